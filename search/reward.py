"""The evaluator as an online reward service for RL trainers.

``RewardService.score(kernel, source, dtype)`` answers one reward with its evidence. It runs
on the search's own machinery: admission in CPU tasks and the evaluator pool
(:class:`search.pool.EvalPool`, one actor per GPU, replaced when it dies), every verdict
written by :class:`search.jobs.Evaluations` to ``evaluations.jsonl`` of the service's
directory, and every reward to ``rewards.jsonl`` beside it. A source already judged (in
this process or on record from an earlier one) is answered from the records without a new
evaluation; identical sources in flight at once share one evaluation.

A verdict only pays after the gates a search's winner passes: the search shapes under the
full timing protocol, then the held-out shapes, then compute-sanitizer (memcheck and
racecheck) and the peers' loop (many launches in a row, every output verified). A gate that
fails turns the verdict into its failure (INCORRECT on held-out shapes, REJECTED for the
sanitizer's findings or a failure in the loop). Shaping: :mod:`search.reward_shaping`.

Requests from many clients are queued per client and taken in turn (round robin), so one
busy client cannot starve the others; a single loop thread drives the pool.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agents.base import derive_seed
from kernels.records import ShapeSet, Stage, eval_key, read_jsonl
from kernels.spec import KernelSpecError, kernel_ref, list_kernels, load_kernel
from kernels.variant import Variant
from kernels.verdict import Evaluation, Status
from search.config import DTYPES, dump_config
from search.export_rewards import ProposalOutcome
from search.jobs import Evaluations, Job
from search.records import RunRecords, load_history
from search.reward_queue import FairQueue
from search.reward_shaping import RewardConfig
from search.state import KernelState

REWARDS_FILE = "rewards.jsonl"
# What a request may bring beside its source, kept in its rewards.jsonl line for trajectory
# files: the model's whole response, the prompt's chat messages, the episode it belongs to.
CONTEXT_KEYS = ("response", "messages", "episode_id")


class RewardRecords(RunRecords):
    """A run's records plus the service's own: ``rewards.jsonl`` (one line per answer, with
    its evidence) and ``trajectories.jsonl`` (:mod:`search.trajectory`)."""

    FILES = (*RunRecords.FILES, "rewards", "trajectories")


# Sanitizer outcomes that stop a reward: findings are a caught cheat or fault; a run that did
# not finish leaves the kernel unchecked, so it does not pay either. UNAVAILABLE (no
# compute-sanitizer on the machine) and SKIPPED (the stand-in) pass, and the evidence says so.
_SANITIZER_FAILS = {"FINDINGS": Status.REJECTED, "TIMEOUT": Status.TIMEOUT, "FAILED": Status.CRASH}


class RewardRequestError(ValueError):
    """A request the service cannot judge (unknown kernel, dtype the kernel lacks)."""


class ServiceError(RuntimeError):
    """The service itself failed (its loop stopped): no verdict on the kernel."""


@dataclass
class _Pending:
    """One request being judged: what was asked, the gates passed so far, who waits, and the
    requests for the same source that arrived meanwhile (answered with it, as cached)."""

    request_id: str
    client: str
    state: KernelState
    variant: Variant
    future: Future[dict[str, Any]]
    started: float
    evaluation: Evaluation | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    followers: list[_Pending] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)


class _Quiet:
    """The search's progress line has nothing to show for a service."""

    def update(self, owner: Any, force: bool = False) -> None:
        pass


class RewardService:
    """Judges kernels for rewards over one evaluator pool; needs Ray started.

    Args:
        out_dir: the service's record directory (created; records there are reused).
        config: how to judge.
    """

    def __init__(self, out_dir: Path | str, config: RewardConfig | None = None) -> None:
        from search.pool import EvalPool, admission_task

        self.config = config or RewardConfig()
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        run_config = self.config.run_config()
        dump_config(run_config, self.dir / "config.yaml")
        history = load_history(self.dir) if (self.dir / "evaluations.jsonl").is_file() else None
        self.answered = _answered(self.dir / REWARDS_FILE)
        self.records = RewardRecords(self.dir, self.dir.name)
        if self.config.compile_on_cpu_nodes:
            admission_task.on_cpu_nodes()
        self.pool = EvalPool(self.config.evaluator, self.config.gpus, self.config.retries,
                             self.config.standin_latency_s)
        self.evals = Evaluations(run_config, self.records, self.pool, _Quiet(), history, on_tick=self._expire)
        self.states: dict[tuple[str, str], KernelState] = {}
        self.served_kernels = self.config.kernels or tuple(list_kernels())
        self.inflight: dict[tuple[str, str, str], _Pending] = {}
        self.queue = FairQueue()
        self.max_inflight = self.config.max_inflight or 2 * self.config.gpus
        self.served = 0
        self._records_lock = threading.Lock()
        self._states_lock = threading.Lock()
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._open: set[Future[dict[str, Any]]] = set()  # futures not yet answered
        self._thread = threading.Thread(target=self._loop, name="reward-loop", daemon=True)
        self._thread.start()

    # -- the API --------------------------------------------------------------------------

    def score(self, kernel: str, source: str, dtype: str = "", client: str = "",
              timeout_s: float | None = None, context: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The reward of ``source`` as a kernel ``kernel`` at ``dtype``, with its evidence.

        Returns:
            ``score``, ``correct``, ``speedup`` (None unless correct), ``status`` (a
            :class:`~kernels.verdict.Status` value or ``NO_VARIANT``), ``feedback`` (the
            evaluator's message), ``kernel``, ``dtype``, ``variant_id``, ``cached``,
            ``synthetic``, ``request_id``, ``latency_s`` and ``evidence`` (the record keys
            and gate reports behind it). ``context`` (the model's ``response``, the prompt's
            ``messages``, an ``episode_id``) is kept with the record for trajectory files.

        Raises:
            RewardRequestError: an unknown kernel or a dtype it does not support.
            ServiceError: the service stopped, or no answer within ``timeout_s``.
        """
        future = self.submit(kernel, source, dtype, client, context)
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            raise ServiceError(f"no reward within {timeout_s} s") from None

    def submit(self, kernel: str, source: str, dtype: str = "", client: str = "",
               context: Mapping[str, Any] | None = None) -> Future[dict[str, Any]]:
        """Queues a request; the future gets :meth:`score`'s answer.

        Raises:
            RewardRequestError: an unknown kernel or a dtype it does not support.
            ServiceError: the service stopped.
        """
        if self._failure is not None or self._stop.is_set():
            raise ServiceError(f"the reward service stopped: {self._failure or 'closed'}")
        st = self._state(kernel, dtype or self.config.dtype)
        future: Future[dict[str, Any]] = Future()
        request = _Pending(uuid.uuid4().hex[:12], client or "anonymous", st,
                           Variant(st.name, source, author=f"rl:{client or 'anonymous'}"), future, time.time(),
                           context={k: context[k] for k in CONTEXT_KEYS if context and context.get(k)})
        with self._records_lock:
            self._open.add(future)
        self.queue.put(request.client, request)
        return future

    def stats(self) -> dict[str, Any]:
        return {"served": self.served, "queued": len(self.queue), "inflight": len(self.inflight),
                "evaluators": len(self.pool.actors), "evaluators_replaced": self.pool.replaced,
                "evaluator": self.config.evaluator}

    def record(self, name: str, row: dict[str, Any]) -> None:
        """Appends a row to one of the service's JSONL records (thread-safe)."""
        with self._records_lock:
            self.records.append(name, row)

    def close(self) -> None:
        """Stops the loop, then closes the evaluators (their sandbox workers) and the records;
        requests still waiting get :class:`ServiceError`."""
        self._stop.set()
        self._thread.join(timeout=30)
        with self._records_lock:
            for f in self._open:
                if not f.done():
                    f.set_exception(ServiceError("the reward service closed"))
        self.pool.close()
        self.records.close()

    # -- requests -------------------------------------------------------------------------

    def _state(self, kernel: str, dtype: str) -> KernelState:
        # Names only, from the served list or the library: a path would make the service load
        # (and run) any spec.py a client can name on this machine.
        if kernel not in self.served_kernels:
            raise RewardRequestError(f"no kernel {kernel!r} served here (served: {', '.join(self.served_kernels)})")
        if dtype not in DTYPES:
            raise RewardRequestError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        key = (kernel, dtype)
        with self._states_lock:  # callers' threads: one state per kernel and dtype
            if key not in self.states:
                self.states[key] = self._new_state(kernel, dtype)
            return self.states[key]

    def _new_state(self, kernel: str, dtype: str) -> KernelState:
        try:
            ref = kernel_ref(kernel)
            spec = load_kernel(ref)
        except KernelSpecError as exc:
            raise RewardRequestError(str(exc)) from None
        if dtype not in spec.dtypes:
            raise RewardRequestError(f"kernel {kernel} supports {', '.join(spec.dtypes)}, not {dtype}")
        heldout = spec.draw_heldout(derive_seed(self.config.seed, spec.name, "heldout"))
        return KernelState(spec, ref.renamed(spec.name), dtype, 1, 1, 1, (), heldout)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._take_new()
                if not self.evals.busy():
                    self.queue.wait(0.2)
                    continue
                self.evals.drain(lambda: not self.evals.busy() or self._stop.is_set()
                                 or (len(self.inflight) < self.max_inflight and len(self.queue) > 0), wait_s=0.05)
        except BaseException as exc:  # a bug of ours: every waiting caller learns it, loudly
            self._failure = exc
            print(f"!! reward service stopped: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            with self._records_lock:
                for f in self._open:
                    if not f.done():
                        f.set_exception(ServiceError(f"the reward service stopped: {exc}"))
            raise

    def _expire(self) -> None:
        self.pool.expire(self.config.evaluation_timeout_s)

    def _take_new(self) -> None:
        while len(self.inflight) < self.max_inflight:
            request = self.queue.take()
            if request is None:
                return
            self._start(request)

    def _start(self, p: _Pending) -> None:
        st, variant = p.state, p.variant
        if not variant.source.strip():
            self._answer(p, None, dict(NO_VARIANT_ANSWER))
            return
        key = (st.name, variant.id, st.dtype)
        earlier = self.answered.get(key)
        if earlier is not None:
            self._answer(p, None, {**earlier, "cached": True})
            return
        if key in self.inflight:  # the same source in flight: one evaluation answers both
            self.inflight[key].followers.append(p)
            return
        self.inflight[key] = p
        self.evals.submit(Job(st, variant, Stage.FULL, {}, lambda ev: self._gate(p, ev, "search")))

    # -- gates ----------------------------------------------------------------------------

    def _gate(self, p: _Pending, evaluation: Evaluation, passed: str) -> None:
        """Takes the verdict of one gate and starts the next, or answers."""
        st = p.state
        gates = p.evidence.setdefault("gates", [])
        gates.append({"gate": passed, "status": evaluation.status.value})
        if passed == "search":
            p.evaluation = evaluation
        elif not evaluation.status.is_ok:  # a later gate's failure is the verdict
            p.evaluation = replace(evaluation, shapes=())
        assert p.evaluation is not None
        if not p.evaluation.status.is_ok or p.evaluation.speedup is None:
            self._finish(p)
            return
        params = dict(p.evaluation.params)
        if passed == "search" and self.config.heldout and st.heldout_shapes():
            self.evals.submit(Job(st, p.variant, Stage.HELDOUT, params, lambda ev: self._gate(p, ev, "heldout"),
                                  shape_set=ShapeSet.HELDOUT))
        elif passed in ("search", "heldout") and self.config.sanitize:
            self.evals.recorded_call(f"sanitize|{st.name}|{p.variant.id}|{st.dtype}",
                                     lambda value, error: self._report(p, "sanitizer", value, error),
                                     "sanitize", st.ref, p.variant.source, st.dtype, params,
                                     [*st.search_shapes(), *st.heldout_shapes()], exclusive=False,
                                     what=f"{st.name} {p.variant.id}")
        elif passed != "loop" and self.config.loop:
            ours = {p.variant.id: (p.variant.source, params)}
            self.evals.recorded_call(f"loop|{st.name}|{p.variant.id}|{st.dtype}",
                                     lambda value, error: self._report(p, "loop", value, error),
                                     "time_peers", st.ref, st.dtype, "search", ours, False, None, False,
                                     what=f"{st.name} {p.variant.id}")
        else:
            self._finish(p)

    def _report(self, p: _Pending, gate: str, value: Any, error: str) -> None:
        """A sanitizer report or a loop's answer as a gate verdict."""
        assert p.evaluation is not None
        ev = p.evaluation
        if value is None:  # the evaluator could not answer: no reward rests on an unchecked gate
            verdict = replace(ev, status=Status.CRASH, message=f"{gate} could not run: {error}", shapes=())
        elif gate == "sanitizer" and value.get("status") in _SANITIZER_FAILS:
            verdict = replace(ev, status=_SANITIZER_FAILS[value["status"]], guard="sanitizer",
                              message=f"compute-sanitizer: {value.get('summary', '')}"[:2000], shapes=())
        elif gate == "loop" and value.get("failed"):
            why = "; ".join(str(v) for v in value["failed"].values())
            verdict = replace(ev, status=Status.REJECTED, guard="loop",
                              message=f"failed in the peers' loop (many launches in a row): {why}"[:2000], shapes=())
        else:
            verdict = ev
        p.evidence.setdefault("reports", {})[gate] = value if value is not None else {"error": error}
        self._gate(p, verdict, "sanitizer" if gate == "sanitizer" else "loop")

    def _finish(self, p: _Pending) -> None:
        st, ev = p.state, p.evaluation
        assert ev is not None
        self.inflight.pop((st.name, p.variant.id, st.dtype), None)
        self._answer(p, ev, {"gates": p.evidence.get("gates", []), "reports": p.evidence.get("reports", {})})

    def _answer(self, p: _Pending, ev: Evaluation | None, evidence: dict[str, Any]) -> None:
        """Shapes, records and delivers one answer (``ev`` None: ``evidence`` is an earlier answer)."""
        st = p.state
        base: dict[str, Any]
        if ev is not None:
            base = {"status": ev.status.value, "speedup": ev.speedup, "feedback": ev.message, "guard": ev.guard,
                    "synthetic": is_synthetic_evaluation(ev), "cached": False, "evidence": {
                        **evidence, "eval_keys": _keys(st, p.variant.id, ev, evidence.get("gates", [])),
                        "evaluator": ev.extra.get("evaluator", self.config.evaluator)}}
            self.answered[(st.name, p.variant.id, st.dtype)] = base
        else:
            base = evidence
        status = str(base["status"])
        outcome = Status(status) if status in Status.__members__ else ProposalOutcome(status)
        score = self.config.shaping.score(outcome, base["speedup"])
        answer = {**base, "score": score, "correct": outcome is Status.OK, "kernel": st.name, "dtype": st.dtype,
                  "variant_id": p.variant.id, "request_id": p.request_id, "latency_s": time.time() - p.started}
        self.record("rewards", {**answer, "client": p.client, "time": time.time(), "source": p.variant.source,
                                "shaping": self.config.shaping.to_dict(), **p.context})
        self.served += 1
        with self._records_lock:
            self._open.discard(p.future)
        p.future.set_result(answer)
        for follower in p.followers:
            self._answer(follower, None, {**base, "cached": True})


def is_synthetic_evaluation(ev: Evaluation) -> bool:
    """Whether a verdict came from the CPU stand-in (its numbers are not measurements)."""
    return ev.extra.get("evaluator") == "standin"


NO_VARIANT_ANSWER: dict[str, Any] = {
    "status": ProposalOutcome.NO_VARIANT.value, "speedup": None, "guard": "", "synthetic": False, "cached": False,
    "feedback": "no kernel found in the response: give the whole .cu file (launch header and kernel) in one "
                "```cuda block", "evidence": {"gates": []}}


def _keys(st: KernelState, variant_id: str, ev: Evaluation, gates: list[dict[str, Any]]) -> list[str]:
    """The keys of the evaluation records behind an answer (search shapes, held-out shapes)."""
    stages = [(Stage.FULL, ShapeSet.SEARCH)] + [(Stage.HELDOUT, ShapeSet.HELDOUT)] * any(
        g["gate"] == "heldout" for g in gates)
    return [eval_key(st.name, variant_id, ev.params, st.dtype, stage, shapes) for stage, shapes in stages]


def _answered(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Earlier answers on record, by (kernel, variant id, dtype): served again without a new
    evaluation (re-shaped with the current shaping)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in read_jsonl(path):
        if row.get("cached") or row.get("status") == ProposalOutcome.NO_VARIANT:
            continue
        keep = ("status", "speedup", "feedback", "guard", "synthetic", "evidence")
        out[(row["kernel"], row["variant_id"], row["dtype"])] = {**{k: row.get(k) for k in keep}, "cached": False}
    return out

