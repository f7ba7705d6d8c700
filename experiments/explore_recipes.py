"""Every embedded recipe of a kernel's family over its parameter grid, beside the peers (GPU).

    python -m experiments.explore_recipes --kernel silu_and_mul --out experiments/results/explore-silu

A map of where each layout wins, for whoever writes recipes: all recipe variants (each at
every point of its ``// tune:`` grid), the hand-written files under
``experiments/results/variants/<kernel>/`` (at their default parameters), our baseline and the peers
are timed per search shape in one interleaved loop
(:meth:`evaluators.gpu.GpuEvaluator.time_peers_full`). Kernel times: CUDA events around one
launch (ours), one CUDA-graph replay (peers); L2 flushed before every repetition.

This loop times; it does not validate. A variant's correctness comes from the evaluator
(``python -m evaluators.check``) or a search, never from this table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from agents.embedded.recipes import recipes_for
from agents.embedded.source import insert_header
from experiments.bench_library import exit_without_gpu
from kernels.spec import load_kernel, shape_label
from kernels.variant import Variant
from kernels.verdict import geomean
from search.report import git_commit

REPO_ROOT = Path(__file__).resolve().parent.parent
PEERS_FIRST = ("baseline", "flashinfer", "torch_compile", "torch_eager")


FAST_MATH = "// flags: --use_fast_math"


def candidates(kernel: str, max_per_recipe: int, fast_math: bool = True) -> dict[str, tuple[str, dict[str, int]]]:
    """``{name: (source, params)}``: every recipe at each grid point, and the hand-written files.

    ``fast_math``: the recipes compiled with ``--use_fast_math``, the flag the search's
    ``fast_math_flag`` adds and every recipe winner of the sweeps carried; off, they are timed
    as written (exact expf, erff, division). Hand-written files keep their own flags."""
    spec = load_kernel(kernel)
    out: dict[str, tuple[str, dict[str, int]]] = {"baseline": (spec.baseline_source(), {})}
    for recipe in recipes_for(spec):
        source = recipe.build(spec)
        if fast_math:
            source = insert_header(source, FAST_MATH)
        for i, params in enumerate(Variant(spec.name, source).launch().param_grid()):
            if i >= max_per_recipe:
                break
            label = ",".join(f"{k}={v}" for k, v in params.items())
            out[f"{recipe.name.removeprefix('recipe:')} {label}"] = (source, params)
    for path in sorted((REPO_ROOT / "experiments" / "results" / "variants" / spec.name).glob("*.cu")):
        out[f"file:{path.name}"] = (path.read_text(), {})
    return out


def table(reply: dict[str, Any], labels: list[str]) -> list[dict[str, Any]]:
    """One row per implementation: per-shape microseconds and geometric-mean speedups over the
    peers (peer time / this time), best first by speedup over torch.compile."""
    times: dict[str, dict[str, float]] = reply["peers"]
    rows = []
    for name, per_shape in times.items():
        row: dict[str, Any] = {"impl": name, "us": {lb: per_shape[lb] * 1e3 for lb in labels if lb in per_shape}}
        for peer in PEERS_FIRST:
            if peer in times and peer != name:
                ratios = [times[peer][lb] / per_shape[lb] for lb in labels if lb in per_shape and lb in times[peer]]
                row[f"vs_{peer}"] = geomean(ratios) if ratios else None
        rows.append(row)
    rows.sort(key=lambda r: -(r.get("vs_torch_compile") or 0.0))
    return rows


def to_markdown(meta: dict[str, Any], rows: list[dict[str, Any]], labels: list[str]) -> str:
    peers = [p for p in PEERS_FIRST if any(f"vs_{p}" in r for r in rows)]
    lines = [f"# Recipe map: {meta['kernel']} ({meta['dtype']}) on {meta['gpu']}", "",
             f"- command: `{meta['command']}`", f"- git commit: {meta['git_commit']}", f"- date: {meta['date']}",
             "- kernel times (us): CUDA events around one launch (ours) or one CUDA-graph replay (peers); L2 "
             f"flushed before every repetition; all interleaved in one loop; median of {meta['repetitions']}",
             "- recipes compiled " + ("with --use_fast_math (as the search's fast_math_flag compiles them)"
                                      if meta.get("fast_math", False) else "as written, without --use_fast_math")
             + "; hand-written files (file:) with the flags their headers give",
             "- not validated here: a timing map, not a verdict; its 'vs' ratios come from this one loop and "
             "carry no spread, so they rank candidates and are no headline (experiments.bench_library repeats "
             "its loop in fresh processes for that)", ""]
    if meta.get("errors"):
        lines += ["Peers not timed: " + "; ".join(f"{k}: {v}" for k, v in meta["errors"].items()), ""]
    lines += ["| implementation | " + " | ".join(f"vs {p}" for p in peers) + " | " + " | ".join(labels) + " |",
              "|---|" + "---|" * (len(peers) + len(labels))]
    for r in rows:
        vs = [f"{r[f'vs_{p}']:.3f}x" if r.get(f"vs_{p}") else "-" for p in peers]
        us = [f"{r['us'][lb]:.2f}" if lb in r["us"] else "-" for lb in labels]
        lines.append(f"| {r['impl']} | " + " | ".join(vs) + " | " + " | ".join(us) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernel", required=True)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--max-per-recipe", type=int, default=24, help="grid points per recipe, in grid order")
    p.add_argument("--repetitions", type=int, default=100)
    p.add_argument("--no-fast-math", action="store_true",
                   help="time the recipes as written, without --use_fast_math (default: with it, as the search's winners)")
    p.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = p.parse_args(argv)
    if (code := exit_without_gpu("experiments.explore_recipes")) is not None:
        return code
    from evaluators.gpu import GpuEvaluator

    spec = load_kernel(args.kernel)
    ours = candidates(spec.name, args.max_per_recipe, fast_math=not args.no_fast_math)
    print(f"{spec.name}: timing {len(ours)} variants beside the peers", flush=True)
    evaluator = GpuEvaluator(step_timeout_s=60.0)
    try:
        gpu = evaluator.info()["gpu"]
        reply = evaluator.time_peers_full(spec.name, args.dtype, "search", ours, repetitions=args.repetitions)
    finally:
        evaluator.close()
    labels = [shape_label(s) for s in spec.shapes("search")]
    rows = table(reply, labels)
    meta = {"kernel": spec.name, "dtype": args.dtype, "gpu": gpu, "repetitions": args.repetitions,
            "fast_math": not args.no_fast_math,
            "command": "python -m experiments.explore_recipes " + " ".join(argv if argv is not None else sys.argv[1:]),
            "git_commit": git_commit(REPO_ROOT), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "errors": reply.get("errors", {}), "copy_bw_tb_s": reply["copy_bw_bytes_per_s"] / 1e12}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "labels": labels, "rows": rows}, indent=1))
    text = to_markdown(meta, rows, labels)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
