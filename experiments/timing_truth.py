"""Times the same kernels through the evaluator and through the end-of-run loop (GPU only).

    python -m experiments.timing_truth --kernel fused_add_rmsnorm --kernel merge_attn_states_lse

Per kernel, in one fresh sandbox process each:

- ``evaluator``: our baseline evaluated against itself, timed by the evaluator's own path
  (``run_evaluate``; the baseline binary twice, once as "candidate");
- ``loop``: the peers' loop (``run_peers``) with the same binary as ``baseline``, no peers;
- ``loop_graph``: the same loop with the baseline also captured in a CUDA graph and replayed
  beside itself (``baseline@graph``), no peers: do graph replays in the loop change the
  direct launch's time?
- ``loop_peers``: the same loop with the kernel's peers interleaved (FlashInfer, torch eager,
  torch.compile: the end-of-run loop as a search runs it);
- ``direct`` and ``padded``: the baseline alone on one working set, restored and flushed as
  everywhere, without verification; ``padded`` queues a GPU sleep of about 50 us after each
  flush, so that the GPU is still busy when the host queues the timed launch (a time that
  drops with the pad is host latency inside the window);
- ``evaluator_after_peers``: the evaluator's path again, after the loop with peers (this and
  the set-ups below run in a process where torch.compile and FlashInfer have run);
- ``split``: the evaluator's former set-up, rebuilt here for comparison: baseline and
  candidate on a working set each, the candidate compared with the baseline's outputs after
  every repetition.

With ``--per-peer``, two more kinds of set-up split the loop with peers apart: ``copies``
(the baseline beside three copies of its own binary, no peers) and ``only:<peer>`` (beside one
peer alone). Every loop runs under an NVML sampler of the SM and memory clocks.

It prints, per shape, the baseline's median in each set-up, the ratio of the evaluator's
to the loop's (1.00 means one timing truth) and to the loop's with peers, and the L2
persistence state the timing ran under. ``--out FILE.json`` keeps everything. A search run at c7d532f reported fused_add_rmsnorm
[256, 4096] at 18.06 us in the evaluator and 12.16 us in the loop; on the H200 this probe found
the three set-ups within 5% of each other (``experiments/results/timing-truth-h200.json``).
The search run at efb7523 (``experiments/results/search-h200.md``) again had the loop faster
than the evaluator on the baselines of fused_add_rmsnorm and merge_attn_states_lse (evaluator
/ loop 1.01-1.43, silu_and_mul 1.00-1.02), with the loop's peers in it: ``loop_peers`` asks
whether the peers are what changes the baseline's time.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from experiments.bench_baselines import git_commit
from experiments.bench_library import exit_without_gpu

DEFAULT_KERNELS = ("fused_add_rmsnorm", "merge_attn_states_lse", "silu_and_mul")


def _inputs(ctx: Any, spec: Any, shape: dict[str, int], job: dict[str, Any]) -> Any:
    """The input plan of every set-up here: the evaluator's two input sets (seeds 10,000 and
    10,001), a fixed perturbation plan, as many launches as warm-ups and repetitions."""
    import torch

    from evaluators.context import torch_dtype
    from evaluators.verify import RepInputs

    sets = [spec.make_inputs(shape, torch_dtype(job["dtype"]), torch.Generator(device=ctx.device).manual_seed(k),
                             "random", ctx.device) for k in (10_000, 10_001)]
    launches = job["timing"]["warmup"] + job["timing"]["repetitions"]
    return RepInputs(spec, sets, launches, torch.Generator(device=ctx.device).manual_seed(1))


def _split_setup(ctx: Any, job: dict[str, Any]) -> dict[str, float]:
    """The former evaluator set-up: a working set per implementation, the comparison after
    every repetition; returns the baseline's median per shape label (ms)."""
    from evaluators.context import tolerances
    from evaluators.timing import Timed, time_interleaved
    from evaluators.verify import TimedOutputCheck
    from kernels.spec import shape_label

    spec = ctx.spec(job["kernel_dir"])
    base = ctx.kernel(spec, job["baseline"], job["shapes"])
    out = {}
    for shape in job["shapes"]:
        label = shape_label(shape)
        warmup, reps = job["timing"]["warmup"], job["timing"]["repetitions"]
        inputs = _inputs(ctx, spec, shape, job)
        bufs = {name: inputs.buffer() for name in ("baseline", "candidate")}
        impls = [Timed(name, functools.partial(inputs.restore, buf),
                       functools.partial(base.launch, label, base.args(buf, shape))) for name, buf in bufs.items()]
        check = TimedOutputCheck(inputs, None, tolerances(spec, job["dtype"], 2.0), spec.compare, warmup, reps)

        def after(i: int, _: list[str], check: TimedOutputCheck = check, bufs: dict[str, Any] = bufs) -> None:
            check.compare(i, bufs["candidate"], bufs["baseline"])

        samples = time_interleaved(impls, ctx.flush, warmup, reps, after_rep=after)
        out[label] = samples["baseline"].median_ms
    return out


PAD_CYCLES = 100_000  # about 50 us at the H200's 1980 MHz


def _direct_setup(ctx: Any, job: dict[str, Any], pad_cycles: int,
                  host: dict[str, list[float]] | None = None) -> dict[str, float]:
    """The baseline alone on one working set (restored and flushed before every launch, not
    verified), with ``pad_cycles`` of GPU sleep queued after each flush; the baseline's
    median per shape label (ms). ``host``, if given, gets the host's seconds per launch
    call (``launch``) and per flush call (``flush``)."""
    import torch

    from evaluators.timing import Timed, time_interleaved
    from kernels.spec import shape_label

    spec = ctx.spec(job["kernel_dir"])
    base = ctx.kernel(spec, job["baseline"], job["shapes"])
    warmup, reps = job["timing"]["warmup"], job["timing"]["repetitions"]

    def flush() -> None:
        t = time.perf_counter()
        ctx.flush()
        if pad_cycles:
            torch.cuda._sleep(pad_cycles)
        if host is not None:
            host.setdefault("flush", []).append(time.perf_counter() - t)

    def timed_launch(launch: Callable[[], None]) -> None:
        t = time.perf_counter()
        launch()
        if host is not None:
            host.setdefault("launch", []).append(time.perf_counter() - t)

    out = {}
    for shape in job["shapes"]:
        label = shape_label(shape)
        inputs = _inputs(ctx, spec, shape, job)
        buf = inputs.buffer()
        impl = Timed("baseline", functools.partial(inputs.restore, buf),
                     functools.partial(timed_launch, functools.partial(base.launch, label, base.args(buf, shape))))
        out[label] = time_interleaved([impl], flush, warmup, reps)["baseline"].median_ms
    return out


class Clocks:
    """Samples the GPU's SM and memory clocks (MHz) from a thread while a set-up runs, through
    NVML; ``summary()`` gives each clock's median and range, or
    why there are none. A latency-bound kernel's time follows the SM clock: a set-up that runs
    at another clock is not timing the same machine. Every loop set-up runs under one, so their
    host sides share the same sampling thread (whose NVML calls release the GIL)."""

    def __init__(self, index: int = 0, period_s: float = 0.002) -> None:
        import threading

        self.samples: list[tuple[int, int]] = []
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(index, period_s), daemon=True)

    def _run(self, index: int, period_s: float) -> None:
        try:
            # NVML through the copy Ray ships (Ray is a dependency; the GPU machine's bundle
            # has no nvidia-ml-py of its own).
            from ray._private.thirdparty import pynvml as nvml
            nvml.nvmlInit()
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            while not self._stop.is_set():
                self.samples.append((nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                                     nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)))
                self._stop.wait(period_s)
        except Exception as exc:  # noqa: BLE001 (no NVML here: the times stand without clocks)
            self.error = f"{type(exc).__name__}: {exc}"

    def __enter__(self) -> Clocks:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {"error": self.error or "no samples"}
        out: dict[str, Any] = {"samples": len(self.samples)}
        for k, name in enumerate(("sm_mhz", "mem_mhz")):
            v = [x[k] for x in self.samples]
            out[name] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
        return out


def _timed_loop(ctx: Any, job: dict[str, Any], clocks: dict[str, Any], name: str) -> dict[str, Any]:
    """run_peers under a clock sampler; the clocks go to ``clocks[name]``."""
    from evaluators.peers import run_peers

    with Clocks(ctx.device.index or 0) as c:
        reply = run_peers(ctx, job, lambda _: None)
    clocks[name] = c.summary()
    return reply


def _diagnose(ctx: Any, spec: Any, base_job: dict[str, Any], part: dict[str, Any],
              clocks: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Set-ups that split the loop with peers apart, the baseline's median per shape label
    (ms) in each: ``copies`` (the baseline and three copies of its binary, no peers: more
    implementations per repetition, no other code) and ``only:<peer>`` (the loop beside that
    peer alone; ``only:torch_compile`` every compilation)."""
    from evaluators.peers import COMPILED

    out: dict[str, dict[str, float]] = {}
    copies = _timed_loop(ctx, {**base_job, "kernels": {"baseline": part, **{f"copy{k}": part for k in (1, 2, 3)}},
                               "peers": False}, clocks, "copies")
    out["copies"] = copies["peers"].get("baseline", {})
    for peer in (*spec.peers, COMPILED):
        reply = _timed_loop(ctx, {**base_job, "kernels": {"baseline": part}, "peers": True, "only_peers": [peer]},
                            clocks, f"only:{peer}")
        out[f"only:{peer}"] = reply["peers"].get("baseline", {})
    return out


def baseline_part(ctx: Any, spec: Any, dtype: str) -> tuple[dict[str, Any], list[dict[str, int]]]:
    """The kernel's baseline as a worker job's binary (``{cubin, launches}``) on its search
    shapes, and those shapes."""
    from evaluators.admit import Artifact, admit
    from kernels.spec import shape_label

    artifact = admit(spec, spec.baseline_source(), dtype, {}, arch=str(ctx.info["arch"]), limits=ctx.limits)
    assert isinstance(artifact, Artifact), f"the baseline of {spec.name} is refused: {artifact}"
    shapes = list(spec.shapes("search"))
    configs = artifact.launches(tuple(shapes), ctx.limits)
    part = {"cubin": artifact.cubin,
            "launches": [(c.grid, c.block, c.smem_bytes) for c in (configs[shape_label(s)] for s in shapes)]}
    return part, [dict(s) for s in shapes]


def baseline_against_itself(ctx: Any, spec: Any, dtype: str) -> dict[str, Any]:
    """The evaluator's job (``evaluators.worker.run_evaluate``, without ``timing``) that
    evaluates the kernel's baseline against itself on its search shapes as two binaries, so
    that every guard runs as for a real candidate."""
    part, shapes = baseline_part(ctx, spec, dtype)
    return {"type": "evaluate", "kernel_dir": str(spec.directory), "dtype": dtype, "shapes": shapes,
            "candidate": part, "baseline": part, "same_as_baseline": False, "seeds": [0],
            "best_ms": {}, "time": True, "noise_floor": False}


def probe_kernel(kernel: str, dtype: str, repetitions: int, per_peer: bool = False) -> dict[str, Any]:
    """The three set-ups for one kernel's baseline, each in a fresh context of this process."""
    import torch

    from evaluators.context import Context
    from evaluators.timing import gpu_us, l2_persistence
    from evaluators.worker import run_evaluate
    from kernels.spec import load_kernel, shape_label

    spec = load_kernel(kernel)
    ctx = Context(0)
    timing = {"warmup": 20, "repetitions": repetitions, "cutoff": None}
    job = {**baseline_against_itself(ctx, spec, dtype), "timing": timing}
    part = job["baseline"]
    evaluated = run_evaluate(ctx, job, lambda _: None)
    loop_job = {"kernel_dir": str(spec.directory), "dtype": dtype, "shapes": job["shapes"], "warmup": 20,
                "repetitions": repetitions, "kernels": {"baseline": part}, "baseline": part, "peers": False}
    clocks: dict[str, Any] = {}
    loop = _timed_loop(ctx, loop_job, clocks, "loop")
    with_graph = _timed_loop(ctx, {**loop_job, "graph_ours": True}, clocks, "loop_graph")
    with_peers = _timed_loop(ctx, {**loop_job, "peers": True}, clocks, "loop_peers")
    diagnosis = _diagnose(ctx, spec, loop_job, part, clocks) if per_peer else {}
    l2_after_peers = l2_persistence(torch.cuda.current_stream().cuda_stream, clear=False)
    # The set-ups below run after the peers' compilations: a time that drops now and not
    # before is something the peers left behind in the process, not the loop's doing.
    after = {shape_label(s["shape"]): s["baseline_ms"] for s in run_evaluate(ctx, job, lambda _: None)["shapes"]}
    split = _split_setup(ctx, job)
    host: dict[str, list[float]] = {}
    try:  # new set-ups: a failure here must not lose the others
        direct, padded, direct_error = _direct_setup(ctx, job, 0, host), _direct_setup(ctx, job, PAD_CYCLES), ""
    except Exception as exc:  # noqa: BLE001
        direct, padded, direct_error = {}, {}, f"{type(exc).__name__}: {exc}"
    rows = []
    for s in evaluated["shapes"]:
        label = shape_label(s["shape"])
        ev, lp = s["baseline_ms"], loop["peers"].get("baseline", {}).get(label)
        lpp = with_peers["peers"].get("baseline", {}).get(label)
        graph = with_graph["peers"]
        rows.append({"shape": label, "evaluator_ms": ev, "evaluator_after_peers_ms": after.get(label), "loop_ms": lp, "loop_peers_ms": lpp,
                     "loop_graph_ms": graph.get("baseline", {}).get(label),
                     "loop_graph_replayed_ms": graph.get("baseline@graph", {}).get(label),
                     "split_ms": split.get(label), "direct_ms": direct.get(label), "padded_ms": padded.get(label),
                     "evaluator_over_loop": ev / lp if lp else None,
                     "evaluator_over_loop_peers": ev / lpp if lpp else None,
                     "peers_ms": {name: t.get(label) for name, t in with_peers["peers"].items() if name != "baseline"},
                     "diagnosis_ms": {name: t.get(label) for name, t in diagnosis.items()}})
    return {"kernel": kernel, "dtype": dtype, "gpu": torch.cuda.get_device_name(0), "rows": rows,
            "l2_persistence": l2_persistence(torch.cuda.current_stream().cuda_stream),
            "l2_persistence_after_peers": l2_after_peers, "direct_error": direct_error,
            # Host microseconds per call in the direct set-up (median, 90th percentile), and the
            # GPU's microseconds per flush: a launch call that outlasts the flush puts host time
            # inside the window.
            "host_us": {k: (statistics.median(v) * 1e6, statistics.quantiles(v, n=10)[-1] * 1e6)
                        for k, v in host.items() if len(v) > 1},
            "flush_gpu_us": gpu_us(ctx.flush), "clocks": clocks,
            "loop_failed": {**loop.get("failed", {}), **with_graph.get("failed", {}), **with_peers.get("failed", {})},
            "peer_errors": with_peers.get("errors", {})}


def _print(result: dict[str, Any]) -> None:
    print(f"\n{result['kernel']} ({result['dtype']}) on {result['gpu']}, L2 persistence {result['l2_persistence']}")
    print(f"  L2 persistence after the loop with peers: {result['l2_persistence_after_peers']}")
    print(f"  host us per call (median, p90): {result['host_us']}; GPU us per flush: {result['flush_gpu_us']:.1f}")
    print("  evaluator after the peers: " + ", ".join(
        f"{r['shape']} " + ("-" if r["evaluator_after_peers_ms"] is None else f"{r['evaluator_after_peers_ms'] * 1e3:.2f} us")
        for r in result["rows"]))
    print(f"  {'shape':<24}{'evaluator us':>14}{'loop us':>10}{'+graph us':>11}{'graph us':>10}{'+peers us':>11}{'split us':>10}{'direct us':>11}"
          f"{'padded us':>11}{'eval/loop':>11}{'eval/+peers':>13}")
    for r in result["rows"]:
        def us(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:.2f}"
        def ratio(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"
        print(f"  {r['shape']:<24}{us(r['evaluator_ms']):>14}{us(r['loop_ms']):>10}{us(r['loop_graph_ms']):>11}"
              f"{us(r['loop_graph_replayed_ms']):>10}{us(r['loop_peers_ms']):>11}"
              f"{us(r['split_ms']):>10}{us(r['direct_ms']):>11}{us(r['padded_ms']):>11}"
              f"{ratio(r['evaluator_over_loop']):>11}{ratio(r['evaluator_over_loop_peers']):>13}")
    for name, c in result.get("clocks", {}).items():
        print(f"  clocks during {name}: " + (c["error"] if "error" in c else
              f"SM {c['sm_mhz']['median']} MHz [{c['sm_mhz']['min']}-{c['sm_mhz']['max']}], "
              f"memory {c['mem_mhz']['median']} MHz [{c['mem_mhz']['min']}-{c['mem_mhz']['max']}]"))
    setups = sorted({k for r in result["rows"] for k in r.get("diagnosis_ms", {})})
    if setups:
        print(f"  {'shape':<24}" + "".join(f"{k:>24}" for k in setups) + "   (baseline us)")
        for r in result["rows"]:
            d = r["diagnosis_ms"]
            print(f"  {r['shape']:<24}" + "".join(f"{'-' if d.get(k) is None else f'{d[k] * 1e3:.2f}':>24}" for k in setups))
    if result["loop_failed"]:
        print(f"  !! failed in the loop: {result['loop_failed']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", action="append", help=f"kernel (repeatable; default {', '.join(DEFAULT_KERNELS)})")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--repetitions", type=int, default=100)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--per-peer", action="store_true",
                   help="also time the baseline beside three copies of itself and beside each peer alone")
    args = p.parse_args(argv)
    missing = exit_without_gpu("experiments.timing_truth")
    if missing is not None:
        return missing
    results = []
    for kernel in args.kernel or DEFAULT_KERNELS:
        result = probe_kernel(kernel, args.dtype, args.repetitions, args.per_peer)
        _print(result)
        results.append(result)
    if args.out:
        args.out.write_text(json.dumps({"command": "python -m experiments.timing_truth " + " ".join(argv or sys.argv[1:]),
                                        "git_commit": git_commit(), "gpu": results[0]["gpu"] if results else "",
                                        "date": datetime.now(UTC).isoformat(timespec="seconds"),
                                        "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
