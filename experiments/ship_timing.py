"""``python -m experiments.ship_timing --package DIR``: shipped ops timed beside the run's own times.

For every op and dtype of a shipped package and every shape its evidence lists, the op is
captured in a CUDA graph (one launch through the package's driver-API path) and timed by the
evaluator's own loop (:func:`evaluators.timing.time_interleaved`): the L2 flushed before each
repetition, CUDA events around one replay, median of 100 repetitions after 20 warm-ups.
Beside each time stands the evaluator's time of the same kernel from the run (``best_ms``);
their ratio should sit within the run's noise of 1.0. A stand-in run's times are synthetic:
the ratio then means nothing, and the table says so.

Writes ``OUT/ship-timing.json`` and ``.md`` (OUT defaults to a new ``runs/bench-<time>/``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evaluators.timing import Flusher, Timed, capture_graph, time_interleaved
from experiments.bench_library import default_out, exit_without_gpu
from kernels.spec import KernelSpec, load_kernel, shape_label
from search.report import git_commit

REPO_ROOT = Path(__file__).resolve().parent.parent


def time_op(pkg: Any, spec: KernelSpec, dtype: str, shape: dict[str, int], flush: Flusher, warmup: int = 20,
            reps: int = 100) -> float:
    """Median milliseconds of one graph-captured launch of the op at ``shape``, L2 flushed."""
    import torch

    inputs = spec.make_inputs(shape, getattr(torch, dtype), torch.Generator(device="cuda").manual_seed(0),
                              "random", torch.device("cuda"))
    args = [inputs[a.name] for a in spec.args if a.kind == "tensor"]
    op = getattr(pkg, spec.name)
    graph = capture_graph(lambda: op(*args))  # its warm-up launches load the cubin outside the capture
    samples = time_interleaved([Timed("op", lambda i: None, graph.replay)], flush, warmup, reps)
    return samples["op"].median_ms


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.ship_timing", description=__doc__.split("\n\n")[0])
    p.add_argument("--package", type=Path, required=True)
    p.add_argument("--name", default="kernel_ops")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    code = exit_without_gpu("ship_timing")
    if code is not None:
        return code
    import torch

    sys.path.insert(0, str(args.package.resolve()))
    pkg = __import__(args.name)
    rows = []
    flush = Flusher(torch.device("cuda"))
    for kernel, entry in pkg.MANIFEST["kernels"].items():
        spec = load_kernel(kernel)
        for dtype, build in entry["builds"].items():
            ev = build["evidence"]
            for s in ev["shapes"]:
                ms = time_op(pkg, spec, dtype, s["shape"], flush)
                evaluator_ms = s.get("best_ms")  # absent where the run's evidence has no time for it
                rows.append({"kernel": kernel, "dtype": dtype, "shape": shape_label(s["shape"]), "op_ms": ms,
                             "evaluator_ms": evaluator_ms, "ratio": ms / evaluator_ms if evaluator_ms else None,
                             "synthetic": ev["synthetic"]})
                print(f"{kernel} {dtype} {rows[-1]['shape']}: op {ms:.4f} ms, evaluator {_ms(evaluator_ms)} ms")
    meta = {"command": "python -m experiments.ship_timing " + shlex.join(sys.argv[1:] if argv is None else list(argv)),
            "git_commit": git_commit(REPO_ROOT), "gpu": torch.cuda.get_device_name(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    out = args.out or default_out("ship-timing").parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "ship-timing.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [f"# Shipped ops vs the evaluator's times ({meta['gpu']})", "", f"- command: `{meta['command']}`",
             f"- git commit: {meta['git_commit']}; date: {meta['date']}",
             "- op: one CUDA-graph replay of the op, L2 flushed, CUDA events, median of 100 after 20 warm-ups",
             "", "| kernel | dtype | shape | op ms | evaluator ms | op / evaluator |", "|---|---|---|---|---|---|"]
    for r in rows:
        note = " (evaluator times synthetic)" if r["synthetic"] else ""
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(f"| {r['kernel']} | {r['dtype']} | {r['shape']} | {r['op_ms']:.4f} | {_ms(r['evaluator_ms'])} | "
                     f"{ratio}{note} |")
    (out / "ship-timing.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'ship-timing.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
