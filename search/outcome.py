"""What the agents' proposals came to, per kernel, in words a reader cannot mistake.

A search whose every proposal failed still ends with a "winner": the baseline it started
from. Without a word about it, a run whose LLM endpoint answered nothing usable looks like a
run that found nothing better. :func:`proposal_outcome` counts, from the run's records, the
proposals made, those that never became a variant (an LLM error, a reply without code), those
admitted (compiled and launched: any verdict but the admission step's COMPILE_ERROR and
RESOURCE_ERROR) and those found correct; :func:`outcome_line` says what that means for the
winner, and :func:`never_admitted` names the kernels a run must fail for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kernels.records import EvalRecord
from kernels.verdict import Status
from search.proposal_records import read_proposals

# The verdicts of the admission step (evaluators.admit): a variant with only these never ran.
REFUSED = frozenset({Status.COMPILE_ERROR, Status.RESOURCE_ERROR})
BASELINE_AUTHOR = "baseline"


@dataclass(frozen=True)
class ProposalOutcome:
    """Counts of one kernel's proposals over the run.

    Attributes:
        proposals: proposals the agents made, failed ones included.
        failed: proposals that never became a variant (the reason is in ``reasons``).
        admitted: distinct proposed variants that passed admission and were launched.
        correct: distinct proposed variants with at least one OK verdict.
        reasons: the commonest reasons, ``"N x reason"``, failed proposals and refused
            variants together (at most three).
    """

    proposals: int = 0
    failed: int = 0
    admitted: int = 0
    correct: int = 0
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reasons": list(self.reasons)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> ProposalOutcome | None:
        if not d:
            return None
        return cls(int(d.get("proposals", 0)), int(d.get("failed", 0)), int(d.get("admitted", 0)),
                   int(d.get("correct", 0)), tuple(d.get("reasons", ())))


def _reason(text: str) -> str:
    first = " ".join(text.split())
    return first[:120] + ("..." if len(first) > 120 else "")


def proposal_outcome(run_dir: Path, kernel: str, records: Sequence[EvalRecord]) -> ProposalOutcome:
    """The outcome of ``kernel``'s proposals from ``proposals.jsonl`` and the evaluations."""
    path = Path(run_dir) / "proposals.jsonl"
    proposals = [p for p in read_proposals(path) if p.kernel == kernel] if path.is_file() else []
    mine = [r for r in records if r.kernel == kernel and r.variant.author != BASELINE_AUTHOR]
    admitted = {r.variant.id for r in mine if r.evaluation.status not in REFUSED}
    correct = {r.variant.id for r in mine if r.evaluation.status.is_ok}
    reasons: Counter[str] = Counter(_reason(p.failure) for p in proposals if p.failed)
    refused = {r.variant.id: f"{r.evaluation.status.value}: {r.evaluation.message}" for r in mine
               if r.variant.id not in admitted}
    reasons.update(_reason(text) for text in refused.values())
    return ProposalOutcome(len(proposals), sum(p.failed for p in proposals), len(admitted), len(correct),
                           tuple(f"{n} x {why}" for why, n in reasons.most_common(3)))


def winner_is_baseline(kernel_summary: Mapping[str, Any]) -> bool:
    """Whether a kernel's winner (its summary.json entry) is the baseline it started from."""
    lineage = kernel_summary.get("lineage") or []
    return bool(lineage) and lineage[0].get("author") == BASELINE_AUTHOR


def outcome_line(kernel_summary: Mapping[str, Any]) -> str:
    """One plain sentence when the winner is the baseline (why no proposal won), else ''."""
    if not winner_is_baseline(kernel_summary):
        return ""
    o = ProposalOutcome.from_dict(kernel_summary.get("proposals"))
    if o is None:
        return "NO IMPROVEMENT: the winner is the baseline itself"
    why = f"; commonest failures: {' | '.join(o.reasons)}" if o.reasons else ""
    if o.admitted == 0:
        return (f"NO PROPOSAL ADMITTED: none of {o.proposals} proposal(s) compiled and ran ({o.failed} never "
                f"became a variant); the 'winner' is the unchanged baseline{why}")
    return (f"NO IMPROVEMENT: {o.admitted} proposal(s) ran, {o.correct} correct, none faster than the baseline; "
            f"the winner is the unchanged baseline{why}")


def never_admitted(summary: Mapping[str, Any]) -> list[str]:
    """The kernels of a summary for which no proposal was ever admitted (the run failed at
    its purpose for them); kernels without counts (older runs) are not named."""
    out = []
    for k in summary.get("kernels", []):
        o = ProposalOutcome.from_dict(k.get("proposals"))
        if o is not None and o.admitted == 0:
            out.append(str(k["kernel"]))
    return out
