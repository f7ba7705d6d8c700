"""The evaluator pool never lets a sanitizer run (non-exclusive) overlap a timed call on the
same GPU: the dispatch rule alone, with actors that only record what they were given."""

from __future__ import annotations

from collections import deque
from typing import Any

from search.pool import EvalPool


class _Method:
    def __init__(self, log: list[tuple[int, str]], actor: int, name: str) -> None:
        self.log, self.actor, self.name = log, actor, name

    def remote(self, *args: Any) -> tuple[int, str, int]:
        self.log.append((self.actor, self.name))
        return (self.actor, self.name, len(self.log))


class _Actor:
    def __init__(self, log: list[tuple[int, str]], index: int) -> None:
        self.log, self.index = log, index

    def __getattr__(self, name: str) -> _Method:
        return _Method(self.log, self.index, name)


def _pool(size: int) -> tuple[EvalPool, list[tuple[int, str]]]:
    log: list[tuple[int, str]] = []
    pool = EvalPool.__new__(EvalPool)
    pool.actors = [_Actor(log, i) for i in range(size)]
    pool.idle, pool.sharing, pool.queue, pool.inflight = deque(range(size)), [0] * size, deque(), {}
    pool.spans = []
    return pool, log


def _finish(pool: EvalPool, method: str) -> None:
    ref = next(r for r, c in pool.inflight.items() if c.method == method)
    pool._release(pool.inflight.pop(ref))


def test_a_timed_call_waits_for_sanitizer_runs_on_its_actor_and_they_wait_for_it() -> None:
    pool, log = _pool(1)
    pool.call("a", "sanitize", exclusive=False)
    pool.call("b", "sanitize", exclusive=False)
    pool.call("c", "time_peers")
    assert log == [(0, "sanitize"), (0, "sanitize")]  # sanitizers share; the loop waits
    _finish(pool, "sanitize")
    assert len(log) == 2
    _finish(pool, "sanitize")
    assert log[-1] == (0, "time_peers")
    pool.call("d", "sanitize", exclusive=False)
    assert len(log) == 3  # no sanitizer run starts beside the timed loop
    _finish(pool, "time_peers")
    assert log[-1] == (0, "sanitize")


def test_sanitizer_runs_go_to_actors_without_a_timed_call() -> None:
    pool, log = _pool(2)
    pool.call("a", "evaluate")
    pool.call("b", "sanitize", exclusive=False)
    pool.call("c", "sanitize", exclusive=False)
    assert log == [(0, "evaluate"), (1, "sanitize"), (1, "sanitize")]
    pool.call("d", "evaluate")  # actor 1 is shared by sanitizers: the evaluation waits
    assert len(log) == 3
    _finish(pool, "evaluate")
    assert log[-1] == (0, "evaluate")
