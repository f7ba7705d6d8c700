"""Ratios from the repeated end-of-run loop: median, min-max and what they allow us to say.

The end-of-run loop (our winner, our baseline and the peers interleaved) runs in several
independent processes. Each loop gives one ratio per pair (the geometric mean over the
shapes of other time / our time); a headline is the median of those ratios with their range,
and a kernel is called faster than another only when the whole range lies above 1.0, slower
only when it lies below, and a tie otherwise. One loop gives a range of one value: its
verdict says so.

Targets follow the same rule: a target is met only when the whole range is at or above it,
missed when the whole range lies below it, and otherwise the range straddles it ("within
range"), which is not a target met. A figure over several kernels (a median or geometric
mean) gets its range from the kernels' ranges (:func:`aggregate`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
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


def single(value: float) -> Spread:
    """A figure measured once (no repeated loops): a range of one value."""
    return Spread(value, value, value, 1)


def figure(ranged: Mapping[str, Any] | None, median: float | None) -> Spread | None:
    """A ratio as a spread: its range over the loops (:meth:`Spread.to_dict`), else the one
    figure there is, else None."""
    found = from_dict(ranged)
    if found is not None:
        return found
    return None if median is None else single(median)


def least_lead(medians: Mapping[str, float | None], ranges: Mapping[str, Any], prefix: str) -> tuple[str, Spread | None]:
    """Of our ratios over the implementations named ``prefix...`` (one library's several APIs
    for the op, e.g. ``flashinfer`` and ``flashinfer_in_place``; ``ranges``: their spreads by
    name), the one we lead by the least: the library at its best. ``(prefix, None)`` when none
    was timed."""
    found = {name: s for name, m in medians.items() if name.startswith(prefix)
             if (s := figure(ranges.get(name), m)) is not None}
    if not found:
        return prefix, None
    name = min(found, key=lambda n: (found[n].median, n))
    return name, found[name]


def median_times(runs: Sequence[Times]) -> dict[str, dict[str, float]]:
    """Per implementation and shape label, the median time over the loops that timed it."""
    collected: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for impl, per_shape in run.items():
            for label, ms in per_shape.items():
                collected.setdefault(impl, {}).setdefault(label, []).append(ms)
    return {impl: {label: statistics.median(v) for label, v in per_shape.items()}
            for impl, per_shape in collected.items()}


def aggregate(parts: Sequence[Spread], how: Callable[[Sequence[float]], float]) -> Spread | None:
    """A figure over several kernels (``how``: a median, a geometric mean) with its range.

    The figure is ``how`` of the kernels' medians; its range runs from ``how`` of their lows
    to ``how`` of their highs. Both figures rise with every kernel's ratio, so this range
    holds every value the figure takes for any choice of one loop per kernel (the loops of
    two kernels are independent: there is no "same run" to pair them by). ``runs`` is the
    fewest loops any kernel had.
    """
    if not parts:
        return None
    return Spread(how([p.median for p in parts]), how([p.low for p in parts]), how([p.high for p in parts]),
                  min(p.runs for p in parts))


MET, NOT_MET, WITHIN, NOT_MEASURED = "met", "not met", "within range", "not measured"
_WORST_FIRST = (NOT_MET, NOT_MEASURED, WITHIN, MET)


def against(target: float, measured: Spread | Mapping[str, Any] | float | None) -> str:
    """Whether a measured ratio meets ``target``: ``met`` when its whole range is at or
    above it, ``not met`` when its whole range is below it, ``within range`` when the range
    straddles it; a single figure is a range of one value."""
    if measured is None:
        return NOT_MEASURED
    if isinstance(measured, Spread):
        s = measured
    elif isinstance(measured, Mapping):
        s = from_dict(measured) or single(float("nan"))
    else:
        s = single(float(measured))
    if s.low >= target:
        return MET
    if s.high < target:
        return NOT_MET
    if s.low < target <= s.high:
        return WITHIN
    return NOT_MEASURED  # NaN: nothing to compare


def all_of(verdicts: Sequence[str]) -> str:
    """Several conditions of one target together: met only when every one is; the worst
    verdict otherwise (not met, then not measured, then within range); no conditions at all
    is nothing measured."""
    if not verdicts:
        return NOT_MEASURED
    for worst in _WORST_FIRST:
        if worst in verdicts:
            return worst
    return MET


def verdict_text(verdict: str) -> str:
    """A target verdict for a table: ``met``, ``NOT met``, ``within range (not met)``, ``not measured``."""
    return {MET: "met", NOT_MET: "NOT met", WITHIN: "within range (not met by the whole range)"}.get(verdict, verdict)


def text(d: Mapping[str, Any] | None) -> str:
    """A written spread as :meth:`Spread.text`, or ``-``."""
    s = from_dict(d)
    return "-" if s is None else s.text()


def over_shapes(timed: int | None, shapes: int | None) -> str:
    """`` over 2 of 7 shapes`` after a ratio taken over some of a kernel's shapes only (a peer
    that could not run the others), else nothing."""
    return f" over {timed} of {shapes} shapes" if timed and shapes and timed < shapes else ""
