"""CUDA kernels run on the CPU: a kernel's outputs on small shapes, without a GPU.

A kernel source is compiled as host C++ (C++20, the system's ``g++``) with a small shim.
Every CUDA thread of a block is a host thread, ``__syncthreads`` a barrier over them,
``__shared__`` a static array (the blocks of a grid run one after another), a warp shuffle an
exchange through a per-warp buffer between two barriers of the warp's threads. What it checks
is which elements each thread reads and writes and what it computes, on small shapes: it is
neither a timer nor the GPU's memory model. Out of its reach (the host compile fails, and the
caller says the kernel was not checked): inline PTX (``asm``), thread-block clusters
(``barrier.cluster``, distributed shared memory), dynamic shared memory (``extern
__shared__``) and intrinsics the shim does not define. :mod:`kernels.cpu_check` turns a run
into a verdict; the GPU evaluator remains the authority.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from kernels.launch import parse_launch_header
from kernels.nvrtc import build_options, full_source, include_dirs
from kernels.spec import KernelSpec

CXX = shutil.which("g++") or shutil.which("c++")
RUN_TIMEOUT_S = 120.0  # small shapes run in well under a second; a hang is the kernel's


class CpuRunError(RuntimeError):
    """The kernel did not run to the end on the CPU.

    Attributes:
        stage: ``build`` (the host compile refused the source: a construct the emulator does
            not model) or ``run`` (the program aborted, faulted or ran past its time limit).
        detail: the compiler's or the program's last lines of output.
    """

    def __init__(self, stage: str, detail: str) -> None:
        super().__init__(f"{stage}: {detail}")
        self.stage = stage
        self.detail = detail

    def first_line(self) -> str:
        """The first error line of the output (the whole of it is long), at most 300 characters."""
        lines = [ln.strip() for ln in self.detail.splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower() and "collect2" not in ln
                  or "undefined reference" in ln] or lines or ["no output"]
        return errors[0][:300]

SHIM = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
// The CUDA headers' qualifiers, as plain C++ for one host thread per CUDA thread.
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __forceinline__
#define __forceinline__ inline
#undef __noinline__
#define __noinline__ __attribute__((noinline))
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __shared__
#define __shared__ static
#define __restrict__ __restrict

struct cg_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local cg_dim3 threadIdx, blockIdx;
static cg_dim3 blockDim, gridDim;
static std::barrier<>* cg_block_barrier = nullptr;
static std::vector<std::unique_ptr<std::barrier<>>> cg_warp_barriers;
static std::vector<unsigned long long> cg_warp_slots;

static inline void __syncthreads() { cg_block_barrier->arrive_and_wait(); }
static inline unsigned cg_lane_id() { return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y; }
// A warp shuffle: every thread of the warp posts its value, then reads lane from(lane)'s.
template <typename T, typename F>
static inline T cg_exchange(T v, F from) {
    static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
    const unsigned id = cg_lane_id(), warp = id / 32;
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    cg_warp_slots[id] = bits;
    cg_warp_barriers[warp]->arrive_and_wait();
    const unsigned src = warp * 32 + from(id % 32);
    if (src >= cg_warp_slots.size()) { std::fprintf(stderr, "shuffle from lane %u past the block\n", src); std::abort(); }
    bits = cg_warp_slots[src];
    cg_warp_barriers[warp]->arrive_and_wait();
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
// Lanes outside the caller's width-segment give the caller's own value, as on the GPU.
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    return cg_exchange(v, [=](unsigned l) { const unsigned s = l ^ static_cast<unsigned>(mask); return s / width == l / width ? s : l; });
}
template <typename T> static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    return cg_exchange(v, [=](unsigned l) { const unsigned s = l + delta; return s / width == l / width ? s : l; });
}
template <typename T> static inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    return cg_exchange(v, [=](unsigned l) { return l % width >= delta ? l - delta : l; });
}
template <typename T> static inline T __shfl_sync(unsigned, T v, int lane, int width = 32) {
    return cg_exchange(v, [=](unsigned l) { return l / width * width + static_cast<unsigned>(lane) % width; });
}
static inline void __syncwarp(unsigned = 0xffffffffu) { cg_warp_barriers[cg_lane_id() / 32]->arrive_and_wait(); }
static constexpr int warpSize = 32;
using std::signbit;  // CUDA declares it in the global namespace
static inline void __trap() { std::fprintf(stderr, "__trap\n"); std::abort(); }
template <typename T> static inline void __stwb(T* p, T v) { *p = v; }
template <typename T> static inline T __ldg(const T* p) { return *p; }
template <typename T> static inline T __ldcs(const T* p) { return *p; }
template <typename T> static inline void __stcs(T* p, T v) { *p = v; }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
// Fast-math intrinsics at full precision (within every tolerance of the fast ones); macros,
// since glibc declares some of these names (__expf, __logf) for itself.
static inline float cg_saturate(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
#define __expf(x) std::exp(static_cast<float>(x))
#define __exp10f(x) std::pow(10.0f, static_cast<float>(x))
#define __logf(x) std::log(static_cast<float>(x))
#define __log2f(x) std::log2(static_cast<float>(x))
#define __log10f(x) std::log10(static_cast<float>(x))
#define __sinf(x) std::sin(static_cast<float>(x))
#define __cosf(x) std::cos(static_cast<float>(x))
#define __tanf(x) std::tan(static_cast<float>(x))
#define __tanhf(x) std::tanh(static_cast<float>(x))
#define __powf(x, y) std::pow(static_cast<float>(x), static_cast<float>(y))
#define __fdividef(x, y) (static_cast<float>(x) / static_cast<float>(y))
#define __fdiv_rn(x, y) (static_cast<float>(x) / static_cast<float>(y))
#define __frcp_rn(x) (1.0f / static_cast<float>(x))
#define __fsqrt_rn(x) std::sqrt(static_cast<float>(x))
#define __frsqrt_rn(x) (1.0f / std::sqrt(static_cast<float>(x)))
#define __fmul_rn(x, y) (static_cast<float>(x) * static_cast<float>(y))
#define __fadd_rn(x, y) (static_cast<float>(x) + static_cast<float>(y))
#define __fsub_rn(x, y) (static_cast<float>(x) - static_cast<float>(y))
#define __fmaf_rn(x, y, z) std::fma(static_cast<float>(x), static_cast<float>(y), static_cast<float>(z))
#define __saturatef(x) cg_saturate(static_cast<float>(x))
template <typename T> static inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <typename T> static inline T atomicOr(T* p, T v) { return std::atomic_ref<T>(*p).fetch_or(v); }
template <typename A, typename B> static inline auto min(A a, B b) { return a < b ? a : b; }
template <typename A, typename B> static inline auto max(A a, B b) { return a < b ? b : a; }

// Runs fn once per thread of every block, one block at a time.
template <typename F>
static void cg_launch(cg_dim3 grid, cg_dim3 block, F fn) {
    gridDim = grid;
    blockDim = block;
    const unsigned n = block.x * block.y * block.z;
    std::barrier<> bar(n);
    cg_block_barrier = &bar;
    cg_warp_barriers.clear();
    for (unsigned w = 0; w < (n + 31) / 32; ++w) cg_warp_barriers.emplace_back(new std::barrier<>(std::min(32u, n - 32 * w)));
    cg_warp_slots.assign(n, 0);
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (unsigned tz = 0; tz < block.z; ++tz)
                    for (unsigned ty = 0; ty < block.y; ++ty)
                        for (unsigned tx = 0; tx < block.x; ++tx)
                            threads.emplace_back([=] {
                                blockIdx = {bx, by, bz};
                                threadIdx = {tx, ty, tz};
                                fn();
                            });
                for (auto& t : threads) t.join();
            }
}

// Dynamic shared memory (extern __shared__ T name[]) points here; see _dynamic_smem.
alignas(256) static unsigned char cg_dynamic_smem[232448];

static void* cg_read(const char* path, size_t bytes) {
    void* p = std::aligned_alloc(256, bytes < 256 ? 256 : (bytes + 255) / 256 * 256);
    FILE* f = std::fopen(path, "rb");
    if (!f || std::fread(p, 1, bytes, f) != bytes) { std::fprintf(stderr, "cannot read %s\n", path); std::exit(2); }
    std::fclose(f);
    return p;
}

static void cg_write(const char* path, const void* p, size_t bytes) {
    FILE* f = std::fopen(path, "wb");
    std::fwrite(p, 1, bytes, f);
    std::fclose(f);
}
"""


def available() -> str:
    """Why kernels cannot run here (no compiler, no CUDA headers), or "" when they can."""
    if CXX is None:
        return "no host C++ compiler"
    if not any((Path(d) / "crt" / "host_defines.h").exists() for d in include_dirs()):
        return "no CUDA headers with crt/host_defines.h"
    return ""


# ``extern __shared__ [__align__(N)] T name[];``: the host compiler takes no ``extern static``.
_DYNAMIC_SMEM_RE = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_][\w:]*(?:\s*<[^;>]*>)?)"
    r"\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_]\w*)\s*\[\s*\]\s*;")


def _dynamic_smem(source: str) -> str:
    """Each dynamic shared-memory array becomes a pointer to the shim's buffer (one block runs
    at a time, so every block may use the whole of it)."""
    return _DYNAMIC_SMEM_RE.sub(r"\1* const \2 = reinterpret_cast<\1*>(cg_dynamic_smem);", source)


def _float_arg(x: float) -> str:
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    return f"{x!r}f"


def run(spec: KernelSpec, source: str, dtype: str, params: Mapping[str, int],
        cases: Sequence[tuple[Mapping[str, int], Mapping[str, np.ndarray]]], workdir: Path,
        timeout_s: float = RUN_TIMEOUT_S) -> list[dict[str, np.ndarray]]:
    """Launches ``source``'s entry point once per case, a case being a shape and every tensor
    argument's bytes (outputs included, as numpy arrays), over the grid its launch header gives
    for the shape and ``params``; returns each case's written tensors' bytes after its launch.
    One compilation serves every case.

    Raises:
        CpuRunError: the host compile failed (``stage`` build) or the program did not finish
            (``stage`` run: an abort such as ``__trap``, a fault, or ``timeout_s`` passed).
        LaunchSpecError: the launch header does not resolve for a shape and ``params``.
    """
    head = parse_launch_header(source)
    params = {**head.default_params(), **params}
    workdir.mkdir(parents=True, exist_ok=True)
    body = []
    for n, (shape, inputs) in enumerate(cases):
        launch = head.resolve(shape, params)
        args, lines = [], []
        for a, (ctype, _) in zip(spec.args, spec.c_signature(), strict=True):
            if a.kind == "tensor":
                buf = np.ascontiguousarray(inputs[a.name]).view(np.uint8).reshape(-1)
                path = workdir / f"{n}.{a.name}.bin"
                path.write_bytes(buf.tobytes())
                lines.append(f'auto* {a.name} = static_cast<{ctype}*>(cg_read("{path}", {buf.size}));')
                args.append(a.name)
            elif a.kind == "int":
                args.append(str(int(shape[a.name])))
            else:
                args.append(_float_arg(float(spec.constants[a.name])))
        grid = "{" + ", ".join(map(str, launch.grid)) + "}"
        block = "{" + ", ".join(map(str, launch.block)) + "}"
        lines.append(f"cg_launch({grid}, {block}, [&] {{ {spec.name}({', '.join(args)}); }});")
        lines += [f'cg_write("{workdir / f"{n}.{a.name}.out"}", {a.name}, {np.asarray(inputs[a.name]).nbytes});'
                  for a in spec.args if a.kind == "tensor" and a.role != "in"]
        body.append("    {\n" + "\n".join("        " + x for x in lines) + "\n    }")
    includes = full_source("").split("#line", 1)[0]  # the headers every variant is compiled with
    text = f"{includes}{SHIM}\n{_dynamic_smem(source)}\nint main() {{\n" + "\n".join(body) + "\n}\n"
    (workdir / "kernel.cpp").write_text(text)
    # The evaluator's macros (scalar_t, the tune parameters) and include paths, as NVRTC gets them.
    flags = [o for o in build_options(source, dtype, params) if o.startswith(("-D", "-I"))]
    if CXX is None:
        raise CpuRunError("build", "no host C++ compiler (g++ or c++) on PATH")
    built = subprocess.run([CXX, "-std=c++20", "-O1", "-w", "-pthread", *flags, "kernel.cpp", "-o", "kernel"],
                           cwd=workdir, capture_output=True, text=True)
    if built.returncode:
        raise CpuRunError("build", built.stderr[-4000:])
    try:
        ran = subprocess.run([str(workdir / "kernel")], cwd=workdir, capture_output=True, text=True,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CpuRunError("run", f"still running after {timeout_s:g} s") from None
    if ran.returncode:
        raise CpuRunError("run", f"exit status {ran.returncode}: {ran.stderr[-4000:]}")
    return [{a.name: np.fromfile(workdir / f"{n}.{a.name}.out", dtype=np.uint8)
             for a in spec.args if a.kind == "tensor" and a.role != "in"} for n in range(len(cases))]
