"""The run's written report: ``report.md`` (and a plot per kernel where matplotlib is
installed, the ``plots`` extra) in every run directory, the sources of every dispatch member
beside the winner's, and the printed summary of a stand-in run.

A kernel's result may be several variants dispatched by shape (:mod:`search.dispatch`):
``best/NAME.cu`` is the first of them, and :func:`write_member_sources` writes each other
member as ``best/NAME.member<i>.cu`` so that no member lives only inside a JSON file.

A stand-in run's times are synthetic: nothing was launched, no CUDA event timed anything
and no end-of-run loop ran, so :func:`print_synthetic_summary` says that and leaves out the
timing protocol's wording, the loops' ratio lines and the noise floor.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from kernels.records import atomic_write
from search.outcome import outcome_line

REPORT_FILE = "report.md"
SYNTHETIC_TIMES = ("synthetic: the stand-in evaluator (a CPU test double) ran no kernel; its times and "
                   "speedups are made up and only exercise the pipeline (agents, admission, records, report)")
SPEEDUPS = ("'best screened' on the progress line is the screening score (the search's own evaluation, one run, "
            "search shapes); the per-shape table is the winner's final evaluation (one run); 'vs baseline' is "
            "the median of the end-of-run loops when they ran, else that final evaluation")


def member_file(kernel: str, index: int) -> str:
    """Where dispatch member ``index`` of ``kernel`` is written, relative to the run directory
    (member 0 is the winner itself, ``best/NAME.cu``)."""
    return f"best/{kernel}.cu" if index == 0 else f"best/{kernel}.member{index}.cu"


def write_member_sources(run_dir: Path) -> list[Path]:
    """Writes every dispatch member's source beside the winner's, from ``best/NAME.json``;
    returns the files written."""
    written = []
    for path in sorted((Path(run_dir) / "best").glob("*.json")):
        evidence = json.loads(path.read_text())
        members = (evidence.get("dispatch") or {}).get("members") or []
        for i, member in enumerate(members[1:], start=1):
            target = Path(run_dir) / member_file(evidence["kernel"], i)
            atomic_write(target, member["variant"]["source"])
            written.append(target)
    return written


def kernel_heading(k: Mapping[str, Any]) -> str:
    """A kernel's block in the printed summary starts with this: its winner, the outcome when
    no proposal improved on the baseline, and its dispatch members."""
    text = f"\n== {k['kernel']} ({k['dtype']}): winner {k['winner']} {k['params'] or ''}\n"
    if outcome_line(k):
        text += f"   !! {outcome_line(k)}\n"
    return text + "".join(f"   {line}\n" for line in dispatch_lines(k))


def lineage_line(k: Mapping[str, Any]) -> str:
    """The winner's lineage, newest first, for the printed summary."""
    return "   lineage: " + " <- ".join(f"{x['id'][:8]} ({x['author']}: {x['note'] or x['transformation'] or '-'})"
                                       for x in k["lineage"]) + "\n"


def dispatch_lines(k: Mapping[str, Any]) -> list[str]:
    """A kernel's dispatch members, each with its source file and the search shapes it runs."""
    d = k.get("dispatch")
    if not d:
        return []
    table: dict[str, int] = d.get("table", {})
    lines = [f"dispatched by shape: {len(d['members'])} kernels, each run on the shapes where it was fastest "
             "(else the nearest search shape's)"]
    for i, m in enumerate(d["members"]):
        shapes = [label for label, member in table.items() if member == i]
        lines.append(f"  member {i}: {m['variant_id']} {m.get('params') or ''} in {member_file(k['kernel'], i)}, "
                     f"shapes {', '.join(shapes) or '-'}")
    return lines


def print_synthetic_summary(summary: Mapping[str, Any], out: TextIO) -> None:
    """The printed summary of a stand-in run: what ran and what was decided, times marked
    synthetic, nothing of the GPU timing protocol."""
    w = out.write
    w(f"!! {summary.get('warning') or 'STAND-IN EVALUATOR'}\n")
    w(f"run {summary.get('run_id', '')} (stand-in evaluator), wall {summary.get('wall_s', 0):.0f}s\n")
    w(f"times: {SYNTHETIC_TIMES}\n")
    for k in summary["kernels"]:
        w(kernel_heading(k))
        w(f"   {'shape':<22}{'baseline (synthetic)':>22}{'best (synthetic)':>18}\n")
        for s in k["shapes"]:
            w(f"   {s['label']:<22}{s['baseline_ms']:>22.4f}{s['best_ms']:>18.4f}\n")
        w(f"   final {k['final_status']} | held-out {k['heldout_status']} | sanitizer {k.get('sanitizer_status', '-')}\n")
        w(f"   evaluated {k['variants_evaluated']} variants, {k['trials_evaluated']} screening trials\n")
        w(lineage_line(k))


def plot_kernel(k: Mapping[str, Any], path: Path, synthetic: bool) -> Path:
    """Time per search shape of the baseline, the winner and the peers of the end-of-run
    loop, log scale; writes a PNG.

    Raises:
        ImportError: matplotlib is not installed (``pip install .[plots]``).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    labels = [s["label"] for s in k["shapes"]]
    series: dict[str, list[tuple[int, float]]] = {"baseline": [], "winner": []}
    for x, s in enumerate(k["shapes"]):
        series["baseline"].append((x, s["baseline_ms"]))
        series["winner"].append((x, s["best_ms"]))
        for impl, ms in (s.get("loop_ms") or {}).items():
            if impl not in ("best", "baseline") and ms:
                series.setdefault(impl, []).append((x, ms))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2), 4.5))
    for name, points in series.items():
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", linewidth=2.5 if name == "winner" else 1.2, label=name)
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel("time per call (ms, log scale)" + (" SYNTHETIC" if synthetic else ""))
    ax.set_title(f"{k['kernel']} ({k['dtype']})" + (": stand-in, synthetic times" if synthetic else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report_text(summary: Mapping[str, Any], printed: str, plots: Mapping[str, str]) -> str:
    """The Markdown of ``report.md``: the run's facts, how to read its figures, each kernel's
    files, and the printed summary."""
    synthetic = summary.get("evaluator") == "standin"
    lines = [f"# Run {summary.get('run_id', '')}", ""]
    if synthetic:
        lines += [f"**{summary.get('warning') or 'STAND-IN EVALUATOR'}**", ""]
    lines += [f"- command: `{summary.get('command', '')}`",
              f"- evaluator: {summary.get('evaluator', '?')} on {summary.get('gpu', '?')}, "
              f"{summary.get('n_gpus', '?')} actor(s); wall {summary.get('wall_s', 0):.0f} s",
              f"- date {summary.get('date', '')}, commit {summary.get('git_commit', '') or 'unknown'}",
              f"- speedups: {SYNTHETIC_TIMES if synthetic else SPEEDUPS}", ""]
    for k in summary.get("kernels", []):
        lines += [f"## {k['kernel']} ({k['dtype']})", ""]
        if outcome_line(k):
            lines += [f"**{outcome_line(k)}**", ""]
        lines += [f"- winner `{k['winner']}` {k['params'] or ''}: source `best/{k['kernel']}.cu`, evidence "
                  f"`best/{k['kernel']}.json`"]
        lines += [f"- {line.strip()}" for line in dispatch_lines(k)]
        if k["kernel"] in plots:
            lines += ["", f"![{k['kernel']}]({plots[k['kernel']]})"]
        lines.append("")
    lines += ["## Printed summary", "", "```", printed.rstrip("\n"), "```", ""]
    return "\n".join(lines)


def write_run_report(run_dir: Path, summary: Mapping[str, Any], printer: Any) -> Path:
    """Writes the dispatch members' sources, a plot per kernel (when matplotlib is there) and
    ``report.md``; ``printer(summary, out)`` is the printed summary put inside it."""
    run_dir = Path(run_dir)
    write_member_sources(run_dir)
    plots: dict[str, str] = {}
    synthetic = summary.get("evaluator") == "standin"
    try:
        for k in summary.get("kernels", []):
            name = f"report-{k['kernel']}.png"
            plot_kernel(k, run_dir / name, synthetic)
            plots[k["kernel"]] = name
    except ImportError:
        pass  # the plots extra is not installed: the report says nothing of plots
    printed = io.StringIO()
    printer(summary, printed)
    path = run_dir / REPORT_FILE
    atomic_write(path, report_text(summary, printed.getvalue(), plots))
    return path
