"""CPU tests of the GPU evaluator's parent side: the one admission path, the artifact a caller
hands in, and the peers' loop surviving a kernel of ours that crashes it. The sandbox is
replaced by a scripted one where a GPU would be needed."""

from __future__ import annotations

from typing import Any

import pytest

from evaluators.admit import Artifact, admit
from evaluators.api import EvalRequest
from evaluators.gpu import EvaluatorError, GpuEvaluator
from kernels.launch import DeviceLimits
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Status
from tests.adversarial.index import FIXTURE_DIR

HONEST = (FIXTURE_DIR / "honest_silu_vectorized.cu").read_text()
TOO_MANY_THREADS = (FIXTURE_DIR / "too_many_threads.cu").read_text()


class ScriptedEvaluator(GpuEvaluator):
    """A GpuEvaluator whose sandbox answers from a script: ``crashes(job)`` says whether the
    job faults; every other job times each implementation at 1 ms per shape."""

    def __init__(self, crashes: Any) -> None:
        super().__init__(arch="sm_90", start_timeout_s=5.0)
        self.crashes = crashes
        self.jobs: list[dict[str, Any]] = []

    @property
    def limits(self) -> DeviceLimits:
        return DeviceLimits()

    def _job(self, job: dict[str, Any], timeout_s: float | None = None) -> tuple[str, dict[str, Any]]:
        self.jobs.append(job)
        if self.crashes(job):
            return "result", {"status": "CRASH", "message": "CUDA fault: an illegal instruction", "fatal": True}
        impls = list(job["kernels"]) + (["torch_eager"] if job.get("peers", True) else [])
        times = {name: {"s": 1.0} for name in impls}
        return "result", {"status": "OK", "peers": times, "iqr": times, "errors": {}, "failed": {},
                          "copy_bw_bytes_per_s": 4e12}


def _ours(*names: str) -> dict[str, tuple[str, dict[str, int]]]:
    spec = load_kernel("silu_and_mul")
    return {n: (HONEST if n != "baseline" else spec.baseline_source(), {}) for n in names}


def test_a_kernel_that_crashes_the_peers_loop_is_failed_and_the_others_are_timed(compile_cache):
    ev = ScriptedEvaluator(lambda job: "bad" in job["kernels"])
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=_ours("good", "bad", "baseline"))
    assert reply["failed"]["bad"].startswith("CRASH") and "illegal instruction" in reply["failed"]["bad"]
    assert "bad" not in reply["peers"]
    assert {"good", "baseline", "torch_eager"} <= set(reply["peers"])
    # the whole loop, then each of ours alone without the peers, then the survivors together
    assert [sorted(j["kernels"]) for j in ev.jobs] == [["bad", "baseline", "good"], ["good"], ["bad"], ["baseline"],
                                                       ["baseline", "good"]]
    assert [j.get("peers", True) for j in ev.jobs] == [True, False, False, False, True]
    assert all(j["baseline"]["cubin"] for j in ev.jobs)  # our kernels are verified against the baseline


def test_a_crash_that_needs_two_kernels_still_costs_no_run(compile_cache):
    ev = ScriptedEvaluator(lambda job: {"a", "b"} <= set(job["kernels"]))
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=_ours("a", "b"))
    assert reply["failed"] == {} and reply["separate_loops"]
    assert {"a", "b", "torch_eager"} <= set(reply["peers"])


def test_refused_kernels_of_ours_are_failed_not_errors(compile_cache):
    ev = ScriptedEvaluator(lambda job: False)
    ours = {**_ours("good"), "wide": (TOO_MANY_THREADS, {})}
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=ours)
    assert reply["failed"]["wide"].startswith("RESOURCE_ERROR") and "1024" in reply["failed"]["wide"]
    assert list(ev.jobs[0]["kernels"]) == ["good"]


def test_a_loop_that_fails_without_any_kernel_of_ours_is_an_evaluator_error(compile_cache):
    ev = ScriptedEvaluator(lambda job: True)
    with pytest.raises(EvaluatorError, match="none of our kernels"):
        ev.time_peers_full("silu_and_mul", "float16", ours={})


def test_a_refusal_is_the_verdict_and_starts_no_sandbox(compile_cache):
    ev = GpuEvaluator(arch="sm_90", start_timeout_s=5.0)
    result = ev.evaluate(EvalRequest("silu_and_mul", Variant("silu_and_mul", TOO_MANY_THREADS)))
    assert result.status is Status.RESOURCE_ERROR and "1024" in result.message
    assert ev._worker is None


def _artifact(source: str, params: dict[str, int] | None = None) -> Artifact:
    artifact = admit(load_kernel("silu_and_mul"), source, "float16", params, arch="sm_90")
    assert isinstance(artifact, Artifact), artifact
    return artifact


@pytest.mark.parametrize("change", ["variant", "dtype", "params"])
def test_an_artifact_for_another_request_is_refused_loudly(compile_cache, change):
    ev = GpuEvaluator(arch="sm_90", start_timeout_s=5.0)
    artifact = _artifact(HONEST, {"BLOCK": 128})
    request = EvalRequest("silu_and_mul", Variant("silu_and_mul", HONEST), params={"BLOCK": 128})
    if change == "variant":
        request = EvalRequest("silu_and_mul", Variant("silu_and_mul", HONEST + "\n"), params={"BLOCK": 128})
    elif change == "dtype":
        request = EvalRequest("silu_and_mul", Variant("silu_and_mul", HONEST), params={"BLOCK": 128},
                              dtype="bfloat16")
    else:
        request = EvalRequest("silu_and_mul", Variant("silu_and_mul", HONEST), params={"BLOCK": 256})
    with pytest.raises(EvaluatorError, match="artifact"):
        ev.evaluate(request, artifact)
    assert ev._worker is None
