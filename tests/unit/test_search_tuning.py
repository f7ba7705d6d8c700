"""Optuna tuning: categorical over declared values, FAIL for failures, storage resumes."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from kernels.verdict import Evaluation, ShapeResult, Status
from search.tuning import TuningStore, study_name

TUNE = {"BLOCK": (128, 256, 512, 1024), "VEC": (1, 2, 4, 8)}


def _ok(params: dict[str, int]) -> Evaluation:
    speed = params["BLOCK"] / 256 * params["VEC"]
    return Evaluation(Status.OK, params=params, shapes=(ShapeResult({"n": 1}, 1.0 / speed, 1.0),))


def test_first_trial_is_defaults_and_values_are_declared(tmp_path):
    study = TuningStore(tmp_path, seed=1).study("k", "v1", "float16", TUNE, budget=6)
    number, params = study.ask()
    assert number == 0 and params == {"BLOCK": 128, "VEC": 1}
    study.tell(number, _ok(params))
    for _ in range(study.remaining()):
        n, p = study.ask()
        assert p["BLOCK"] in TUNE["BLOCK"] and p["VEC"] in TUNE["VEC"]
        study.tell(n, _ok(p))
    assert study.remaining() == 0


def test_failures_are_told_as_fail_not_as_values(tmp_path):
    study = TuningStore(tmp_path).study("k", "v1", "float16", TUNE, budget=3)
    n, p = study.ask()
    study.tell(n, Evaluation(Status.CRASH, message="illegal address", params=p))
    trial = study.study.trials[0]
    assert trial.state == TrialState.FAIL and trial.value is None
    assert study.defaults_failed()


def test_small_grid_is_enumerated(tmp_path):
    study = TuningStore(tmp_path).study("k", "v2", "float16", {"B": (1, 2, 3)}, budget=8)
    seen = []
    while study.remaining():
        n, p = study.ask()
        seen.append(p["B"])
        study.tell(n, Evaluation(Status.OK, params=p, shapes=(ShapeResult({"n": 1}, 1.0 / p["B"], 1.0),)))
    assert sorted(seen) == [1, 2, 3]
    assert study.best_params() == {"B": 3}


def test_study_resumes_from_disk_with_its_trials(tmp_path):
    store = TuningStore(tmp_path, seed=3)
    study = store.study("silu_and_mul", "abc", "bfloat16", TUNE, budget=5)
    for _ in range(2):
        n, p = study.ask()
        study.tell(n, _ok(p))
    n_running, p_running = study.ask()  # the run is killed while this one is evaluated
    del study, store

    store = TuningStore(tmp_path, seed=3)
    assert store.study_names() == [study_name("silu_and_mul", "abc", "bfloat16")]
    again = store.study("silu_and_mul", "abc", "bfloat16", TUNE, budget=5)
    assert len(again.study.trials) >= 3
    again.recover(lambda params: None)  # its evaluation was not recorded
    assert again.remaining() == 3  # the interrupted trial does not use up the budget
    n, p = again.ask()
    assert p == p_running  # asked again
    again.tell(n, _ok(p))
    assert again.remaining() == 2


def test_recover_tells_a_recorded_evaluation(tmp_path):
    store = TuningStore(tmp_path)
    study = store.study("k", "v", "float16", TUNE, budget=4)
    n, p = study.ask()
    study.recover(lambda params: _ok(params) if params == p else None)
    trial = study.study.trials[n]
    assert trial.state == TrialState.COMPLETE and trial.value == _ok(p).speedup
    assert isinstance(study.study, optuna.Study)
