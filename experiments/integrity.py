"""Evaluation integrity on the GPU machine: every adversarial fixture's verdict, and the
accounting of a search run in which a fraction of the proposals were hostile.

    python -m experiments.integrity fixtures --index tests/adversarial/fixtures.yaml --out OUT
    python -m experiments.integrity run RUN_DIR [RUN_DIR ...] --fixtures-json OUT.json --out OUT

``fixtures`` evaluates every file of a fixtures index (``--index``, the adversarial corpus
of the test suite) with the GPU evaluator
(5 warm-ups, 20 timed repetitions), each at the dtype and on the shape set its entry names,
and, after every fault, the baseline again (it must still be OK); fixtures whose bug only
compute-sanitizer sees also go through the sanitizer tool their entry names. ``run`` reads
search runs' proposals.jsonl and evaluations.jsonl and checks that every proposal has a
verdict on record and no injected kernel was reported, then writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from evaluators.api import EvalRequest, TimingConfig
from kernels.records import Stage, read_evaluations
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Status
from search.proposal_records import read_proposals


def run_fixtures(index: Path) -> dict[str, Any]:
    """Every fixture of ``index`` evaluated on the GPU, with the baseline after each fault."""
    from evaluators.gpu import GpuEvaluator

    data = yaml.safe_load(index.read_text())
    evaluator = GpuEvaluator(step_timeout_s=15.0)
    rows = []
    try:
        gpu = evaluator.info()["gpu"]
        for fx in data["fixtures"]:
            source = (index.parent / fx["file"]).read_text()
            dtype, shape_set = fx.get("dtype", "float16"), fx.get("shape_set", "search")
            ev = evaluator.evaluate(EvalRequest(fx["kernel"], Variant(fx["kernel"], source), dtype=dtype,
                                                shape_set=shape_set, timing=TimingConfig(5, 20, 0.0)))
            row = {"file": fx["file"], "kernel": fx["kernel"], "dtype": dtype, "shape_set": shape_set,
                   "expected": fx["status"], "expected_guard": fx.get("guard", ""), "got": ev.status.value,
                   "guard": ev.guard, "message": ev.message[:300], "restarts_so_far": evaluator.restarts}
            if ev.status not in (Status.OK, Status.COMPILE_ERROR):
                spec = load_kernel(fx["kernel"])
                after = evaluator.evaluate(EvalRequest(fx["kernel"], Variant(spec.name, spec.baseline_source()),
                                                       dtype=dtype, time=False))
                row["baseline_after"] = after.status.value
            if fx.get("sanitizer"):
                row["sanitizer"] = _sanitizer_verdict(fx["kernel"], source, dtype, fx["sanitizer"])
            row["as_expected"] = as_expected(fx, row)
            rows.append(row)
            print(f"{fx['file']:<40} expected {fx['status']:<14} got {ev.status.value:<14} {ev.guard}", flush=True)
    finally:
        evaluator.close()
    return {"gpu": gpu, "fixtures": rows, "not_applicable": data.get("not_applicable", [])}


def as_expected(fx: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether a fixture got its verdict: the status (and guard) of its entry, and the named
    sanitizer tool's findings. An out-of-bounds access (a memcheck fixture) may also fault,
    depending on where the allocator put the buffer it overruns: CRASH is then right too."""
    allowed = {fx["status"]} | ({Status.CRASH.value} if fx.get("sanitizer") == "memcheck" else set())
    guard_ok = row["got"] != "REJECTED" or row["guard"] == fx.get("guard")
    sanitizer_ok = not fx.get("sanitizer") or row.get("sanitizer") == "FINDINGS"
    return row["got"] in allowed and guard_ok and sanitizer_ok


def rejudge(fixtures: dict[str, Any], index: Path) -> dict[str, Any]:
    """The rows of a fixtures run judged again by the index's current entries."""
    entries = {fx["file"]: fx for fx in yaml.safe_load(index.read_text())["fixtures"]}
    rows = [dict(r, as_expected=as_expected(entries[r["file"]], r)) if r["file"] in entries else r
            for r in fixtures["fixtures"]]
    return dict(fixtures, fixtures=rows)


def _sanitizer_verdict(kernel: str, source: str, dtype: str, tool: str) -> str:
    from evaluators.sanitize import sanitize

    return sanitize(kernel, source, dtype, tools=(tool,)).status.value


def account_run(run_dir: Path) -> dict[str, Any]:
    """Every proposal must have at least one evaluation on record (by variant id)."""
    proposals = read_proposals(run_dir / "proposals.jsonl")
    evals = read_evaluations(run_dir / "evaluations.jsonl")
    statuses: dict[tuple[str, str], set[str]] = {}
    stages: dict[tuple[str, str], set[str]] = {}
    for e in evals:
        statuses.setdefault((e.kernel, e.variant.id), set()).add(e.evaluation.status.value)
        stages.setdefault((e.kernel, e.variant.id), set()).add(e.stage.value)
    missing = [p.variant_id for p in proposals if not p.failed and (p.kernel, p.variant_id) not in statuses]
    injected = [p for p in proposals if p.variant.meta.get("injected")]
    verdicts: Counter[str] = Counter()
    furthest: Counter[str] = Counter()
    as_expected = 0
    for p in injected:
        mine = statuses.get((p.kernel, p.variant_id), set())
        # A proposal's verdict is its failure wherever it failed (screening, the full
        # protocol, held-out), OK only when every evaluation of it was.
        failed = sorted(mine - {Status.OK.value})
        verdicts[failed[0] if failed else ("OK" if mine else "MISSING")] += 1
        reached = stages.get((p.kernel, p.variant_id), set())
        furthest[next((st.value for st in reversed(Stage) if st.value in reached), "none")] += 1
        as_expected += p.variant.meta["expected_status"] in mine
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    return {
        "run_dir": run_dir.name, "command": summary.get("command", ""), "proposals": len(proposals),
        "injected": len(injected), "injected_fraction": len(injected) / max(1, len(proposals)),
        "evaluations": len(evals), "proposals_without_verdict": missing,
        "evaluations_by_status": dict(Counter(e.evaluation.status.value for e in evals)),
        "injected_verdicts": dict(verdicts), "injected_as_expected": as_expected,
        "injected_furthest_stage": dict(furthest),
        "winners_injected": [k["winner"] for k in summary.get("kernels", [])
                             if any(p.variant_id == k["winner"] for p in injected)],
        "injected_fixtures": dict(Counter(str(p.variant.meta["injected"]) for p in injected)),
        "kernels": [{"kernel": k["kernel"], "winner": k["winner"], "heldout": k.get("heldout_status"),
                     "sanitizer": k.get("sanitizer", "").replace("\n", "; "),
                     "peer_failures": k.get("peer_failures", {}), "rejected_why": k.get("rejected_why", {}),
                     "speedup_over_peers": k.get("speedup_over_peers", {})}
                    for k in summary.get("kernels", [])],
        "completed": bool(summary), "wall_s": summary.get("wall_s"),
    }


def to_markdown(doc: dict[str, Any]) -> str:
    fx = doc["fixtures"]
    good = sum(r["as_expected"] for r in fx["fixtures"])
    lines = [f"# Evaluation integrity on {fx['gpu']}", "", f"- commit: {doc['git_commit']}", f"- date: {doc['date']}",
             *([f"- verdicts judged by the entries of {fx['judged_by']}"] if fx.get("judged_by") else []),
             f"- fixtures: {good} of {len(fx['fixtures'])} got the expected verdict "
             "(evaluated with 5 warm-ups and 20 timed repetitions at the dtype and on the shape set of their "
             "entry; after every fault the baseline was evaluated again; the sanitizer column is the named "
             "compute-sanitizer tool over every shape)",
             "", "| fixture | kernel | dtype, shapes | expected | got | guard | baseline after | sanitizer | as expected |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in fx["fixtures"]:
        lines.append(f"| {r['file']} | {r['kernel']} | {r.get('dtype', 'float16')}, {r.get('shape_set', 'search')} | "
                     f"{r['expected']} {r['expected_guard']} | {r['got']} | {r['guard']} | "
                     f"{r.get('baseline_after', '-')} | {r.get('sanitizer', '-')} | {'yes' if r['as_expected'] else 'NO'} |")
    if fx["not_applicable"]:
        lines += ["", "Not applicable to device-only code compiled by NVRTC:", ""]
        lines += [f"- {json.dumps(item) if not isinstance(item, str) else item}" for item in fx["not_applicable"]]
    for run in doc.get("runs", []):
        lines += _run_markdown(run)
    return "\n".join(lines) + "\n"


def _fixtures_doc(path: Path, index: Path | None) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    if index is None:
        return doc
    return dict(rejudge(doc, index), judged_by=f"{index}, as it is at this commit")


def _run_markdown(run: dict[str, Any]) -> list[str]:
    lines = ["", f"## Search run with hostile proposals: {run['run_dir']}", "", f"- command: `{run['command']}`",
             f"- completed: {run['completed']}, wall {run['wall_s']:.0f} s" if run["wall_s"] else
             f"- completed: {run['completed']}",
             f"- proposals: {run['proposals']}, of which injected hostile: {run['injected']} "
             f"({run['injected_fraction']:.0%})",
             f"- injected fixtures: {run.get('injected_fixtures', {})}",
             f"- evaluations on record: {run['evaluations']}; by status: {run['evaluations_by_status']}",
             f"- proposals without a verdict on record: {len(run['proposals_without_verdict'])}",
             f"- injected proposals' verdicts: {run['injected_verdicts']} "
             f"({run['injected_as_expected']} with the fixture's expected status)",
             f"- the furthest stage injected proposals reached: {run.get('injected_furthest_stage', {})}",
             f"- winners that were injected: {run['winners_injected'] or 'none'}", "",
             "| kernel | winner | held-out | sanitizer | failed in the peers' loop | dropped winners (why) |",
             "|---|---|---|---|---|---|"]
    for k in run.get("kernels", []):
        dropped = "; ".join(f"{vid}: {why}" for vid, why in k["rejected_why"].items()) or "-"
        lines.append(f"| {k['kernel']} | {k['winner']} | {k['heldout']} | {k['sanitizer'] or '-'} | "
                     f"{k['peer_failures'] or '-'} | {dropped} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixtures")
    f.add_argument("--index", type=Path, required=True, help="fixtures index (tests/adversarial/fixtures.yaml)")
    f.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    r.add_argument("--fixtures-json", required=True)
    r.add_argument("--index", type=Path, help="judge the fixtures' rows again by this index's entries")
    r.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.cmd == "fixtures":
        out.with_suffix(".json").write_text(json.dumps(run_fixtures(args.index), indent=1))
        return 0
    doc = {"git_commit": os.environ.get("KERNEL_SEARCH_COMMIT", "unknown"),
           "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "fixtures": _fixtures_doc(Path(args.fixtures_json), args.index),
           "runs": [account_run(d) for d in args.run_dirs]}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(to_markdown(doc))
    print(to_markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
