"""Shared test set-up: the ``gpu`` marker and a private compile cache.

Tests marked ``@pytest.mark.gpu`` (and every test under ``tests/gpu/``) need a CUDA GPU; on
a machine without one they are skipped with a reason, so ``pytest -q`` passes on CPU-only
CI and ``pytest -m gpu`` on a GPU machine runs exactly them. Slow tests run by default: there
is no opt-in flag to forget.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parent / "gpu"


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
        if item.get_closest_marker("gpu") is not None and not cuda_available():
            item.add_marker(skip_gpu)


@pytest.fixture
def compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty compile cache: ``KERNEL_SEARCH_CACHE`` points at a temporary folder.

    Returns:
        The cubin cache folder that :func:`evaluators.compile.default_cache_dir` now returns.
    """
    root = tmp_path / "kernel-search-cache"
    monkeypatch.setenv("KERNEL_SEARCH_CACHE", str(root))
    return root / "cubin"
