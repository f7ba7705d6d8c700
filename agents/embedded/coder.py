"""The embedded coder: applies a plan to the parent source and checks the result.

A result is kept only if it is a complete variant file that keeps the entry point and
argument list, whose launch header resolves on every shape of the kernel (search and
held-out) and every tunable value within the hardware's limits, and that compiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents.embedded.recipes import Recipe, RecipeError
from agents.embedded.transforms import GENERIC, Target
from evaluators.compile import compile_variant
from kernels.launch import LaunchSpecError, parse_launch_header
from kernels.spec import KernelSpec, KernelSpecError, check_signature

MAX_THREADS = 1024
MAX_SMEM_BYTES = 227 * 1024  # opt-in shared memory per block on sm_90
MAX_GRID_YZ = 65535
MAX_GRID_X = 2**31 - 1


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


def launch_problem(spec: KernelSpec, source: str) -> str | None:
    """Why the launch header is unusable on some shape and tunable assignment, or None."""
    try:
        launch = parse_launch_header(source)
        spec.check_launch(launch)
        for shape in (*spec.search_shapes, *spec.heldout_shapes):
            for params in launch.param_grid():
                cfg = launch.resolve(shape, params)
                threads = cfg.block[0] * cfg.block[1] * cfg.block[2]
                if threads > MAX_THREADS:
                    return f"{threads} threads per block at {shape} {params}"
                if cfg.smem_bytes > MAX_SMEM_BYTES:
                    return f"{cfg.smem_bytes} bytes of shared memory at {shape} {params}"
                if cfg.grid[0] > MAX_GRID_X or max(cfg.grid[1:]) > MAX_GRID_YZ:
                    return f"grid {cfg.grid} too large at {shape} {params}"
    except LaunchSpecError as exc:
        return str(exc)
    return None


def check_variant(spec: KernelSpec, source: str, dtype: str) -> str | None:
    """Signature, launch header and an NVRTC compile at the default tunables; the reason
    the variant is unusable, or None."""
    try:
        check_signature(spec, source)
    except KernelSpecError as exc:
        return str(exc)
    problem = launch_problem(spec, source)
    if problem:
        return problem
    defaults = parse_launch_header(source).default_params()
    result = compile_variant(source, spec.name, dtype, defaults)
    return None if result.ok else result.log[-2000:]
