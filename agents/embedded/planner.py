"""The embedded planner: reads verdicts and lineage history, ranks the next plans.

A plan is a short tuple of steps (generic transformations, family recipes and schedules
generated from the traced reference) applied in order to the parent. The planner never
proposes a plan that failed or gave nothing before, bans the steps a failure points at
(wrong results after fast math, impossible launches after launch changes), and orders what
is left by the agent's strategy, by what the parent's evaluation says (bandwidth fraction,
spills) and by a seeded random jitter.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agents.base import Attempt
from agents.embedded.strategies import Strategy, group_of, is_rewrite
from agents.embedded.transforms import GENERIC
from kernels.verdict import Evaluation, Status

# A relative gain below this counts as "gave nothing": inside the timing noise.
MIN_GAIN = 0.02
# Shapes moving fewer bytes than this are dominated by launch latency, not bandwidth.
SMALL_SHAPE_BYTES = 8 << 20

# Which steps a failure of a given kind points at, when several steps were applied at once.
_SUSPECTS: dict[Status, tuple[str, ...]] = {
    Status.INCORRECT: ("fast_math_intrinsics", "fast_math_flag", "read_only_cache"),
    Status.RESOURCE_ERROR: ("launch_bounds", "tunable_block", "grid_stride", "unroll"),
    Status.COMPILE_ERROR: (),
}


def steps_of(attempt: Attempt) -> tuple[str, ...]:
    """The steps a past attempt applied to its parent (empty if it was not ours)."""
    return tuple(attempt.variant.meta.get("steps", ()))


@dataclass
class Knowledge:
    """What the lineage has learned: plans to avoid and steps that are banned."""

    tried: set[tuple[str, ...]] = field(default_factory=set)
    banned_steps: set[str] = field(default_factory=set)
    failures: dict[str, int] = field(default_factory=dict)

    def allows(self, plan: tuple[str, ...]) -> bool:
        return plan not in self.tried and not (set(plan) & self.banned_steps)


def _speedup(ev: Evaluation | None) -> float | None:
    return ev.speedup if ev is not None and ev.status.is_ok else None


def learn(history: Iterable[Attempt], parent_speedups: dict[str, float]) -> Knowledge:
    """Turns past attempts into plans to skip and steps to ban.

    Args:
        history: the lineage's attempts, oldest first.
        parent_speedups: known speedups by variant id (history and the current parent), to
            judge whether an attempt improved on the variant it came from.
    """
    k = Knowledge()
    for att in history:
        plan = steps_of(att)
        if not plan:
            continue
        k.tried.add(plan)
        ev = att.evaluation
        if ev is None:  # not evaluated yet: do not propose it again, judge it later
            continue
        if ev.status.is_ok:
            base = parent_speedups.get(att.variant.parent, 1.0)
            got = _speedup(ev)
            if got is not None and got > base * (1.0 + MIN_GAIN):
                continue
        # A single step that failed or gave nothing is banned; in a combination only the
        # steps the kind of failure points at are.
        bad = set(plan) if len(plan) == 1 else set(plan) & set(_SUSPECTS.get(ev.status, ()))
        k.banned_steps |= bad
        if not ev.status.is_ok:
            for step in plan:  # a step inside two failed combinations is banned as well
                k.failures[step] = k.failures.get(step, 0) + 1
                if k.failures[step] >= 2:
                    k.banned_steps.add(step)
    return k


@dataclass(frozen=True)
class Signals:
    """What the parent's evaluation suggests, as score bonuses per group."""

    bonus: dict[str, float]

    @staticmethod
    def read(ev: Evaluation | None) -> Signals:
        bonus: dict[str, float] = {}
        if ev is None:
            return Signals(bonus)
        if not ev.status.is_ok:
            # A broken parent: rewriting it from a recipe is the safe move.
            return Signals({"recipe": 2.0})
        big = [s.copy_bw_fraction for s in ev.shapes if s.bytes_moved >= SMALL_SHAPE_BYTES]
        small = [s.speedup for s in ev.shapes if 0 < s.bytes_moved < SMALL_SHAPE_BYTES]
        if big and sum(big) / len(big) < 0.6:  # far from the copy roofline: wider accesses
            bonus["recipe"] = bonus.get("recipe", 0.0) + 1.0
            bonus["memory"] = bonus.get("memory", 0.0) + 0.5
        if small and min(small) < 1.05:  # small shapes not helped: launch shape matters
            bonus["launch"] = bonus.get("launch", 0.0) + 0.7
        if (ev.local_bytes or 0) > 0:  # spills: no more unrolling
            bonus["loops"] = bonus.get("loops", 0.0) - 3.0
        return Signals(bonus)


def candidate_plans(recipes: Sequence[str], applied: Sequence[str]) -> list[tuple[str, ...]]:
    """Single steps and the useful combinations, minus steps the parent already has."""
    done = set(applied)
    singles = [(s,) for s in (*recipes, *GENERIC) if s not in done]
    combos: list[tuple[str, ...]] = []
    for r in recipes:
        if r.startswith("codegen:"):
            # Generated code follows the reference's exact fp32 ops: only the intrinsics (a
            # few ulp) are worth a try, not the flag's approximate division.
            combos.append((r, "fast_math_intrinsics"))
            continue
        combos += [(r, "fast_math_intrinsics"), (r, "fast_math_flag"), (r, "fast_math_intrinsics", "fast_math_flag")]
    combos += [
        ("restrict", "launch_bounds"),
        ("tunable_block", "launch_bounds"),
        ("restrict", "fast_math_intrinsics"),
        ("fast_math_intrinsics", "fast_math_flag"),
        ("tunable_block", "grid_stride"),
    ]
    combos = [c for c in combos if not (set(c) & done)]
    return singles + combos


def rank_plans(
    plans: Sequence[tuple[str, ...]],
    strategy: Strategy,
    knowledge: Knowledge,
    signals: Signals,
    rng: random.Random,
    parent_is_recipe: bool,
) -> list[tuple[str, ...]]:
    """Orders the allowed plans, best first."""
    scored = []
    for plan in plans:
        if not knowledge.allows(plan):
            continue
        score = max(strategy.rank(s) + signals.bonus.get(group_of(s), 0.0) for s in plan)
        if len(plan) > 1:  # combinations rank against singles by the strategy's taste
            score += strategy.combine - 1.0 - 0.3 * (len(plan) - 2)
        if parent_is_recipe and is_rewrite(plan[0]):
            score -= 3.0  # the parent is already a recipe: refine it before replacing it
        score += rng.uniform(0.0, strategy.jitter)
        scored.append((score, plan))
    scored.sort(key=lambda x: -x[0])
    return [p for _, p in scored]
