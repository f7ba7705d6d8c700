"""Optuna tuning: categorical over declared values, FAIL for failures, asks a pure function of
the verdicts told (so a resumed run asks the same trials)."""

from __future__ import annotations

from optuna.trial import TrialState

from kernels.verdict import Evaluation, ShapeResult, Status
from search.tuning import TuningStore

TUNE = {"BLOCK": (128, 256, 512, 1024), "VEC": (1, 2, 4, 8)}


def _ok(params: dict[str, int]) -> Evaluation:
    speed = params["BLOCK"] / 256 * params["VEC"]
    return Evaluation(Status.OK, params=params, shapes=(ShapeResult({"n": 1}, 1.0 / speed, 1.0),))


def test_first_trial_is_defaults_and_values_are_declared(tmp_path):
    study = TuningStore(seed=1).study("k", "v1", "float16", TUNE, budget=6)
    number, params = study.ask()
    assert number == 0 and params == {"BLOCK": 128, "VEC": 1}
    study.tell(number, _ok(params))
    for _ in range(study.remaining()):
        n, p = study.ask()
        assert p["BLOCK"] in TUNE["BLOCK"] and p["VEC"] in TUNE["VEC"]
        study.tell(n, _ok(p))
    assert study.remaining() == 0


def test_failures_are_told_as_fail_not_as_values(tmp_path):
    study = TuningStore().study("k", "v1", "float16", TUNE, budget=3)
    n, p = study.ask()
    study.tell(n, Evaluation(Status.CRASH, message="illegal address", params=p))
    trial = study.study.trials[0]
    assert trial.state == TrialState.FAIL and trial.value is None
    assert study.defaults_failed()


def test_small_grid_is_enumerated(tmp_path):
    study = TuningStore().study("k", "v2", "float16", {"B": (1, 2, 3)}, budget=8)
    seen = []
    while study.remaining():
        n, p = study.ask()
        seen.append(p["B"])
        study.tell(n, Evaluation(Status.OK, params=p, shapes=(ShapeResult({"n": 1}, 1.0 / p["B"], 1.0),)))
    assert sorted(seen) == [1, 2, 3]
    assert study.best_params() == {"B": 3}


def _asks(seed: int, told: list[float | None], budget: int = 6) -> list[dict[str, int]]:
    """The parameters a fresh study asks when each trial is told ``told[i]`` (None: failed)."""
    study = TuningStore(seed=seed).study("silu_and_mul", "abc", "bfloat16", TUNE, budget=budget)
    asked = []
    for value in told:
        n, p = study.ask()
        asked.append(p)
        ev = _ok(p) if value is not None else Evaluation(Status.CRASH, params=p)
        study.tell(n, ev)
    return asked


def test_asks_depend_on_the_verdicts_told_not_on_the_process():
    # A resumed run rebuilds each study by asking again and replaying the recorded verdicts:
    # it must be asked exactly what the first process was asked, trial for trial.
    told = [1.0, 1.0, None, 1.0, 1.0, 1.0]
    assert _asks(3, told) == _asks(3, told)
    many = {tuple(sorted(p.items())) for seed in range(8) for p in _asks(seed, told)[1:]}
    assert len(many) > 3  # the seed matters: different runs explore differently
