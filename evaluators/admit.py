"""Admission: the one door from a variant's source to something the GPU may run.

Every caller (the search's compile tasks, the GPU and stand-in evaluators, the sanitizer, both
coders' pre-checks, ``python -m evaluators.check``) turns ``(kernel, source, dtype,
parameters)`` into an :class:`Artifact` or a :class:`Refusal` here and nowhere else:

1. the launch header parses, names only the kernel's integer arguments and tunables, and the
   parameters are among the declared values (defaults filled in);
2. the entry point keeps the spec's C signature;
3. the launch resolves on every shape the spec lists within the device's limits;
4. the source passes the static checks (includes, flags, every preprocessor route to the
   file system: :mod:`kernels.compile_checks`);
5. NVRTC compiles it in a bounded sandbox (:mod:`evaluators.compile_sandbox`: no secrets in
   its environment, wall-clock and memory limits; cached on disk by everything that changes
   the binary), and the binary holds the entry, calls no device-runtime service (printf,
   heap) and stays within the binary-size and per-thread stack limits.

Refusals are COMPILE_ERROR (header, signature, static checks, the compiler, a compile
stopped by its time or memory limit) or RESOURCE_ERROR (a launch beyond the device's limits,
a binary too large or with too much stack), each with a message cut to
:data:`MAX_LOG_CHARS`.

The artifact carries the cubin, so the evaluator loads it instead of compiling again; across
Ray it travels as an object (see :mod:`search.pool`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from evaluators.compile import DEFAULT_ARCH, CompileLimits, CompileResult, compile_variant
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
from kernels.variant import source_hash
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


def check_front(spec: KernelSpec, source: str, params: Mapping[str, int] | None = None, *,
                limits: DeviceLimits | None = None,
                shapes: Iterable[Shape] | None = None) -> tuple[LaunchSpec, dict[str, int]] | Refusal:
    """Admission without the compile: header, names, parameters, signature, launch limits.

    Args:
        spec: the kernel.
        source: the variant file.
        params: tunable values (missing ones take their defaults).
        limits: the device's launch limits (default: the H200's).
        shapes: the shapes whose launches must fit (default: the spec's search and held-out).

    Returns:
        The parsed launch header and the full parameter assignment, or a :class:`Refusal`.
    """
    limits = limits or DeviceLimits()
    chosen = tuple(shapes) if shapes is not None else (*spec.search_shapes, *spec.heldout_shapes)
    try:
        launch = parse_launch_header(source)
        spec.check_launch(launch)
        full = launch.validate_params(params or {})
        check_signature(spec, source)
        for shape in chosen:
            check_limits(launch.resolve(shape, full), limits, f"at shape {shape_label(shape)} with {full}")
    except LaunchLimitError as exc:
        return Refusal(Status.RESOURCE_ERROR, clip_log(str(exc)), dict(params or {}))
    except (LaunchSpecError, KernelSpecError) as exc:
        return Refusal(Status.COMPILE_ERROR, clip_log(str(exc)), dict(params or {}))
    return launch, full


def admit(spec: KernelSpec, source: str, dtype: str, params: Mapping[str, int] | None = None, *,
          arch: str | None = None, limits: DeviceLimits | None = None,
          shapes: Iterable[Shape] | None = None, compile_limits: CompileLimits | None = None,
          cache_dir: Path | None = None) -> Artifact | Refusal:
    """Admits one variant at one parameter assignment, or says why not.

    Args:
        spec: the kernel.
        source: the variant file.
        dtype: run dtype.
        params: tunable values (missing ones take their defaults).
        arch: compile target (default: :data:`evaluators.compile.DEFAULT_ARCH`).
        limits: the device's launch limits (default: the H200's).
        shapes: the shapes whose launches must fit (default: the spec's search and held-out).
        compile_limits: the compile's time, memory, binary-size and stack limits (default:
            :class:`evaluators.compile.CompileLimits`).
        cache_dir: the compile cache (default: :func:`evaluators.compile.default_cache_dir`).

    Returns:
        An :class:`Artifact`, or a :class:`Refusal` whose status is the verdict.
    """
    front = check_front(spec, source, params, limits=limits, shapes=shapes)
    if isinstance(front, Refusal):
        return front
    launch, full = front
    arch = arch or DEFAULT_ARCH
    result = compile_variant(source, spec.name, dtype, full, arch, cache_dir, limits=compile_limits)
    if not result.ok:
        status = Status.RESOURCE_ERROR if result.resource_error else Status.COMPILE_ERROR
        return Refusal(status, clip_log(result.log or "compilation failed without a log"), full,
                       result.seconds, result.key)
    return Artifact(
        kernel=spec.name, variant_id=source_hash(source), dtype=dtype, params=full, launch=launch,
        cubin=result.cubin, arch=arch, compile_key=result.key,
        binary_key=binary_key(result, launch, full, dtype), compile_s=result.seconds,
        log=clip_log(result.log), registers=result.registers, spill_bytes=result.spill_bytes,
        stack_bytes=result.stack_bytes, smem_bytes=result.smem_bytes,
    )
