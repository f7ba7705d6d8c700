"""Helper processes that end with everything they started.

A process the evaluator starts may start others in turn (compute-sanitizer runs the launcher as
its child; FlashInfer's first call runs ninja, and ninja runs nvcc with a thread per core).
Killing only the process we started leaves those running, beside the timed loops that follow.
Each helper therefore leads a process group of its own, and is ended by killing the group.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any


def start_group(cmd: Sequence[str], *, env: Mapping[str, str], cwd: str | Path,
                stdout: int | IO[Any] | None = subprocess.PIPE, stderr: int | IO[Any] | None = subprocess.PIPE,
                text: bool = False) -> subprocess.Popen[Any]:
    """Starts ``cmd`` as the leader of a new process group (a new session)."""
    return subprocess.Popen(list(cmd), stdout=stdout, stderr=stderr, env=dict(env), cwd=cwd, text=text,
                            start_new_session=True)


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """Kills ``proc``'s process group, whatever of it still runs, then ``proc`` itself if it
    leads no group (it was not started by :func:`start_group`); does not reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # no such group: every process of it has ended
    if proc.poll() is None:
        proc.kill()


def run_group(cmd: Sequence[str], *, env: Mapping[str, str], cwd: str | Path, timeout_s: float,
              merge_stderr: bool = False) -> tuple[int | None, str, str]:
    """Runs ``cmd`` in a process group of its own to its end or ``timeout_s``, whichever comes
    first; on the timeout the whole group is killed. Returns (exit code, None on the timeout;
    stdout; stderr, empty when ``merge_stderr`` sends it to stdout)."""
    proc = start_group(cmd, env=env, cwd=cwd, stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out or "", err or ""
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        return None, out or "", err or ""
