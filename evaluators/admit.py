"""Admission: the one door from a variant's source to something the GPU may run.

Every caller (the search's compile tasks, the GPU and stand-in evaluators, the sanitizer, both
coders' pre-checks, ``python -m evaluators.check``) turns ``(kernel, source, dtype,
parameters)`` into an :class:`Artifact` or a :class:`Refusal` here and nowhere else:

1. the launch header parses, names only the kernel's integer arguments and tunables, and the
   parameters are among the declared values (defaults filled in);
2. the entry point keeps the spec's C signature;
3. the launch resolves on every shape the spec lists within the device's limits;
4. the source passes the static checks (includes, flags, routes to the file system);
5. NVRTC compiles it (cached on disk by everything that changes the binary) and the binary
   holds the entry.

The artifact carries the cubin, so the evaluator loads it instead of compiling again; across
Ray it travels as an object (see :mod:`search.pool`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from evaluators.compile import CompileResult, compile_variant
from kernels.launch import (
    DeviceLimits,
    LaunchConfig,
    LaunchLimitError,
    LaunchSpec,
    LaunchSpecError,
    check_limits,
    parse_launch_header,
)
from kernels.spec import KernelSpec, KernelSpecError, Shape, check_signature, shape_label
from kernels.verdict import Status


@dataclass(frozen=True)
class Artifact:
    """A variant that passed admission: what the evaluator needs to run it, and nothing to
    compile.

    Attributes:
        kernel: the spec's name (the entry symbol).
        variant_id: the source's id.
        dtype: run dtype it was compiled for.
        params: the full parameter assignment (defaults filled in).
        launch: the parsed launch header (resolved per shape by :meth:`launches`).
        cubin: the binary.
        arch: the architecture it was compiled for.
        compile_key: the compile cache key.
        binary_key: identity of what would run: cubin, launch expressions, parameters, dtype.
        compile_s: compile time (0 when served from the cache).
        log: the compiler's log, cut to a sane length.
        registers / spill_bytes / stack_bytes / smem_bytes: from the ptxas report.
    """

    kernel: str
    variant_id: str
    dtype: str
    params: dict[str, int]
    launch: LaunchSpec
    cubin: bytes
    arch: str
    compile_key: str
    binary_key: str
    compile_s: float = 0.0
    log: str = ""
    registers: int | None = None
    spill_bytes: int | None = None
    stack_bytes: int | None = None
    smem_bytes: int | None = None

    def launches(self, shapes: Iterable[Shape], limits: DeviceLimits) -> dict[str, LaunchConfig]:
        """The resolved launch of each shape, keyed by shape label, each within ``limits``.

        Raises:
            LaunchLimitError: a shape's launch exceeds the device's limits.
            LaunchSpecError: a shape's launch does not resolve (non-positive size).
        """
        out = {}
        for shape in shapes:
            cfg = self.launch.resolve(shape, self.params)
            check_limits(cfg, limits, f"at shape {shape_label(shape)} with {self.params}")
            out[shape_label(shape)] = cfg
        return out

    def summary(self) -> Admitted:
        """The small part the search driver keeps (no cubin)."""
        return Admitted(self.variant_id, self.params, self.compile_key, self.binary_key, self.compile_s)


@dataclass(frozen=True)
class Admitted:
    """What the driver needs to know of an artifact it does not hold."""

    variant_id: str
    params: dict[str, int]
    compile_key: str
    binary_key: str
    compile_s: float = 0.0


@dataclass(frozen=True)
class Refusal:
    """Why a variant cannot run: COMPILE_ERROR (header, signature, static check, compiler) or
    RESOURCE_ERROR (a launch or binary beyond the limits), with a one-paragraph reason."""

    status: Status
    message: str
    params: dict[str, int] = field(default_factory=dict)
    compile_s: float = 0.0
    compile_key: str = ""


MAX_LOG_CHARS = 4000


def clip_log(log: str, limit: int = MAX_LOG_CHARS) -> str:
    """A compiler log cut to ``limit`` characters (its head holds the first error)."""
    log = log.strip()
    return log if len(log) <= limit else log[:limit] + f"\n... ({len(log) - limit} more characters cut)"


def binary_key(result: CompileResult, launch: LaunchSpec, params: Mapping[str, int], dtype: str) -> str:
    h = hashlib.sha256(result.cubin)
    exprs = [e.text for e in (*launch.grid, *launch.block, launch.smem)]
    h.update(repr((exprs, sorted(params.items()), dtype)).encode())
    return h.hexdigest()[:32]


def _front(spec: KernelSpec, source: str, params: Mapping[str, int],
           shapes: Iterable[Shape], limits: DeviceLimits) -> tuple[LaunchSpec, dict[str, int]]:
    launch = parse_launch_header(source)
    spec.check_launch(launch)
    full = launch.validate_params(params)
    check_signature(spec, source)
    for shape in shapes:
        check_limits(launch.resolve(shape, full), limits, f"at shape {shape_label(shape)} with {full}")
    return launch, full


def admit(spec: KernelSpec, source: str, dtype: str, params: Mapping[str, int] | None = None, *,
          arch: str | None = None, limits: DeviceLimits | None = None,
          shapes: Iterable[Shape] | None = None) -> Artifact | Refusal:
    """Admits one variant at one parameter assignment, or says why not.

    Args:
        spec: the kernel.
        source: the variant file.
        dtype: run dtype.
        params: tunable values (missing ones take their defaults).
        arch: compile target (default: :data:`evaluators.compile.DEFAULT_ARCH`).
        limits: the device's launch limits (default: the H200's).
        shapes: the shapes whose launches must fit (default: the spec's search and held-out).

    Returns:
        An :class:`Artifact`, or a :class:`Refusal` whose status is the verdict.
    """
    limits = limits or DeviceLimits()
    chosen = tuple(shapes) if shapes is not None else (*spec.search_shapes, *spec.heldout_shapes)
    try:
        launch, full = _front(spec, source, params or {}, chosen, limits)
    except LaunchLimitError as exc:
        return Refusal(Status.RESOURCE_ERROR, str(exc), dict(params or {}))
    except (LaunchSpecError, KernelSpecError) as exc:
        return Refusal(Status.COMPILE_ERROR, str(exc), dict(params or {}))
    result = compile_variant(source, spec.name, dtype, full, arch)
    if not result.ok:
        return Refusal(Status.COMPILE_ERROR, clip_log(result.log), full, result.seconds, result.key)
    variant_id = _variant_id(source)
    return Artifact(
        kernel=spec.name, variant_id=variant_id, dtype=dtype, params=full, launch=launch,
        cubin=result.cubin, arch=arch or _default_arch(), compile_key=result.key,
        binary_key=binary_key(result, launch, full, dtype), compile_s=result.seconds,
        log=clip_log(result.log), registers=result.registers, spill_bytes=result.spill_bytes,
        stack_bytes=result.stack_bytes, smem_bytes=result.smem_bytes,
    )


def _variant_id(source: str) -> str:
    from kernels.variant import source_hash

    return source_hash(source)


def _default_arch() -> str:
    from evaluators.compile import DEFAULT_ARCH

    return DEFAULT_ARCH
