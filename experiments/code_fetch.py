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
length instead (code and data stay in L2), by the evaluator's loop (``time_interleaved``):
CUDA events around one launch, every kernel in both conditions interleaved, median of
``--repetitions`` after 10 warm-ups. The figure that answers the question is how the
flushed-minus-warm difference grows with P and with D.
"""

from __future__ import annotations

import argparse
import json
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

    from evaluators.timing import Flusher, Timed, gpu_us, time_interleaved

    flush = Flusher(torch.device("cuda"))
    # The warm set-up idles the GPU as long as a flush takes, with a sleep calibrated here.
    flush_us = gpu_us(flush)
    sleep_cycles = int(100_000 * flush_us / gpu_us(lambda: torch.cuda._sleep(100_000)))
    x = torch.randn(128, device="cuda")
    y = torch.empty(128, device="cuda")
    x_cp, y_cp = cupy.asarray(x), cupy.asarray(y)  # views of the torch tensors, passed as pointers
    impls = []
    for name, (p, d) in _kernels().items():
        # cupy names the device's architecture itself (a second -arch is an NVRTC error).
        probe = cupy.RawModule(code=SOURCE, options=(f"-DEXEC={p}", f"-DDEAD={d}")).get_function("probe")

        def launch(probe: Any = probe) -> None:
            probe((1,), (128,), (y_cp, x_cp, cupy.int32(128), cupy.int32(1)))

        # What precedes the launch is the "prepare" step, so both conditions share one loop.
        impls += [Timed(f"{name}|flushed", lambda _: flush(), launch),
                  Timed(f"{name}|warm", lambda _: torch.cuda._sleep(sleep_cycles), launch)]
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):  # cupy launches where the events are
        times = time_interleaved(impls, lambda: None, 10, repetitions)
    rows = []
    for name, (p, d) in _kernels().items():
        f, w = (times[f"{name}|{c}"].median_ms * 1e3 for c in ("flushed", "warm"))
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
