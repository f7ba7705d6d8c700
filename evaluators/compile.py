"""NVRTC compilation of variant files to cubins, on the CPU, cached on disk.

No GPU is needed: NVRTC compiles device code only, so compiling fans out over CPU workers
and is tested in CI. The cache key covers everything that changes the binary: the full
source after the prelude, the options (macros included), the target architecture and the
NVRTC version.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from kernels.records import atomic_write

DEFAULT_ARCH = "sm_90"
# Headers a variant may include; anything else could read files of the harness at compile time.
# Only headers NVRTC itself can find: it ships no C library headers (stdint.h, float.h, ...).
ALLOWED_INCLUDES = frozenset({"cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "math_constants.h"})
# Compiler flags a variant may ask for with '// flags: ...'.
ALLOWED_FLAGS = re.compile(
    r"^(--use_fast_math|-use_fast_math|--extra-device-vectorization|-ftz=(true|false)|"
    r"-prec-div=(true|false)|-prec-sqrt=(true|false)|-fmad=(true|false)|-maxrregcount=\d{1,3})$"
)
_PRELUDE = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda_fp8.h>\n"
# Any include-like directive (also spelled with the digraph %: or the trigraph ??=); its operand
# must be a literal <name> or "name": a macro operand could name any file on the machine.
_INCLUDE_RE = re.compile(r"^[ \t]*(?:#|%:|\?\?=)[ \t]*(include\w*|import|embed)\b(.*)$", re.MULTILINE)
_INCLUDE_OPERAND_RE = re.compile(r'^(?:<([^<>"]+)>|"([^<>"]+)")$')
# The tokens that decide where a comment starts: raw strings (which span lines), identifiers,
# numbers (with ' digit separators), string and character literals, then the two comments.
# Tokenising in the compiler's order keeps a '/*' inside a literal from hiding a directive.
_TOKEN_RE = re.compile(
    r"""(?P<raw>(?:u8|[uUL])?R"(?P<delim>[^()\\\s"]{0,16})\(.*?\)(?P=delim)")"""
    r"|[A-Za-z_]\w*"
    r"|\.?\d(?:[eEpP][+-]|'\w|[\w.])*"
    r'|"(?:\\.|[^"\\\n])*"'
    r"|'(?:\\.|[^'\\\n])*'"
    r"|(?P<comment>//[^\n]*|/\*.*?\*/)",
    re.DOTALL,
)
_FLAGS_RE = re.compile(r"^\s*//\s*flags\s*:(.*)$", re.MULTILINE)
_SCALAR_T = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"}


class CompileRefused(ValueError):
    """The source asks for something the compiler is not allowed to do (include, flag)."""


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
        registers / spill_bytes / stack_bytes: from the ptxas report of the entry function.
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


def default_cache_dir() -> Path:
    root = os.environ.get("KERNEL_SEARCH_CACHE") or os.path.join(Path.home(), ".cache", "kernel-search")
    return Path(root) / "cubin"


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


@lru_cache(maxsize=1)
def _include_dirs() -> tuple[str, ...]:
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
    """The ``// flags:`` of a variant, each checked against the allowed list."""
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


def _preprocessor_view(source: str) -> str:
    """The source as the preprocessor reads its directives: line splices joined and comments
    blanked (keeping their line breaks, so a directive after a comment still starts a line)."""
    text = source.replace("\\\r\n", "").replace("\\\n", "")

    def blank(m: re.Match[str]) -> str:
        token = m.group(0)
        return " " + "\n" * token.count("\n") if m.group("comment") else token

    return _TOKEN_RE.sub(blank, text)


def check_includes(source: str) -> None:
    """Refuses include directives other than a literal ``<name>`` from :data:`ALLOWED_INCLUDES`.

    Raises:
        CompileRefused: a forbidden header, a macro operand, or another directive that reads files.
    """
    for directive, operand in _INCLUDE_RE.findall(_preprocessor_view(source)):
        m = _INCLUDE_OPERAND_RE.match(operand.strip())
        name = (m.group(1) or m.group(2)).strip() if m else ""
        if directive != "include" or name not in ALLOWED_INCLUDES:
            raise CompileRefused(
                f"#{directive} {operand.strip()} is not allowed; only #include of "
                f"{', '.join(sorted(ALLOWED_INCLUDES))} (device code only, no other files)"
            )


def build_options(
    source: str, dtype: str, defines: Mapping[str, int], arch: str = DEFAULT_ARCH
) -> list[str]:
    """NVRTC options: target, C++ standard, resource report, the variant's flags and macros."""
    if dtype not in _SCALAR_T:
        raise CompileRefused(f"unknown dtype {dtype!r}; expected one of {sorted(_SCALAR_T)}")
    opts = [f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v", "-default-device"]
    opts += [f"-I{d}" for d in _include_dirs()]
    opts += variant_flags(source)
    opts.append(f"-Dscalar_t={_SCALAR_T[dtype]}")
    for name, value in sorted(defines.items()):
        opts.append(f"-D{name}={int(value)}")
    return opts


def _full_source(source: str) -> str:
    # The prelude gives every variant the half/bf16/fp8 types; #line keeps log lines true.
    return _PRELUDE + '#line 1 "variant.cu"\n' + source


def cache_key(source: str, options: Sequence[str], entry: str) -> str:
    h = hashlib.sha256()
    for part in (_full_source(source), "\0".join(o for o in options if not o.startswith("-I")), entry, nvrtc_version()):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()[:32]


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores")
_PTXAS_SMEM = re.compile(r"Used \d+ registers.*?(\d+) bytes smem")


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")


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
    """(registers, spill bytes, stack bytes, static shared memory) of ``entry`` from the ptxas report."""
    log = _entry_report(log, entry)
    regs = _PTXAS_REGS.findall(log)
    stack = _PTXAS_STACK.findall(log)
    smem = _PTXAS_SMEM.findall(log)
    return (
        int(regs[-1]) if regs else None,
        int(stack[-1][1]) if stack else None,
        int(stack[-1][0]) if stack else None,
        int(smem[-1]) if smem else (0 if regs else None),
    )


def _text_section(entry: str) -> bytes:
    """The ELF section name of an unmangled kernel, NUL-terminated so that no longer name
    matches (the ptxas report is not always in NVRTC's log)."""
    return b".text." + entry.encode() + b"\x00"


def _nvrtc_compile(source: str, options: Sequence[str], entry: str) -> tuple[bool, bytes, str]:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(_full_source(source).encode(), b"variant.cu", 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return False, b"", f"nvrtcCreateProgram failed: {err}"
    try:
        encoded = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.decode(errors="replace").rstrip("\x00").strip()
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return False, b"", log or str(result)
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return True, bytes(cubin), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_variant(
    source: str,
    entry: str,
    dtype: str,
    defines: Mapping[str, int] | None = None,
    arch: str | None = None,
    cache_dir: Path | None = None,
) -> CompileResult:
    """Compiles a variant file to a cubin for ``arch``, using the disk cache.

    A source that includes other files or asks for forbidden flags is refused with
    ``ok=False`` and the reason in ``log``; NVRTC errors come back the same way. Only a
    broken NVRTC installation raises.
    """
    arch = arch or DEFAULT_ARCH
    try:
        check_includes(source)
        options = build_options(source, dtype, defines or {}, arch)
    except CompileRefused as exc:
        return CompileResult(ok=False, cubin=b"", log=str(exc), key="")
    key = cache_key(source, options, entry)
    cache = (cache_dir or default_cache_dir()) / key[:2]
    meta_path, bin_path = cache / f"{key}.json", cache / f"{key}.cubin"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        cubin = bin_path.read_bytes() if meta["ok"] and bin_path.is_file() else b""
        if cubin or not meta["ok"]:
            return CompileResult(meta["ok"], cubin, meta["log"], key, 0.0, True, *_resources(meta["log"], entry), tuple(options))
    start = time.perf_counter()
    ok, cubin, log = _nvrtc_compile(source, options, entry)
    seconds = time.perf_counter() - start
    # An entry counts only as an unmangled __global__ symbol of exactly that name: a C++
    # (mangled) kernel or another kernel whose name merely contains ``entry`` cannot be loaded.
    if ok and entry not in _PTXAS_ENTRY.findall(log) and _text_section(entry) not in cubin:
        ok, log = False, f'{log}\nno kernel named {entry} in the binary (use extern "C" __global__ void {entry}(...))'
    if ok:
        atomic_write(bin_path, cubin)
    atomic_write(meta_path, json.dumps({"ok": ok, "log": log, "options": options}).encode())
    return CompileResult(ok, cubin, log, key, seconds, False, *_resources(log, entry), tuple(options))
