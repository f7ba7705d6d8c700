"""``search.export`` on a small synthetic run written with the run's own record writer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agents.base import Proposal
from kernels.records import EvalRecord
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status
from search.export import SAMPLE_SCHEMA, TRAJECTORY_SCHEMA, export_run
from search.export_rewards import OUTCOME_PENALTIES, PENALTIES, ProposalOutcome, reward
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


def verdict(status: Status, speedup: float = 1.0, evaluator: str = "gpu") -> Evaluation:
    shapes = (ShapeResult(shape=SHAPE, candidate_ms=1.0 / speedup, baseline_ms=1.0),) if status.is_ok else ()
    return Evaluation(status=status, kernel=K, dtype="float16", shapes=shapes, extra={"evaluator": evaluator})


TESTER_CALL = {**call("tester", "", "T", "shapes please", '{"shapes": []}'), "kernel": K,
               "accepted_shapes": [{"num_tokens": 3, "d": 4104}], "rejected_shapes": ["d=7 is odd", "held-out"]}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Baseline -> A (OK 1.3) -> D (INCORRECT); baseline -> B (compile error after a repair);
    C (no code); E (embedded, OK 1.2, judged by the stand-in). Planner call P is shared by A, B
    and C; the tester made one call T for the kernel."""
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
    # As the run loop records the tester: a call of no proposal and no variant.
    rec.append("llm_calls", {**TESTER_CALL, "variant_id": "", "run_id": "run1"})
    for i, (rnd, prop) in enumerate(proposals):
        rec.proposal(K, "float16", rnd, prop.variant.author, prop, index=i, batch=len(proposals))
    evals = [(va, "screen", verdict(Status.OK, 1.1)), (va, "full", verdict(Status.OK, 1.3)),
             (vb, "screen", verdict(Status.COMPILE_ERROR)), (vd, "screen", verdict(Status.INCORRECT)),
             (ve, "full", verdict(Status.OK, 1.2, evaluator="standin"))]
    for v, stage, ev in evals:
        rec.evaluation(EvalRecord("run1", K, "float16", v.round, v.author, stage, None, v, ev))
    rec.close()
    return tmp_path / "run"


# The shape of common chat templates (Llama 3, Mistral, Gemma, Qwen): one optional system
# message, first; then user and assistant alternating, starting with the user. They raise
# through ``raise_exception`` otherwise, as transformers renders them.
CHAT_TEMPLATE = """
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}
    {%- if not loop.first -%}{{ raise_exception('System message must be at the beginning.') }}{%- endif -%}
    <<SYS>>{{ message['content'] }}<</SYS>>
  {%- else -%}
    {%- set offset = 1 if messages[0]['role'] == 'system' else 0 -%}
    {%- if (message['role'] == 'user') != ((loop.index0 - offset) % 2 == 0) -%}
      {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif -%}
    [{{ message['role'] }}]{{ message['content'] }}
  {%- endif -%}
{%- endfor -%}
"""


def render_chat(messages: list[dict]) -> str:
    def raise_exception(text: str) -> None:
        raise TemplateError(text)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(CHAT_TEMPLATE).render(messages=messages)


def test_the_chat_template_check_can_fail():
    with pytest.raises(TemplateError, match="beginning"):
        render_chat([{"role": "system", "content": "a"}, {"role": "user", "content": "u"},
                     {"role": "system", "content": "b"}])
    with pytest.raises(TemplateError, match="alternate"):
        render_chat([{"role": "user", "content": "u"}, {"role": "user", "content": "v"}])
    assert "[assistant]r" in render_chat([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                          {"role": "assistant", "content": "r"}])


def test_parquet_export_has_the_documented_schema_and_rewards(run_dir: Path, tmp_path: Path):
    paths = export_run(run_dir, "parquet", tmp_path / "out")
    samples = pl.read_parquet(paths["samples"])
    assert dict(samples.schema) == SAMPLE_SCHEMA
    assert samples.height == 9  # 7 calls of proposals, the tester's call and one embedded proposal
    by_call = {r["call_id"] or r["proposal_id"]: r for r in samples.to_dicts()}
    assert by_call["cA"]["reward"] == pytest.approx(1.3)  # the full-protocol stage wins
    assert by_call["P"]["reward"] == pytest.approx(1.3)  # the best proposal the plan led to
    assert by_call["cB"]["status"] == "COMPILE_ERROR" and by_call["cB"]["reward"] == -1.0
    assert by_call["cC"]["status"] == "NO_VARIANT" and by_call["cD"]["reward"] == -0.5
    assert by_call["cA"]["messages"][-1] == {"role": "assistant", "content": "```cuda\na\n```"}
    embedded = samples.filter(pl.col("origin") == "embedded").to_dicts()[0]
    assert embedded["reward"] == pytest.approx(1.2) and embedded["role"] == "transformation"
    assert "// base" in embedded["messages"][0]["content"] and "// e" in embedded["completion"]


def test_tester_calls_are_exported_with_the_share_of_accepted_shapes(run_dir: Path, tmp_path: Path):
    samples = pl.read_parquet(export_run(run_dir, "parquet", tmp_path / "out")["samples"])
    tester = samples.filter(pl.col("role") == "tester").to_dicts()
    assert len(tester) == 1
    t = tester[0]
    assert t["call_id"] == "T" and t["kernel"] == K and t["dtype"] == "float16" and t["variant_id"] == ""
    assert (t["shapes_accepted"], t["shapes_rejected"]) == (1, 2) and t["reward"] == pytest.approx(1 / 3)
    assert t["completion"] == '{"shapes": []}' and t["messages"][0]["role"] == "system"
    assert samples.filter(pl.col("role") != "tester")["shapes_accepted"].null_count() == samples.height - 1


def test_trajectories_split_by_role_with_one_leading_system_message(run_dir: Path, tmp_path: Path):
    traj = pl.read_parquet(export_run(run_dir, "parquet", tmp_path / "out")["trajectories"])
    assert dict(traj.schema) == TRAJECTORY_SCHEMA
    rows = {r["trajectory_id"]: r for r in traj.to_dicts()}
    # Leaves B, C, D (planner and coder each) and E (embedded); A has a child.
    embedded = [k for k in rows if k.endswith(":transformation")]
    assert len(embedded) == 1 and set(rows) - set(embedded) == {
        "pB:coder", "pB:planner", "pC:coder", "pC:planner", "pD:coder", "pD:planner"}
    d = rows["pD:coder"]
    assert d["n_steps"] == 2 and d["step_rewards"] == pytest.approx([1.3, -0.5]) and d["best_reward"] == 1.3
    assert [m["content"] for m in d["messages"]] == ["you are the coder", "do a", "```cuda\na\n```",
                                                     "do d", "```cuda\nd\n```"]
    assert [m["content"] for m in rows["pD:planner"]["messages"]] == ["you are the planner", "plan", "{}", "plan", "{}"]
    b = rows["pB:coder"]
    # The coder's conversation with the repair turn added once; the shared plan has its own row.
    assert [m["role"] for m in b["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert b["messages"][-1]["content"] == "```cuda\nfixed\n```"
    assert [s["proposal_id"] for s in rows["pB:planner"]["steps"]] == ["pB"]
    assert rows["pB:planner"]["messages"][1]["content"] == "plan"
    for r in traj.to_dicts():
        render_chat(r["messages"])


def test_every_exported_chat_passes_the_chat_template(run_dir: Path, tmp_path: Path):
    paths = export_run(run_dir, "parquet", tmp_path / "out")
    for name in ("samples", "trajectories"):
        for r in pl.read_parquet(paths[name]).to_dicts():
            assert sum(m["role"] == "system" for m in r["messages"]) <= 1
            render_chat(r["messages"])


def test_a_differing_later_system_prompt_moves_into_the_user_turn():
    from search.export_turns import Conversation

    conv = Conversation()
    conv.add("s1", [{"role": "system", "content": "S1"}, {"role": "user", "content": "u1"},
                    {"role": "assistant", "content": "a1"}])
    conv.add("s2", [{"role": "system", "content": "S1"}, {"role": "user", "content": "u2"},
                    {"role": "assistant", "content": "a2"}])
    conv.add("s3", [{"role": "system", "content": "S2"}, {"role": "user", "content": "u3"},
                    {"role": "assistant", "content": "a3"}])
    assert [m["content"] for m in conv.messages] == ["S1", "u1", "a1", "u2", "a2", "S2\n\nu3", "a3"]
    render_chat(conv.messages)


def test_synthetic_marks_standin_evaluations_and_standin_runs(run_dir: Path, tmp_path: Path):
    samples = pl.read_parquet(export_run(run_dir, "parquet", tmp_path / "a")["samples"]).to_dicts()
    flagged = {r["origin"] for r in samples if r["synthetic"]}
    assert flagged == {"embedded"}  # only E was judged by the stand-in; no config says more
    traj = pl.read_parquet(export_run(run_dir, "parquet", tmp_path / "b")["trajectories"]).to_dicts()
    assert {r["role"] for r in traj if r["synthetic"]} == {"transformation"}
    (run_dir / "config.yaml").write_text("evaluator:\n  kind: standin\n")
    paths = export_run(run_dir, "parquet", tmp_path / "c")
    assert pl.read_parquet(paths["samples"])["synthetic"].all()
    assert pl.read_parquet(paths["trajectories"])["synthetic"].all()


def test_every_status_has_a_penalty_and_no_failure_is_rewarded():
    assert set(PENALTIES) == {s for s in Status if not s.is_ok}
    assert set(OUTCOME_PENALTIES) == set(ProposalOutcome)
    for status in [*PENALTIES, *OUTCOME_PENALTIES]:
        assert reward(status, None) <= 0.0 and reward(status, None, zero_penalty=True) == 0.0
    assert reward(Status.OK, 1.7) == 1.7
    with pytest.raises(ValueError):
        reward(Status.OK, None)


def test_jsonl_export_through_the_command_line(run_dir: Path):
    result = subprocess.run([sys.executable, "-m", "search.export", str(run_dir), "--format", "jsonl",
                             "--zero-penalty"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "samples:" in result.stdout
    lines = [json.loads(x) for x in (run_dir / "export" / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 9 and set(lines[0]) == set(SAMPLE_SCHEMA)
    assert {x["reward"] for x in lines if x["status"] not in ("OK", "")} == {0.0}
    assert pl.read_ndjson(run_dir / "export" / "trajectories.jsonl").height == 7


def test_export_refuses_a_folder_that_is_not_a_run(tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "search.export", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "no proposals.jsonl" in result.stderr
