"""End of a run: held-out re-validation of the winners, sanitizer, final timing, peers, best files.

Every step is a stage of the controller over the same evaluator pool (retries, replacement of
dead actors) and every evaluation is recorded by the same code as the search's:

1. held-out: each kernel's elites, in rank order, on the held-out shapes (the spec's fixed
   ones and those drawn for this run) until one passes; the baseline is the last resort. The
   variants that would be dispatched by shape beside the winner (:mod:`search.dispatch`) are
   checked on the same shapes; one that fails is left out;
2. the peers' warm-up (search.run) is stopped, the compilations and the peers' rounds begun
   beside the search (:mod:`search.compile_ahead`; the rounds time once the search is over,
   beside the held-out checks) are waited for, and the pool is renewed (fresh evaluators, one
   per GPU);
3. per kernel (each answer recorded, so a resumed run picks up where it stopped): the
   dispatch's choice loop (its kernels alone: which runs on which shape) and the final timing
   of each kernel kept (stage final: the evaluator's verdict and A/A noise floor);
4. once every kernel's final timing is in, for all kernels at once: compute-sanitizer on each
   kernel kept (a winner with findings is replaced by the baseline, whose held-out verdict
   and final timing are then evaluated and recorded too; another kernel with findings is
   dropped) and, beside it, the peers' torch.compile programs compiled ahead (once per kernel
   and shape set) where none was made beside the search; then the production peers timed in
   one loop with our kernels and the baseline, repeated in ``peer_runs`` fresh sandbox processes: every reported ratio, "vs
   baseline" included, is taken from these loops.

A failure of one kernel's step (an evaluator error, an actor that keeps dying) is recorded for
that kernel and the others finish.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ray.exceptions import RayError

from evaluators.peer_warmup import PeerWarmup
from kernels.records import ShapeSet, Stage
from kernels.spec import shape_label
from kernels.verdict import Evaluation, ShapeResult
from search.compile_ahead import CompiledAhead, folder_name
from search.config import EvaluatorConfig
from search.controller import Controller
from search.dispatch import Dispatch, choose, single
from search.jobs import Job
from search.peer_cache import PeerCache, default_folder, with_cached
from search.pool import EvalPool
from search.selection import Scored
from search.spread import median_times
from search.stages import StageClock, by_kind
from search.state import KernelState

LOOP_ERROR = "peers' loop"  # key of peer_errors when the whole loop could not run
MEMBER_PREFIX = "best:"  # a dispatch member's name in the peers' loop is this and its variant id


@dataclass
class KernelResult:
    """The outcome for one kernel.

    Attributes:
        state: the kernel's search state.
        winner: the variant reported (at its best parameters); with dispatch members, the
            primary (the one that runs where no member was faster).
        heldout: its verdict on the held-out shapes (with members: each shape's result from
            the member that runs there, :meth:`search.dispatch.Dispatch.member_for`).
        final: its full-protocol timing on the search shapes, in a fresh evaluator (composed
            the same way).
        peers: ``{implementation: {shape label: ms}}`` from the peers' loop on the search
            shapes; empty when the winner failed verification in that loop.
        rejected: variants that were better on the search shapes but failed held-out (or
            the sanitizer).
        sanitizer: the sanitizer's report (``status``, ``summary``, ...).
        peer_errors: ``{peer: why it was not timed}``.
        peer_failures: ``{our kernel: why}`` for our kernels (``best``, ``baseline``) that
            failed verification in the reported peers' loop (no ratios are taken from it).
        rejected_why: ``{variant id: why}`` for winners dropped after the held-out stage: a
            winner that fails verification in the peers' loop is replaced by the baseline (and
            listed in ``rejected``), so no cheat is reported as a winner or with ratios.
        dispatch: the winner and the variants dispatched beside it by shape (None: the
            winner alone); ``member_heldout``, ``member_final``, ``member_sanitizer``: each
            member's own verdicts by variant id; ``choice_ms``: the loop that settled which
            member runs where (``{name: {shape label: ms}}``).
    """

    state: KernelState
    winner: Scored
    heldout: Evaluation
    final: Evaluation
    peers: dict[str, dict[str, float]] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    sanitizer: dict[str, Any] = field(default_factory=dict)
    peer_errors: dict[str, str] = field(default_factory=dict)
    peer_failures: dict[str, str] = field(default_factory=dict)
    rejected_why: dict[str, str] = field(default_factory=dict)
    peer_runs: list[dict[str, dict[str, float]]] = field(default_factory=list)
    peer_extra: dict[str, Any] = field(default_factory=dict)
    dispatch: Dispatch | None = None
    member_heldout: dict[str, Evaluation] = field(default_factory=dict)
    member_final: dict[str, Evaluation] = field(default_factory=dict)
    member_sanitizer: dict[str, dict[str, Any]] = field(default_factory=dict)
    choice_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    heldout_peers: dict[str, dict[str, float]] = field(default_factory=dict)
    heldout_peer_runs: list[dict[str, dict[str, float]]] = field(default_factory=list)
    heldout_peer_extra: dict[str, Any] = field(default_factory=dict)


def combine_heldout(result: KernelResult, runs: list[dict[str, Any]]) -> None:
    """Fills the held-out fields of ``result`` from the replies of the loops on the spec's fixed
    held-out shapes, as :func:`combine_runs` fills the search shapes' (a kernel of ours that
    failed verification there gets no held-out ratios)."""
    scratch = KernelResult(result.state, result.winner, result.heldout, result.final)
    combine_runs(scratch, runs)
    result.heldout_peers, result.heldout_peer_runs = scratch.peers, scratch.peer_runs
    result.heldout_peer_extra = {**scratch.peer_extra, "errors": scratch.peer_errors,
                                 "failures": scratch.peer_failures,
                                 "shapes": [shape_label(dict(s)) for s in result.state.spec.heldout_shapes]}


def combine_runs(result: KernelResult, runs: list[dict[str, Any]]) -> None:
    """Fills ``result`` from the replies of the repeated end-of-run loop (a reply is
    ``{"loop_error": why}`` for a loop that could not run).

    ``peer_runs`` keeps each loop's times; ``peers`` their per-shape medians (for the
    tables); a kernel of ours that failed verification in any loop gets no ratios at all.
    ``peer_extra`` keeps, per loop, which torch.compile compilation won each shape, what each
    peer's time covers, the L2 persistence state the loop ran under, its set-up and timed
    seconds (``phase_s``), the set-up seconds per peer (``prepare_s_by_peer``: every shape's and
    the first shape's), what the peers' libraries built on disk (``jit_builds``) and, compiled
    ahead, what it loaded (``compile_cache``); with dispatch
    members (replies made by :func:`compose_reply`), each member's own times per loop and
    the members that failed verification (they were dropped, their shapes given to the
    winner, which the same loops timed: the ratios stand).
    """
    errors: dict[str, str] = {}
    failed: dict[str, str] = {}
    timed: list[dict[str, dict[str, float]]] = []
    extra: dict[str, Any] = {"compiled": [], "notes": {}, "l2_persistence": [], "l2_findings": []}
    member_failures: dict[str, str] = {}
    for i, reply in enumerate(runs, 1):
        if "loop_error" in reply:
            errors[f"{LOOP_ERROR} (run {i})"] = reply["loop_error"]
            continue
        for peer, why in reply.get("errors", {}).items():
            errors.setdefault(peer, why)
        for ours, why in reply.get("failed", {}).items():
            (member_failures if ours.startswith(MEMBER_PREFIX) else failed).setdefault(ours, f"run {i}: {why}")
        if "members_ms" in reply:
            extra.setdefault("members_ms", []).append(reply["members_ms"])
        timed.append(dict(reply.get("peers", {})))
        extra["compiled"].append(dict(reply.get("compiled", {})))
        extra["notes"].update(reply.get("notes", {}))
        extra["l2_persistence"].append(reply.get("l2_persistence", {}))
        extra.setdefault("phase_s", []).append(dict(reply.get("phase_s", {})))
        extra.setdefault("prepare_s_by_peer", []).append(
            {"total": dict(reply.get("prepare_s_by_peer", {})),
             "first_shape": dict(reply.get("prepare_s_first_shape_by_peer", {}))})
        if "compile_cache" in reply:
            extra.setdefault("compile_cache", []).append(dict(reply["compile_cache"]))
        extra.setdefault("jit_builds", []).append(dict(reply.get("jit_builds", {})))
        if reply.get("l2_finding"):
            extra["l2_findings"].append(f"run {i}: {reply['l2_finding']}")
        # where this loop's peer figures come from: None when it timed them itself
        extra.setdefault("cached_peers", []).append(reply.get("cached_peers"))
    if member_failures:
        extra["member_failures"] = member_failures
    result.peer_errors, result.peer_failures, result.peer_extra = errors, failed, extra
    # A kernel that failed verification in a loop gets no ratios from any of them.
    result.peer_runs = [] if failed else timed
    result.peers = {} if failed else median_times(timed)


@dataclass
class _Progress:
    """One kernel's way through the end of the run."""

    st: KernelState
    queue: list[Scored]
    winner: Scored | None = None
    heldout: Evaluation | None = None
    rejected: list[str] = field(default_factory=list)
    sanitizer: dict[str, Any] = field(default_factory=dict)
    rejected_why: dict[str, str] = field(default_factory=dict)
    result: KernelResult | None = None
    # Per-shape dispatch (search.dispatch): the winner and the members that joined it, and
    # per member (variant id) its held-out verdict, sanitizer report and final timing.
    dispatch: Dispatch | None = None
    member_heldout: dict[str, Evaluation] = field(default_factory=dict)
    member_sanitizer: dict[str, dict[str, Any]] = field(default_factory=dict)
    member_final: dict[str, Evaluation] = field(default_factory=dict)
    choice_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    # compile-ahead (search.finalize.EndOfRun.compile_ahead): per (shape set, loop) the folder
    # its compilations were made in, None where they failed or were not made
    folders: dict[tuple[str, int], str | None] = field(default_factory=dict)
    # and per shape set the peers whose first calls there ended its process, on which shapes and
    # why ({peer: {shape label: why}}): the loops leave them out there from the start
    crashes: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    # After the final timing, the sanitizer runs and the peers' loops go on side by side
    # (EndOfRun._beside): the result is put together once both are in (_assemble). A new
    # winner (the baseline, after a finding) starts a new generation; answers of an older one
    # are dropped.
    timed: bool = False  # the final timing is in: the sanitizer and the loops may start
    started: bool = False
    sanitized: bool = False
    looped: tuple[list[_LoopPlan], list[list[dict[str, Any]]]] | None = None
    generation: int = 0


@dataclass
class _LoopPlan:
    """The end-of-run loops of one kernel on one shape set.

    Attributes:
        shape_set: the shapes they time.
        ours: our kernels in them, ``{name: (source, params)}``.
        keys: per loop, its peer-cache key ("" without a cache).
        hits: per loop, the cached entry whose peer figures it takes (None: it times the peers).
        record_keys: per loop, the key its answer is recorded under (for resume).
        folders: per loop, the folder its torch.compile programs were compiled into ahead of it.
    """

    shape_set: ShapeSet
    ours: dict[str, tuple[str, dict[str, int]]]
    keys: list[str]
    hits: list[dict[str, Any] | None]
    record_keys: list[str]
    folders: list[str | None]


def member_name(item: Scored) -> str:
    """A dispatch member's name in the peers' loop (the primary is ``best``)."""
    return f"{MEMBER_PREFIX}{item.variant.id}"


def compose_reply(reply: dict[str, Any], dispatch: Dispatch,
                  shapes: Sequence[Mapping[str, int]] | None = None) -> dict[str, Any]:
    """A loop's reply with ``best`` made of each shape's member (``members_ms`` keeps every
    member's own times, which are not peers and leave ``peers``); ``shapes``: the loop's shapes
    when they are not the search shapes (each shape's member by the dispatch rule)."""
    peers = {n: dict(t) for n, t in reply.get("peers", {}).items()}
    members = {n: peers.pop(n) for n in list(peers) if n.startswith(MEMBER_PREFIX)}
    chosen = (dispatch.table.items() if shapes is None
              else [(shape_label(dict(s)), dispatch.member_for(s)) for s in shapes])
    if "best" in peers:
        for label, i in chosen:
            if i > 0:
                mine = members.get(member_name(dispatch.members[i]), {})
                if label in mine:
                    peers["best"][label] = mine[label]
    return {**reply, "peers": peers, "members_ms": members}


def compose_evaluation(dispatch: Dispatch, per_member: Mapping[str, Evaluation],
                       shapes: Sequence[Mapping[str, int]]) -> Evaluation:
    """One evaluation of the dispatch on ``shapes``: each shape's result from its member's
    evaluation (every member was evaluated on all of them); a shape its member has no time
    for (a validated-only shape) keeps the primary's, if any. The primary's evaluation itself
    where there is one member or the primary's verdict is not OK."""
    primary = per_member[dispatch.primary.variant.id]
    if len(dispatch.members) == 1 or not primary.status.is_ok:
        return primary

    def timed(evaluation: Evaluation) -> dict[str, ShapeResult]:
        return {shape_label(r.shape): r for r in evaluation.shapes}

    own = timed(primary)
    results = []
    for shape in shapes:
        label = shape_label(dict(shape))
        found = timed(per_member[dispatch.members[dispatch.member_for(shape)].variant.id]).get(label, own.get(label))
        if found is not None:
            results.append(found)
    return replace(primary, shapes=tuple(results))


class EndOfRun:
    """The stages of the end of a run, for every kernel at once, over the controller's pool.

    Args:
        ctl: the controller whose search has finished.
    """

    def __init__(self, ctl: Controller, cache: PeerCache | None = None, ahead: CompiledAhead | None = None) -> None:
        self.ctl = ctl
        self.cache = cache
        self.ahead = ahead  # compilations made beside the search (search.compile_ahead)
        # progress over the peers' loops (one line each, with an estimate of what is left)
        cfg = ctl.config.evaluator
        self.loops_expected = (sum(cfg.peer_runs * len(loop_sets(st)) for st in ctl.states)
                               if cfg.peers else 0)
        self.loops_done = 0
        self.loops_started = time.time()
        self.compiling = 0  # compile-ahead processes in flight
        self.released = False  # every final timing is in: the non-exclusive calls have begun
        self.waiting: list[Callable[[], None]] = []  # rounds to start once none is
        self.kernels: dict[str, _Progress] = {}
        for st in ctl.states:
            assert st.baseline_scored is not None
            self.kernels[st.name] = _Progress(st, [*st.archive.ranked(), st.baseline_scored])

    # -- held-out -------------------------------------------------------------------------

    def heldout(self) -> None:
        """Walks each kernel's elites in rank order until one passes on the held-out shapes,
        then checks the members that would join it (:mod:`search.dispatch`) on the same
        shapes; a member that fails them is left out."""
        for k in self.kernels.values():
            self._next_heldout(k)
        self.ctl.drain(lambda: all(k.winner is not None for k in self.kernels.values()))
        for k in self.kernels.values():
            self._choose_members(k)
        self.ctl.drain(lambda: all(self._members_checked(k) for k in self.kernels.values()))
        for k in self.kernels.values():
            assert k.dispatch is not None
            for item in k.dispatch.members[1:]:
                verdict = k.member_heldout[item.variant.id]
                if not verdict.status.is_ok:
                    self._drop_member(k, item, f"held-out: {verdict.status.value} {verdict.message}")

    def _heldout_job(self, st: KernelState, item: Scored, then: Callable[[Evaluation], None]) -> Job:
        return Job(st, item.variant, Stage.HELDOUT, item.params, then, shape_set=ShapeSet.HELDOUT)

    def _next_heldout(self, k: _Progress) -> None:
        item = k.queue[0]

        def done(evaluation: Evaluation) -> None:
            if evaluation.status.is_ok or item.variant.id == k.st.baseline.id:
                k.winner, k.heldout = item, evaluation
                return
            k.st.drop(item.variant.id)
            k.rejected.append(item.variant.id)
            k.rejected_why[item.variant.id] = f"held-out: {evaluation.status.value} {evaluation.message}"[:500]
            k.queue.pop(0)
            self._next_heldout(k)

        self.ctl.submit(self._heldout_job(k.st, item, done))

    def _choose_members(self, k: _Progress) -> None:
        assert k.winner is not None and k.heldout is not None
        shapes = k.st.search_shapes()
        k.member_heldout = {k.winner.variant.id: k.heldout}
        if k.winner.variant.id == k.st.baseline.id:
            k.dispatch = single(k.winner, shapes)
            return
        others = [s for s in k.st.archive.ranked(limit=False)
                  if s.variant.id not in (k.winner.variant.id, k.st.baseline.id)]
        k.dispatch = choose(k.winner, others, shapes, max_members=self.ctl.config.search.dispatch)
        for item in k.dispatch.members[1:]:
            def done(evaluation: Evaluation, item: Scored = item) -> None:
                k.member_heldout[item.variant.id] = evaluation

            self.ctl.submit(self._heldout_job(k.st, item, done))

    def _members_checked(self, k: _Progress) -> bool:
        return k.dispatch is not None and all(m.variant.id in k.member_heldout for m in k.dispatch.members)

    def _drop_member(self, k: _Progress, item: Scored, why: str) -> None:
        """Takes ``item`` out of the dispatch, its shapes to the winner; a member dropped
        before (by its loops, when the sanitizer reports after them) keeps its first reason."""
        assert k.dispatch is not None
        index = next((i for i, m in enumerate(k.dispatch.members) if m.variant.id == item.variant.id), None)
        if index is None:
            return
        k.dispatch = k.dispatch.without(index)
        k.rejected_why[item.variant.id] = f"dispatch member dropped: {why}"[:500]

    # -- sanitizer, final timing, peers -----------------------------------------------------

    def finish(self) -> list[KernelResult]:
        """Dispatch choice loop, final timing, then sanitizer and peers for every kernel (with
        the peers' compilations made ahead of them all where compile_ahead is on,
        :meth:`compile_ahead`); returns the results in order."""
        for k in self.kernels.values():
            self._choose(k)
        self.ctl.drain(lambda: all(k.result is not None for k in self.kernels.values()))
        return [self.kernels[st.name].result for st in self.ctl.states]  # type: ignore[misc]

    def _sanitize(self, k: _Progress) -> None:
        """compute-sanitizer on every member of the kernel's result (the winner and those
        joining it), all at once, beside the kernel's peers' loops (:meth:`_beside`). A winner
        with findings is replaced by the baseline (its loops' answers are dropped); a member
        with findings leaves the dispatch."""
        assert k.winner is not None and k.dispatch is not None
        cfg = self.ctl.config.evaluator
        if not cfg.sanitize or k.winner.variant.id == k.st.baseline.id:
            k.sanitizer = {"status": "SKIPPED", "summary": "not asked for" if not cfg.sanitize else "baseline"}
            k.sanitized = True
            self._assemble(k)
            return
        members = list(k.dispatch.members)
        k.member_sanitizer = {}
        generation = k.generation

        def done(item: Scored, report: dict[str, Any] | None, error: str) -> None:
            if k.generation != generation:
                return  # about a winner replaced meanwhile (it failed in a peers' loop)
            report = report if report is not None else {"status": "ERROR", "summary": error}
            k.member_sanitizer[item.variant.id] = report
            print(f"end {k.st.name}: sanitizer {report.get('status')}"
                  + ("" if item is members[0] else f" (dispatch member {item.variant.id})"), file=sys.stderr, flush=True)
            if len(k.member_sanitizer) < len(members):
                return
            assert k.winner is not None
            k.sanitizer = k.member_sanitizer[k.winner.variant.id]
            if k.sanitizer.get("status") == "FINDINGS":
                k.rejected_why[k.winner.variant.id] = f"sanitizer: {k.sanitizer.get('summary', '')}"[:500]
                self._to_baseline(k)  # a latent memory bug or race: not reported, whatever its speed
                return
            for other in members[1:]:
                found = k.member_sanitizer[other.variant.id]
                if found.get("status") == "FINDINGS":
                    self._drop_member(k, other, f"sanitizer: {found.get('summary', '')}")
            k.sanitized = True
            self._assemble(k)

        shapes = [*k.st.search_shapes(), *k.st.heldout_shapes()]
        for item in members:
            # Sanitizer runs are separate, mostly host-bound processes: they overlap on an actor.
            self.ctl.recorded_call(_call_key("sanitize", k, item=item), partial(done, item), "sanitize", k.st.ref,
                                   item.variant.source, k.st.dtype, dict(item.params), shapes, exclusive=False,
                                   what=f"{k.st.name} {item.variant.id}")

    def _to_baseline(self, k: _Progress) -> None:
        assert k.winner is not None and k.st.baseline_scored is not None
        # A new generation: what is still in flight about the old winner is dropped on arrival.
        k.generation += 1
        k.timed = k.started = k.sanitized = False
        k.looped = None
        k.rejected.append(k.winner.variant.id)
        k.winner = k.st.baseline_scored
        k.dispatch = single(k.winner, k.st.search_shapes())

        def done(evaluation: Evaluation) -> None:
            k.heldout = evaluation
            k.member_heldout = {k.st.baseline.id: evaluation}
            self._final(k)

        self.ctl.submit(self._heldout_job(k.st, k.winner, done))

    def _final(self, k: _Progress) -> None:
        """The final timing of every member (a timed call: before any sanitizer run or peers'
        loop of the kernel, see :meth:`_beside`)."""
        assert k.winner is not None and k.dispatch is not None
        members = list(k.dispatch.members)
        k.member_final = {}

        def done(item: Scored, evaluation: Evaluation) -> None:
            k.member_final[item.variant.id] = evaluation
            if len(k.member_final) < len(members):
                return
            for other in members[1:]:
                if not k.member_final[other.variant.id].status.is_ok:
                    verdict = k.member_final[other.variant.id]
                    self._drop_member(k, other, f"final timing: {verdict.status.value} {verdict.message}")
            k.timed = True
            self._beside()

        for item in members:
            self.ctl.submit(Job(k.st, item.variant, Stage.FINAL, item.params, partial(done, item)))

    def _choose(self, k: _Progress) -> None:
        """Which member runs on which search shape, settled by one loop of the members alone
        (interleaved, no peers) apart from the loops that report them (search.dispatch),
        first, so that a member it drops costs no sanitizer run or final timing; then the
        final timing."""
        assert k.winner is not None and k.dispatch is not None
        if len(k.dispatch.members) == 1 or not self.ctl.config.evaluator.peers:
            self._final(k)
            return
        ours = _ours(k)

        def done(reply: dict[str, Any] | None, error: str) -> None:
            assert k.dispatch is not None
            if reply is not None:
                timed = reply.get("peers", {})
                failed = reply.get("failed", {})
                names = ["best", *(member_name(m) for m in k.dispatch.members[1:])]
                before = list(k.dispatch.members)
                k.dispatch = k.dispatch.retimed([None if n in failed else timed.get(n, {}) for n in names])
                kept = {m.variant.id for m in k.dispatch.members}
                for item in before[1:]:
                    if item.variant.id not in kept:
                        why = failed.get(member_name(item), "no shape where the choice loop found it fastest")
                        k.rejected_why[item.variant.id] = f"dispatch member dropped: {why}"[:500]
                k.choice_ms = {n: dict(t) for n, t in timed.items()}
            print(f"end {k.st.name}: choice loop " + ("done" if reply is not None else f"failed: {error}")
                  + f", {len(k.dispatch.members)} kernels dispatched", file=sys.stderr, flush=True)
            self._final(k)

        self.ctl.recorded_call(_call_key("choose", k, sorted(ours)), done, "time_peers", k.st.ref, k.st.dtype,
                               ShapeSet.SEARCH.value, ours, False, None, False,
                               what=f"{k.st.name} dispatch choice loop")

    def _beside(self) -> None:
        """Once every kernel has its final timing, each kernel's sanitizer runs and peers' loops
        start together, for all kernels at once: they are non-exclusive calls, and a timed
        call (a final timing, a choice loop) waits for an evaluator with none in flight, so a
        kernel's final timing asked for while another kernel's loops ran would wait for them
        all. Set-ups (compilations, checks) overlap the sanitizer runs; each loop's timed pass
        still has the GPU alone (:mod:`evaluators.gpu_turns`: sanitizer runs hold it shared).
        A kernel back from a finding (the baseline's final timing) starts at once."""
        if not all(k.timed or k.result is not None for k in self.kernels.values()):
            return
        if not self.released:
            # Compilations ahead (non-exclusive calls as well) start here too, not earlier: a
            # choice loop or final timing asked for while they ran would wait for them all.
            self.released = True
            self.compile_ahead()
        for k in self.kernels.values():
            if k.timed and not k.started:
                k.started = True
                generation = k.generation
                self._sanitize(k)
                if k.generation == generation:  # a recorded finding may have replaced the winner
                    self._peers(k)

    def _peers(self, k: _Progress) -> None:
        """The end-of-run loops (winner, dispatch members, baseline and peers interleaved),
        repeated in ``peer_runs`` rounds, each in a fresh sandbox process that times the search
        shapes and then the spec's fixed held-out shapes; every ratio reported comes from
        these loops (:mod:`search.spread`). The rounds run all at once (see :meth:`_loops`),
        their torch.compile programs compiled ahead where compile_ahead is on
        (:meth:`compile_ahead`)."""
        assert k.winner is not None and k.heldout is not None and k.dispatch is not None
        if not self.ctl.config.evaluator.peers:
            k.looped = ([], [])
            self._assemble(k)
            return
        # The winner, its dispatch members and the baseline are timed again in the same
        # interleaved loop as the peers, so that "vs baseline" and "vs peers" are ratios of
        # one loop's times; which member runs on which shape was fixed before (no member is
        # chosen on the times it is reported with; a member the sanitizer drops later gives
        # its shapes back to the winner, timed on every shape in the same loops).
        ours = {**_ours(k), "baseline": (k.st.baseline.source, {})}
        plans = [self._plan(k, shape_set, ours) for shape_set in loop_sets(k.st)]
        generation = k.generation

        def looped(runs: list[list[dict[str, Any]]]) -> None:
            if k.generation == generation:
                k.looped = (plans, runs)
                self._assemble(k)

        self._loops(k, plans, looped)

    def _assemble(self, k: _Progress) -> None:
        """The kernel's result, once its sanitizer verdict and its loops are both in."""
        if not k.sanitized or k.looped is None or k.result is not None:
            return
        assert k.winner is not None and k.heldout is not None and k.dispatch is not None
        plans, runs = k.looped
        heldout = compose_evaluation(k.dispatch, k.member_heldout, k.st.heldout_shapes())
        final = compose_evaluation(k.dispatch, k.member_final, k.st.search_shapes())
        result = KernelResult(k.st, k.winner, heldout, final, rejected=k.rejected, sanitizer=k.sanitizer,
                              dispatch=k.dispatch, member_heldout=dict(k.member_heldout),
                              member_final=dict(k.member_final), member_sanitizer=dict(k.member_sanitizer),
                              choice_ms=dict(k.choice_ms))
        if not plans:
            self._done(k, result)
            return
        assert result.dispatch is not None
        combine_runs(result, [r if "loop_error" in r else compose_reply(r, result.dispatch) for r in runs[0]])
        if len(plans) > 1:
            shapes = k.st.spec.heldout_shapes
            combine_heldout(result, [r if "loop_error" in r else compose_reply(r, result.dispatch, shapes)
                                     for r in runs[1]])
        result.rejected_why = dict(k.rejected_why)
        self._finish_loops(k, plans, result)

    def _finish_loops(self, k: _Progress, plans: list[_LoopPlan], result: KernelResult) -> None:
        for plan in plans:
            for folder in plan.folders:
                if folder:
                    shutil.rmtree(folder, ignore_errors=True)  # where this machine holds it
        self._done(k, result)

    def _plan(self, k: _Progress, shape_set: ShapeSet, ours: dict[str, tuple[str, dict[str, int]]]) -> _LoopPlan:
        """The loops of one shape set: each one's cache key, cached entry (if any) and record key."""
        n, names = self.ctl.config.evaluator.peer_runs, sorted(ours)
        keys, hits = self._cached(k, shape_set)
        record_keys = []
        for i in range(n):
            more: list[Any] = [names] if len(names) > 2 else []
            if shape_set is not ShapeSet.SEARCH:
                more.append(shape_set.value)
            if hits[i] is not None:
                more.append("cached peers")
            record_keys.append(_call_key("peers", k, i, *more))
        return _LoopPlan(shape_set, ours, keys, hits, record_keys, [None] * n)

    def _cached(self, k: _Progress, shape_set: ShapeSet) -> tuple[list[str], list[dict[str, Any] | None]]:
        """Per loop of the shape set: its peer-cache key ("" without a cache) and the entry whose
        peers' figures it takes (None: it times the peers): the one its round beside the search
        measured (:mod:`search.compile_ahead`), else the cache's."""
        cfg, cache = self.ctl.config.evaluator, self.cache
        keys = loop_keys(cache, cfg, k.st, shape_set) if cache is not None else [""] * cfg.peer_runs
        hits: list[dict[str, Any] | None] = []
        for i, key in enumerate(keys):
            measured = self.ahead.measured(k.st.name, shape_set, i) if self.ahead is not None else None
            hits.append(measured if measured is not None
                        else cache.get(key) if cache is not None and not cfg.fresh_peers else None)
        return keys, hits

    def _loops(self, k: _Progress, plans: list[_LoopPlan], then: Callable[[list[list[dict[str, Any]]]], None]) -> None:
        """``peer_runs`` rounds of loops of our kernels and the peers, all at once; round i runs
        loop i of every plan (search shapes, then held-out shapes) in a fresh sandbox process
        of its own (:meth:`search.pool.EvaluatorActor.time_round`), which sets every loop up
        before it times any: the rounds' set-ups (compilations loaded, each peer run and
        checked per shape) overlap each other and the other kernels' rounds, while each timed
        pass has the GPU alone (:mod:`evaluators.gpu_turns`); the rounds stay independent of
        each other. They start once no compile-ahead process is left (:meth:`compile_ahead`).
        ``then`` gets each plan's replies, in round order. A loop whose peers' figures are in
        the peer cache (:mod:`search.peer_cache`) times our kernels alone and takes the peers'
        from there; one that times the peers stores them. A winner that fails verification in
        a loop is replaced by the baseline, whose loops start anew."""
        self._after_compiling(lambda: self._rounds(k, plans, then))

    def _rounds(self, k: _Progress, plans: list[_LoopPlan], then: Callable[[list[list[dict[str, Any]]]], None]) -> None:
        cfg = self.ctl.config.evaluator
        n = cfg.peer_runs
        # Read now, once the compilations are made (they may still run when the plans are made).
        for plan in plans:
            plan.folders = [k.folders.get((plan.shape_set.value, i)) for i in range(n)]
        answers: dict[int, tuple[dict[str, Any] | None, str]] = {}
        generation = k.generation

        def label(plan: _LoopPlan) -> str:
            return "" if plan.shape_set is ShapeSet.SEARCH else " (held-out shapes)"

        def answered(i: int, value: dict[str, Any] | None, error: str) -> None:
            if k.generation != generation:
                return  # loops of a winner the sanitizer replaced meanwhile
            answers[i] = (value, error)
            if len(answers) == n:
                self._rounds_done(k, plans, [answers[j] for j in range(n)], label, then)

        for i in range(n):
            loops = [{"shape_set": plan.shape_set.value, "ours": plan.ours, "compile_trials": cfg.compile_trials,
                      "peers": plan.hits[i] is None, "compile_cache": plan.folders[i],
                      "exclude_peers": k.crashes.get(plan.shape_set.value, {})} for plan in plans]
            cached = sum(1 for plan in plans if plan.hits[i] is not None)
            self.ctl.recorded_call(_round_key(plans, i), partial(answered, i), "time_round", k.st.ref, k.st.dtype,
                                   loops, cfg.overlap_rounds, exclusive=not cfg.overlap_rounds,
                                   what=f"{k.st.name} peers' loops, round {i + 1} of {n}"
                                        + (f" ({cached} of {len(plans)} with peers from the cache)" if cached else ""))

    def _rounds_done(self, k: _Progress, plans: list[_LoopPlan], answers: list[tuple[dict[str, Any] | None, str]],
                     label: Callable[[_LoopPlan], str], then: Callable[[list[list[dict[str, Any]]]], None]) -> None:
        """Every round answered: each loop's reply taken in round order, as if they had run one
        after the other."""
        assert k.winner is not None and k.dispatch is not None
        cache, n = self.cache, self.ctl.config.evaluator.peer_runs
        runs: dict[int, list[dict[str, Any]]] = {id(plan): [] for plan in plans}
        for i, (value, error) in enumerate(answers):
            loops = value.get("loops", []) if value is not None else []
            for j, plan in enumerate(plans):
                reply: dict[str, Any] | None = loops[j] if j < len(loops) else None
                why = error or "the round answered no reply for this loop"
                if reply is not None and "loop_error" in reply:  # this loop failed, the round's others did not
                    why, reply = str(reply["loop_error"]), None
                hit = plan.hits[i]
                if reply is not None and hit is not None:
                    reply = with_cached(reply, hit)
                elif reply is not None and cache is not None:
                    reply["peers_stored"] = cache.put(plan.keys[i], reply, sorted(plan.ours), self.ctl.records.run_id)
                failed = reply.get("failed", {}) if reply is not None else {}
                if "best" in failed and k.winner.variant.id != k.st.baseline.id:
                    # A winner that misbehaves in the peers' loop is a cheat or a latent bug:
                    # it is not reported, as for a sanitizer finding; the baseline is.
                    k.rejected_why[k.winner.variant.id] = f"failed in the peers' loop{label(plan)}: {failed['best']}"
                    self._to_baseline(k)
                    return
                for item in list(k.dispatch.members[1:]):
                    if member_name(item) in failed:  # its shapes go to the winner, timed in the same loop
                        self._drop_member(k, item, f"failed in the peers' loop{label(plan)}: {failed[member_name(item)]}")
                runs[id(plan)].append(reply if reply is not None else {"loop_error": why})
                self._loop_done(k, f"peers' loop{label(plan)} {len(runs[id(plan)])} of {n}", reply, why)
        then([runs[id(plan)] for plan in plans])

    # -- compile-ahead --------------------------------------------------------------------

    def compile_ahead(self) -> None:
        """With compile_ahead, compiles the torch.compile programs of the end-of-run loops that
        the peer cache lacks, once per kernel and shape set, into one folder that every round's
        loop on that shape set loads from (:mod:`evaluators.peer_compile`): all kernels at once,
        beside the sanitizer runs, once every final timing is in (:meth:`_beside`). The rounds
        then time the same compilations in three fresh processes: their spread is that of
        timing, not of compiling (``--no-compile-ahead``: every loop compiles afresh). A round
        on record (a resumed run's, replayed) needs nothing compiled. What is compiled lies on
        this machine's disk, so it is not recorded: a resumed run compiles again for the rounds
        it has not done. What was compiled beside the search (:mod:`search.compile_ahead`) is
        taken as it is, not compiled again."""
        cfg = self.ctl.config.evaluator
        if not cfg.compile_ahead or not cfg.peers:
            return
        for k in self.kernels.values():
            done = self._recorded_rounds(k)
            for shape_set in loop_sets(k.st):
                rounds = [i for i, hit in enumerate(self._cached(k, shape_set)[1]) if hit is None and i not in done]
                if not rounds:
                    continue
                self.compiling += 1
                call = partial(self._compiled, k, shape_set.value, rounds)
                made = self.ahead.take(k.st.name, shape_set) if self.ahead is not None else None
                if made is not None:  # compiled beside the search
                    call(made, "")
                    continue
                where = folder_name(self.ctl.records.run_id, k.st, shape_set.value)
                self.ctl.pool.call(call, "precompile", k.st.ref, k.st.dtype, shape_set.value, where, exclusive=False,
                                   what=f"{k.st.name} compile ahead ({shape_set.value} shapes)")

    def _recorded_rounds(self, k: _Progress) -> set[int]:
        """The rounds of the kernel's loops on record for its winner as it stands."""
        if k.winner is None or k.dispatch is None:
            return set()
        ours = {**_ours(k), "baseline": (k.st.baseline.source, {})}
        plans = [self._plan(k, shape_set, ours) for shape_set in loop_sets(k.st)]
        return {i for i in range(self.ctl.config.evaluator.peer_runs) if _round_key(plans, i) in self.ctl.answers}

    def _compiled(self, k: _Progress, shape_set: str, rounds: list[int], reply: dict[str, Any] | None,
                  error: str) -> None:
        made: dict[str, Any] = reply if reply is not None else {"status": "ERROR", "summary": error}
        folder = made.get("folder") if made.get("status") == "OK" else None
        for i in rounds:
            k.folders[(shape_set, i)] = folder
        # A library call that ended the compile-ahead process would end each loop's as well.
        k.crashes[shape_set] = made.get("peer_crashes") or {}
        self.compiling -= 1
        where = "" if shape_set == ShapeSet.SEARCH.value else " on the held-out shapes"
        crashed = "; ".join(f"{peer} on {', '.join(shapes)}" for peer, shapes in k.crashes[shape_set].items())
        print((f"end {k.st.name}: compiled ahead for {len(rounds)} loops{where}" if folder else
               f"end {k.st.name}: nothing compiled ahead for {len(rounds)} loops{where} "
               f"({made.get('summary', '')[:200]}); they compile for themselves")
              + (f"; left out where their first calls ended its process: {crashed}" if crashed else ""),
              file=sys.stderr, flush=True)
        if self.compiling == 0:
            waiting, self.waiting = self.waiting, []
            for start in waiting:
                start()

    def _after_compiling(self, start: Callable[[], None]) -> None:
        """Runs ``start`` now if no compile-ahead process is in flight, else once none is: no
        compilation's processes (CPU-bound, launching on the GPU) run beside a timed pass."""
        if self.compiling == 0:
            start()
        else:
            self.waiting.append(start)

    def _loop_done(self, k: _Progress, what: str, reply: dict[str, Any] | None, error: str) -> None:
        """One line per finished loop, with how many loops are left in the run and, at the pace
        of the loops so far, about how long they will take."""
        self.loops_done += 1
        elapsed = time.time() - self.loops_started
        left = max(0, self.loops_expected - self.loops_done)
        pace = f", about {elapsed / self.loops_done * left:.0f} s left at this pace" if left else ""
        how = "done" if reply is not None else f"failed: {error}"
        if reply is not None and reply.get("cached_peers"):
            cached = reply["cached_peers"]
            scale = list((cached.get("scale") or {}).values())
            drift = f", scaled by the baseline's drift {min(scale):.3f}-{max(scale):.3f}" if scale else ""
            where = ("timed beside the search in this run" if cached.get("run_id") == self.ctl.records.run_id
                     else f"from the cache, measured {cached.get('measured_at')}")
            how += f" (peers {where}{drift})"
        print(f"end {k.st.name}: {what} {how}; {self.loops_done} loops done, {left} to go{pace}",
              file=sys.stderr, flush=True)

    def _done(self, k: _Progress, result: KernelResult) -> None:
        k.result = result
        members = len(result.dispatch.members) if result.dispatch is not None else 1
        beside = f"{len(result.peers)} implementations timed beside it" if result.peers else "no peers timed beside it"
        print(f"final {k.st.name}: {result.final.status.value}, {beside}"
              + (f", {members} kernels dispatched by shape" if members > 1 else "")
              + (f"; failed in the peers' loop: {result.peer_failures}" if result.peer_failures else ""),
              file=sys.stderr, flush=True)


def _ours(k: _Progress) -> dict[str, tuple[str, dict[str, int]]]:
    """Our kernels of the result for a loop: the winner as ``best``, each dispatch member by
    :func:`member_name`."""
    assert k.winner is not None and k.dispatch is not None
    return {"best": (k.winner.variant.source, dict(k.winner.params)),
            **{member_name(m): (m.variant.source, dict(m.params)) for m in k.dispatch.members[1:]}}


def _call_key(what: str, k: _Progress, *more: Any, item: Scored | None = None) -> str:
    """The key an end-of-run call's answer is recorded under: the call, the kernel, the
    variant it is about (the winner unless ``item``) and its parameters, and what else tells
    two calls apart (the loop's number, the dispatch members in the loop)."""
    item = item or k.winner
    assert item is not None
    return json.dumps([what, k.st.name, k.st.dtype, item.variant.id, sorted(item.params.items()), *more])


def _round_key(plans: list[_LoopPlan], i: int) -> str:
    """The key round ``i`` of the loops of ``plans`` is recorded under: its loops' keys."""
    return json.dumps(["round", *(plan.record_keys[i] for plan in plans)])


def stop_warmup(warmup: PeerWarmup) -> float | None:
    """Ends the peers' warm-up before the loops time: no other process may launch anything on
    the GPUs then. What it has not done is stopped, not waited for: it only fills on-disk caches
    that the loops' own fresh compilations fill as well, so waiting would idle the GPUs for work
    done twice (a resumed run whose search was over waited about 2 min for it). Returns how
    long it had run if it was still running, else None."""
    ran = time.time() - warmup.started if warmup.running() else None
    if ran is not None:
        print(f"end: peer warm-up stopped after {ran:.0f} s; the peers' loops compile what it had not", flush=True)
    warmup.stop()
    return ran


def finalize(ctl: Controller, warmup: PeerWarmup | None = None, cache: PeerCache | None = None,
             clock: StageClock | None = None, ahead: CompiledAhead | None = None) -> tuple[list[KernelResult], str]:
    """Re-validates, re-times and writes ``best/``; returns the results and the device name.

    The end of the run works over as many fresh evaluator actors as the search had GPUs (no
    more than there are kernels), several sanitizer runs at once on each. ``cache``: the peer
    figures kept from earlier runs (:mod:`search.peer_cache`); ``clock`` gets the seconds of
    each stage and, as ``end_calls_s``, of each kind of call after the held-out checks.
    ``ahead``: the compilations started beside the search; the pool is renewed once they are in.
    """
    clock = clock or StageClock()
    end = EndOfRun(ctl, cache, ahead)
    with clock.stage("held-out"):
        end.heldout()
    with clock.stage("end set-up"):
        if warmup is not None:
            stop_warmup(warmup)
        if ctl.pool.background_inflight():
            # Renewing the pool would end them; what they compile is the end-of-run loops' own work.
            print(f"end: waiting for {ctl.pool.background_inflight()} calls begun beside the search "
                  "(compilations, peers' rounds)", file=sys.stderr, flush=True)
            waited = time.monotonic()
            ctl.drain(lambda: not ctl.pool.background_inflight())
            print(f"end: calls beside the search in after {time.monotonic() - waited:.0f} s more",
                  file=sys.stderr, flush=True)
        # Non-exclusive calls overlap on an actor: a sanitizer run per dispatch member (up to
        # search.dispatch per kernel), and with peers, beside them, the compilations ahead (one
        # per kernel and shape set) and after those the rounds of loops (one per kernel and
        # round), each a process with torch and a CUDA context of its own, up to one per CPU
        # core but two.
        cfg = ctl.config.evaluator
        sharing = len(ctl.states)
        if cfg.peers:
            wanted = len(ctl.states) * (max(2 if cfg.compile_ahead else 0, cfg.peer_runs * cfg.overlap_rounds)
                                        + ctl.config.search.dispatch)
            sharing = max(sharing, min(wanted, max(1, (os.cpu_count() or 2) - 2)))
        ctl.pool.renew(size=max(1, min(len(ctl.pool.actors), len(ctl.states))), max_concurrency=sharing)
        device = ctl.pool.device_name()
    since = time.monotonic()  # the pool's call spans are on the monotonic clock
    end.loops_started = time.time()
    with clock.stage("sanitizer, final timing and peers"):
        results = end.finish()
    if ahead is not None:
        ahead.remove_folders()  # those no end-of-run loop loaded (its peers' figures were measured beside the search)
    clock.calls = by_kind(ctl.pool.spans, since)
    ctl.pool.close()
    for result in results:
        write_best(ctl, result)
    return results, device


def open_peer_cache(cfg: EvaluatorConfig, pool: EvalPool) -> PeerCache | None:
    """The peer cache of a GPU run that times peers with the cache on, keyed by the environment
    of the pool's first evaluator (:meth:`search.pool.EvalPool.environment`, which waits for its
    worker); else None."""
    if cfg.kind != "gpu" or not cfg.peers or not cfg.peer_cache:
        return None
    try:
        environment = pool.environment()
    except RayError as exc:  # the search reports the evaluator's failure; the run goes on without the cache
        print(f"!! peer cache off: the evaluator's environment could not be read ({exc})"[:300], file=sys.stderr)
        return None
    return PeerCache(cfg.peer_cache_dir or default_folder(), environment)


def all_cached(cache: PeerCache | None, cfg: EvaluatorConfig, st: KernelState) -> bool:
    """Whether every end-of-run loop of the kernel would take its peers' figures from the cache
    (then nothing of its peers needs compiling or building in this run)."""
    return all(set_cached(cache, cfg, st, s) for s in loop_sets(st))


def set_cached(cache: PeerCache | None, cfg: EvaluatorConfig, st: KernelState, shape_set: ShapeSet) -> bool:
    """Whether every end-of-run loop of the kernel on one shape set would take its peers'
    figures from the cache."""
    if cache is None or cfg.fresh_peers:
        return False
    return all(cache.get(key) is not None for key in loop_keys(cache, cfg, st, shape_set))


def loop_sets(st: KernelState) -> list[ShapeSet]:
    """The shape sets a kernel's end-of-run loops time: the search shapes, then the spec's fixed
    held-out shapes where it has any."""
    return [ShapeSet.SEARCH, *([ShapeSet.HELDOUT] if st.spec.heldout_shapes else [])]


def loop_keys(cache: PeerCache, cfg: EvaluatorConfig, st: KernelState, shape_set: ShapeSet) -> list[str]:
    """The peer-cache key of each of a kernel's loops on one shape set."""
    shapes = [dict(s) for s in st.spec.shapes(shape_set.value)]
    return [cache.key(st.ref.digest, st.dtype, shape_set.value, shapes, i, cfg.compile_trials)
            for i in range(cfg.peer_runs)]


def write_best(ctl: Controller, result: KernelResult) -> None:
    st, variant = result.state, result.winner.variant
    mine = sorted((r for r in ctl.cache.values() if r.variant.id == variant.id and r.kernel == st.name),
                  key=lambda r: r.key)
    evidence: dict[str, Any] = {
        "kernel": st.name,
        "dtype": st.dtype,
        "variant": variant.to_dict(),
        "params": result.winner.params,
        "heldout_status": result.heldout.status.value,
        "heldout": result.heldout.to_dict(),
        "heldout_shapes": [dict(s) for s in st.heldout_shapes()],
        "final": result.final.to_dict(),
        "peers_ms": result.peers,
        "peer_runs_ms": result.peer_runs,
        "peer_extra": result.peer_extra,
        "peer_errors": result.peer_errors,
        "peer_failures": result.peer_failures,
        "rejected_on_heldout": result.rejected,
        "rejected_why": result.rejected_why,
        "sanitizer": result.sanitizer,
        "lineage": st.lineage(variant.id),
        "evaluations": [r.to_dict() for r in mine],
    }
    d = result.dispatch
    if d is not None and len(d.members) > 1:
        # Everything a user of the result needs to launch the members where they run: the
        # rule, the search shapes' table, each member's source and its own verdicts.
        evidence["dispatch"] = {
            **d.to_dict(),
            "search_shapes": [dict(s) for s in d.shapes],
            "choice_loop_ms": result.choice_ms,
            "members": [{"variant": m.variant.to_dict(), "params": m.params,
                         "heldout": _dict_of(result.member_heldout.get(m.variant.id)),
                         "final": _dict_of(result.member_final.get(m.variant.id)),
                         "sanitizer": result.member_sanitizer.get(m.variant.id, {}),
                         "lineage": st.lineage(m.variant.id),
                         "evaluations": [r.to_dict() for r in sorted(
                             (r for r in ctl.cache.values() if r.variant.id == m.variant.id and r.kernel == st.name),
                             key=lambda r: r.key)] if m is not d.primary else []} for m in d.members],
        }
    ctl.records.write_best(st.name, variant.source, json.loads(json.dumps(evidence, default=str)))


def _dict_of(evaluation: Evaluation | None) -> dict[str, Any] | None:
    return evaluation.to_dict() if evaluation is not None else None
