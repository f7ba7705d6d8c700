"""NVRTC compilation of variant files to cubins, on the CPU, sandboxed and cached on disk.

No GPU is needed: NVRTC compiles device code only, so compiling fans out over CPU workers
and is tested in CI. The options, the prelude and the NVRTC call itself are the plain ones of
:mod:`kernels.nvrtc`; this module adds what untrusted sources need (the static
checks of :mod:`kernels.compile_checks` on source and binary, the bounded sandbox process) and
the disk cache, whose key covers everything that changes the binary: the full source after the prelude, the options (macros
included), the target architecture and the NVRTC version.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from evaluators.compile_sandbox import CompileLimits, SandboxOutcome, sandbox_compile
from kernels.compile_checks import (
    ALLOWED_INCLUDES,
    CompileRefused,
    binary_stack_bytes,
    check_services,
    check_source_routes,
)
from kernels.nvrtc import (
    DEFAULT_ARCH,
    build_options,
    cache_key,
    cache_root,
    entry_compiled,
    full_source,
    nvrtc_version,
)
from kernels.records import atomic_write

__all__ = [
    "ALLOWED_INCLUDES", "DEFAULT_ARCH", "CompileLimits", "CompileRefused", "CompileResult",
    "build_options", "cache_key", "check_includes", "compile_variant", "nvrtc_version", "target_arch",
]


@dataclass(frozen=True)
class CompileResult:
    """Outcome of one compilation.

    Attributes:
        ok: a cubin was produced.
        cubin: the binary (empty when not ok).
        log: NVRTC's log (errors, warnings and the ptxas resource report).
        key: cache key.
        seconds: compile time (0 when served from the cache).
        cached: served from the disk cache.
        registers / spill_bytes / stack_bytes: from the ptxas report of the entry function
            (stack bytes: the larger of its frame and its cumulative stack size).
        limit: the limit that refused it: "timeout" or "memory" (the compile was stopped),
            "cubin_bytes" or "stack_bytes" (the binary is too large), "" for none.
    """

    ok: bool
    cubin: bytes
    log: str
    key: str
    seconds: float = 0.0
    cached: bool = False
    registers: int | None = None
    spill_bytes: int | None = None
    stack_bytes: int | None = None
    smem_bytes: int | None = None
    options: tuple[str, ...] = field(default=())
    limit: str = ""

    @property
    def resource_error(self) -> bool:
        """The binary exceeds a resource limit (a RESOURCE_ERROR verdict, not COMPILE_ERROR)."""
        return self.limit in ("cubin_bytes", "stack_bytes")


def default_cache_dir() -> Path:
    return cache_root() / "cubin"


def target_arch() -> str:
    """The local GPU's architecture if torch sees one, else sm_90 (the H200)."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # torch missing or broken CUDA: compile for the default target
        pass
    return DEFAULT_ARCH


def check_includes(source: str) -> None:
    """Refuses every preprocessor route to the file system (see
    :func:`kernels.compile_checks.check_source_routes`).

    Raises:
        CompileRefused: a forbidden header, directive, pragma, identifier or character.
    """
    check_source_routes(source)


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores")
_PTXAS_CUMULATIVE = re.compile(r"(\d+) bytes cumulative stack size")
_PTXAS_SMEM = re.compile(r"Used \d+ registers.*?(\d+) bytes smem")
# Limits whose refusal is a property of the source under a given limit value, recorded with
# that value in the cache: a later compile under the same or a tighter limit reuses it.
_CACHED_LIMITS = {"timeout": "timeout_s", "memory": "memory_bytes", "cubin_bytes": "cubin_bytes"}


def _entry_report(log: str, entry: str) -> str:
    """The part of the ptxas report about ``entry``: from its 'Compiling entry function' line
    to its 'Compile time' line. Other kernels and non-inlined device functions of the same
    file have their own parts, before or after it."""
    start = log.find(f"Compiling entry function '{entry}'")
    if start < 0:
        return ""
    end = log.find("Compile time", start)
    return log[start : end if end >= 0 else len(log)]


def _resources(log: str, entry: str) -> tuple[int | None, int | None, int | None, int | None]:
    """(registers, spill bytes, stack bytes, static shared memory) of ``entry`` from the ptxas
    report; stack bytes are the larger of its own frame and the cumulative stack of its calls."""
    log = _entry_report(log, entry)
    regs = _PTXAS_REGS.findall(log)
    stack = _PTXAS_STACK.findall(log)
    cumulative = _PTXAS_CUMULATIVE.findall(log)
    smem = _PTXAS_SMEM.findall(log)
    frames = [int(stack[-1][0])] if stack else []
    frames += [int(c) for c in cumulative[-1:]]
    return (
        int(regs[-1]) if regs else None,
        int(stack[-1][1]) if stack else None,
        max(frames) if frames else None,
        int(smem[-1]) if smem else (0 if regs else None),
    )


def _judge(cubin: bytes, log: str, entry: str, limits: CompileLimits) -> tuple[str, str]:
    """Checks a compiled binary; returns ("", "") or (the reason it is refused, the limit).

    Runs on every result, cached ones included, so a tighter limit applies to old entries.
    """
    # An entry counts only as an unmangled __global__ symbol of exactly that name: a C++
    # (mangled) kernel or another kernel whose name merely contains ``entry`` cannot be loaded.
    if not entry_compiled(log, cubin, entry):
        return f'no kernel named {entry} in the binary (use extern "C" __global__ void {entry}(...))', ""
    try:
        check_services(cubin)
    except CompileRefused as exc:
        return str(exc), ""
    if len(cubin) > limits.cubin_bytes:
        return f"resource limit: the binary is {len(cubin)} bytes, more than the {limits.cubin_bytes} allowed", "cubin_bytes"
    stack = _resources(log, entry)[2]
    source = "ptxas report"
    if stack is None:  # no report for the entry: the largest frame of any function in the binary
        stack, source = binary_stack_bytes(cubin), "largest frame in the binary; no ptxas report for the entry"
    if stack > limits.stack_bytes:
        return (f"resource limit: {stack} bytes of stack per thread ({source}), more than the "
                f"{limits.stack_bytes} allowed (large local arrays?)"), "stack_bytes"
    return "", ""


def _cached(meta_path: Path, bin_path: Path, limits: CompileLimits) -> SandboxOutcome | None:
    """The cached outcome, if there is one that still holds under ``limits``."""
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    limit = meta.get("limit", "")
    if limit in _CACHED_LIMITS and getattr(limits, _CACHED_LIMITS[limit]) > meta.get("limit_value", 0):
        return None  # refused under a tighter limit than today's: compile again
    cubin = bin_path.read_bytes() if meta["ok"] and bin_path.is_file() else b""
    if meta["ok"] and not cubin:
        return None  # the binary was lost
    return SandboxOutcome(meta["ok"], cubin, meta["log"], 0.0, limit)


def compile_variant(
    source: str,
    entry: str,
    dtype: str,
    defines: Mapping[str, int] | None = None,
    arch: str | None = None,
    cache_dir: Path | None = None,
    *,
    limits: CompileLimits | None = None,
) -> CompileResult:
    """Compiles a variant file to a cubin for ``arch`` in the sandbox, using the disk cache.

    A source that could reach files or asks for forbidden flags is refused before NVRTC sees
    it; NVRTC errors, limits that stopped the compile (``limit`` says which) and refused
    binaries (device printf or heap, too large, too much stack) come back with ``ok=False``
    and the reason in ``log``. Only a broken NVRTC installation raises.
    """
    arch = arch or DEFAULT_ARCH
    limits = limits or CompileLimits()
    try:
        check_includes(source)
        options = build_options(source, dtype, defines or {}, arch)
    except CompileRefused as exc:
        return CompileResult(ok=False, cubin=b"", log=str(exc), key="")
    key = cache_key(source, options, entry)
    cache = (cache_dir or default_cache_dir()) / key[:2]
    meta_path, bin_path = cache / f"{key}.json", cache / f"{key}.cubin"
    outcome = _cached(meta_path, bin_path, limits)
    cached = outcome is not None
    if outcome is None:
        outcome = sandbox_compile(full_source(source), options, limits)
        if outcome.ok:
            atomic_write(bin_path, outcome.cubin)
        if outcome.cacheable:
            meta = {"ok": outcome.ok, "log": outcome.log, "options": options, "limit": outcome.limit}
            if outcome.limit in _CACHED_LIMITS:
                meta["limit_value"] = getattr(limits, _CACHED_LIMITS[outcome.limit])
            atomic_write(meta_path, json.dumps(meta).encode())
    ok, cubin, log, limit = outcome.ok, outcome.cubin, outcome.log, outcome.limit
    if ok:
        reason, limit = _judge(cubin, log, entry, limits)
        if reason:
            ok, cubin, log = False, b"", f"{reason}\n{log}".strip()
    return CompileResult(ok, cubin, log, key, outcome.seconds, cached, *_resources(log, entry), tuple(options), limit=limit)
