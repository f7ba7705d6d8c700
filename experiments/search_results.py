"""Turns a search run's summary.json into a results file with the targets checked.

    python -m experiments.search_results runs/<id> --out experiments/results/search-h200

Writes OUT.json (the run's summary plus the target checks) and OUT.md (a readable table).
All times in the summary are kernel times: CUDA events around one launch (ours) or one
CUDA-graph replay (peers), L2 flushed before each repetition, implementations interleaved.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from experiments.sweep_results import ASTRA_FLASHINFER_TARGET, compiled_won
from kernels.records import EvalRecord, Stage, read_evaluations
from kernels.verdict import geomean
from search import spread
from search.dispatch import describe
from search.progress import busy_label

SEARCH_STAGES = (Stage.SCREEN, Stage.FULL)  # the search's own work, before the end of the run

# The Astra paper's multi-agent speedups over its baselines (REFERENCE.md section 2).
ASTRA_TARGETS = {"silu_and_mul": 1.46, "fused_add_rmsnorm": 1.25, "merge_attn_states_lse": 1.26}
PEER_TARGETS = {"flashinfer": 0.95, "torch_compile": 1.0}
BUSY_TARGET = 0.70


def _busy(summary: dict[str, Any]) -> str:
    """What the run's busy fraction measured: the GPUs, or only the (stand-in) evaluator actors."""
    return busy_label(summary.get("evaluator", "gpu")).replace("gpu", "GPU")


def _ratio(k: dict[str, Any], peer: str, value: float | None) -> str:
    """A ratio with its spread over the repeated end-of-run loops, else the single figure
    with where it came from (older summaries, or a run whose loops did not run)."""
    ranged = k.get("spreads", {}).get(peer)
    if ranged:
        return spread.text(ranged)
    if value is None:
        return "-"
    source = "evaluator" if peer == "baseline" and k.get("speedup_search_source", "evaluator") == "evaluator" else "loop"
    return f"{value:.3f}x (one {source} run, no spread)"


def flashinfer_at_best(k: dict[str, Any]) -> tuple[str, spread.Spread | None]:
    """The kernel's ratio over FlashInfer's fastest API for its op (``merge_state`` or
    ``merge_state_in_place``; the one we lead by the least), with its spread over the loops,
    else the one figure there is; ``("flashinfer", None)`` when FlashInfer was not timed."""
    return spread.least_lead(k["speedup_over_peers"], k.get("spreads", {}), "flashinfer")


def _loops(summary: dict[str, Any]) -> str:
    """How many end-of-run loops the ratios are medians of (``3``, or ``2-3`` when kernels differ)."""
    counts = sorted({int(k.get("peer_runs", 0)) for k in summary["kernels"]}) or [0]
    return str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"


def busy_breakdown(evaluations: list[EvalRecord], n_gpus: int) -> dict[str, float]:
    """Evaluator-busy fraction of the search phase (first evaluation to the last screening or
    full evaluation), from the run's records; the whole-run figure in summary.json also
    counts Ray start-up and the end-of-run peer timing, during which no search work exists.

    'Busy' is the time an evaluator actor spent inside evaluate() (compile cache lookup,
    input generation, validation and timing), summed over actors; the whole-run figure adds
    the end-of-run peer timing.
    """
    if not evaluations:
        return {}
    evaluations = sorted(evaluations, key=lambda r: r.time)
    start = evaluations[0].time - evaluations[0].busy_s
    search = [r for r in evaluations if r.stage in SEARCH_STAGES]
    end = max(r.time for r in search)
    busy = sum(r.busy_s for r in search)
    return {"search_phase_s": end - start, "search_phase_busy_s": busy,
            "search_phase_busy_fraction": busy / ((end - start) * n_gpus)}


def check_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: what was required, what was measured (with its range over the
    repeated end-of-run loops where there is one) and the verdict (:func:`search.spread.against`):
    ``met`` only when the whole range is at or above the target, ``not met`` when the whole
    range is below it, ``within range`` when it straddles it. ``met`` (a bool) is True only
    for ``met``."""
    rows = []
    for k in summary["kernels"]:
        name, ranges = k["kernel"], k.get("spreads", {})
        if name in ASTRA_TARGETS:
            rows.append({"kernel": name, "target": "speedup over our baseline (search shapes)",
                         "required": ASTRA_TARGETS[name], "measured": k["speedup_search"],
                         "range": ranges.get("baseline")})
        for peer, need in PEER_TARGETS.items():
            # FlashInfer at its best: its fastest API for the op where it has several.
            api = flashinfer_at_best(k)[0] if peer == "flashinfer" else peer
            rows.append({"kernel": name, "target": f"speedup over {api} (same loop)", "required": need,
                         "measured": k["speedup_over_peers"].get(api), "range": ranges.get(api)})
        rows.append({"kernel": name, "target": "held-out shapes pass", "required": "OK",
                     "measured": k["heldout_status"]})
    astra = [b for k in summary["kernels"] if k["kernel"] in ASTRA_TARGETS and (b := flashinfer_at_best(k)[1])]
    if astra and len(astra) == len(ASTRA_TARGETS):
        together = spread.aggregate(astra, geomean)
        assert together is not None
        rows.append({"kernel": "*", "target": "geomean over FlashInfer's fastest API, the three Astra kernels",
                     "required": ASTRA_FLASHINFER_TARGET, "measured": together.median,
                     "range": together.to_dict() if together.runs > 1 else None})
    rows.append({"kernel": "*", "target": f"{_busy(summary)} fraction (whole run)", "required": BUSY_TARGET,
                 "measured": summary.get("gpu_busy_fraction")})
    if "search_phase_busy_fraction" in summary:
        rows.append({"kernel": "*", "target": "evaluator busy fraction (search phase)", "required": BUSY_TARGET,
                     "measured": summary["search_phase_busy_fraction"]})
    for r in rows:
        req, got = r["required"], r["measured"]
        if isinstance(req, str):
            r["verdict"] = spread.MET if got == req else spread.NOT_MET
        else:
            r["verdict"] = spread.against(req, r.get("range") or got)
        r["met"] = r["verdict"] == spread.MET
    return rows


def _loop_us(shape: dict[str, Any], impl: str) -> str:
    """An implementation's time on a shape in the end-of-run interleaved loop, if recorded."""
    loop = shape.get("loop_ms", {})
    return f"{loop[impl] * 1e3:.2f}" if impl in loop else "-"


def largest(kernel: dict[str, Any]) -> dict[str, Any]:
    """The kernel's shape with the most elements (where bandwidth matters most)."""
    return max(kernel["shapes"], key=lambda s: math.prod(s["shape"].values()))


def _shape_ratio(shape: dict[str, Any], peer: str) -> str:
    """One shape's ratio of ``peer`` time to ours over the loops, with its range."""
    return spread.text(shape.get("loop_spreads", {}).get(peer))


def _fastest_flashinfer(k: dict[str, Any]) -> str:
    """The summary table's FlashInfer cell: the ratio over its fastest API, named when it has several."""
    api, _ = flashinfer_at_best(k)
    several = sum(name.startswith("flashinfer") for name in k["speedup_over_peers"]) > 1
    return _ratio(k, api, k["speedup_over_peers"].get(api)) + (f" ({api})" if several else "")


def _stages(summary: dict[str, Any]) -> list[str]:
    if not summary.get("stage_s"):
        return []
    calls = summary.get("end_calls_s") or {}
    return ["- stages (s): " + ", ".join(f"{n} {v:.0f}" for n, v in summary["stage_s"].items())
            + ("; after the held-out checks, seconds with at least one call of each kind running: "
               + ", ".join(f"{n} {v:.0f}" for n, v in calls.items()) if calls else "")]


def heldout_table(summary: dict[str, Any]) -> list[str]:
    """The winners against the baseline and the peers on the search shapes and, beside them, on
    the spec's fixed held-out shapes (the same loops' protocol), with where the peers' figures
    came from: a dispatch table or tuning chosen on the search shapes cannot flatter the first
    without the second showing it."""
    rows = []
    for k in summary["kernels"]:
        held = k.get("heldout_loops") or {}
        if not held:
            continue
        fi, _ = flashinfer_at_best(k)
        cells = []
        for part in (k.get("spreads", {}), held.get("spreads", {})):
            cells += [spread.text(part.get(p)) for p in ("baseline", fi, "torch_compile")]
        cached = [c for c in k.get("peer_cache", []) + held.get("peer_cache", []) if c]
        dates = sorted({str(c.get("measured_at")) for c in cached})
        where = (f"cache, {len(cached)} of {len(k.get('peer_cache', [])) + len(held.get('peer_cache', []))} loops "
                 f"(measured {', '.join(dates)})" if cached else "timed in this run")
        rows.append(f"| {k['kernel']} | {' | '.join(cells)} | {len(held.get('shapes', []))} | {where} |")
    if not rows:
        return []
    return ["", "Search shapes against the spec's fixed held-out shapes (loop; ratios as above; FlashInfer: its "
                "API we lead by least on the search shapes):", "",
            "| kernel | search: vs baseline | search: vs FlashInfer | search: vs torch.compile | held-out: vs baseline "
            "| held-out: vs FlashInfer | held-out: vs torch.compile | held-out shapes | peers' figures |",
            "|---|---|---|---|---|---|---|---|---|", *rows]


def to_markdown(summary: dict[str, Any], targets: list[dict[str, Any]]) -> str:
    evaluations = sum(k["evaluations"] for k in summary["kernels"])
    per_min = evaluations / (summary["wall_s"] / 60.0)
    lines = [f"# Search run on {summary['gpu']}", "",
             f"- command: `{summary['command']}`", f"- git commit: {summary['git_commit']}",
             f"- date: {summary['date']}", f"- evaluator: {summary['evaluator']}, GPUs: {summary['n_gpus']}",
             f"- wall time: {summary['wall_s']:.0f} s; {_busy(summary)} fraction: {summary['gpu_busy_fraction']:.0%}; "
             f"evaluations: {evaluations} ({per_min:.1f} per minute)",
             *([f"- search phase: {summary['search_phase_s']:.0f} s with the evaluator busy "
                f"{summary['search_phase_busy_fraction']:.0%} of it (from evaluations.jsonl); busy = seconds the "
                "evaluator actors spent serving evaluations and peer timing, over wall time x GPUs; the whole-run "
                "figure also counts Ray start-up and the end of the run (held-out checks, sanitizer, fresh "
                "evaluators, final timing)"]
               if "search_phase_busy_fraction" in summary else []),
             *_stages(summary),
             "- times: kernel times. Evaluator: CUDA events around one launch of ours, 100 repetitions after 20 "
             "warm-ups in a fresh evaluator, L2 flushed before every repetition (the held-out verdict and the "
             "per-shape 'evaluator' columns). Loop: the end-of-run loop, where our winner and our baseline (CUDA "
             "events around one launch) and the peers (one CUDA-graph replay each) are interleaved on one working "
             f"set, L2 flushed before every repetition, repeated in {_loops(summary)} fresh sandbox processes (every "
             "ratio in the summary table, 'vs baseline' included)", ""]
    if summary.get("warning"):
        lines += [f"**{summary['warning']}**", ""]
    lines += [f"Ratios: other time / our time, geometric mean over the search shapes per loop; median over the "
              f"{_loops(summary)} end-of-run loops (each in a fresh sandbox process) [min-max]; faster only when the "
              "whole range is above 1.0x, slower only when it is below, a tie when it straddles 1.0x. 'vs baseline' "
              "comes from the same loops as the peers; 'held-out' is the evaluator's one run on the held-out shapes.",
              "",
              "| kernel | speedup vs baseline (search, loop) | held-out (evaluator) | vs FlashInfer, fastest API (loop) | "
              "vs torch.compile (loop) | copy-bw fraction, largest shape (evaluator) | variants | trials | "
              "noise floor (A/A, evaluator) |", "|---|---|---|---|---|---|---|---|---|"]
    for k in summary["kernels"]:
        p = k["speedup_over_peers"]
        f = lambda x: "-" if x is None else f"{x:.3f}x"  # noqa: E731
        lines.append(f"| {k['kernel']} | {_ratio(k, 'baseline', k['speedup_search'])} | {k['heldout_status']} "
                     f"{f(k['speedup_heldout'])} | "
                     f"{_fastest_flashinfer(k)} | "
                     f"{_ratio(k, 'torch_compile', p.get('torch_compile'))} | "
                     f"{largest(k)['copy_bw_fraction']:.0%} {largest(k)['label']} | {k['variants_evaluated']} | "
                     f"{k['trials_evaluated']} | "
                     f"{'-' if k['noise_floor'] is None else format(k['noise_floor'], '.3f')} |")
    lines += heldout_table(summary)
    for k in summary["kernels"]:
        # Two timings side by side, each labelled: the evaluator's (validated, one run) and the
        # end-of-run loops' (every ratio is taken within one loop, then the median over the loops).
        lines += ["", f"## {k['kernel']} ({k['dtype']}): winner {k['winner']} {k['params']}", ""]
        if describe(k.get("dispatch")):
            lines += [describe(k.get("dispatch")) + "; the 'best' columns are each shape's kernel", ""]
        fi, _ = flashinfer_at_best(k)
        lines += ["evaluator: the full protocol against our baseline (validated, one run); loop: median over the "
                  "end-of-run loops of each implementation's time, and per shape the ratio other / best over "
                  "those loops [min-max]", "",
                  "| shape | baseline us (evaluator) | best us (evaluator) | speedup (evaluator) | copy bw | "
                  f"best us (loop) | {fi} us (loop) | torch.compile us (loop) | vs baseline (loop) | "
                  f"vs {fi} (loop) | vs torch.compile (loop) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for s in k["shapes"]:
            lines.append(f"| {s['label']} | {s['baseline_ms'] * 1e3:.2f} | {s['best_ms'] * 1e3:.2f} | "
                         f"{s['speedup']:.3f}x | {s['copy_bw_fraction']:.0%} | {_loop_us(s, 'best')} | "
                         f"{_loop_us(s, fi)} | {_loop_us(s, 'torch_compile')} | "
                         f"{_shape_ratio(s, 'baseline')} | {_shape_ratio(s, fi)} | "
                         f"{_shape_ratio(s, 'torch_compile')} |")
        if won := compiled_won(k):
            lines += ["", "torch.compile: the fastest of its compilations per shape and loop; shapes won by mode: "
                      + ", ".join(f"{m} {n}" for m, n in sorted(won.items()))]
        if k.get("peer_notes"):
            lines += ["", "Timed: " + "; ".join(f"{p}: {n}" for p, n in sorted(k["peer_notes"].items()))]
        lines += ["", "lineage: " + " <- ".join(f"{x['id'][:8]} ({x['author']}: {x['note']})" for x in k["lineage"])]
    lines += ["", "## Targets", "",
              "A target is met only when the whole range over the loops is at or above it, not met when the whole "
              "range is below it, and 'within range' (not met) when the range straddles it.", "",
              "| kernel | target | required | measured | met |", "|---|---|---|---|---|"]
    for t in targets:
        m = t["measured"]
        shown = m if isinstance(m, str) or m is None else format(m, ".3f")
        if t.get("range"):
            shown = spread.text(t["range"])
        lines.append(f"| {t['kernel']} | {t['target']} | {t['required']} | {shown} | "
                     f"{spread.verdict_text(t.get('verdict', spread.MET if t['met'] else spread.NOT_MET))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", default="experiments/results/search-h200")
    p.add_argument("--summary-json", help="take the summary from this earlier results file")
    args = p.parse_args(argv)
    if (args.run_dir / "summary.json").exists():
        summary = json.loads((args.run_dir / "summary.json").read_text())
    elif args.summary_json:  # a results file written earlier from the same run
        summary = json.loads(Path(args.summary_json).read_text())["summary"]
    else:
        p.error(f"{args.run_dir} has no summary.json (pass --summary-json)")
    records = args.run_dir / "evaluations.jsonl"
    if records.exists():
        rows = read_evaluations(records)
        summary.update(busy_breakdown(rows, int(summary.get("n_gpus", 1))))
    targets = check_targets(summary)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "targets": targets}, indent=1, default=str))
    out.with_suffix(".md").write_text(to_markdown(summary, targets))
    print(to_markdown(summary, targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
