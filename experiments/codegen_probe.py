"""Times the code generator's schedules beside torch.compile, without a search (GPU only).

    python -m experiments.codegen_probe                       # every kernel of experiments/unseen
    python -m experiments.codegen_probe experiments/unseen/transpose_2d --grid --out /tmp/probe

Per kernel folder: every schedule the embedded agent's generator writes for it (at its default
tuning, or with ``--grid`` at every point of its ``// tune:`` grid), the kernel's baseline,
torch eager and torch.compile, timed in one interleaved loop in a fresh sandbox process, the
loop the end of a search uses (ours by CUDA events around one launch, peers by one CUDA-graph
replay, L2 flushed before every repetition). Every kernel of ours is validated in the loop.

It prints, per schedule and point, the geometric mean over the search shapes of
torch.compile's time over ours, and per shape the times; ``--out DIR`` writes ``probe.json``
and ``probe.md`` (command, commit, GPU, date). A quick look at where the generator stands, for
choosing what to search: one loop, no spread, not a headline.

``--compare-fill`` is an A/B of the small-launch block cap of the elementwise schedules and the
gated recipes (a launch of a few long rows takes smaller blocks, down to a warp, until it has
about FILL_BLOCKS of them): each schedule or recipe whose launch has the cap is timed beside its
twin without it (``<name> uncapped``, the same source with the cap's term taken out of its
launch line), the only other kernels in the loop; with ``--loops N`` (N fresh loops, each in
its own process) it reports per shape the uncapped time over the capped one, median
[min-max] over the loops. ``--no-peers`` leaves torch eager and torch.compile out of the loop.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from experiments.bench_library import exit_without_gpu
from kernels.verdict import geomean

ROOT = Path(__file__).resolve().parents[1]
UNSEEN = ROOT / "experiments" / "unseen"


def tune_points(source: str, grid: bool) -> list[dict[str, int]]:
    """The default point of a source's ``// tune:`` grid, or every point of it."""
    from kernels.launch import parse_launch_header

    launch = parse_launch_header(source)
    return list(launch.param_grid()) if grid else [launch.default_params()]


UNCAPPED = " uncapped"


def without_fill_cap(source: str) -> str:
    """The source with the small-launch block cap (:func:`agents.embedded.launch_fill.fill_threads`)
    taken out of its launch line: the block as the generator wrote it before the cap."""
    import re

    from agents.embedded.launch_fill import fill_threads

    term = re.escape(", " + fill_threads("ROWS", "COLS")).replace("ROWS", "[^,()]+").replace("COLS", "[^,()]+")
    return re.sub(term, "", source)


def variants_of(folder: Path, grid: bool, compare_fill: bool = False) -> dict[str, tuple[str, dict[str, int]]]:
    """Name -> (source, parameters): every generated schedule at its points, and the baseline;
    with ``compare_fill``, only the schedules with the block cap, each beside its uncapped twin."""
    from agents.embedded.codegen import generate
    from kernels.spec import load_kernel

    spec = load_kernel(folder)
    out: dict[str, tuple[str, dict[str, int]]] = {}
    written = [(s.name.removeprefix("codegen:"), s.source) for s in generate(spec)]
    if compare_fill:  # the embedded recipes with the cap too (the gated activations' flat and tiles)
        from agents.embedded.recipes import recipes_for

        written += [(r.name, r.build(spec)) for r in recipes_for(spec)]
    for schedule, source in written:
        uncapped = without_fill_cap(source)
        if compare_fill and uncapped == source:
            continue
        for params in tune_points(source, grid):
            label = ",".join(f"{k}={v}" for k, v in params.items())
            name = f"{schedule} {label}".strip()
            out[name] = (source, params)
            if compare_fill:
                out[name + UNCAPPED] = (uncapped, params)
    if not compare_fill:
        out["baseline"] = (spec.baseline_source(), {})
    return out


def probe(evaluator: Any, folder: Path, dtype: str, grid: bool, repetitions: int, compare_fill: bool = False,
          peers: bool = True) -> dict[str, Any]:
    """One kernel's loop: per implementation, its time per shape and its geomean ratio."""
    from kernels.spec import load_kernel, shape_label

    spec = load_kernel(folder)
    variants = variants_of(folder, grid, compare_fill)
    if not variants:
        return {"kernel": spec.name, "folder": str(folder), "dtype": dtype, "shapes": [], "times_ms": {},
                "vs_torch_compile": {}, "failed": {}, "errors": {"all": "no schedule with the block cap"}}
    reply = evaluator.time_peers_full(str(folder), dtype, "search", variants, repetitions=repetitions,
                                      fresh_process=True, peers=peers)
    times = reply["peers"]
    compiled = times.get("torch_compile", {})
    labels = [shape_label(s) for s in spec.search_shapes]
    ratios = {}
    for name, per_shape in times.items():
        pairs = [compiled[lab] / per_shape[lab] for lab in labels if per_shape.get(lab) and compiled.get(lab)]
        ratios[name] = geomean(pairs) if len(pairs) == len(labels) else None
    return {"kernel": spec.name, "folder": str(folder), "dtype": dtype, "shapes": labels, "times_ms": times,
            "vs_torch_compile": ratios, "failed": reply.get("failed", {}), "errors": reply.get("errors", {})}


def merge_loops(loops: list[dict[str, Any]]) -> dict[str, Any]:
    """One kernel's result from several fresh loops: the first loop's record, with every loop's
    times, the geomean ratios to torch.compile as median [min, max] over the loops, and (for
    each capped schedule beside its uncapped twin) per shape the uncapped time over the capped
    one, median [min, max]."""
    import statistics

    first = dict(loops[0])
    first["loops_times_ms"] = [r["times_ms"] for r in loops]

    def spread(values: list[float]) -> list[float] | None:
        return [statistics.median(values), min(values), max(values)] if values else None

    ranges = {n: spread([r["vs_torch_compile"][n] for r in loops if r["vs_torch_compile"].get(n)])
              for n in first["vs_torch_compile"]}
    first["vs_torch_compile"] = {n: v[0] if v else None for n, v in ranges.items()}
    first["vs_torch_compile_range"] = ranges
    ab: dict[str, dict[str, list[float] | None]] = {}
    for name in first["times_ms"]:
        twin = name + UNCAPPED
        if twin not in first["times_ms"]:
            continue
        ab[name] = {lab: spread([r["times_ms"][twin][lab] / r["times_ms"][name][lab] for r in loops
                                 if r["times_ms"].get(name, {}).get(lab) and r["times_ms"].get(twin, {}).get(lab)])
                    for lab in first["shapes"]}
    first["uncapped_over_capped"] = ab
    return first


def _ab_markdown(r: dict[str, Any]) -> list[str]:
    """The A/B table of one kernel: per capped schedule and shape, uncapped time / capped time."""
    if not r.get("uncapped_over_capped"):
        return []
    lines = ["uncapped time / capped time per shape, median [min-max] over the loops (above 1: the cap is faster)",
             "", "| schedule | " + " | ".join(r["shapes"]) + " |", "|---" * (len(r["shapes"]) + 1) + "|"]
    for name, per in r["uncapped_over_capped"].items():
        cells = [f"{v[0]:.3f} [{v[1]:.3f}-{v[2]:.3f}]" if v else "n/a" for v in (per[lab] for lab in r["shapes"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def to_markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [f"# Code generator probe on {meta['gpu']}", "",
             f"- command: `{meta['command']}`", f"- git commit: {meta['commit']}", f"- date: {meta['date']}",
             "- times: kernel times in one interleaved loop per kernel, in a fresh sandbox process; ours by CUDA "
             "events around one launch, peers by one CUDA-graph replay; L2 flushed before every repetition; "
             f"median of {meta['repetitions']} repetitions; "
             + ("one loop, no spread" if meta.get("loops", 1) == 1 else
                f"{meta['loops']} fresh loops per kernel, ratios as median [min-max] over them"), ""]
    for r in results:
        lines += [f"## {r['kernel']} ({r['dtype']})", ""]
        if any(v is not None for v in r["vs_torch_compile"].values()):
            lines += ["| implementation | torch.compile time / its time (geomean) |", "|---|---|"]
            ranked = sorted(r["vs_torch_compile"].items(), key=lambda kv: -(kv[1] or 0.0))
            ranges = r.get("vs_torch_compile_range") or {}
            lines += [f"| {name} | {'n/a' if v is None else f'{v:.3f}x'}"
                      + (f" [{ranges[name][1]:.3f}-{ranges[name][2]:.3f}]" if ranges.get(name) and meta.get("loops", 1) > 1 else "")
                      + " |" for name, v in ranked]
            lines.append("")
        lines += _ab_markdown(r)
        if r.get("errors", {}).get("all"):
            lines += [f"not probed: {r['errors']['all']}", ""]
        if r["failed"]:
            lines += ["", "failed in the loop: " + "; ".join(f"{k}: {v}" for k, v in r["failed"].items())]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="*", type=Path, help="kernel folders (default: every one in experiments/unseen)")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--grid", action="store_true", help="every point of each schedule's tune grid, not only the default")
    p.add_argument("--repetitions", type=int, default=50)
    p.add_argument("--out", type=Path, help="directory for probe.json and probe.md")
    p.add_argument("--compare-fill", action="store_true",
                   help="time each schedule with the small-launch block cap beside its uncapped twin (only those)")
    p.add_argument("--loops", type=int, default=1, help="fresh loops per kernel (ratios as median [min-max])")
    p.add_argument("--no-peers", action="store_true", help="leave torch eager and torch.compile out of the loop")
    args = p.parse_args(argv)
    if args.loops < 1:
        p.error("--loops must be at least 1")
    folders = args.folders or sorted(f.parent for f in UNSEEN.glob("*/spec.py"))
    missing = [str(f) for f in folders if not (f / "spec.py").is_file()]
    if missing:
        print(f"error: not kernel folders (no spec.py): {', '.join(missing)}", file=sys.stderr)
        return 2
    code = exit_without_gpu("experiments.codegen_probe")
    if code is not None:
        return code
    from evaluators.gpu import GpuEvaluator
    from search.report import git_commit

    evaluator = GpuEvaluator(step_timeout_s=120.0)
    results = []
    try:
        for folder in folders:
            result = merge_loops([probe(evaluator, folder, args.dtype, args.grid, args.repetitions,
                                        args.compare_fill, not args.no_peers) for _ in range(args.loops)])
            results.append(result)
            best = max(((n, v) for n, v in result["vs_torch_compile"].items() if v and n != "torch_compile"),
                       key=lambda kv: kv[1], default=None)
            if best is not None:
                print(f"{result['kernel']}: best {best[0]} at {best[1]:.3f}x torch.compile", flush=True)
            print("\n".join([result["kernel"] + ":", *_ab_markdown(result)]) if args.compare_fill else "", flush=True)
        import torch  # the GPU's name, as the search's report takes it when the evaluator has none

        gpu = str(getattr(evaluator, "device_name", "") or torch.cuda.get_device_name(0))
    finally:
        evaluator.close()
    meta = {"command": "python -m experiments.codegen_probe " + shlex.join(sys.argv[1:] if argv is None else list(argv)),
            "commit": git_commit(ROOT), "gpu": gpu, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "repetitions": args.repetitions, "loops": args.loops}
    text = to_markdown(meta, results)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
        (args.out / "probe.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
