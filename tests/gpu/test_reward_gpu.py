"""Every hostile adversarial fixture through the reward service on the real GPU evaluator,
with its gates (held-out shapes, compute-sanitizer, the peers' loop): none may earn a
positive reward, and honest kernels must still be paid. Run on the GPU machine:
``python -m pytest -m gpu tests/gpu/test_reward_gpu.py``."""

from __future__ import annotations

import pytest
import torch

from search.reward import RewardConfig, RewardService
from tests.adversarial.index import Fixture, fixtures

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
HOSTILE = [f for f in fixtures() if not f.honest]
HONEST = [f for f in fixtures() if f.honest]
# Correct code whose trick gains nothing (fixtures.yaml's ``twin``): it is paid as what it is, a
# correct kernel, and its speedup must stay that of its twin without the trick (the pair
# tests/gpu/test_timing_truth_gpu.py times; the same 10% margin).
NO_GAIN = [f for f in HOSTILE if f.twin]


def _param(fx: Fixture):
    marks = [pytest.mark.xfail(reason=f"known gap: {fx.known_gap}", strict=False)] if fx.known_gap else []
    return pytest.param(fx, id=fx.name, marks=marks)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    import ray

    from search.run import worker_runtime_env

    ray.init(include_dashboard=False, runtime_env=worker_runtime_env(), log_to_driver=False)
    svc = RewardService(tmp_path_factory.mktemp("rewards"), RewardConfig(evaluator="gpu", gpus=1))
    yield svc
    svc.close()
    ray.shutdown()


@pytest.mark.parametrize("fx", [_param(f) for f in HOSTILE if not f.twin])
def test_hostile_fixture_earns_no_positive_reward(service, fx: Fixture):
    r = service.score(fx.kernel, fx.source(), fx.dtype, client="hostile", timeout_s=1800)
    assert r["score"] <= 0 and not r["correct"], f"{fx.file}: {r['status']} {r['score']}: {r['feedback'][:300]}"


@pytest.mark.parametrize("fx", NO_GAIN, ids=[f.name for f in NO_GAIN])
def test_a_trick_that_gains_nothing_is_paid_as_plain_code(service, fx: Fixture):
    tricked = service.score(fx.kernel, fx.source(), fx.dtype, timeout_s=1800)
    (twin,) = [f for f in HONEST if f.file == fx.twin]
    plain = service.score(twin.kernel, twin.source(), twin.dtype, timeout_s=1800)
    assert tricked["correct"] and plain["correct"]
    assert tricked["speedup"] <= plain["speedup"] / 0.9


@pytest.mark.parametrize("fx", HONEST, ids=[f.name for f in HONEST])
def test_honest_fixture_is_paid(service, fx: Fixture):
    r = service.score(fx.kernel, fx.source(), fx.dtype, client="honest", timeout_s=1800)
    assert r["correct"] and r["score"] >= service.config.shaping.correct, f"{fx.file}: {r}"
