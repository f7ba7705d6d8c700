"""The embedded coder: applies a plan to the parent source and checks the result.

A result is kept only if it is a complete variant file that keeps the entry point and
argument list, whose launch header resolves on every shape of the kernel (search and
held-out) and every tunable value within the device's limits, and that admission
(:func:`evaluators.admit.admit`) accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents.embedded.recipes import Recipe, RecipeError
from agents.embedded.transforms import GENERIC, Target
from evaluators.admit import Refusal, admit
from kernels.launch import DeviceLimits, LaunchSpecError, check_limits, parse_launch_header
from kernels.spec import KernelSpec, shape_label

# The device the search targets (the H200's limits); the evaluator checks again with its own.
LIMITS = DeviceLimits()


@dataclass(frozen=True)
class Applied:
    """The outcome of one plan: the new source and the steps that made it."""

    source: str
    steps: tuple[str, ...]
    transformations: tuple[str, ...]  # everything applied since the last recipe, in order


def apply_plan(
    spec: KernelSpec, source: str, applied: Sequence[str], plan: Sequence[str], recipes: dict[str, Recipe]
) -> Applied | None:
    """Applies the steps in order; None if a step does not apply (the plan would repeat a
    shorter one) or a recipe does not fit the kernel."""
    target = Target(spec.name, spec.shape_symbols)
    history = list(applied)
    for step in plan:
        if step in recipes:
            try:
                source = recipes[step].build(spec)
            except RecipeError:
                return None
            history = [step]  # a recipe replaces the whole source
            continue
        new = GENERIC[step](source, target)
        if new is None:
            return None
        source = new
        history.append(step)
    return Applied(source, tuple(plan), tuple(history))


def launch_problem(spec: KernelSpec, source: str, limits: DeviceLimits = LIMITS) -> str | None:
    """Why the launch header is unusable on some shape and tunable assignment, or None.

    Admission checks one assignment; the coder checks every one, since the search will try
    them all."""
    try:
        launch = parse_launch_header(source)
        spec.check_launch(launch)
        for shape in (*spec.search_shapes, *spec.heldout_shapes):
            for params in launch.param_grid():
                check_limits(launch.resolve(shape, params), limits, f"at shape {shape_label(shape)} with {params}")
    except LaunchSpecError as exc:
        return str(exc)
    return None


def check_variant(spec: KernelSpec, source: str, dtype: str) -> str | None:
    """Launch header at every tunable assignment, then admission (signature, static checks,
    the sandboxed compile) at the default tunables; the reason the variant is unusable, or
    None."""
    problem = launch_problem(spec, source)
    if problem:
        return problem
    outcome = admit(spec, source, dtype, limits=LIMITS)
    return outcome.message if isinstance(outcome, Refusal) else None
