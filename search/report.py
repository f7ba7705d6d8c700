"""The run's report: summary.json, the printed table, and parquet tables.

``python -m search.report RUN_DIR`` rewrites the tables from the records (also for a run
that is still going or was killed) and prints the summary if the run finished.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import polars as pl

from kernels.records import EvalRecord, Stage, atomic_write, read_evaluations
from kernels.spec import shape_label
from kernels.verdict import geomean
from search import spread
from search.outcome import proposal_outcome
from search.progress import busy_label
from search.run_report import SPEEDUPS, kernel_heading, lineage_line, print_synthetic_summary

STANDIN_WARNING = ("STAND-IN EVALUATOR: synthetic times from a CPU test double, not measurements "
                   "(its verdicts come from running each variant on the CPU emulator at small shapes)")


def git_commit(repo: Path) -> str:
    """The commit under test; KERNEL_SEARCH_COMMIT wins (the GPU machine gets no .git)."""
    if os.environ.get("KERNEL_SEARCH_COMMIT"):
        return os.environ["KERNEL_SEARCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


OURS = spread.OURS  # our winner's name in the end-of-run loop; every ratio is taken against it
TIMES = ("kernel times; evaluator: CUDA events around one launch of ours, L2 flushed before every repetition "
         "(the per-shape table, held-out, noise floor); loop: our winner and baseline (CUDA events around one "
         "launch) and the peers (one CUDA-graph replay each) interleaved on one working set, L2 flushed, repeated "
         "in fresh sandbox processes (every 'vs' ratio)")


def _peer_speedups(shapes: list[dict[str, Any]], peers: dict[str, dict[str, float]],
                   failures: dict[str, str]) -> dict[str, float]:
    """Per peer, the geometric mean of peer time / our time over the shapes both have.

    Our time is the winner's time from the same interleaved loop as the peers (``best``)
    when the evaluator gave one, else the final evaluation's. No ratio is computed for an
    implementation that failed verification in the loop, and none at all when ours did:
    a time whose output was wrong is not a time to compare.
    """
    if OURS in failures:
        return {}
    out = {}
    ours = peers.get(OURS, {})
    for peer, times in peers.items():
        if peer == OURS or peer in failures:
            continue
        ratios = [times[s["label"]] / ours.get(s["label"], s["best_ms"]) for s in shapes
                  if s["label"] in times and times[s["label"]] > 0]
        if ratios:
            out[peer] = geomean(ratios)
    return out


def kernel_summary(result: Any, records: list[EvalRecord]) -> dict[str, Any]:
    """One kernel's entry of summary.json (``result`` is a :class:`search.finalize.KernelResult`)."""
    st, final, heldout = result.state, result.final, result.heldout
    # Our implementations whose output failed verification in the peers' loop (name -> reason).
    failures = dict(result.peer_failures)
    shapes = [
        {"shape": s.shape, "label": shape_label(s.shape), "baseline_ms": s.baseline_ms, "best_ms": s.candidate_ms,
         "speedup": s.speedup, "copy_bw_fraction": s.copy_bw_fraction,
         # every implementation timed and verified in the end-of-run interleaved loop (best, baseline, peers)
         "loop_ms": {impl: t[shape_label(s.shape)] for impl, t in result.peers.items()
                     if shape_label(s.shape) in t and impl not in failures}}
        for s in final.shapes
    ]
    mine = [r for r in records if r.kernel == st.name]
    # Every headline ratio, "vs baseline" included, from the repeated end-of-run loop: the
    # median over the loops with its min-max (search.spread).
    runs = list(getattr(result, "peer_runs", []))
    ratios = {} if OURS in failures else spread.spreads(runs, exclude=list(failures),
                                                          labels=[s["label"] for s in shapes])
    vs_baseline = ratios.get("baseline")
    extra = dict(getattr(result, "peer_extra", {}))
    for s in shapes:
        loop = s["loop_ms"]
        s["loop_speedup"] = loop["baseline"] / loop[OURS] if loop.get("baseline") and loop.get(OURS) else None
        # this shape's ratios over the loops (median [min-max]), as the headline's over all shapes
        s["loop_spreads"] = ({} if OURS in failures else
                             {p: v.to_dict() for p, v in spread.spreads(runs, exclude=list(failures),
                                                                          labels=[s["label"]]).items()})
        s["compiled"] = [c[s["label"]] for c in extra.get("compiled", []) if s["label"] in c]
    fractions = [s["copy_bw_fraction"] for s in shapes if s["copy_bw_fraction"] > 0]
    return {
        "kernel": st.name,
        # where the kernel's folder was and which files it held: reports and tools load the
        # spec through this (kernels.spec.load_kernel(KernelRef.from_dict(...))), not by name
        "kernel_ref": st.ref.to_dict(),
        "dtype": st.dtype,
        "winner": result.winner.variant.id,
        "params": result.winner.params,
        # the variants dispatched by shape beside the winner (search.dispatch); ``best`` in
        # every loop and per-shape time is the member that runs on that shape
        "dispatch": (result.dispatch.to_dict() if getattr(result, "dispatch", None) is not None
                     and len(result.dispatch.members) > 1 else None),
        "final_status": final.status.value,
        # from the end-of-run loops when they ran (the evaluator's own figure stays beside it)
        "speedup_search": vs_baseline.median if vs_baseline is not None else final.speedup,
        "speedup_search_source": "loop" if vs_baseline is not None else "evaluator",
        "speedup_search_evaluator": final.speedup,
        "speedup_search_screened": result.winner.score,
        "speedup_heldout": heldout.speedup,
        "heldout_status": heldout.status.value,
        "noise_floor": final.noise_floor,
        "shapes": shapes,
        "speedup_over_peers": ({k: v.median for k, v in ratios.items()} if runs
                               else _peer_speedups(shapes, result.peers, failures)),
        "spreads": {k: v.to_dict() for k, v in ratios.items()},
        "peer_runs": len(runs),
        "peer_notes": dict(extra.get("notes", {})),
        "l2_persistence": list(extra.get("l2_persistence", [])),
        "l2_findings": list(extra.get("l2_findings", [])),
        # per loop: seconds setting up (peers, compilations) and timing; compiled ahead, the
        # compilations it loaded (hit) and made itself (miss, bypass)
        "loop_phase_s": list(extra.get("phase_s", [])),
        # per loop and peer: set-up seconds over every shape and on the first shape alone
        "loop_prepare_s_by_peer": list(extra.get("prepare_s_by_peer", [])),
        "compile_cache": list(extra.get("compile_cache", [])),
        # per loop: the library modules (FlashInfer's JIT) its peers built or rebuilt, the build
        # files they rewrote and the settings those depend on
        "loop_jit_builds": list(extra.get("jit_builds", [])),
        "peer_errors": dict(result.peer_errors),
        "peer_failures": failures,
        # per loop, where its peer figures came from: None when it timed them itself, else the
        # cached entry's date and run (search.peer_cache)
        "peer_cache": list(extra.get("cached_peers", [])),
        "heldout_loops": heldout_loops(result),
        "copy_bw_fraction": geomean(fractions) if fractions else None,
        "variants_evaluated": len({r.variant.id for r in mine}),
        "trials_evaluated": sum(1 for r in mine if r.stage is Stage.SCREEN),
        "evaluations": len(mine),
        "rejected_on_heldout": result.rejected,
        "rejected_why": dict(result.rejected_why),
        "sanitizer": getattr(result, "sanitizer", {}).get("summary", ""),
        "sanitizer_status": getattr(result, "sanitizer", {}).get("status", "SKIPPED"),
        "lineage": st.lineage(result.winner.variant.id),
    }


def heldout_loops(result: Any) -> dict[str, Any] | None:
    """The end-of-run loops on the spec's fixed held-out shapes (our kernel, the baseline and
    the peers interleaved, as on the search shapes): per implementation the spread of its ratio
    over the loops, per shape the median times; None where no such loop ran."""
    runs = list(getattr(result, "heldout_peer_runs", []))
    extra = dict(getattr(result, "heldout_peer_extra", {}))
    if not runs and not extra:
        return None
    failures = dict(extra.get("failures", {}))
    labels = list(extra.get("shapes", []))
    ratios = {} if OURS in failures else spread.spreads(runs, exclude=list(failures), labels=labels or None)
    return {"shapes": labels, "loops": len(runs), "spreads": {k: v.to_dict() for k, v in ratios.items()},
            "loop_ms": dict(getattr(result, "heldout_peers", {})), "peer_errors": dict(extra.get("errors", {})),
            "failures": failures, "peer_cache": list(extra.get("cached_peers", [])),
            "loop_phase_s": list(extra.get("phase_s", [])), "compile_cache": list(extra.get("compile_cache", []))}


def build_summary(run_dir: Path, results: Sequence[Any], meta: dict[str, Any]) -> dict[str, Any]:
    records = read_evaluations(run_dir / "evaluations.jsonl")
    summary = {
        **meta,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(Path(__file__).resolve().parent.parent),
        "kernels": [kernel_summary(r, records) for r in results],
    }
    for k in summary["kernels"]:
        k["proposals"] = proposal_outcome(run_dir, k["kernel"], records).to_dict()
    if meta.get("evaluator") == "standin":
        summary["warning"] = STANDIN_WARNING
    atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary


def _fmt(x: float | None, spec: str = ".3f", suffix: str = "x") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _vs_baseline(k: dict[str, Any]) -> str:
    """The headline speedup over our baseline, with its range and where it came from."""
    ranged = k.get("spreads", {}).get("baseline")
    if ranged:
        return f"{spread.text(ranged)} (loop)"
    return f"{_fmt(k['speedup_search'])} (evaluator, one run)"


def print_summary(summary: dict[str, Any], out: TextIO | None = None) -> None:
    if summary.get("evaluator") == "standin":
        print_synthetic_summary(summary, out or sys.stdout)
        return
    w = (out or sys.stdout).write
    if summary.get("warning"):
        w(f"!! {summary['warning']}\n")
    w(f"run {summary.get('run_id', '')} on {summary.get('gpu', '?')} ({summary.get('evaluator', '?')}), "
      f"wall {summary.get('wall_s', 0):.0f}s, {busy_label(summary.get('evaluator', ''))} "
      f"{summary.get('gpu_busy_fraction', 0):.0%}\n")
    w(f"times: {TIMES}\n")
    if summary.get("stage_s"):
        w("stages: " + ", ".join(f"{name} {sec:.0f} s" for name, sec in summary["stage_s"].items())
          + ("; end-of-run calls: " + ", ".join(f"{m} {sec:.0f} s" for m, sec in summary["end_calls_s"].items())
             if summary.get("end_calls_s") else "") + "\n")
    w(f"speedups: {SPEEDUPS}\n")
    for k in summary["kernels"]:
        loops = k.get("peer_runs", 0)
        w(kernel_heading(k))
        w(f"   evaluator (one run):\n   {'shape':<22}{'baseline ms':>14}{'best ms':>12}{'speedup':>10}{'copy bw':>9}\n")
        for s in k["shapes"]:
            w(f"   {s['label']:<22}{s['baseline_ms']:>14.4f}{s['best_ms']:>12.4f}{_fmt(s['speedup'], '.2f'):>10}"
              f"{s['copy_bw_fraction']:>9.0%}\n")
        w(f"   vs baseline (search shapes): {_vs_baseline(k)} | held-out {k['heldout_status']} "
          f"{_fmt(k['speedup_heldout'])} (evaluator) | noise floor {_fmt(k['noise_floor'], '.3f', '')}\n")
        if loops:
            w(f"   ratios: median over {loops} end-of-run loop(s) [min-max], faster/slower only when the whole "
              "range is above/below 1.0x\n")
        for peer, value in k["speedup_over_peers"].items():
            if peer == "baseline":
                continue  # printed above
            ranged = k.get("spreads", {}).get(peer)
            part = spread.over_shapes(sum(1 for s in k["shapes"] if peer in s.get("loop_ms", {})), len(k["shapes"]))
            w(f"   vs {peer}: {spread.text(ranged) if ranged else f'{value:.3f}x (one run, no spread)'}{part}\n")
        held = k.get("heldout_loops")
        if held and held.get("spreads"):
            parts = [f"vs {p} {spread.text(v)}" for p, v in sorted(held["spreads"].items())]
            w(f"   held-out shapes (loop, the spec's {len(held['shapes'])} fixed ones): {' | '.join(parts)}\n")
        loops = len(k.get("peer_cache", []))
        beside = [c for c in k.get("peer_cache", []) if c and c.get("run_id") == summary.get("run_id")]
        cached = [c for c in k.get("peer_cache", []) if c and c.get("run_id") != summary.get("run_id")]
        if beside:
            w(f"   peers' figures timed beside the search in {len(beside)} of {loops} loops (rounds of their own, "
              f"each a fresh process, anchored on the baseline; our kernels and the baseline timed after it)\n")
        if cached:
            dates = sorted({str(c.get("measured_at")) for c in cached})
            w(f"   peers' figures from the peer cache in {len(cached)} of {loops} loops "
              f"(measured {', '.join(dates)}; our kernels and the baseline timed in this run)\n")
        for finding in k.get("l2_findings", []):
            w(f"   !! {finding}\n")
        for peer, why in k.get("peer_errors", {}).items():
            w(f"   {peer} not timed: {why[:200]}\n")
        for impl, why in k.get("peer_failures", {}).items():
            w(f"   {impl} failed verification in the peers' loop (no ratio taken): {why[:200]}\n")
        if k["rejected_on_heldout"]:
            w(f"   failed held-out (not reported): {', '.join(k['rejected_on_heldout'])}\n")
        w(f"   evaluated {k['variants_evaluated']} variants, {k['trials_evaluated']} screening trials\n")
        w(lineage_line(k))


def _flat_record(r: EvalRecord) -> dict[str, Any]:
    ev, var = r.evaluation, r.variant
    return {
        "run_id": r.run_id, "kernel": r.kernel, "dtype": r.dtype, "round": r.round,
        "agent": r.agent, "stage": r.stage.value, "trial": r.trial,
        "variant_id": var.id, "parent": var.parent, "author": var.author,
        "note": var.note, "params": json.dumps(r.params, sort_keys=True),
        "shape_set": r.shape_set.value, "status": ev.status.value, "speedup": ev.speedup,
        "message": ev.message[:500], "registers": ev.registers,
        "compile_key": r.compile_key, "busy_s": r.busy_s, "time": r.time,
    }


def write_tables(run_dir: Path) -> tuple[Path, Path]:
    """evaluations.parquet from the records and best.parquet from ``best/*.json``."""
    run_dir = Path(run_dir)
    rows = [_flat_record(r) for r in read_evaluations(run_dir / "evaluations.jsonl")]
    evals = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    evals.write_parquet(run_dir / "evaluations.parquet")
    best_rows = []
    for path in sorted((run_dir / "best").glob("*.json")):
        b = json.loads(path.read_text())
        best_rows.append({
            "kernel": b["kernel"], "dtype": b["dtype"], "variant_id": b["variant"]["id"],
            "params": json.dumps(b["params"], sort_keys=True), "heldout_status": b["heldout_status"],
            "speedup_search": b["final"].get("speedup"), "speedup_heldout": b["heldout"].get("speedup"),
            "lineage_depth": len(b["lineage"]),
        })
    best = pl.DataFrame(best_rows, infer_schema_length=None) if best_rows else pl.DataFrame()
    best.write_parquet(run_dir / "best.parquet")
    return run_dir / "evaluations.parquet", run_dir / "best.parquet"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m search.report", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    if not (args.run_dir / "evaluations.jsonl").is_file():
        print(f"error: {args.run_dir} holds no evaluations.jsonl", file=sys.stderr)
        return 2
    evals, best = write_tables(args.run_dir)
    print(f"wrote {evals} and {best}")
    summary_path = args.run_dir / "summary.json"
    if summary_path.is_file():
        print_summary(json.loads(summary_path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
