"""evaluators/ninja_turns.py: the ninja shim on a child's PATH runs the real ninja one at a
time per build folder, and at once for different folders (real processes; the "real ninja"
here is a script that notes when it starts and ends)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evaluators.child_env import run_environment
from evaluators.ninja_turns import REAL, environment, shim_folder

RECORDER = """#!{python}
import os, sys, time
args = sys.argv[1:]
folder = args[args.index("-C") + 1]
with open(os.path.join(folder, "runs.txt"), "a") as f:
    f.write(f"start {{time.time()}}\\n"); f.flush(); time.sleep(0.6); f.write(f"end {{time.time()}}\\n")
print("ran", *args)
"""


@pytest.fixture
def recorder(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ninja = bin_dir / "ninja"
    ninja.write_text(RECORDER.format(python=sys.executable))
    ninja.chmod(0o755)
    return environment({**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})


def _spans(folder: Path) -> list[tuple[float, float]]:
    lines = (folder / "runs.txt").read_text().split()
    times = [float(v) for v in lines[1::2]]
    return list(zip(times[0::2], times[1::2], strict=True))


def test_builds_in_one_folder_take_turns_and_other_folders_do_not_wait(recorder: dict[str, str], tmp_path: Path):
    assert Path(recorder[REAL]).parent == tmp_path / "bin"
    assert shutil.which("ninja", path=recorder["PATH"]) != recorder[REAL]  # the shim comes first
    shared, other = tmp_path / "jit", tmp_path / "elsewhere"
    shared.mkdir()
    other.mkdir()
    # one of the three with a TMPDIR of its own: the lock lies in the build folder, found all the same
    envs = [recorder, {**recorder, "TMPDIR": str(tmp_path)}, recorder, recorder]
    procs = [subprocess.Popen(["ninja", "-v", "-C", str(folder), "-f", "build.ninja"], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, text=True)
             for folder, env in zip((shared, shared, shared, other), envs, strict=True)]
    start = time.time()
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs) and all(o.startswith("ran -v -C") for o in outs)
    spans = sorted(_spans(shared))
    assert len(spans) == 3
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    assert (shared / ".kernel-search-ninja.lock").is_file()
    (o_start, _), = _spans(other)
    assert o_start - start < 1.0  # the other folder's build did not wait for the three


def test_the_environment_of_candidate_processes_has_the_shim_once(recorder: dict[str, str]):
    again = environment(recorder)
    assert again["PATH"] == recorder["PATH"] and again[REAL] == recorder[REAL]
    child = run_environment()
    if shutil.which("ninja"):
        assert child[REAL] == shutil.which("ninja")
        assert child["PATH"].split(os.pathsep)[0] == str(shim_folder(sys.executable))
    none = environment({"PATH": ""})
    assert REAL not in none  # no ninja on that PATH: nothing to take turns for
