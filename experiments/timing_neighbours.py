"""What a neighbour in the timing loop does to the baseline's time (GPU only).

    python -m experiments.timing_neighbours --kernel fused_add_rmsnorm --out runs/diag/neighbours.json

``experiments.timing_truth --per-peer`` found the baselines of fused_add_rmsnorm and
merge_attn_states_lse timed up to 1.39x shorter in the end-of-run loop when torch.compile's
programs run beside them, and not beside copies of themselves, FlashInfer or torch eager.
This probe splits the effect twice:

1. **Inside the kernel or around it?** Every set-up runs under the CUDA profiler (CUPTI), so
   besides the loop's event window it gets the baseline kernel's own duration and the gap from
   the end of the GPU work before it (the L2 flush) to its start. A window that shrinks while
   the duration stays is launch latency; a duration that shrinks is the kernel itself.
2. **Which neighbour does it?** The baseline alone in the loop (``loop``) and beside
   torch.compile's programs of the kernel (``loop+compiled``, one compilation per mode), as the
   end-of-run loop runs them, with the evaluator's flush and with the former one (``former
   flush``: the buffer write alone, no reset of eviction priorities); then in a loop of this
   probe's own (the baseline restored, flushed and launched as there, the former flush) beside:
   nothing (``none``); a Triton kernel launched directly (``triton``); an Inductor program
   replayed from a CUDA graph (``inductor@graph``); a CUDA kernel that fills 200 KiB of dynamic
   shared memory (``smem``, which leaves the SM in its largest shared-memory configuration); a
   Triton kernel that reads the working set with the ``evict_normal`` and ``evict_last`` L2
   hints (``evict_last,covered``: with the evaluator's flush); and alone with the baseline's
   preferred shared-memory carve-out set to 0% and 100% (``carveout0``, ``carveout100``).

Prints a table per kernel (event window, kernel duration and gap, medians in us) and keeps
everything in ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from experiments.bench_baselines import git_commit
from experiments.bench_library import exit_without_gpu

DEFAULT_KERNELS = ("fused_add_rmsnorm", "merge_attn_states_lse")
SMEM_BYTES = 200 * 1024
CARVEOUT_ATTR = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (cuda.h)
AFTER_FLUSH_US = 40.0  # a GPU activity at least this long just before: the L2 flush (~86 us on an H200)


def kernel_stats(activities: list[tuple[str, float, float]], name: str, labels: list[str]) -> dict[str, Any]:
    """The launches of kernel ``name`` that directly follow a flush (a GPU activity of at least
    :data:`AFTER_FLUSH_US`), from ``(name, start_us, end_us)`` activities in time order: the
    timed launches (warm-ups are not flushed; the checker's reference runs follow other work).
    Their durations and gaps from the flush's end, medians per shape (the loops time the shapes
    one after the other, the same number of launches each) when the count divides evenly, and
    over all of them."""
    durations, gaps = [], []
    for prev, cur in zip(activities, activities[1:], strict=False):
        if cur[0] == name and prev[2] - prev[1] >= AFTER_FLUSH_US:
            durations.append(cur[2] - cur[1])
            gaps.append(cur[1] - prev[2])
    out: dict[str, Any] = {"launches": len(durations)}
    if not durations:
        return out
    out |= {"duration_us": statistics.median(durations), "gap_us": statistics.median(gaps)}
    if labels and len(durations) % len(labels) == 0:
        n = len(durations) // len(labels)
        out["duration_by_shape_us"] = {lb: statistics.median(durations[i * n:(i + 1) * n]) for i, lb in enumerate(labels)}
        out["gap_by_shape_us"] = {lb: statistics.median(gaps[i * n:(i + 1) * n]) for i, lb in enumerate(labels)}
    return out


def _profiled(fn: Callable[[], dict[str, float]], name: str) -> dict[str, Any]:
    """Runs ``fn`` (returning the baseline's event-window medians in ms per shape label) under
    the profiler; the windows and :func:`kernel_stats` of the baseline kernel ``name``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        windows = fn()
    acts = sorted(((e.name(), e.start_ns() / 1e3, e.end_ns() / 1e3)
                   for e in prof.profiler.kineto_results.events() if e.device_type() == DeviceType.CUDA),
                  key=lambda a: a[1])
    return {"window_us": {k: v * 1e3 for k, v in windows.items()}, "kernel": kernel_stats(acts, name, list(windows))}


Neighbour = Callable[[dict[str, Any]], Callable[[], None]]  # working set -> a launcher


def _neighbours(ctx: Any) -> dict[str, Neighbour]:
    """The neighbours of the probe's own loop, each made for a working set and launched on
    torch's current stream: ``evict_last`` / ``evict_normal`` read every working-set tensor with
    that L2 eviction hint (Triton's ``eviction_policy``)."""
    import cupy
    import torch
    import triton
    import triton.language as tl

    src = torch.randn(1 << 20, device=ctx.device)
    dst = torch.empty_like(src)
    sums = torch.empty(1 << 16, dtype=torch.int32, device=ctx.device)

    @triton.jit
    def copy(s, d, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803 (Triton's spelling)
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(d + i, tl.load(s + i, mask=i < n), mask=i < n)

    @triton.jit
    def read(p, out, n, BLOCK: tl.constexpr, LAST: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        if LAST:
            x = tl.load(p + i, mask=i < n, other=0, eviction_policy="evict_last")
        else:
            x = tl.load(p + i, mask=i < n, other=0)
        tl.store(out + tl.program_id(0) % 65536, tl.sum(x.to(tl.int32), axis=0))

    def triton_copy(_: dict[str, Any]) -> Callable[[], None]:
        return lambda: copy[(triton.cdiv(src.numel(), 1024),)](src, dst, src.numel(), BLOCK=1024)

    def reader(last: bool) -> Neighbour:
        def make(buf: dict[str, Any]) -> Callable[[], None]:
            flat = [t.reshape(-1).view(torch.uint8) for t in buf.values()
                    if isinstance(t, torch.Tensor) and t.is_cuda and t.is_contiguous() and t.numel()]

            def launch() -> None:
                for t in flat:
                    read[(triton.cdiv(t.numel(), 4096),)](t, sums, t.numel(), BLOCK=4096, LAST=last)
            return launch
        return make

    compiled = torch.compile(lambda x, y: y.copy_(x * 2.0 + 1.0))
    for _ in range(3):
        compiled(src, dst)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        compiled(src, dst)

    kernel = cupy.RawKernel(r"""
    extern "C" __global__ void smem_fill(float* out, int n) {
        extern __shared__ float s[];
        for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = i;
        __syncthreads();
        if (threadIdx.x == 0) out[blockIdx.x] = s[(blockIdx.x * 7) % n];
    }""", "smem_fill")
    kernel.max_dynamic_shared_size_bytes = SMEM_BYTES
    out = cupy.empty(1024, dtype=cupy.float32)
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count

    def smem() -> None:
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((sms,), (256,), (out, cupy.int32(SMEM_BYTES // 4)), shared_mem=SMEM_BYTES)

    return {"triton": triton_copy, "inductor@graph": lambda _: graph.replay, "smem": lambda _: smem,
            "evict_normal": reader(False), "evict_last": reader(True)}


def _own_loop(ctx: Any, spec: Any, base: Any, job: dict[str, Any], neighbour: Neighbour | None,
              cover: bool = False) -> dict[str, float]:
    """The baseline restored, flushed and timed as in the end-of-run loop, interleaved with
    ``neighbour`` (its own flush and window, not reported); ``cover``: the flush takes the
    working set out of the L2 whatever its priority (as the evaluator's does), else the
    former flush; the baseline's median per shape (ms)."""
    import torch

    from evaluators.context import torch_dtype
    from evaluators.timing import Timed, time_interleaved
    from evaluators.verify import RepInputs
    from kernels.spec import shape_label

    warmup, reps = 20, job["repetitions"]
    out = {}
    for shape in job["shapes"]:
        label = shape_label(shape)
        sets = [spec.make_inputs(shape, torch_dtype(job["dtype"]), torch.Generator(device=ctx.device).manual_seed(k),
                                 "random", ctx.device) for k in (10_000, 10_001)]
        inputs = RepInputs(spec, sets, warmup + reps, torch.Generator(device=ctx.device).manual_seed(1))
        buf = inputs.buffer()
        ctx.flush.cover(buf.values() if cover else [])
        impls = [Timed("baseline", functools.partial(inputs.restore, buf),
                       functools.partial(base.launch, label, base.args(buf, shape)))]
        if neighbour is not None:
            impls.append(Timed("neighbour", lambda i: None, neighbour(buf)))
        out[label] = time_interleaved(impls, ctx.flush, warmup, reps)["baseline"].median_ms
    return out


def probe_kernel(kernel: str, dtype: str, repetitions: int) -> dict[str, Any]:
    import cupy
    import torch

    from evaluators.context import Context
    from evaluators.peers import COMPILED, run_peers
    from experiments.timing_truth import baseline_part
    from kernels.spec import load_kernel

    spec = load_kernel(kernel)
    ctx = Context(0)
    part, shapes = baseline_part(ctx, spec, dtype)
    job: dict[str, Any] = {"kernel_dir": str(spec.directory), "dtype": dtype, "shapes": shapes, "warmup": 20,
           "repetitions": repetitions, "kernels": {"baseline": part}, "baseline": part, "peers": False}
    setups: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}

    def attempt(name: str, fn: Callable[[], dict[str, float]]) -> None:
        try:
            setups[name] = _profiled(fn, spec.name)
        except Exception as exc:  # noqa: BLE001 (one set-up's failure must not lose the others)
            errors[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        print(f"{kernel}: {name} " + ("done" if name in setups else f"failed: {errors[name]}"), flush=True)

    def loop(extra: dict[str, Any]) -> dict[str, float]:
        return dict(run_peers(ctx, {**job, **extra}, lambda _: None)["peers"].get("baseline", {}))

    def former(fn: Callable[[], dict[str, float]]) -> dict[str, float]:
        ctx.flush.demote = False
        try:
            return fn()
        finally:
            ctx.flush.demote = True

    compiled = {"peers": True, "only_peers": [COMPILED], "compile_trials": 1}
    attempt("loop", lambda: loop({}))
    attempt("loop+compiled", lambda: loop(compiled))
    attempt("loop+compiled,former flush", lambda: former(lambda: loop(compiled)))
    base = ctx.kernel(spec, part, job["shapes"])
    try:
        neighbours = _neighbours(ctx)
    except Exception as exc:  # noqa: BLE001
        neighbours, errors["neighbours"] = {}, f"{type(exc).__name__}: {exc}"
    attempt("none", lambda: _own_loop(ctx, spec, base, job, None))
    for name, make in neighbours.items():
        attempt(name, functools.partial(_own_loop, ctx, spec, base, job, make))
    if "evict_last" in neighbours:
        attempt("evict_last,covered", functools.partial(_own_loop, ctx, spec, base, job, neighbours["evict_last"], True))
    for percent in (0, 100):
        def carved(percent: int = percent) -> dict[str, float]:
            cupy.cuda.driver.funcSetAttribute(base.function.ptr, CARVEOUT_ATTR, percent)
            return _own_loop(ctx, spec, base, job, None)
        attempt(f"carveout{percent}", carved)
    return {"kernel": kernel, "dtype": dtype, "gpu": torch.cuda.get_device_name(0), "setups": setups, "errors": errors}


def _print(result: dict[str, Any]) -> None:
    print(f"\n{result['kernel']} ({result['dtype']}) on {result['gpu']}: baseline us, median "
          "(event window / kernel duration / gap after the flush)")
    names = list(result["setups"])
    labels = list(next(iter(result["setups"].values()))["window_us"]) if names else []
    print(f"  {'shape':<18}" + "".join(f"{n:>18}" for n in names))
    for label in labels:
        print(f"  {label:<18}" + "".join(f"{result['setups'][n]['window_us'].get(label, float('nan')):>18.2f}" for n in names))
    print("  kernel duration / gap after the flush, us:")
    for label in labels:
        print(f"  {label:<18}" + "".join(
            f"{s['kernel'].get('duration_by_shape_us', {}).get(label, float('nan')):>11.2f} /"
            f"{s['kernel'].get('gap_by_shape_us', {}).get(label, float('nan')):>5.2f}" for s in result["setups"].values()))
    print(f"  {'all shapes':<18}" + "".join(
        f"{s['kernel'].get('duration_us', float('nan')):>11.2f} /{s['kernel'].get('gap_us', float('nan')):>5.2f}"
        for s in result["setups"].values()))
    print(f"  {'launches seen':<18}" + "".join(f"{s['kernel']['launches']:>18}" for s in result["setups"].values()))
    for name, why in result["errors"].items():
        print(f"  !! {name}: {why}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", action="append", help=f"kernel (repeatable; default {', '.join(DEFAULT_KERNELS)})")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--repetitions", type=int, default=100)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if (code := exit_without_gpu("experiments.timing_neighbours")) is not None:
        return code
    results = []
    for kernel in args.kernel or DEFAULT_KERNELS:
        results.append(probe_kernel(kernel, args.dtype, args.repetitions))
        _print(results[-1])
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": "python -m experiments.timing_neighbours " + " ".join(
            argv if argv is not None else sys.argv[1:]), "git_commit": git_commit(), "date": datetime.now(UTC).isoformat(
            timespec="seconds"), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
