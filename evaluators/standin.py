"""A CPU stand-in evaluator: its verdicts are real, its times are not.

It exists so that the search loop (agents, Ray pool, selection, tuning, records, resume)
can run end to end on a machine without a GPU. What is real: the launch header and
signature checks and the NVRTC compilation (admission, :func:`evaluators.admit.admit`, the
same door the GPU evaluator uses), so compile and resource errors are genuine; and
correctness: every admitted variant, at its parameters, runs on the CPU emulator at the two
smallest shapes of the request's shape set on every input case, against the reference
(:func:`kernels.cpu_check.check_on_cpu`), so OK means the code computed the right thing
there. A variant the emulator cannot run (inline PTX, clusters) is REJECTED with guard
``cpu_unverified``: not known correct, never OK. What is not real: the "timings" are a
deterministic synthetic cost model of the source (vector loads, fast intrinsics,
``__restrict__``, block size and grid coverage make a variant "faster"), never a measurement.
Every evaluation it returns carries ``extra["evaluator"] == "standin"``, and runs that use it
say so in their summary.

Marker comments force outcomes, for testing the loop's failure paths::

    // standin: crash | incorrect | timeout | rejected | incorrect-heldout | kill-process | hang
"""

from __future__ import annotations

import os
import re
import time
import zlib
from pathlib import Path

from evaluators.admit import Artifact, admit
from evaluators.api import EvalRequest, Evaluator
from kernels.cpu_check import check_on_cpu, cpu_shapes
from kernels.folders import KernelRef
from kernels.launch import DeviceLimits, LaunchConfig, LaunchSpecError
from kernels.spec import KernelSpec, load_kernel
from kernels.verdict import Evaluation, ShapeResult, Status

DEVICE_NAME = "cpu-standin"
_COPY_BW = 4.3e12  # bytes/s; the H200's practical copy ceiling, so fractions look plausible
_SMS = 132
_LAUNCH_MS = 0.003
HANG_S = 3600.0  # how long the ``hang`` marker blocks an evaluation
_MARKER_RE = re.compile(r"^\s*//\s*standin\s*:\s*([a-z-]+)", re.MULTILINE)
_FEATURES = (  # (pattern, efficiency gained): the levers the reference facts name
    (re.compile(r"float4|uint4|int4|half2|__half2|__nv_bfloat162|reinterpret_cast"), 0.30),
    (re.compile(r"__expf|__frcp_rn|__fdividef|__fmul_rn|rsqrtf|__shfl"), 0.08),
    (re.compile(r"__restrict__"), 0.04),
    (re.compile(r"--use_fast_math"), 0.04),
)
_STATUS_OF_MARKER = {
    "crash": (Status.CRASH, "stand-in: forced CRASH by marker"),
    "incorrect": (Status.INCORRECT, "stand-in: forced INCORRECT by marker"),
    "timeout": (Status.TIMEOUT, "stand-in: forced TIMEOUT by marker"),
    "rejected": (Status.REJECTED, "stand-in: forced REJECTED by marker"),
}


def _efficiency(source: str, launch: LaunchConfig, threads_needed: int) -> float:
    eff = 0.45 + sum(gain for pattern, gain in _FEATURES if pattern.search(source))
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if threads < 64:
        eff *= 0.6
    elif threads > 512:
        eff *= 0.95
    blocks = launch.grid[0] * launch.grid[1] * launch.grid[2]
    # Too few resident threads cannot keep HBM busy: scale by coverage of the machine.
    coverage = min(1.0, blocks * threads / max(1, min(threads_needed, _SMS * 1024)))
    return min(0.97, eff) * max(0.05, coverage)


def synthetic_ms(source: str, launch: LaunchConfig, bytes_moved: int, salt: str) -> float:
    """The stand-in's deterministic "time" of one launch (milliseconds)."""
    eff = _efficiency(source, launch, max(1, bytes_moved // 16))
    jitter = 1.0 + ((zlib.crc32(salt.encode()) % 2001) - 1000) / 50_000.0  # +-2%
    return (_LAUNCH_MS + bytes_moved / (_COPY_BW * eff) * 1e3) * jitter


class StandinEvaluator(Evaluator):
    """CPU test double of the GPU evaluator (see the module docstring: not a measurement).

    Args:
        cache_dir: the compile cache (None: the default cache).
        latency_s: seconds each evaluation sleeps, to give tests a slow evaluator.
        verify_on_cpu: run every admitted variant on the CPU emulator against the reference
            (False: OK means only "admitted"; for tests of the loop's plumbing alone).
    """

    kind = "standin"
    device_name = DEVICE_NAME

    def __init__(self, cache_dir: Path | None = None, latency_s: float = 0.0, verify_on_cpu: bool = True) -> None:
        self.cache_dir = cache_dir
        self.latency_s = latency_s
        self.verify_on_cpu = verify_on_cpu
        # Keyed by the reference (folder and digest) or the name the caller gave: never by a
        # kernel's name alone when it came as a reference.
        self._specs: dict[KernelRef | str, KernelSpec] = {}
        self.limits = DeviceLimits()

    def _spec(self, kernel: KernelRef | str) -> KernelSpec:
        if kernel not in self._specs:
            self._specs[kernel] = load_kernel(kernel)
        return self._specs[kernel]

    def _fail(self, request: EvalRequest, status: Status, message: str, **kw: object) -> Evaluation:
        return Evaluation(
            status=status, message=message, kernel=request.variant.kernel, dtype=request.dtype,
            variant_id=request.variant.id, params=dict(request.params), shape_set=request.shape_set,
            extra={"evaluator": self.kind}, **kw,  # type: ignore[arg-type]
        )

    def _admitted(self, spec: KernelSpec, request: EvalRequest, artifact: Artifact | None) -> Artifact | Evaluation:
        """The artifact to run: the one given when it is this request's, else admission's."""
        if artifact is not None and (artifact.kernel, artifact.variant_id, artifact.dtype) == (
                spec.name, request.variant.id, request.dtype):
            try:
                full = request.variant.launch().validate_params(request.params)
                if full == artifact.params:
                    artifact.launches(request.shapes(spec), self.limits)
                    return artifact
            except LaunchSpecError:
                pass  # not this request's artifact after all: admit the source
        outcome = admit(spec, request.variant.source, request.dtype, request.params,
                        limits=self.limits, shapes=request.shapes(spec), cache_dir=self.cache_dir)
        if isinstance(outcome, Artifact):
            return outcome
        return self._fail(request, outcome.status, outcome.message, compile_s=outcome.compile_s)

    def evaluate(self, request: EvalRequest, artifact: Artifact | None = None) -> Evaluation:
        start = time.perf_counter()
        spec = self._spec(request.kernel)
        source = request.variant.source
        admitted = self._admitted(spec, request, artifact)
        if isinstance(admitted, Evaluation):
            return admitted
        params = admitted.params
        if self.latency_s:
            time.sleep(self.latency_s)
        for marker in _MARKER_RE.findall(source):
            if marker == "kill-process":
                # Stands in for a fault that takes the evaluator's own process down (as a
                # driver failure could): the run must replace the actor and go on.
                os._exit(17)
            if marker == "hang":
                # Stands in for an evaluator that stops answering (a stuck driver call): only
                # its caller's deadline ends it.
                time.sleep(HANG_S)
            if marker == "incorrect-heldout" and request.shape_set == "heldout":
                return self._fail(request, Status.INCORRECT, "stand-in: forced INCORRECT on held-out shapes")
            if marker in _STATUS_OF_MARKER:
                return self._fail(request, *_STATUS_OF_MARKER[marker])
        checked = "outputs not checked (verify_on_cpu off)"
        if self.verify_on_cpu:
            cpu = check_on_cpu(spec, source, request.dtype, params, cpu_shapes(spec, request.shapes(spec)),
                               cache_dir=self.cache_dir)
            if not cpu.verified:
                return self._fail(request, cpu.status, f"stand-in: {cpu.message}", guard=cpu.guard,
                                  registers=admitted.registers, compile_s=admitted.compile_s)
            checked = cpu.message
        results = []
        if request.time:
            try:
                results = self._time(spec, request, params)
            except LaunchSpecError as exc:
                return self._fail(request, Status.RESOURCE_ERROR, str(exc))
        return Evaluation(
            status=Status.OK, message=f"stand-in: {checked}; times are synthetic (a cost model of the source), "
                                      "not a measurement",
            kernel=spec.name, dtype=request.dtype, variant_id=request.variant.id,
            params=params, shapes=tuple(results), shape_set=request.shape_set,
            registers=admitted.registers, compile_s=admitted.compile_s,
            eval_s=time.perf_counter() - start, extra={"evaluator": self.kind},
        )

    def _time(self, spec: KernelSpec, request: EvalRequest, params: dict[str, int]) -> list[ShapeResult]:
        base_src = spec.baseline_source()
        base_launch = request.variant.__class__(spec.name, base_src).launch()
        out = []
        for shape in request.shapes(spec):
            cand = request.variant.launch().resolve(shape, params)
            base = base_launch.resolve(shape, base_launch.default_params())
            nbytes = spec.bytes_moved(shape, request.dtype)
            label = f"{sorted(shape.items())}{request.dtype}"
            c_ms = synthetic_ms(request.variant.source, cand, nbytes, f"{request.variant.id}{params}{label}")
            b_ms = synthetic_ms(base_src, base, nbytes, f"baseline{label}")
            out.append(
                ShapeResult(
                    shape=dict(shape), candidate_ms=c_ms, baseline_ms=b_ms, bytes_moved=nbytes,
                    repetitions=request.timing.repetitions,
                    copy_bw_fraction=nbytes / (c_ms * 1e-3) / _COPY_BW,
                )
            )
        return out
