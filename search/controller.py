"""The search driver: rounds of proposals, admission, tuning and timing, pipelined on Ray.

Each kernel moves through its rounds on its own: proposals and tuning (stage screen), then
the full timing protocol for the round's contenders (stage full), then the verdicts go back
to the agents. Every evaluation goes through :class:`search.jobs.Evaluations` (the one path,
also for the end of the run, :mod:`search.finalize`).

Runs are reproducible: nothing that is recorded depends on the order in which Ray returns
results. Proposals are taken up in (agent, slot) order (so deduplication by source and by
binary picks the same variant every time), the round's screening cutoff is fixed when the
round starts, selection breaks ties by variant id, tuning asks are seeded per trial, and an
agent's seed depends on (run seed, kernel, round, slot) only.

Resuming is replay: recorded replies stand in for agent calls, and recorded evaluations
(keyed by kernel, variant id, parameters, dtype, stage and shape set) stand in for evaluator runs,
so a resumed run rebuilds the same state and evaluates nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from agents.base import Attempt, Proposal, derive_seed
from kernels.records import Stage, params_key
from kernels.variant import Variant
from kernels.verdict import Evaluation, Status
from search.config import RunConfig
from search.jobs import Admission, Evaluations, Job, agent_name
from search.pool import EvalPool
from search.records import RunHistory, RunRecords
from search.selection import Scored, pick_contenders, scored
from search.state import Entry, KernelState, RoundState
from search.tuning import TuningStore, VariantStudy


@dataclass
class VariantRun:
    """One variant's way through admission and tuning within a round."""

    state: KernelState
    agent: int | None
    slot: int
    variant: Variant
    defaults: dict[str, int] = field(default_factory=dict)
    study: VariantStudy | None = None
    evals: dict[str, Evaluation] = field(default_factory=dict)


class Controller(Evaluations):
    """Runs the search over all kernels until every kernel has done its rounds.

    Args:
        config: the resolved run configuration.
        states: one state per kernel.
        records: the run's record writer.
        pool: the evaluator actors.
        agents: the agent actor handles (one per population member).
        tuning: the tuning studies.
        progress: the live progress line.
        history: records of an earlier attempt at this run (``--resume``), or None.
        on_tick: called on every turn of the loop.
    """

    def __init__(self, config: RunConfig, states: list[KernelState], records: RunRecords, pool: EvalPool,
                 agents: list[Any], tuning: TuningStore, progress: Any, history: RunHistory | None = None,
                 on_tick: Callable[[], None] | None = None) -> None:
        super().__init__(config, records, pool, progress, history, on_tick)
        self.states, self.agents, self.tuning = states, agents, tuning
        self.recorded_rounds = dict(history.rounds_done) if history else {}
        self.saved = recorded_replies(history) if history else {}

    def run(self) -> None:
        for st in self.states:
            job = Job(st, st.baseline, Stage.SCREEN, {}, partial(self._on_baseline, st))
            self.admit(st, st.baseline, {}, partial(self.first_screen, job))
        self.drain(lambda: all(st.rounds_done >= self.config.search.rounds for st in self.states))
        self.progress.update(self, force=True)

    def _open(self, st: KernelState) -> None:
        if st.round is not None:
            st.round.outstanding += 1

    def _close(self, st: KernelState) -> None:
        if st.round is None:
            return
        st.round.outstanding -= 1
        if st.round.outstanding == 0:
            if st.round.phase is Stage.SCREEN:
                self._start_contenders(st)
            else:
                self._end_round(st)

    def _on_baseline(self, st: KernelState, evaluation: Evaluation) -> None:
        st.set_baseline(evaluation)
        st.dedupe.add_source(st.baseline.id)
        self.set_final(st, st.baseline.id, evaluation)
        self._start_round(st)

    # -- proposals, in (agent, slot) order -----------------------------------------------

    def _start_round(self, st: KernelState) -> None:
        cfg = self.config.search
        if st.rounds_done >= cfg.rounds:
            st.round = None
            return
        number = st.rounds_done
        st.round = RoundState(number, outstanding=1, best_ms=st.best_ms())  # open until every agent answered
        for i in range(cfg.population):
            self._open(st)
            saved = self.saved.get((st.name, number, i))
            if saved is not None:
                self.later(partial(self._on_proposals, st, i, saved, False))
                continue
            seed = derive_seed(self.config.seed, st.name, number, i)
            ref = self.agents[i].propose.remote(st.context(i, number, cfg.variants, seed))
            self.await_ref(ref, partial(self._on_fresh_proposals, st, i), "agent answer")
        self._close(st)

    def _on_fresh_proposals(self, st: KernelState, agent: int, proposals: list[Proposal]) -> None:
        self._on_proposals(st, agent, proposals, True)

    def _on_proposals(self, st: KernelState, agent: int, proposals: list[Proposal], fresh: bool) -> None:
        r = st.round
        assert r is not None
        entries = []
        for index, proposal in enumerate(proposals):
            variant = _stamp(proposal.variant, st, agent, r.number)
            if fresh:
                self.records.proposal(st.name, st.dtype, r.number, agent_name(agent),
                                      replace(proposal, variant=variant), index, len(proposals))
            entries.append(Entry(agent, index, variant, bool(proposal.failure), proposal.transformation))
        if fresh:
            self.records.reply(st.name, r.number, agent_name(agent), len(proposals))
        for e in entries:
            if e.failed:
                continue
            self._open(st)
            vid = e.variant.id
            if vid not in r.admissions and not st.dedupe.known_source(vid):
                r.admissions[vid] = None  # asked for; admission is pure, so asking early is safe
                self.admit(st, e.variant, {}, partial(self._on_admission, st, r, vid))
        r.replies[agent] = entries
        self._advance(st)
        self._close(st)

    def _on_admission(self, st: KernelState, r: RoundState, variant_id: str, admission: Admission) -> None:
        r.admissions[variant_id] = admission
        if st.round is r:
            self._advance(st)

    def _advance(self, st: KernelState) -> None:
        """Takes up the round's proposals in (agent, slot) order as far as answers allow."""
        r = st.round
        assert r is not None
        agent, slot = r.cursor
        while agent < self.config.search.population and agent in r.replies:
            entries = r.replies[agent]
            while slot < len(entries):
                if not self._take_up(st, entries[slot]):
                    r.cursor = (agent, slot)
                    return
                slot += 1
            agent, slot = agent + 1, 0
        r.cursor = (agent, slot)

    def _take_up(self, st: KernelState, e: Entry) -> bool:
        """Starts one proposal; False when its admission has not answered yet."""
        if e.failed:
            return True
        assert st.round is not None
        run = VariantRun(st, e.agent, e.slot, e.variant)
        if st.dedupe.known_source(e.variant.id):
            self.when_final(st, e.variant.id, lambda ev: self._attempt_done(run, ev))
            return True
        admission = st.round.admissions.get(e.variant.id)
        if admission is None:
            return False
        st.dedupe.add_source(e.variant.id)
        st.variants.setdefault(e.variant.id, e.variant)
        st.notes.setdefault(e.variant.id, {"agent": e.agent, "transformation": e.transformation})
        job = Job(st, e.variant, Stage.SCREEN, {}, lambda ev: self._on_first(run, ev), agent=e.agent,
                  on_same=lambda ev: self._same_binary(run, ev))
        self.first_screen(job, admission)
        return True

    # -- variants: tuning, verdicts -------------------------------------------------------

    def _same_binary(self, run: VariantRun, evaluation: Evaluation) -> None:
        # The earlier variant's verdict is this one's too (later copies of its source wait on it).
        self.set_final(run.state, run.variant.id, evaluation)
        self._attempt_done(run, evaluation)

    def _on_first(self, run: VariantRun, evaluation: Evaluation) -> None:
        """The variant was admitted (or not) at its defaults; tune it or take the verdict."""
        st, launch = run.state, None
        if evaluation.status not in (Status.COMPILE_ERROR, Status.RESOURCE_ERROR):
            launch = run.variant.launch()
        if launch is None or not launch.tune or self.config.search.trials <= 1:
            run.evals[params_key(evaluation.params)] = evaluation
            return self._variant_done(run, evaluation)
        run.defaults = launch.default_params()
        run.study = self.tuning.study(st.name, run.variant.id, st.dtype, launch.tune, self.config.search.trials,
                                      parent=run.variant.parent)
        self._next_trial(run)

    def _next_trial(self, run: VariantRun) -> None:
        study = run.study
        assert study is not None
        if study.remaining() == 0 or study.defaults_failed():
            best = study.best_params() or run.defaults
            found = run.evals.get(params_key(best)) or run.evals.get(params_key(run.defaults))
            assert found is not None, "a finished study without any evaluation"
            return self._variant_done(run, found)
        number, params = study.ask()

        def told(ev: Evaluation) -> None:
            run.evals[params_key(params)] = ev
            study.tell(number, ev)
            self._next_trial(run)

        self.submit(Job(run.state, run.variant, Stage.SCREEN, params, told, agent=run.agent, trial=number))

    def _variant_done(self, run: VariantRun, evaluation: Evaluation) -> None:
        st = run.state
        self.set_final(st, run.variant.id, evaluation)
        item = scored(run.variant, evaluation, Stage.SCREEN)
        if item is not None:
            st.offer(run.agent, item)
        self._attempt_done(run, evaluation)

    def _attempt_done(self, run: VariantRun, evaluation: Evaluation) -> None:
        st = run.state
        if st.round is not None and run.agent is not None:
            st.round.attempts.setdefault(run.agent, {})[run.slot] = Attempt(run.variant, evaluation)
        self._close(st)

    # -- rounds ---------------------------------------------------------------------------

    def _start_contenders(self, st: KernelState) -> None:
        assert st.round is not None
        st.round.phase = Stage.FULL
        st.round.outstanding = 1
        for item in pick_contenders(st.round.scored, self.config.search.contenders, st.full_done):
            st.full_done.add(item.variant.id)
            self._open(st)
            agent = st.notes.get(item.variant.id, {}).get("agent")
            self.submit(Job(st, item.variant, Stage.FULL, item.params, partial(self._on_full, st, item, agent),
                            agent=agent))
        self._close(st)

    def _on_full(self, st: KernelState, item: Scored, agent: int | None, evaluation: Evaluation) -> None:
        full = scored(item.variant, evaluation, Stage.FULL)
        if full is None:
            st.drop(item.variant.id)  # correct when screened, not under the full protocol
        else:
            st.offer(agent, full)
        self._close(st)

    def _end_round(self, st: KernelState) -> None:
        assert st.round is not None
        for agent, attempts in st.round.attempts_in_order().items():
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


def recorded_replies(history: RunHistory) -> dict[tuple[str, int, int], list[Proposal]]:
    """Agent replies on record, by (kernel, round, agent): complete batches of proposals, and
    empty replies (a line in ``replies.jsonl`` with no proposals)."""
    saved = _complete_batches(history.proposals)
    for reply in history.replies:
        key = (reply["kernel"], int(reply["round"]), _agent_index(reply["agent"]))
        if int(reply["proposals"]) == 0:
            saved[key] = []
    return saved


def _agent_index(name: str) -> int:
    return int(str(name).removeprefix("agent"))


def _complete_batches(proposals: list[dict[str, Any]]) -> dict[tuple[str, int, int], list[Proposal]]:
    """Recorded agent replies that were written in full (a kill can cut one short; the
    agent is then asked again and its new reply, starting at index 0, replaces the torn one)."""
    batches: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for p in proposals:
        key = (p["kernel"], int(p["round"]), _agent_index(p["agent"]))
        if int(p["index"]) == 0:
            batches[key] = []
        batches.setdefault(key, []).append(p)
    return {
        key: [Proposal(Variant.from_dict(p["variant"]), p.get("transformation", ""), (), p.get("failure", ""))
              for p in items]
        for key, items in batches.items()
        if items and len(items) == int(items[0]["batch"]) and [int(p["index"]) for p in items] == list(range(len(items)))
    }
