"""Shared test set-up: the ``gpu`` and ``smoke`` markers and a private compile cache.

Tests marked ``@pytest.mark.gpu`` (and every test under ``tests/gpu/``) need a CUDA GPU; on
a machine without one they are skipped with a reason, so ``pytest -q`` passes on CPU-only
CI and ``pytest -m gpu`` on a GPU machine runs exactly them. Slow tests run by default: there
is no opt-in flag to forget.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parent / "gpu"
# ``pytest -q -m smoke``: the quick check a user runs after installing (2 to 4 minutes on 2
# busy cores, measured; the whole suite takes ~40): specs and kernels.check, launch expressions,
# NVRTC and the admission step, validation and verdicts, the stand-in search end to end with
# resume, selection, tuning and records, the agents' conformance and the LLM backend against
# the scripted server, the sandboxes' environments, the layering rules. Tests marked ``slow``
# in these files stay out.
SMOKE_FILES = frozenset({
    "test_spec.py", "test_launch.py", "test_compile.py", "test_admit.py", "test_kernels_check.py",
    "test_kernels_new.py", "test_verdict.py", "test_validate.py", "test_standin.py", "test_search_selection.py",
    "test_search_tuning.py", "test_search_records.py", "test_search_loop.py", "test_llm_parse.py",
    "test_llm_agent.py", "test_conformance.py", "test_layering.py", "test_child_env.py", "test_outcome.py",
    "test_interrupt.py", "test_report_summary.py", "test_readme.py",
})


@lru_cache(maxsize=1)
def cuda_available() -> bool:
    """Whether torch sees a CUDA device (False when torch itself is missing or broken)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken CUDA install must skip GPU tests, not fail collection
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if GPU_DIR in item.path.resolve().parents:
            item.add_marker(pytest.mark.gpu)
        if item.path.name in SMOKE_FILES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.smoke)
        if item.get_closest_marker("gpu") is not None and not cuda_available():
            item.add_marker(skip_gpu)


FAILURE_LOG_ENV = "KERNEL_SEARCH_FAILURE_LOG"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``KERNEL_SEARCH_FAILURE_LOG=FILE``, each failure's traceback is appended to FILE as
    it happens: a run cut short by a time limit (a GPU machine's lease) still leaves the reasons
    of the failures it saw, which pytest itself prints only at the end."""
    path = os.environ.get(FAILURE_LOG_ENV)
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


@pytest.fixture
def compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty compile cache: ``KERNEL_SEARCH_CACHE`` points at a temporary folder.

    Returns:
        The cubin cache folder that :func:`evaluators.compile.default_cache_dir` now returns.
    """
    root = tmp_path / "kernel-search-cache"
    monkeypatch.setenv("KERNEL_SEARCH_CACHE", str(root))
    return root / "cubin"
