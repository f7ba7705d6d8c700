"""The gate of the peers' rounds set up beside the search: a round waits, beating, until the
gate's file exists, and the pool's actor opens it on its node (search.pool)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from evaluators.context import Verdict
from evaluators.peers import _wait_for_gate
from kernels.verdict import Status
from search.pool import EvalPool, EvaluatorActor, gate_file


def test_a_round_waits_at_the_gate_until_it_opens(tmp_path: Path) -> None:
    gate = tmp_path / "gate.open"
    beats: list[str] = []
    opener = threading.Timer(0.5, gate.touch)
    opener.start()
    start = time.monotonic()
    _wait_for_gate(gate, beats.append, every_s=0.05)
    assert gate.exists() and time.monotonic() - start >= 0.45
    opener.join()


def test_a_round_whose_gate_stays_shut_gives_up_at_its_deadline(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(Verdict) as raised:
        _wait_for_gate(tmp_path / "never.open", lambda _: None, until=time.time() + 0.3, every_s=0.05)
    assert raised.value.status is Status.TIMEOUT and "not opened" in raised.value.message
    assert 0.25 <= time.monotonic() - start < 5.0


def test_the_pool_opens_the_gate_on_its_own_node_even_when_no_actor_answers() -> None:
    """A live actor that does not answer in time (here: none that answers at all) must not leave
    the rounds on this node waiting."""
    name = f"test-{time.time_ns()}"

    class Silent:
        class open_gate:  # noqa: N801 - an actor method's handle
            @staticmethod
            def remote(_name: str) -> None:
                raise TimeoutError("no answer")

    pool = EvalPool.__new__(EvalPool)
    pool.actors = [Silent()]
    try:
        pool.open_gates(name, timeout_s=0.1)
        assert gate_file(name).exists()
    finally:
        gate_file(name).unlink(missing_ok=True)


def test_the_actor_opens_a_gate_of_this_attempt_only() -> None:
    name = f"test-{time.time_ns()}"
    actor = EvaluatorActor("standin")
    try:
        assert not gate_file(name).exists()
        assert Path(actor.open_gate(name)) == gate_file(name) and gate_file(name).exists()
        assert not gate_file(name + "-other").exists()
    finally:
        gate_file(name).unlink(missing_ok=True)
        actor.close()
