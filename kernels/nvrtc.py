"""Plain NVRTC: a variant file's compile options and one compile in this process.

NVRTC compiles device code on the CPU, so everything here works without a GPU. The search
compiles untrusted variants through the evaluators' sandbox and disk cache
(:mod:`evaluators.compile`), which build on this module and on the static checks of
:mod:`kernels.compile_checks`; ``python -m kernels.check`` compiles a spec author's own
baseline with it directly.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kernels.compile_checks import C_LIMITS, CompileRefused

DEFAULT_ARCH = "sm_90"  # the H200
# Compiler flags a variant may ask for with '// flags: ...'.
ALLOWED_FLAGS = re.compile(
    r"^(--use_fast_math|-use_fast_math|--extra-device-vectorization|-ftz=(true|false)|"
    r"-prec-div=(true|false)|-prec-sqrt=(true|false)|-fmad=(true|false)|-maxrregcount=\d{1,3})$"
)
SCALAR_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"}
_PRELUDE = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda_fp8.h>\n" + "".join(
    f"#ifndef {name}\n#define {name} {value}\n#endif\n" for name, value in C_LIMITS.items()
)
_FLAGS_RE = re.compile(r"^\s*//\s*flags\s*:(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class NvrtcOutput:
    """What NVRTC made of one translation unit.

    Attributes:
        ok: a binary was produced (within ``max_cubin_bytes`` when one was given).
        cubin: the binary (empty when not ok).
        log: NVRTC's log: errors, warnings and, with ``--ptxas-options=-v``, the resource report.
        limit: "memory" (NVRTC ran out of memory), "cubin_bytes" (the binary is too large), or "".
    """

    ok: bool
    cubin: bytes
    log: str
    limit: str = ""


def cache_root() -> Path:
    """Where compiled results are kept: ``$KERNEL_SEARCH_CACHE`` or ``~/.cache/kernel-search``."""
    root = os.environ.get("KERNEL_SEARCH_CACHE") or os.path.join(Path.home(), ".cache", "kernel-search")
    return Path(root)


@lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """Folders holding the CUDA headers the prelude includes (NVRTC ships only some of them)."""
    dirs: list[str] = []
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
        if found:
            dirs.append(str(found))
    except Exception:  # older cuda-bindings without pathfinder: fall back to CUDA_HOME
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / "cuda_fp16.h").is_file():
            dirs.append(str(Path(root) / "include"))
    return tuple(dict.fromkeys(dirs))


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def variant_flags(source: str) -> list[str]:
    """The ``// flags:`` of a variant, each checked against the allowed list.

    Raises:
        CompileRefused: a flag outside :data:`ALLOWED_FLAGS`.
    """
    flags: list[str] = []
    for line in _FLAGS_RE.findall(source):
        for flag in line.split():
            if not ALLOWED_FLAGS.match(flag):
                raise CompileRefused(
                    f"compiler flag {flag!r} is not allowed; allowed: --use_fast_math, -ftz=, "
                    "-prec-div=, -prec-sqrt=, -fmad=, -maxrregcount=N, --extra-device-vectorization"
                )
            flags.append(flag)
    return flags


def build_options(
    source: str, dtype: str, defines: Mapping[str, int], arch: str = DEFAULT_ARCH
) -> list[str]:
    """NVRTC options: target, C++ standard, resource report, the variant's flags and macros.

    Raises:
        CompileRefused: an unknown dtype or a flag outside the allowed list.
    """
    if dtype not in SCALAR_TYPES:
        raise CompileRefused(f"unknown dtype {dtype!r}; expected one of {sorted(SCALAR_TYPES)}")
    opts = [f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v", "-default-device"]
    opts += [f"-I{d}" for d in include_dirs()]
    opts += variant_flags(source)
    opts.append(f"-Dscalar_t={SCALAR_TYPES[dtype]}")
    for name, value in sorted(defines.items()):
        opts.append(f"-D{name}={int(value)}")
    return opts


def full_source(source: str) -> str:
    """The translation unit NVRTC sees: the prelude, which gives every variant the
    half/bf16/fp8 types and the C limits (:data:`kernels.compile_checks.C_LIMITS`), then the
    variant under a #line that keeps log lines true."""
    return _PRELUDE + '#line 1 "variant.cu"\n' + source


def cache_key(source: str, options: Sequence[str], entry: str) -> str:
    """A key for what compiling ``source`` with ``options`` for ``entry`` gives: the full
    source after the prelude, the options (macros included; include paths, which differ
    between machines, left out), the entry and the NVRTC version."""
    h = hashlib.sha256()
    for part in (full_source(source), "\0".join(o for o in options if not o.startswith("-I")), entry, nvrtc_version()):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()[:32]


def compile_program(source: str, options: Sequence[str], max_cubin_bytes: int | None = None) -> NvrtcOutput:
    """Compiles one full translation unit (see :func:`full_source`) in this process.

    A binary larger than ``max_cubin_bytes`` is refused before it is copied out of NVRTC.
    """
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"variant.cu", 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return NvrtcOutput(False, b"", f"nvrtcCreateProgram failed: {err}")
    try:
        encoded = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.decode(errors="replace").rstrip("\x00").strip()
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return NvrtcOutput(False, b"", log or str(result), "memory" if "out of memory" in log else "")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        if max_cubin_bytes is not None and size > max_cubin_bytes:
            return NvrtcOutput(False, b"", f"resource limit: the binary is {size} bytes, more than the "
                               f"{max_cubin_bytes} allowed (large initialised __device__ or __constant__ data?)"
                               f"\n{log}", "cubin_bytes")
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return NvrtcOutput(True, bytes(cubin), log)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def entry_compiled(log: str, cubin: bytes, entry: str) -> bool:
    """Whether the binary holds an unmangled kernel named exactly ``entry``: the ptxas report
    names it, or the binary has its text section (the report is not always in the log)."""
    return f"Compiling entry function '{entry}'" in log or (b".text." + entry.encode() + b"\x00") in cubin
