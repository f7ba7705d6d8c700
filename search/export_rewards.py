"""Rewards of a run's proposals for training data: one outcome per variant, one reward per status.

A variant's outcome comes from its search-shape evaluations (:class:`kernels.records.EvalRecord`);
a proposal that produced no variant, or whose variant was never evaluated, gets a
:class:`ProposalOutcome` instead of a :class:`kernels.verdict.Status`. Every failing status and
outcome has its own penalty: the tables are keyed by the enums, so a status added later has no
reward until someone gives it one (the export test checks that every member has an entry).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from kernels.records import EvalRecord, ShapeSet, Stage
from kernels.verdict import Status


class ProposalOutcome(StrEnum):
    """What became of a proposal that has no verdict of its own."""

    NO_VARIANT = "NO_VARIANT"  # the agent produced no usable code (no code block, failed call)
    NOT_EVALUATED = "NOT_EVALUATED"  # a variant the run never evaluated (e.g. killed first)


Outcome = Status | ProposalOutcome

# Reward of a variant that did not pass: worse for what cannot run or cheats than for a
# kernel that ran and was only wrong or asked for impossible resources.
PENALTIES: dict[Status, float] = {
    Status.COMPILE_ERROR: -1.0,
    Status.INCORRECT: -0.5,
    Status.CRASH: -1.0,
    Status.TIMEOUT: -1.0,
    Status.REJECTED: -1.0,
    Status.RESOURCE_ERROR: -0.5,
}
OUTCOME_PENALTIES: dict[ProposalOutcome, float] = {
    ProposalOutcome.NO_VARIANT: -1.0,
    ProposalOutcome.NOT_EVALUATED: 0.0,
}
STANDIN_EVALUATOR = "standin"
_AUTHORITATIVE_STAGES = (Stage.FINAL, Stage.FULL)


@dataclass(frozen=True)
class VariantOutcome:
    """A variant's verdict for training: status, speedup when OK, dtype, and whether the
    evaluations behind it came from the stand-in evaluator (synthetic numbers)."""

    status: Outcome
    speedup: float | None = None
    dtype: str = ""
    synthetic: bool = False


def is_synthetic(record: EvalRecord) -> bool:
    """Whether the evaluation came from the CPU stand-in (its numbers are not measurements)."""
    return record.evaluation.extra.get("evaluator") == STANDIN_EVALUATOR


def variant_outcomes(evaluations: Iterable[EvalRecord]) -> dict[str, VariantOutcome]:
    """Per variant id, its outcome from its search-shape evaluations.

    An OK verdict wins over failures (a variant can fail at one parameter assignment and
    pass at another); among OK ones the full-protocol stages win over screening, then the
    highest speedup. Without any OK verdict the latest status stands.
    """
    groups: dict[str, list[EvalRecord]] = defaultdict(list)
    for rec in evaluations:
        groups[rec.variant.id].append(rec)
    out: dict[str, VariantOutcome] = {}
    for vid, recs in groups.items():
        search = [r for r in recs if r.shape_set is ShapeSet.SEARCH] or recs
        synthetic = any(is_synthetic(r) for r in recs)
        ok = [r for r in search if r.evaluation.status.is_ok and r.evaluation.speedup is not None]
        if ok:
            full = [r for r in ok if r.stage in _AUTHORITATIVE_STAGES] or ok
            best = max(full, key=lambda r: r.evaluation.speedup or 0.0)
            out[vid] = VariantOutcome(Status.OK, best.evaluation.speedup, best.dtype, synthetic)
        else:
            last = search[-1]
            out[vid] = VariantOutcome(last.evaluation.status, None, last.dtype, synthetic)
    return out


def reward(status: Outcome, speedup: float | None, zero_penalty: bool = False) -> float:
    """The speedup of an OK variant, else the status's penalty (0 with ``zero_penalty``).

    Raises:
        KeyError: a status without a penalty (give it one in :data:`PENALTIES`).
    """
    if status is Status.OK:
        if speedup is None:
            raise ValueError("an OK outcome needs its speedup")
        return float(speedup)
    penalty = PENALTIES[status] if isinstance(status, Status) else OUTCOME_PENALTIES[status]
    return 0.0 if zero_penalty else penalty


def tester_reward(accepted: int, rejected: int) -> float:
    """The tester's reward: the fraction of the shapes it proposed that passed the checks
    (0 when it proposed none or the call failed)."""
    proposed = accepted + rejected
    return accepted / proposed if proposed else 0.0
