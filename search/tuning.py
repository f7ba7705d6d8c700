"""Optuna tuning of a variant's ``// tune:`` parameters, stored on disk so runs resume.

One study per (kernel, variant, dtype), named so that ``--resume`` finds it again. Trials
are asked and told (the evaluation runs elsewhere, on an evaluator actor). The objective is
the geometric-mean speedup over the baseline; a failed evaluation is told as
``TrialState.FAIL``, never as a huge time. Grids no larger than the trial budget are
enumerated exhaustively (TPE would only re-ask points it has already seen).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from kernels.verdict import Evaluation

optuna.logging.set_verbosity(optuna.logging.WARNING)

STORAGE_FILE = "optuna.journal"
INTERRUPTED = "interrupted"  # user attribute of trials closed by recover()


def study_name(kernel: str, variant_id: str, dtype: str) -> str:
    return f"{kernel}.{variant_id}.{dtype}"


class VariantStudy:
    """The tuning study of one variant.

    Args:
        study: the Optuna study (already created or loaded).
        tune: parameter name -> declared values (first = default).
        budget: total trials for this variant, defaults included.
    """

    def __init__(self, study: optuna.Study, tune: Mapping[str, tuple[int, ...]], budget: int) -> None:
        self.study = study
        self.tune = {k: tuple(v) for k, v in tune.items()}
        grid = 1
        for values in self.tune.values():
            grid *= len(values)
        self.budget = min(budget, grid)
        self._dists: dict[str, BaseDistribution] = {k: CategoricalDistribution(list(v)) for k, v in self.tune.items()}
        if not study.trials:
            self._seed_queue(grid)

    def _seed_queue(self, grid: int) -> None:
        # The defaults first: the variant's first screening run doubles as trial 0.
        defaults = {k: v[0] for k, v in self.tune.items()}
        self.study.enqueue_trial(defaults)
        if grid <= self.budget:
            keys = list(self.tune)
            for combo in itertools.product(*(self.tune[k] for k in keys)):
                params = dict(zip(keys, combo, strict=True))
                if params != defaults:
                    self.study.enqueue_trial(params)

    def _finished(self) -> list[optuna.trial.FrozenTrial]:
        # Trials cut short by a killed run do not count against the budget.
        return [
            t for t in self.study.get_trials(deepcopy=False)
            if t.state.is_finished() and not t.user_attrs.get(INTERRUPTED)
        ]

    def defaults_failed(self) -> bool:
        """The default parameters were evaluated and failed: tuning the rest is pointless."""
        defaults = {k: v[0] for k, v in self.tune.items()}
        return any(t.state == TrialState.FAIL and t.params == defaults for t in self._finished())

    def remaining(self) -> int:
        return max(0, self.budget - len(self._finished()))

    def recover(self, lookup: Callable[[dict[str, int]], Evaluation | None]) -> None:
        """Closes trials left RUNNING by a killed run: told from the record if the
        evaluation was written, otherwise failed and their parameters queued again."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            params = {k: int(v) for k, v in t.params.items()}
            found = lookup(params) if params else None
            if found is not None:
                self.tell(t.number, found)
                continue
            self._mark_interrupted(t.number)
            self.study.tell(t.number, state=TrialState.FAIL)
            if params:
                self.study.enqueue_trial(params)

    def _mark_interrupted(self, number: int) -> None:
        storage = self.study._storage  # Study exposes no public handle on its storage
        study_id = storage.get_study_id_from_name(self.study.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        storage.set_trial_user_attr(trial_id, INTERRUPTED, True)

    def ask(self) -> tuple[int, dict[str, int]]:
        """A new trial: its number and the parameter values to evaluate."""
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


class TuningStore:
    """The run's Optuna storage: a journal file in the run directory.

    Args:
        run_dir: the run directory.
        seed: base seed; each study's TPE sampler is seeded from it and the study name.
    """

    def __init__(self, run_dir: Path, seed: int = 0) -> None:
        self.path = Path(run_dir) / STORAGE_FILE
        self.storage = JournalStorage(JournalFileBackend(str(self.path)))
        self.seed = seed

    def study(self, kernel: str, variant_id: str, dtype: str, tune: Mapping[str, tuple[int, ...]], budget: int) -> VariantStudy:
        name = study_name(kernel, variant_id, dtype)
        sampler = optuna.samplers.TPESampler(seed=(self.seed * 1_000_003 + zlib.crc32(name.encode())) % 2**31)
        study = optuna.create_study(
            study_name=name,
            storage=self.storage,
            sampler=sampler,
            direction="maximize",
            load_if_exists=True,
        )
        return VariantStudy(study, tune, budget)

    def study_names(self) -> list[str]:
        return [s.study_name for s in optuna.get_all_study_summaries(self.storage)]
