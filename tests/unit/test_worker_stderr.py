"""The sandbox worker's stderr comes back with its death (evaluators.gpu._Worker): a process
killed by a signal names the Python frames it was in, and one that cannot start says why.
Real processes; the worker is a stand-in (tests/unit/segfault_worker.py) where a GPU would be
needed."""

from __future__ import annotations

import pytest
import torch

from evaluators import gpu
from evaluators.gpu import EvaluatorError, _Worker


def test_a_worker_killed_by_a_signal_names_where(monkeypatch):
    monkeypatch.setattr(gpu, "WORKER_MODULE", "tests.unit.segfault_worker")
    worker = _Worker(device=0, start_timeout_s=60)
    try:
        kind, died = worker.run({"type": "peers"}, step_timeout_s=60)
    finally:
        worker.kill()
    assert kind == "died" and died["exitcode"] == -11
    assert died["last_step"] == "call of peer flashinfer on [33, 32, 96]"
    assert "Segmentation fault" in died["stderr"] and "segfault_worker.py" in died["stderr"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the real worker starts where there is a GPU")
def test_a_worker_that_cannot_start_says_why():
    with pytest.raises(EvaluatorError, match="exited while starting") as raised:
        _Worker(device=0, start_timeout_s=120)
    assert "Error" in str(raised.value)  # the exception the worker died of, from its stderr
