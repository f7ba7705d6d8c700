"""``python -m experiments.model_bench --package DIR``: shipped kernels inside a decoder, end to end.

A Llama/Qwen-style decoder (:mod:`experiments.model_decoder`, Llama-3-8B's layer sizes by
default, a few layers, random weights) runs one step under CUDA graphs for decode batch sizes
1..256 (a KV cache of ``--context`` tokens per sequence) and for a prefill of ``--prefill``
tokens, in four configurations built in one process: plain torch, ``torch.compile`` of it,
torch with the shipped ops swapped in for residual-add RMSNorm, NeoX rotary and SiLU-and-mul,
and that under ``torch.compile`` (``fullgraph=True``: the ops cause no graph break).

Times: each configuration's step is captured in a CUDA graph; a repetition replays one graph
between two CUDA events; the configurations take turns within each repetition, and the table
shows the median over ``--repeats`` repetitions (no L2 flush: a step moves far more than the
L2 holds). The share of time in the swapped kernels comes from torch.profiler's kernel
durations over graph replays. Outputs (hidden states and residual after the last layer) are
compared with plain torch: relative L2 error and largest absolute difference.

Runs: ``--runs N`` (default 3) runs all of the above N times, each in a fresh Python process,
and reports each speedup as the median over runs with its min-max and a faster / tie / slower
verdict (:mod:`experiments.model_bench_runs`); ``--runs 1`` is one process and says it has no
spread.

Writes ``OUT/model-bench.json`` and ``.md`` (command, git commit, GPU, date inside); OUT
defaults to a new ``runs/bench-<time>/``. Without a GPU it stops with one line (exit 2).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import importlib
import json
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evaluators.timing import capture_graph
from experiments.bench_library import default_out, exit_without_gpu
from experiments.model_bench_runs import RunFailed, combine, ratio_text, run_children
from experiments.model_decoder import (
    ModelShape,
    ShippedOps,
    StepInputs,
    TorchOps,
    make_inputs,
    make_weights,
    step,
)
from search.report import git_commit

CONFIGS = ("torch", "torch.compile", "shipped", "shipped+compile")
SWAPPED = ("fused_add_rmsnorm", "rotary_embedding_neox", "silu_and_mul")
REPO_ROOT = Path(__file__).resolve().parent.parent
AGREEMENT_REL_L2 = 2e-2  # bf16 through several layers: a few ulps per op, compounded


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.model_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--package", type=Path, required=True, help="folder holding the shipped package (ship's --out)")
    p.add_argument("--name", default="kernel_ops", help="the package's name (ship's --name)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256", help="decode batch sizes")
    p.add_argument("--context", type=int, default=2048, help="KV-cache tokens per sequence in decode")
    p.add_argument("--prefill", type=int, default=4096, help="prefill tokens (0: no prefill)")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--runs", type=int, default=3,
                   help="independent runs, each in a fresh process; ratios are their median [min-max] (1: no spread)")
    p.add_argument("--out", type=Path, help="output folder (default: a new runs/bench-<time>/)")
    return p


# Everything a run needs, forwarded unchanged to each fresh process (--runs and --out are the parent's).
FORWARDED = ("package", "name", "dtype", "layers", "batch_sizes", "context", "prefill", "repeats")


def child_argv(args: argparse.Namespace, out: Path) -> list[str]:
    """The arguments of one independent run: the parent's settings, one run, its own OUT."""
    argv = []
    for dest in FORWARDED:
        argv += ["--" + dest.replace("_", "-"), str(getattr(args, dest))]
    return argv + ["--runs", "1", "--out", str(out)]


def child_command(args: argparse.Namespace, out: Path) -> list[str]:
    """One independent run's command line: this interpreter, this module, :func:`child_argv`."""
    return [sys.executable, "-m", "experiments.model_bench", *child_argv(args, out)]


def load_package(folder: Path, name: str, dtype: str) -> Any:
    """Imports the shipped package and checks it has the three kernels for ``dtype``."""
    sys.path.insert(0, str(folder.resolve()))
    pkg = importlib.import_module(name)
    missing = [k for k in SWAPPED if dtype not in pkg.MANIFEST.get("kernels", {}).get(k, {}).get("builds", {})]
    if missing:
        raise ValueError(f"{folder / name} has no {dtype} build of {', '.join(missing)}; ship a {dtype} run of them")
    pkg.load()
    return pkg


def _configs(pkg: Any) -> dict[str, Callable[..., Any]]:
    import torch

    torch_ops, shipped_ops = TorchOps(), ShippedOps(pkg)

    def plain(*args: Any) -> Any:
        return step(torch_ops, *args)

    def shipped(*args: Any) -> Any:
        return step(shipped_ops, *args)

    return {"torch": plain, "torch.compile": torch.compile(plain, fullgraph=True, dynamic=False),
            "shipped": shipped, "shipped+compile": torch.compile(shipped, fullgraph=True, dynamic=False)}


def capture(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, Any]:
    """Warms ``fn`` up on a side stream (compiles, loads cubins), then captures one call
    (:func:`evaluators.timing.capture_graph`); returns the graph and that call's outputs."""
    captured: dict[str, Any] = {}

    def call() -> None:
        captured["out"] = fn(*args)

    graph = capture_graph(call)
    return graph, captured["out"]


def time_graphs(graphs: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    """Per configuration, the milliseconds of each replay; configurations take turns."""
    import torch

    for g in graphs.values():
        for _ in range(3):
            g.replay()
    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(repeats)] for name in graphs}
    for r in range(repeats):
        for name, g in graphs.items():
            start, end = events[name][r]
            start.record()
            g.replay()
            end.record()
    torch.cuda.synchronize()
    return {name: [s.elapsed_time(e) for s, e in pairs] for name, pairs in events.items()}


def swapped_share(graph: Any) -> dict[str, Any]:
    """Kernel time of the swapped kernels over all kernel time in three replays (profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    ours = total = 0.0
    per_kernel: dict[str, float] = {}
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            us = float(getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0) or 0.0)
            total += us
            if e.name in SWAPPED:
                ours += us
                per_kernel[e.name] = per_kernel.get(e.name, 0.0) + us / 3
    return {"share": ours / total if total else None, "kernel_us_per_step": total / 3 if total else None,
            "swapped_us_per_step": per_kernel}


def agreement(out: Any, ref: Any) -> dict[str, Any]:
    rel = max(float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)) for a, b in zip(out, ref, strict=True))
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, ref, strict=True))
    finite = all(bool(a.isfinite().all()) for a in out)
    return {"rel_l2": rel, "max_abs": diff, "ok": finite and rel <= AGREEMENT_REL_L2}


def bench_case(phase: str, tokens: int, configs: dict[str, Callable[..., Any]], weights: Any, shape: ModelShape,
               args: argparse.Namespace, dtype: Any) -> dict[str, Any]:
    import torch

    layers, cos_sin = weights
    inp: StepInputs = make_inputs(shape, tokens, args.context, phase == "decode", dtype, "cuda")
    graphs, outs = {}, {}
    for name, fn in configs.items():
        graphs[name], outs[name] = capture(fn, (layers, cos_sin, inp, shape))
    times = time_graphs(graphs, args.repeats)
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    ms = {name: statistics.median(t) for name, t in times.items()}
    row = {
        "phase": phase, "tokens": tokens, "ms": ms,
        "ms_min_max": {name: [min(t), max(t)] for name, t in times.items()},
        "shipped_over_torch": ms["torch"] / ms["shipped"],
        "shipped_compile_over_compile": ms["torch.compile"] / ms["shipped+compile"],
        "agreement": {name: agreement(outs[name], outs["torch"]) for name in CONFIGS if name != "torch"},
        "profile": {name: swapped_share(graphs[name]) for name in ("shipped", "shipped+compile")},
    }
    del graphs, outs, inp
    torch.cuda.empty_cache()
    return row


def _f(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _runs_line(runs: int) -> str:
    if runs <= 1:
        return ("- one run: one process, no spread across independent runs, so a ratio within a few percent "
                "of 1.0 may be a tie, not a win or a loss")
    return (f"- {runs} independent runs, each a fresh Python process: a time is the median over the runs of each "
            "run's median; a speedup is the median [min-max] of the runs' ratios, called faster or slower only "
            "when the whole range lies on that side of 1.0, a tie otherwise; outputs agree only when they agree "
            "in every run (worst error shown); the share is the median over the runs")


def to_markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [f"# Model benchmark: shipped kernels in a decoder ({meta['gpu']})", "",
             f"- command: `{meta['command']}`", f"- git commit: {meta['git_commit']}", f"- date: {meta['date']}",
             f"- torch {meta['torch']}; package {meta['package']} (cubins for {meta['arch']}, NVRTC {meta['nvrtc']})",
             f"- model: {meta['model']}, {meta['dtype']}; decode with {meta['context']} cached tokens per sequence",
             f"- time: ms per step, median of {meta['repeats']} CUDA-graph replays timed with CUDA events, "
             "configurations interleaved; a run's speedup is the ratio of its medians (above 1: shipped faster)",
             _runs_line(meta.get("runs", 1)),
             "- share: the swapped kernels' part of all kernel time in a shipped step (torch.profiler)", "",
             "| phase | tokens | torch | torch.compile | shipped | shipped+compile | shipped vs torch | "
             "shipped+compile vs torch.compile | share (shipped / +compile) | outputs agree |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms, prof = r["ms"], r["profile"]
        agree = all(a["ok"] for a in r["agreement"].values())
        worst = max(a["rel_l2"] for a in r["agreement"].values())
        lines.append(f"| {r['phase']} | {r['tokens']} | " + " | ".join(_f(ms[c]) for c in CONFIGS)
                     + f" | {ratio_text(r, 'shipped_over_torch')} | {ratio_text(r, 'shipped_compile_over_compile')} | "
                     f"{_f(prof['shipped']['share'], '.1%')} / {_f(prof['shipped+compile']['share'], '.1%')} | "
                     f"{'yes' if agree else 'NO'} (rel L2 <= {worst:.1e}) |")
    lines += ["", "Evidence of the shipped kernels (from the runs they came from):", ""]
    for k, builds in meta["evidence"].items():
        for dtype, ev in builds.items():
            lines.append(f"- {k} ({dtype}): search {_f(ev.get('speedup_search'))}x, held-out "
                         f"{ev.get('heldout_status')} {_f(ev.get('speedup_heldout'))}x, sanitizer "
                         f"{ev.get('sanitizer_status')}, evaluator {ev.get('evaluator')} on {ev.get('gpu')}"
                         + (" (SYNTHETIC: stand-in run)" if ev.get("synthetic") else ""))
    return "\n".join(lines) + "\n"


def run_once(args: argparse.Namespace, command: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """One run in this process: (meta, rows), or None after a one-line error (package unusable)."""
    import torch

    for attr in ("cache_size_limit", "recompile_limit"):  # one compilation per batch size and config
        if hasattr(torch._dynamo.config, attr):
            setattr(torch._dynamo.config, attr, 256)
    dtype = getattr(torch, args.dtype)
    try:
        pkg = load_package(args.package, args.name, args.dtype)
    except (ValueError, ImportError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return None
    shape = ModelShape(layers=args.layers)
    weights = make_weights(shape, dtype, "cuda")
    configs = _configs(pkg)
    cases = [("decode", int(b)) for b in args.batch_sizes.split(",") if b]
    cases += [("prefill", args.prefill)] if args.prefill else []
    rows = []
    for phase, tokens in cases:
        row = bench_case(phase, tokens, configs, weights, shape, args, dtype)
        print(f"{phase} {tokens}: " + ", ".join(f"{c} {row['ms'][c]:.3f} ms" for c in CONFIGS), flush=True)
        rows.append(row)
    manifest = pkg.MANIFEST
    meta = {
        "command": command, "git_commit": git_commit(REPO_ROOT), "gpu": torch.cuda.get_device_name(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "torch": torch.__version__,
        "package": str(args.package / args.name), "arch": manifest["arch"], "nvrtc": manifest["nvrtc"],
        "dtype": args.dtype, "context": args.context, "repeats": args.repeats, "runs": 1,
        "model": f"{shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads / {shape.kv_heads} KV heads "
                 f"of {shape.head_dim}, intermediate {shape.intermediate}",
        "evidence": {k: {d: b["evidence"] for d, b in e["builds"].items() if d == args.dtype}
                     for k, e in manifest["kernels"].items() if k in SWAPPED},
    }
    return meta, rows


def run_independent(args: argparse.Namespace, command: str,
                    command_for: Callable[[Path], list[str]] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``args.runs`` runs, each a fresh ``python -m experiments.model_bench --runs 1``, combined.

    ``command_for`` (an OUT folder to a command line) replaces the child command in tests.
    Raises :class:`RunFailed` or ``ValueError`` when a run fails or the runs do not match.
    """
    results = run_children(command_for or functools.partial(child_command, args), args.runs)
    rows = combine(results)
    meta = {**results[0]["meta"], "command": command, "runs": len(results), "git_commit": git_commit(REPO_ROOT),
            "run_dates": [r["meta"]["date"] for r in results]}
    meta["date"] = meta["run_dates"][-1]
    meta["per_run_rows"] = [r["rows"] for r in results]
    return meta, rows


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.runs < 1:
        print("error: --runs must be at least 1", file=sys.stderr)
        return 2
    code = exit_without_gpu("model_bench")
    if code is not None:
        return code
    command = "python -m experiments.model_bench " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    if args.runs == 1:
        result = run_once(args, command)
        if result is None:
            return 2
    else:
        try:
            result = run_independent(args, command)
        except (RunFailed, ValueError) as exc:
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
    return write_outputs(args.out or default_out("model-bench").parent, *result)


def write_outputs(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> int:
    """Writes ``model-bench.json`` and ``.md``; 0 when every output agrees with plain torch, else 1."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "model-bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (out / "model-bench.md").write_text(to_markdown(meta, rows))
    print(f"wrote {out / 'model-bench.json'} and {out / 'model-bench.md'}")
    return 0 if all(a["ok"] for r in rows for a in r["agreement"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
