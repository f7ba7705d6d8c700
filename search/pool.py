"""Ray plumbing: agent actors, compile tasks, and the pool of evaluator actors.

The actors are thin: each wraps a plain object (an :class:`agents.base.Agent`, an
:class:`evaluators.api.Evaluator`) that is tested without Ray. The evaluator pool follows
Ray's ``ActorPool`` pattern (submit, then wait for whichever finishes first) and replaces an
actor that dies, retrying its request.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError

from agents.base import AgentContext, Attempt, Proposal
from evaluators.api import EvalRequest
from kernels.launch import LaunchSpecError
from kernels.variant import Variant
from kernels.verdict import Evaluation, Status


class AgentActor:
    """One member of the population: a plain agent per kernel, created on first use.

    Args:
        kind: agent kind for :func:`agents.factory.make_agent`.
        config: the agent section of the run config.
        seed: this member's seed.
    """

    def __init__(self, kind: str, config: Any, seed: int) -> None:
        self.kind, self.config, self.seed = kind, config, seed
        self.agents: dict[str, Any] = {}

    def _agent(self, kernel: str) -> Any:
        if kernel not in self.agents:
            from agents.factory import make_agent

            self.agents[kernel] = make_agent(self.kind, self.config, self.seed)
        return self.agents[kernel]

    def propose(self, ctx: AgentContext) -> list[Proposal]:
        return list(self._agent(ctx.kernel).propose(ctx))[: ctx.n_variants]

    def observe(self, kernel: str, attempts: Sequence[Attempt]) -> None:
        self._agent(kernel).observe(attempts)


@dataclass(frozen=True)
class CompileOutcome:
    """What the driver needs from a compilation (the cubin itself stays in the disk cache).

    Attributes:
        ok: compiled, and the launch header and signature fit the spec.
        log: the reason when not ok (compiler log, header or signature error).
        key: the compile cache key.
        binary_key: identity of what would run: cubin, launch expressions, parameters, dtype.
        params: the full parameter assignment (defaults filled in).
        seconds: compile time.
    """

    ok: bool
    log: str
    key: str = ""
    binary_key: str = ""
    params: dict[str, int] | None = None
    seconds: float = 0.0


def compile_outcome(kernel: str, variant: Variant, dtype: str, params: dict[str, int]) -> CompileOutcome:
    """Checks and compiles one variant on the CPU (no GPU involved)."""
    from evaluators.compile import compile_variant
    from kernels.spec import KernelSpecError, check_signature, load_kernel

    spec = load_kernel(kernel)
    try:
        launch = variant.launch()
        spec.check_launch(launch)
        check_signature(spec, variant.source)
        full = launch.validate_params(params)
    except (LaunchSpecError, KernelSpecError) as exc:
        return CompileOutcome(False, str(exc))
    result = compile_variant(variant.source, spec.name, dtype, full)
    if not result.ok:
        return CompileOutcome(False, result.log, result.key, "", full, result.seconds)
    h = hashlib.sha256(result.cubin)
    exprs = [e.text for e in (*launch.grid, *launch.block, launch.smem)]
    h.update(repr((exprs, sorted(full.items()), dtype)).encode())
    return CompileOutcome(True, result.log, result.key, h.hexdigest()[:32], full, result.seconds)


compile_task = ray.remote(num_cpus=1)(compile_outcome)


class EvaluatorActor:
    """Holds one evaluator on one GPU (Ray sets CUDA_VISIBLE_DEVICES, so it is device 0).

    Args:
        kind: ``gpu`` or ``standin``.
        latency_s: stand-in only: seconds each evaluation sleeps.
    """

    def __init__(self, kind: str, latency_s: float = 0.0) -> None:
        if kind == "gpu":
            from evaluators.gpu import GpuEvaluator

            self.evaluator: Any = GpuEvaluator(device=0)
        else:
            from evaluators.standin import StandinEvaluator

            self.evaluator = StandinEvaluator(latency_s=latency_s)
        self.kind = kind
        # An actor made with max_concurrency > 1 runs calls in threads; the evaluator (one
        # worker process, one pipe) serves one of them at a time. Sanitizer runs do not use it.
        self._lock = threading.Lock()

    def ready(self) -> None:
        """Starts the sandbox worker (CUDA context, copy-bandwidth probe) before any request
        arrives, so that start-up overlaps the agents' first proposals instead of being the
        first evaluation's time."""
        info = getattr(self.evaluator, "info", None)
        if callable(info):
            with self._lock:
                info()

    def evaluate(self, request: EvalRequest) -> tuple[Evaluation, float]:
        with self._lock:
            start = time.perf_counter()
            evaluation = self.evaluator.evaluate(request)
            return evaluation, time.perf_counter() - start

    def time_peers(self, kernel: str, dtype: str, shape_set: str,
                   ours: dict[str, tuple[str, dict[str, int]]] | None = None
                   ) -> tuple[dict[str, dict[str, float]], float, dict[str, str]]:
        """Peer times, the seconds this actor spent on them (GPU busy, as for evaluate), and
        why a peer could not be timed (``{peer: reason}``)."""
        with self._lock:
            start = time.perf_counter()
            reply = self.evaluator.time_peers_full(kernel, dtype, shape_set, ours)
            return reply["peers"], time.perf_counter() - start, dict(reply.get("errors", {}))

    def sanitize(self, kernel: str, source: str, dtype: str, params: dict[str, int]) -> dict[str, Any]:
        """compute-sanitizer (memcheck, racecheck) on one launch of a winner; the stand-in
        has no GPU to check on and says so."""
        if self.kind != "gpu":
            return {"status": "SKIPPED", "summary": "stand-in evaluator: no GPU to sanitize on"}
        from evaluators.sanitize import sanitize

        report = sanitize(kernel, source, dtype, params=params)
        return dict(report.to_dict(), summary=report.summary())

    def device_name(self) -> str:
        name = getattr(self.evaluator, "device_name", None)
        if name:
            return str(name)
        import torch

        return torch.cuda.get_device_name(0)

    def close(self) -> None:
        with self._lock:
            self.evaluator.close()


def spawn_evaluator(kind: str, latency_s: float = 0.0, max_concurrency: int = 1) -> Any:
    """A new evaluator actor: one GPU each for ``gpu``, no resources for the stand-in.

    ``max_concurrency`` > 1 lets calls overlap (threads): useful for sanitizer runs, which are
    separate processes; calls that use the evaluator still take turns (a lock in the actor).
    The actor starts its worker at once, before its first request.
    """
    gpus = 1 if kind == "gpu" else 0
    options = {"num_gpus": gpus, "num_cpus": 0, "max_concurrency": max(1, max_concurrency)}
    actor: Any = ray.remote(EvaluatorActor).options(**options).remote(kind, latency_s)
    actor.ready.remote()  # not awaited: a failure here shows again on the first request
    return actor


@dataclass
class _InFlight:
    slot: int
    job: Any
    request: EvalRequest
    tries: int


class EvalPool:
    """Keeps every evaluator actor fed with one request at a time.

    Args:
        kind: evaluator kind.
        size: number of actors (GPUs).
        retries: how often a request is retried after its actor died.
        latency_s: stand-in only.
    """

    def __init__(self, kind: str, size: int, retries: int = 1, latency_s: float = 0.0) -> None:
        self.kind, self.retries, self.latency_s = kind, retries, latency_s
        self.actors = [spawn_evaluator(kind, latency_s) for _ in range(size)]
        self.idle = deque(range(size))
        self.queue: deque[tuple[Any, EvalRequest, int]] = deque()
        self.inflight: dict[Any, _InFlight] = {}
        self.busy_s = 0.0
        self.replaced = 0

    def submit(self, job: Any, request: EvalRequest) -> None:
        self.queue.append((job, request, 0))
        self._dispatch()

    def _dispatch(self) -> None:
        while self.idle and self.queue:
            slot = self.idle.popleft()
            job, request, tries = self.queue.popleft()
            ref = self.actors[slot].evaluate.remote(request)
            self.inflight[ref] = _InFlight(slot, job, request, tries)

    def refs(self) -> list[Any]:
        return list(self.inflight)

    def pending(self) -> int:
        return len(self.queue) + len(self.inflight)

    def collect(self, ref: Any) -> tuple[Any, Evaluation, float] | None:
        """Takes a finished request: ``(job, evaluation, busy_s)``, or None when it was
        requeued because its actor died (the actor is replaced)."""
        item = self.inflight.pop(ref)
        try:
            evaluation, busy = ray.get(ref)
        except RayActorError as exc:
            self.actors[item.slot] = spawn_evaluator(self.kind, self.latency_s)
            self.replaced += 1
            self.idle.append(item.slot)
            if item.tries < self.retries:
                self.queue.appendleft((item.job, item.request, item.tries + 1))
                self._dispatch()
                return None
            self._dispatch()
            message = f"the evaluator process died twice on this variant: {str(exc).splitlines()[0]}"
            return item.job, _died(item.request, message), 0.0
        self.busy_s += busy
        self.idle.append(item.slot)
        self._dispatch()
        return item.job, evaluation, busy

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors, self.idle = [], deque()


def _died(request: EvalRequest, message: str) -> Evaluation:
    return Evaluation(
        status=Status.CRASH, message=message, kernel=request.variant.kernel, dtype=request.dtype,
        variant_id=request.variant.id, params=dict(request.params), shape_set=request.shape_set,
    )
