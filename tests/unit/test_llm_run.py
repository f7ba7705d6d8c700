"""The LLM agent inside the search run, on the CPU: preflight at start-up, the tester's extra
shapes (search only, recorded, reused on resume), and the scripted demonstration end to end.

The search runs as a real ``python -m search.run`` subprocess (local Ray, stand-in evaluator)
against the scripted OpenAI-compatible server of ``agents/llm/scripted_server.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agents.llm.scripted_server import ScriptedLLMServer
from evaluators.api import EvalRequest
from evaluators.standin import StandinEvaluator
from experiments import llm_demo
from kernels.records import ShapeSet, Stage, read_evaluations
from kernels.spec import load_kernel, shape_label
from kernels.variant import Variant
from search.export import export_run
from search.proposal_records import read_calls
from search.run import EXTRA_SHAPES_FILE, REPO_ROOT

SPEC = load_kernel("silu_and_mul")
SEARCH = [shape_label(s) for s in SPEC.search_shapes]
HELDOUT = [shape_label(s) for s in SPEC.heldout_shapes]
EXTRA = shape_label(llm_demo.EXTRA_SHAPE)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, dict]:
    """The demonstration with the stand-in evaluator: (exit code, its out folder, its report)."""
    out = tmp_path_factory.mktemp("llm-demo")
    code = llm_demo.main(["--evaluator", "standin", "--out", str(out), "--timeout-s", "300"])
    return code, out, json.loads((out / "llm-demo.json").read_text())


def _labels(record) -> list[str]:
    return [shape_label(s.shape) for s in record.evaluation.shapes]


def test_demo_runs_end_to_end_with_the_standin(demo):
    code, out, report = demo
    assert code == 0, report.get("stderr_tail") or report["checks"]
    assert report["ok"] and report["checks"] and all(report["checks"].values())
    assert report["winner"] == report["expected_variant"] == Variant("silu_and_mul", llm_demo.VARIANT_FILE.read_text()).id
    assert [c["role"] for c in report["chain"]] == ["tester", "planner", "coder"]
    assert report["served_roles"] == ["tester", "planner", "coder"]
    assert all(c["prompt_tokens"] > 0 and c["completion_tokens"] > 0 and c["latency_s"] > 0 for c in report["chain"])
    assert report["gpu"] == "cpu-standin" and "STAND-IN" in report["warning"]
    assert report["speedup_search"] > 1.0
    md = (out / "llm-demo.md").read_text()
    assert report["winner"] in md and "| coder |" in md and "STAND-IN" in md


def test_extra_shapes_join_search_evaluations_and_never_heldout(demo):
    _, _, report = demo
    run_dir = Path(report["run_dir"])
    records = read_evaluations(run_dir / "evaluations.jsonl")
    search = [r for r in records if r.shape_set is ShapeSet.SEARCH and r.evaluation.shapes]
    heldout = [r for r in records if r.shape_set is ShapeSet.HELDOUT and r.evaluation.shapes]
    assert {r.stage for r in search} == {Stage.SCREEN, Stage.FULL, Stage.FINAL} and heldout
    # Every search evaluation, the baseline's included, has the tester's shape after the spec's.
    assert any(r.variant.author == "baseline" for r in search)
    assert all(_labels(r) == [*SEARCH, EXTRA] for r in search)
    # Held-out evaluations: the spec's held-out shapes first (the run may draw more), never the tester's.
    assert all(_labels(r)[: len(HELDOUT)] == HELDOUT and EXTRA not in _labels(r) for r in heldout)
    assert json.loads((run_dir / EXTRA_SHAPES_FILE).read_text()) == {"silu_and_mul": [llm_demo.EXTRA_SHAPE]}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["extra_shapes"] == {"silu_and_mul": [llm_demo.EXTRA_SHAPE]}
    assert [s["label"] for s in summary["kernels"][0]["shapes"]] == [*SEARCH, EXTRA]  # the final timing
    # The agents are told about it too: the planner's prompt lists it among the search shapes.
    planner = next(c for c in read_calls(run_dir / "llm_calls.jsonl") if c.role == "planner")
    assert EXTRA in planner.messages[1]["content"]


def test_export_of_the_demo_run_flags_synthetic_rewards_and_keeps_the_tester(demo, tmp_path):
    _, _, report = demo
    paths = export_run(Path(report["run_dir"]), "jsonl", tmp_path / "export")
    samples = [json.loads(x) for x in paths["samples"].read_text().splitlines()]
    trajectories = [json.loads(x) for x in paths["trajectories"].read_text().splitlines()]
    assert sorted(r["role"] for r in samples) == ["coder", "planner", "tester"]
    assert all(r["synthetic"] for r in samples + trajectories)  # the stand-in judged every variant
    tester = next(r for r in samples if r["role"] == "tester")
    assert tester["shapes_accepted"] == 1 and tester["reward"] == 1.0 and tester["kernel"] == "silu_and_mul"
    assert {r["role"] for r in trajectories} == {"planner", "coder"}
    for r in samples + trajectories:
        roles = [m["role"] for m in r["messages"]]
        assert roles[0] == "system" and "system" not in roles[1:], roles


def test_request_shapes_are_the_spec_set_then_the_extras(tmp_path):
    # The run decides which extras go where: the tester's to search requests, drawn held-out
    # shapes to held-out requests; the request itself appends what it is given.
    extra = ({"num_tokens": 3, "d": 4104},)
    base = Variant("silu_and_mul", SPEC.baseline_source())
    search = EvalRequest("silu_and_mul", base, extra_shapes=extra)
    held = EvalRequest("silu_and_mul", base, shape_set="heldout")
    assert search.shapes(SPEC) == (*SPEC.search_shapes, *extra)
    assert held.shapes(SPEC) == SPEC.heldout_shapes
    evaluator = StandinEvaluator(cache_dir=tmp_path)
    assert [s.shape for s in evaluator.evaluate(search).shapes][-1] == extra[0]
    assert [s.shape for s in evaluator.evaluate(held).shapes] == list(SPEC.heldout_shapes)


def test_resume_reuses_recorded_extra_shapes_without_asking_the_tester(demo, tmp_path):
    _, _, report = demo
    run_dir = tmp_path / "runs" / Path(report["run_dir"]).name
    shutil.copytree(report["run_dir"], run_dir)
    # As if killed before its end (a finished run, summary.json written last, is left untouched).
    (run_dir / "summary.json").unlink()
    faster = SPEC.baseline_source().replace("expf(", "__expf(")
    replies = llm_demo.scripted_replies(faster)
    del replies["tester"]  # asking the tester again would get a 500 and leave a record
    with ScriptedLLMServer(api_key=llm_demo.API_KEY, models=[llm_demo.MODEL],
                           responder=llm_demo.make_responder(replies)) as server:
        out = subprocess.run([sys.executable, "-m", "search.run", "--resume", str(run_dir), "--rounds", "2"],
                             cwd=REPO_ROOT, env=llm_demo.server_env(server), capture_output=True, text=True,
                             timeout=240)
        served = [llm_demo.role_of(r["body"]) for r in server.chat_requests()]
    assert out.returncode == 0, out.stderr[-2000:]
    assert served == ["planner", "coder"]  # the second round only; no tester call
    calls = read_calls(run_dir / "llm_calls.jsonl")
    assert [c.role for c in calls if c.is_tester] == ["tester"]
    new = [r for r in read_evaluations(run_dir / "evaluations.jsonl") if r.variant.id == Variant("silu_and_mul", faster).id]
    assert new and all(_labels(r) == [*SEARCH, EXTRA] for r in new if r.shape_set is ShapeSet.SEARCH)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed"] is True and summary["extra_shapes"] == {"silu_and_mul": [llm_demo.EXTRA_SHAPE]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_llm(base_url: str | None, key: str | None, out: Path, model: str = "scripted", more: tuple[str, ...] = (),
             timeout_s: float = 30) -> subprocess.CompletedProcess:
    """``search.run`` with the LLM agent; ``None`` leaves OPENAI_BASE_URL / OPENAI_API_KEY unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    env.update({k: v for k, v in (("OPENAI_BASE_URL", base_url), ("OPENAI_API_KEY", key)) if v is not None})
    cmd = [sys.executable, "-m", "search.run", "--kernel", "silu_and_mul", "--agent", "llm", "--model", model,
           "--evaluator", "standin", "--out", str(out), *more]
    # 30 s bounds a start-up check; the client's own timeouts and retries would take minutes.
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.parametrize("case", ["closed-port", "wrong-key", "unknown-model", "no-key-openai", "no-key-local"])
def test_preflight_failure_exits_2_with_one_line_before_anything_starts(tmp_path, case):
    out = tmp_path / "runs"
    with ScriptedLLMServer(api_key="right-key", models=["scripted"]) as server:
        if case == "closed-port":
            proc = _run_llm(f"http://127.0.0.1:{_free_port()}/v1", "right-key", out)
        elif case == "wrong-key":
            proc = _run_llm(server.base_url, "wrong-key", out)
        elif case == "no-key-openai":  # OpenAI's endpoint: the missing key is named before any network
            proc = _run_llm(None, None, out)
        elif case == "no-key-local":
            proc = _run_llm(server.base_url, None, out)
        else:
            proc = _run_llm(server.base_url, "right-key", out, model="no-such-model")
        assert not server.chat_requests()
    expected = {"closed-port": "cannot reach", "wrong-key": "refused the API key", "unknown-model": "no-such-model",
                "no-key-openai": "no API key: OPENAI_API_KEY is not set",
                "no-key-local": "wants an API key and none is set"}
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: LLM endpoint check failed"), proc.stderr
    assert expected[case] in lines[0] and "right-key" not in lines[0]
    assert not out.exists() or not any(out.iterdir())  # no run directory, no Ray


def test_a_run_whose_every_proposal_fails_says_so_and_exits_1(tmp_path):
    """An endpoint that answers without code: the baseline is no success to report."""
    out = tmp_path / "runs"
    with ScriptedLLMServer(api_key="k", models=["scripted"],
                           responder=lambda body: {"reply": "I cannot help with that."}) as server:
        proc = _run_llm(server.base_url, "k", out, more=("--population", "1", "--rounds", "1", "--variants", "1"),
                        timeout_s=300)
    assert proc.returncode == 1, proc.stderr
    assert "NO PROPOSAL ADMITTED: none of 1 proposal(s) compiled and ran" in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no proposal was admitted for silu_and_mul"), proc.stderr
    (run_dir,) = out.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kernels"][0]["proposals"] == {"proposals": 1, "failed": 1, "admitted": 0, "correct": 0,
                                                  "reasons": ["1 x planner: the planner's reply held no suggestions"]}


def test_the_demo_writes_under_runs_unless_told(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seen = []

    def fake_run_demo(evaluator, out, timeout_s, command):
        seen.append(out)
        return {"checks": {"ran": True}, "ok": True, "returncode": 0}

    monkeypatch.setattr(llm_demo, "run_demo", fake_run_demo)
    assert llm_demo.main(["--evaluator", "standin"]) == 0
    (out,) = seen
    assert out.parent == tmp_path / "runs" and out.name.startswith("llm-demo-")
    assert (out / "llm-demo.json").is_file() and not (tmp_path / "experiments").exists()
