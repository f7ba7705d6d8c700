"""Where a run's wall time goes: its stages one after the other, and the evaluator calls inside them.

The summary of every run records ``stage_s``: seconds of each sequential stage (set-up, search,
held-out checks, the rest of the end of the run, the report), and ``end_calls_s``: over the
end of the run after the held-out checks, the wall seconds during which at least one call of
each kind was running on an evaluator (sanitizer runs, final timings, peers' loops,
compilations ahead), so overlapping calls are not counted twice.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable, Iterator


class StageClock:
    """Seconds per named stage, in the order the stages ran; prints a line as each ends."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.time() if started is None else started
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, float] = {}  # per kind of evaluator call, wall seconds (by_kind)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            spent = time.time() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + spent
            print(f"stage {name}: {spent:.0f} s ({time.time() - self.started:.0f} s into the run)",
                  file=sys.stderr, flush=True)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


def union_s(spans: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the (start, end) spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def by_kind(spans: Iterable[tuple[str, float, float]], since: float = float("-inf")) -> dict[str, float]:
    """Per kind of call, :func:`union_s` of its spans that started at or after ``since``."""
    kinds: dict[str, list[tuple[float, float]]] = {}
    for kind, start, end in spans:
        if start >= since:
            kinds.setdefault(kind, []).append((start, end))
    return {kind: union_s(s) for kind, s in sorted(kinds.items())}
