"""Turns a library sweep into a results file with issue targets checked, and a plot per kernel.

    python -m experiments.sweep_results runs/sweep-<id> --out experiments/results/sweep-h200
    python -m experiments.sweep_results runs/a/sweep-<id1> runs/b/sweep-<id2> --out ...  # one sweep in parts
    python -m experiments.sweep_results runs/c/sweep-<id3> --earlier OUT-partial.json --out ...  # parts already reported

A library too long to sweep in one sitting can be swept in parts (``search.sweep --kernel``
for each part, all of the same code on one kind of GPU) and reported as one: the parts' kernels
are pooled, their targets checked together, and the file names every part (commands, date).
The same code is one commit, or commits between which git finds only results and prose
changed (so that parts can be swept in sittings with results committed in between).

Reads the sweep's run summary (``summary.json``, written by the run's end: every winner
re-validated on the held-out shapes, then re-timed in a fresh evaluator in one interleaved
loop with our baseline and the production peers). Writes OUT.json, OUT.md and
OUT-<kernel>.png (time per shape for each implementation; needs matplotlib). Every time is a
kernel time: CUDA events around one launch (ours) or one CUDA-graph replay (peers), L2
flushed before every repetition.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from experiments.bench_library import kernel_result, plot_kernel, shape_table
from kernels.folders import KernelRef
from kernels.spec import KernelSpec, load_kernel
from kernels.verdict import geomean
from search import spread
from search.dispatch import describe
from search.progress import busy_label
from search.sweep import attempts_text

TC_MEDIAN_TARGET = 1.1
TC_GEOMEAN_TARGET = 1.15  # over the best torch.compile mode, with every kernel's whole range at or above 1.0
ASTRA = ("silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse")
ASTRA_FLASHINFER_TARGET = 1.1
# A library of kernels the agents have no recipe for (issue 16): level with torch.compile over the
# library, and no kernel whose whole range lies below 0.9x.
EXTERNAL_GEOMEAN_TARGET = 1.0
EXTERNAL_FLOOR = 0.9
ROOFLINE = 1.3  # as the evaluator's roofline guard: no kernel moves its bytes faster than 1.3x a copy
NOT_PEERS = ("best", "baseline", "torch_eager", "torch_compile")  # the rest are production peers


def find_summary(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run summary, sweep meta) from a sweep directory or a folder holding copies of both."""
    meta = json.loads((path / "sweep.json").read_text()) if (path / "sweep.json").is_file() else {}
    for folder in (path / meta.get("run_dir", "-"), path):
        if (folder / "summary.json").is_file():
            return json.loads((folder / "summary.json").read_text()), meta
    raise FileNotFoundError(f"{path}: no summary.json (neither in the sweep's run directory nor beside sweep.json)")


# What the parts of one sweep must share: the code, the machine and the protocol.
PART_KEYS = ("git_commit", "gpu", "evaluator", "n_gpus")


def _same(key: str, a: object, b: object) -> bool:
    """Whether two parts agree on ``key``: a commit given short in one part and in full in the
    other (KERNEL_SEARCH_COMMIT is whatever the caller set) is the same commit when one is a
    prefix of the other, at least 7 hex digits long."""
    if key == "git_commit" and isinstance(a, str) and isinstance(b, str) and min(len(a), len(b)) >= 7:
        return a.startswith(b) or b.startswith(a)
    return a == b


# Changes that cannot alter what a sweep ran: results and prose.
NOT_CODE_PREFIXES = ("experiments/results/", "docs/")
NOT_CODE_SUFFIXES = (".md",)
REPO = Path(__file__).resolve().parents[1]


def code_changes(a: str, b: str, repo: Path = REPO) -> list[str] | None:
    """The files that differ between commits ``a`` and ``b`` other than results and prose
    (:data:`NOT_CODE_PREFIXES`, :data:`NOT_CODE_SUFFIXES`); None when git cannot compare them
    (a commit it does not have, no repository)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "diff", "--name-only", a, b], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [f for f in out.stdout.split() if not f.startswith(NOT_CODE_PREFIXES) and not f.endswith(NOT_CODE_SUFFIXES)]


def merge_parts(parts: list[tuple[Path, dict[str, Any], dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One (summary, meta) from the sweeps of one library split by ``--kernel`` into parts, run
    one after the other (a sweep too long for one sitting): the parts must share the code, the
    GPU, the evaluator and its GPU count, and the library, and each kernel may be in one part
    only. The code is shared when the commits are one, or when git finds nothing between them
    but results and prose (:func:`code_changes`; ``meta["commits"]`` then lists every
    part's commit). Wall time is their sum, busy fraction their wall-weighted mean; every part's
    commands and date are kept (``parts``).

    Raises:
        ValueError: parts that differ in any of those, or that share a kernel.
    """
    if len(parts) == 1:
        return parts[0][1], parts[0][2]
    first_path, first, first_meta = parts[0]
    seen: dict[str, Path] = {}
    commits: list[str] = []
    for path, summary, meta in parts:
        differ = [k for k in PART_KEYS if not _same(k, summary.get(k), first.get(k))]
        if "git_commit" in differ and _same_code(str(summary.get("git_commit")), str(first.get("git_commit"))):
            differ.remove("git_commit")
        # an earlier report of parts at several commits of the same code names them all
        for commit in [str(summary.get("git_commit")), *meta.get("commits", [])]:
            if not any(_same("git_commit", commit, c) for c in commits):
                commits.append(commit)
        if (meta.get("library") or None) != (first_meta.get("library") or None):  # "" and None: the built-in one
            differ.append("library")
        if differ:
            raise ValueError(f"{path} and {first_path} are not parts of one sweep: they differ in "
                             + ", ".join(f"{k} ({summary.get(k, meta.get(k))!r} vs {first.get(k, first_meta.get(k))!r})"
                                         for k in differ))
        for k in summary["kernels"]:
            name = f"{k['kernel']} ({k.get('dtype')})"
            if name in seen:
                raise ValueError(f"{name} is in two parts: {seen[name]} and {path}")
            seen[name] = path
    wall = sum(float(s["wall_s"]) for _, s, _ in parts)
    busy = sum(float(s["wall_s"]) * float(s["gpu_busy_fraction"]) for _, s, _ in parts) / wall if wall else 0.0
    summary = {**first, "kernels": [k for _, s, _ in parts for k in s["kernels"]], "wall_s": wall,
               "gpu_busy_fraction": busy, "date": max(str(s.get("date", "")) for _, s, _ in parts)}
    meta = {**first_meta, "sweep_id": "+".join(str(m.get("sweep_id", p.name)) for p, _, m in parts),
            **({"commits": commits} if len(commits) > 1 else {}),
            "skipped": {k: v for _, _, m in parts for k, v in (m.get("skipped") or {}).items()},
            "attempts": [a for _, _, m in parts for a in m.get("attempts", [])],
            "parts": [part for p, s, m in parts for part in _parts_of(p, s, m)]}
    return summary, meta


def _same_code(a: str, b: str) -> bool:
    """Two commits whose difference git can tell and holds no code (:func:`code_changes`)."""
    if min(len(a), len(b)) < 7 or a == "None" or b == "None":
        return False  # as for one commit: a shorter prefix may name another
    changed = code_changes(a, b)
    return changed is not None and not changed


def _parts_of(path: Path, summary: dict[str, Any], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts one input stands for: a sweep directory is one; an earlier report names its own."""
    if meta.get("parts"):
        return list(meta["parts"])
    return [{"sweep_id": meta.get("sweep_id", path.name), "date": summary.get("date"), "wall_s": summary.get("wall_s"),
             "kernels": sorted(k["kernel"] for k in summary["kernels"]),
             "commands": [a["command"] for a in meta.get("attempts", [])] or [summary.get("command")]}]


def earlier_report(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run summary, sweep meta) from a results file this script wrote for earlier parts of the
    same sweep, when their sweep directories are gone: its kernels come as they were reported
    (each carried whole under ``entry``, not recomputed), with their parts' commands and dates.

    Raises:
        ValueError: a JSON file that is not such a report.
    """
    report = json.loads(path.read_text())
    if not {"summary", "sweep", "kernels"} <= set(report):
        raise ValueError(f"{path}: not a results file of experiments.sweep_results (summary, sweep, kernels)")
    summary = {**report["summary"],
               "kernels": [{"kernel": e["kernel"], "dtype": e["dtype"], "entry": e} for e in report["kernels"]]}
    return summary, dict(report["sweep"])


def entry_spec(k: dict[str, Any]) -> KernelSpec:
    """The spec of a kernel of a run summary: through its folder reference (the folder as the
    run found it, or its copy under ``$KSEARCH_KERNEL_ROOT``); summaries written before runs
    recorded references name library kernels."""
    ref = k.get("kernel_ref")
    return load_kernel(KernelRef.from_dict(ref) if ref else k["kernel"])


def kernel_entry(k: dict[str, Any]) -> dict[str, Any]:
    """One kernel: speedups, verdicts, and the per-shape loop as bench_library results."""
    spec = entry_spec(k)
    loop: dict[str, dict[str, float]] = {}
    copy_bw = None
    for s in k["shapes"]:
        for impl, ms in s.get("loop_ms", {}).items():
            loop.setdefault(impl, {})[s["label"]] = ms
        if copy_bw is None and s["copy_bw_fraction"] > 0:
            # The summary keeps fractions; the bandwidth they were taken against follows from one.
            copy_bw = spec.bytes_moved(s["shape"], k["dtype"]) / (s["best_ms"] * 1e-3) / s["copy_bw_fraction"]
    reply = {"peers": loop, "copy_bw_bytes_per_s": copy_bw or 1.0}
    bench = kernel_result(spec, k["dtype"], "search", reply, {"variant_id": k["winner"], "params": k["params"]})
    largest = max(k["shapes"], key=lambda s: spec.bytes_moved(s["shape"], k["dtype"]))
    over = k["speedup_over_peers"]
    return {
        "kernel": k["kernel"], "dtype": k["dtype"], "winner": k["winner"], "params": k["params"],
        "dispatch": k.get("dispatch"),
        "speedup_vs_baseline": k["speedup_search"], "heldout_status": k["heldout_status"],
        "vs_baseline_source": k.get("speedup_search_source", "evaluator"),
        "speedup_heldout": k["speedup_heldout"], "speedup_vs_torch_compile": over.get("torch_compile"),
        "speedup_vs_torch_eager": over.get("torch_eager"),
        "speedup_vs_production": {p: v for p, v in over.items() if p not in NOT_PEERS},
        "largest_shape": largest["label"], "copy_bw_fraction_largest": largest["copy_bw_fraction"],
        "variants_evaluated": k["variants_evaluated"], "evaluations": k["evaluations"],
        "sanitizer": k.get("sanitizer_status"), "lineage": [x["note"] for x in k["lineage"]][:1],
        "peer_errors": dict(k.get("peer_errors") or {}),
        "peer_failures": dict(k.get("peer_failures") or {}),
        # shapes each implementation was timed on in the loop (a peer may fail on some only)
        "shapes_timed": {impl: len(times) for impl, times in loop.items()}, "shapes": len(k["shapes"]),
        # median and min-max over the repeated end-of-run loops, per peer ("baseline" too)
        "spreads": dict(k.get("spreads") or {}), "peer_runs": k.get("peer_runs", 0),
        "peer_notes": dict(k.get("peer_notes") or {}),
        "compiled_won": compiled_won(k), "l2_findings": list(k.get("l2_findings") or []),
        "loop_phase_s": list(k.get("loop_phase_s") or []), "compile_cache": list(k.get("compile_cache") or []),
        "loop_prepare_s_by_peer": list(k.get("loop_prepare_s_by_peer") or []),
        "loop_jit_builds": list(k.get("loop_jit_builds") or []),
        "bench": bench,
    }


def _loop_cost(e: dict[str, Any]) -> str:
    """Where the end-of-run loops' time went: set-up (peers, torch.compile) against timing."""
    phases = e["loop_phase_s"]
    text = ("End-of-run loops: set-up " + ", ".join(f"{p.get('prepare', 0.0):.0f}" for p in phases)
            + " s, timed " + ", ".join(f"{p.get('loop', 0.0):.1f}" for p in phases) + " s")
    if e.get("compile_cache"):
        hits = sum(c.get("hit", 0) for c in e["compile_cache"])
        made = sum(c.get("miss", 0) + c.get("bypass", 0) for c in e["compile_cache"])
        text += f"; torch.compile compiled ahead: {hits} compilations loaded, {made} made in the loops"
    by_peer = _setup_by_peer(e.get("loop_prepare_s_by_peer") or [])
    if by_peer:
        text += "; set-up per peer (median over the loops, the first shape's part in brackets): " + ", ".join(
            f"{name} {total:.1f} s ({first:.1f} s)" for name, (total, first) in by_peer.items())
    built = _jit_builds(e.get("loop_jit_builds") or [])
    if built:
        text += "; library modules built in the loops: " + built
    return text + "."


def _jit_builds(loops: list[dict[str, Any]]) -> str:
    """Which loops built or rebuilt a library module (FlashInfer's JIT), which build files they
    rewrote and whether ninja would build a module again right after, e.g. ``loop 2 rebuilt
    silu_and_mul.so (build files rewritten: silu_and_mul)``; empty when no loop built anything."""
    parts = []
    for i, loop in enumerate(loops, 1):
        made = [f"built {Path(m).name}" for m in loop.get("built", [])] + [
            f"rebuilt {Path(m).name}" for m in loop.get("rebuilt", [])]
        if not made:
            continue
        rewritten = loop.get("rewritten", {})
        note = (f" (build files rewritten: {', '.join(Path(p).parent.name for p in rewritten)})" if rewritten
                else " (no build file rewritten)")
        dirty = loop.get("still_dirty", {})
        if dirty:
            module, why = next(iter(dirty.items()))
            note += f", {len(dirty)} still out of date for ninja ({Path(module).name}: {why[0] if why else '?'})"
        parts.append(f"loop {i} " + ", ".join(made) + note)
    return "; ".join(parts)


def _setup_by_peer(loops: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per peer, the median over the loops of its set-up seconds (every shape's) and of its first
    shape's: a first shape taking most of it is a cost paid once per process (an import, a
    library's JIT build or load), not per shape. torch.compile's compilations count as one
    peer; peers under 0.5 s are left out. Largest first."""
    def per_peer(seconds: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, v in seconds.items():
            peer = "torch_compile" if name.startswith("torch_compile[") else name
            out[peer] = out.get(peer, 0.0) + v
        return out

    totals = [per_peer(loop.get("total", {})) for loop in loops]
    firsts = [per_peer(loop.get("first_shape", {})) for loop in loops]
    found = {name: (statistics.median(t.get(name, 0.0) for t in totals),
                    statistics.median(f.get(name, 0.0) for f in firsts))
             for name in {n for t in totals for n in t}}
    return dict(sorted(((n, v) for n, v in found.items() if v[0] >= 0.5), key=lambda kv: -kv[1][0]))


def compiled_won(k: dict[str, Any]) -> dict[str, int]:
    """How often each torch.compile mode won a shape, over every loop."""
    won: dict[str, int] = {}
    for s in k["shapes"]:
        for choice in s.get("compiled", []):
            mode = choice.split("#")[0]
            won[mode] = won.get(mode, 0) + 1
    return won


def _ratio(e: dict[str, Any], peer: str, median: float | None) -> str:
    """A ratio with its spread over the loops (``1.12x [1.05-1.18] faster``), else the single
    figure; ``over 2 of 7 shapes`` where the peer was timed on some shapes only."""
    part = spread.over_shapes(e.get("shapes_timed", {}).get(peer), e.get("shapes"))
    ranged = e.get("spreads", {}).get(peer)
    if ranged:
        return spread.text(ranged) + part
    source = "evaluator" if peer == "baseline" and e.get("vs_baseline_source") == "evaluator" else "loop"
    return "-" if median is None else f"{median:.3f}x (one {source} run, no spread){part}"


def _spread_of(e: dict[str, Any], peer: str, median: float | None) -> spread.Spread | None:
    """A kernel's ratio over ``peer`` as a spread: over the loops, else the one figure there is."""
    return spread.figure(e.get("spreads", {}).get(peer), median)


def _strongest_flashinfer(e: dict[str, Any]) -> tuple[str, spread.Spread | None]:
    """The kernel's ratio over FlashInfer at its best: where FlashInfer offers the op through
    several APIs (merge_state and merge_state_in_place), the one we lead by the least."""
    return spread.least_lead(e["speedup_vs_production"], e.get("spreads", {}), "flashinfer")


def check_targets(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets over the sweep. Each figure over the kernels (median, geometric mean)
    has a range from the kernels' ranges (:func:`search.spread.aggregate`); a target is ``met``
    only when that whole range is at or above it (:func:`search.spread.against`)."""
    tc_parts = {e["kernel"]: s for e in entries
                if (s := _spread_of(e, "torch_compile", e["speedup_vs_torch_compile"])) is not None}
    tc = [e["speedup_vs_torch_compile"] for e in entries if e["speedup_vs_torch_compile"] is not None]
    median = spread.aggregate(list(tc_parts.values()), statistics.median)
    gm = spread.aggregate(list(tc_parts.values()), geomean)
    median_verdict = spread.against(TC_MEDIAN_TARGET, median)
    # The geomean target also asks every kernel's whole range over torch.compile to be at or above 1.0.
    geomean_verdict = spread.all_of([spread.against(TC_GEOMEAN_TARGET, gm),
                                     *(spread.against(1.0, s) for s in tc_parts.values())])
    strongest = {e["kernel"]: _strongest_flashinfer(e) for e in entries if e["kernel"] in ASTRA}
    astra_parts = [s for _, s in strongest.values() if s is not None]
    astra = spread.aggregate(astra_parts, geomean) if len(astra_parts) == len(ASTRA) else None
    vs_baseline = {e["kernel"]: _spread_of(e, "baseline", e["speedup_vs_baseline"]) for e in entries}
    external_verdict = spread.all_of([spread.against(EXTERNAL_GEOMEAN_TARGET, gm),
                                      *(spread.against(EXTERNAL_FLOOR, s) for s in tc_parts.values())])
    return {
        "external_verdict": external_verdict,
        "below_floor_vs_torch_compile": sorted(k for k, s in tc_parts.items() if s.low < EXTERNAL_FLOOR),
        "geomean_vs_torch_compile": gm.median if gm else None, "geomean_target": TC_GEOMEAN_TARGET,
        "geomean_vs_torch_compile_range": gm.to_dict() if gm else None,
        "geomean_verdict": geomean_verdict, "geomean_met": geomean_verdict == spread.MET,
        "below_one_vs_torch_compile": sorted(k for k, s in tc_parts.items() if s.low < 1.0),
        "verdicts_vs_torch_compile": {k: s.verdict for k, s in tc_parts.items()},
        "geomean_vs_flashinfer_astra": astra.median if astra else None,
        # per Astra kernel, the FlashInfer API the target is taken against (its fastest one)
        "flashinfer_astra_peers": {k: name for k, (name, s) in strongest.items() if s is not None},
        "geomean_vs_flashinfer_astra_range": astra.to_dict() if astra else None,
        # not applicable when the sweep holds none of the Astra kernels (a library of other kernels)
        "flashinfer_astra_verdict": (spread.against(ASTRA_FLASHINFER_TARGET, astra) if strongest
                                     else "not applicable"),
        "all_heldout_ok": all(e["heldout_status"] == "OK" for e in entries),
        "median_vs_torch_compile": median.median if median else None, "median_target": TC_MEDIAN_TARGET,
        "median_vs_torch_compile_range": median.to_dict() if median else None,
        "median_verdict": median_verdict, "median_met": median_verdict == spread.MET,
        "kernels_with_torch_compile": len(tc),
        # slower only when the whole range is below 1.0; a range straddling it is a tie
        "slower_than_baseline": sorted(k for k, s in vs_baseline.items() if s is not None and s.verdict == "slower"),
        "tie_with_baseline": sorted(k for k, s in vs_baseline.items() if s is not None and s.verdict == "tie"),
        "below_roofline": below_roofline(entries),
    }


def below_roofline(entries: list[dict[str, Any]]) -> list[str]:
    """End-of-run loop times that beat the copy-bandwidth roofline: impossible for a kernel that
    does its work, so those loop figures are not to be trusted (the evaluator's own timing of
    the same kernel carries the replay and roofline guards; this loop does not)."""
    out = []
    for e in entries:
        for row in e["bench"]["rows"]:
            for impl, v in row["impl"].items():
                if v["copy_bw_fraction"] > ROOFLINE:
                    out.append(f"{e['kernel']} {impl} {row['label']} ({v['copy_bw_fraction']:.0%} of copy bandwidth)")
    return out


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def _figure(value: float | None, ranged: dict[str, Any] | None) -> str:
    """A figure over the kernels with its range (``1.160x [1.120-1.190]``), else the figure."""
    r = spread.from_dict(ranged)
    if r is None:
        return _x(value)
    one = ", one run" if r.runs == 1 else ""
    return f"{r.median:.3f}x [{r.low:.3f}-{r.high:.3f}{one}]"


def _loops(entries: list[dict[str, Any]]) -> str:
    """How many end-of-run loops the ratios are medians of (``3``, or ``2-3`` when kernels differ)."""
    counts = sorted({int(e.get("peer_runs") or 0) for e in entries}) or [0]
    return str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"


def external_library(meta: dict[str, Any]) -> bool:
    """Whether the sweep searched a library of its own (``--library``) rather than the built-in one:
    such kernels have no recipes, and are held to the general agent's targets."""
    return bool(meta.get("library"))


def to_markdown(summary: dict[str, Any], meta: dict[str, Any], entries: list[dict[str, Any]],
                targets: dict[str, Any]) -> str:
    commands = attempts_text(meta.get("attempts", [])) or f"`{summary.get('command')}`"
    loops = _loops(entries)
    verdict = spread.verdict_text
    lines = [f"# Library sweep on {summary['gpu']}", "",
             *([f"**{summary['warning']}**", ""] if summary.get("warning") else []),
             f"- command: {commands}", f"- git commit at the end of the run: {summary.get('git_commit')}", f"- date: {summary.get('date')}",
             *([f"- parts: {len(meta['parts'])} sweeps of "
                + (f"the same code at commits {', '.join(c[:7] for c in meta['commits'])} (between them git finds "
                   "changes to results and prose only)" if meta.get("commits") else "this commit")
                + ", one after the other, the library split by "
                "`--kernel`: " + "; ".join(f"{p['sweep_id']} ({p['date']}, {float(p['wall_s']):.0f} s: "
                                           f"{', '.join(p['kernels'])})" for p in meta["parts"])]
               if meta.get("parts") else []),
             f"- evaluator: {summary.get('evaluator')}, GPUs: {summary.get('n_gpus')}, agents: embedded; wall "
             f"{summary['wall_s']:.0f} s, {busy_label(summary.get('evaluator', 'gpu')).replace('gpu', 'GPU')} "
             f"{summary['gpu_busy_fraction']:.0%}",
             "- times: kernel times; ours by CUDA events around one launch, peers by one CUDA-graph replay; L2 "
             "flushed before every repetition; the winner, our baseline and the peers interleaved in one loop on one "
             f"working set (100 repetitions after 20 warm-ups), the loop repeated in {loops} fresh sandbox processes "
             "at the end of the sweep",
             "- speedup = other time / our best time, geometric mean over the search shapes within one loop; every "
             f"ratio is the median over the {loops} loops [min-max], 'vs baseline' included; 'held-out' is the "
             "evaluator's full protocol on the held-out shapes (one run, validated, with the replay and roofline "
             "guards); the per-shape tables give each implementation's median time over the loops", "",
             "## Targets", "",
             "A target is met only when the whole range is at or above it, not met when the whole range is below "
             "it, and 'within range' (not met) when it straddles it; a figure over the kernels (median, geomean) "
             "ranges from that figure of the kernels' lows to that of their highs.", "",
             f"- every kernel correct on its held-out shapes: {'yes' if targets['all_heldout_ok'] else 'NO'}",
    ]
    geomean = _figure(targets['geomean_vs_torch_compile'], targets.get('geomean_vs_torch_compile_range'))
    if external_library(meta):
        lines += [f"- geomean over torch.compile (best of its modes) across a library without recipes: **{geomean}** "
                  f"(target {EXTERNAL_GEOMEAN_TARGET}x with no kernel's whole range below {EXTERNAL_FLOOR}x: "
                  f"{verdict(targets['external_verdict'])}; ranges reaching below {EXTERNAL_FLOOR}x: "
                  f"{', '.join(targets['below_floor_vs_torch_compile']) or 'none'}; below 1.0x: "
                  f"{', '.join(targets['below_one_vs_torch_compile']) or 'none'})"]
    else:
        lines += [f"- median speedup over torch.compile across the {targets['kernels_with_torch_compile']} kernels it "
                  f"compiles: **{_figure(targets['median_vs_torch_compile'], targets.get('median_vs_torch_compile_range'))}"
                  f"** (target {targets['median_target']}x: {verdict(targets['median_verdict'])})",
                  f"- geomean over torch.compile (best of its modes): **{geomean}** "
                  f"(target {TC_GEOMEAN_TARGET}x with every kernel's whole range at or above 1.0: "
                  f"{verdict(targets['geomean_verdict'])}; ranges below 1.0: "
                  f"{', '.join(targets['below_one_vs_torch_compile']) or 'none'})",
                  f"- geomean over FlashInfer on {', '.join(ASTRA)}, each against its fastest FlashInfer API "
                  f"({', '.join(f'{k}: {p}' for k, p in sorted(targets.get('flashinfer_astra_peers', {}).items())) or '-'}): "
                  f"**{_figure(targets['geomean_vs_flashinfer_astra'], targets.get('geomean_vs_flashinfer_astra_range'))}"
                  f"** (target {ASTRA_FLASHINFER_TARGET}x: {verdict(targets['flashinfer_astra_verdict'])})"]
    lines += [
             f"- kernels slower than their baseline (whole range below 1.0x): "
             f"{', '.join(targets['slower_than_baseline']) or 'none'}; tied with it: "
             f"{', '.join(targets['tie_with_baseline']) or 'none'}", ""]
    if targets["below_roofline"]:
        lines += [f"**Not trusted: {len(targets['below_roofline'])} end-of-run loop time(s) beat the copy-bandwidth "
                  f"roofline ({ROOFLINE}x), which a kernel doing its work cannot:** "
                  + "; ".join(targets["below_roofline"]), ""]
    lines += [
             "| kernel | vs baseline | held-out (evaluator) | vs torch.compile | vs production peer | "
             "vs torch eager | copy bw, largest shape | variants | sanitizer |", "|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        prod = ", ".join(f"{p} {_ratio(e, p, v)}" for p, v in sorted(e["speedup_vs_production"].items())) or "none"
        lines.append(f"| {e['kernel']} | {_ratio(e, 'baseline', e['speedup_vs_baseline'])} | {e['heldout_status']} "
                     f"{_x(e['speedup_heldout'])} | {_ratio(e, 'torch_compile', e['speedup_vs_torch_compile'])} | "
                     f"{prod} | {_ratio(e, 'torch_eager', e['speedup_vs_torch_eager'])} | "
                     f"{e['copy_bw_fraction_largest']:.0%} {e['largest_shape']} | "
                     f"{e['variants_evaluated']} | {e['sanitizer'] or '-'} |")
    lines += ["", f"Ratios: median over the {loops} end-of-run loops [min-max]; faster only when the whole range is "
              "above 1.0x, slower only when it is below, a tie when it straddles 1.0x; 'vs baseline' comes from the "
              "same loops as the peers; a ratio marked 'one run' had no repeated loops to give it a range. "
              "No production peer in reach (FlashInfer 0.2.14, Liger, torch): "
              + (", ".join(e["kernel"] for e in entries if not e["speedup_vs_production"]) or "none") + "."]
    for e in entries:
        lines += ["", f"## {e['kernel']} ({e['dtype']}): winner {e['winner']} {e['params']}", "",
                  f"found by: {', '.join(e['lineage'])}", "",
                  *([describe(e.get("dispatch")) + "; 'best' is each shape's kernel", ""] if describe(e.get("dispatch"))
                    else []), *shape_table(e["bench"])]
        if e.get("compiled_won"):
            lines += ["", "torch.compile: the fastest of its compilations per shape and loop; shapes won by mode: "
                      + ", ".join(f"{m} {n}" for m, n in sorted(e["compiled_won"].items()))]
        if e.get("peer_notes"):
            lines += ["", "Timed: " + "; ".join(f"{p}: {n}" for p, n in sorted(e["peer_notes"].items()))]
        if e.get("loop_phase_s"):
            lines += ["", _loop_cost(e)]
        for finding in e.get("l2_findings", []):
            lines += ["", f"**{finding}**"]
        if e["peer_errors"]:
            lines += ["", "Not timed: " + "; ".join(f"{p}: {why}" for p, why in sorted(e["peer_errors"].items()))]
        if e["peer_failures"]:
            lines += ["", "Failed verification in the loop (no ratio taken): "
                      + "; ".join(f"{p}: {why}" for p, why in sorted(e["peer_failures"].items()))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep_dir", type=Path, nargs="*",
                   help="a sweep directory, or several: the parts of one sweep split by --kernel (same code and GPU)")
    p.add_argument("--earlier", type=Path, action="append", default=[], metavar="REPORT.json",
                   help="a results file this script wrote for earlier parts of the same sweep whose directories "
                        "are gone: its kernels are pooled as reported")
    p.add_argument("--out", type=Path, default=Path("experiments/results/sweep-h200"))
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    if not args.sweep_dir and not args.earlier:
        p.error("give at least one sweep directory or --earlier report")
    try:
        summary, meta = merge_parts([*((r, *earlier_report(r)) for r in args.earlier),
                                     *((d, *find_summary(d)) for d in args.sweep_dir)])
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"sweep_results: {exc}", file=sys.stderr)
        return 2
    entries = [k["entry"] if "entry" in k else kernel_entry(k)
               for k in sorted(summary["kernels"], key=lambda k: k["kernel"])]
    targets = check_targets(entries)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    slim = {k: v for k, v in summary.items() if k != "kernels"}
    args.out.with_suffix(".json").write_text(json.dumps(
        {"summary": slim, "sweep": {k: meta[k] for k in ("sweep_id", "skipped", "attempts", "parts", "commits", "library") if k in meta},
         "targets": targets, "kernels": entries}, indent=1, default=str))
    text = to_markdown(summary, meta, entries, targets)
    args.out.with_suffix(".md").write_text(text)
    if not args.no_plots:
        try:
            for e in entries:
                plot_kernel(e["bench"], args.out.parent / f"{args.out.name}-{e['kernel']}.png", summary["gpu"])
        except ImportError:
            print("matplotlib is not installed: no plots (pip install .[plots])", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
