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


def variants_of(folder: Path, grid: bool) -> dict[str, tuple[str, dict[str, int]]]:
    """Name -> (source, parameters): every generated schedule at its points, and the baseline."""
    from agents.embedded.codegen import generate
    from kernels.spec import load_kernel

    spec = load_kernel(folder)
    out: dict[str, tuple[str, dict[str, int]]] = {}
    for schedule in generate(spec):
        for params in tune_points(schedule.source, grid):
            label = ",".join(f"{k}={v}" for k, v in params.items())
            out[f"{schedule.name.removeprefix('codegen:')} {label}".strip()] = (schedule.source, params)
    out["baseline"] = (spec.baseline_source(), {})
    return out


def probe(evaluator: Any, folder: Path, dtype: str, grid: bool, repetitions: int) -> dict[str, Any]:
    """One kernel's loop: per implementation, its time per shape and its geomean ratio."""
    from kernels.spec import load_kernel, shape_label

    spec = load_kernel(folder)
    variants = variants_of(folder, grid)
    reply = evaluator.time_peers_full(str(folder), dtype, "search", variants, repetitions=repetitions,
                                      fresh_process=True)
    times = reply["peers"]
    compiled = times.get("torch_compile", {})
    labels = [shape_label(s) for s in spec.search_shapes]
    ratios = {}
    for name, per_shape in times.items():
        pairs = [compiled[lab] / per_shape[lab] for lab in labels if per_shape.get(lab) and compiled.get(lab)]
        ratios[name] = geomean(pairs) if len(pairs) == len(labels) else None
    return {"kernel": spec.name, "folder": str(folder), "dtype": dtype, "shapes": labels, "times_ms": times,
            "vs_torch_compile": ratios, "failed": reply.get("failed", {}), "errors": reply.get("errors", {})}


def to_markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [f"# Code generator probe on {meta['gpu']}", "",
             f"- command: `{meta['command']}`", f"- git commit: {meta['commit']}", f"- date: {meta['date']}",
             "- times: kernel times in one interleaved loop per kernel, in a fresh sandbox process; ours by CUDA "
             "events around one launch, peers by one CUDA-graph replay; L2 flushed before every repetition; "
             f"median of {meta['repetitions']} repetitions; one loop, no spread", ""]
    for r in results:
        lines += [f"## {r['kernel']} ({r['dtype']})", "", "| implementation | torch.compile time / its time (geomean) |",
                  "|---|---|"]
        ranked = sorted(r["vs_torch_compile"].items(), key=lambda kv: -(kv[1] or 0.0))
        lines += [f"| {name} | {'n/a' if v is None else f'{v:.3f}x'} |" for name, v in ranked]
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
    args = p.parse_args(argv)
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
            result = probe(evaluator, folder, args.dtype, args.grid, args.repetitions)
            results.append(result)
            best = max(((n, v) for n, v in result["vs_torch_compile"].items() if v and n != "torch_compile"),
                       key=lambda kv: kv[1], default=("none", 0.0))
            print(f"{result['kernel']}: best {best[0]} at {best[1]:.3f}x torch.compile", flush=True)
        gpu = str(getattr(evaluator, "device_name", "") or "GPU")
    finally:
        evaluator.close()
    meta = {"command": "python -m experiments.codegen_probe " + shlex.join(sys.argv[1:] if argv is None else list(argv)),
            "commit": git_commit(ROOT), "gpu": gpu, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "repetitions": args.repetitions}
    text = to_markdown(meta, results)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
        (args.out / "probe.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
