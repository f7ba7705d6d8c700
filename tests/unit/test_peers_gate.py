"""The gate of the peers' rounds set up beside the search: a round waits, beating, until the
gate's file exists, and the pool's actor opens it on its node (search.pool)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from evaluators.peers import _wait_for_gate
from search.pool import EvaluatorActor, gate_file


def test_a_round_waits_at_the_gate_until_it_opens(tmp_path: Path) -> None:
    gate = tmp_path / "gate.open"
    beats: list[str] = []
    opener = threading.Timer(0.5, gate.touch)
    opener.start()
    start = time.monotonic()
    _wait_for_gate(gate, beats.append, every_s=0.05)
    assert gate.exists() and time.monotonic() - start >= 0.45
    opener.join()


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
