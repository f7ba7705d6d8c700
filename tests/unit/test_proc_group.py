"""Helper processes end with what they started (evaluators.proc_group)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from evaluators.proc_group import kill_group, run_group, start_group


def parent_of_a_child(pid_file: Path) -> list[str]:
    """A command whose process starts a child that sleeps two minutes, writes the child's pid to
    ``pid_file`` and sleeps as long: the child stands for a build its parent started."""
    script = ("import subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(120)")
    return [sys.executable, "-c", script]


def wait_for_child(pid_file: Path, within_s: float = 30.0) -> int:
    deadline = time.time() + within_s
    while not pid_file.exists() or not pid_file.read_text():
        assert time.time() < deadline, "the parent never started its child"
        time.sleep(0.05)
    return int(pid_file.read_text())


def alive(pid: int) -> bool:
    """The process runs (a zombie awaiting its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.time() + seconds
    while alive(pid):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_timeout_ends_the_child_and_what_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    start = time.time()
    rc, _, _ = run_group(parent_of_a_child(pid_file), env=dict(os.environ), cwd=tmp_path, timeout_s=3.0)
    assert rc is None and time.time() - start < 30.0
    assert _gone_within(wait_for_child(pid_file), 10.0)


def test_a_command_that_ends_gives_its_code_and_output(tmp_path):
    rc, out, err = run_group([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                             env=dict(os.environ), cwd=tmp_path, timeout_s=60.0)
    assert (rc, out.strip(), err.strip()) == (3, "out", "err")
    rc, out, err = run_group([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
                             env=dict(os.environ), cwd=tmp_path, timeout_s=60.0, merge_stderr=True)
    assert rc == 0 and sorted(out.split()) == ["err", "out"] and err == ""


def test_kill_group_ends_a_group_whose_leader_has_already_ended(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(pid_file)!r}, 'w').write(str(c.pid))")  # the leader ends at once, its child lives on
    proc = start_group([sys.executable, "-c", script], env=dict(os.environ), cwd=tmp_path)
    proc.wait(timeout=30)
    child = wait_for_child(pid_file)
    assert alive(child)
    kill_group(proc)
    assert _gone_within(child, 10.0)
