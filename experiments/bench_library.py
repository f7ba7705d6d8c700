"""The kernel library beside its production peers, with plots, on the GPU machine.

    python -m experiments.bench_library --best runs/sweep-20261129-101500-ab12
    python -m experiments.bench_library --kernel rmsnorm --kernel layernorm --merge

For every kernel, dtype (default float16) and search shape: our baseline, the best kernel a
sweep or run found (``--best DIR``: its ``best/<kernel>.cu`` and ``.json``; optional), torch
eager, torch.compile, Liger and FlashInfer where the spec has them, all timed in one
interleaved loop (:meth:`evaluators.gpu.GpuEvaluator.time_peers_full`), with the achieved
fraction of the measured copy bandwidth. Every figure is kernel time: CUDA events around one
launch (ours) or one CUDA-graph replay (peers), L2 flushed before each repetition.

The loop is repeated ``--repeats`` times (default 3) per kernel and dtype, each time in a fresh
sandbox process (as the end of a search run does): every ratio is the median over the loops of
that loop's ratio, printed with its min-max and the verdict of :mod:`search.spread` (faster or
slower only when the whole range is above or below 1.0x, a tie otherwise); the per-shape tables
give each implementation's median time over the loops.

Writes OUT.json and OUT.md (command, git commit, GPU, date) and one PNG per kernel and dtype
(OUT-<kernel>-<dtype>.png; needs matplotlib, the ``plots`` extra). OUT defaults to a new
folder, ``runs/bench-<UTC time>/library``, so a run never overwrites the measured results kept
under ``experiments/results/`` unless ``--out`` names them. ``--merge`` keeps the
entries of an earlier OUT.json for kernels not timed this time, so the library can be timed
in several shorter runs and still give one table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from evaluators.gpu import EvaluatorError
from kernels.spec import KernelSpec, kernel_ref, list_kernels, load_kernel, shape_label
from kernels.verdict import geomean
from search import spread
from search.report import git_commit

REPO_ROOT = Path(__file__).resolve().parent.parent
TIMING = ("median of the repetitions after 20 warm-ups; CUDA events around one launch (ours) or one CUDA-graph "
          "replay (peers); inputs restored and L2 flushed before every repetition; implementations interleaved "
          "in one loop, every implementation on one working set; torch_compile = the fastest per shape of fresh "
          "compilations (default and max-autotune-no-cudagraphs, each compiled twice, caches off) of the spec's "
          "`compiled` program; peers that return new tensors are timed without a copy into the outputs; the "
          "loop repeated in fresh sandbox processes, ratios the median over the loops [min-max]")
PLOT_TITLE = "kernel time, CUDA events / graph replay, L2 flushed"
OURS = ("baseline", "best")
GRAPH_NOTE = ("; <name>@graph = the same kernel of ours captured in a CUDA graph and replayed, timed exactly as the "
              "peers are, so that 'vs best@graph' is what the launch mechanism alone changes")


def find_best(best_dir: Path | None, kernel: str) -> tuple[Path, dict[str, Any]] | None:
    """The best kernel a sweep or run directory recorded for ``kernel``: (source path, evidence)."""
    if best_dir is None:
        return None
    candidates = [best_dir / "best"] + sorted(p / "best" for p in best_dir.iterdir() if p.is_dir())
    for folder in candidates:
        source, evidence = folder / f"{kernel}.cu", folder / f"{kernel}.json"
        if source.is_file() and evidence.is_file():
            found = json.loads(evidence.read_text())
            if found.get("dispatch"):
                # best/<kernel>.cu is the dispatch's primary kernel; the others run on some shapes.
                print(f"note: {kernel}'s result dispatches {len(found['dispatch']['members'])} kernels by shape; "
                      f"'best' here is the primary alone ({source})", file=sys.stderr)
            return source, found
    return None


def combine_loops(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """One reply from the replies of one kernel's repeated loops (a reply is ``{"loop_error":
    why}`` for a loop that could not run), for :func:`kernel_result`.

    ``peers`` and ``iqr`` are the per-shape medians over the loops that timed them; ``runs``
    keeps each loop's times for the ratios. A kernel of ours that failed verification in any
    loop is failed in all of them: its times from the other loops are dropped too, so no ratio
    is taken of a kernel that once gave a wrong output.
    """
    errors: dict[str, str] = {}
    failed: dict[str, str] = {}
    timed: list[dict[str, dict[str, float]]] = []
    iqrs: list[dict[str, dict[str, float]]] = []
    copy_bw: list[float] = []
    for i, reply in enumerate(replies, 1):
        if "loop_error" in reply:
            errors[f"loop (run {i})"] = reply["loop_error"]
            continue
        for peer, why in reply.get("errors", {}).items():
            errors.setdefault(peer, why)
        for ours, why in reply.get("failed", {}).items():
            failed.setdefault(ours, f"run {i}: {why}" if len(replies) > 1 else why)
        timed.append(dict(reply.get("peers", {})))
        iqrs.append(dict(reply.get("iqr", {})))
        if reply.get("copy_bw_bytes_per_s"):
            copy_bw.append(float(reply["copy_bw_bytes_per_s"]))
    if not timed:  # every loop failed: their reasons, each once
        raise EvaluatorError("; ".join(dict.fromkeys(r["loop_error"] for r in replies)))
    runs = [{impl: t for impl, t in run.items() if impl not in failed} for run in timed]
    return {"peers": spread.median_times(runs), "iqr": spread.median_times(iqrs), "errors": errors,
            "failed": failed, "copy_bw_bytes_per_s": statistics.median(copy_bw) if copy_bw else 1.0, "runs": runs}


def kernel_result(spec: KernelSpec, dtype: str, shape_set: str, reply: dict[str, Any],
                  best: dict[str, Any] | None) -> dict[str, Any]:
    """One kernel's entry of the results from a ``time_peers_full`` reply (no GPU needed).

    Args:
        spec: the kernel.
        dtype: the dtype timed.
        shape_set: ``search`` or ``heldout``.
        reply: ``{"peers": {impl: {label: ms}}, "iqr": ..., "errors": ..., "failed": ...,
            "copy_bw_bytes_per_s": ...}``, and ``runs`` (each loop's ``peers``) when the loop
            was repeated (:func:`combine_loops`); our kernels in ``failed`` (wrong on a timed
            launch, faster than the roofline, faulted) have no times and are listed with the reason.
        best: what is known of the best kernel timed as ``best`` (variant id, source path), or None.
    """
    copy_bw = float(reply["copy_bw_bytes_per_s"])
    rows = []
    for shape in spec.shapes(shape_set):
        label, nbytes = shape_label(shape), spec.bytes_moved(shape, dtype)
        impl = {}
        for name, per_shape in reply["peers"].items():
            ms = per_shape.get(label)
            if ms is None or ms <= 0:
                continue
            bw = nbytes / (ms * 1e-3)
            impl[name] = {"median_us": ms * 1e3, "iqr_us": reply.get("iqr", {}).get(name, {}).get(label, 0.0) * 1e3,
                          "bandwidth_tb_s": bw / 1e12, "copy_bw_fraction": bw / copy_bw}
        rows.append({"shape": dict(shape), "label": label, "bytes_moved": nbytes, "impl": impl})
    runs = list(reply.get("runs", []))
    return {"kernel": spec.name, "dtype": dtype, "shape_set": shape_set, "best": best, "rows": rows,
            "peer_errors": dict(reply.get("errors", {})), "copy_bw_tb_s": copy_bw / 1e12,
            "ours_failed": dict(reply.get("failed", {})), "loops": len(runs), "loop_runs_ms": runs,
            "summary": summarize(rows, runs)}


def summarize(rows: list[dict[str, Any]], runs: list[dict[str, dict[str, float]]] | None = None) -> dict[str, Any]:
    """Speedups of our kernel (best, else baseline) over every other implementation, and its
    copy-bandwidth fraction on the largest shape.

    With ``runs`` (each loop's times), a speedup is the median over the loops of that loop's
    geometric mean over the shapes, and ``spreads`` holds its min-max and verdict
    (:mod:`search.spread`); without, it is the geometric mean of the rows' times (one loop).
    """
    names = {n for r in rows for n in r["impl"]}
    ours = "best" if "best" in names else "baseline"
    speedups: dict[str, float] = {}
    ranges: dict[str, dict[str, Any]] = {}
    if runs:
        for other, s in spread.spreads(runs, ours=ours, labels=[r["label"] for r in rows]).items():
            speedups[other], ranges[other] = s.median, s.to_dict()
    else:
        for other in sorted(names - {ours}):
            ratios = [r["impl"][other]["median_us"] / r["impl"][ours]["median_us"] for r in rows
                      if other in r["impl"] and ours in r["impl"]]
            if ratios:
                speedups[other] = geomean(ratios)
    largest = max(rows, key=lambda r: r["bytes_moved"], default=None)
    fraction = largest["impl"].get(ours, {}).get("copy_bw_fraction") if largest else None
    return {"ours": ours, "speedup_over": speedups, "spreads": ranges,
            "largest_shape": largest["label"] if largest else None, "copy_bw_fraction_largest": fraction}


def implementations(results: list[dict[str, Any]]) -> list[str]:
    """Every implementation in the results, ours first, then the peers by name."""
    names = {n for r in results for row in r["rows"] for n in row["impl"]}
    return [n for n in OURS if n in names] + sorted(names - set(OURS))


def shape_table(result: dict[str, Any]) -> list[str]:
    """Markdown lines: one row per shape, microseconds and copy-bandwidth fraction per implementation."""
    impls = implementations([result])
    if not impls:  # nothing timed (a stand-in run has no loop): a header without columns is no table
        return ["No per-shape times: no implementation was timed in an end-of-run loop."]
    lines = ["| shape | " + " | ".join(f"{i} us (% copy)" for i in impls) + " |", "|---|" + "---|" * len(impls)]
    for row in result["rows"]:
        cells = [f"{v['median_us']:.2f} ({v['copy_bw_fraction']:.0%})" if (v := row["impl"].get(i)) else "-"
                 for i in impls]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    return lines


def _x(v: float | None, spec: str = ".2f", suffix: str = "x") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _ratio(summary: dict[str, Any], other: str) -> str:
    """Our speedup over ``other`` with its range over the loops, or the one loop's figure."""
    ranged = summary.get("spreads", {}).get(other)
    if ranged:
        return spread.text(ranged)
    value = summary["speedup_over"].get(other)
    return "-" if value is None else f"{value:.3f}x (one run, no spread)"


def to_markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """The summary table (one line per kernel and dtype) and a per-shape table per kernel."""
    peers = [n for n in implementations(results) if n not in OURS]
    if any(r["summary"]["ours"] == "best" for r in results):
        peers.insert(0, "baseline")  # our best kernel over our baseline, from the same loops
    lines = [f"# The kernel library beside its peers on {meta['gpu']}", "",
             f"- command: `{meta['command']}`", f"- git commit: {meta['git_commit']}", f"- date: {meta['date']}",
             f"- best kernels from: {meta.get('best_dir') or '- (baselines only)'}",
             f"- timing: {meta['timing']}", ""]
    if meta.get("failed"):
        lines += ["Could not be timed: " + "; ".join(f"{k}: {v}" for k, v in sorted(meta["failed"].items())), ""]
    refused = [f"{r['kernel']} {r['dtype']} {name}: {why}" for r in results
               for name, why in sorted(r.get("ours_failed", {}).items())]
    if refused:
        lines += ["Failed verification in the loop (not timed): " + "; ".join(refused), ""]
    lines += ["Speedup = peer time / our time, geometric mean over the shapes both ran within one loop; median "
             "over the loops [min-max] (each loop in a fresh sandbox process); faster only when the whole range is "
             "above 1.0x, slower only when it is below, a tie when it straddles 1.0x; a ratio marked 'one run' had "
             "no repeated loops to give it a range. Ours = the best kernel found where there is one, else our "
             "baseline.", "",
             "| kernel | dtype | ours | loops | " + " | ".join(f"vs {p}" for p in peers)
             + " | copy bw (largest shape) |",
             "|---|---|---|---|" + "---|" * len(peers) + "---|"]
    for r in results:
        s = r["summary"]
        bw = "-" if s["copy_bw_fraction_largest"] is None else f"{s['copy_bw_fraction_largest']:.0%} {s['largest_shape']}"
        lines.append(f"| {r['kernel']} | {r['dtype']} | {s['ours']} | {r.get('loops') or 1} | "
                     + " | ".join(_ratio(s, p) for p in peers) + f" | {bw} |")
    for r in results:
        lines += ["", f"## {r['kernel']} ({r['dtype']}, {r['shape_set']} shapes)", "",
                  f"median kernel time over {r.get('loops') or 1} loop(s), us (fraction of copy bandwidth)", ""]
        if r.get("best"):
            lines += [f"best: {r['best'].get('variant_id', '')} from {r['best'].get('source', '')}", ""]
        lines += shape_table(r)
        if r["peer_errors"]:
            lines += ["", "Not timed: " + "; ".join(f"{k}: {v}" for k, v in sorted(r["peer_errors"].items()))]
    return "\n".join(lines) + "\n"


def plot_kernel(result: dict[str, Any], path: Path, gpu: str = "") -> Path:
    """Time per shape for each implementation, log scale; writes a PNG.

    Raises:
        ImportError: matplotlib is not installed (``pip install .[plots]``).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display on the GPU machine
    import matplotlib.pyplot as plt

    labels = [row["label"] for row in result["rows"]]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2), 4.5))
    markers = "osD^v<>ph*"
    for i, name in enumerate(implementations([result])):
        points = [(x, row["impl"][name]["median_us"]) for x, row in enumerate(result["rows"]) if name in row["impl"]]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=markers[i % len(markers)], linewidth=2.5 if name in OURS else 1.2, label=name)
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_xlabel(f"shape ({', '.join(result['rows'][0]['shape']) if result['rows'] else ''})")
    ax.set_ylabel("time per call (us, log scale)")
    where = f" on {gpu}" if gpu else ""
    ax.set_title(f"{result['kernel']} ({result['dtype']}){where}\n{PLOT_TITLE}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bench_kernel(evaluator: Any, name: str, dtype: str, shape_set: str, best_dir: Path | None,
                 repetitions: int, graph_ours: bool = False, repeats: int = 3) -> dict[str, Any]:
    """Times one kernel and dtype on the GPU (``evaluator``: a GpuEvaluator) in ``repeats``
    loops, each in a fresh sandbox process; ``graph_ours`` also times our kernels through CUDA
    graphs (``baseline@graph``, ``best@graph``).

    A loop that fails as a whole is recorded (``loop (run i)`` among the errors) and the others
    are kept; only when none ran does the kernel fail (:class:`EvaluatorError`).
    """
    spec = load_kernel(name)
    ours: dict[str, tuple[str, dict[str, int]]] = {"baseline": (spec.baseline_source(), {})}
    found, best = find_best(best_dir, spec.name), None
    if found is not None and found[1].get("dtype") == dtype:
        # Only in the dtype it was validated in (the loop verifies every timed output against
        # our baseline, but the held-out and sanitizer verdicts are per dtype).
        source, evidence = found
        ours["best"] = (source.read_text(), dict(evidence.get("params") or {}))
        best = {"variant_id": evidence.get("variant", {}).get("id", ""), "source": str(source),
                "params": evidence.get("params") or {}, "heldout_status": evidence.get("heldout_status")}
    replies: list[dict[str, Any]] = []
    for _ in range(repeats):
        try:
            # fresh_process: no loop of this kernel shares a CUDA context, allocations or
            # compilations with another, so the loops are independent repetitions.
            replies.append(evaluator.time_peers_full(kernel_ref(name), dtype, shape_set, ours,
                                                     repetitions=repetitions, graph_ours=graph_ours,
                                                     fresh_process=True))
        except EvaluatorError as exc:
            replies.append({"loop_error": " ".join(str(exc).split())[:500]})
    return kernel_result(spec, dtype, shape_set, combine_loops(replies), best)


def default_out(stem: str, now: dt.datetime | None = None) -> Path:
    """OUT for a run given no ``--out``: ``runs/bench-<UTC time>/<stem>``, a folder no earlier
    run wrote (the committed results under ``experiments/results/`` are never a default)."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"bench-{stamp}" / stem


def gpu_missing(program: str) -> str | None:
    """The one-line reason a GPU-only script cannot run here, or None when a CUDA GPU is visible.

    Checked before any compile or evaluator start, so a machine without a GPU gets one line
    instead of a traceback from deep inside the evaluator.
    """
    import torch

    if torch.cuda.is_available():
        return None
    return f"no CUDA GPU visible; {program} times kernels on a GPU: run it on a GPU machine"


def exit_without_gpu(program: str) -> int | None:
    """Prints ``error: ...`` to stderr and returns exit code 2 when no CUDA GPU is visible."""
    reason = gpu_missing(program)
    if reason is None:
        return None
    print(f"error: {reason}", file=sys.stderr)
    return 2


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier results with the newly timed (kernel, dtype) entries replaced or added."""
    fresh = {(r["kernel"], r["dtype"]) for r in new}
    kept = [r for r in old if (r["kernel"], r["dtype"]) not in fresh]
    return sorted(kept + new, key=lambda r: (r["kernel"], r["dtype"]))


def write_outputs(out: Path, meta: dict[str, Any], results: list[dict[str, Any]], plots: bool = True) -> list[Path]:
    """Writes OUT.json, OUT.md and (if matplotlib is there) a PNG per kernel; returns the files."""
    out.parent.mkdir(parents=True, exist_ok=True)
    written = [out.with_suffix(".json"), out.with_suffix(".md")]
    written[0].write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    written[1].write_text(to_markdown(meta, results))
    if plots:
        try:
            for r in results:
                written.append(plot_kernel(r, out.parent / f"{out.name}-{r['kernel']}-{r['dtype']}.png", meta["gpu"]))
        except ImportError:
            print("matplotlib is not installed: no plots (pip install .[plots])", file=sys.stderr)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernel", action="append", help="kernels (default: the whole library)")
    p.add_argument("--dtype", action="append", help="dtypes (default: float16)")
    p.add_argument("--shapes", default="search", choices=("search", "heldout"))
    p.add_argument("--best", type=Path, help="sweep or run directory whose best/ kernels to time too")
    p.add_argument("--repetitions", type=int, default=100, help="timed repetitions per shape within one loop")
    p.add_argument("--repeats", type=int, default=3,
                   help="independent loops per kernel and dtype, each in a fresh sandbox process; every ratio is "
                        "the median over them with its min-max (at least 3 for a headline)")
    p.add_argument("--out", type=Path, default=None,
                   help="writes OUT.json, OUT.md and OUT-<kernel>-<dtype>.png (default: a new folder, "
                        "runs/bench-<UTC time>/library; name experiments/results/... to replace kept results)")
    p.add_argument("--merge", action="store_true", help="keep earlier OUT.json entries of other kernels")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--graph-ours", action="store_true",
                   help="also time our kernels through CUDA graphs, as the peers are (<name>@graph)")
    args = p.parse_args(argv)
    if args.best is not None and not args.best.is_dir():
        p.error(f"--best {args.best} is not a directory")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if (code := exit_without_gpu("experiments.bench_library")) is not None:
        return code
    if args.out is None:
        args.out = default_out("library")
    from evaluators.gpu import GpuEvaluator

    out_json = args.out.with_suffix(".json")
    old = json.loads(out_json.read_text())["results"] if args.merge and out_json.is_file() else []
    failed: dict[str, str] = {}
    meta: dict[str, Any] = {"command": "python -m experiments.bench_library " + " ".join(argv if argv is not None else sys.argv[1:]),
            "git_commit": git_commit(REPO_ROOT), "gpu": "", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "best_dir": str(args.best or ""), "repeats": args.repeats,
            "timing": TIMING.replace("the repetitions", f"{args.repetitions} repetitions").replace(
                "fresh sandbox processes", f"{args.repeats} fresh sandbox processes")
            + (GRAPH_NOTE if args.graph_ours else ""),
            "failed": failed}
    evaluator = GpuEvaluator(step_timeout_s=60.0)
    results: list[dict[str, Any]] = []
    try:
        meta["gpu"] = evaluator.info()["gpu"]
        for name in args.kernel or list_kernels():
            for dtype in args.dtype or ["float16"]:
                print(f"{name} {dtype} ...", flush=True)
                try:
                    results.append(bench_kernel(evaluator, name, dtype, args.shapes, args.best, args.repetitions,
                                                graph_ours=args.graph_ours, repeats=args.repeats))
                except EvaluatorError as exc:  # one kernel's failure must not lose the others' numbers
                    failed[f"{name} {dtype}"] = " ".join(str(exc).split())[:500]
                # Written after every kernel: a run cut short keeps what it timed.
                write_outputs(args.out, meta, merge(old, results), plots=False)
    finally:
        evaluator.close()
    results = merge(old, results)
    for path in write_outputs(args.out, meta, results, plots=not args.no_plots):
        print(f"wrote {path}")
    print(to_markdown(meta, results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
