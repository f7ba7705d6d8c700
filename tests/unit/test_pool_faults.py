"""An evaluator actor whose process dies is replaced; its request is retried once, then
recorded as CRASH, and the other requests are evaluated normally (real Ray actors)."""

from __future__ import annotations

import ray

from evaluators.api import EvalRequest
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Status
from search.pool import EvalPool


def _drain(pool: EvalPool) -> dict[str, tuple[Status, str]]:
    verdicts = {}
    while pool.pending():
        ready, _ = ray.wait(pool.refs(), num_returns=1, timeout=120)
        assert ready, "no evaluator answered within 120 s"
        out = pool.collect(ready[0])
        if out is not None:
            job, evaluation, _ = out
            verdicts[job] = (evaluation.status, evaluation.message)
    return verdicts


def test_dead_actor_is_replaced_and_its_request_retried_once(local_ray):
    spec = load_kernel("silu_and_mul")
    baseline = spec.baseline_source()
    killer = baseline + "\n// standin: kill-process\n"
    pool = EvalPool("standin", size=1, retries=1)
    try:
        pool.submit("killer", EvalRequest("silu_and_mul", Variant("silu_and_mul", killer), time=False))
        pool.submit("honest", EvalRequest("silu_and_mul", Variant("silu_and_mul", baseline), time=False))
        verdicts = _drain(pool)
    finally:
        pool.shutdown()
    assert verdicts["killer"][0] is Status.CRASH
    assert "died twice" in verdicts["killer"][1]
    assert verdicts["honest"][0] is Status.OK
    assert pool.replaced == 2  # first death, then the retry's death
