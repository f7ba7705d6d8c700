"""NVRTC compilation on the CPU: binaries, error reports, refusals and the disk cache."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evaluators.compile import (
    ALLOWED_INCLUDES,
    CompileResult,
    build_options,
    cache_key,
    compile_variant,
)
from kernels.spec import load_kernel

pytest.importorskip("cuda.bindings.nvrtc")

SIMPLE = 'extern "C" __global__ void k(scalar_t* o) { o[threadIdx.x] = scalar_t(1.0f); }\n'

# Two kernels and a non-inlined helper: the resource report holds one part per function.
TWO_KERNELS = """
__device__ __noinline__ float helper(const float* a, int n) {
    float acc[32];
    for (int i = 0; i < 32; i++) acc[i] = a[i * n];
    float s = 0.0f;
    for (int i = 0; i < 32; i++) s += acc[(i * n) % 32];
    return s;
}
extern "C" __global__ void heavy(float* o, const float* a) {
    __shared__ float buf[256];
    buf[threadIdx.x] = a[threadIdx.x];
    __syncthreads();
    o[threadIdx.x] = helper(buf, threadIdx.x);
}
extern "C" __global__ void light(float* o) { o[0] = 1.0f; }
"""


def _compile(source: str, entry: str = "k", dtype: str = "float16", **kw: object) -> CompileResult:
    return compile_variant(source, entry, dtype, **kw)  # type: ignore[arg-type]


def test_baseline_compiles_to_a_cubin_with_its_resource_report(compile_cache: Path) -> None:
    spec = load_kernel("silu_and_mul")
    result = _compile(spec.baseline_source(), entry=spec.name)
    assert result.ok, result.log
    assert result.cubin.startswith(b"\x7fELF")
    assert not result.cached
    used = re.findall(r"Used (\d+) registers", result.log)
    assert len(used) == 1
    assert result.registers == int(used[0]) > 0
    assert result.spill_bytes == 0
    assert result.stack_bytes == 0
    assert result.smem_bytes == 0
    assert "-Dscalar_t=__half" in result.options
    assert any(compile_cache.rglob(f"{result.key}.cubin"))


def test_resources_are_those_of_the_entry_not_of_other_functions(compile_cache: Path) -> None:
    heavy = _compile(TWO_KERNELS, entry="heavy")
    light = _compile(TWO_KERNELS, entry="light")
    assert heavy.ok and light.ok, heavy.log
    assert heavy.registers is not None and light.registers is not None
    assert heavy.registers > light.registers
    # heavy keeps the helper's array on its stack and declares 1 KiB of shared memory.
    assert heavy.stack_bytes is not None and heavy.stack_bytes > 0
    assert heavy.smem_bytes == 256 * 4
    assert light.stack_bytes == 0
    assert light.smem_bytes == 0


def test_compile_error_carries_nvrtc_text_and_the_variant_line(compile_cache: Path) -> None:
    source = "// launch: grid=(1,) block=(32,)\n\n" + SIMPLE + "\n__device__ int broken() { return undeclared_name; }\n"
    result = _compile(source)
    assert not result.ok
    assert result.cubin == b""
    assert 'identifier "undeclared_name" is undefined' in result.log
    # Line 5 of the file as written: the prepended headers must not shift it.
    assert "variant.cu(5): error" in result.log


def test_error_on_the_first_line_reports_line_one(compile_cache: Path) -> None:
    result = _compile("int x = ;\n" + SIMPLE)
    assert not result.ok
    assert "variant.cu(1): error" in result.log


@pytest.mark.parametrize(
    "include",
    [
        "#include </etc/hostname>",
        '#include "/etc/hostname"',
        "#include <cuda_fp16.hpp>",
        "  #  include <../../etc/hostname>",
        "#define F </etc/hostname>\n#include F",
        "#\\\ninclude </etc/hostname>",
        "#/* hidden */include </etc/hostname>",
        "int a; /*\n*/ #include </etc/hostname>",
        "%:include </etc/hostname>",
        "#include_next </etc/hostname>",
        "#import </etc/hostname>",
        "#embed </etc/hostname>",
        # A '/*' inside a literal starts no comment: it must not hide the directive that follows.
        'const char* s = R"(\n/*)";\n#include </etc/hostname>\n// */',
        "int a = 1'000, b = '/*';\n#include </etc/hostname>\nint c = '*/';",
        # Every whitespace class the preprocessor accepts between '#' and the directive name.
        "#\finclude </etc/hostname>",
        "#\vinclude </etc/hostname>",
        "\f\v #\t\f include </etc/hostname>",
        "%:\vinclude </etc/hostname>",
        "??=include </etc/hostname>",
        "#include \\\n</etc/hostname>",
        "#inc\\\r\nlude </etc/hostname>",
        "# \\ \ninclude </etc/hostname>",  # backslash-space-newline: a splice for GCC only
        "#\x00include </etc/hostname>",  # GCC skips NUL as whitespace
        "int a;\r#include </etc/hostname>",  # a lone CR
        # An unterminated literal in a skipped block must not open a comment that hides a directive.
        "#if 0\ndon't /*\n#endif\n#include </etc/hostname>\n// */",
        "#error don't /*\n#include </etc/hostname>\n// */",
        # Probes and pragmas that read or name files, also assembled by macros.
        '#if __has_include("/etc/passwd")\n#endif',
        "#if __has_include_next(<x.h>)\n#endif",
        "#ifdef __has_include\n#endif",
        '_Pragma("GCC dependency \\"/etc/passwd\\"")',
        '#define P(x) _Pragma(#x)\nP(once)',
        "#define CAT(a, b) a##b\n#if CAT(__has_, include)(</etc/passwd>)\n#endif",
        "#define CAT(a, b) a%:%:b",
        '#pragma GCC dependency "/etc/passwd"',
        "#pragma include_alias(<a.h>, </etc/passwd>)",
        '#line 1 "/etc/passwd"',
        '# 1 "/etc/passwd"',
        "#ident \"x\"",
        "int \\u0061 = 1;",
        "/* a comment hides nothing\n#include_next <cuda_fp16.h>\n*/",
    ],
)
def test_forbidden_includes_are_refused_before_nvrtc_reads_them(include: str, compile_cache: Path) -> None:
    result = _compile(include + "\n" + SIMPLE)
    assert not result.ok
    assert "is not allowed" in result.log
    assert "hostname(1)" not in result.log  # NVRTC never opened the file
    assert not compile_cache.exists()  # refused before compiling: nothing cached


@pytest.mark.parametrize("name", sorted(ALLOWED_INCLUDES))
def test_every_allowed_include_is_found_by_nvrtc(name: str, compile_cache: Path) -> None:
    result = _compile(f"#include <{name}>\n" + SIMPLE)
    assert result.ok, result.log


@pytest.mark.parametrize("name", ["stdint.h", "cstdint", "float.h"])
def test_c_library_headers_nvrtc_lacks_are_refused_with_the_allowed_list(name: str, compile_cache: Path) -> None:
    result = _compile(f"#include <{name}>\n" + SIMPLE)
    assert not result.ok
    assert "is not allowed" in result.log and "cuda_fp16.h" in result.log
    assert not compile_cache.exists()


def test_the_c_limits_a_kernel_gets_from_host_headers_under_nvcc_are_predefined(compile_cache: Path) -> None:
    """INFINITY, NAN, FLT_MAX and the rest come from <math.h>, <float.h> and <limits.h> under nvcc,
    which NVRTC lacks: a kernel written for nvcc compiles unchanged, and one that defines a
    limit itself keeps its own (a warning, not an error)."""
    body = ("extern \"C\" __global__ void k(float* o) {\n"
            "    float m = -INFINITY;\n"
            "    o[0] = fmaxf(m, o[1]) + (isnan(o[2]) ? NAN : HUGE_VALF) + FLT_MAX + FLT_MIN + FLT_EPSILON;\n"
            "    o[3] = (float)DBL_MAX + (float)INT_MAX + (float)INT_MIN;\n"
            "}\n")
    result = _compile(body, dtype="float32")
    assert result.ok, result.log
    own = _compile("#define FLT_MAX 3.4e38f\n" + body, dtype="float32")
    assert own.ok, own.log
    assert 'redefinition of macro "FLT_MAX"' in own.log
    refused = _compile("#include <float.h>\n" + body, dtype="float32")
    assert not refused.ok and "FLT_MAX" in refused.log and "predefined" in refused.log


@pytest.mark.parametrize(
    "include", ["#include <cuda_fp8.h>", '#include "cuda_bf16.h"', "#include <math_constants.h>", "// #include </etc/hostname>"]
)
def test_allowed_includes_and_commented_ones_compile(include: str, compile_cache: Path) -> None:
    result = _compile(include + "\n" + SIMPLE)
    assert result.ok, result.log


@pytest.mark.parametrize(
    "flag", ["-I/etc", "--pre-include=/etc/hostname", "-DSECRET=1", "--include-path=/", "-maxrregcount=9999", "-G"]
)
def test_forbidden_flags_are_refused(flag: str, compile_cache: Path) -> None:
    result = _compile(f"// flags: --use_fast_math {flag}\n" + SIMPLE)
    assert not result.ok
    assert f"compiler flag {flag!r} is not allowed" in result.log


def test_allowed_flags_reach_nvrtc(compile_cache: Path) -> None:
    result = _compile("// flags: --use_fast_math -maxrregcount=32 -ftz=true\n" + SIMPLE, dtype="bfloat16")
    assert result.ok, result.log
    assert {"--use_fast_math", "-maxrregcount=32", "-ftz=true", "-Dscalar_t=__nv_bfloat16"} <= set(result.options)


def test_unknown_dtype_is_refused(compile_cache: Path) -> None:
    result = _compile(SIMPLE, dtype="float64")
    assert not result.ok
    assert "unknown dtype" in result.log


@pytest.mark.parametrize(
    ("source", "entry"),
    [
        (SIMPLE, "missing"),
        (TWO_KERNELS, "heav"),  # a prefix of a real kernel's name
        ("__global__ void k(float* o) { o[0] = 1.0f; }\n", "k"),  # C++ linkage: a mangled symbol
        ('extern "C" __device__ void k(float* o) { o[0] = 1.0f; }\n', "k"),  # not a kernel
    ],
)
def test_a_missing_entry_kernel_is_a_compile_error(source: str, entry: str, compile_cache: Path) -> None:
    result = _compile(source, entry=entry)
    assert not result.ok
    assert f"no kernel named {entry}" in result.log


def test_second_compile_is_served_from_the_disk_cache(compile_cache: Path) -> None:
    first = _compile(SIMPLE, defines={"BLOCK": 128})
    second = _compile(SIMPLE, defines={"BLOCK": 128})
    assert first.ok and not first.cached
    assert second.cached
    assert second.seconds == 0.0
    assert (second.key, second.cubin, second.registers) == (first.key, first.cubin, first.registers)
    assert len(list(compile_cache.rglob("*.cubin"))) == 1


def test_failures_are_cached_too(compile_cache: Path) -> None:
    first = _compile("int x = ;\n" + SIMPLE)
    second = _compile("int x = ;\n" + SIMPLE)
    assert not first.ok and not second.ok
    assert second.cached
    assert second.log == first.log


def test_a_lost_cubin_is_compiled_again(compile_cache: Path) -> None:
    first = _compile(SIMPLE)
    for path in compile_cache.rglob("*.cubin"):
        path.unlink()
    again = _compile(SIMPLE)
    assert again.ok and not again.cached
    assert again.cubin == first.cubin


def test_explicit_cache_dir_is_used(tmp_path: Path, compile_cache: Path) -> None:
    result = _compile(SIMPLE, cache_dir=tmp_path / "elsewhere")
    assert any((tmp_path / "elsewhere").rglob(f"{result.key}.json"))
    assert not compile_cache.exists()


@pytest.mark.parametrize(
    "change",
    [
        {"source": SIMPLE.replace("1.0f", "2.0f")},
        {"source": SIMPLE + "\n"},
        {"dtype": "bfloat16"},
        {"defines": {"BLOCK": 256}},
        {"defines": {"BLOCK": 128, "VEC": 4}},
        {"arch": "sm_80"},
    ],
)
def test_cache_key_changes_with_everything_that_changes_the_binary(change: dict[str, object], compile_cache: Path) -> None:
    base: dict[str, object] = {"source": SIMPLE, "dtype": "float16", "defines": {"BLOCK": 128}, "arch": "sm_90"}
    first = _compile(**base)  # type: ignore[arg-type]
    changed = _compile(**{**base, **change})  # type: ignore[arg-type]
    assert first.ok and changed.ok, changed.log
    assert not changed.cached
    assert changed.key != first.key


def test_cache_key_ignores_machine_specific_include_paths() -> None:
    options = build_options(SIMPLE, "float16", {"BLOCK": 128})
    assert cache_key(SIMPLE, options, "k") == cache_key(SIMPLE, [*options, "-I/somewhere/else"], "k")
    assert cache_key(SIMPLE, options, "k") != cache_key(SIMPLE, options, "k2")


@pytest.mark.parametrize(
    "source",
    [
        "#pragma unroll 4\n#pragma nv_diag_suppress 177\n",
        "#define N 4\n#ifndef M\n#define M (N * 2)\n#elif M > 3\n#else\n#endif\n#undef N\n",
        "#\n#define S(x) #x\nconst char* s = S(a) \"__FILE__ stays text\";\n",
        "/* notes:\n# not a directive, prose\n*/\n",
        "#define LONG_MACRO(a) \\\n    ((a) + 1)\n",
        "const char* raw = R\"(#include </etc/hostname> is text here)\";\n".replace("#include", "include"),
    ],
)
def test_honest_preprocessor_use_still_compiles(source: str, compile_cache: Path) -> None:
    result = _compile(source + SIMPLE)
    assert result.ok, result.log


def test_a_refusal_quotes_no_environment(monkeypatch: pytest.MonkeyPatch, compile_cache: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-in-a-log")
    for include in ('#include "/proc/self/environ"', "#\finclude </proc/self/environ>"):
        result = _compile(include + "\n" + SIMPLE)
        assert not result.ok and "sk-never-in-a-log" not in result.log
