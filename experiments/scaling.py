"""Evaluation throughput of the same search on one GPU and on several, from the runs' records.

    python -m experiments.scaling runs/<1-gpu run> runs/<2-gpu run> --out experiments/results/scaling-h200x2

A variant-trial is one screening or full evaluation of a variant at one parameter point (the
search's work unit). The rate is variant-trials per minute of the search phase: from the
first evaluation's start to the last screening or full evaluation, the span in which there is
search work to do (Ray start-up and the end-of-run re-timing are the same on any number of
GPUs and are reported beside it, with the whole-run rate). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from experiments.search_results import SEARCH_STAGES, busy_breakdown
from kernels.records import read_evaluations

SCALING_TARGET = 1.8  # two GPUs against one


def run_rates(run_dir: Path) -> dict[str, Any]:
    """Trials, phases and rates of one run directory (summary.json and evaluations.jsonl)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_evaluations(run_dir / "evaluations.jsonl")
    trials = [r for r in records if r.stage in SEARCH_STAGES]
    n_gpus = int(summary.get("n_gpus", 1))
    phase = busy_breakdown(records, n_gpus)
    # Once every evaluator has finished its first evaluation (which can hold its start-up):
    # a diagnostic beside the target's measure, not a replacement for it. Records do not name
    # their evaluator, so the first evaluations are taken to be the n longest of the first 4n.
    trials.sort(key=lambda r: r.time)
    firsts = sorted(trials[: 4 * n_gpus], key=lambda r: r.busy_s)[-n_gpus:]
    warm_from = max(r.time for r in firsts)
    warm = [r for r in trials if r.time > warm_from]
    warm_s = max(r.time for r in trials) - warm_from
    return {
        "run_id": summary.get("run_id"), "command": summary.get("command"), "git_commit": summary.get("git_commit"),
        "gpu": summary.get("gpu"), "date": summary.get("date"), "n_gpus": n_gpus, "variant_trials": len(trials),
        "search_phase_s": phase["search_phase_s"], "search_phase_busy_fraction": phase["search_phase_busy_fraction"],
        "trials_per_min": len(trials) / (phase["search_phase_s"] / 60.0),
        "first_evaluation_busy_s": [round(r.busy_s, 2) for r in firsts],
        "after_first_trials_per_min": len(warm) / (warm_s / 60.0) if warm_s > 0 else None,
        "wall_s": summary["wall_s"], "whole_run_trials_per_min": len(trials) / (summary["wall_s"] / 60.0),
        "gpu_busy_fraction": summary.get("gpu_busy_fraction"),
        "best": {k["kernel"]: k["speedup_search"] for k in summary["kernels"]},
    }


def to_markdown(runs: list[dict[str, Any]], ratio: float, whole_ratio: float) -> str:
    base = runs[0]
    lines = [f"# Search throughput: {base['n_gpus']} GPU against {runs[1]['n_gpus']} on {base['gpu']}", "",
             f"- date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}",
             "- variant-trial: one screening or full evaluation of a variant at one parameter point",
             "- rate: variant-trials per minute of the search phase (first evaluation to the last screening or full "
             "evaluation); whole-run rate beside it; and, as a diagnostic only, the rate after every evaluator's "
             "first evaluation (which may hold the evaluator's start-up)", "",
             "| GPUs | run | command | git commit | variant-trials | search phase s | trials/min | busy (search phase) | "
             "wall s | trials/min (whole run) | busy (whole run) | first evaluation s | trials/min after it |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['n_gpus']} | {r['run_id']} | `{r['command']}` | {r['git_commit']} | {r['variant_trials']} | "
                     f"{r['search_phase_s']:.0f} | {r['trials_per_min']:.1f} | {r['search_phase_busy_fraction']:.0%} | "
                     f"{r['wall_s']:.0f} | {r['whole_run_trials_per_min']:.1f} | {r['gpu_busy_fraction']:.0%} | "
                     f"{', '.join(str(x) for x in r['first_evaluation_busy_s'])} | "
                     f"{'-' if r['after_first_trials_per_min'] is None else format(r['after_first_trials_per_min'], '.1f')} |")
    met = "met" if ratio >= SCALING_TARGET else "NOT met"
    warm = [r["after_first_trials_per_min"] for r in runs]
    after = f"{warm[1] / warm[0]:.2f}x" if all(warm) else "-"
    lines += ["", f"Search-phase rate, {runs[1]['n_gpus']} GPUs over 1: **{ratio:.2f}x** (target {SCALING_TARGET}x: {met}); "
              f"whole-run rate: {whole_ratio:.2f}x; after every evaluator's first evaluation (diagnostic): {after}.", "",
              "Best speedup over the baseline per kernel (search shapes), to show both runs did the same search:", "",
              "| kernel | " + " | ".join(f"{r['n_gpus']} GPU" for r in runs) + " |", "|---|" + "---|" * len(runs)]
    for kernel in base["best"]:
        lines.append(f"| {kernel} | " + " | ".join(f"{r['best'].get(kernel, float('nan')):.3f}x" for r in runs) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("one_gpu", type=Path, help="run directory of the one-GPU run")
    p.add_argument("more_gpus", type=Path, help="run directory of the same run on more GPUs")
    p.add_argument("--out", type=Path, default=Path("experiments/results/scaling-h200x2"))
    args = p.parse_args(argv)
    runs = [run_rates(args.one_gpu), run_rates(args.more_gpus)]
    ratio = runs[1]["trials_per_min"] / runs[0]["trials_per_min"]
    whole = runs[1]["whole_run_trials_per_min"] / runs[0]["whole_run_trials_per_min"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"runs": runs, "ratio_search_phase": ratio, "ratio_whole_run": whole, "target": SCALING_TARGET}, indent=1))
    text = to_markdown(runs, ratio, whole)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
