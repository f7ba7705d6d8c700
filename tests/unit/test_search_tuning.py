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
    told = [1.0, 1.0, None, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert _asks(3, told, budget=10) == _asks(3, told, budget=10)
    # The first 7 walk the two parameters from the defaults; TPE draws the rest from the seed.
    many = {tuple(sorted(p.items())) for seed in range(8) for p in _asks(seed, told, budget=10)[7:]}
    assert len(many) > 3  # the seed matters: different runs explore differently


def _run(study, objective) -> list[dict[str, int]]:
    asked = []
    while study.remaining():
        n, p = study.ask()
        asked.append(p)
        study.tell(n, Evaluation(Status.OK, params=p, shapes=(ShapeResult({"n": 1}, 1.0 / objective(p), 1.0),)))
    return asked


def test_a_grid_past_the_budget_is_walked_one_parameter_at_a_time_from_the_defaults():
    # With 4 trials over a 4 x 3 grid every value of the first parameter is measured (TPE
    # alone could leave the best of them untried).
    tune = {"ITEMS": (4, 2, 8, 1), "RU": (1, 2, 4)}
    asked = _run(TuningStore(seed=5).study("k", "v", "float16", tune, budget=4), lambda p: 9 - p["ITEMS"])
    assert asked == [{"ITEMS": 4, "RU": 1}, {"ITEMS": 2, "RU": 1}, {"ITEMS": 8, "RU": 1}, {"ITEMS": 1, "RU": 1}]


def test_a_derived_variant_starts_from_its_parents_best_and_walks_on():
    tune = {"ITEMS": (4, 2, 8, 1), "RU": (1, 2, 4)}
    store = TuningStore(seed=5)
    objective = lambda p: (9 - p["ITEMS"]) * (1 + p["RU"] / 10)  # noqa: E731
    _run(store.study("k", "parent", "float16", tune, budget=4), objective)
    child = _run(store.study("k", "child", "float16", tune, budget=4, parent="parent"), objective)
    # Its defaults (its first screening), the parent's best, then only points the parent left:
    # the second parameter's values around that best.
    assert child == [{"ITEMS": 4, "RU": 1}, {"ITEMS": 1, "RU": 1}, {"ITEMS": 1, "RU": 2}, {"ITEMS": 1, "RU": 4}]
    grandchild = _run(store.study("k", "grandchild", "float16", tune, budget=3, parent="child"), objective)
    assert grandchild[:2] == [{"ITEMS": 4, "RU": 1}, {"ITEMS": 1, "RU": 4}]
    assert store.study("k", "child", "float16", tune, budget=4).best_params() == {"ITEMS": 1, "RU": 4}


def test_a_parent_without_a_study_or_with_other_parameters_leaves_the_defaults_as_centre():
    tune = {"ITEMS": (4, 2, 8, 1), "RU": (1, 2, 4)}
    store = TuningStore(seed=5)
    _run(store.study("k", "other", "float16", {"BLOCK": (256, 128, 512), "V": (1, 2)}, budget=3), lambda p: p["BLOCK"])
    for parent in ("never-tuned", "other"):
        asked = _run(store.study("k", f"from-{parent}", "float16", tune, budget=3, parent=parent), lambda p: 1.0)
        assert asked == [{"ITEMS": 4, "RU": 1}, {"ITEMS": 2, "RU": 1}, {"ITEMS": 8, "RU": 1}]
