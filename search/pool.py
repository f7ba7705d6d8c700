"""Ray plumbing: agent actors, admission tasks, and the pool of evaluator actors.

The actors are thin: each wraps a plain object (an :class:`agents.base.Agent`, an
:class:`evaluators.api.Evaluator`) that is tested without Ray. The evaluator pool follows
Ray's ``ActorPool`` pattern (submit, then wait for whichever finishes first), replaces an
actor that dies and retries its call, and turns a failure of the evaluator itself into a
recorded verdict, so that no single evaluation, sanitizer run or peer timing ends a run.

Admission (:func:`evaluators.admit.admit`) runs in a CPU task (on a cluster's CPU-only nodes
where it has some: :class:`AdmissionTasks`) with two return objects: the small summary
(:class:`~evaluators.admit.Admitted` or the :class:`~evaluators.admit.Refusal`) that the
driver fetches, and the :class:`~evaluators.admit.Artifact` (the cubin) that it does
not: the artifact's reference goes to ``EvaluatorActor.evaluate`` as a top-level argument, so
Ray moves the cubin to the evaluator's node and the evaluator compiles nothing again.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agents.base import AgentContext, Attempt, Proposal
from evaluators.admit import Admitted, Artifact, Refusal, admit
from evaluators.api import EvalRequest
from kernels.folders import KernelRef
from kernels.spec import cached_kernel
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

    def whereabouts(self, kernels: Mapping[str, str]) -> dict[str, Any]:
        """Where this actor runs and takes the project and kernel folders from."""
        from search.cluster import whereabouts

        return whereabouts(kernels)


_spec = cached_kernel  # one cache per process, keyed by reference


def admission(kernel: KernelRef | str, source: str, dtype: str, params: Mapping[str, int],
              shapes: Sequence[Mapping[str, int]]) -> tuple[Admitted | Refusal, Artifact | None]:
    """Admits one variant on the CPU: ``(summary, artifact)``; the artifact is None when refused.

    Args:
        kernel: the kernel's reference (resolved on whichever node runs the task), or a
            library kernel name.
        source: the variant file.
        dtype: run dtype.
        params: tunable values (missing ones take their defaults).
        shapes: every shape the run may launch it on (search, held-out, drawn and extra).
    """
    out = admit(_spec(kernel), source, dtype, params, shapes=[dict(s) for s in shapes])
    if isinstance(out, Refusal):
        return out, None
    return out.summary(), out


def admission_on_node(kernel: KernelRef | str, source: str, dtype: str, params: Mapping[str, int],
                      shapes: Sequence[Mapping[str, int]]) -> tuple[Admitted | Refusal, Artifact | None, str]:
    """:func:`admission` and the id of the Ray node it ran on (what ``cluster.json`` records)."""
    summary, artifact = admission(kernel, source, dtype, params, shapes)
    return summary, artifact, ray.get_runtime_context().get_node_id()


# One CPU and no GPU: a compile never holds a GPU an evaluator could use. The cubin goes back
# as an object reference, so where a compile ran costs one object transfer to the evaluator's
# node.
_admission_task = ray.remote(num_cpus=1, num_returns=2)(admission)
_admission_task_on_node = ray.remote(num_cpus=1, num_returns=3)(admission_on_node)

# Where a cluster run's compile tasks go is re-read from ray.nodes() (one call to the GCS) at
# most this often, so a node that died stops being chosen and one that joined starts to be.
NODES_REFRESH_S = 30.0
ANYWHERE = "anywhere"  # the key of tasks sent with no node chosen
UNANSWERED = "unanswered"  # the key of tasks whose node is not known (failed, or still running)
_FOLD_EVERY = 64  # tasks started between two counts of the finished ones
# How far below the search's CPU priority the calls beside it run (search.compile_ahead). The
# peers' rounds set up at 10: they have until the search ends. The compilations run at 0: on one
# H100 at cb587aa, at 10, they answered 110-155 s after the run's set-up, all after a search of
# 100 s, and the end waited 101 s for them and the rounds behind them; at 0 (9a09729) they had
# answered 32-94 s in, during a search of 104-105 s (one cold run against two).
BESIDE_SEARCH_NICE = 10
COMPILE_BESIDE_SEARCH_NICE = 0


class AdmissionTasks:
    """Starts admission tasks: ``remote(...)`` takes :func:`admission`'s arguments and returns
    the summary's and the artifact's object references, like a Ray remote function with two
    returns. A run chooses once, at start, where they go (:meth:`anywhere` for a local
    cluster, :meth:`on_cpu_nodes` for ``--address``).

    Why CPU nodes: left to itself, Ray runs a one-CPU task on any node with a CPU free, GPU
    nodes as readily as others, and prefers the driver's node while it has room. On a GPU
    node a compile takes host CPU and memory bandwidth from the evaluators there, whose worker
    processes launch and time kernels and verify them against torch on the host. So where the
    cluster has alive nodes with CPUs and no GPU, every compile is pinned to one of them by a
    *soft* node affinity: Ray runs it there, waiting for a free CPU on that node rather than
    spilling to a GPU node, and runs it elsewhere only if the node died or can never run it,
    so a lost node never stalls the run. The nodes take turns in proportion to their CPUs. A
    cluster without such nodes places compiles as Ray would (anywhere), as does a local run.

    On a cluster it counts, per node, the tasks sent there and the tasks that ran there (each
    task returns its node id as a third object) for ``cluster.json``.
    """

    def __init__(self, refresh_s: float = NODES_REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self.anywhere()

    def anywhere(self) -> None:
        """Local runs: Ray places each task; nothing is chosen or counted."""
        self.recording = False
        self._reset({})

    def on_cpu_nodes(self, nodes: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Cluster runs: sends each task to a CPU-only node while there are any, and counts.

        Args:
            nodes: ``ray.nodes()``-shaped entries to choose from; None reads ``ray.nodes()``
                (and re-reads it every ``refresh_s`` seconds).
        """
        from search.cluster import compile_nodes

        self.recording = True
        self._reset(compile_nodes(ray.nodes() if nodes is None else nodes))
        self._refreshing = nodes is None

    def _reset(self, nodes: dict[str, float]) -> None:
        self.nodes = nodes
        self.sent: Counter[str] = Counter()
        self.ran: Counter[str] = Counter()
        self._turns: Counter[str] = Counter()
        self._where: list[Any] = []
        self._fold_at = _FOLD_EVERY
        self._refreshing = False
        self._checked = time.monotonic()

    def _refresh(self) -> None:
        if not self._refreshing or time.monotonic() - self._checked < self.refresh_s:
            return
        from search.cluster import compile_nodes

        self._checked = time.monotonic()
        nodes = compile_nodes(ray.nodes())
        if set(nodes) != set(self.nodes):
            self._turns.clear()  # a new set of nodes starts its turns afresh
        self.nodes = nodes

    def _next_node(self) -> str | None:
        """The CPU-only node with the fewest tasks sent per CPU since the set of nodes last
        changed, or None when there is none."""
        self._refresh()
        if not self.nodes:
            return None
        node = min(sorted(self.nodes), key=lambda n: self._turns[n] / self.nodes[n])
        self._turns[node] += 1
        return node

    def remote(self, kernel: KernelRef | str, source: str, dtype: str, params: Mapping[str, int],
               shapes: Sequence[Mapping[str, int]]) -> tuple[Any, Any]:
        """Starts one admission task: ``(summary reference, artifact reference)``."""
        args = (kernel, source, dtype, params, shapes)
        if not self.recording:
            # Two return objects (num_returns=2): Ray's stubs type them as one.
            refs: Any = _admission_task.remote(*args)
            return refs[0], refs[1]
        node = self._next_node()
        task: Any = _admission_task_on_node
        if node is not None:
            task = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True))
        summary, artifact, where = task.remote(*args)
        self.sent[node or ANYWHERE] += 1
        self._where.append(where)
        if len(self._where) >= self._fold_at:
            self._fold(timeout_s=0)
            self._fold_at = len(self._where) + _FOLD_EVERY  # unfinished ones wait for the next fold
        return summary, artifact

    def _fold(self, timeout_s: float) -> None:
        """Counts the node of every finished task (within ``timeout_s``) and forgets its reference."""
        if not self._where:
            return
        ready, self._where = ray.wait(self._where, num_returns=len(self._where), timeout=timeout_s)
        for ref in ready:
            try:
                self.ran[str(ray.get(ref))] += 1
            except RayError:  # the task failed (its caller sees why); its node is unknown
                self.ran[UNANSWERED] += 1

    def record(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Where compile tasks went: ``placement`` (``cpu nodes`` or ``anywhere``), the chosen
        ``cpu_nodes`` (node id -> CPUs; the last choice), and per node the tasks ``sent`` there
        and the tasks that ``ran`` there (waiting up to ``timeout_s`` for unfinished ones)."""
        self._fold(timeout_s)
        ran = Counter(self.ran)
        if self._where:
            ran[UNANSWERED] += len(self._where)
        return {"placement": "cpu nodes" if self.nodes else ANYWHERE, "cpu_nodes": dict(self.nodes),
                "sent": dict(self.sent), "ran": dict(ran)}


# The run's admission tasks: run.start_ray chooses their placement once per run.
admission_task = AdmissionTasks()


class EvaluatorActor:
    """Holds one evaluator on one GPU (Ray sets CUDA_VISIBLE_DEVICES, so it is device 0).

    Args:
        kind: ``gpu`` or ``standin``.
        latency_s: stand-in only: seconds each evaluation sleeps.
    """

    def __init__(self, kind: str, latency_s: float = 0.0) -> None:
        if kind == "gpu":
            from evaluators.gpu import GpuEvaluator
            from evaluators.gpu_turns import benchmark_lock_path, lock_path

            # Its worker holds the GPU's benchmark lock alone through every job: compilations
            # made beside the search (precompile, beside_search) benchmark under that lock.
            self.evaluator: Any = GpuEvaluator(device=0, job_lock=str(benchmark_lock_path(lock_path())))
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

    def evaluate(self, request: EvalRequest, artifact: Artifact | None = None) -> tuple[Evaluation, float]:
        """The verdict and the seconds spent; ``artifact`` arrives resolved (Ray fetched it)."""
        with self._lock:
            start = time.perf_counter()
            evaluation = self.evaluator.evaluate(request, artifact)
            return evaluation, time.perf_counter() - start

    def time_peers(self, kernel: KernelRef | str, dtype: str, shape_set: str,
                   ours: dict[str, tuple[str, dict[str, int]]] | None = None, fresh_process: bool = False,
                   compile_trials: int | None = None, peers: bool = True,
                   compile_cache: str | None = None) -> dict[str, Any]:
        """The peers' loop: ``peers`` (times), ``errors`` (peers not timed), ``failed`` (our
        kernels that failed verification in the loop), what the loop recorded beside them
        (``compiled``, ``notes``, ``l2_persistence``, ``l2_finding``, ``phase_s``, ``prepare_s_by_peer``,
        ``compile_phases_s``, ``jit_builds``) and ``busy_s`` (GPU busy, as for evaluate); ``fresh_process``: in a new sandbox process;
        ``peers`` False: our kernels alone; ``compile_cache``: the folder :meth:`precompile`
        made this loop's compilations in."""
        with self._lock:
            start = time.perf_counter()
            reply = self.evaluator.time_peers_full(kernel, dtype, shape_set, ours, fresh_process=fresh_process,
                                                   compile_trials=compile_trials, peers=peers,
                                                   compile_cache=compile_cache)
            return {**_loop_answer(reply), "busy_s": time.perf_counter() - start}

    def time_round(self, kernel: KernelRef | str, dtype: str, loops: list[dict[str, Any]],
                   beside_others: bool = True, beside_search: str | None = None,
                   gate_until: float | None = None) -> dict[str, Any]:
        """A round of end-of-run loops (each of ``loops`` the keyword arguments of
        :meth:`time_peers` but ``fresh_process``), in a process of its own that sets every loop
        up before it times any: ``{"loops": [each loop's answer, as time_peers gives it],
        "busy_s": the seconds its loops timed}``. On a GPU the round has an evaluator of its
        own, whose sandbox process takes part in the GPU's turns (:mod:`evaluators.gpu_turns`):
        rounds are non-exclusive calls, run beside each other and beside sanitizer runs, and
        their set-ups overlap while their timed passes take turns with everything that
        launches on the GPU. ``beside_others`` False (an exclusive call: the GPU is this
        round's) and the stand-in take the evaluator's turn and its process. ``beside_search``:
        the name of a gate (:meth:`open_gate`): the round sets up now, beside the search, at a
        lower CPU priority, and times once the gate is open (:mod:`search.compile_ahead`), or
        fails if it is still shut at ``gate_until`` (epoch seconds)."""
        if self.kind == "gpu" and beside_others:
            from evaluators.gpu import GpuEvaluator
            from evaluators.gpu_turns import lock_path

            evaluator = GpuEvaluator(device=0, gpu_turns=str(lock_path()), nice=BESIDE_SEARCH_NICE if beside_search else 0)
            try:
                replies = evaluator.time_round(kernel, dtype, loops,
                                               time_after=str(gate_file(beside_search)) if beside_search else None,
                                               time_after_until=gate_until)
            finally:
                evaluator.close()
        else:
            with self._lock:
                replies = self.evaluator.time_round(kernel, dtype, loops)
        answers = [_loop_answer(r) for r in replies]
        return {"loops": answers, "busy_s": sum(float(a.get("phase_s", {}).get("loop", 0.0)) for a in answers)}

    def open_gate(self, name: str) -> str:
        """Opens the gate ``name`` on this actor's node (:func:`gate_file`): the rounds set up
        beside the search and waiting there time from now on. Returns the file's path."""
        return str(open_gate_here(name))

    def precompile(self, kernel: KernelRef | str, dtype: str, shape_set: str, folder: str,
                   beside_search: bool = False) -> dict[str, Any]:
        """Compiles the kernel's torch.compile programs for its end-of-run loops on one shape set
        ahead of them (every round's loop on that set loads them), into
        ``folder`` under this node's temporary directory (:mod:`evaluators.peer_compile`); the
        report carries the folder's full path as ``folder``. A separate process, like a
        sanitizer run: it never overlaps a timed call. ``beside_search``: it runs beside the
        search's evaluations (:mod:`search.compile_ahead`), its autotuning benchmarks taking
        turns with them through the lock this actor's worker holds through every job. The
        stand-in has nothing to compile."""
        if self.kind != "gpu":
            return {"status": "SKIPPED", "summary": "stand-in evaluator: no peers to compile"}
        import tempfile

        from evaluators.gpu_turns import benchmark_lock_path, lock_path
        from evaluators.peer_compile import compile_ahead

        where = Path(tempfile.gettempdir()) / "kernel-search-compiled" / folder
        # One lock per GPU: the compile-ahead processes of this GPU never benchmark at once.
        benchmarks = benchmark_lock_path(lock_path()) if beside_search else None
        # Beside the search, at COMPILE_BESIDE_SEARCH_NICE: yielding the CPU to the search (at
        # 10) left it at 100 s against 104-105 s (other commits) and cost the end a minute (see there).
        nice = COMPILE_BESIDE_SEARCH_NICE if beside_search else 0
        return dict(compile_ahead(kernel, dtype, shape_set, where, lock_path(), benchmark_lock=benchmarks, nice=nice),
                    folder=str(where))

    def sanitize(self, kernel: KernelRef | str, source: str, dtype: str, params: dict[str, int],
                 shapes: Sequence[Mapping[str, int]] = ()) -> dict[str, Any]:
        """compute-sanitizer (memcheck, racecheck) on a winner over ``shapes``; the stand-in
        has no GPU to check on and says so."""
        if self.kind != "gpu":
            return {"status": "SKIPPED", "summary": "stand-in evaluator: no GPU to sanitize on"}
        from evaluators.gpu_turns import benchmark_lock_path, lock_path
        from evaluators.peer_compile import sharing_the_gpu
        from evaluators.sanitize import sanitize

        # No timed pass and no autotuning benchmark (of a compile-ahead process or of a round's
        # set-up) while an instrumented kernel loads the GPU.
        with sharing_the_gpu(lock_path()), sharing_the_gpu(benchmark_lock_path(lock_path())):
            report = sanitize(kernel, source, dtype, params=params, shapes=[dict(s) for s in shapes])
        return dict(report.to_dict(), summary=report.summary())

    def device_name(self) -> str:
        name = getattr(self.evaluator, "device_name", None)
        if name:
            return str(name)
        import torch

        return torch.cuda.get_device_name(0)

    def environment(self) -> dict[str, Any]:
        """What the peers' figures measured on this evaluator depend on beside their programs
        (:mod:`search.peer_cache`): the GPU model and architecture, the driver and CUDA runtime
        versions and the peer libraries' versions (starts the worker). The stand-in: its name."""
        if self.kind != "gpu":
            return {"gpu": self.device_name()}
        from search.peer_cache import library_versions

        with self._lock:
            info = self.evaluator.info()
        return {"gpu": info["gpu"], "arch": info["arch"], "driver": info.get("driver"), "runtime": info.get("runtime"),
                **library_versions()}

    def whereabouts(self, kernels: Mapping[str, str]) -> dict[str, Any]:
        """Where this actor runs and takes the project and kernel folders from (no turn taken:
        it touches neither the evaluator nor the GPU)."""
        from search.cluster import whereabouts

        return {**whereabouts(kernels), "kind": self.kind}

    def close(self) -> None:
        with self._lock:
            self.evaluator.close()


def evaluator_options(kind: str, max_concurrency: int = 1) -> dict[str, Any]:
    """Ray actor options of an evaluator: one GPU each for ``gpu``, no resources for the stand-in.

    One GPU per actor makes the pool one evaluator per GPU wherever the GPUs are: a pool as
    large as the cluster's GPU count takes every GPU, whichever nodes hold them. SPREAD is for
    a smaller pool (``--gpus``): Ray's default packs actors onto the driver's node while it has
    room, where they would share its host CPUs and memory bandwidth and disturb each other's
    timing; spread, they go to different nodes while there are nodes enough. The stand-in asks
    for nothing, so it runs on any node, CPU-only ones included.
    """
    return {"num_gpus": 1 if kind == "gpu" else 0, "num_cpus": 0, "max_concurrency": max(1, max_concurrency),
            "scheduling_strategy": "SPREAD"}


def gate_file(name: str) -> Path:
    """The file whose existence opens gate ``name`` on this node (see
    :meth:`EvaluatorActor.open_gate`): one per run attempt, so that none is found open early."""
    import tempfile

    return Path(tempfile.gettempdir()) / "kernel-search-gates" / f"{name}.open"


def open_gate_here(name: str) -> Path:
    """Opens gate ``name`` on this node (creates its :func:`gate_file`); returns the file."""
    path = gate_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def spawn_evaluator(kind: str, latency_s: float = 0.0, max_concurrency: int = 1) -> Any:
    """A new evaluator actor, placed by :func:`evaluator_options`.

    ``max_concurrency`` > 1 lets calls overlap (threads): useful for sanitizer runs, which are
    separate processes; calls that use the evaluator still take turns (a lock in the actor).
    The actor starts its worker at once, before its first request.
    """
    options = evaluator_options(kind, max_concurrency)
    actor: Any = ray.remote(EvaluatorActor).options(**options).remote(kind, latency_s)
    actor.ready.remote()  # not awaited: a failure here shows again on the first request
    return actor


@dataclass
class Call:
    """One call on an evaluator actor and whom its answer is for.

    Attributes:
        owner: the caller's handle (a job, a callback), returned with the answer.
        method: ``evaluate``, ``time_peers`` or ``sanitize``.
        args: the method's arguments (object references among them are resolved by Ray).
        exclusive: takes the actor's turn (the GPU); False for sanitizer runs, which are
            separate processes and may overlap each other on one actor, but never an
            exclusive call: a timed evaluation or peers' loop has its GPU to itself.
        background: neither takes the actor's turn nor waits for one (compilations ahead
            made during the search, which take turns with its evaluations on their own).
        what: a label for messages (kernel and variant).
        tries: retries used so far.
        started: when the call was sent to its actor (monotonic seconds).
        expired: :meth:`EvalPool.expire` ended its actor: the call is answered, not retried.
    """

    owner: Any
    method: str
    args: tuple[Any, ...]
    exclusive: bool = True
    what: str = ""
    background: bool = False
    tries: int = 0
    slot: int = field(default=-1, compare=False)
    actor: Any = field(default=None, compare=False, repr=False)
    started: float = field(default=0.0, compare=False)
    expired: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Answer:
    """A finished call: its value, or why there is none.

    Attributes:
        call: the call.
        value: the method's return value (``evaluate``: the Evaluation), None on error.
        busy_s: seconds the actor's GPU was busy with it.
        error: empty, or the reason the evaluator could not answer (it raised, or its actor
            died more often than the retries allow).
    """

    call: Call
    value: Any
    busy_s: float = 0.0
    error: str = ""


def _loop_answer(reply: dict[str, Any]) -> dict[str, Any]:
    """What a peers' loop answers over Ray: its times and what it recorded beside them (a loop
    of a round that failed on its own: ``{"loop_error": why}``)."""
    if "loop_error" in reply:
        return {"loop_error": str(reply["loop_error"])}
    kept: dict[str, Any] = {k: reply[k] for k in ("compiled", "notes", "l2_persistence", "l2_finding", "phase_s", "prepare_s_by_peer",
                                  "prepare_s_first_shape_by_peer", "compile_phases_s", "compile_cache", "jit_builds",
                                  "timed_at", "nice_timed", "separate_loops") if k in reply}
    return {"peers": dict(reply["peers"]), "errors": dict(reply.get("errors", {})),
            "failed": dict(reply.get("failed", {})), **kept}


class EvalPool:
    """Keeps every evaluator actor fed with one exclusive call at a time.

    Args:
        kind: evaluator kind.
        size: number of actors (GPUs).
        retries: how often a call is retried after its actor died.
        latency_s: stand-in only.
        background: background calls (:attr:`Call.background`) that may run at once, each
            beside the exclusive calls of its actor (which runs them in threads of its own).
    """

    def __init__(self, kind: str, size: int, retries: int = 1, latency_s: float = 0.0, background: int = 0) -> None:
        self.kind, self.retries, self.latency_s = kind, retries, latency_s
        self.background_limit = max(0, background)
        self._concurrency = 1 + self.background_limit
        self.actors = [spawn_evaluator(kind, latency_s, self._concurrency) for _ in range(size)]
        self.idle = deque(range(size))
        self.sharing = [0] * size  # non-exclusive calls in flight per actor
        self.behind = [0] * size  # background calls in flight per actor
        self.queue: deque[Call] = deque()
        self.inflight: dict[Any, Call] = {}
        self.busy_s = 0.0
        self.replaced = 0
        # (method, dispatched, answered) of every call answered: where the wall time went (search.stages)
        self.spans: list[tuple[str, float, float]] = []

    def submit(self, job: Any, request: EvalRequest, artifact: Any = None) -> None:
        """Queues an evaluation; ``artifact`` is the admitted artifact's object reference."""
        self.call(job, "evaluate", request, artifact, what=f"{request.variant.kernel} {request.variant.id}")

    def call(self, owner: Any, method: str, *args: Any, exclusive: bool = True, what: str = "",
             background: bool = False) -> None:
        """Queues any evaluator call (see :class:`Call`)."""
        if background and not self.background_limit:
            raise ValueError("EvalPool: a background call on a pool made without background room")
        self.queue.append(Call(owner, method, args, exclusive and not background, what, background))
        self._dispatch()

    def background_inflight(self) -> int:
        """Background calls queued or in flight."""
        return sum(1 for c in [*self.queue, *self.inflight.values()] if c.background)

    def _dispatch(self) -> None:
        waiting: deque[Call] = deque()
        while self.queue:
            call = self.queue.popleft()
            slot = self._background_slot() if call.background else self._free_slot(call.exclusive)
            if slot is None:
                waiting.append(call)
                continue
            call.slot = slot
            if call.background:
                self.behind[slot] += 1
            elif call.exclusive:
                self.idle.remove(slot)
            else:
                self.sharing[slot] += 1
            call.actor = self.actors[call.slot]
            call.started = time.monotonic()
            ref = getattr(call.actor, call.method).remote(*call.args)
            self.inflight[ref] = call
        self.queue = waiting

    def _free_slot(self, exclusive: bool) -> int | None:
        """An actor for the call, or None to wait. Sanitizer runs (non-exclusive) launch
        instrumented kernels on the same GPU: were they to overlap a timed call, its times
        would include their contention. So an exclusive call waits for an actor with nothing
        in flight, and non-exclusive calls share an actor only with each other (the least
        loaded one not running an exclusive call)."""
        if exclusive:
            return next((s for s in self.idle if self.sharing[s] == 0), None)
        return min(self.idle, key=lambda s: self.sharing[s], default=None)

    def _background_slot(self) -> int | None:
        """The actor with the fewest background calls, while the pool has room for one more."""
        if not self.actors or sum(self.behind) >= self.background_limit:
            return None
        return min(range(len(self.actors)), key=lambda s: self.behind[s])

    def refs(self) -> list[Any]:
        return list(self.inflight)

    def pending(self) -> int:
        return len(self.queue) + len(self.inflight)

    def collect(self, ref: Any) -> Answer | None:
        """Takes a finished call's answer, or None when it was requeued because its actor
        died (the actor is replaced). An ``evaluate`` whose evaluator failed answers a CRASH
        verdict that says so; other calls answer with ``error`` set."""
        call = self.inflight.pop(ref)
        try:
            value = ray.get(ref)
        except RayActorError as exc:
            self._replace(call)
            if call.expired:
                self._dispatch()
                return self._failed(call, f"the evaluator did not answer within {time.monotonic() - call.started:.0f} s "
                                          "and was replaced", Status.TIMEOUT)
            if call.tries < self.retries:
                call.tries += 1
                self.queue.appendleft(call)
                self._dispatch()
                return None
            self._dispatch()
            return self._failed(call, f"the evaluator process died {call.tries + 1} times on this call: "
                                      f"{_first_line(exc)}")
        except RayTaskError as exc:
            self._release(call)
            return self._failed(call, f"evaluator error (a failure of the evaluator, not a verdict on "
                                      f"the kernel): {_cause(exc)}")
        self._release(call)
        busy = 0.0
        if call.method == "evaluate":
            value, busy = value
        elif call.method in ("time_peers", "time_round"):
            busy = float(value.get("busy_s", 0.0))
        self.busy_s += busy
        return Answer(call, value, busy)

    def _release(self, call: Call) -> None:
        self.spans.append((call.method, call.started, time.monotonic()))
        self._free(call)
        self._dispatch()

    def _free(self, call: Call) -> None:
        if call.background:
            self.behind[call.slot] -= 1
        elif call.exclusive:
            self.idle.append(call.slot)
        else:
            self.sharing[call.slot] -= 1

    def _replace(self, call: Call) -> None:
        slot = call.slot
        if self.actors[slot] is call.actor:  # not yet replaced for another call it took down
            ray.kill(call.actor)
            self.actors[slot] = spawn_evaluator(self.kind, self.latency_s, self._concurrency)
            self.replaced += 1
        self._free(call)

    def expire(self, limit_s: float) -> int:
        """Ends every actor whose exclusive call has run longer than ``limit_s``: an evaluator
        that stopped answering (a hung kernel is the sandbox worker's watchdog's, a TIMEOUT
        verdict without this). The call is answered TIMEOUT (an ``evaluate``) or with an
        error, never retried, and the actor is replaced; returns how many were ended."""
        now = time.monotonic()
        overdue = [c for c in self.inflight.values() if c.exclusive and not c.expired and now - c.started > limit_s]
        for call in overdue:
            call.expired = True
            ray.kill(call.actor)
        return len(overdue)

    def _failed(self, call: Call, message: str, status: Status = Status.CRASH) -> Answer:
        print(f"!! {call.method} {call.what}: {message}", file=sys.stderr, flush=True)
        if call.method == "evaluate":
            return Answer(call, _crash(call.args[0], message, status), 0.0, message)
        return Answer(call, None, 0.0, message)

    def renew(self, size: int | None = None, max_concurrency: int = 1) -> None:
        """Replaces every actor by a fresh one (``size`` of them), e.g. for the end of a run,
        whose timing starts from clean evaluators. Nothing may be in flight."""
        if self.inflight or self.queue:
            raise RuntimeError("EvalPool.renew with calls in flight")
        size = len(self.actors) if size is None else size
        self.shutdown()
        self._concurrency = max(1, max_concurrency)
        self.actors = [spawn_evaluator(self.kind, self.latency_s, self._concurrency) for _ in range(size)]
        self.idle = deque(range(size))
        self.sharing = [0] * size
        self.behind = [0] * size
        self.background_limit = 0  # fresh actors run one call at a time beside their sharing ones

    def device_name(self) -> str:
        """The name of the device the first actor evaluates on."""
        return str(ray.get(self.actors[0].device_name.remote()))

    def environment(self) -> dict[str, Any]:
        """The first actor's :meth:`EvaluatorActor.environment` (every evaluator of a pool is
        taken to run the same GPU model and software; peer figures are keyed by it)."""
        return dict(ray.get(self.actors[0].environment.remote()))

    def open_gates(self, name: str, timeout_s: float = 120.0) -> None:
        """Opens gate ``name`` on every actor's node (:meth:`EvaluatorActor.open_gate`), and on
        this process's node first: there it opens even if its actors do not answer."""
        open_gate_here(name)
        try:
            ray.get([actor.open_gate.remote(name) for actor in self.actors], timeout=timeout_s)
        except (RayError, TimeoutError) as exc:
            # A round on another node whose actor did not answer waits on until its deadline
            # (``gate_until`` of time_round) or that actor's end, and the end's wait with it.
            print(f"!! opening gate {name} failed: {_first_line(exc)}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Closes the evaluators (their sandbox workers) and ends the actors."""
        try:
            ray.get([actor.close.remote() for actor in self.actors])
        except RayError as exc:  # the results are in; a failed close costs nothing but a warning
            print(f"!! closing the evaluators failed: {_first_line(exc)}", file=sys.stderr, flush=True)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors, self.idle, self.sharing, self.behind = [], deque(), [], []


def _first_line(exc: BaseException) -> str:
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def _cause(exc: RayTaskError) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {_first_line(cause)}"
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _crash(request: EvalRequest, message: str, status: Status = Status.CRASH) -> Evaluation:
    return Evaluation(
        status=status, message=message, kernel=request.variant.kernel, dtype=request.dtype,
        variant_id=request.variant.id, params=dict(request.params), shape_set=request.shape_set,
    )
