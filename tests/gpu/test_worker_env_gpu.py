"""GPU test: the sandbox worker that runs candidates holds no secret of its parent in its
environment, and still has the CUDA settings it needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluators.gpu import GpuEvaluator

pytestmark = pytest.mark.gpu


def test_the_gpu_worker_has_no_secret_and_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-gpu-test-secret")
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    ev = GpuEvaluator()
    try:
        assert ev.info()["arch"].startswith("sm_")  # the worker started and saw its GPU
        worker = ev._worker
        assert worker is not None
        environ = Path(f"/proc/{worker.proc.pid}/environ").read_bytes()
        assert b"sk-gpu-test-secret" not in environ
        assert b"CUDA_MODULE_LOADING=LAZY\0" in environ
    finally:
        ev.close()
