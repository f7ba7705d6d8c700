"""The search loop end to end on the CPU: local Ray, the stand-in evaluator, a toy agent.

Also the CLI's error handling and a run killed mid-way and resumed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from kernels.records import EvalRecord, read_jsonl
from kernels.spec import shape_label
from search.config import override
from search.run import (
    REPO_ROOT,
    Prepared,
    build_parser,
    resolve_config,
    resolve_kernels,
    run_search,
)

TOY = "tests.unit.search_toy_agent:ToyAgent"
CLI = [sys.executable, "-m", "search.run"]


def _prepare(tmp_path: Path, *extra: str) -> Prepared:
    args = build_parser().parse_args(
        ["--evaluator", "standin", "--kernel", "silu_and_mul", "--agent", TOY, "--population", "3",
         "--rounds", "2", "--variants", "3", "--trials", "3", "--out", str(tmp_path), *extra]
    )
    config = resolve_config(args)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return Prepared(config, resolve_kernels(config), run_dir, resume=False)


def _records(run_dir: Path) -> list[EvalRecord]:
    return [EvalRecord.from_dict(d) for d in read_jsonl(run_dir / "evaluations.jsonl")]


def test_dispatch_1_keeps_one_kernel_for_every_shape(local_ray, tmp_path):
    prep = _prepare(tmp_path, "--dispatch", "1")
    summary = run_search(prep, "test")
    stages = Counter(r.stage for r in _records(prep.run_dir))
    assert stages["heldout"] == 1 and stages["final"] == 1
    assert summary["kernels"][0]["dispatch"] is None
    assert "dispatch" not in json.loads((prep.run_dir / "best" / "silu_and_mul.json").read_text())


def test_search_end_to_end_with_standin(local_ray, tmp_path, capsys):
    prep = _prepare(tmp_path)
    summary = run_search(prep, "test")
    run = prep.run_dir
    records = _records(run)
    stages = Counter(r.stage for r in records)
    best = json.loads((run / "best" / "silu_and_mul.json").read_text())
    # The winner and each variant dispatched beside it by shape: held-out and final once each.
    members = len(best.get("dispatch", {}).get("members", [])) or 1
    assert stages["screen"] > 3 and stages["full"] >= 1 and stages["heldout"] == members
    assert stages["final"] == members
    assert len({r.key for r in records}) == len(records)  # nothing evaluated twice
    statuses = {r.evaluation.status.value for r in records}
    assert {"OK", "COMPILE_ERROR"} <= statuses  # the toy's broken edit was caught by NVRTC
    # Tuning ran: one variant evaluated at several parameter values, with trial numbers.
    assert any(r.trial is not None and r.trial > 0 for r in records)
    kernel = summary["kernels"][0]
    assert summary["evaluator"] == "standin" and summary["gpu"] == "cpu-standin" and "warning" in summary
    assert kernel["speedup_search"] > 1.0 and kernel["heldout_status"] == "OK"
    assert kernel["lineage"][-1]["author"] == "baseline"
    if members > 1:
        # Each kernel dispatched beside the winner passed the held-out shapes and its final
        # timing on its own; the reported per-shape times are those of each shape's member.
        d = best["dispatch"]
        assert all(m["heldout"]["status"] == "OK" and m["final"]["status"] == "OK" for m in d["members"])
        assert kernel["dispatch"]["table"] == d["table"] and set(d["table"].values()) == set(range(members))
        for s in kernel["shapes"]:
            member = d["members"][d["table"][s["label"]]]
            own = {shape_label(r["shape"]): r["candidate_ms"] for r in member["final"]["shapes"]}
            assert s["best_ms"] == own[s["label"]]
    assert (run / "best" / "silu_and_mul.cu").read_text() == best["variant"]["source"]
    for i, member in enumerate(best.get("dispatch", {}).get("members", [])[1:], start=1):  # beside the winner
        assert (run / "best" / f"silu_and_mul.member{i}.cu").read_text() == member["variant"]["source"]
    report = (run / "report.md").read_text()  # every run writes its report, a stand-in's says synthetic
    assert kernel["winner"] in report and "synthetic" in report and "CUDA event" not in report
    printed = capsys.readouterr().out
    assert "synthetic" in printed and "CUDA event" not in printed and "noise floor" not in printed
    assert [json.loads(line)["round"] for line in (run / "rounds.jsonl").read_text().splitlines()] == [0, 1]
    proposals = list(read_jsonl(run / "proposals.jsonl"))
    assert len(proposals) == 2 * 3 * 3  # rounds x agents x variants
    assert {p["transformation"] for p in proposals} >= {"restrict", "broken"}
    assert len(list(read_jsonl(run / "replies.jsonl"))) == 2 * 3  # rounds x agents
    for name in ("config.yaml", "evaluations.parquet", "best.parquet", "summary.json", "heldout_shapes.json",
                 "attempts.json"):
        assert (run / name).is_file(), name
    # Every held-out evaluation covers the fixed held-out shapes and those drawn for the run.
    spec = prep.kernels[0][0]
    drawn = json.loads((run / "heldout_shapes.json").read_text())["silu_and_mul"]
    assert drawn == [dict(s) for s in spec.draw_heldout(__import__("agents.base").base.derive_seed(
        prep.config.seed, "silu_and_mul", "heldout"))]
    for r in records:
        if r.shape_set == "heldout":
            assert len(r.evaluation.shapes) == len(spec.heldout_shapes) + len(drawn)
    assert "STAND-IN" in printed


def test_winner_failing_heldout_is_not_reported(local_ray, tmp_path):
    prep = _prepare(tmp_path, "--rounds", "1")
    cfg = override(prep.config, {"agent.kind": "tests.unit.search_toy_agent:HeldoutCheater"})
    summary = run_search(Prepared(cfg, prep.kernels, prep.run_dir, False), "test")
    kernel = summary["kernels"][0]
    assert kernel["rejected_on_heldout"], "the cheater should have been the search winner"
    assert kernel["winner"] not in kernel["rejected_on_heldout"]
    assert kernel["heldout_status"] == "OK"


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args",
    [
        ["--population", "0", "--evaluator", "standin"],
        ["--rounds", "many"],
        ["--dtype", "float64"],
        ["--kernel", "no_such_kernel", "--evaluator", "standin"],
        ["--config", "/nonexistent.yaml"],
        ["--resume", "/nonexistent-run"],
        ["--agent", "nomodule.nowhere:Agent", "--kernel", "silu_and_mul", "--evaluator", "standin"],
    ],
)
def test_cli_errors_exit_2_with_one_line(args):
    out = _cli(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_cli_without_gpu_exits_2():
    out = _cli("--kernel", "silu_and_mul", "--agent", TOY, "--evaluator", "gpu")
    assert out.returncode == 2 and "GPU" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_killed_run_resumes_without_loss_or_duplicates(tmp_path):
    config = tmp_path / "slow.yaml"
    config.write_text("evaluator:\n  kind: standin\n  standin_latency_s: 0.4\n")
    args = ["--config", str(config), "--kernel", "silu_and_mul", "--agent", TOY, "--population", "2",
            "--rounds", "3", "--variants", "3", "--trials", "3", "--out", str(tmp_path / "runs")]
    proc = subprocess.Popen([*CLI, *args], cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 90
        evals = None
        while time.time() < deadline:
            found = list((tmp_path / "runs").glob("*/evaluations.jsonl"))
            if found and len(found[0].read_text().splitlines()) >= 4:
                evals = found[0]
                break
            time.sleep(0.2)
        assert evals is not None, "the run wrote no records"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    run_dir = evals.parent
    before = [r.key for r in _records(run_dir)]
    assert not (run_dir / "summary.json").exists(), "the run finished before it was killed"

    out = _cli("--resume", str(run_dir), timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    after = [r.key for r in _records(run_dir)]
    assert after[: len(before)] == before  # nothing lost
    assert len(set(after)) == len(after)  # nothing evaluated twice
    rounds = [json.loads(line)["round"] for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed"] is True and summary["kernels"][0]["heldout_status"] == "OK"


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_short_run_on_the_gpu_evaluator(tmp_path):
    out = _cli("--kernel", "silu_and_mul", "--agent", TOY, "--evaluator", "gpu", "--population", "2",
               "--rounds", "1", "--variants", "3", "--trials", "2", "--out", str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert summary["evaluator"] == "gpu" and summary["gpu"] != "cpu-standin"
    assert summary["kernels"][0]["heldout_status"] == "OK"
