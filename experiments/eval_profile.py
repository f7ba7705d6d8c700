"""Where one evaluation's time goes (GPU only): validation, the timing loop's host work and
its GPU work, for the screening and the full protocol.

    python -m experiments.eval_profile --out eval-profile.json

Per kernel, in this process's context: our baseline is evaluated against itself as a
candidate (two binaries, so every guard runs as for a real candidate) through
``evaluators.worker.run_evaluate``, the function the sandbox worker runs. Each protocol is run
``--repeats`` times after one warm-up evaluation; reported per protocol: the median wall time
of the whole evaluation, of validation alone (``time: False``), the GPU's busy time inside
the evaluation (sum of kernel and memcpy/memset durations in a torch profiler trace) and the
top host functions by own time (cProfile of one evaluation). Each protocol runs three
times: as the evaluator runs it; as ``<protocol>/oracle-rerun``, with the checker re-running
the baseline after every timed candidate launch instead of comparing with the baseline's timed
launch of the same repetition (``evaluators.worker.CHECK_AGAINST_TIMED_BASELINE``); and as
``<protocol>/oracle-rerun+torch-check``, also comparing through the torch operators instead of
the one-pass device check (:mod:`evaluators.mismatch_device`): the evaluator before both. A search's screening
evaluations are what bounds the search phase on one GPU (about 0.3 s each, 224 of them in a
default run on the H200, ``experiments/results/search-h200-634aee9-evaluations.jsonl.gz``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from experiments.bench_baselines import git_commit
from experiments.bench_library import exit_without_gpu

DEFAULT_KERNELS = ("silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse")
PROTOCOLS = {"screen": {"warmup": 5, "repetitions": 20, "cutoff": 3.0},
             "full": {"warmup": 20, "repetitions": 100, "cutoff": 0.0}}


def _job(kernel: str, dtype: str, ctx: Any) -> dict[str, Any]:
    from experiments.timing_truth import baseline_against_itself
    from kernels.spec import load_kernel

    return {**baseline_against_itself(ctx, load_kernel(kernel), dtype), "seeds": [0, 1]}


def _gpu_busy_s(fn: Any) -> float:
    """Seconds of kernel, memcpy and memset activity on the device while ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
    # Self device time summed over every operator counts each kernel, memcpy and memset once.
    total_us = 0.0
    for e in prof.key_averages():
        total_us += float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)
    return total_us * 1e-6


def _top_host(fn: Any, n: int = 15) -> list[dict[str, Any]]:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}:{name}", "calls": calls, "tottime_s": tottime,
                     "cumtime_s": cumtime})
    rows.sort(key=lambda r: -r["tottime_s"])
    return rows[:n]


def profile_kernel(kernel: str, dtype: str, repeats: int) -> dict[str, Any]:
    import torch

    from evaluators.context import Context
    from evaluators.worker import run_evaluate

    ctx = Context(0)
    base = _job(kernel, dtype, ctx)
    out: dict[str, Any] = {"kernel": kernel, "dtype": dtype, "gpu": torch.cuda.get_device_name(0),
                           "shapes": len(base["shapes"])}
    from evaluators import mismatch_device, worker

    one_pass = mismatch_device.supported
    variants = (("", "device", True), ("/oracle-rerun", "device", False), ("/oracle-rerun+torch-check", "torch", False))
    for name, timing, check, paired in [(f"{p}{suffix}", t, c, pair) for p, t in PROTOCOLS.items()
                                        for suffix, c, pair in variants]:
        job = {**base, "timing": timing}
        # "torch": every timed launch checked through the torch operators, as before the
        # one-pass device check (evaluators.mismatch_device); not paired: the baseline re-run
        # by the checker after every candidate launch, as before OursOnShape.paired
        mismatch_device.supported = one_pass if check == "device" else (lambda *_: False)
        worker.CHECK_AGAINST_TIMED_BASELINE = paired

        def once(j: dict[str, Any] = job) -> None:
            run_evaluate(ctx, j, lambda _: None)
            torch.cuda.synchronize()

        once()  # warm-up: module loads, allocator
        walls, validation = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            once()
            walls.append(time.perf_counter() - t)
            t = time.perf_counter()
            once({**job, "time": False})
            validation.append(time.perf_counter() - t)
        busy = _gpu_busy_s(once)
        out[name] = {"wall_s": statistics.median(walls), "wall_s_all": walls,
                     "validation_s": statistics.median(validation), "gpu_busy_s_profiled": busy,
                     "top_host": _top_host(once)}
        print(f"{kernel} {name}: evaluation {out[name]['wall_s']:.3f} s, validation alone "
              f"{out[name]['validation_s']:.3f} s, GPU busy {busy:.3f} s (under the profiler)", flush=True)
    mismatch_device.supported = one_pass
    worker.CHECK_AGAINST_TIMED_BASELINE = True
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", action="append", help=f"kernel (repeatable; default {', '.join(DEFAULT_KERNELS)})")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    missing = exit_without_gpu("experiments.eval_profile")
    if missing is not None:
        return missing
    results = [profile_kernel(k, args.dtype, args.repeats) for k in args.kernel or DEFAULT_KERNELS]
    if args.out:
        args.out.write_text(json.dumps({"command": "python -m experiments.eval_profile " + " ".join(argv or sys.argv[1:]),
                                        "git_commit": git_commit(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
                                        "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
