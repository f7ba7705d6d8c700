"""The evaluator pool on real Ray actors: a dead actor is replaced and its call retried once,
then recorded as CRASH; an evaluator that raises gives a CRASH verdict that says so (or an
error for other calls) without ending anything; the admitted artifact reaches the actor."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from evaluators.admit import Admitted
from evaluators.api import EvalRequest
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Status
from search.pool import Answer, EvalPool, admission_task


def _drain(pool: EvalPool) -> dict[Any, Answer]:
    answers = {}
    while pool.pending():
        ready, _ = ray.wait(pool.refs(), num_returns=1, timeout=120)
        assert ready, "no evaluator answered within 120 s"
        answer = pool.collect(ready[0])
        if answer is not None:
            answers[answer.call.owner] = answer
    return answers


def test_dead_actor_is_replaced_and_its_request_retried_once(local_ray):
    spec = load_kernel("silu_and_mul")
    baseline = spec.baseline_source()
    killer = baseline + "\n// standin: kill-process\n"
    pool = EvalPool("standin", size=1, retries=1)
    try:
        pool.submit("killer", EvalRequest("silu_and_mul", Variant("silu_and_mul", killer), time=False))
        pool.submit("honest", EvalRequest("silu_and_mul", Variant("silu_and_mul", baseline), time=False))
        answers = _drain(pool)
    finally:
        pool.shutdown()
    assert answers["killer"].value.status is Status.CRASH
    assert "died 2 times" in answers["killer"].value.message
    assert answers["honest"].value.status is Status.OK
    assert pool.replaced == 2  # first death, then the retry's death


def test_evaluator_error_is_a_crash_verdict_and_the_pool_goes_on(local_ray, capsys):
    spec = load_kernel("silu_and_mul")
    pool = EvalPool("standin", size=1, retries=1)
    try:
        # The evaluator itself fails (no such kernel folder): not the kernel's fault.
        pool.submit("broken", EvalRequest("/no/such/kernel", Variant("silu_and_mul", spec.baseline_source())))
        pool.submit("honest", EvalRequest("silu_and_mul", Variant("silu_and_mul", spec.baseline_source()), time=False))
        answers = _drain(pool)
    finally:
        pool.shutdown()
    broken = answers["broken"]
    assert broken.value.status is Status.CRASH and "evaluator error" in broken.value.message
    assert broken.value.variant_id == Variant("silu_and_mul", spec.baseline_source()).id
    assert answers["honest"].value.status is Status.OK
    assert pool.replaced == 0  # the actor did not die; it answered the next call
    assert "evaluator error" in capsys.readouterr().err  # said loudly, not only recorded


def test_admitted_artifact_travels_to_the_evaluator_as_an_object(local_ray, compile_cache):
    spec = load_kernel("silu_and_mul")
    source = spec.baseline_source().replace("block=(256,)", "block=(128,)")
    refs: Any = admission_task.remote("silu_and_mul", source, "float16", {}, spec.search_shapes)
    summary_ref, artifact_ref = refs
    summary = ray.get(summary_ref)
    assert isinstance(summary, Admitted)  # the driver holds the summary, not the cubin
    pool = EvalPool("standin", size=1)
    try:
        pool.submit("with", EvalRequest("silu_and_mul", Variant("silu_and_mul", source)), artifact_ref)
        pool.submit("without", EvalRequest("silu_and_mul", Variant("silu_and_mul", source)))
        answers = _drain(pool)
    finally:
        pool.shutdown()
    with_artifact, without = answers["with"].value, answers["without"].value
    assert with_artifact.status is Status.OK and with_artifact.params == summary.params
    assert [s.candidate_ms for s in with_artifact.shapes] == [s.candidate_ms for s in without.shapes]


def test_a_background_call_runs_beside_an_exclusive_one_on_the_same_actor(local_ray):
    """Compilations made beside the search (search.compile_ahead) neither wait for the actor's
    turn nor hold it: dispatched while an evaluation runs, answered before it ends; the pool's
    room for them is a limit (the rest wait), and a pool without room refuses them."""
    spec = load_kernel("silu_and_mul")
    pool = EvalPool("standin", size=1, latency_s=3.0, background=1)
    order: list[str] = []
    try:
        pool.submit("slow", EvalRequest("silu_and_mul", Variant("silu_and_mul", spec.baseline_source()), time=False))
        for name in ("first", "second"):
            pool.call(lambda reply, error, name=name: order.append(name), "precompile", "silu_and_mul", "float16",
                      "search", "run-x/silu", True, background=True)
        assert len(pool.inflight) == 2 and len(pool.queue) == 1  # the evaluation and one compilation
        assert pool.background_inflight() == 2
        while pool.pending():
            ready, _ = ray.wait(pool.refs(), num_returns=1, timeout=120)
            answer = pool.collect(ready[0])
            if answer is not None and answer.call.method == "evaluate":
                order.append("evaluation")
            elif answer is not None:
                answer.call.owner(answer.value, answer.error)
    finally:
        pool.shutdown()
    assert order == ["first", "second", "evaluation"]
    assert pool.background_inflight() == 0
    bare = EvalPool("standin", size=1)
    try:
        with pytest.raises(ValueError, match="background"):
            bare.call(print, "precompile", "silu_and_mul", "float16", "search", "x", True, background=True)
    finally:
        bare.shutdown()
