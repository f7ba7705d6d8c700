"""Does a kernel's code size cost time after the L2 flush? (GPU only.)

    python -m experiments.code_fetch --out experiments/results/code-fetch-h200.json

The timing protocol flushes the L2 before every launch, which evicts the kernel's code as
well as its data: a small launch whose instructions come from DRAM may wait on instruction
fetch, and then a larger binary, or a hot path laid out behind code it skips, is slower on
the small shapes for a reason no data-side change will reach. On small shapes our kernels
trail torch.compile's by 0.3-1 us (bias_gelu [1, 11008] 4.70 against 4.10 us; transpose_2d
[1, 4096] 4.93 us against our own baseline's 3.97 us in unseen-h200-201e26c), which is what such a
cost would look like.

One block of 128 threads on 128 floats, so that data is a single round trip. Per kernel:

- ``exec P``: P extra straight-line instructions executed by every thread (four independent
  FMA chains, so issue and not latency sets their time);
- ``dead D``: D instructions of code laid out between the entry and the hot path, skipped by a
  branch on a runtime flag (do skipped bytes cost fetch time?);
- ``jumps J``: J taken branches on the hot path, each over 256 instructions of skipped code
  (is it the bytes skipped, or each jump to a line not yet fetched, that costs?).

Each is timed with the L2 flushed before every launch and with a GPU sleep of the flush's
length instead (code and data stay in L2), by the evaluator's loop (``time_interleaved``):
CUDA events around one launch, every kernel in both conditions interleaved, median of
``--repetitions`` after 10 warm-ups. The figure that answers the question is how the
flushed-minus-warm difference grows with P, D and J.

With ``--run SWEEP_DIR --library FOLDER`` the same two conditions time real kernels too: each
kernel's baseline and the run's winner (``best/<kernel>.json``, its primary variant at its
parameters) on every search shape, restored before every launch as in the evaluator. If the
winners' flushed-minus-warm exceeds their baselines' by about their small-shape gap to
torch.compile, that gap is fetch (code or constants), not work. Each row carries the entry's
code size (its ``.text`` section in the cubin).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from experiments.bench_baselines import git_commit
from experiments.bench_library import exit_without_gpu
from kernels.compile_checks import text_bytes

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
    for (int j = 0; j < JUMPS; ++j) {
        if (skip == 1000 + j) {  // never taken: each a jump over GAP instructions
#pragma unroll
            for (int k = 0; k < GAP / 4; ++k) {
                a = fmaf(a, 1.0001f, 0.5f); b = fmaf(b, 1.0001f, 0.5f);
                c = fmaf(c, 1.0001f, 0.5f); d = fmaf(d, 1.0001f, 0.5f);
                asm volatile("" : "+f"(a), "+f"(b), "+f"(c), "+f"(d));
            }
        }
        a = fmaf(a, 0.9999f, 0.25f);
        asm volatile("" : "+f"(a), "+f"(b), "+f"(c), "+f"(d));
    }
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
JUMPS = (4, 16)
GAP = 256  # instructions skipped by each jump of the ``jumps`` probes


def _kernels() -> dict[str, tuple[int, int, int]]:
    """Probe name -> (EXEC, DEAD, JUMPS)."""
    out = {f"exec {p}": (p, 0, 0) for p in EXEC}
    out.update({f"dead {d}": (0, d, 0) for d in DEAD})
    out.update({f"jumps {j}": (0, 0, j) for j in JUMPS})
    return out


def _options(exec_: int, dead: int, jumps: int) -> list[str]:
    return [f"-DEXEC={exec_}", f"-DDEAD={dead}", f"-DJUMPS={jumps}", f"-DGAP={GAP}"]


def _conditions(flush: Any) -> tuple[float, int]:
    """The flush's GPU time (us) and the sleep, in cycles, that idles the GPU as long: the
    warm condition queues the sleep where the flushed one queues the flush."""
    import torch

    from evaluators.timing import gpu_us

    flush_us = gpu_us(flush)
    return flush_us, int(100_000 * flush_us / gpu_us(lambda: torch.cuda._sleep(100_000)))


def run(repetitions: int) -> dict[str, Any]:
    import cupy
    import torch

    from evaluators.timing import Flusher, Timed, time_interleaved

    flush = Flusher(torch.device("cuda"))
    flush_us, sleep_cycles = _conditions(flush)
    x = torch.randn(128, device="cuda")
    y = torch.empty(128, device="cuda")
    x_cp, y_cp = cupy.asarray(x), cupy.asarray(y)  # views of the torch tensors, passed as pointers
    impls = []
    for name, opts in _kernels().items():
        # cupy names the device's architecture itself (a second -arch is an NVRTC error).
        probe = cupy.RawModule(code=SOURCE, options=tuple(_options(*opts))).get_function("probe")

        def launch(probe: Any = probe) -> None:
            probe((1,), (128,), (y_cp, x_cp, cupy.int32(128), cupy.int32(1)))

        # What precedes the launch is the "prepare" step, so both conditions share one loop.
        impls += _both(Timed(name, lambda _: None, launch), flush, lambda: torch.cuda._sleep(sleep_cycles))
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):  # cupy launches where the events are
        times = time_interleaved(impls, lambda: None, 10, repetitions)
    rows = []
    for name, (p, d, j) in _kernels().items():
        f, w = (times[f"{name}|{c}"].median_ms * 1e3 for c in ("flushed", "warm"))
        rows.append({"kernel": name, "exec_instructions": p, "dead_instructions": d, "jumps": j,
                     "flushed_us": f, "warm_us": w, "flushed_minus_warm_us": f - w})
    return {"gpu": torch.cuda.get_device_name(0), "flush_gpu_us": flush_us, "sleep_cycles": sleep_cycles,
            "repetitions": repetitions, "rows": rows}


def winners(run_dir: Path, library: Path) -> dict[Path, dict[str, Any]]:
    """Kernel folder -> the run's winner (``variant`` source and ``params``) for every kernel
    of ``library`` with a ``best/<kernel>.json`` in ``run_dir`` (a sweep's or a search's run
    directory, or any folder above one)."""
    found = {}
    for best in sorted(run_dir.rglob("best/*.json")):
        folder = library / best.stem
        record = json.loads(best.read_text())
        if (folder / "spec.py").is_file() and "variant" in record:
            found[folder] = {"source": record["variant"]["source"], "params": dict(record.get("params") or {}),
                             "variant_id": record["variant"].get("id", "")}
    return found


def run_kernels(run_dir: Path, library: Path, dtype: str, repetitions: int, peer_shapes: int) -> list[dict[str, Any]]:
    """Each winner of ``run_dir`` and its baseline on every search shape, and torch.compile on
    the ``peer_shapes`` smallest, flushed and warm (a row with an ``error`` for what could not
    be timed)."""
    from evaluators.context import Context

    ctx = Context(0)
    _, sleep_cycles = _conditions(ctx.flush)
    rows: list[dict[str, Any]] = []
    for folder, winner in winners(run_dir, library).items():
        try:  # one kernel refused or failing must not lose the others' rows
            rows += _kernel_rows(ctx, folder, winner, dtype, repetitions, sleep_cycles, peer_shapes)
        except Exception as exc:  # noqa: BLE001
            rows.append({"kernel": folder.name, "error": f"{type(exc).__name__}: {exc}"})
            print(f"  {folder.name}: {rows[-1]['error']}", flush=True)
    return rows


def _both(impl: Any, flush: Callable[[], None], sleep: Callable[[], None]) -> list[Any]:
    """``impl`` (a :class:`evaluators.timing.Timed`) as two: ``<name>|flushed``, its prepare
    step then the flush, and ``<name>|warm``, its prepare step then the sleep."""
    from evaluators.timing import Timed

    def then(after: Callable[[], None]) -> Callable[[int], None]:
        def prepare(i: int) -> None:
            impl.prepare(i)
            after()
        return prepare

    return [Timed(f"{impl.name}|flushed", then(flush), impl.launch), Timed(f"{impl.name}|warm", then(sleep), impl.launch)]


def _kernel_rows(ctx: Any, folder: Path, winner: dict[str, Any], dtype: str, repetitions: int,
                 sleep_cycles: int, peer_shapes: int) -> list[dict[str, Any]]:
    import functools

    import torch

    from evaluators.admit import Artifact, admit
    from evaluators.context import torch_dtype
    from evaluators.peers import COMPILED, only_peers, peer_fns, peer_impls
    from evaluators.timing import Timed, time_interleaved
    from evaluators.verify import RepInputs
    from kernels.spec import load_kernel, shape_label

    warmup = 10
    rows: list[dict[str, Any]] = []
    sleep = functools.partial(torch.cuda._sleep, sleep_cycles)
    spec = load_kernel(folder)
    shapes: list[Mapping[str, int]] = list(spec.shapes("search"))
    smallest = sorted(shapes, key=lambda s: math.prod(s.values()))[:peer_shapes]
    # One default-mode compilation (static shapes: compiled again for each shape it meets).
    compiled = only_peers(peer_fns(spec, modes=("default",), trials=1), [COMPILED])
    loaded = {}
    for name, source, params in (("baseline", spec.baseline_source(), {}),
                                 ("winner", winner["source"], winner["params"])):
        art = admit(spec, source, dtype, params, arch=str(ctx.info["arch"]), limits=ctx.limits)
        assert isinstance(art, Artifact), f"{spec.name} {name} is refused: {art}"
        configs = art.launches(tuple(shapes), ctx.limits)
        part = {"cubin": art.cubin,
                "launches": [(c.grid, c.block, c.smem_bytes) for c in (configs[shape_label(s)] for s in shapes)]}
        loaded[name] = (ctx.kernel(spec, part, shapes), text_bytes(art.cubin, spec.name))
    for shape in shapes:
        label = shape_label(shape)
        sets = [spec.make_inputs(shape, torch_dtype(dtype), torch.Generator(device=ctx.device).manual_seed(k),
                                 "random", ctx.device) for k in (10_000, 10_001)]
        inputs = RepInputs(spec, sets, warmup + repetitions, torch.Generator(device=ctx.device).manual_seed(1))
        impls = []
        for name, (kernel, _) in loaded.items():
            buf = inputs.buffer()
            impls += _both(Timed(name, functools.partial(inputs.restore, buf),
                                 functools.partial(kernel.launch, label, kernel.args(buf, shape))), ctx.flush, sleep)
        names = list(loaded)
        if shape in smallest:
            # torch.compile's kernel (default mode, one compilation), replayed from a CUDA graph
            # as in the end-of-run loop, under the same two conditions.
            errors: dict[str, str] = {}
            for t in peer_impls(ctx, spec, shape, dtype, inputs, inputs.buffer(), compiled, errors):
                impls += _both(t, ctx.flush, sleep)
                names.append(t.name)
            rows += [{"kernel": spec.name, "shape": label, "impl": name, "error": why} for name, why in errors.items()]
        times = time_interleaved(impls, lambda: None, warmup, repetitions)
        for name in names:
            f, w = (times[f"{name}|{c}"].median_ms * 1e3 for c in ("flushed", "warm"))
            rows.append({"kernel": spec.name, "shape": label, "impl": name,
                         "code_bytes": loaded[name][1] if name in loaded else None,
                         "variant_id": {"winner": winner["variant_id"]}.get(name, name),
                         "flushed_us": f, "warm_us": w, "flushed_minus_warm_us": f - w})
        print(f"  {spec.name} {label} (flushed/warm us): " + ", ".join(
            f"{r['impl']} {r['flushed_us']:.2f}/{r['warm_us']:.2f}" for r in rows[-len(names):]), flush=True)
    return rows


def _write(out: Path | None, argv: list[str] | None, result: dict[str, Any]) -> None:
    if out is not None:
        out.write_text(json.dumps({"command": "python -m experiments.code_fetch " + " ".join(argv or sys.argv[1:]),
                                   "git_commit": git_commit(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
                                   **result}, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repetitions", type=int, default=200)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--run", type=Path, help="also time this run's winners and their baselines (best/<kernel>.json)")
    p.add_argument("--library", type=Path, default=Path("experiments/unseen"),
                   help="the kernel folders of --run's kernels (default: experiments/unseen)")
    p.add_argument("--dtype", default="float16", help="dtype of --run's kernels (default: float16)")
    p.add_argument("--peer-shapes", type=int, default=1,
                   help="time torch.compile (one default-mode compilation per shape) on this many of each "
                        "kernel's smallest search shapes (default: 1)")
    args = p.parse_args(argv)
    if args.run is not None and not winners(args.run, args.library):
        p.error(f"no best/<kernel>.json under {args.run} names a kernel folder of {args.library}")
    missing = exit_without_gpu("experiments.code_fetch")
    if missing is not None:
        return missing
    result = run(args.repetitions)
    print(f"{result['gpu']}: flush {result['flush_gpu_us']:.1f} us of GPU time; medians of {args.repetitions}")
    print(f"{'kernel':<12}{'flushed us':>12}{'warm us':>10}{'flushed - warm':>16}")
    for r in result["rows"]:
        print(f"{r['kernel']:<12}{r['flushed_us']:>12.2f}{r['warm_us']:>10.2f}{r['flushed_minus_warm_us']:>16.2f}")
    _write(args.out, argv, result)  # the probes' rows are kept whatever happens to the kernels'
    if args.run is not None:
        print(f"kernels of {args.run}:")
        result["kernel_rows"] = run_kernels(args.run, args.library, args.dtype, args.repetitions, args.peer_shapes)
        _write(args.out, argv, result)
        print("flushed - warm, us, median over each kernel's shapes (torch.compile: its shapes only):")
        for kernel in dict.fromkeys(r["kernel"] for r in result["kernel_rows"]):
            extra: dict[str, list[float]] = {}
            for r in result["kernel_rows"]:
                if r["kernel"] == kernel and "error" not in r:
                    extra.setdefault(r["impl"], []).append(r["flushed_minus_warm_us"])
            print(f"  {kernel:<20}" + "  ".join(f"{impl} {statistics.median(v):.2f}" for impl, v in extra.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
