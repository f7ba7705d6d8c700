"""The timed-launch output check in one pass over the data (GPU only).

Every timed launch of a candidate is compared with our baseline's outputs on the same inputs
(:class:`evaluators.verify.TimedOutputCheck`). Done with torch operators,
:func:`evaluators.validate.mismatch_stats` makes about a dozen passes over both tensors
(difference, magnitudes, comparisons, NaN masks, a reduction, an argmax) and queues some
twenty launches from the host: on a large output that is several times the kernel's own time,
spent after every timed launch. This module does the same test in one kernel that reads each
element once and counts what fails, then one single-thread kernel that writes the statistics
row; same rule, same row (``[bad elements, first bad flat index, got there, expected there]``,
float64, no host synchronisation).

The rule, as :func:`kernels.compare.mismatch_mask`: an element passes when
``|g - e| - rtol * |e| <= atol`` (in fp32), or ``g == e`` (the same infinity), or both are NaN;
integers and booleans must be bit-equal. Where the two tensors' dtypes differ, are not
contiguous, or are of a dtype not listed here, :func:`stats_into` falls back to the torch
operators.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# element type name in the kernel source, and how one element becomes fp32 (floats) or is
# compared as raw bits (integers)
_FLOATS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
_BITS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}

_SOURCE = r"""
__device__ __forceinline__ float load_f16(const unsigned short* p, long long i) {
    float f; unsigned short h = p[i];
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float load_bf16(const unsigned short* p, long long i) {
    return __uint_as_float(((unsigned int)p[i]) << 16);
}
__device__ __forceinline__ float load_f32(const float* p, long long i) { return p[i]; }

__device__ __forceinline__ void note(unsigned long long bad, unsigned long long first,
                                     unsigned long long* count, unsigned long long* first_out) {
    if (bad) {  // nothing to add in a correct launch: no atomics at all
        atomicAdd(count, bad);
        atomicMin(first_out, first);
    }
}

// Outside the tolerance: |g - e| - rtol * |e| > atol, unless g == e (the same infinity) or
// both are NaN (a NaN on either side alone makes the difference NaN, which fails).
__device__ __forceinline__ bool float_bad(float gv, float ev, float rtol, float atol) {
    const float excess = fabsf(gv - ev) - rtol * fabsf(ev);
    return !((excess <= atol) || (gv == ev) || (gv != gv && ev != ev));
}

// One kernel per element type: counts the elements i where BAD holds and keeps the first.
#define CHECK(NAME, T, BAD)                                                                     \
extern "C" __global__ void mismatch_##NAME(const T* g, const T* e, long long n, float rtol,     \
                                           float atol, unsigned long long* count,               \
                                           unsigned long long* first_out) {                     \
    unsigned long long bad = 0, first = ~0ull;                                                  \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                 \
         i += (long long)gridDim.x * blockDim.x) {                                              \
        if (BAD) { bad++; if ((unsigned long long)i < first) first = i; }                       \
    }                                                                                           \
    note(bad, first, count, first_out);                                                         \
}
CHECK(f16, unsigned short, float_bad(load_f16(g, i), load_f16(e, i), rtol, atol))
CHECK(bf16, unsigned short, float_bad(load_bf16(g, i), load_bf16(e, i), rtol, atol))
CHECK(f32, float, float_bad(load_f32(g, i), load_f32(e, i), rtol, atol))
// integers and booleans: bit-equal
CHECK(b1, unsigned char, g[i] != e[i])
CHECK(b2, unsigned short, g[i] != e[i])
CHECK(b4, unsigned int, g[i] != e[i])
CHECK(b8, unsigned long long, g[i] != e[i])

// One thread: the statistics row from the counters, which it then resets for the next check.
// got_at / expected_at: the element at the first bad index as fp32, read by the host-side
// caller's dtype (KIND: 0 f16, 1 bf16, 2 f32, 3 signed integer of SIZE bytes, 4 bool,
// 5 unsigned integer of SIZE bytes).
__device__ double value_at(const void* p, unsigned long long i, int kind, int size) {
    if (kind == 0) return (double)load_f16((const unsigned short*)p, (long long)i);
    if (kind == 1) return (double)load_bf16((const unsigned short*)p, (long long)i);
    if (kind == 2) return (double)((const float*)p)[i];
    if (kind == 4) return ((const unsigned char*)p)[i] ? 1.0 : 0.0;
    if (kind == 5) {
        if (size == 1) return (double)((const unsigned char*)p)[i];
        if (size == 2) return (double)((const unsigned short*)p)[i];
        if (size == 4) return (double)((const unsigned int*)p)[i];
        return (double)((const unsigned long long*)p)[i];
    }
    if (size == 1) return (double)((const signed char*)p)[i];
    if (size == 2) return (double)((const short*)p)[i];
    if (size == 4) return (double)((const int*)p)[i];
    return (double)((const long long*)p)[i];
}

extern "C" __global__ void mismatch_row(const void* g, const void* e, int kind, int size,
                                        unsigned long long* count, unsigned long long* first_out,
                                        double* row) {
    const unsigned long long bad = *count;
    const unsigned long long first = bad ? *first_out : 0ull;
    row[0] = (double)bad;
    row[1] = (double)first;
    row[2] = value_at(g, first, kind, size);
    row[3] = value_at(e, first, kind, size);
    *count = 0ull;
    *first_out = ~0ull;
}
"""

_KIND = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.bool: 4}


def supported(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether :func:`stats_into` checks this pair in one pass."""
    if got.dtype != expected.dtype or got.device != expected.device or got.device.type != "cuda":
        return False
    if got.shape != expected.shape or got.numel() == 0:
        return False
    if not (got.is_contiguous() and expected.is_contiguous()):
        return False
    return got.dtype in _FLOATS or got.dtype == torch.bool or (
        not got.dtype.is_floating_point and not got.dtype.is_complex and got.element_size() in _BITS)


class DeviceMismatch:
    """Compiled once per process; :meth:`stats_into` queues the check of one pair of tensors
    on the current torch stream."""

    def __init__(self, device: torch.device) -> None:
        import cupy

        self._cupy = cupy
        self._module = cupy.RawModule(code=_SOURCE, options=("--std=c++14",))
        self._functions: dict[str, Any] = {}
        # [count, first], reset by every row kernel; kept so that no check needs a memset
        self.counters = torch.tensor([0, -1], dtype=torch.int64, device=device)
        self._streams: dict[int, Any] = {}
        self._sms = torch.cuda.get_device_properties(device).multi_processor_count

    def _function(self, name: str) -> Any:
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self._module.get_function(name)
        return fn

    def _stream(self) -> Any:
        ptr = torch.cuda.current_stream().cuda_stream
        stream = self._streams.get(ptr)
        if stream is None:
            stream = self._streams[ptr] = self._cupy.cuda.ExternalStream(ptr)
        return stream

    def stats_into(self, row: torch.Tensor, got: torch.Tensor, expected: torch.Tensor, rtol: float,
                   atol: float) -> None:
        """Writes ``[bad, first, got[first], expected[first]]`` into the float64 device tensor
        ``row`` (4 contiguous elements); the pair must be :func:`supported`."""
        assert row.dtype == torch.float64 and row.is_contiguous() and row.numel() == 4
        n = got.numel()
        dtype = got.dtype
        name = _FLOATS.get(dtype) or f"b{got.element_size()}"
        kind = _KIND.get(dtype, 3 if dtype.is_signed else 5)
        stream = self._stream()
        count_ptr = self.counters.data_ptr()
        first_ptr = count_ptr + 8
        grid = max(1, min(-(-n // 256), self._sms * 8))
        self._function(f"mismatch_{name}")(
            (grid,), (256,),
            (np.uint64(got.data_ptr()), np.uint64(expected.data_ptr()), np.int64(n), np.float32(rtol),
             np.float32(atol), np.uint64(count_ptr), np.uint64(first_ptr)), stream=stream)
        self._function("mismatch_row")(
            (1,), (1,),
            (np.uint64(got.data_ptr()), np.uint64(expected.data_ptr()), np.int32(kind),
             np.int32(got.element_size()), np.uint64(count_ptr), np.uint64(first_ptr), np.uint64(row.data_ptr())),
            stream=stream)


_BY_DEVICE: dict[int, DeviceMismatch] = {}


def checker(device: torch.device) -> DeviceMismatch:
    """The process's checker for ``device`` (compiled on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _BY_DEVICE.get(index)
    if found is None:
        found = _BY_DEVICE[index] = DeviceMismatch(torch.device("cuda", index))
    return found
