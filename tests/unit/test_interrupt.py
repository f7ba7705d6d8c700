"""Ctrl-C on ``search.run``: the run folder is named at start, and the interrupt leaves one
line with the command that continues the run (exit code 130), not a traceback."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from search.run import REPO_ROOT, InterruptWatch, interrupted_line


def test_the_interrupt_line_names_the_resume_command_or_that_nothing_started(tmp_path: Path) -> None:
    assert interrupted_line(tmp_path) == f"interrupted before the search started; nothing to resume in {tmp_path}"
    (tmp_path / "config.yaml").write_text("{}")
    assert interrupted_line(tmp_path).endswith(f"continue with: python -m search.run --resume {tmp_path}")


def test_a_ctrl_c_where_python_would_drop_it_is_noted_and_raised_on_the_next_check() -> None:
    """Inside the logging module (its lock release runs as an at-fork hook after a subprocess
    starts) or a finalizer, a KeyboardInterrupt would be printed as "Exception ignored" with a
    traceback and lost: the handler only notes it there; elsewhere it raises at once."""
    def frame_in(module: str, function: str = "f") -> object:
        scope: dict[str, object] = {"__name__": module, "sys": sys}
        exec(f"def {function}():\n    return sys._getframe()", scope)  # noqa: S102 - a frame with these globals
        return scope[function]()  # type: ignore[operator]

    watch = InterruptWatch()
    watch._handler(signal.SIGINT, frame_in("logging", "_releaseLock"))
    watch._handler(signal.SIGINT, frame_in("somewhere", "__del__"))
    assert watch.seen
    with pytest.raises(KeyboardInterrupt):
        watch.check()
    with pytest.raises(KeyboardInterrupt):
        InterruptWatch()._handler(signal.SIGINT, frame_in("search.controller"))


@pytest.mark.slow
def test_ctrl_c_prints_the_resume_command_and_the_command_resumes(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "search.run", "--kernel", "silu_and_mul", "--evaluator", "standin",
           "--population", "1", "--rounds", "3", "--out", str(out)]
    # Its own session: SIGINT to the group is what a terminal's Ctrl-C does (Ray's processes get it too).
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not list(out.glob("*/evaluations.jsonl")):
            time.sleep(0.2)
        assert list(out.glob("*/evaluations.jsonl")), "the run wrote no records"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    (run_dir,) = out.iterdir()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130, err[-3000:]
    assert lines[0] == f"run directory: {run_dir}"
    assert lines[-1] == f"interrupted; continue with: python -m search.run --resume {run_dir}"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    resumed = subprocess.run(shlex.split(lines[-1].split(": ", 1)[1]), cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=300, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run_dir / "summary.json").is_file()


def test_ctrl_c_on_a_sweep_prints_its_resume_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from search import sweep

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_sweep", interrupted)
    assert sweep.main(["--kernel", "silu_and_mul", "--evaluator", "standin", "--out", str(tmp_path)]) == 130
    (sweep_dir,) = tmp_path.iterdir()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"interrupted; continue with: python -m search.sweep --resume {sweep_dir}"
