"""The library sweep on the CPU: local Ray, the stand-in evaluator, a toy agent.

End to end over a small library (one kernel skipped for its dtype), the table read back with
polars, a finished and a killed sweep resumed without duplicates, and the CLI's errors.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from kernels.records import read_jsonl
from kernels.spec import LIBRARY_DIR
from search.config import ConfigError
from search.report import git_commit
from search.run import REPO_ROOT, UsageError
from search.sweep import (
    SWEEP_FILE,
    TABLE_SCHEMA,
    attempts_text,
    choose_kernels,
    kernel_wall_s,
    main,
)

TOY = "tests.unit.search_toy_agent:ToyAgent"
CLI = [sys.executable, "-m", "search.sweep"]
SMALL = ["--agent", TOY, "--population", "2", "--budget-rounds", "1", "--variants", "2", "--trials", "2"]


@pytest.fixture
def library(tmp_path: Path) -> Path:
    """Two library kernels as they are, and a third that supports bfloat16 only."""
    lib = tmp_path / "lib"
    for name in ("silu_and_mul", "rmsnorm", "gelu_and_mul"):
        shutil.copytree(LIBRARY_DIR / name, lib / name)
    spec = lib / "gelu_and_mul" / "spec.py"
    text = spec.read_text()
    assert 'dtypes=("float16", "bfloat16")' in text
    spec.write_text(text.replace('dtypes=("float16", "bfloat16")', 'dtypes=("bfloat16",)'))
    return lib


def _sweep_dir(out: Path) -> Path:
    found = list(out.glob("sweep-*"))
    assert len(found) == 1, found
    return found[0]


def _keys(sweep_dir: Path) -> list[tuple]:
    meta = json.loads((sweep_dir / SWEEP_FILE).read_text())
    return [(r["variant"]["id"], json.dumps(r["params"], sort_keys=True), r["dtype"], r["stage"], r["shape_set"])
            for r in read_jsonl(sweep_dir / meta["run_dir"] / "evaluations.jsonl")]


def test_choose_kernels_skips_only_unnamed_kernels_without_the_dtype(library):
    refs, skipped = choose_kernels(library, None, "float16")
    assert [Path(r).name for r in refs] == ["rmsnorm", "silu_and_mul"]
    assert list(skipped) == ["gelu_and_mul"] and "bfloat16" in skipped["gelu_and_mul"]
    with pytest.raises(ConfigError, match="gelu_and_mul"):
        choose_kernels(library, ["gelu_and_mul"], "float16")
    with pytest.raises(UsageError, match="no kernel nope"):
        choose_kernels(library, ["nope"], "float16")
    assert choose_kernels(None, ["rmsnorm"], "float16") == (["rmsnorm"], {})


def test_kernel_wall_time_leaves_out_the_time_a_killed_sweep_was_down():
    attempts = [{"start": 100.0, "end": None}, {"start": 500.0, "end": 560.0}]
    assert kernel_wall_s([110.0, 130.0, 510.0, 540.0], attempts) == pytest.approx(30.0 + 40.0)
    assert kernel_wall_s([120.0], attempts) == pytest.approx(20.0)
    assert kernel_wall_s([], attempts) == 0.0


def test_sweep_end_to_end_then_resume_of_the_finished_sweep(local_ray, library, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["--evaluator", "standin", "--library", str(library), *SMALL, "--out", str(out)]) == 0
    sweep = _sweep_dir(out)
    table = pl.read_parquet(sweep / "sweep.parquet")
    assert dict(table.schema) == TABLE_SCHEMA
    assert table["kernel"].to_list() == ["gelu_and_mul", "rmsnorm", "silu_and_mul"]
    searched = table.filter(pl.col("note") == "")
    assert searched["kernel"].to_list() == ["rmsnorm", "silu_and_mul"]
    assert searched["heldout_status"].to_list() == ["OK", "OK"]
    assert all(s > 0 for s in searched["speedup_vs_baseline"])
    assert searched["speedup_vs_torch_compile"].null_count() == 2  # the stand-in times no peers
    assert all(n >= 1 for n in searched["variants_evaluated"]) and all(w > 0 for w in searched["wall_s"])
    assert searched["cost_usd"].to_list() == [0.0, 0.0] and searched["prompt_tokens"].to_list() == [0, 0]
    for row in searched.iter_rows(named=True):
        labels = [s["label"] for s in row["shapes"]]
        assert labels and row["largest_shape"] in labels
        biggest = max(row["shapes"], key=lambda s: s["bytes_moved"])
        assert row["copy_bw_fraction_largest"] == biggest["copy_bw_fraction"] > 0
    skipped = table.filter(pl.col("kernel") == "gelu_and_mul").row(0, named=True)
    assert skipped["note"].startswith("skipped") and skipped["winner"] is None
    md = (sweep / "sweep.md").read_text()
    assert "STAND-IN" in md and all(k in md for k in ("gelu_and_mul", "rmsnorm", "silu_and_mul"))
    (attempt,) = json.loads((sweep / SWEEP_FILE).read_text())["attempts"]
    assert attempt["git_commit"] == git_commit(REPO_ROOT)
    assert f"({attempt['date']}, at {attempt['git_commit'][:7]})" in md

    before = _keys(sweep)
    assert len(set(before)) == len(before)
    assert main(["--resume", str(sweep)]) == 0
    assert _keys(sweep) == before  # a finished sweep runs nothing again
    assert pl.read_parquet(sweep / "sweep.parquet").equals(table)
    assert len(json.loads((sweep / SWEEP_FILE).read_text())["attempts"]) == 1


def test_the_report_says_each_attempts_commit_or_that_it_was_not_recorded():
    attempts = [{"command": "python -m search.sweep --out runs", "date": "2026-12-02T17:20:27+00:00"},
                {"command": "python -m search.sweep --resume runs/s", "date": "2026-12-03T09:00:00+00:00",
                 "git_commit": "93caf7b0123"}]
    assert attempts_text(attempts) == ("`python -m search.sweep --out runs` (2026-12-02T17:20:27+00:00, commit not "
                                       "recorded); `python -m search.sweep --resume runs/s` "
                                       "(2026-12-03T09:00:00+00:00, at 93caf7b)")


def test_killed_sweep_resumes_without_loss_or_duplicates(local_ray, tmp_path):
    config = tmp_path / "slow.yaml"
    config.write_text("evaluator:\n  kind: standin\n  standin_latency_s: 0.3\n")
    out = tmp_path / "runs"
    args = ["--config", str(config), "--kernel", "silu_and_mul", "--kernel", "rmsnorm", *SMALL,
            "--budget-rounds", "2", "--out", str(out)]
    proc = subprocess.Popen([*CLI, *args], cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline, sweep = time.time() + 90, None
        while time.time() < deadline:
            found = list(out.glob("sweep-*/sweep-*/evaluations.jsonl"))
            if found and len(found[0].read_text().splitlines()) >= 4:
                sweep = found[0].parent.parent
                break
            time.sleep(0.2)
        assert sweep is not None, "the sweep wrote no records"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (sweep / "sweep.parquet").exists(), "the sweep finished before it was killed"
    before = _keys(sweep)

    assert main(["--resume", str(sweep)]) == 0
    after = _keys(sweep)
    assert after[: len(before)] == before  # nothing lost
    assert len(set(after)) == len(after)  # nothing evaluated twice
    table = pl.read_parquet(sweep / "sweep.parquet")
    assert table["kernel"].to_list() == ["rmsnorm", "silu_and_mul"]
    attempts = json.loads((sweep / SWEEP_FILE).read_text())["attempts"]
    assert [a["end"] is None for a in attempts] == [True, False]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--budget-rounds", "0", "--evaluator", "standin"], "search.rounds"),
        (["--population", "many"], "invalid int"),
        (["--dtype", "float64"], "invalid choice"),
        (["--kernel", "no_such_kernel", "--evaluator", "standin"], "no_such_kernel"),
        (["--library", "/nonexistent-library", "--evaluator", "standin"], "not a folder"),
        (["--resume", "/nonexistent-sweep"], "not a sweep directory"),
        (["--resume", "/nonexistent-sweep", "--kernel", "rmsnorm"], "drop --kernel"),
        (["--agent", "nomodule.nowhere:Agent", "--kernel", "rmsnorm", "--evaluator", "standin"], "nomodule"),
    ],
)
def test_cli_errors_exit_2_with_one_line(args, says, tmp_path):
    out = _cli(*args, "--out", str(tmp_path)) if "--resume" not in args else _cli(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], out.stderr
    assert not list(tmp_path.glob("sweep-*")), "a sweep that cannot start leaves no directory"
