"""The GPU evaluator: compiles on the CPU, runs candidates in a sandbox process, keeps going.

:class:`GpuEvaluator` is a plain object (the Ray GPU actor wraps it). It owns one long-lived
worker process (:mod:`evaluators.worker`) that holds the CUDA context. A watchdog waits for
the worker's heartbeat; silence longer than ``step_timeout_s`` means a hang: the worker is
killed and the verdict is TIMEOUT. A worker that dies or reports a CUDA fault gives CRASH.
Either way the next request starts a fresh worker, so one bad kernel costs one verdict.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import replace
from typing import Any

from evaluators.admit import Artifact
from evaluators.api import EvalRequest, Evaluator
from evaluators.compile import CompileResult, compile_variant
from kernels.launch import LaunchSpecError
from kernels.spec import KernelSpec, KernelSpecError, check_signature, load_kernel
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status


class EvaluatorError(RuntimeError):
    """A failure of the evaluator itself (a bug or a broken installation), not of a kernel."""


class _Worker:
    """Handle on one sandbox process."""

    def __init__(self, device: int, start_timeout_s: float) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        from evaluators.worker import serve

        self.proc = ctx.Process(target=serve, args=(child, device), name=f"kernel-sandbox-{device}")
        self.proc.start()
        child.close()
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise EvaluatorError(f"sandbox worker did not start within {start_timeout_s:.0f} s")
        kind, info = self.conn.recv()
        if kind != "ready":
            raise EvaluatorError(f"sandbox worker sent {kind!r} instead of ready")
        self.info: dict[str, Any] = info

    def alive(self) -> bool:
        return self.proc.is_alive()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()

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
                self.proc.join(timeout=5)
                return "died", {"exitcode": self.proc.exitcode, "last_step": last}
            if kind == "beat":
                last = payload
            else:
                return kind, payload


class GpuEvaluator(Evaluator):
    """Evaluates variants on one GPU in a respawnable sandbox process.

    Args:
        device: CUDA device index as this process sees it.
        step_timeout_s: longest silence from the worker before it is declared hung.
        start_timeout_s: time allowed for a worker to start (imports, CUDA init).
        arch: compile target; default: the GPU's own.
    """

    def __init__(self, device: int = 0, step_timeout_s: float = 20.0, start_timeout_s: float = 180.0,
                 arch: str | None = None) -> None:
        self.device = device
        self.step_timeout_s = step_timeout_s
        self.start_timeout_s = start_timeout_s
        self._arch = arch
        self._worker: _Worker | None = None
        self._specs: dict[str, KernelSpec] = {}
        self.restarts = 0
        self.busy_s = 0.0

    # -- process management -------------------------------------------------------------
    def _ensure_worker(self) -> _Worker:
        if self._worker is not None and not self._worker.alive():
            self._drop_worker()
        if self._worker is None:
            self._worker = _Worker(self.device, self.start_timeout_s)
        return self._worker

    def info(self) -> dict[str, Any]:
        return dict(self._ensure_worker().info)

    @property
    def arch(self) -> str:
        return self._arch or self._ensure_worker().info["arch"]

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

    # -- evaluation -----------------------------------------------------------------------
    def spec(self, kernel: str) -> KernelSpec:
        if kernel not in self._specs:
            self._specs[kernel] = load_kernel(kernel)
        return self._specs[kernel]

    def _compile(self, spec: KernelSpec, source: str, params: dict[str, int], dtype: str,
                 shapes: tuple[dict[str, int], ...]) -> tuple[CompileResult | None, list, dict[str, int], str]:
        """Compiles and resolves launches; returns (result, launches, params, error message)."""
        try:
            launch = Variant(spec.name, source).launch()
            spec.check_launch(launch)
            params = launch.validate_params(params)
            check_signature(spec, source)
            configs = [launch.resolve(s, params) for s in shapes]
        except (LaunchSpecError, KernelSpecError) as exc:
            return None, [], params, str(exc)
        result = compile_variant(source, spec.name, dtype, params, self.arch)
        if not result.ok:
            return result, [], params, result.log
        return result, [(c.grid, c.block, c.smem_bytes) for c in configs], params, ""

    def evaluate(self, request: EvalRequest, artifact: Artifact | None = None) -> Evaluation:
        start = time.perf_counter()
        spec = self.spec(request.kernel)
        shapes = request.shapes(spec)
        cand, cand_launch, params, error = self._compile(spec, request.variant.source, request.params,
                                                         request.dtype, shapes)
        # The compile-error verdict; every later outcome is this record with status, message and
        # measurements replaced (dataclasses.replace keeps the keyword arguments type-checked).
        head = Evaluation(Status.COMPILE_ERROR, error, kernel=spec.name, dtype=request.dtype,
                          variant_id=request.variant.id, shape_set=request.shape_set, params=params)
        if error:
            return head
        assert cand is not None
        base, base_launch, _, base_error = self._compile(spec, spec.baseline_source(), {}, request.dtype, shapes)
        if base_error or base is None:
            raise EvaluatorError(f"the baseline of {spec.name} does not compile: {base_error}")
        job = {
            "type": "evaluate",
            "kernel_dir": str(spec.directory),
            "dtype": request.dtype,
            "shapes": [dict(s) for s in shapes],
            "candidate": {"cubin": cand.cubin, "launches": cand_launch},
            "baseline": {"cubin": base.cubin, "launches": base_launch},
            "same_as_baseline": cand.key == base.key,
            "seeds": list(request.seeds),
            "timing": {"warmup": request.timing.warmup, "repetitions": request.timing.repetitions,
                       "cutoff": request.timing.cutoff},
            "best_ms": dict(request.best_ms),
            "time": request.time,
            "noise_floor": request.noise_floor,
        }
        kind, reply = self._job(job)
        head = replace(head, registers=cand.registers, compile_s=cand.seconds)
        if kind == "timeout":
            return replace(head, status=Status.TIMEOUT, message=f"no progress for {self.step_timeout_s:.0f} s "
                           f"after '{reply['last_step']}': the kernel hangs or runs far too long; the sandbox "
                           "was restarted", eval_s=time.perf_counter() - start)
        if kind == "died":
            return replace(head, status=Status.CRASH, message=f"the sandbox process died (exit code "
                           f"{reply['exitcode']}) after '{reply['last_step']}'", eval_s=time.perf_counter() - start)
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

    def time_peers_full(self, kernel: str, dtype: str, shape_set: str = "search",
                        ours: dict[str, tuple[str, dict[str, int]]] | None = None,
                        repetitions: int = 100, graph_ours: bool = False) -> dict[str, Any]:
        """Like :meth:`time_peers`, with spreads, peer errors and the copy bandwidth."""
        spec = self.spec(kernel)
        shapes = spec.shapes(shape_set)
        kernels = {}
        for name, (source, params) in (ours or {}).items():
            result, launches, _, error = self._compile(spec, source, params, dtype, shapes)
            if error or result is None:
                raise EvaluatorError(f"{name} does not compile: {error}")
            kernels[name] = {"cubin": result.cubin, "launches": launches}
        job = {"type": "peers", "kernel_dir": str(spec.directory), "dtype": dtype, "kernels": kernels,
               "shapes": [dict(s) for s in shapes], "warmup": 20, "repetitions": repetitions,
               "graph_ours": graph_ours}
        kind, reply = self._job(job, timeout_s=max(self.step_timeout_s, 300.0))
        if kind != "result" or reply.get("status") != "OK":
            raise EvaluatorError(f"timing peers of {kernel} failed: {kind} {reply}")
        return reply

