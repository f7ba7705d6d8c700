"""The search state of one kernel: elites, islands, dedupe sets, lineages and histories."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.base import AgentContext, Attempt
from kernels.folders import KernelRef
from kernels.records import Stage
from kernels.spec import KernelSpec, shape_label
from kernels.variant import Variant
from kernels.verdict import Evaluation, Status
from search.selection import Dedupe, EliteArchive, Islands, Scored


class SearchError(RuntimeError):
    """The search cannot go on for a kernel (e.g. its baseline fails to evaluate)."""


@dataclass(frozen=True)
class Entry:
    """One proposal of an agent's reply, at its place (agent, slot) in the round."""

    agent: int
    slot: int
    variant: Variant
    failed: bool
    transformation: str = ""


@dataclass
class RoundState:
    """Bookkeeping of one kernel's current round.

    Proposals are taken up in a fixed order (agent, then slot), whatever order the agents
    answer and the compiles finish in: which of two equal sources or binaries is evaluated
    (and which copies its verdict) must not depend on Ray's timing.

    Attributes:
        number: the round (0-based).
        outstanding: proposals, compilations and evaluations not yet finished.
        phase: screen (proposals and tuning) then full (contenders).
        best_ms: per-shape times of the best variant when the round started (the screening
            cutoff; fixed for the round so that no verdict depends on arrival order).
        replies: per agent, its reply's entries (absent: not answered yet).
        admissions: variant id -> (summary, artifact reference) of its admission at defaults
            (None while asked for).
        cursor: the next (agent, slot) to take up.
        attempts: per agent and slot, what it tried this round and the verdicts.
        scored: correct variants of this round at their best screened parameters.
    """

    number: int
    outstanding: int = 0
    phase: Stage = Stage.SCREEN
    best_ms: dict[str, float] = field(default_factory=dict)
    replies: dict[int, list[Entry]] = field(default_factory=dict)
    admissions: dict[str, tuple[Any, Any] | None] = field(default_factory=dict)
    cursor: tuple[int, int] = (0, 0)
    attempts: dict[int, dict[int, Attempt]] = field(default_factory=dict)
    scored: list[Scored] = field(default_factory=list)

    def attempts_in_order(self) -> dict[int, list[Attempt]]:
        """Per agent (ascending), its attempts in slot order."""
        return {a: [by_slot[k] for k in sorted(by_slot)] for a, by_slot in sorted(self.attempts.items())}


class KernelState:
    """Everything the search knows about one kernel.

    Args:
        spec: the kernel spec.
        ref: how every process finds the kernel (folder and digest); its name is the
            kernel's name in this run (records, run files, agents).
        dtype: run dtype.
        population / top_k / migrate_every: selection settings.
        extra_shapes: shapes the tester added to the search shapes for this run.
        heldout_extra: held-out shapes drawn for this run (:meth:`KernelSpec.draw_heldout`).
    """

    def __init__(self, spec: KernelSpec, ref: KernelRef, dtype: str, population: int, top_k: int, migrate_every: int,
                 extra_shapes: tuple[dict[str, int], ...] = (),
                 heldout_extra: tuple[dict[str, int], ...] = ()) -> None:
        self.spec, self.ref, self.dtype = spec, ref, dtype
        self.extra_shapes = tuple(dict(s) for s in extra_shapes)
        self.heldout_extra = tuple(dict(s) for s in heldout_extra)
        self.baseline = Variant(ref.name, spec.baseline_source(), author="baseline", note="baseline")
        self.baseline_scored: Scored | None = None
        self.archive = EliteArchive(top_k)
        self.islands = Islands(migrate_every)
        self.dedupe = Dedupe()
        self.history: dict[int, list[Attempt]] = {i: [] for i in range(population)}
        self.variants: dict[str, Variant] = {self.baseline.id: self.baseline}
        self.notes: dict[str, dict[str, Any]] = {}  # variant id -> transformation, agent
        self.verdicts: dict[str, Evaluation] = {}  # variant id -> best screening verdict
        self.full_done: set[str] = set()
        self.round: RoundState | None = None
        self.rounds_done = 0

    @property
    def name(self) -> str:
        """The kernel's name in this run (the spec's name unless two kernels share it)."""
        return self.ref.name

    def search_shapes(self) -> tuple[dict[str, int], ...]:
        """The spec's search shapes and the tester's extra ones (never held-out shapes)."""
        return tuple(dict(s) for s in self.spec.search_shapes) + self.extra_shapes

    def heldout_shapes(self) -> tuple[dict[str, int], ...]:
        """The spec's fixed held-out shapes and the ones drawn for this run."""
        return tuple(dict(s) for s in self.spec.heldout_shapes) + self.heldout_extra

    def all_shapes(self) -> tuple[dict[str, int], ...]:
        """Every shape the run may launch a variant on (admission checks them all)."""
        return self.search_shapes() + self.heldout_shapes()

    def set_baseline(self, evaluation: Evaluation) -> None:
        """Records the baseline's own evaluation; it must be correct to start a search.

        Raises:
            SearchError: the baseline does not pass.
        """
        if evaluation.speedup is None:
            hint = ""
            if evaluation.status is Status.INCORRECT:
                hint = (f" (the baseline and the reference disagree beyond the {self.dtype} tolerance: fix the "
                        "baseline, or give the spec looser `tolerances` for that dtype if the reference is "
                        "stricter than the kernel needs to be)")
            raise SearchError(
                f"{self.name}: the baseline itself failed ({evaluation.status.value}): "
                f"{evaluation.message.splitlines()[0] if evaluation.message else ''}{hint}"
            )
        self.baseline_scored = Scored(self.baseline, evaluation, Stage.SCREEN)
        self.verdicts[self.baseline.id] = evaluation

    def best(self) -> Scored:
        best = self.archive.best()
        assert self.baseline_scored is not None
        return best if best is not None and best.score > self.baseline_scored.score else self.baseline_scored

    def best_ms(self) -> dict[str, float]:
        """Per-shape times of the best variant so far (for the evaluator's early cutoff)."""
        return {shape_label(s.shape): s.candidate_ms for s in self.best().evaluation.shapes}

    def context(self, agent: int, round_: int, n_variants: int, seed: int) -> AgentContext:
        assert self.baseline_scored is not None
        parent, _ = self.islands.parent(agent, round_, self.archive, self.baseline_scored)
        elites = tuple(Attempt(s.variant, s.evaluation) for s in self.archive.ranked())
        return AgentContext(
            kernel=self.name,
            description=self.spec.description,
            signature=", ".join(f"{a.name}:{a.kind}" for a in self.spec.args),
            shapes=self.search_shapes(),
            dtype=self.dtype,
            parent=parent.variant,
            parent_eval=parent.evaluation,
            history=tuple(self.history[agent]),
            elites=elites,
            round=round_,
            n_variants=n_variants,
            seed=seed,
            ref=self.ref,
        )

    def offer(self, agent: int | None, item: Scored) -> None:
        """A correct variant (screened or fully timed) enters selection."""
        self.archive.add(item)
        if agent is not None:
            self.islands.update(agent, item)
        if item.stage is Stage.SCREEN and self.round is not None:
            self.round.scored.append(item)

    def drop(self, variant_id: str) -> None:
        """Takes a variant out of selection for good (it failed the full protocol or the
        held-out shapes)."""
        self.archive.remove(variant_id)
        self.islands.remove(variant_id)

    def lineage(self, variant_id: str) -> list[dict[str, Any]]:
        """The chain from a variant back to the baseline, newest first."""
        chain, seen = [], set()
        current = self.variants.get(variant_id)
        while current is not None and current.id not in seen:
            seen.add(current.id)
            extra = self.notes.get(current.id, {})
            chain.append(
                {"id": current.id, "author": current.author, "note": current.note, "round": current.round,
                 "parent": current.parent, "transformation": extra.get("transformation", "")}
            )
            current = self.variants.get(current.parent) if current.parent else None
        return chain
