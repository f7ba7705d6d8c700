"""Does a kernel's code size cost time after the L2 flush? (GPU only.)

    python -m experiments.code_fetch --out experiments/results/code-fetch-h200.json

The timing protocol flushes the L2 before every launch, which evicts the kernel's code as
well as its data: a small launch whose instructions come from DRAM may wait on instruction
fetch, and then a larger binary, or a hot path laid out behind code it skips, is slower on
the small shapes for a reason no data-side change will reach. On small shapes our kernels
trail torch.compile's by 0.3-1 us (bias_gelu [1, 11008] 4.70 against 4.10 us; transpose_2d
[1, 4096] 4.93 us against our own baseline's 3.97 us in unseen-h200), which is what such a
cost would look like.

One block of 128 threads on 128 floats, so that data is a single round trip. Per kernel:

- ``exec P``: P extra straight-line instructions executed by every thread (four independent
  FMA chains, so issue and not latency sets their time);
- ``dead D``: D instructions of code laid out between the entry and the hot path, skipped by a
  branch on a runtime flag (do skipped bytes cost fetch time?).

Each is timed with the L2 flushed before every launch and with a GPU sleep of the flush's
length instead (code and data stay in L2); CUDA events around one launch, implementations
interleaved, median of ``--repetitions``. The figure that answers the question is how the
flushed-minus-warm difference grows with P and with D.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from experiments.bench_baselines import git_commit
from experiments.bench_library import exit_without_gpu

SOURCE = r"""
extern "C" __global__ void probe(float* __restrict__ out, const float* __restrict__ in, int n, int skip) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float a = i < n ? in[i] : 0.0f, b = a + 1.0f, c = a + 2.0f, d = a + 3.0f;
#if DEAD > 0
    if (skip == 0) {  // never taken: skip is 1 at every launch
#pragma unroll
        for (int j = 0; j < DEAD / 4; ++j) {
            a = fmaf(a, 1.0001f, 0.5f); b = fmaf(b, 1.0001f, 0.5f);
            c = fmaf(c, 1.0001f, 0.5f); d = fmaf(d, 1.0001f, 0.5f);
            asm volatile("" : "+f"(a), "+f"(b), "+f"(c), "+f"(d));
        }
    }
#endif
#pragma unroll
    for (int j = 0; j < EXEC / 4; ++j) {
        a = fmaf(a, 0.9999f, 0.25f); b = fmaf(b, 0.9999f, 0.25f);
        c = fmaf(c, 0.9999f, 0.25f); d = fmaf(d, 0.9999f, 0.25f);
        asm volatile("" : "+f"(a), "+f"(b), "+f"(c), "+f"(d));
    }
    if (i < n) out[i] = a + b + c + d;
}
"""

EXEC = (0, 256, 1024, 4096)
DEAD = (1024, 4096)


def _kernels() -> dict[str, tuple[int, int]]:
    out = {f"exec {p}": (p, 0) for p in EXEC}
    out.update({f"dead {d}": (0, d) for d in DEAD})
    return out


def run(repetitions: int) -> dict[str, Any]:
    import cupy
    import torch

    from evaluators.timing import FLUSH_BYTES

    stream = torch.cuda.current_stream()
    flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    x = torch.randn(128, device="cuda")
    y = torch.empty(128, device="cuda")
    kernels = {}
    for name, (p, d) in _kernels().items():
        # cupy names the device's architecture itself (a second -arch is an NVRTC error).
        mod = cupy.RawModule(code=SOURCE, options=(f"-DEXEC={p}", f"-DDEAD={d}"))
        kernels[name] = mod.get_function("probe")
    # The flush's GPU time, so that the warm set-up idles the GPU as long before each launch.
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush_buf.zero_()
    s.record()
    for _ in range(10):
        flush_buf.zero_()
    e.record()
    e.synchronize()
    flush_us = s.elapsed_time(e) * 1e3 / 10
    s.record()
    torch.cuda._sleep(100_000)
    e.record()
    e.synchronize()
    sleep_cycles = int(100_000 * flush_us / (s.elapsed_time(e) * 1e3))  # the sleep's cycles per us, measured

    def before(flushed: bool) -> None:
        if flushed:
            flush_buf.zero_()
        else:
            torch.cuda._sleep(sleep_cycles)

    times: dict[str, dict[str, list[tuple[Any, Any]]]] = {n: {"flushed": [], "warm": []} for n in kernels}
    x_cp, y_cp = cupy.asarray(x), cupy.asarray(y)  # views of the torch tensors, passed as pointers
    ext = cupy.cuda.ExternalStream(stream.cuda_stream)
    with ext:
        for rep in range(repetitions + 10):
            names = list(kernels) if rep % 2 == 0 else list(reversed(kernels))
            for flushed in (True, False):
                for name in names:
                    before(flushed)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record(stream)
                    kernels[name]((1,), (128,), (y_cp, x_cp, cupy.int32(128), cupy.int32(1)))
                    end.record(stream)
                    if rep >= 10:
                        times[name]["flushed" if flushed else "warm"].append((start, end))
    stream.synchronize()
    rows = []
    for name, (p, d) in _kernels().items():
        f = statistics.median(a.elapsed_time(b) for a, b in times[name]["flushed"]) * 1e3
        w = statistics.median(a.elapsed_time(b) for a, b in times[name]["warm"]) * 1e3
        rows.append({"kernel": name, "exec_instructions": p, "dead_instructions": d,
                     "flushed_us": f, "warm_us": w, "flushed_minus_warm_us": f - w})
    return {"gpu": torch.cuda.get_device_name(0), "flush_gpu_us": flush_us, "sleep_cycles": sleep_cycles,
            "repetitions": repetitions, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repetitions", type=int, default=200)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    missing = exit_without_gpu("experiments.code_fetch")
    if missing is not None:
        return missing
    result = run(args.repetitions)
    print(f"{result['gpu']}: flush {result['flush_gpu_us']:.1f} us of GPU time; medians of {args.repetitions}")
    print(f"{'kernel':<12}{'flushed us':>12}{'warm us':>10}{'flushed - warm':>16}")
    for r in result["rows"]:
        print(f"{r['kernel']:<12}{r['flushed_us']:>12.2f}{r['warm_us']:>10.2f}{r['flushed_minus_warm_us']:>16.2f}")
    if args.out:
        args.out.write_text(json.dumps({"command": "python -m experiments.code_fetch " + " ".join(argv or sys.argv[1:]),
                                        "git_commit": git_commit(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
                                        **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
