"""End of a run: held-out re-validation of the winners, sanitizer, final timing, peers, best files.

Every step is a stage of the controller over the same evaluator pool (retries, replacement of
dead actors) and every evaluation is recorded by the same code as the search's:

1. held-out: each kernel's elites, in rank order, on the held-out shapes (the spec's fixed
   ones and those drawn for this run) until one passes; the baseline is the last resort;
2. the pool is renewed (fresh evaluators, one per GPU, after the peers' background compiles);
3. per kernel (each answer recorded, so a resumed run picks up where it stopped):
   compute-sanitizer on the winner (a winner with findings is replaced by the
   baseline, whose held-out verdict is then evaluated and recorded too), the final timing
   (stage final: the evaluator's verdict and A/A noise floor), and the production peers timed
   in one loop with the winner and baseline, repeated in ``peer_runs`` fresh sandbox
   processes: every reported ratio, "vs baseline" included, is taken from these loops.

A failure of one kernel's step (an evaluator error, an actor that keeps dying) is recorded for
that kernel and the others finish.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evaluators.peer_warmup import PeerWarmup
from kernels.records import ShapeSet, Stage
from kernels.verdict import Evaluation
from search.controller import Controller
from search.jobs import Job
from search.selection import Scored
from search.spread import median_times
from search.state import KernelState

LOOP_ERROR = "peers' loop"  # key of peer_errors when the whole loop could not run


@dataclass
class KernelResult:
    """The outcome for one kernel.

    Attributes:
        state: the kernel's search state.
        winner: the variant reported (at its best parameters).
        heldout: its verdict on the held-out shapes.
        final: its full-protocol timing on the search shapes, in a fresh evaluator.
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


def combine_runs(result: KernelResult, runs: list[dict[str, Any]]) -> None:
    """Fills ``result`` from the replies of the repeated end-of-run loop (a reply is
    ``{"loop_error": why}`` for a loop that could not run).

    ``peer_runs`` keeps each loop's times; ``peers`` their per-shape medians (for the
    tables); a kernel of ours that failed verification in any loop gets no ratios at all.
    ``peer_extra`` keeps, per loop, which torch.compile compilation won each shape, what each
    peer's time covers, and the L2 persistence state the loop ran under.
    """
    errors: dict[str, str] = {}
    failed: dict[str, str] = {}
    timed: list[dict[str, dict[str, float]]] = []
    extra: dict[str, Any] = {"compiled": [], "notes": {}, "l2_persistence": [], "l2_findings": []}
    for i, reply in enumerate(runs, 1):
        if "loop_error" in reply:
            errors[f"{LOOP_ERROR} (run {i})"] = reply["loop_error"]
            continue
        for peer, why in reply.get("errors", {}).items():
            errors.setdefault(peer, why)
        for ours, why in reply.get("failed", {}).items():
            failed.setdefault(ours, f"run {i}: {why}")
        timed.append(dict(reply.get("peers", {})))
        extra["compiled"].append(dict(reply.get("compiled", {})))
        extra["notes"].update(reply.get("notes", {}))
        extra["l2_persistence"].append(reply.get("l2_persistence", {}))
        if reply.get("l2_finding"):
            extra["l2_findings"].append(f"run {i}: {reply['l2_finding']}")
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


class EndOfRun:
    """The stages of the end of a run, for every kernel at once, over the controller's pool.

    Args:
        ctl: the controller whose search has finished.
    """

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.kernels: dict[str, _Progress] = {}
        for st in ctl.states:
            assert st.baseline_scored is not None
            self.kernels[st.name] = _Progress(st, [*st.archive.ranked(), st.baseline_scored])

    # -- held-out -------------------------------------------------------------------------

    def heldout(self) -> None:
        """Walks each kernel's elites in rank order until one passes on the held-out shapes."""
        for k in self.kernels.values():
            self._next_heldout(k)
        self.ctl.drain(lambda: all(k.winner is not None for k in self.kernels.values()))

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

    # -- sanitizer, final timing, peers -----------------------------------------------------

    def finish(self) -> list[KernelResult]:
        """Sanitizer, final timing and peers for every kernel; returns the results in order."""
        for k in self.kernels.values():
            self._sanitize(k)
        self.ctl.drain(lambda: all(k.result is not None for k in self.kernels.values()))
        return [self.kernels[st.name].result for st in self.ctl.states]  # type: ignore[misc]

    def _sanitize(self, k: _Progress) -> None:
        assert k.winner is not None
        cfg = self.ctl.config.evaluator
        if not cfg.sanitize or k.winner.variant.id == k.st.baseline.id:
            k.sanitizer = {"status": "SKIPPED", "summary": "not asked for" if not cfg.sanitize else "baseline"}
            self._final(k)
            return

        def done(report: dict[str, Any] | None, error: str) -> None:
            k.sanitizer = report if report is not None else {"status": "ERROR", "summary": error}
            print(f"end {k.st.name}: sanitizer {k.sanitizer.get('status')}", file=sys.stderr, flush=True)
            if k.sanitizer.get("status") == "FINDINGS":
                assert k.winner is not None
                k.rejected_why[k.winner.variant.id] = f"sanitizer: {k.sanitizer.get('summary', '')}"[:500]
                self._to_baseline(k)  # a latent memory bug or race: not reported, whatever its speed
            else:
                self._final(k)

        shapes = [*k.st.search_shapes(), *k.st.heldout_shapes()]
        # Sanitizer runs are separate, mostly host-bound processes: they overlap on an actor.
        self.ctl.recorded_call(_call_key("sanitize", k), done, "sanitize", k.st.ref, k.winner.variant.source,
                               k.st.dtype, dict(k.winner.params), shapes, exclusive=False,
                               what=f"{k.st.name} {k.winner.variant.id}")

    def _to_baseline(self, k: _Progress) -> None:
        assert k.winner is not None and k.st.baseline_scored is not None
        k.rejected.append(k.winner.variant.id)
        k.winner = k.st.baseline_scored

        def done(evaluation: Evaluation) -> None:
            k.heldout = evaluation
            self._final(k)

        self.ctl.submit(self._heldout_job(k.st, k.winner, done))

    def _final(self, k: _Progress) -> None:
        assert k.winner is not None
        item = k.winner
        self.ctl.submit(Job(k.st, item.variant, Stage.FINAL, item.params, lambda ev: self._peers(k, ev)))

    def _peers(self, k: _Progress, final: Evaluation) -> None:
        """The end-of-run loop (winner, baseline and peers interleaved), repeated in
        ``peer_runs`` fresh sandbox processes one after the other; every ratio reported comes
        from these loops (:mod:`search.spread`)."""
        assert k.winner is not None and k.heldout is not None
        result = KernelResult(k.st, k.winner, k.heldout, final, rejected=k.rejected, sanitizer=k.sanitizer)
        cfg = self.ctl.config.evaluator
        if not cfg.peers:
            self._done(k, result)
            return
        runs: list[dict[str, Any]] = []
        # The winner and the baseline are timed again in the same interleaved loop as the
        # peers, so that "vs baseline" and "vs peers" are ratios of one loop's times.
        ours = {"best": (k.winner.variant.source, dict(k.winner.params)), "baseline": (k.st.baseline.source, {})}

        def submit() -> None:
            self.ctl.recorded_call(_call_key("peers", k, len(runs)), done, "time_peers", k.st.ref, k.st.dtype,
                                   ShapeSet.SEARCH.value, ours, True, cfg.compile_trials,
                                   what=f"{k.st.name} peers, run {len(runs) + 1} of {cfg.peer_runs}")

        def done(reply: dict[str, Any] | None, error: str) -> None:
            assert k.winner is not None
            if reply is not None and "best" in reply.get("failed", {}) and k.winner.variant.id != k.st.baseline.id:
                # A winner that misbehaves in the peers' loop is a cheat or a latent bug:
                # it is not reported, as for a sanitizer finding; the baseline is.
                k.rejected_why[k.winner.variant.id] = f"failed in the peers' loop: {reply['failed']['best']}"
                self._to_baseline(k)
                return
            runs.append(reply if reply is not None else {"loop_error": error})
            print(f"end {k.st.name}: peers' loop {len(runs)} of {cfg.peer_runs} "
                  + ("done" if reply is not None else f"failed: {error}"), file=sys.stderr, flush=True)
            if len(runs) < cfg.peer_runs:
                submit()
                return
            combine_runs(result, runs)
            result.rejected_why = dict(k.rejected_why)
            self._done(k, result)

        submit()

    def _done(self, k: _Progress, result: KernelResult) -> None:
        k.result = result
        print(f"final {k.st.name}: {result.final.status.value}, {len(result.peers)} implementations timed "
              f"beside it" + (f"; failed in the peers' loop: {result.peer_failures}" if result.peer_failures else ""),
              file=sys.stderr, flush=True)


def _call_key(what: str, k: _Progress, *more: Any) -> str:
    """The key an end-of-run call's answer is recorded under: the call, the kernel, its winner
    (variant and parameters) and what else tells two calls apart (the loop's number)."""
    assert k.winner is not None
    return json.dumps([what, k.st.name, k.st.dtype, k.winner.variant.id, sorted(k.winner.params.items()), *more])


def finalize(ctl: Controller, warmup: PeerWarmup | None = None) -> tuple[list[KernelResult], str]:
    """Re-validates, re-times and writes ``best/``; returns the results and the device name.

    The end of the run works over as many fresh evaluator actors as the search had GPUs (no
    more than there are kernels), several sanitizer runs at once on each.
    """
    end = EndOfRun(ctl)
    end.heldout()
    if warmup is not None:
        # The final timing starts once the peers' compiles are in the caches and no other
        # process launches anything on the GPUs.
        warmup.wait()
    ctl.pool.renew(size=max(1, min(len(ctl.pool.actors), len(ctl.states))), max_concurrency=len(ctl.states))
    device = ctl.pool.device_name()
    results = end.finish()
    ctl.pool.close()
    for result in results:
        write_best(ctl, result)
    return results, device


def write_best(ctl: Controller, result: KernelResult) -> None:
    st, variant = result.state, result.winner.variant
    mine = sorted((r for r in ctl.cache.values() if r.variant.id == variant.id and r.kernel == st.name),
                  key=lambda r: r.key)
    evidence = {
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
    ctl.records.write_best(st.name, variant.source, json.loads(json.dumps(evidence, default=str)))
