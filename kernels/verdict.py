"""The evaluator's verdicts: one status enum and one record per evaluation."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """Outcome of evaluating one variant; every outcome is a status, never a sentinel."""

    OK = "OK"
    COMPILE_ERROR = "COMPILE_ERROR"  # NVRTC refused the source, or the launch header/signature is wrong
    INCORRECT = "INCORRECT"  # ran, but an output differs from the reference or the baseline
    CRASH = "CRASH"  # a CUDA fault (illegal address, trap, misaligned access, ...)
    TIMEOUT = "TIMEOUT"  # the watchdog fired (hang or runaway kernel)
    REJECTED = "REJECTED"  # an integrity guard fired (input mutation, partial output, roofline, ...)
    RESOURCE_ERROR = "RESOURCE_ERROR"  # launch asks for impossible resources (too many threads, smem, registers)

    @property
    def is_ok(self) -> bool:
        return self is Status.OK


@dataclass(frozen=True)
class ShapeResult:
    """Timings of candidate and baseline on one shape, measured interleaved in one process.

    Times are kernel times from CUDA events around a single launch (L2 flushed before each
    repetition), in milliseconds; spreads are the inter-quartile range.
    """

    shape: dict[str, int]
    candidate_ms: float
    baseline_ms: float
    candidate_iqr_ms: float = 0.0
    baseline_iqr_ms: float = 0.0
    bytes_moved: int = 0
    repetitions: int = 0
    copy_bw_fraction: float = 0.0  # candidate's effective bandwidth / measured copy bandwidth
    roofline_ms: float = 0.0  # bytes_moved at the measured copy bandwidth: no honest kernel is faster

    def __post_init__(self) -> None:
        # A zero time is never a measurement. Without a positive candidate time or roofline the
        # speedup would divide by zero; the geometric mean refuses infinities, so fail here,
        # where the bad record is made, rather than later in an unrelated aggregate.
        if not max(self.candidate_ms, self.roofline_ms) > 0:
            raise ValueError(
                f"shape {self.shape}: candidate_ms={self.candidate_ms} and roofline_ms="
                f"{self.roofline_ms}; at least one must be a positive time to compute a speedup"
            )

    @property
    def speedup(self) -> float:
        """baseline / candidate, the candidate's time clamped at the roofline so that one shape
        timed near zero cannot inflate the geometric mean."""
        return self.baseline_ms / max(self.candidate_ms, self.roofline_ms)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["speedup"] = self.speedup
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShapeResult:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def geomean(values: Iterable[float]) -> float:
    """Geometric mean in log space (no overflow for long products).

    Raises:
        ValueError: empty input or a non-positive value.
    """
    vals = list(values)
    if not vals:
        raise ValueError("geometric mean of nothing")
    if any(not (v > 0) or math.isinf(v) for v in vals):
        raise ValueError(f"geometric mean needs positive finite values, got {vals}")
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals))


@dataclass(frozen=True)
class Evaluation:
    """One verdict on one variant (at one parameter assignment, one dtype).

    ``message`` is written for the planner: the compiler error, the first mismatch (shape,
    index, expected, got), or the guard that fired and why.
    """

    status: Status
    message: str = ""
    kernel: str = ""
    dtype: str = ""
    variant_id: str = ""
    params: dict[str, int] = field(default_factory=dict)
    shapes: tuple[ShapeResult, ...] = ()
    shape_set: str = "search"
    registers: int | None = None
    smem_bytes: int | None = None
    local_bytes: int | None = None
    compile_s: float = 0.0
    eval_s: float = 0.0
    guard: str = ""  # name of the guard that fired (REJECTED), else empty
    noise_floor: float | None = None  # |1 - geomean(A/A)| measured for the baseline, if asked
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        """Geometric-mean speedup over the baseline, per-shape speedups clamped (see guards)."""
        if not self.status.is_ok or not self.shapes:
            return None
        return geomean(s.speedup for s in self.shapes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        d["shapes"] = [s.to_dict() for s in self.shapes]
        d["speedup"] = self.speedup
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Evaluation:
        """Reads a record back; unknown fields (from newer versions) are ignored."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["status"] = Status(kw["status"])
        kw["shapes"] = tuple(ShapeResult.from_dict(s) for s in kw.get("shapes", ()))
        return cls(**kw)
