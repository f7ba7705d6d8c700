"""Seeded strategies: the order in which an embedded agent tries families of changes.

Agents of one population get different strategies (by seed, or by name) so that eight
agents explore eight orders of the same catalogue instead of one chain eight times.
"""

from __future__ import annotations

from dataclasses import dataclass

# Groups of steps; a step's group decides where a strategy ranks it.
GROUPS: dict[str, tuple[str, ...]] = {
    "recipe": (),  # every ``recipe:*`` and ``codegen:*`` step (16-byte vectors, warp reductions, tunables)
    "launch": ("tunable_block", "launch_bounds", "grid_stride"),
    "fastmath": ("fast_math_intrinsics", "fast_math_flag"),
    "memory": ("restrict", "read_only_cache"),
    "loops": ("unroll",),
}


def is_rewrite(step: str) -> bool:
    """Steps that replace the whole source: family recipes and generated schedules."""
    return step.startswith(("recipe:", "codegen:"))


def group_of(step: str) -> str:
    # Generated schedules rank with the recipes: both are complete fast kernels.
    if is_rewrite(step):
        return "recipe"
    for group, steps in GROUPS.items():
        if step in steps:
            return group
    raise KeyError(f"unknown step {step!r}")


@dataclass(frozen=True)
class Strategy:
    """How one agent orders its candidate plans.

    Attributes:
        name: the strategy's name (also part of the agent's name).
        order: groups, most preferred first.
        combine: preference for multi-step plans (a recipe with fast math, ...): 1 ranks them
            with their best single step, above 1 ahead of it.
        jitter: size of the seeded random perturbation of plan scores (0: deterministic).
    """

    name: str
    order: tuple[str, ...]
    combine: float = 0.5
    jitter: float = 0.3

    def rank(self, step: str) -> float:
        """Preference of one step: 5 for the first group down to 1 for the last."""
        group = group_of(step)
        return float(len(self.order) - self.order.index(group)) if group in self.order else 0.0


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("family-recipe-first", ("recipe", "fastmath", "launch", "memory", "loops"), combine=1.4),
        Strategy("vectorize-first", ("recipe", "memory", "loops", "launch", "fastmath"), combine=0.3),
        Strategy("launch-config-first", ("launch", "recipe", "memory", "fastmath", "loops"), combine=0.5),
        Strategy("fast-math-first", ("fastmath", "recipe", "launch", "memory", "loops"), combine=1.0),
        Strategy("explore", ("recipe", "launch", "fastmath", "memory", "loops"), combine=0.5, jitter=3.0),
    )
}
DEFAULT_ORDER = tuple(STRATEGIES)


def pick_strategy(seed: int, name: str | None = None) -> Strategy:
    """The named strategy, or one chosen by seed (seeds 0..4 cover all five).

    Raises:
        KeyError: an unknown strategy name; the message lists the known ones.
    """
    if name is None:
        return STRATEGIES[DEFAULT_ORDER[seed % len(DEFAULT_ORDER)]]
    if name not in STRATEGIES:
        raise KeyError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
