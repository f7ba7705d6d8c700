"""tests/conftest.py: KERNEL_SEARCH_FAILURE_LOG gets each failure's traceback while the run goes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_failure_is_written_before_the_run_ends(tmp_path: Path):
    (tmp_path / "test_sample.py").write_text(
        "import os, pathlib\n"
        "def test_fails():\n    assert 1 + 1 == 3, 'arithmetic'\n"
        "def test_log_already_has_it():\n"
        "    assert 'arithmetic' in pathlib.Path(os.environ['KERNEL_SEARCH_FAILURE_LOG']).read_text()\n"
        "def test_passes():\n    pass\n")
    log = tmp_path / "failures.log"
    env = {**os.environ, "KERNEL_SEARCH_FAILURE_LOG": str(log), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           str(tmp_path / "test_sample.py")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout[-2000:]
    text = log.read_text()
    assert text.count("=== ") == 1 and "test_fails (call)" in text and "arithmetic" in text
