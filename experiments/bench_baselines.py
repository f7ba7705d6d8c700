"""Baselines beside production peers, on the GPU machine.

    python -m experiments.bench_baselines --out experiments/results/baselines-h200

For every kernel, dtype and search shape: the median kernel time and effective bandwidth of
our baseline, FlashInfer, torch eager and torch.compile, the fraction of the measured copy
bandwidth, and the A/A noise floor (our baseline timed against itself). All columns are
kernel times: CUDA events around one launch (ours) or one CUDA-graph replay (peers), inputs
restored and L2 flushed before each repetition, all implementations interleaved in one loop.
Writes OUT.json and OUT.md with the command, git commit, GPU and date; OUT defaults to a new
folder, ``runs/bench-<UTC time>/baselines``, never the kept results under ``experiments/results/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from evaluators.api import EvalRequest, TimingConfig
from experiments.bench_library import default_out, exit_without_gpu
from kernels.spec import load_kernel, shape_label
from kernels.variant import Variant

ASTRA = ["silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse"]
PEERS = ["flashinfer", "torch_compile", "torch_eager", "liger"]


def git_commit() -> str:
    """The commit under test; KERNEL_SEARCH_COMMIT wins (the GPU machine gets no .git)."""
    if os.environ.get("KERNEL_SEARCH_COMMIT"):
        return os.environ["KERNEL_SEARCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=False).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") or "unknown"
    except OSError:
        return "unknown"


def bench_kernel(evaluator: Any, name: str, dtype: str, shape_set: str, extra: dict[str, str]) -> dict[str, Any]:
    spec = load_kernel(name)
    ours: dict[str, tuple[str, dict[str, int]]] = {"baseline": (spec.baseline_source(), {})}
    for label, path in extra.items():
        ours[label] = (Path(path).read_text(), {})
    reply = evaluator.time_peers_full(name, dtype, shape_set, ours)
    aa = evaluator.evaluate(EvalRequest(name, Variant(name, spec.baseline_source()), dtype=dtype,
                                        shape_set=shape_set, timing=TimingConfig.full()))
    copy_bw = reply["copy_bw_bytes_per_s"]
    rows = []
    for shape in spec.shapes(shape_set):
        label = shape_label(shape)
        nbytes = spec.bytes_moved(shape, dtype)
        row: dict[str, Any] = {"shape": dict(shape), "label": label, "bytes_moved": nbytes, "impl": {}}
        for impl, per_shape in reply["peers"].items():
            ms = per_shape.get(label)
            if ms is None:
                continue
            bw = nbytes / (ms * 1e-3)
            row["impl"][impl] = {"median_us": ms * 1e3, "iqr_us": reply["iqr"][impl][label] * 1e3,
                                 "bandwidth_tb_s": bw / 1e12, "copy_bw_fraction": bw / copy_bw}
        aa_shape = next(s for s in aa.shapes if s.shape == dict(shape))
        row["aa_ratio"] = aa_shape.baseline_ms / aa_shape.candidate_ms
        rows.append(row)
    return {"kernel": name, "dtype": dtype, "shape_set": shape_set, "rows": rows,
            "aa_geomean": aa.speedup, "peer_errors": reply["errors"], "copy_bw_tb_s": copy_bw / 1e12}


def to_markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [f"# Baselines and peers on {meta['gpu']}", "",
             f"- command: `{meta['command']}`", f"- git commit: {meta['git_commit']}", f"- date: {meta['date']}",
             f"- measured copy bandwidth: {meta['copy_bw_tb_s']:.2f} TB/s (device-to-device copy, read + write)",
             f"- timing: {meta['timing']}", ""]
    for r in results:
        impls = [i for i in ["baseline", *[k for k in r["rows"][0]["impl"] if k != "baseline"]] if i in r["rows"][0]["impl"]]
        lines += [f"## {r['kernel']} ({r['dtype']}, {r['shape_set']} shapes)", "",
                  f"A/A noise floor (baseline vs itself, geometric mean): {r['aa_geomean']:.4f}", "",
                  "| shape | " + " | ".join(f"{i} us (TB/s, % copy)" for i in impls) + " | A/A |",
                  "|---|" + "---|" * (len(impls) + 1)]
        for row in r["rows"]:
            cells = []
            for i in impls:
                v = row["impl"].get(i)
                cells.append("-" if v is None else
                             f"{v['median_us']:.1f} ({v['bandwidth_tb_s']:.2f}, {v['copy_bw_fraction']:.0%})")
            lines.append(f"| {row['label']} | " + " | ".join(cells) + f" | {row['aa_ratio']:.3f} |")
        if r["peer_errors"]:
            lines += ["", "Peers that could not be timed: " + "; ".join(f"{k}: {v}" for k, v in r["peer_errors"].items())]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernel", action="append", help="kernels (default: the three Astra kernels)")
    p.add_argument("--dtype", action="append", help="dtypes (default: each kernel's)")
    p.add_argument("--shapes", default="search", choices=("search", "heldout"))
    p.add_argument("--variant", action="append", default=[], metavar="KERNEL:LABEL=PATH",
                   help="also time a variant file beside the baseline")
    p.add_argument("--out", default=None,
                   help="writes OUT.json and OUT.md (default: a new folder, runs/bench-<UTC time>/baselines)")
    args = p.parse_args(argv)
    if (code := exit_without_gpu("experiments.bench_baselines")) is not None:
        return code
    from evaluators.gpu import GpuEvaluator

    extra: dict[str, dict[str, str]] = {}
    for item in args.variant:
        k, _, rest = item.partition(":")
        label, _, path = rest.partition("=")
        extra.setdefault(k, {})[label] = path
    evaluator = GpuEvaluator(step_timeout_s=60.0)
    results = []
    try:
        info = evaluator.info()
        for name in args.kernel or ASTRA:
            spec = load_kernel(name)
            for dtype in args.dtype or list(spec.dtypes):
                print(f"{name} {dtype} ...", flush=True)
                results.append(bench_kernel(evaluator, name, dtype, args.shapes, extra.get(name, {})))
    finally:
        evaluator.close()
    meta = {
        "command": "python -m experiments.bench_baselines " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": git_commit(), "gpu": info["gpu"], "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "copy_bw_tb_s": info["copy_bw_bytes_per_s"] / 1e12,
        "timing": "median of 100 repetitions after 20 warm-ups; CUDA events around one launch (ours) or one "
                  "CUDA-graph replay (peers); inputs restored and L2 flushed (256 MB memset) before every "
                  "repetition; implementations interleaved; torch_compile = torch.compile of the fp32 reference",
    }
    out = Path(args.out) if args.out is not None else default_out("baselines")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    out.with_suffix(".md").write_text(to_markdown(meta, results))
    print(to_markdown(meta, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
