"""Ratios from the repeated end-of-run loop: median, min-max and what they allow us to say.

The end-of-run loop (our winner, our baseline and the peers interleaved) runs in several
independent processes. Each loop gives one ratio per pair (the geometric mean over the
shapes of other time / our time); a headline is the median of those ratios with their range,
and a kernel is called faster than another only when the whole range lies above 1.0, slower
only when it lies below, and a tie otherwise. One loop gives a range of one value: its
verdict says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kernels.verdict import geomean

OURS = "best"  # our winner's name in the end-of-run loop
Times = Mapping[str, Mapping[str, float]]  # implementation -> shape label -> ms


@dataclass(frozen=True)
class Spread:
    """A ratio over repeated loops: median, min, max, how many loops, and the verdict."""

    median: float
    low: float
    high: float
    runs: int

    @property
    def verdict(self) -> str:
        if self.low > 1.0:
            return "faster"
        if self.high < 1.0:
            return "slower"
        return "tie"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}

    def text(self) -> str:
        """``1.123x [1.050-1.180] faster`` (``one run`` noted when there is one loop only)."""
        runs = "" if self.runs > 1 else ", one run"
        return f"{self.median:.3f}x [{self.low:.3f}-{self.high:.3f}] {self.verdict}{runs}"


def of(values: Sequence[float]) -> Spread | None:
    """The spread of per-loop ratios (None when there are none)."""
    if not values:
        return None
    return Spread(statistics.median(values), min(values), max(values), len(values))


def loop_ratio(times: Times, other: str, ours: str = OURS, labels: Sequence[str] | None = None) -> float | None:
    """One loop's ratio: geometric mean over the shapes both were timed on of other / ours."""
    mine, theirs = times.get(ours, {}), times.get(other, {})
    shown = labels if labels is not None else list(mine)
    ratios = [theirs[lb] / mine[lb] for lb in shown if lb in mine and lb in theirs and mine[lb] > 0 and theirs[lb] > 0]
    return geomean(ratios) if ratios else None


def spreads(runs: Sequence[Times], ours: str = OURS, exclude: Sequence[str] = (),
            labels: Sequence[str] | None = None) -> dict[str, Spread]:
    """Per implementation other than ``ours``, the spread of its ratio over the loops."""
    others = sorted({impl for run in runs for impl in run if impl != ours and impl not in exclude})
    out = {}
    for other in others:
        values = [r for r in (loop_ratio(run, other, ours, labels) for run in runs) if r is not None]
        s = of(values)
        if s is not None:
            out[other] = s
    return out


def from_dict(d: Mapping[str, Any] | None) -> Spread | None:
    """A spread written by :meth:`Spread.to_dict` (None passes through)."""
    if not d:
        return None
    return Spread(float(d["median"]), float(d["low"]), float(d["high"]), int(d["runs"]))


def text(d: Mapping[str, Any] | None) -> str:
    """A written spread as :meth:`Spread.text`, or ``-``."""
    s = from_dict(d)
    return "-" if s is None else s.text()
