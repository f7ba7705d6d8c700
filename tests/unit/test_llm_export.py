"""``search.export`` on a small synthetic run written with the run's own record writer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from agents.base import Proposal
from kernels.records import EvalRecord
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status
from search.export import SAMPLE_SCHEMA, TRAJECTORY_SCHEMA, export_run
from search.records import RunRecords

ROOT = Path(__file__).resolve().parents[2]
K = "silu_and_mul"
SHAPE = {"num_tokens": 16, "d": 4096}


def src(tag: str) -> str:
    return f'// {tag}\n// launch: grid=(num_tokens,) block=(256,) smem=0\nextern "C" __global__ void {K}(...) {{}}\n'


def call(role: str, pid: str, cid: str, prompt: str, reply: str, plan: str = "", prior=()) -> dict:
    messages = [{"role": "system", "content": f"you are the {role}"}, {"role": "user", "content": prompt}, *prior]
    return {"role": role, "model": "m", "messages": messages, "reply": reply, "call_id": cid,
            "proposal_id": pid, "plan_call_id": plan, "attempts": 1, "error": "", "latency_s": 0.5,
            "cost_usd": 0.01, "usage": {"prompt_tokens": 100, "completion_tokens": 50}}


def verdict(status: Status, speedup: float = 1.0) -> Evaluation:
    shapes = (ShapeResult(shape=SHAPE, candidate_ms=1.0 / speedup, baseline_ms=1.0),) if status.is_ok else ()
    return Evaluation(status=status, kernel=K, dtype="float16", shapes=shapes)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Baseline -> A (OK 1.3) -> D (INCORRECT); baseline -> B (compile error after a repair);
    C (no code); E (embedded, OK 1.2). Planner call P is shared by A, B and C."""
    base = Variant(K, src("base"), author="baseline")
    va = Variant(K, src("a"), parent=base.id, author="llm-multi-0", note="a", meta={"proposal_id": "pA"})
    vb = Variant(K, src("b"), parent=base.id, author="llm-multi-0", note="b", meta={"proposal_id": "pB"})
    vd = Variant(K, src("d"), parent=va.id, author="llm-multi-0", round=1, note="d", meta={"proposal_id": "pD"})
    ve = Variant(K, src("e"), parent=base.id, author="embedded-1", note="vectorize")
    failed_c = Variant(K, base.source, author="baseline", meta={"proposal_id": "pC"})
    coder_b = call("coder", "pB", "cB", "do b", "```cuda\nbroken\n```", plan="P")
    repair_b = call("coder", "pB", "cB2", "do b", "```cuda\nfixed\n```", plan="P",
                    prior=[{"role": "assistant", "content": coder_b["reply"]}, {"role": "user", "content": "log"}])
    proposals = [
        (0, Proposal(va, "a: change", (call("planner", "pA", "P", "plan", "{}"),
                                       call("coder", "pA", "cA", "do a", "```cuda\na\n```", plan="P")))),
        (0, Proposal(vb, "b", (coder_b, repair_b))),
        (0, Proposal(failed_c, "c", (call("coder", "pC", "cC", "do c", "no code", plan="P"),), failure="no code")),
        (1, Proposal(vd, "d", (call("planner", "pD", "P2", "plan", "{}"),
                               call("coder", "pD", "cD", "do d", "```cuda\nd\n```", plan="P2")))),
        (0, Proposal(ve, "vectorize")),
    ]
    rec = RunRecords(tmp_path / "run", "run1")
    for i, (rnd, prop) in enumerate(proposals):
        rec.proposal(K, "float16", rnd, prop.variant.author, prop, index=i, batch=len(proposals))
    evals = [(va, "screen", verdict(Status.OK, 1.1)), (va, "full", verdict(Status.OK, 1.3)),
             (vb, "screen", verdict(Status.COMPILE_ERROR)), (vd, "screen", verdict(Status.INCORRECT)),
             (ve, "full", verdict(Status.OK, 1.2))]
    for v, stage, ev in evals:
        rec.evaluation(EvalRecord("run1", K, "float16", v.round, v.author, stage, None, v, ev))
    rec.close()
    return tmp_path / "run"


def test_parquet_export_has_the_documented_schema_and_rewards(run_dir: Path, tmp_path: Path):
    paths = export_run(run_dir, "parquet", tmp_path / "out")
    samples = pl.read_parquet(paths["samples"])
    assert dict(samples.schema) == SAMPLE_SCHEMA
    assert samples.height == 8  # 7 LLM calls and one embedded proposal
    by_call = {r["call_id"] or r["proposal_id"]: r for r in samples.to_dicts()}
    assert by_call["cA"]["reward"] == pytest.approx(1.3)  # the full-protocol stage wins
    assert by_call["P"]["reward"] == pytest.approx(1.3)  # the best proposal the plan led to
    assert by_call["cB"]["status"] == "COMPILE_ERROR" and by_call["cB"]["reward"] == -1.0
    assert by_call["cC"]["status"] == "NO_VARIANT" and by_call["cD"]["reward"] == -0.5
    assert by_call["cA"]["messages"][-1] == {"role": "assistant", "content": "```cuda\na\n```"}
    embedded = samples.filter(pl.col("origin") == "embedded").to_dicts()[0]
    assert embedded["reward"] == pytest.approx(1.2) and embedded["role"] == "transformation"
    assert "// base" in embedded["messages"][0]["content"] and "// e" in embedded["completion"]

    traj = pl.read_parquet(paths["trajectories"])
    assert dict(traj.schema) == TRAJECTORY_SCHEMA
    rows = {r["leaf_variant_id"]: r for r in traj.to_dicts()}
    assert traj.height == 4  # leaves: B, C, D and E; A has a child
    d = next(r for r in rows.values() if r["trajectory_id"] == "pD")
    assert d["n_steps"] == 2 and d["step_rewards"] == pytest.approx([1.3, -0.5]) and d["best_reward"] == 1.3
    b = next(r for r in rows.values() if r["trajectory_id"] == "pB")
    # The shared plan, then the coder's conversation with the repair turn added once.
    assert [m["role"] for m in b["messages"]] == ["system", "user", "assistant", "system", "user",
                                                 "assistant", "user", "assistant"]
    assert b["messages"][-1]["content"] == "```cuda\nfixed\n```"


def test_jsonl_export_through_the_command_line(run_dir: Path):
    result = subprocess.run([sys.executable, "-m", "search.export", str(run_dir), "--format", "jsonl",
                             "--zero-penalty"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "samples:" in result.stdout
    lines = [json.loads(x) for x in (run_dir / "export" / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and set(lines[0]) == set(SAMPLE_SCHEMA)
    assert {x["reward"] for x in lines if x["status"] != "OK"} == {0.0}
    assert pl.read_ndjson(run_dir / "export" / "trajectories.jsonl").height == 4


def test_export_refuses_a_folder_that_is_not_a_run(tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "search.export", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "no proposals.jsonl" in result.stderr
