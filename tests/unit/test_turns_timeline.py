"""experiments/turns_timeline.py: a run's GPU-lock records laid out on one time axis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evaluators.gpu_turns import TIMELINE_ENV, GpuTurns
from experiments.turns_timeline import lay_out

ROOT = Path(__file__).resolve().parents[2]


def test_the_share_that_kept_a_timing_waiting_is_named_with_its_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    log = tmp_path / "turns"
    log.mkdir()
    monkeypatch.setenv(TIMELINE_ENV, str(log))
    path = tmp_path / "gpu.lock"
    # Another process sets up for 0.8 s (a share), announcing when it holds it.
    setup = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from evaluators.gpu_turns import GpuTurns; t = GpuTurns(sys.argv[1]);"
         " t.hold_shared(); print('in', flush=True); time.sleep(0.8)", str(path)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert setup.stdout is not None and setup.stdout.readline().strip() == "in"
    hold = GpuTurns(path)
    with hold.alone(waiting=lambda: None, every_s=5.0):
        time.sleep(0.3)  # timing
    setup.wait()
    report = lay_out(log)
    assert report["lock"] == "gpu.lock" and report["processes"] == 2
    assert 0.3 <= report["alone_s"] < 0.6
    assert 0.4 <= report["blocked_s"] <= 0.9
    (blocker,) = report["blockers"]
    assert blocker["pid"] == setup.pid and blocker["argv"].startswith("-c")  # python -c's argv
    # Blocked while it held its share, and for the poll's few milliseconds after it let go.
    assert report["blocked_s"] - 0.1 <= blocker["shared_s"] <= report["blocked_s"]


def test_a_folder_without_records_says_so(tmp_path: Path):
    assert lay_out(tmp_path) == {"folder": str(tmp_path), "lock": None, "processes": 0}
