"""The reward service on the CPU stand-in evaluator: verdicts become rewards through the
search's pool and records, identical sources are answered from the records, a crashed
evaluator gives a verdict and is replaced, and the shaping never pays a failure."""

from __future__ import annotations

import concurrent.futures
import math

import pytest

from kernels.records import read_evaluations, read_jsonl
from kernels.spec import load_kernel
from kernels.verdict import Status
from search.reward import RewardConfig, RewardRequestError, RewardService
from search.reward_queue import FairQueue
from search.reward_shaping import Shaping, ShapingError

BASELINE = load_kernel("silu_and_mul").baseline_source()


def test_shaping_orders_outcomes_and_refuses_a_paying_failure():
    s = Shaping()
    assert s.score(Status.OK, 0.5) == s.correct == s.score(Status.OK, 1.0)
    assert s.score(Status.OK, 2.0) == pytest.approx(s.correct + math.log(2.0))
    assert s.score(Status.OK, 1e9) == s.max_score
    assert all(s.score(st, None) <= 0 for st in Status if st is not Status.OK)
    assert s.score(Status.REJECTED, None) < s.score(Status.COMPILE_ERROR, None) == 0.0
    with pytest.raises(ShapingError, match="positive"):
        Shaping(penalties={**s.penalties, "INCORRECT": 0.2})
    with pytest.raises(ShapingError, match="miss"):
        Shaping(penalties={"COMPILE_ERROR": 0.0})
    assert Shaping.from_dict(s.to_dict()) == s


def test_fair_queue_takes_clients_in_turn():
    q = FairQueue()
    for i in range(3):
        q.put("greedy", f"g{i}")
    q.put("other", "o0")
    assert [q.take() for _ in range(5)] == ["g0", "o0", "g1", "g2", None]


@pytest.fixture(scope="module")
def service(local_ray, tmp_path_factory):
    svc = RewardService(tmp_path_factory.mktemp("rewards"), RewardConfig(evaluator="standin", gpus=1, retries=1,
                                                                             evaluation_timeout_s=20.0))
    yield svc
    svc.close()


def test_a_correct_kernel_pays_and_is_recorded_with_evidence(service):
    r = service.score("silu_and_mul", BASELINE, client="t")
    assert r["status"] == "OK" and r["correct"] and r["synthetic"]
    assert r["score"] >= service.config.shaping.correct
    assert [g["gate"] for g in r["evidence"]["gates"]] == ["search", "heldout", "sanitizer", "loop"]
    evals = read_evaluations(service.dir / "evaluations.jsonl")
    keys = r["evidence"]["eval_keys"]
    assert len(keys) == 2 and set(keys) <= {e.key for e in evals}  # search and held-out shapes
    rows = list(read_jsonl(service.dir / "rewards.jsonl"))
    assert rows[-1]["request_id"] == r["request_id"] and rows[-1]["source"] == BASELINE


def test_identical_sources_are_answered_from_the_records(service):
    first = service.score("silu_and_mul", BASELINE + "\n// again\n")
    n_evals = len(read_evaluations(service.dir / "evaluations.jsonl"))
    futures = [service.submit("silu_and_mul", BASELINE + "\n// again\n", client=f"c{i}") for i in range(4)]
    answers = [f.result(timeout=60) for f in futures]
    assert all(a["cached"] and a["score"] == first["score"] for a in answers)
    assert len(read_evaluations(service.dir / "evaluations.jsonl")) == n_evals


@pytest.mark.parametrize(("source", "status", "score"), [
    (BASELINE.replace("__global__", "__global__ int"), "COMPILE_ERROR", 0.0),
    (BASELINE + "\n// standin: rejected\n", "REJECTED", -1.0),
    (BASELINE + "\n// standin: incorrect\n", "INCORRECT", 0.0),
    ("   ", "NO_VARIANT", 0.0),
])
def test_failures_never_pay(service, source, status, score):
    r = service.score("silu_and_mul", source)
    assert (r["status"], r["score"], r["correct"]) == (status, score, False)
    assert r["feedback"]


def test_a_crashed_evaluator_gives_a_verdict_and_is_replaced(service):
    before = service.pool.replaced
    r = service.score("silu_and_mul", BASELINE + "\n// standin: kill-process\n", timeout_s=120)
    assert r["status"] == "CRASH" and r["score"] <= 0 and "died" in r["feedback"]
    assert service.pool.replaced > before
    assert service.score("silu_and_mul", BASELINE + "\n// after the crash\n", timeout_s=120)["correct"]


def test_a_hung_evaluator_gives_a_timeout_and_is_replaced(service):
    before = service.pool.replaced
    r = service.score("silu_and_mul", BASELINE + "\n// standin: hang\n", timeout_s=180)
    assert (r["status"], r["score"]) == ("TIMEOUT", 0.0) and "did not answer" in r["feedback"]
    assert service.pool.replaced == before + 1
    assert service.score("silu_and_mul", BASELINE + "\n// after the hang\n", timeout_s=120)["correct"]


def test_a_restarted_service_answers_known_sources_from_its_records(local_ray, tmp_path):
    config = RewardConfig(evaluator="standin", gpus=1, heldout=False, sanitize=False, loop=False)
    first = RewardService(tmp_path, config)
    try:
        answer = first.score("silu_and_mul", BASELINE, timeout_s=120)
    finally:
        first.close()
    n_evals = len(read_evaluations(tmp_path / "evaluations.jsonl"))
    strict = RewardService(tmp_path, RewardConfig(evaluator="standin", gpus=1, heldout=False, sanitize=False, loop=False,
                                                  shaping=Shaping(correct=0.2)))
    try:
        again = strict.score("silu_and_mul", BASELINE, timeout_s=120)
    finally:
        strict.close()
    assert again["cached"] and again["status"] == answer["status"] == "OK"
    assert again["score"] == Shaping(correct=0.2).score(Status.OK, answer["speedup"])  # re-shaped, not re-timed
    assert len(read_evaluations(tmp_path / "evaluations.jsonl")) == n_evals


def test_bad_requests_are_typed_errors(service):
    with pytest.raises(RewardRequestError, match="no kernel"):
        service.submit("no_such_kernel", BASELINE)
    with pytest.raises(RewardRequestError, match="no kernel"):  # a folder path: never loaded
        service.submit(str(load_kernel("silu_and_mul").directory), BASELINE)
    with pytest.raises(RewardRequestError, match="dtype"):
        service.submit("silu_and_mul", BASELINE, dtype="int8")


def test_concurrent_clients_all_get_answers(service):
    sources = [BASELINE + f"\n// variant {i}\n" for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        answers = list(ex.map(lambda s: service.score("silu_and_mul", s, client=s[-3:], timeout_s=120), sources))
    assert all(a["correct"] for a in answers)
    assert len({a["variant_id"] for a in answers}) == 6
