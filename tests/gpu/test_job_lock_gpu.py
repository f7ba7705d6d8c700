"""GPU test: the pool's evaluator holds its job lock alone through every job, so that the
autotuning benchmarks of compilations made beside the search (which hold the same lock alone,
search.compile_ahead) never run beside an evaluation, nor an evaluation beside them."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import pytest

from evaluators.api import EvalRequest
from evaluators.gpu import GpuEvaluator
from evaluators.gpu_turns import turns
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Status

pytestmark = pytest.mark.gpu


def test_an_evaluation_waits_for_a_benchmark_and_a_benchmark_for_an_evaluation(tmp_path) -> None:
    lock = tmp_path / "benchmarks.lock"
    request = EvalRequest("silu_and_mul", Variant("silu_and_mul", load_kernel("silu_and_mul").baseline_source()))
    ev = GpuEvaluator(step_timeout_s=30.0, job_lock=str(lock))
    try:
        ev.info()  # the worker is up before the clock starts
        got: dict[str, object] = {}
        worker = threading.Thread(target=lambda: got.setdefault("first", ev.evaluate(request)))
        with turns(lock).alone():  # a benchmark holds the lock
            worker.start()
            time.sleep(12.0)  # past two of the worker's heartbeats while it waits
            assert "first" not in got  # the evaluation has not run beside it
        worker.join(timeout=300)
        assert getattr(got.get("first"), "status", None) is Status.OK, got
        # Now the other way: while an evaluation runs, the lock cannot be had.
        worker = threading.Thread(target=lambda: got.setdefault("second", ev.evaluate(request)))
        refused = 0
        fd = os.open(lock, os.O_RDWR)
        try:
            worker.start()
            while worker.is_alive():
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                except BlockingIOError:
                    refused += 1
                time.sleep(0.01)
        finally:
            os.close(fd)
        assert getattr(got.get("second"), "status", None) is Status.OK, got
        assert refused > 0
    finally:
        ev.close()
