"""experiments/gpu_steps.sh with a stand-in for python (no GPU): steps run in order, a step cut
by the limit ends the call, the state archive carries what is done into the next call, and
that call resumes the cut sweep instead of starting a new one."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "gpu_steps.sh"

# Logs its arguments; a sweep makes its directory, then sleeps SLEEP seconds (the limit cuts it).
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> calls.txt
case "$*" in
  *search.sweep*--out*) args="$*"; mkdir -p "${args##*--out }"/sweep-1; sleep "${SLEEP:-0}" ;;
  *experiments.codegen_probe*) [ "$FAIL_PROBE" = "${3##*/}" ] && exit 3 ;;
esac
exit 0
"""


def _call(work: Path, out: Path, steps: str, limit: int, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OUT": str(out), "PY": str(work / "py"), "STEPS": steps, "LIMIT": str(limit),
            "RESERVE": "1", "MIN_STEP": "1", **env}
    return subprocess.run(["bash", str(SCRIPT)], cwd=work, env=full, capture_output=True, text=True, timeout=120)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    if shutil.which("timeout") is None:
        pytest.skip("needs coreutils' timeout")
    (tmp_path / "py").write_text(STAND_IN)
    (tmp_path / "py").chmod(0o755)
    return tmp_path


def _hand_back(work: Path, out: Path) -> None:
    """What the next call on a bare machine sees: the tree, and the last call's archive as runs/state.tgz."""
    shutil.rmtree(work / "runs")
    (work / "runs").mkdir()
    shutil.copy(out / "state.tgz", work / "runs" / "state.tgz")


def test_a_cut_step_ends_the_call_and_the_next_call_resumes_it(work: Path):
    first = _call(work, work / "o1", "tests unseen fill", limit=5, SLEEP="60", FILL="x/a")
    assert first.returncode == 0, first.stderr
    assert "unseen: cut by the limit" in first.stdout
    assert (work / "o1" / "done.txt").read_text().split() == ["tests"]  # fill never started
    with tarfile.open(work / "o1" / "state.tgz") as t:
        assert "./unseen/sweep-1" in t.getnames()
    calls = (work / "calls.txt").read_text().splitlines()
    assert calls[0].startswith("-m pytest -m gpu") and "--library experiments/unseen" in calls[1]
    assert len(calls) == 2

    _hand_back(work, work / "o1")
    second = _call(work, work / "o2", "tests unseen fill", limit=60, FILL="x/a x/b", FAIL_PROBE="a")
    assert second.returncode == 0, second.stderr
    assert "tests: done before" in second.stdout
    calls = (work / "calls.txt").read_text().splitlines()[2:]
    assert calls[0] == "-m search.sweep --resume runs/unseen/sweep-1"  # resumed, not started afresh
    # a probe that fails is reported and the step goes on to the next kernel
    assert [c.split()[2] for c in calls[1:]] == ["x/a", "x/b"] and "fill: a failed (rc 3)" in second.stdout
    assert (work / "o2" / "done.txt").read_text().split() == ["fill", "tests", "unseen"]
    assert not (work / "runs" / "state.tgz").exists()


def test_parts_and_gpu_test_ids_reach_their_commands(work: Path):
    r = _call(work, work / "o", "lib tests", limit=30, LIB_KERNELS="silu_and_mul rmsnorm",
              GPU_TESTS="tests/gpu/a.py;tests/unit/b.py::t[x y]")
    assert r.returncode == 0, r.stderr
    calls = (work / "calls.txt").read_text().splitlines()
    assert calls[0].startswith("-m search.sweep --kernel silu_and_mul --kernel rmsnorm --population 8")
    assert calls[1].endswith("tests/gpu/a.py tests/unit/b.py::t[x y]")


def test_the_flashinfer_probe_takes_its_kernels_and_rounds(work: Path):
    r = _call(work, work / "o", "fisetup", limit=30, FI_KERNELS="silu_and_mul gelu_and_mul", FI_ROUNDS="1")
    assert r.returncode == 0, r.stderr
    call = (work / "calls.txt").read_text().splitlines()[0]
    assert call == "-m experiments.flashinfer_setup --rounds 1 --out runs/diag/flashinfer-setup.json silu_and_mul gelu_and_mul"


def test_recipe_maps_run_per_kernel_and_a_kernel_done_is_skipped(work: Path):
    r = _call(work, work / "o", "explore=merge_attn_states_lse,silu_and_mul", limit=30)
    assert r.returncode == 0, r.stderr
    calls = (work / "calls.txt").read_text().splitlines()
    assert calls == ["-m experiments.explore_recipes --kernel merge_attn_states_lse "
                     "--out runs/explore/merge_attn_states_lse/explore-merge_attn_states_lse",
                     "-m experiments.explore_recipes --kernel silu_and_mul --out runs/explore/silu_and_mul/explore-silu_and_mul"]
    assert (work / "o" / "done.txt").read_text().split() == ["explore"]
    # a later call with another list runs only the kernel not mapped yet
    (work / "runs" / ".done" / "explore").unlink()
    _call(work, work / "o2", "explore=silu_and_mul,gelu_and_mul", limit=30)
    assert (work / "calls.txt").read_text().splitlines()[2:] == [
        "-m experiments.explore_recipes --kernel gelu_and_mul --out runs/explore/gelu_and_mul/explore-gelu_and_mul"]


def test_an_unknown_step_stops_the_call(work: Path):
    r = _call(work, work / "o", "tests nonsense unseen", limit=30)
    assert "unknown step: nonsense" in r.stdout and "nonsense: failed" in r.stdout
    assert (work / "o" / "done.txt").read_text().split() == ["tests"]


def test_named_library_parts_sweep_their_own_kernels_into_their_own_folders(work: Path):
    steps = "lib2a=rotary_embedding_neox,topk_softmax lib2b=layernorm"
    first = _call(work, work / "o1", steps, limit=5, SLEEP="60", SWEEP_ARGS="--compile-ahead")
    assert "lib2a: cut by the limit" in first.stdout
    calls = (work / "calls.txt").read_text().splitlines()
    assert calls == ["-m search.sweep --kernel rotary_embedding_neox --kernel topk_softmax --population 8 "
                     "--budget-rounds 5 --compile-ahead --out runs/lib2a"]
    _hand_back(work, work / "o1")
    second = _call(work, work / "o2", steps, limit=60)
    assert second.returncode == 0, second.stderr
    calls = (work / "calls.txt").read_text().splitlines()[1:]
    assert calls == ["-m search.sweep --resume runs/lib2a/sweep-1",
                     "-m search.sweep --kernel layernorm --population 8 --budget-rounds 5 --out runs/lib2b"]
    assert (work / "o2" / "done.txt").read_text().split() == ["lib2a", "lib2b"]
    _hand_back(work, work / "o2")
    third = _call(work, work / "o3", steps, limit=60)
    assert "lib2a: done before" in third.stdout and "lib2b: done before" in third.stdout


def test_end_of_run_parts_are_numbered_and_the_first_is_marked(work: Path):
    r = _call(work, work / "o", "eor=cold,warm eor=warm rewardbench", limit=30)
    assert r.returncode == 0, r.stderr
    calls = (work / "calls.txt").read_text().splitlines()
    assert calls[0] == ("-m experiments.end_of_run_bench --runs cold,warm --first --cache runs/eor/peer-cache "
                        "--out runs/eor/runs --json runs/eor/part-1.json")
    # the stand-in writes no part, so the second list is numbered as a first part again: the
    # numbering follows the parts on disk, not the calls
    assert calls[1].startswith("-m experiments.end_of_run_bench --runs warm --first")
    assert calls[2].startswith("-m experiments.reward_bench --evaluator gpu --gpus 1 --clients 32 --duration-s 300")
    assert sorted((work / "o" / "done.txt").read_text().split()) == ["eor=cold,warm", "eor=warm", "rewardbench"]
