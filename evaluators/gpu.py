"""The GPU evaluator: compiles on the CPU, runs candidates in a sandbox process, keeps going.

:class:`GpuEvaluator` is a plain object (the Ray GPU actor wraps it). It owns one long-lived
worker process (:mod:`evaluators.worker`) that holds the CUDA context. A watchdog waits for
the worker's heartbeat; silence longer than ``step_timeout_s`` means a hang: the worker is
killed and the verdict is TIMEOUT. A worker that dies or reports a CUDA fault gives CRASH.
Either way the next request starts a fresh worker, so one bad kernel costs one verdict.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from evaluators.admit import Artifact, Refusal, admit
from evaluators.api import EvalRequest, Evaluator
from evaluators.child_env import run_environment
from evaluators.peer_compile import crash_summary
from evaluators.peer_steps import EVERY_SHAPE, PEER_EXCLUSIONS, parse_peer_step
from kernels.folders import KernelRef
from kernels.launch import DeviceLimits, LaunchLimitError, LaunchSpecError
from kernels.spec import KernelSpec, Shape, load_kernel, shape_label
from kernels.verdict import Evaluation, ShapeResult, Status

Launches = list[tuple[tuple[int, int, int], tuple[int, int, int], int]]


class EvaluatorError(RuntimeError):
    """A failure of the evaluator itself (a bug or a broken installation), not of a kernel."""


WORKER_MODULE = "evaluators.worker"  # run as ``python -m WORKER_MODULE --fd N --device D``


class _Worker:
    """Handle on one sandbox process.

    The process is started with :func:`evaluators.child_env.run_environment`, not the
    parent's environment (a Ray actor's holds the LLM endpoint's key), and talks over one end
    of a socket pair wrapped as a :class:`multiprocessing.connection.Connection`.
    """

    def __init__(self, device: int, start_timeout_s: float, gpu_turns: str | None = None,
                 job_lock: str | None = None, nice: int = 0) -> None:
        ours, theirs = socket.socketpair()
        self.conn = Connection(ours.detach())
        turns = ((["--gpu-turns", gpu_turns] if gpu_turns else []) + (["--job-lock", job_lock] if job_lock else [])
                 + (["--nice", str(nice)] if nice else []))
        # stderr into a file of its own, read back when the process dies: with faulthandler on,
        # a signal (a library's segfault) leaves the Python frames it hit there.
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, "--fd", str(theirs.fileno()), "--device", str(device), *turns],
                env=run_environment({"PYTHONFAULTHANDLER": "1"}), pass_fds=(theirs.fileno(),), close_fds=True,
                stderr=self.stderr)
        finally:
            theirs.close()
        if not self.conn.poll(start_timeout_s):
            said = crash_summary(self.stderr_tail())
            self.kill()
            raise EvaluatorError(f"sandbox worker did not start within {start_timeout_s:.0f} s: {said}")
        try:
            kind, info = self.conn.recv()
        except (EOFError, ConnectionError, OSError):
            try:  # its socket closes as it exits: let it finish writing stderr
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            said = crash_summary(self.stderr_tail())
            self.kill()
            raise EvaluatorError(f"sandbox worker exited while starting (exit code {self.proc.returncode}): "
                                 f"{said}") from None
        if kind != "ready":
            raise EvaluatorError(f"sandbox worker sent {kind!r} instead of ready")
        self.info: dict[str, Any] = info

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, nbytes: int = 16384) -> str:
        """The last ``nbytes`` the process wrote to stderr."""
        try:
            self.stderr.seek(0, 2)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - nbytes))
            return self.stderr.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()
        self.stderr.close()

    def run(self, job: dict[str, Any], step_timeout_s: float) -> tuple[str, dict[str, Any]]:
        """Sends a job; returns ('result', reply), ('timeout', last step) or ('died', why)."""
        self.conn.send(job)
        last = "job sent"
        while True:
            if not self.conn.poll(step_timeout_s):
                return "timeout", {"last_step": last}
            try:
                kind, payload = self.conn.recv()
            except (EOFError, ConnectionError, OSError):
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                return "died", {"exitcode": self.proc.returncode, "last_step": last,
                                "stderr": crash_summary(self.stderr_tail())}
            if kind == "beat":
                last = payload
            else:
                return kind, payload


def _loop_key(spec: KernelSpec, shape_set: str) -> str:
    """A kernel's loop on one shape set, as a worker process that ran it is marked with (one
    such loop per process: repetitions of a loop run in fresh processes)."""
    return f"{spec.directory}:{shape_set}"


class GpuEvaluator(Evaluator):
    """Evaluates variants on one GPU in a respawnable sandbox process.

    Args:
        device: CUDA device index as this process sees it.
        step_timeout_s: longest silence from the worker before it is declared hung.
        start_timeout_s: time allowed for a worker to start (imports, CUDA init).
        arch: compile target; default: the GPU's own.
        gpu_turns: the GPU's lock file (:mod:`evaluators.gpu_turns`) that the worker takes part
            in: it shares the GPU with other processes' set-ups, and times with it alone. None
            for the pool's own evaluator, which the pool gives the GPU to alone.
        job_lock: a lock file the worker holds alone through every job: the pool's evaluator,
            beside which compilations of the end-of-run peers run during the search, their
            autotuning benchmarks holding the same lock alone (:mod:`search.compile_ahead`).
        nice: the worker's CPU niceness (a round set up beside the search yields to it).
    """

    def __init__(self, device: int = 0, step_timeout_s: float = 20.0, start_timeout_s: float = 180.0,
                 arch: str | None = None, gpu_turns: str | None = None, job_lock: str | None = None,
                 nice: int = 0) -> None:
        self.device = device
        self.gpu_turns, self.job_lock, self.nice = gpu_turns, job_lock, nice
        self.step_timeout_s = step_timeout_s
        self.start_timeout_s = start_timeout_s
        self._arch = arch
        self._worker: _Worker | None = None
        # Keyed by the reference (folder and digest) or the name the caller gave: never by a
        # kernel's name alone when it came as a reference.
        self._specs: dict[KernelRef | str, KernelSpec] = {}
        self._baselines: dict[tuple[str, str], Artifact] = {}
        self.restarts = 0
        self.busy_s = 0.0
        self._looped: dict[int, set[str]] = {}  # worker pid -> kernels whose peers' loop it ran
        # (kernel folder, dtype) -> {peer: {shape label: why}}: the shapes on which a peer's call
        # ended a sandbox process, left out of this evaluator's later jobs (see _peers_job)
        self._crashes: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
        self._crash_lock = threading.Lock()

    # -- process management -------------------------------------------------------------
    def _ensure_worker(self) -> _Worker:
        if self._worker is not None and not self._worker.alive():
            self._drop_worker()
        if self._worker is None:
            self._worker = _Worker(self.device, self.start_timeout_s, self.gpu_turns, self.job_lock, self.nice)
        return self._worker

    def info(self) -> dict[str, Any]:
        return dict(self._ensure_worker().info)

    @property
    def arch(self) -> str:
        arch = self._arch or self._ensure_worker().info["arch"]
        assert isinstance(arch, str)
        return arch

    @property
    def limits(self) -> DeviceLimits:
        """The launch limits the worker's device reported (starts the worker)."""
        limits = self._ensure_worker().info.get("limits")
        return limits if isinstance(limits, DeviceLimits) else DeviceLimits()

    def _known_limits(self) -> DeviceLimits:
        """The device's limits if a worker is already there, else the defaults: admission must
        not start a sandbox just to refuse a source (the device's own limits are applied
        again before anything is sent to it, see :meth:`_launches`)."""
        if self._worker is not None and isinstance(self._worker.info.get("limits"), DeviceLimits):
            limits: DeviceLimits = self._worker.info["limits"]
            return limits
        return DeviceLimits()

    def close(self) -> None:
        if self._worker is not None:
            try:
                self._worker.conn.send(None)
            except OSError:
                pass
            self._worker.kill()
            self._worker = None

    def _drop_worker(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None
            self.restarts += 1

    def _job(self, job: dict[str, Any], timeout_s: float | None = None) -> tuple[str, dict[str, Any]]:
        start = time.perf_counter()
        try:
            kind, payload = self._ensure_worker().run(job, timeout_s or self.step_timeout_s)
        except (BrokenPipeError, ConnectionError, EOFError):
            # The worker was already gone before this job reached it: nothing ran, so retry once.
            self._drop_worker()
            kind, payload = self._ensure_worker().run(job, timeout_s or self.step_timeout_s)
        self.busy_s += time.perf_counter() - start
        if kind in ("timeout", "died") or (kind == "result" and payload.get("fatal")):
            self._drop_worker()  # a hung or faulted context is never reused
        return kind, payload

    # -- admission ------------------------------------------------------------------------
    def spec(self, kernel: KernelRef | str) -> KernelSpec:
        if kernel not in self._specs:
            self._specs[kernel] = load_kernel(kernel)
        return self._specs[kernel]

    def _admit(self, spec: KernelSpec, source: str, dtype: str, params: dict[str, int],
               shapes: tuple[Shape, ...] | None = None) -> Artifact | Refusal:
        return admit(spec, source, dtype, params, arch=self.arch, limits=self._known_limits(), shapes=shapes)

    def _baseline(self, spec: KernelSpec, dtype: str) -> Artifact:
        """The baseline's artifact, admitted once per kernel and dtype."""
        key = (str(spec.directory), dtype)
        if key not in self._baselines:
            artifact = self._admit(spec, spec.baseline_source(), dtype, {})
            if isinstance(artifact, Refusal):
                raise EvaluatorError(f"the baseline of {spec.name} is refused: {artifact.message}")
            self._baselines[key] = artifact
        return self._baselines[key]

    def _launches(self, artifact: Artifact, shapes: tuple[Shape, ...]) -> Launches | Refusal:
        """The artifact's launch per shape within the device's own limits, or the refusal."""
        try:
            configs = artifact.launches(shapes, self.limits)
        except LaunchLimitError as exc:
            return Refusal(Status.RESOURCE_ERROR, str(exc), artifact.params, artifact.compile_s, artifact.compile_key)
        except LaunchSpecError as exc:
            return Refusal(Status.COMPILE_ERROR, str(exc), artifact.params, artifact.compile_s, artifact.compile_key)
        resolved = [configs[shape_label(s)] for s in shapes]  # one per shape, repeated shapes included
        return [(c.grid, c.block, c.smem_bytes) for c in resolved]

    def _candidate(self, spec: KernelSpec, request: EvalRequest, shapes: tuple[Shape, ...],
                   artifact: Artifact | None) -> Artifact | Refusal:
        """The request's artifact: the one given (which must be for this request) or admitted here."""
        if artifact is not None:
            wanted = (spec.name, request.dtype, request.variant.id)
            if (artifact.kernel, artifact.dtype, artifact.variant_id) != wanted:
                raise EvaluatorError(f"artifact {(artifact.kernel, artifact.dtype, artifact.variant_id)} was given "
                                     f"for request {wanted}")
            try:
                params = artifact.launch.validate_params(request.params)
            except LaunchSpecError as exc:
                raise EvaluatorError(f"artifact given for parameters it cannot take: {exc}") from None
            if params != artifact.params:
                raise EvaluatorError(f"artifact compiled with {artifact.params} given for {params}")
            if artifact.arch == self.arch:
                return artifact
        return self._admit(spec, request.variant.source, request.dtype, request.params, shapes)

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, request: EvalRequest, artifact: Artifact | None = None) -> Evaluation:
        start = time.perf_counter()
        spec = self.spec(request.kernel)
        shapes = request.shapes(spec)
        head = Evaluation(Status.COMPILE_ERROR, "", kernel=spec.name, dtype=request.dtype,
                          variant_id=request.variant.id, shape_set=request.shape_set, params=dict(request.params))
        cand = self._candidate(spec, request, shapes, artifact)
        if isinstance(cand, Refusal):
            return replace(head, status=cand.status, message=cand.message, params=cand.params or head.params,
                           compile_s=cand.compile_s, eval_s=time.perf_counter() - start)
        # Every later outcome is this record with status, message and measurements replaced
        # (dataclasses.replace keeps the keyword arguments type-checked).
        head = replace(head, params=cand.params, registers=cand.registers, compile_s=cand.compile_s)
        cand_launches = self._launches(cand, shapes)
        if isinstance(cand_launches, Refusal):
            return replace(head, status=cand_launches.status, message=cand_launches.message,
                           eval_s=time.perf_counter() - start)
        base = self._baseline(spec, request.dtype)
        base_launches = self._launches(base, shapes)
        if isinstance(base_launches, Refusal):
            raise EvaluatorError(f"the baseline of {spec.name} cannot run here: {base_launches.message}")
        job = {
            "type": "evaluate",
            "kernel_dir": str(spec.directory),
            "dtype": request.dtype,
            "shapes": [dict(s) for s in shapes],
            "candidate": {"cubin": cand.cubin, "launches": cand_launches},
            "baseline": {"cubin": base.cubin, "launches": base_launches},
            "same_as_baseline": cand.binary_key == base.binary_key,
            "seeds": list(request.seeds),
            "timing": {"warmup": request.timing.warmup, "repetitions": request.timing.repetitions,
                       "cutoff": request.timing.cutoff},
            "best_ms": dict(request.best_ms),
            "time": request.time,
            "noise_floor": request.noise_floor,
        }
        kind, reply = self._job(job)
        if kind == "timeout":
            return replace(head, status=Status.TIMEOUT, message=f"no progress for {self.step_timeout_s:.0f} s "
                           f"after '{reply['last_step']}': the kernel hangs or runs far too long; the sandbox "
                           "was restarted", eval_s=time.perf_counter() - start)
        if kind == "died":
            return replace(head, status=Status.CRASH, message=f"the sandbox process died (exit code "
                           f"{reply['exitcode']}) after '{reply['last_step']}'{_stderr_note(reply)}",
                           eval_s=time.perf_counter() - start)
        return self._to_evaluation(reply, head, time.perf_counter() - start)

    def _to_evaluation(self, reply: dict[str, Any], head: Evaluation, eval_s: float) -> Evaluation:
        if reply["status"] == "INTERNAL":
            raise EvaluatorError(f"evaluator bug: {reply['message']}\n{reply.get('traceback', '')}")
        attrs = reply.get("attributes", {})
        extra = dict(reply.get("extra", {}))
        extra.update({k: v for k, v in attrs.items() if k not in ("registers",)})
        return replace(
            head,
            status=Status(reply["status"]),
            message=reply.get("message", ""),
            shapes=tuple(ShapeResult.from_dict(s) for s in reply.get("shapes", [])),
            guard=reply.get("guard", ""),
            noise_floor=reply.get("noise_floor"),
            smem_bytes=attrs.get("smem_static_bytes"),
            local_bytes=attrs.get("local_bytes"),
            eval_s=eval_s,
            extra=extra,
            registers=attrs.get("registers", head.registers),
        )

    def time_peers_full(self, kernel: KernelRef | str, dtype: str, shape_set: str = "search",
                        ours: dict[str, tuple[str, dict[str, int]]] | None = None,
                        repetitions: int = 100, graph_ours: bool = False, fresh_process: bool = False,
                        compile_trials: int | None = None, peers: bool = True,
                        compile_cache: str | None = None,
                        exclude_peers: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
        """Like :meth:`time_peers`, with spreads, peer errors, the copy bandwidth and ``failed``:
        ``{our kernel: why}`` for each of ours refused at admission, failing a guard in the loop
        (see :mod:`evaluators.peers`) or crashing it; a failed kernel has no times.

        A kernel of ours that crashes or hangs the loop costs its own result only: the loop is
        run again without every kernel of ours that fails when timed alone.

        ``fresh_process`` runs the loop in a sandbox process that has not run this kernel's loop
        before (a new one if the current one has), so that repetitions of one kernel's loop
        share no CUDA context, allocations or compilations, while the loops of several kernels
        can share a process; ``compile_trials``: fresh compilations per torch.compile mode;
        ``peers`` False: our kernels alone (no peer is set up or compiled); ``compile_cache``:
        the folder this loop's compilations were made in ahead of it (loaded from there);
        ``exclude_peers``: peers left out from the start where named (see :meth:`_loop_job`).
        """
        spec = self.spec(kernel)
        # one loop per process for each kernel and shape set: a round of the end of a run
        # (search.finalize) runs its held-out loop right after its search loop, in that loop's
        # process (one process start and one set-up of the peers' libraries per round), while
        # the next round's search loop starts a fresh process
        key = _loop_key(spec, shape_set)
        if fresh_process and self._worker is not None and key in self._looped.get(self._worker.info["pid"], set()):
            self.close()
        job, kernels, failed = self._loop_job(spec, dtype, shape_set, ours, repetitions, graph_ours, compile_trials,
                                              peers, compile_cache, exclude_peers)
        reply = self._loop_alone(job, kernels, failed)
        if self._worker is not None:
            self._looped.setdefault(self._worker.info["pid"], set()).add(key)
        return reply

    def time_round(self, kernel: KernelRef | str, dtype: str, loops: Sequence[Mapping[str, Any]],
                   time_after: str | None = None, time_after_until: float | None = None) -> list[dict[str, Any]]:
        """A round of end-of-run loops in one sandbox process (a fresh one if this evaluator's
        worker has run a loop of this kernel): each of ``loops`` (the keyword arguments of
        :meth:`time_peers_full`: ``shape_set``, ``ours``, ``compile_trials``, ``peers``,
        ``compile_cache``, ``exclude_peers``) set up first, then all timed (:func:`evaluators.peers.run_round`);
        returns each loop's reply as :meth:`time_peers_full` does. Made with ``gpu_turns``,
        several evaluators' rounds run at once on one GPU: their set-ups overlap, their
        timing never does. A round that fails as a whole (a kernel of ours crashing it) is run
        again loop by loop, each with the crash handling of :meth:`time_peers_full`; a loop
        that still fails with none of our kernels in it answers ``{"loop_error": why}`` in its
        place, and the round fails only when every loop does. ``time_after``: a file whose
        existence lets the round time (set up beside the search, it times once the search is over,
        holding the benchmark lock of the pool's evaluator as well); ``time_after_until``: the
        wall-clock time (epoch seconds) past which the round gives up waiting for that file and
        fails, each of its loops answering ``loop_error`` (a TIMEOUT verdict)."""
        spec = self.spec(kernel)
        keys = {_loop_key(spec, str(loop.get("shape_set", "search"))) for loop in loops}
        if self._worker is not None and keys & self._looped.get(self._worker.info["pid"], set()):
            self.close()
        built = [self._loop_job(spec, dtype, str(loop.get("shape_set", "search")), loop.get("ours"),
                                int(loop.get("repetitions", 100)), bool(loop.get("graph_ours", False)),
                                loop.get("compile_trials"), bool(loop.get("peers", True)), loop.get("compile_cache"),
                                loop.get("exclude_peers"))
                 for loop in loops]
        if time_after:  # each loop's job carries it: a loop run again on its own waits as well
            for job, _, _ in built:
                job["time_after"] = time_after
                if time_after_until is not None:  # one deadline: a loop run again does not wait anew
                    job["time_after_until"] = time_after_until
        round_job = {"type": "peers_round", "loops": [{**job, "kernels": dict(kernels)} for job, kernels, _ in built]}
        reply, _why = self._peers_job(round_job)
        if reply is not None and len(reply.get("loops", [])) == len(built):
            replies = [{**r, "failed": {**failed, **r.get("failed", {})}} for r, (_, _, failed) in zip(reply["loops"], built, strict=True)]
        else:
            replies = []
            for job, kernels, failed in built:
                try:
                    replies.append(self._loop_alone(job, kernels, failed))
                except EvaluatorError as exc:  # this loop's alone: the round's other loops keep theirs
                    replies.append({"loop_error": str(exc)})
            if all("loop_error" in r for r in replies):
                raise EvaluatorError(replies[0]["loop_error"])
        if self._worker is not None:
            self._looped.setdefault(self._worker.info["pid"], set()).update(keys)
        return replies

    def _loop_job(self, spec: KernelSpec, dtype: str, shape_set: str, ours: dict[str, tuple[str, dict[str, int]]] | None,
                  repetitions: int, graph_ours: bool, compile_trials: int | None, peers: bool,
                  compile_cache: str | None, exclude_peers: Mapping[str, Mapping[str, str]] | None = None,
                  ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, str]]:
        """One loop's job for the worker (without ``kernels``), our binaries admitted for it, and
        ours refused at admission with why. ``exclude_peers``: peers to leave out from the start
        ({peer: {shape label: why}}: their calls ended a compile-ahead process there)."""
        shapes = spec.shapes(shape_set)
        failed: dict[str, str] = {}
        kernels: dict[str, dict[str, Any]] = {}
        for name, (source, params) in (ours or {}).items():
            artifact = self._admit(spec, source, dtype, params, shapes)
            launches = artifact if isinstance(artifact, Refusal) else self._launches(artifact, shapes)
            if isinstance(launches, Refusal):
                failed[name] = f"{launches.status.value}: {launches.message}"
            elif isinstance(artifact, Artifact):
                kernels[name] = {"cubin": artifact.cubin, "launches": launches}
        base = self._baseline(spec, dtype)
        base_launches = self._launches(base, shapes)
        if isinstance(base_launches, Refusal):
            raise EvaluatorError(f"the baseline of {spec.name} cannot run here: {base_launches.message}")
        job = {"type": "peers", "kernel_dir": str(spec.directory), "dtype": dtype,
               "baseline": {"cubin": base.cubin, "launches": base_launches},
               "shapes": [dict(s) for s in shapes], "warmup": 20, "repetitions": repetitions,
               "graph_ours": graph_ours, "peers": peers}
        if compile_trials is not None:
            job["compile_trials"] = compile_trials
        if compile_cache:
            job["compile_cache"] = compile_cache
        if exclude_peers:
            job["exclude_peers"] = {peer: dict(shapes) for peer, shapes in exclude_peers.items()}
        return job, kernels, failed

    def _loop_alone(self, job: dict[str, Any], kernels: dict[str, dict[str, Any]], failed: dict[str, str]) -> dict[str, Any]:
        """One loop's job run on its own: a kernel of ours that crashes or hangs it costs its
        own result only (see :meth:`time_peers_full`)."""
        kernels = dict(kernels)
        reply, why = self._peers_job({**job, "kernels": dict(kernels)})
        if reply is None:
            # Find the culprits by timing each kernel of ours alone (no peers: cheap), then the rest together.
            for name in list(kernels):
                alone, why = self._peers_job({**job, "kernels": {name: kernels[name]}, "peers": False})
                if alone is None:
                    failed[name] = why
                    del kernels[name]
            reply, why = self._peers_job({**job, "kernels": dict(kernels)})
        if reply is None:
            reply = self._peers_one_by_one(job, kernels, failed, why)
        reply["failed"] = {**failed, **reply.get("failed", {})}
        return reply

    def _peers_job(self, job: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """Runs a peers' job (one loop, or a round's loops): (reply, "") or, when it crashed,
        hung or failed as a whole, (None, why).

        A peer whose call ends the sandbox process (a library's segfault on a size it does not
        support) or hangs it, as the process's last step names
        (:func:`evaluators.peer_steps.peer_step`), costs its own figure on that shape only: the
        job runs again without that peer on that shape, and the evaluator remembers it for the
        later jobs of the same kernel folder and dtype, which leave it out there from the start.
        The shapes on which the peer ran keep it: FlashInfer's merge_state, which ends the
        process on head sizes it was not built for, is still timed on the others. After
        :data:`PEER_EXCLUSIONS` such re-runs, every peer that ended a process is left out on
        every shape for one last run, so a peer that crashes everywhere costs a bounded number
        of runs. Why each is left out is in the reply's ``errors``."""
        memory = _crash_key(job)
        with self._crash_lock:
            excluded = {name: dict(shapes) for name, shapes in self._crashes.get(memory, {}).items()}
        reruns, everywhere = 0, False
        while True:
            reply, why, ended_in = self._peers_job_once(_excluding(job, excluded))
            culprit = parse_peer_step(str(ended_in.get("last_step", ""))) if reply is None else None
            if culprit is None or everywhere:
                return reply, why
            name, label = culprit
            ended = (f"exit code {ended_in['exitcode']}" if "exitcode" in ended_in else "no progress")
            ended += _stderr_note(ended_in)
            note = f"its call ended the sandbox process ({ended}); not timed here"
            excluded.setdefault(name, {})[label] = note
            with self._crash_lock:
                self._crashes.setdefault(memory, {}).setdefault(name, {})[label] = note
            if reruns == PEER_EXCLUSIONS:
                # The re-runs are spent: every peer that ended a process is left out everywhere.
                excluded = {peer: {EVERY_SHAPE: f"its calls ended the sandbox process on {', '.join(shapes)} "
                                                f"({ended}); not timed on any shape (more than {PEER_EXCLUSIONS} "
                                                f"re-runs)"}
                            for peer, shapes in excluded.items()}
                everywhere = True
            reruns += 1

    def _peers_job_once(self, job: dict[str, Any]) -> tuple[dict[str, Any] | None, str, dict[str, Any]]:
        """:meth:`_peers_job` without the re-runs: (reply, why, and for a process that died or
        hung what :meth:`_Worker.run` said of it: ``last_step``, and ``exitcode`` and ``stderr``
        where it died)."""
        # Compiling a peer (torch.compile per shape) can take minutes between two beats.
        timeout_s = max(self.step_timeout_s, 300.0) if job.get("peers", True) else self.step_timeout_s
        kind, reply = self._job(job, timeout_s=timeout_s)
        if kind == "result" and reply.get("status") == "INTERNAL":
            raise EvaluatorError(f"evaluator bug in the peers' loop: {reply['message']}\n{reply.get('traceback', '')}")
        if kind == "result" and reply.get("status") == Status.OK.value:
            return reply, "", {}
        if kind == "timeout":
            return (None, f"{Status.TIMEOUT.value}: no progress in the peers' loop after '{reply['last_step']}'",
                    reply)
        if kind == "died":
            return (None, f"{Status.CRASH.value}: the sandbox died (exit code {reply['exitcode']}) after "
                          f"'{reply['last_step']}'{_stderr_note(reply)}", reply)
        return None, f"{reply.get('status')}: {reply.get('message', '')}", {}

    def _peers_one_by_one(self, job: dict[str, Any], kernels: dict[str, dict[str, Any]], failed: dict[str, str],
                          why: str) -> dict[str, Any]:
        """Last resort when the loop crashes although no kernel of ours crashes alone: each kernel
        of ours in a loop of its own with the peers (the peers' figures from the first such loop)."""
        merged: dict[str, Any] = {"peers": {}, "iqr": {}, "errors": {}, "failed": {}, "separate_loops": True}
        for name, part in kernels.items():
            reply, why_alone = self._peers_job({**job, "kernels": {name: part}})
            if reply is None:
                failed[name] = why_alone
                continue
            for key in ("peers", "iqr", "errors", "failed"):
                for impl, value in reply.get(key, {}).items():
                    merged[key].setdefault(impl, value)
            merged.setdefault("copy_bw_bytes_per_s", reply.get("copy_bw_bytes_per_s"))
        if not merged["peers"]:
            reply, why_peers = self._peers_job({**job, "kernels": {}})
            if reply is None:
                raise EvaluatorError(f"the peers' loop fails with none of our kernels in it: {why_peers} "
                                     f"(with them: {why})")
            merged.update({k: v for k, v in reply.items() if k != "failed"})
        return merged


def _crash_key(job: Mapping[str, Any]) -> tuple[str, str]:
    """The kernel folder and dtype of a peers' job (a round's: its first loop's; a round holds
    one kernel's loops)."""
    first = job["loops"][0] if job.get("loops") else job
    return str(first.get("kernel_dir", "")), str(first.get("dtype", ""))


def _excluding(job: dict[str, Any], excluded: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The job with ``excluded`` added to the ``exclude_peers`` of every loop it runs (a
    round's, or its own), beside what the loop left out from the start."""
    if not excluded:
        return job

    def merged(loop: dict[str, Any]) -> dict[str, Any]:
        mine = {peer: dict(shapes) for peer, shapes in loop.get("exclude_peers", {}).items()}
        for peer, shapes in excluded.items():
            mine.setdefault(peer, {}).update(shapes)
        return {**loop, "exclude_peers": mine}

    if "loops" in job:
        return {**job, "loops": [merged(loop) for loop in job["loops"]]}
    return merged(job)


def _stderr_note(died: Mapping[str, Any]) -> str:
    """What a dead sandbox's stderr said (``died["stderr"]``, see :meth:`_Worker.run`), as a
    suffix of the message."""
    text = str(died.get("stderr") or "").strip()
    return f"; its stderr: {text}" if text else ""
