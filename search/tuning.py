"""Optuna tuning of a variant's ``// tune:`` parameters, rebuilt from the records on resume.

One study per (kernel, variant, dtype). Trials are asked and told (the evaluation runs
elsewhere, on an evaluator actor). The objective is the geometric-mean speedup over the
baseline; a failed evaluation is told as ``TrialState.FAIL``, never as a huge time. Grids no
larger than the trial budget are enumerated exhaustively (TPE would only re-ask points it has
already seen).

A larger grid is first walked one parameter at a time, in declared order, from a centre: the
defaults, or for a variant derived from a tuned parent with the same parameters, the parent's
best point (the parent's other measured points are not measured again). A handful of trials then
covers the first parameter's every value, and a lineage of derived variants goes on to the
next parameters, a coordinate search across generations; TPE draws what budget is left. With
three or four trials per variant, TPE alone drew two parameters at random, and a value that
mattered most (a row schedule's ITEMS=1) could go untried while a second parameter was added.

Each ask draws from a sampler seeded by the run's seed, the study's name and the trial's
number, so a study is a pure function of the verdicts told to it and to its parent's study
(finished before anything is derived from it): a resumed run asks the same parameters in the
same order and finds their verdicts in ``evaluations.jsonl`` (each record holds its trial
number and parameters). The records are the truth; the studies are kept on disk as well, in
the run's ``optuna.journal`` (Optuna's journal storage), for anyone to load with
``optuna.load_study`` or a dashboard while the run goes on or after it. A resumed run starts
that file afresh and rebuilds it from the records as it replays them, so it can never disagree
with them:

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend("runs/<id>/optuna.journal"))
    optuna.get_all_study_names(storage)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from agents.base import derive_seed
from kernels.records import params_key
from kernels.verdict import Evaluation

optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_name(kernel: str, variant_id: str, dtype: str) -> str:
    return f"{kernel}.{variant_id}.{dtype}"


class VariantStudy:
    """The tuning study of one variant.

    Args:
        study: the Optuna study (fresh).
        tune: parameter name -> declared values (first = default).
        budget: total trials for this variant, defaults included.
        seed: the run's seed; each ask's sampler is seeded from it, the name and the trial.
        parent: the study of the variant this one was derived from, finished, if it had one.
    """

    def __init__(self, study: optuna.Study, tune: Mapping[str, tuple[int, ...]], budget: int, seed: int = 0,
                 parent: optuna.Study | None = None) -> None:
        self.study = study
        self.seed = seed
        self.tune = {k: tuple(v) for k, v in tune.items()}
        grid = 1
        for values in self.tune.values():
            grid *= len(values)
        self.budget = min(budget, grid)
        self._dists: dict[str, BaseDistribution] = {k: CategoricalDistribution(list(v)) for k, v in self.tune.items()}
        if not study.trials:
            self._seed_queue(grid, parent)

    def _seed_queue(self, grid: int, parent: optuna.Study | None) -> None:
        # The defaults first: the variant's first screening run doubles as trial 0.
        defaults = {k: v[0] for k, v in self.tune.items()}
        if grid <= self.budget:
            grid_points = (dict(zip(self.tune, combo, strict=True)) for combo in itertools.product(*self.tune.values()))
            queue = [p for p in grid_points if p != defaults]
        else:
            queue = self._coordinate_plan(defaults, parent)[: self.budget - 1]
        for params in [defaults, *queue]:
            self.study.enqueue_trial(params)

    def _coordinate_plan(self, defaults: dict[str, int], parent: optuna.Study | None) -> list[dict[str, int]]:
        """The centre, then each parameter's other values with the rest at the centre."""
        centre, measured = dict(defaults), set()
        if parent is not None:
            finished = [t for t in parent.get_trials(deepcopy=False) if t.state.is_finished()]
            same = [t for t in finished if set(t.params) == set(self.tune)
                    and all(t.params[k] in self.tune[k] for k in self.tune)]
            measured = {params_key(t.params) for t in same}
            done = [t for t in same if t.state == TrialState.COMPLETE]
            if done:
                best = max(done, key=lambda t: (t.value, -t.number))
                centre = {k: int(best.params[k]) for k in self.tune}
        plan = [centre]
        for name, values in self.tune.items():
            for value in values:
                point = {**centre, name: value}
                if point not in plan and params_key(point) not in measured:
                    plan.append(point)
        return [p for p in plan if p != defaults]

    def _finished(self) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()]

    def defaults_failed(self) -> bool:
        """The default parameters were evaluated and failed: tuning the rest is pointless."""
        defaults = {k: v[0] for k, v in self.tune.items()}
        return any(t.state == TrialState.FAIL and t.params == defaults for t in self._finished())

    def remaining(self) -> int:
        return max(0, self.budget - len(self._finished()))

    def ask(self) -> tuple[int, dict[str, int]]:
        """A new trial: its number and the parameter values to evaluate."""
        number = len(self.study.get_trials(deepcopy=False))
        # A sampler per ask, seeded by the trial's place: what it draws depends on the trials
        # told so far and nothing else (not on how many asks an earlier process made).
        self.study.sampler = optuna.samplers.TPESampler(
            seed=derive_seed(self.seed, self.study.study_name, number) % 2**31)
        trial = self.study.ask(fixed_distributions=self._dists)
        return trial.number, {k: int(v) for k, v in trial.params.items()}

    def tell(self, number: int, evaluation: Evaluation) -> None:
        speedup = evaluation.speedup
        if speedup is None:
            self.study.tell(number, state=TrialState.FAIL)
        else:
            self.study.tell(number, speedup)

    def best_params(self) -> dict[str, int] | None:
        done = [t for t in self._finished() if t.state == TrialState.COMPLETE]
        if not done:
            return None
        best = max(done, key=lambda t: (t.value, -t.number))
        return {k: int(v) for k, v in best.params.items()}


JOURNAL = "optuna.journal"  # the run folder's study file


def journal_storage(path: Path) -> optuna.storages.BaseStorage:
    """Optuna's journal storage in the file ``path`` (read it while a run writes it)."""
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


class TuningStore:
    """The run's tuning studies (see the module docstring for resume).

    Args:
        seed: the run's seed.
        path: the study file (Optuna's journal storage), started afresh here; None keeps the
            studies in memory only.
    """

    def __init__(self, seed: int = 0, path: Path | None = None) -> None:
        self.seed = seed
        self.path = path
        if path is None:
            self.storage: optuna.storages.BaseStorage = optuna.storages.InMemoryStorage()
        else:
            # Afresh: a resumed run replays its records into it, trial by trial, as they were.
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            self.storage = journal_storage(path)

    def study(self, kernel: str, variant_id: str, dtype: str, tune: Mapping[str, tuple[int, ...]], budget: int,
              parent: str = "") -> VariantStudy:
        """The variant's study, created on first use (the same object's state on later calls).

        ``parent`` is the id of the variant it was derived from: its study, where there is one,
        centres this one's first trials (see the module docstring). A parent is finished before
        anything is derived from it, so a resumed run finds the same parent study.
        """
        name = study_name(kernel, variant_id, dtype)
        study = optuna.create_study(study_name=name, storage=self.storage, direction="maximize", load_if_exists=True)
        return VariantStudy(study, tune, budget, self.seed, self._existing(study_name(kernel, parent, dtype)) if parent else None)

    def _existing(self, name: str) -> optuna.Study | None:
        try:
            return optuna.load_study(study_name=name, storage=self.storage)
        except KeyError:
            return None

