"""Times two sets of best kernels against each other in one loop (GPU only).

    python -m experiments.head_to_head --old runs/old-best --new experiments/results/sweep-h200-kernels/best

``--old`` and ``--new`` are folders of ``<kernel>.json`` files as a sweep writes them under
``best/`` (the variant, its parameters and, where a result dispatches several kernels by
shape, the ``dispatch`` table; a record without the variant's source has it beside it as
``<kernel>.cu``). Per kernel both sides' kernels (every dispatch member) and
the baseline run interleaved in the end-of-run loop on one working set, with no peers, in
``--repeats`` fresh sandbox processes. Each side's time on a shape is that of the member its
dispatch table gives the shape (its primary kernel without a table), so each side is timed as
it would be shipped.

A loop gives one ratio per kernel, old time / new time, the geometric mean over the search
shapes; the report gives the median over the loops with the min-max and a verdict: new
faster only when the whole range is above 1.0, slower only when it is below, a tie otherwise
(:mod:`search.spread`). Two results found by two searches and compared this way answer
"is the new library worse than the old" without the protocol of either search in the way.

``--peers`` puts the kernel's peers (FlashInfer, Liger, torch eager, torch.compile: the best of
``--compile-trials`` compilations per mode, compiled in the loop's own process) in the same
loop, and the report adds the new side's ratio over each: the end-of-run loop of a sweep, run
again for kernels it already found (say, after a change to the timing protocol).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.bench_library import REPO_ROOT, exit_without_gpu
from search import spread
from search.report import git_commit

SIDES = ("old", "new")


def load_side(folder: Path, kernel: str) -> dict[str, Any] | None:
    """One side's result for ``kernel``: ``members`` ``[(name, source, params)]`` (the primary
    first) and ``table`` ``{shape label: member index}`` (empty: the primary everywhere); None
    when the folder has no result for it."""
    path = folder / f"{kernel}.json"
    if not path.is_file():
        return None
    found = json.loads(path.read_text())
    dispatch = found.get("dispatch") or {}
    if dispatch.get("members"):
        members = [(m["variant"]["source"], dict(m.get("params") or {}), m["variant"].get("id", ""))
                   for m in dispatch["members"]]
        table = {str(k): int(v) for k, v in (dispatch.get("table") or {}).items()}
    else:
        # A trimmed record keeps its source beside it, as <kernel>.cu.
        source = found["variant"].get("source") or (folder / f"{kernel}.cu").read_text()
        members = [(source, dict(found.get("params") or {}), found["variant"].get("id", ""))]
        table = {}
    return {"members": members, "table": table, "dtype": found.get("dtype", "float16")}


def member_name(side: str, index: int) -> str:
    """The loop name of a side's member: ``old``/``new`` for the primary, ``old#1`` ... after."""
    return side if index == 0 else f"{side}#{index}"


def loop_kernels(sides: Mapping[str, Mapping[str, Any]], baseline_source: str) -> dict[str, tuple[str, dict[str, int]]]:
    """The ``ours`` argument of the loop: every member of both sides, and the baseline."""
    ours: dict[str, tuple[str, dict[str, int]]] = {"baseline": (baseline_source, {})}
    for side, result in sides.items():
        for i, (source, params, _) in enumerate(result["members"]):
            ours[member_name(side, i)] = (source, params)
    return ours


def compose(times: Mapping[str, Mapping[str, float]], sides: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """One loop's times per side as shipped: each shape label's time from the member the side's
    table names for it (the primary where it names none); the baseline and the peers as timed.
    A shape whose member has no time there is left out of that side."""
    mine = {member_name(side, i) for side, result in sides.items() for i in range(len(result["members"]))}
    out: dict[str, dict[str, float]] = {impl: dict(t) for impl, t in times.items() if impl not in mine}
    for side, result in sides.items():
        primary = times.get(member_name(side, 0), {})
        side_times: dict[str, float] = {}
        for label in primary.keys() | result["table"].keys():
            member = times.get(member_name(side, result["table"].get(label, 0)), {})
            if label in member:
                side_times[label] = member[label]
        out[side] = side_times
    return out


def ratios(runs: Sequence[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, Any]]:
    """Spreads over the loops: ``new_vs_old`` (old / new: above 1.0, the new side is faster)
    and each side over the baseline."""
    out: dict[str, dict[str, Any]] = {}
    for key, other, ours in (("new_vs_old", "old", "new"), ("new_vs_baseline", "baseline", "new"),
                             ("old_vs_baseline", "baseline", "old")):
        values = [r for r in (spread.loop_ratio(run, other, ours) for run in runs) if r is not None]
        s = spread.of(values)
        if s is not None:
            out[key] = s.to_dict()
    for peer, s in spread.spreads(runs, ours="new", exclude=("old", "baseline")).items():
        out[f"new_vs_{peer}"] = s.to_dict()
    return out


def kernel_result(kernel: str, dtype: str, replies: Sequence[Mapping[str, Any]],
                  sides: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One kernel's entry from its loops' replies (a reply is ``{"loop_error": why}`` for a loop
    that did not run). A side with a member that failed verification in any loop is not
    compared: its kernels gave a wrong output once, and the failure is reported instead."""
    failed: dict[str, str] = {}
    errors: list[str] = []
    runs = []
    for i, reply in enumerate(replies, 1):
        if "loop_error" in reply:
            errors.append(f"loop {i}: {reply['loop_error']}")
            continue
        for name, why in reply.get("failed", {}).items():
            failed.setdefault(name, f"loop {i}: {why}")
        runs.append(compose(reply.get("peers", {}), sides))
    bad = {name.split("#")[0] for name in failed}
    runs = [{impl: t for impl, t in run.items() if impl not in bad} for run in runs]
    return {"kernel": kernel, "dtype": dtype, "loops": len(runs), "errors": errors, "failed": failed,
            "members": {side: [m[2] for m in r["members"]] for side, r in sides.items()},
            "spreads": ratios(runs), "median_times_ms": spread.median_times(runs), "runs": runs}


def summary(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Verdict counts of new vs old, and the geomean over the kernels with its range."""
    from kernels.verdict import geomean

    parts = [s for s in (spread.from_dict(r["spreads"].get("new_vs_old")) for r in results) if s is not None]
    counts: dict[str, int] = {}
    for p in parts:
        counts[p.verdict] = counts.get(p.verdict, 0) + 1
    total = spread.aggregate(parts, geomean)
    slower = [r["kernel"] for r in results if (spread.from_dict(r["spreads"].get("new_vs_old")) or spread.single(1.0)).verdict == "slower"]
    return {"kernels": len(results), "compared": len(parts), "verdicts": counts,
            "geomean_new_vs_old": total.to_dict() if total else None, "new_slower": slower,
            "not_compared": [r["kernel"] for r in results if "new_vs_old" not in r["spreads"]]}


def to_markdown(meta: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> str:
    s = summary(results)
    lines = ["# Head to head: two sets of best kernels in one loop", "",
             f"- command: `{meta['command']}`", f"- git commit: {meta['git_commit']}",
             f"- GPU: {meta['gpu']}", f"- date: {meta['date']}",
             f"- old: {meta['old']}", f"- new: {meta['new']}",
             f"- timing: {meta['timing']}", "",
             ("No old side: the new side's kernels with the baseline" + (" and the peers" if "with the peers" in meta["timing"] else "")
              + ", ratios of the new side below.") if meta["old"] == "None" else
             f"Kernels compared: {s['compared']} of {s['kernels']}; verdicts of new vs old: "
             + ", ".join(f"{k} {v}" for k, v in sorted(s["verdicts"].items()))
             + (f"; geomean new vs old {spread.text(s['geomean_new_vs_old'])}" if s["geomean_new_vs_old"] else "")
             + (f"; new slower on: {', '.join(s['new_slower'])}" if s["new_slower"] else "; new slower on none"),
             "",
             "| kernel | new vs old (old us / new us) | new vs baseline | old vs baseline | new vs peers | loops | members old / new |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        sp = r["spreads"]
        peers = ", ".join(f"{k.removeprefix('new_vs_')} {spread.text(v)}" for k, v in sp.items()
                          if k not in ("new_vs_old", "new_vs_baseline", "old_vs_baseline")) or "-"
        lines.append(f"| {r['kernel']} | {spread.text(sp.get('new_vs_old'))} | {spread.text(sp.get('new_vs_baseline'))} "
                     f"| {spread.text(sp.get('old_vs_baseline'))} | {peers} | {r['loops']} "
                     f"| {len(r['members'].get('old', []))} / {len(r['members'].get('new', []))} |")
    lines += ["", "Ratios: geometric mean over the search shapes of one loop, median over the loops "
              "[min-max]; faster only when the whole range is above 1.0x, slower only when it is "
              "below, a tie otherwise.", ""]
    for r in results:
        t = r["median_times_ms"]
        labels = list(t.get("baseline", {}))
        columns = ["baseline", "old", "new", *sorted(k for k in t if k not in ("baseline", "old", "new"))]
        lines += [f"## {r['kernel']} ({r['dtype']})", "", "| shape | " + " | ".join(f"{c} us" for c in columns) + " |",
                  "|---" * (len(columns) + 1) + "|"]
        for label in labels:
            cells = [f"{t[k][label] * 1e3:.2f}" if label in t.get(k, {}) else "-" for k in columns]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        for what in ("errors", "failed"):
            if r[what]:
                lines.append(f"\n{what}: {r[what]}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", type=Path, help="folder of the old side's <kernel>.json files (none: the new side alone, "
                   "with --peers the end-of-run loop run again)")
    p.add_argument("--new", type=Path, required=True, help="folder of the new side's <kernel>.json files")
    p.add_argument("--kernel", action="append", help="kernel (repeatable; default: every kernel both sides have)")
    p.add_argument("--repeats", type=int, default=3, help="loops per kernel, each in a fresh process")
    p.add_argument("--repetitions", type=int, default=100)
    p.add_argument("--peers", action="store_true", help="the kernel's peers in the same loop")
    p.add_argument("--compile-trials", type=int, default=None,
                   help="with --peers: torch.compile compilations per mode (default: the evaluator's)")
    p.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md are written")
    p.add_argument("--resume", action="store_true",
                   help="keep the kernels OUT.json already holds and time only the others (a run cut short)")
    args = p.parse_args(argv)
    sides_given = [side for side in SIDES if getattr(args, side) is not None]
    for side in sides_given:
        if not getattr(args, side).is_dir():
            p.error(f"--{side} {getattr(args, side)} is not a directory")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    both = sorted(set.intersection(*({f.stem for f in getattr(args, side).glob("*.json")} for side in sides_given)))
    kernels = args.kernel or both
    missing = [k for k in kernels if k not in both]
    if missing:
        p.error(f"no result in every folder given: {', '.join(missing)}")
    if (code := exit_without_gpu("experiments.head_to_head")) is not None:
        return code
    from evaluators.gpu import EvaluatorError, GpuEvaluator
    from kernels.spec import kernel_ref, load_kernel

    meta: dict[str, Any] = {
        "command": "python -m experiments.head_to_head " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": git_commit(REPO_ROOT), "gpu": "", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "old": str(args.old), "new": str(args.new),
        "timing": ("kernel times by CUDA events around one launch, L2 flushed before each; both sides' kernels "
                   "and the baseline interleaved in one loop on one working set, "
                   + ("with the peers (each by one CUDA-graph replay; torch.compile the fastest of its compilations per shape) "
                      if args.peers else "no peers ") + f"({args.repetitions} "
                   f"repetitions after 20 warm-ups), {args.repeats} loops per kernel, each in a fresh sandbox process")}
    out_json = args.out.with_suffix(".json")
    results: list[dict[str, Any]] = (json.loads(out_json.read_text())["results"]
                                     if args.resume and out_json.is_file() else [])
    done = {r["kernel"] for r in results}
    evaluator = GpuEvaluator(step_timeout_s=60.0)
    try:
        meta["gpu"] = evaluator.info()["gpu"]
        for kernel in (k for k in kernels if k not in done):
            sides = {side: load_side(getattr(args, side), kernel) for side in sides_given}
            assert all(sides.values())
            dtype = sides["new"]["dtype"]  # type: ignore[index]
            ours = loop_kernels(sides, load_kernel(kernel).baseline_source())  # type: ignore[arg-type]
            replies: list[dict[str, Any]] = []
            for i in range(args.repeats):
                print(f"{kernel}: loop {i + 1} of {args.repeats}", flush=True)
                try:
                    replies.append(evaluator.time_peers_full(kernel_ref(kernel), dtype, "search", ours,
                                                             repetitions=args.repetitions, fresh_process=True,
                                                             peers=args.peers, compile_trials=args.compile_trials))
                except EvaluatorError as exc:
                    replies.append({"loop_error": " ".join(str(exc).split())[:500]})
            results.append(kernel_result(kernel, dtype, replies, sides))  # type: ignore[arg-type]
            print(f"  new vs old {spread.text(results[-1]['spreads'].get('new_vs_old'))}", flush=True)
            # Written after every kernel: a run cut short keeps what it timed.
            args.out.parent.mkdir(parents=True, exist_ok=True)
            out_json.write_text(json.dumps({"meta": meta, "summary": summary(results),
                                                                 "results": results}, indent=1))
            args.out.with_suffix(".md").write_text(to_markdown(meta, results))
    finally:
        evaluator.close()
    print(to_markdown(meta, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
