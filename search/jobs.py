"""The one path of every evaluation of a run: admission, an evaluator call, a record.

A :class:`Job` is one evaluation the search wants (a tuning trial, a contender's full
timing, a winner's held-out check or final timing). :class:`Evaluations` runs it: admission
(:func:`evaluators.admit.admit`) in a CPU task, whose refusal is the verdict; otherwise the
evaluator pool, with the artifact's object reference, so the cubin travels to the GPU. Every
verdict becomes an :class:`~kernels.records.EvalRecord` written by :meth:`Evaluations.record`,
and a job whose key is already on record (a resumed run) is answered from the record.

Everything in flight is a Ray reference (an agent's reply, an admission, an evaluator call);
:meth:`Evaluations.drain` waits for whichever finishes first and runs its continuation.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from evaluators.admit import Admitted, Refusal
from evaluators.api import EvalRequest, TimingConfig
from kernels.records import EvalRecord, ShapeSet, Stage, eval_key
from kernels.variant import Variant
from kernels.verdict import Evaluation
from search.config import RunConfig
from search.pool import EvalPool, admission_task
from search.records import RunHistory, RunRecords
from search.state import KernelState

Admission = tuple[Admitted | Refusal, Any]  # the summary, and the artifact's object reference


def agent_name(index: int) -> str:
    return f"agent{index}"


@dataclass
class Job:
    """One evaluation the search wants, and what to do with its verdict.

    Attributes:
        state / variant / stage / params / shape_set: what to evaluate, and why.
        on_done: receives the verdict.
        agent / trial: for the record (the proposing agent, the Optuna trial number).
        compile_key: set by admission.
        on_same: receives the verdict copied from an earlier variant with the same binary
            (default: ``on_done``).
        artifact: the admitted artifact's object reference, until the evaluator call is made.
    """

    state: KernelState
    variant: Variant
    stage: Stage
    params: dict[str, int]
    on_done: Callable[[Evaluation], None]
    agent: int | None = None
    trial: int | None = None
    shape_set: ShapeSet = ShapeSet.SEARCH
    compile_key: str = ""
    on_same: Callable[[Evaluation], None] | None = None
    artifact: Any = None

    @property
    def key(self) -> str:
        return eval_key(self.state.name, self.variant.id, self.params, self.state.dtype, self.stage, self.shape_set)


def refusal_verdict(job: Job, refusal: Refusal) -> Evaluation:
    """The verdict of a variant that admission refused (it never reaches an evaluator)."""
    return Evaluation(refusal.status, refusal.message, job.state.name, job.state.dtype, job.variant.id,
                      dict(job.params), shape_set=job.shape_set.value, compile_s=refusal.compile_s)


class Evaluations:
    """Runs jobs and evaluator calls over one pool, records every verdict, replays records.

    Args:
        config: the resolved run configuration.
        records: the run's record writer.
        pool: the evaluator actors.
        progress: the live progress line (``update(owner, force=False)``).
        history: records of an earlier attempt at this run (``--resume``), or None.
        on_tick: called on every turn of the loop (e.g. to record the attempt's wall time).
    """

    def __init__(self, config: RunConfig, records: RunRecords, pool: EvalPool, progress: Any,
                 history: RunHistory | None = None, on_tick: Callable[[], None] | None = None) -> None:
        self.config, self.records, self.pool, self.progress = config, records, pool, progress
        self.cache: dict[str, EvalRecord] = history.by_key() if history else {}
        self.answers: dict[str, Any] = dict(history.answers) if history else {}
        self.on_tick = on_tick
        self._tasks: dict[Any, Callable[[Any], None]] = {}
        self._task_kinds: dict[Any, str] = {}  # what each task in flight is, for the progress line
        self._ready: deque[Callable[[], None]] = deque()
        self._waiters: dict[tuple[str, str], list[Callable[[Evaluation], None]]] = defaultdict(list)
        self.start = time.time()

    # -- the loop -------------------------------------------------------------------------

    def later(self, step: Callable[[], None]) -> None:
        """Runs ``step`` on the loop's next turn (never inside the caller)."""
        self._ready.append(step)

    def await_ref(self, ref: Any, then: Callable[[Any], None], kind: str = "") -> None:
        """Calls ``then(ray.get(ref))`` once ``ref`` is ready; ``kind`` names what the loop
        waits for while it is not (``agent answer``, ``compile``) on the progress line."""
        self._tasks[ref] = then
        if kind:
            self._task_kinds[ref] = kind

    def waiting(self) -> dict[str, int]:
        """What the loop waits for now: tasks in flight by kind, and evaluator calls."""
        out: dict[str, int] = {}
        for kind in self._task_kinds.values():
            out[kind] = out.get(kind, 0) + 1
        if self.pool.pending():
            out["evaluator call"] = self.pool.pending()
        return out

    def busy(self) -> bool:
        """Whether anything is in flight or waiting for the loop's next turn."""
        return bool(self._ready or self._tasks or self.pool.pending())

    def drain(self, done: Callable[[], bool], wait_s: float = 1.0) -> None:
        """Runs continuations until ``done()``; waits on Ray for whatever is in flight.

        Args:
            done: checked between turns of the loop.
            wait_s: longest wait for Ray per turn (how late ``done()`` may see a change made
                by another thread, e.g. a reward request queued meanwhile).
        """
        while True:
            while self._ready:
                self._ready.popleft()()
            if done():
                return
            refs = list(self._tasks) + self.pool.refs()
            if not refs:
                raise RuntimeError("search stalled: nothing in flight and not done (a bug)")
            ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
            for ref in ready:
                if ref in self._tasks:
                    self._task_kinds.pop(ref, None)
                    self._tasks.pop(ref)(ray.get(ref))
                    continue
                answer = self.pool.collect(ref)
                if answer is None:
                    continue
                if answer.call.method == "evaluate":
                    self._finish(answer.call.owner, answer.value, answer.busy_s)
                else:
                    answer.call.owner(answer.value, answer.error)
            self.progress.update(self)
            if self.on_tick is not None:
                self.on_tick()

    # -- evaluations ----------------------------------------------------------------------

    def admit(self, st: KernelState, variant: Variant, params: dict[str, int], then: Callable[[Admission], None]) -> None:
        """Admits a variant in a CPU task; ``then((summary, artifact reference))``."""
        # Two return objects (num_returns=2): Ray's stubs type them as one.
        refs: Any = admission_task.remote(st.ref, variant.source, st.dtype, dict(params), st.all_shapes())
        summary_ref, artifact_ref = refs
        self.await_ref(summary_ref, lambda summary: then((summary, artifact_ref)), "compile")

    def submit(self, job: Job) -> None:
        """Evaluates a job (admission, then an evaluator), unless a record already has it."""
        cached = self.cache.get(job.key)
        if cached is not None:
            self.later(lambda: job.on_done(cached.evaluation))
            return
        self.admit(job.state, job.variant, job.params, lambda adm: self._admitted(job, adm))

    def call(self, owner: Callable[[Any, str], None], method: str, *args: Any, exclusive: bool = True,
             what: str = "") -> None:
        """Any other evaluator call over the pool (peers' timing, sanitizer), with the pool's
        retries; ``owner(value, error)`` gets the answer, or None and why there is none."""
        self.pool.call(owner, method, *args, exclusive=exclusive, what=what)

    def recorded_call(self, key: str, owner: Callable[[Any, str], None], method: str, *args: Any,
                      exclusive: bool = True, what: str = "") -> None:
        """Like :meth:`call`, for the end of a run's calls (sanitizer, peers' loops): an answer
        is recorded under ``key`` (``answers.jsonl``) and a recorded one is replayed, so that a
        run cut short in its long end resumes where it stopped. A call that gave no answer is
        not recorded: a resumed run asks it again."""
        if key in self.answers:
            value = self.answers[key]
            self.later(lambda: owner(value, ""))
            return

        def keep(value: Any, error: str) -> None:
            if value is not None:
                # JSON's reading of the answer, so a fresh answer and a replayed one are alike.
                value = json.loads(json.dumps(value, default=str))
                self.records.answer(key, method, value)
                self.answers[key] = value
            owner(value, error)

        self.pool.call(keep, method, *args, exclusive=exclusive, what=what)

    def _admitted(self, job: Job, admission: Admission) -> None:
        summary, artifact = admission
        _take_summary(job, summary)
        cached = self.cache.get(job.key)
        if cached is not None:
            job.on_done(cached.evaluation)
        elif isinstance(summary, Refusal):
            self._finish(job, refusal_verdict(job, summary), 0.0)
        else:
            job.artifact = artifact
            self._evaluate(job)

    def first_screen(self, job: Job, admission: Admission) -> None:
        """A variant's first evaluation at its defaults, with deduplication by binary: a
        binary already judged (the baseline's, an earlier proposal's) lends its verdict."""
        summary, artifact = admission
        _take_summary(job, summary)
        st, cached = job.state, self.cache.get(job.key)
        if isinstance(summary, Refusal):
            verdict = cached.evaluation if cached is not None else None
            self.later(lambda: job.on_done(verdict) if verdict is not None
                       else self._finish(job, refusal_verdict(job, summary), 0.0))
            return
        first = st.dedupe.same_binary(summary.binary_key, job.variant.id)
        if first is not None:
            self.when_final(st, first, lambda ev: self._same_as(job, first, ev))
        elif cached is not None:
            self.later(lambda: job.on_done(cached.evaluation))
        else:
            job.artifact = artifact
            self._evaluate(job)

    def _evaluate(self, job: Job) -> None:
        st = job.state
        screen = job.stage is Stage.SCREEN
        request = EvalRequest(
            kernel=st.ref, variant=job.variant, params=dict(job.params), dtype=st.dtype,
            shape_set=job.shape_set.value, timing=TimingConfig.screen() if screen else TimingConfig.full(),
            seeds=self.config.evaluator.seeds,
            best_ms=dict(st.round.best_ms) if screen and st.round is not None else {},
            noise_floor=job.stage in (Stage.FULL, Stage.FINAL),
            extra_shapes=st.extra_shapes if job.shape_set is ShapeSet.SEARCH else st.heldout_extra,
        )
        artifact, job.artifact = job.artifact, None  # the pool holds it until the call is made
        self.pool.submit(job, request, artifact)

    def _same_as(self, job: Job, first: str, evaluation: Evaluation) -> None:
        """A variant whose binary was already judged takes that verdict, and a record says so
        (so every proposal has a verdict on record; none is run twice)."""
        recorded = self.cache.get(job.key)
        if recorded is not None:  # written before a resume: replay it, a second line would duplicate it
            copied = recorded.evaluation
        else:
            copied = dataclasses.replace(evaluation, variant_id=job.variant.id,
                                         extra={**evaluation.extra, "same_binary_as": first})
            self.record(job, copied, 0.0)
        (job.on_same or job.on_done)(copied)

    def _finish(self, job: Job, evaluation: Evaluation, busy_s: float) -> None:
        self.record(job, evaluation, busy_s)
        job.on_done(evaluation)

    def record(self, job: Job, evaluation: Evaluation, busy_s: float) -> None:
        """Writes the verdict of a job to ``evaluations.jsonl`` (the one writer of records)."""
        st = job.state
        record = EvalRecord(
            run_id=self.records.run_id, kernel=st.name, dtype=st.dtype,
            round=st.round.number if st.round else st.rounds_done,
            agent=agent_name(job.agent) if job.agent is not None else job.variant.author,
            stage=job.stage, trial=job.trial, variant=job.variant, evaluation=evaluation,
            compile_key=job.compile_key, params=dict(job.params), shape_set=job.shape_set,
            time=time.time(), busy_s=busy_s,
        )
        self.records.evaluation(record)
        self.cache[record.key] = record

    # -- final verdicts of variants -------------------------------------------------------

    def when_final(self, st: KernelState, variant_id: str, callback: Callable[[Evaluation], None]) -> None:
        """Calls back with a variant's final screening verdict (on a later turn if known)."""
        if variant_id in st.verdicts:
            verdict = st.verdicts[variant_id]
            self.later(lambda: callback(verdict))
        else:
            self._waiters[(st.name, variant_id)].append(callback)

    def set_final(self, st: KernelState, variant_id: str, evaluation: Evaluation) -> None:
        st.verdicts[variant_id] = evaluation
        for callback in self._waiters.pop((st.name, variant_id), []):
            callback(evaluation)


def _take_summary(job: Job, summary: Admitted | Refusal) -> None:
    """The full parameter assignment (defaults filled in) and the compile key, from admission."""
    if summary.params:
        job.params = dict(summary.params)
    job.compile_key = summary.compile_key
