"""The sandbox worker: a child process that owns a CUDA context and runs untrusted kernels.

It receives jobs over a pipe from :class:`evaluators.gpu.GpuEvaluator`, sends a heartbeat
after every step (so the parent's watchdog can tell a hang from slow work) and answers with
a plain dict. A CUDA fault poisons the context, so after reporting one the worker exits and
the parent starts a fresh one.
"""

from __future__ import annotations

import os
import random
import traceback
from collections.abc import Callable
from typing import Any

import torch

from evaluators import validate as V
from evaluators.launcher import Kernel, LaunchResourceError
from evaluators.timing import Flusher, Timed, measure_copy_bandwidth, time_interleaved
from kernels.launch import LaunchConfig
from kernels.spec import KernelSpec, Shape, load_kernel, shape_label
from kernels.verdict import ShapeResult, Status, geomean

ROOFLINE_MARGIN = 1.3  # a kernel above 130% of copy bandwidth is measuring something else
Beat = Callable[[str], None]


class Verdict(Exception):
    """Ends a job early with a status (raised inside the job, caught at its top)."""

    def __init__(self, status: Status, message: str, guard: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.guard = status, message, guard


class Context:
    """Per-process state: device, copy bandwidth, flush buffer, loaded specs."""

    def __init__(self, device: int) -> None:
        torch.cuda.set_device(device)
        self.device = torch.device("cuda", device)
        self.copy_bw = measure_copy_bandwidth(self.device)
        self.flush = Flusher(self.device)
        self.specs: dict[str, KernelSpec] = {}
        props = torch.cuda.get_device_properties(self.device)
        self.info = {
            "gpu": props.name,
            "arch": f"sm_{props.major}{props.minor}",
            "copy_bw_bytes_per_s": self.copy_bw,
            "pid": os.getpid(),
        }

    def spec(self, kernel_dir: str) -> KernelSpec:
        if kernel_dir not in self.specs:
            self.specs[kernel_dir] = load_kernel(kernel_dir)
        return self.specs[kernel_dir]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _tolerances(spec: KernelSpec, dtype: str, scale: float = 1.0) -> dict[str, tuple[float, float]]:
    out = {}
    for a in spec.written_args:
        rtol, atol = spec.tolerance(a.tensor_dtype(dtype))
        out[a.name] = (rtol * scale, atol * scale)
    return out


def _launch(kernel: Kernel, label: str, tensors: dict[str, torch.Tensor], shape: Shape) -> None:
    kernel.launch(label, kernel.args(tensors, shape))


def _run_twice(
    spec: KernelSpec,
    kernel: Kernel,
    label: str,
    shape: Shape,
    inputs: dict[str, torch.Tensor],
    pristine: dict[str, torch.Tensor],
    in_names: list[str],
    ctx_msg: str,
) -> list[dict[str, torch.Tensor]]:
    """Two launches with different output poisons; returns the outputs of both."""
    outs = []
    for which in (0, 1):
        for a in spec.written_args:
            if a.role == "out":
                V.poison_(inputs[a.name], which)
            else:
                inputs[a.name].copy_(pristine[a.name])
        _launch(kernel, label, inputs, shape)
        torch.cuda.synchronize()
        finding = V.check_inputs_unchanged(inputs, pristine, in_names, ctx_msg)
        if finding:
            raise Verdict(Status.REJECTED, finding.message, finding.kind)
        outs.append({a.name: inputs[a.name].clone() for a in spec.written_args})
    return outs


def _validate_case(
    ctx: Context,
    spec: KernelSpec,
    job: dict[str, Any],
    shape: Shape,
    case: str,
    seed: int,
    cand: Kernel,
    base: Kernel,
) -> None:
    dtype = job["dtype"]
    label = shape_label(shape)
    where = f"(shape {label}, {dtype}, case {case}, seed {seed})"
    gen = torch.Generator(device=ctx.device).manual_seed(seed)
    inputs = spec.make_inputs(shape, _dtype(dtype), gen, case, ctx.device)
    pristine = {k: v.clone() for k, v in inputs.items()}
    expected = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
    in_names = [a.name for a in spec.args if a.kind == "tensor" and a.role == "in"]
    outs = _run_twice(spec, cand, label, shape, inputs, pristine, in_names, where)
    for a in spec.written_args:
        if a.role == "out":
            finding = V.unwritten(a.name, outs[0][a.name], outs[1][a.name], where)
            if finding:
                raise Verdict(Status.REJECTED, finding.message, finding.kind)
    finding = V.check_outputs(outs[0], expected, _tolerances(spec, dtype), spec.compare, where)
    if finding:
        raise Verdict(Status.INCORRECT, finding.message)
    if getattr(spec, "deterministic", True):
        for name in outs[0]:
            if not V.bitwise_equal(outs[0][name], outs[1][name]):
                raise Verdict(
                    Status.REJECTED,
                    f"{name}: two launches on the same inputs gave different bits {where} (race?)",
                    "nondeterminism",
                )
    if base is not cand:
        base_outs = _run_twice(spec, base, label, shape, inputs, pristine, in_names, where)
        finding = V.check_outputs(outs[0], base_outs[0], _tolerances(spec, dtype, 2.0), spec.compare, where + " vs baseline")
        if finding:
            raise Verdict(Status.INCORRECT, "differs from the baseline: " + finding.message)


def _perturb_(t: torch.Tensor, gen: torch.Generator, count: int = 8) -> None:
    """Overwrites a few random elements with values taken from elsewhere in the tensor: the
    content changes every repetition (so no cache keyed on pointers or sampled elements can
    replay a result) while the values stay in the tensor's own distribution."""
    flat = t.view(-1)
    if flat.numel() < 2:
        return
    dst = torch.randint(0, flat.numel(), (count,), device=t.device, generator=gen)
    src = torch.randint(0, flat.numel(), (count,), device=t.device, generator=gen)
    flat[dst] = flat[src]


def _time_shape(
    ctx: Context, spec: KernelSpec, job: dict[str, Any], shape: Shape, cand: Kernel, base: Kernel
) -> tuple[ShapeResult, float | None, bool]:
    """Interleaved timing on inputs that change every repetition; validates the last outputs."""
    dtype, label, timing = job["dtype"], shape_label(shape), job["timing"]
    sets = []
    for k in (0, 1):
        gen = torch.Generator(device=ctx.device).manual_seed(10_000 + k)
        sets.append(spec.make_inputs(shape, _dtype(dtype), gen, "random", ctx.device))
    readable = [a.name for a in spec.read_args]
    perturbed = [n for n in readable if sets[0][n].dtype.is_floating_point and sets[0][n].dtype.itemsize > 1]
    outs_only = [a.name for a in spec.args if a.kind == "tensor" and a.role == "out"]
    reps = timing["repetitions"] + random.randint(0, 7)  # the final launch index is not predictable
    final = timing["warmup"] + reps - 1
    snapshot: dict[str, dict[str, torch.Tensor]] = {}
    bufs: dict[str, dict[str, torch.Tensor]] = {}
    gen = torch.Generator(device=ctx.device).manual_seed(random.randint(0, 2**31))

    def make(name: str, kernel: Kernel) -> Timed:
        buf = bufs[name] = {n: t.clone() for n, t in sets[0].items()}
        args = kernel.args(buf, shape)

        def prepare(i: int) -> None:
            for n in readable:
                buf[n].copy_(sets[i % 2][n])
            for n in perturbed:
                _perturb_(buf[n], gen)
            for n in outs_only:
                V.poison_(buf[n], 0)
            if i == final:
                snapshot[name] = {n: t.clone() for n, t in buf.items()}

        return Timed(name, prepare, lambda: kernel.launch(label, args))

    impls = [make("baseline", base), make("candidate", cand)]
    cutoff = None
    best = job.get("best_ms", {}).get(label)
    if timing.get("cutoff") and best:
        cutoff = {"candidate": timing["cutoff"] * best}
    samples = time_interleaved(impls, ctx.flush, timing["warmup"], reps, cutoff)
    if not samples["candidate"].cut:
        expected = spec.reference(snapshot["candidate"], shape, spec.constants)
        written = {a.name: bufs["candidate"][a.name] for a in spec.written_args}
        finding = V.check_outputs(written, expected, _tolerances(spec, dtype), spec.compare, f"(shape {label}, after timing)")
        if finding:
            raise Verdict(
                Status.REJECTED,
                "result after the timing loop is wrong although validation passed (cached or replayed "
                "results, or different behaviour when launched repeatedly): " + finding.message,
                "replay",
            )
    nbytes = int(spec.bytes_moved(shape, dtype))
    c, b = samples["candidate"], samples["baseline"]
    roofline_ms = nbytes / ctx.copy_bw * 1e3
    if c.median_ms < roofline_ms / ROOFLINE_MARGIN:
        raise Verdict(
            Status.REJECTED,
            f"shape {label}: {c.median_ms * 1e3:.2f} us is faster than moving {nbytes} bytes at "
            f"{ROOFLINE_MARGIN:.0%} of the measured copy bandwidth ({roofline_ms * 1e3:.2f} us)",
            "roofline",
        )
    result = ShapeResult(
        shape=dict(shape),
        candidate_ms=c.median_ms,
        baseline_ms=b.median_ms,
        candidate_iqr_ms=c.iqr_ms,
        baseline_iqr_ms=b.iqr_ms,
        bytes_moved=nbytes,
        repetitions=len(c.times_ms),
        copy_bw_fraction=nbytes / (c.median_ms * 1e-3) / ctx.copy_bw,
        roofline_ms=roofline_ms,
    )
    aa = None
    if job.get("noise_floor"):
        ab = time_interleaved([make("A", base), make("B", base)], ctx.flush, timing["warmup"], reps)
        aa = ab["A"].median_ms / ab["B"].median_ms
    return result, aa, c.cut


def _kernel(ctx: Context, spec: KernelSpec, part: dict[str, Any], shapes: list[Shape]) -> Kernel:
    launches = {shape_label(s): LaunchConfig(*cfg) for s, cfg in zip(shapes, part["launches"], strict=True)}
    return Kernel(part["cubin"], spec, launches)


def run_evaluate(ctx: Context, job: dict[str, Any], beat: Beat) -> dict[str, Any]:
    """Validates then times one candidate against the baseline on every shape."""
    spec = ctx.spec(job["kernel_dir"])
    shapes = job["shapes"]
    cand = _kernel(ctx, spec, job["candidate"], shapes)
    base = cand if job.get("same_as_baseline") else _kernel(ctx, spec, job["baseline"], shapes)
    result: dict[str, Any] = {"attributes": cand.attributes(), "shapes": [], "extra": {}}
    cases = [("random", s) for s in job["seeds"]] + [(c, job["seeds"][0]) for c in spec.edge_cases]
    for shape in shapes:
        for case, seed in cases:
            _validate_case(ctx, spec, job, shape, case, seed, cand, base)
        beat(f"validated {shape_label(shape)}")
    if not job.get("time", True):
        return result
    ratios, cut = [], []
    for shape in shapes:
        shape_result, aa, was_cut = _time_shape(ctx, spec, job, shape, cand, base)
        result["shapes"].append(shape_result.to_dict())
        if aa is not None:
            ratios.append(aa)
        if was_cut:
            cut.append(shape_label(shape))
        beat(f"timed {shape_label(shape)}")
    if ratios:
        result["noise_floor"] = geomean(ratios)
    if cut:
        result["extra"]["cut_shapes"] = cut
    return result


def handle(ctx: Context, job: dict[str, Any], beat: Beat) -> tuple[dict[str, Any], bool]:
    """Runs one job; returns (reply, fatal). Fatal means the CUDA context is unusable."""
    try:
        if job["type"] == "evaluate":
            reply = run_evaluate(ctx, job, beat)
        elif job["type"] == "peers":
            from evaluators.peers import run_peers

            reply = run_peers(ctx, job, beat)
        else:
            raise ValueError(f"unknown job type {job['type']!r}")
        reply.setdefault("status", Status.OK.value)
        return reply, False
    except Verdict as v:
        return {"status": v.status.value, "message": v.message, "guard": v.guard}, False
    except LaunchResourceError as exc:
        return {"status": Status.RESOURCE_ERROR.value, "message": str(exc)}, False
    except Exception as exc:  # classified below: CUDA faults are verdicts, our bugs are not
        text = f"{type(exc).__name__}: {exc}"
        if _is_cuda_fault(exc):
            return {"status": Status.CRASH.value, "message": f"CUDA fault: {text}", "fatal": True}, True
        return {"status": "INTERNAL", "message": text, "traceback": traceback.format_exc()}, False


def _is_cuda_fault(exc: BaseException) -> bool:
    text = str(exc)
    markers = ("CUDA error", "CUDA_ERROR", "cudaError", "illegal memory access", "misaligned address",
               "unspecified launch failure", "device-side assert", "an illegal instruction",
               "launch timed out", "CUDARuntimeError", "CUDADriverError")
    return any(m in text for m in markers) or type(exc).__name__ in ("CUDADriverError", "CUDARuntimeError", "AcceleratorError")


def serve(conn: Any, device: int) -> None:
    """Main loop of the worker process."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    ctx = Context(device)
    conn.send(("ready", ctx.info))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        reply, fatal = handle(ctx, job, lambda msg: conn.send(("beat", msg)))
        conn.send(("result", reply))
        if fatal:
            conn.close()
            os._exit(3)  # the context is poisoned: the parent starts a new worker
