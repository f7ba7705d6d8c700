"""The search driver: rounds of proposals, compilation, tuning and timing, pipelined on Ray.

Everything in flight is a Ray reference (an agent's proposals, a compilation, an
evaluation); one loop waits for whichever finishes first and runs its continuation, so the
evaluator actors stay fed while agents think and the CPU compiles. Each kernel moves
through its rounds on its own: proposals and tuning ("screen"), then the full timing
protocol for the round's contenders ("full"), then the verdicts go back to the agents.

Resuming is replay: recorded proposals stand in for agent calls, and recorded evaluations
(keyed by variant id, parameters, dtype, stage and shape set) stand in for evaluator runs,
so a resumed run rebuilds the same state and evaluates nothing twice.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import ray

from agents.base import Attempt, Proposal
from evaluators.api import EvalRequest, TimingConfig
from kernels.records import EvalRecord, ShapeSet, Stage, eval_key, params_key
from kernels.variant import Variant
from kernels.verdict import Evaluation, Status
from search.config import RunConfig
from search.pool import CompileOutcome, EvalPool, compile_task
from search.progress import Progress
from search.records import RunHistory, RunRecords
from search.selection import Scored, pick_contenders, scored
from search.state import KernelState, RoundState
from search.tuning import TuningStore, VariantStudy


def agent_name(index: int) -> str:
    return f"agent{index}"


@dataclass
class Job:
    """One evaluation the search wants, and what to do with its verdict."""

    state: KernelState
    variant: Variant
    stage: str
    params: dict[str, int]
    on_done: Callable[[Evaluation], None]
    agent: int | None = None
    trial: int | None = None
    shape_set: str = "search"
    compile_key: str = ""
    on_same: Callable[[Evaluation], None] | None = None  # the binary was seen before: its verdict

    @property
    def key(self) -> str:
        return eval_key(self.variant.id, self.params, self.state.dtype, self.stage, self.shape_set)


@dataclass
class VariantRun:
    """One variant's way through compilation and tuning within a round."""

    state: KernelState
    agent: int | None
    variant: Variant
    defaults: dict[str, int] = field(default_factory=dict)
    study: VariantStudy | None = None
    evals: dict[str, Evaluation] = field(default_factory=dict)


class Controller:
    """Runs the search over all kernels until every kernel has done its rounds.

    Args:
        config: the resolved run configuration.
        states: one state per kernel.
        records: the run's record writer.
        pool: the evaluator actors.
        agents: the agent actor handles (one per population member).
        tuning: the Optuna storage.
        progress: the live progress line.
        history: records of an earlier attempt at this run (``--resume``), or None.
    """

    def __init__(self, config: RunConfig, states: list[KernelState], records: RunRecords, pool: EvalPool,
                 agents: list[Any], tuning: TuningStore, progress: Progress, history: RunHistory | None = None) -> None:
        self.config, self.states, self.records, self.pool = config, states, records, pool
        self.agents, self.tuning, self.progress = agents, tuning, progress
        self.cache: dict[str, EvalRecord] = history.by_key() if history else {}
        self.recorded_rounds = dict(history.rounds_done) if history else {}
        self.saved = _complete_batches(history.proposals) if history else {}
        self._tasks: dict[Any, Callable[[Any], None]] = {}
        self._ready: deque[Callable[[], None]] = deque()
        self._waiters: dict[tuple[str, str], list[Callable[[Evaluation], None]]] = defaultdict(list)
        self.start = time.time()

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        for st in self.states:
            self._open(st)
            job = Job(st, st.baseline, "screen", {}, partial(self._on_baseline, st))
            self._submit(job, check_binary=True)
        self.drain(lambda: all(st.rounds_done >= self.config.search.rounds for st in self.states))
        self.progress.update(self, force=True)

    def drain(self, done: Callable[[], bool]) -> None:
        """Runs continuations until ``done()``; waits on Ray for whatever is in flight."""
        while True:
            while self._ready:
                self._ready.popleft()()
            if done():
                return
            refs = list(self._tasks) + self.pool.refs()
            if not refs:
                raise RuntimeError("search stalled: nothing in flight and not done (a bug)")
            ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
            for ref in ready:
                if ref in self._tasks:
                    self._tasks.pop(ref)(ray.get(ref))
                else:
                    out = self.pool.collect(ref)
                    if out is not None:
                        self._finish(*out)
            self.progress.update(self)

    def _open(self, st: KernelState) -> None:
        if st.round is not None:
            st.round.outstanding += 1

    def _close(self, st: KernelState) -> None:
        if st.round is None:
            return
        st.round.outstanding -= 1
        if st.round.outstanding == 0:
            if st.round.phase == "screen":
                self._start_contenders(st)
            else:
                self._end_round(st)

    # -- evaluations ----------------------------------------------------------------------

    def _submit(self, job: Job, check_binary: bool = False, compiled: bool = False) -> None:
        """Compiles (CPU) then evaluates (GPU) a job, unless a record already has it."""
        cached = self.cache.get(job.key)
        if cached is not None and not check_binary:
            self._ready.append(lambda: job.on_done(cached.evaluation))
        elif compiled:
            self._evaluate(job)
        else:
            ref = compile_task.remote(job.state.ref, job.variant, job.state.dtype, job.params)
            self._tasks[ref] = lambda out: self._on_compiled(job, out, check_binary)

    def _on_compiled(self, job: Job, out: CompileOutcome, check_binary: bool) -> None:
        job.compile_key = out.key
        job.params = dict(out.params or job.params)
        cached = self.cache.get(job.key)
        if not out.ok:
            if cached is not None:
                job.on_done(cached.evaluation)
                return
            failed = Evaluation(Status.COMPILE_ERROR, out.log, job.state.name, job.state.dtype,
                                job.variant.id, dict(job.params), compile_s=out.seconds)
            self._finish(job, failed, 0.0)
            return
        if check_binary:
            first = job.state.dedupe.same_binary(out.binary_key, job.variant.id)
            if first is not None:
                self._when_final(job.state, first, lambda ev: self._same_as(job, first, ev))
                return
        if cached is not None:
            job.on_done(cached.evaluation)
        else:
            self._evaluate(job)

    def _evaluate(self, job: Job) -> None:
        st = job.state
        screen = job.stage == "screen"
        request = EvalRequest(
            kernel=st.ref, variant=job.variant, params=dict(job.params), dtype=st.dtype,
            shape_set=job.shape_set, timing=TimingConfig.screen() if screen else TimingConfig.full(),
            seeds=self.config.evaluator.seeds, best_ms=st.best_ms() if screen and st.baseline_scored else {},
            noise_floor=job.stage in ("full", "final"),
            extra_shapes=st.extra_shapes if job.shape_set == "search" else (),
        )
        self.pool.submit(job, request)

    def _same_as(self, job: Job, first: str, evaluation: Evaluation) -> None:
        """A variant whose binary was already judged takes that verdict, and a record says so
        (so every proposal has a verdict on record; none is run twice)."""
        recorded = self.cache.get(job.key)
        if recorded is not None:  # written before a resume: replay it, a second line would duplicate it
            copied = recorded.evaluation
        else:
            copied = dataclasses.replace(evaluation, variant_id=job.variant.id,
                                         extra={**evaluation.extra, "same_binary_as": first})
            self._record(job, copied, 0.0)
        (job.on_same or job.on_done)(copied)

    def _finish(self, job: Job, evaluation: Evaluation, busy_s: float) -> None:
        self._record(job, evaluation, busy_s)
        job.on_done(evaluation)

    def _record(self, job: Job, evaluation: Evaluation, busy_s: float) -> None:
        st = job.state
        record = EvalRecord(
            run_id=self.records.run_id, kernel=st.name, dtype=st.dtype,
            round=st.round.number if st.round else st.rounds_done,
            agent=agent_name(job.agent) if job.agent is not None else job.variant.author,
            stage=Stage(job.stage), trial=job.trial, variant=job.variant, evaluation=evaluation,
            compile_key=job.compile_key, params=dict(job.params), shape_set=ShapeSet(job.shape_set),
            time=time.time(), busy_s=busy_s,
        )
        self.records.evaluation(record)
        self.cache[record.key] = record

    # -- variants: dedupe, tuning, verdicts ----------------------------------------------

    def _when_final(self, st: KernelState, variant_id: str, callback: Callable[[Evaluation], None]) -> None:
        if variant_id in st.verdicts:
            callback(st.verdicts[variant_id])
        else:
            self._waiters[(st.name, variant_id)].append(callback)

    def _set_final(self, st: KernelState, variant_id: str, evaluation: Evaluation) -> None:
        st.verdicts[variant_id] = evaluation
        for callback in self._waiters.pop((st.name, variant_id), []):
            callback(evaluation)

    def _on_baseline(self, st: KernelState, evaluation: Evaluation) -> None:
        st.set_baseline(evaluation)
        st.dedupe.add_source(st.baseline.id)
        self._set_final(st, st.baseline.id, evaluation)
        self._start_round(st)

    def _start_variant(self, st: KernelState, agent: int, variant: Variant) -> None:
        run = VariantRun(st, agent, variant)
        self._open(st)
        if st.dedupe.known_source(variant.id):
            self._when_final(st, variant.id, lambda ev: self._attempt_done(run, ev))
            return
        st.dedupe.add_source(variant.id)
        job = Job(st, variant, "screen", {}, lambda ev: self._on_first(run, ev), agent=agent,
                  on_same=lambda ev: self._same_binary(run, ev))
        self._submit(job, check_binary=True)

    def _same_binary(self, run: VariantRun, evaluation: Evaluation) -> None:
        # The earlier variant's verdict is this one's too (later copies of its source wait on it).
        self._set_final(run.state, run.variant.id, evaluation)
        self._attempt_done(run, evaluation)

    def _on_first(self, run: VariantRun, evaluation: Evaluation) -> None:
        """The variant compiled (or not) at its defaults; tune it or take the verdict."""
        st, launch = run.state, None
        if evaluation.status is not Status.COMPILE_ERROR:
            launch = run.variant.launch()
        if launch is None or not launch.tune or self.config.search.trials <= 1:
            run.evals[params_key(evaluation.params)] = evaluation
            return self._variant_done(run, evaluation)
        run.defaults = launch.default_params()
        run.study = self.tuning.study(st.name, run.variant.id, st.dtype, launch.tune, self.config.search.trials)
        run.study.recover(lambda p: self._lookup(run, p))
        self._next_trial(run)

    def _lookup(self, run: VariantRun, params: dict[str, int]) -> Evaluation | None:
        rec = self.cache.get(eval_key(run.variant.id, params, run.state.dtype, "screen", "search"))
        return rec.evaluation if rec else None

    def _next_trial(self, run: VariantRun) -> None:
        study = run.study
        assert study is not None
        if study.remaining() == 0 or study.defaults_failed():
            best = study.best_params() or run.defaults
            found = run.evals.get(params_key(best)) or self._lookup(run, best)
            if found is None:  # every trial failed: report the defaults' verdict
                found = run.evals.get(params_key(run.defaults)) or self._lookup(run, run.defaults)
            assert found is not None, "a finished study without any recorded evaluation"
            return self._variant_done(run, found)
        number, params = study.ask()
        run.state.trials += 1

        def told(ev: Evaluation) -> None:
            run.evals[params_key(params)] = ev
            study.tell(number, ev)
            self._next_trial(run)

        job = Job(run.state, run.variant, "screen", params, told, agent=run.agent, trial=number)
        self._submit(job, compiled=False)

    def _variant_done(self, run: VariantRun, evaluation: Evaluation) -> None:
        st = run.state
        self._set_final(st, run.variant.id, evaluation)
        item = scored(run.variant, evaluation, "screen")
        if item is not None:
            st.offer(run.agent, item)
        self._attempt_done(run, evaluation)

    def _attempt_done(self, run: VariantRun, evaluation: Evaluation) -> None:
        st = run.state
        if st.round is not None and run.agent is not None:
            st.round.attempts.setdefault(run.agent, []).append(Attempt(run.variant, evaluation))
        self._close(st)

    # -- rounds ---------------------------------------------------------------------------

    def _start_round(self, st: KernelState) -> None:
        cfg = self.config.search
        if st.rounds_done >= cfg.rounds:
            st.round = None
            return
        number = st.rounds_done
        st.round = RoundState(number, outstanding=1)  # held open until every agent answered
        for i in range(cfg.population):
            self._open(st)
            saved = self.saved.get((st.name, number, i))
            if saved is not None:
                self._ready.append(partial(self._on_proposals, st, i, saved, False))
                continue
            seed = self.config.seed * 1000 + i
            ref = self.agents[i].propose.remote(st.context(i, number, cfg.variants, seed))
            self._tasks[ref] = partial(self._on_proposals_fresh, st, i)
        self._close(st)

    def _on_proposals_fresh(self, st: KernelState, agent: int, proposals: list[Proposal]) -> None:
        self._on_proposals(st, agent, proposals, True)

    def _on_proposals(self, st: KernelState, agent: int, proposals: list[Proposal], fresh: bool) -> None:
        assert st.round is not None
        st.round.attempts.setdefault(agent, [])
        for index, proposal in enumerate(proposals):
            variant = _stamp(proposal.variant, st, agent, st.round.number)
            if fresh:
                proposal = replace(proposal, variant=variant)
                self.records.proposal(st.name, st.dtype, st.round.number, agent_name(agent), proposal, index, len(proposals))
            if proposal.failure:
                continue
            st.variants.setdefault(variant.id, variant)
            st.notes.setdefault(variant.id, {"agent": agent, "transformation": proposal.transformation})
            self._start_variant(st, agent, variant)
        self._close(st)

    def _start_contenders(self, st: KernelState) -> None:
        assert st.round is not None
        st.round.phase = "full"
        st.round.outstanding = 1
        for item in pick_contenders(st.round.scored, self.config.search.contenders, st.full_done):
            st.full_done.add(item.variant.id)
            self._open(st)
            agent = st.notes.get(item.variant.id, {}).get("agent")
            job = Job(st, item.variant, "full", item.params, partial(self._on_full, st, item, agent), agent=agent)
            self._submit(job, compiled=False)
        self._close(st)

    def _on_full(self, st: KernelState, item: Scored, agent: int | None, evaluation: Evaluation) -> None:
        full = scored(item.variant, evaluation, "full")
        if full is None:
            st.archive.remove(item.variant.id)  # correct when screened, not under the full protocol
        else:
            st.offer(agent, full)
        self._close(st)

    def _end_round(self, st: KernelState) -> None:
        assert st.round is not None
        for agent, attempts in st.round.attempts.items():
            st.history[agent].extend(attempts)
            self.agents[agent].observe.remote(st.name, attempts)
        if st.round.number >= self.recorded_rounds.get(st.name, 0):
            self.records.round_done(st.name, st.round.number)
        st.rounds_done += 1
        self.progress.update(self, force=True)
        self._start_round(st)


def _stamp(variant: Variant, st: KernelState, agent: int, round_: int) -> Variant:
    """Fills the lineage fields an agent left empty."""
    return replace(
        variant,
        kernel=variant.kernel or st.name,
        author=variant.author or agent_name(agent),
        round=round_ if not variant.round else variant.round,
    )


def _complete_batches(proposals: list[dict[str, Any]]) -> dict[tuple[str, int, int], list[Proposal]]:
    """Recorded agent replies that were written in full (a kill can cut one short; the
    agent is then asked again and its new reply, starting at index 0, replaces the torn one)."""
    batches: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for p in proposals:
        key = (p["kernel"], int(p["round"]), int(str(p["agent"]).removeprefix("agent")))
        if int(p["index"]) == 0:
            batches[key] = []
        batches.setdefault(key, []).append(p)
    return {
        key: [Proposal(Variant.from_dict(p["variant"]), p.get("transformation", ""), (), p.get("failure", ""))
              for p in items]
        for key, items in batches.items()
        if items and len(items) == int(items[0]["batch"]) and [int(p["index"]) for p in items] == list(range(len(items)))
    }
