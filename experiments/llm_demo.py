"""An LLM search run end to end against a scripted OpenAI-compatible server.

    python -m experiments.llm_demo --evaluator gpu --out experiments/results/llm-demo-h200
    python -m experiments.llm_demo --evaluator standin   # the CPU twin, into a new runs/llm-demo-<time>

A local server (``agents/llm/scripted_server.py``) answers each role with a fixed reply: the tester
proposes one extra search shape for silu_and_mul, the planner suggests 16-byte vector loads
with fast intrinsics, and the coder returns ``experiments/results/variants/silu_and_mul/vec_flat.cu``
(read at run time). The script runs ``python -m search.run --agent llm`` against it and checks
that the scripted variant travelled tester -> planner -> coder -> evaluator -> selection:
the tester's shape is in the winner's search evaluations (and in none on held-out shapes),
the planner and coder calls in ``llm_calls.jsonl`` point at the winner, the winner is OK in
``evaluations.jsonl``, and ``summary.json`` names it the winner. Writes ``OUT/llm-demo.json``
and ``OUT/llm-demo.md`` (OUT: ``--out``, else a new ``runs/llm-demo-<UTC time>``); exits 1
when a check fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agents.llm.scripted_server import ScriptedLLMServer
from kernels.records import EvalRecord, ShapeSet, Stage, atomic_write, read_evaluations
from kernels.spec import load_kernel, shape_label
from kernels.variant import Variant
from search.proposal_records import CallRecord, read_calls
from search.report import git_commit

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNEL = "silu_and_mul"
MODEL = "scripted"
API_KEY = "demo-key"
EXTRA_SHAPE = {"num_tokens": 64, "d": 11008}
VARIANT_FILE = REPO_ROOT / "experiments" / "results" / "variants" / "silu_and_mul" / "vec_flat.cu"
SUGGESTION = {
    "title": "16-byte vector loads with fast intrinsics",
    "change": "Give each thread 8 outputs: load gate and up as one 16-byte uint4 each and store 16 bytes; "
              "compute silu with __expf and __frcp_rn; flat grid over num_tokens * d / 8 so small token "
              "counts still fill every SM; scalar path when d is not a multiple of 8.",
    "rationale": "The kernel is memory-bound at about half of the copy bandwidth: scalar 2-byte accesses "
                 "and expf leave HBM idle; wide accesses and cheap math close the gap.",
}


def role_of(body: Mapping[str, Any]) -> str:
    """The agent role of a chat request, from its system prompt ("You are the tester ...")."""
    messages = body.get("messages") or [{}]
    words = str(messages[0].get("content", "")).split()
    return words[3] if words[:3] == ["You", "are", "the"] else "unknown"


def scripted_replies(variant_source: str) -> dict[str, str]:
    """The reply of each role: one extra shape, one structured suggestion, the variant file."""
    tester = {"shapes": [EXTRA_SHAPE], "why": "a medium batch of LLaMA-7B's MLP width, between 16 and 128 tokens"}
    planner = {"analysis": "memory-bound; scalar loads and expf keep it far from the copy bandwidth",
               "suggestions": [SUGGESTION]}
    return {
        "tester": "```json\n" + json.dumps(tester) + "\n```",
        "planner": "```json\n" + json.dumps(planner) + "\n```",
        "coder": f"The variant with 16-byte vectors and __expf / __frcp_rn.\n```cuda\n{variant_source}```\n",
    }


def make_responder(replies: Mapping[str, str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A server responder answering by role; token counts are about 4 characters per token."""

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        role = role_of(body)
        if role not in replies:
            return {"status": 500, "error": f"the demo script has no reply for the {role} role"}
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
        return {"reply": replies[role], "usage": (prompt_chars // 4, len(replies[role]) // 4)}

    return respond


def search_command(evaluator: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "search.run", "--kernel", KERNEL, "--agent", "llm", "--model", MODEL,
            "--population", "1", "--rounds", "1", "--variants", "1", "--trials", "2",
            "--evaluator", evaluator, "--out", str(out)]


def server_env(server: ScriptedLLMServer) -> dict[str, str]:
    """The environment of a search run that talks to ``server``."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": server.api_key, "PYTHONPATH": path}


def call_chain(calls: list[CallRecord], winner: str) -> list[dict[str, Any]]:
    """The tester call of the kernel, then the planner and coder calls that led to ``winner``."""
    chosen = [c for c in calls if c.is_tester and c.kernel == KERNEL]
    chosen += [c for c in calls if c.role in ("planner", "coder") and c.variant_id == winner]
    return [
        {"role": c.role, "call_id": c.call_id, "plan_call_id": c.plan_call_id, "model": c.model,
         "variant_id": c.variant_id, "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
         "latency_s": c.latency_s, "attempts": c.attempts, "error": c.error,
         **({"accepted_shapes": list(c.accepted_shapes)} if c.is_tester else {})}
        for c in chosen
    ]


def _shape_labels(record: EvalRecord) -> list[str]:
    return [shape_label(s.shape) for s in record.evaluation.shapes]


def check_run(run_dir: Path, expected_id: str) -> tuple[dict[str, bool], list[dict[str, Any]], list[dict[str, Any]]]:
    """Checks the scripted variant's way through the run.

    Returns:
        (check name -> passed, the chain of calls, the winner's evaluations).
    """
    summary = json.loads((run_dir / "summary.json").read_text())
    kernel = next(k for k in summary["kernels"] if k["kernel"] == KERNEL)
    chain = call_chain(read_calls(run_dir / "llm_calls.jsonl"), expected_id)
    roles = [c["role"] for c in chain]
    planner = next((c for c in chain if c["role"] == "planner"), None)
    records = read_evaluations(run_dir / "evaluations.jsonl")
    evals = [r for r in records if r.variant.id == expected_id]
    extra, spec = shape_label(EXTRA_SHAPE), load_kernel(KERNEL)
    search_ok = [r for r in evals if r.shape_set is ShapeSet.SEARCH and r.evaluation.status.is_ok]
    heldout = [r for r in records if r.shape_set is ShapeSet.HELDOUT]
    best_source = (run_dir / "best" / f"{KERNEL}.cu").read_text()
    checks = {
        "tester_proposed_the_extra_shape": roles[:1] == ["tester"] and chain[0]["accepted_shapes"] == [EXTRA_SHAPE]
        and summary.get("extra_shapes", {}).get(KERNEL) == [EXTRA_SHAPE],
        "planner_call_led_to_the_winner": planner is not None and not planner["error"],
        "coder_call_wrote_the_winner": any(c["role"] == "coder" and not c["error"] and planner is not None
                                           and c["plan_call_id"] == planner["call_id"] for c in chain),
        "winner_evaluated_ok_on_search_and_extra_shapes": bool(search_ok)
        and all(_shape_labels(r) == [shape_label(s) for s in spec.search_shapes] + [extra] for r in search_ok),
        "heldout_evaluations_never_use_the_extra_shape": bool(heldout)
        and all(extra not in _shape_labels(r) for r in heldout),
        "winner_passed_heldout": kernel["heldout_status"] == "OK"
        and any(r.stage is Stage.HELDOUT and r.evaluation.status.is_ok for r in evals),
        "selected_as_winner": kernel["winner"] == expected_id and Variant(KERNEL, best_source).id == expected_id,
        "faster_than_baseline": (kernel.get("speedup_search") or 0.0) > 1.0,
    }
    brief = [{"stage": r.stage.value, "shape_set": r.shape_set.value, "trial": r.trial, "params": r.params,
              "status": r.evaluation.status.value, "speedup": r.evaluation.speedup,
              "shapes": _shape_labels(r)} for r in evals]
    return checks, chain, brief


def to_markdown(report: Mapping[str, Any]) -> str:
    lines = [f"# LLM run against a scripted server ({report['evaluator']} evaluator on {report['gpu']})", ""]
    if report.get("warning"):
        lines += [f"**{report['warning']}**", ""]
    lines += [f"- command: `{report['command']}`", f"- search command: `{report['search_command']}`",
              f"- git commit: {report['git_commit']}", f"- date: {report['date']}",
              f"- run directory: {report['run_dir']}", f"- extra shape from the tester: {report['extra_shape']}",
              f"- winner: {report['winner']} (scripted variant {report['expected_variant']}), "
              f"speedup {_num(report['speedup_search'])}x on the search shapes, "
              f"{_num(report['speedup_heldout'])}x held-out", f"- requests the server answered: "
              f"{', '.join(report['served_roles'])}", "", "## Calls", "",
              "| role | call | prompt tokens | completion tokens | latency s | attempts | variant |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {c['role']} | {c['call_id'][:8]} | {c['prompt_tokens']} | {c['completion_tokens']} | "
              f"{c['latency_s']:.3f} | {c['attempts']} | {c['variant_id'][:8] or '-'} |" for c in report["chain"]]
    lines += ["", "## Evaluations of the winner", "", "| stage | shapes | trial | params | status | speedup |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {e['stage']} | {e['shape_set']} ({len(e['shapes'])}) | {e['trial'] if e['trial'] is not None else '-'}"
              f" | {e['params']} | {e['status']} | {_num(e['speedup'])} |" for e in report["evaluations"]]
    lines += ["", "## Checks", ""] + [f"- [{'x' if ok else ' '}] {name}" for name, ok in report["checks"].items()]
    return "\n".join(lines) + "\n"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def run_demo(evaluator: str, out: Path, timeout_s: float, command: str) -> dict[str, Any]:
    """Serves the scripted replies, runs the search, checks it; returns the report."""
    source = VARIANT_FILE.read_text()
    expected = Variant(KERNEL, source).id
    out.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in out.iterdir()}
    cmd = search_command(evaluator, out)
    with ScriptedLLMServer(api_key=API_KEY, models=[MODEL], responder=make_responder(scripted_replies(source))) as srv:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=server_env(srv), capture_output=True, text=True, timeout=timeout_s)
        served = [role_of(r["body"]) for r in srv.chat_requests()]
    report: dict[str, Any] = {
        "command": command, "search_command": shlex.join(["python", *cmd[1:]]), "evaluator": evaluator,
        "git_commit": git_commit(REPO_ROOT), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "expected_variant": expected, "extra_shape": EXTRA_SHAPE, "served_roles": served, "returncode": proc.returncode,
    }
    runs = [p for p in out.iterdir() if p.is_dir() and p.name not in before and (p / "summary.json").is_file()]
    if proc.returncode != 0 or len(runs) != 1:
        report.update(ok=False, checks={"search_run_finished": False}, stderr_tail=proc.stderr[-4000:])
        return report
    run_dir = runs[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    kernel = next(k for k in summary["kernels"] if k["kernel"] == KERNEL)
    checks, chain, evals = check_run(run_dir, expected)
    checks["server_answered_tester_planner_coder"] = served == ["tester", "planner", "coder"]
    report.update(
        run_dir=str(run_dir), gpu=summary.get("gpu", ""), winner=kernel["winner"],
        speedup_search=kernel.get("speedup_search"), speedup_heldout=kernel.get("speedup_heldout"),
        noise_floor=kernel.get("noise_floor"), shapes=kernel.get("shapes", []), chain=chain, evaluations=evals,
        checks=checks, ok=all(checks.values()),
    )
    if summary.get("warning"):
        report["warning"] = summary["warning"]
    return report


def default_out(now: dt.datetime | None = None) -> Path:
    """OUT when none is given: a new ``runs/llm-demo-<UTC time>``, so a demonstration never
    writes into the kept results."""
    return Path("runs") / f"llm-demo-{(now or dt.datetime.now(dt.UTC)).strftime('%Y%m%d-%H%M%S')}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.llm_demo", description=__doc__.split("\n")[0])
    p.add_argument("--evaluator", choices=("gpu", "standin"), default="gpu")
    p.add_argument("--out", type=Path, default=None,
                   help="folder of the report and the run (default: a new runs/llm-demo-<UTC time>; name "
                        "experiments/results/... to keep a result)")
    p.add_argument("--timeout-s", type=float, default=1200.0, help="limit of the search run")
    args = p.parse_args(argv)
    command = "python -m experiments.llm_demo " + shlex.join(sys.argv[1:] if argv is None else argv)
    args.out = args.out or default_out()
    report = run_demo(args.evaluator, args.out.resolve(), args.timeout_s, command)
    atomic_write(args.out / "llm-demo.json", json.dumps(report, indent=2, default=str))
    if "chain" in report:
        atomic_write(args.out / "llm-demo.md", to_markdown(report))
        print(to_markdown(report))
    else:
        print(f"the search run failed (exit code {report['returncode']}):\n{report.get('stderr_tail', '')}",
              file=sys.stderr)
    failed = [name for name, ok in report["checks"].items() if not ok]
    if failed:
        print(f"FAILED checks: {', '.join(failed)}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
