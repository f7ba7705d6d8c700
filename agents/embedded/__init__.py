"""The embedded (offline) agent: a rule-based planner and a source-transforming coder.

It needs no network and no GPU: it reads the parent's evaluation and the lineage history,
ranks plans by its seeded strategy, applies them as source transformations, family recipes
or schedules generated from the spec's traced reference (:mod:`agents.embedded.codegen`),
and proposes only variants that keep the signature, have a valid launch header on every
shape, and compile with NVRTC.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import lru_cache

from agents.base import Agent, AgentContext, Attempt, Proposal, derive_seed
from agents.embedded.codegen import schedules_for
from agents.embedded.coder import Applied, apply_plan, check_variant
from agents.embedded.planner import Signals, candidate_plans, learn, rank_plans
from agents.embedded.recipes import Recipe, recipes_for
from agents.embedded.strategies import STRATEGIES, is_rewrite, pick_strategy
from kernels.folders import KernelRef
from kernels.spec import KernelSpec, cached_kernel
from kernels.variant import Variant, source_hash

__all__ = ["EmbeddedAgent", "STRATEGIES"]


_spec = cached_kernel  # one cache per process, keyed by reference


def _fixed_source(source: str) -> Callable[[KernelSpec], str]:
    """A recipe builder that returns an already generated source."""
    return lambda _spec: source


@lru_cache(maxsize=64)
def _generated(kernel: KernelRef | str) -> tuple[Recipe, ...]:
    # Schedules generated from the traced reference: whole-source rewrites like recipes, for
    # any kernel whose op graph the generator classifies (none otherwise). Traced once per
    # reference and process, keyed like the spec.
    return tuple(Recipe(name, "codegen", _fixed_source(schedule.source))
                 for name, schedule in schedules_for(_spec(kernel)).items())


def _attempt_key(attempt: Attempt) -> tuple[str, str]:
    return attempt.variant.id, attempt.evaluation.status.value if attempt.evaluation else ""


class EmbeddedAgent(Agent):
    """Offline planner/coder pair.

    Args:
        seed: drives the strategy choice (when ``strategy`` is None) and the tie-breaking
            jitter, so agents of one population explore differently.
        strategy: one of :data:`STRATEGIES` (``family-recipe-first``, ``vectorize-first``,
            ``launch-config-first``, ``fast-math-first``, ``explore``) or None for by-seed.

    Raises:
        KeyError: an unknown strategy name.
    """

    def __init__(self, seed: int, strategy: str | None = None) -> None:
        self.seed = int(seed)
        self.strategy = pick_strategy(self.seed, strategy)
        self.name = f"embedded-{self.strategy.name}-{self.seed}"
        self._observed: list[Attempt] = []

    def observe(self, attempts: Sequence[Attempt]) -> None:
        """Keeps verdicts of this agent's proposals that the context's history may lack."""
        self._observed.extend(attempts)

    def _history(self, ctx: AgentContext) -> tuple[Attempt, ...]:
        # The context's history already holds what the search fed back; observed attempts
        # add only what it lacks, so that no failure is counted twice.
        known = {_attempt_key(a) for a in ctx.history}
        return (*ctx.history, *(a for a in self._observed if _attempt_key(a) not in known))

    def propose(self, ctx: AgentContext) -> list[Proposal]:
        """Up to ``ctx.n_variants`` distinct, compiling variants derived from ``ctx.parent``."""
        spec = _spec(ctx.kernel_source)
        history = self._history(ctx)
        recipes = {r.name: r for r in (*recipes_for(spec), *_generated(ctx.kernel_source))}
        applied = tuple(ctx.parent.meta.get("transformations", ()))
        speedups = {a.variant.id: a.evaluation.speedup for a in history
                    if a.evaluation is not None and a.evaluation.speedup is not None}
        if ctx.parent_eval is not None and ctx.parent_eval.speedup is not None:
            speedups[ctx.parent.id] = ctx.parent_eval.speedup
        knowledge = learn(history, speedups)
        # Seeded by the request (run seed, kernel, round, slot) and this agent's own seed, so
        # one agent does not replay the same ties every round, and a resumed run gets the same
        # draw as the uninterrupted one (no call counter, no salted hash()).
        rng = random.Random(derive_seed(self.seed, ctx.seed, ctx.kernel, ctx.round))
        plans = rank_plans(
            candidate_plans(list(recipes), applied),
            self.strategy,
            knowledge,
            Signals.read(ctx.parent_eval),
            rng,
            parent_is_recipe=any(is_rewrite(s) for s in applied),
        )
        seen = {ctx.parent.id} | {a.variant.id for a in (*history, *ctx.elites)}
        out: list[Proposal] = []
        for plan in plans:
            if len(out) >= ctx.n_variants:
                break
            result = apply_plan(spec, ctx.parent.source, applied, plan, recipes)
            if result is None or source_hash(result.source) in seen:
                continue
            seen.add(source_hash(result.source))
            if check_variant(spec, result.source, ctx.dtype) is not None:
                continue
            out.append(self._proposal(ctx, result))
        return out

    def _proposal(self, ctx: AgentContext, result: Applied) -> Proposal:
        label = " + ".join(result.steps)
        variant = Variant(
            kernel=ctx.parent.kernel or ctx.kernel,
            source=result.source,
            parent=ctx.parent.id,
            author=self.name,
            note=f"embedded: {label}",
            round=ctx.round,
            meta={
                "steps": list(result.steps),
                "transformations": list(result.transformations),
                "strategy": self.strategy.name,
            },
        )
        return Proposal(variant=variant, transformation=label)
