"""Timing production peers beside our kernels, inside the sandbox worker (GPU only).

Every peer (the spec's ``peers``: torch eager, FlashInfer, Liger; plus ``torch_compile`` of
the fp32 reference or of the spec's ``compiled`` program) is captured in a CUDA graph and timed
by graph replay with the same protocol as our kernels (:mod:`evaluators.timing`): inputs
restored and L2 flushed before every repetition, all implementations interleaved and working
on the same tensors. So every figure is kernel time, not the time of a Python call
(REFERENCE.md section 1).

Our kernels get exactly the evaluator's guards here (:mod:`evaluators.verify`): inputs that
change every launch, outputs filled (NaN, sentinel or stale values) before every launch, every timed launch's outputs
checked against our baseline run on the same inputs, and the roofline guard. A kernel that
fails one is reported in ``failed`` with the reason and none of its times are reported. The
peers (trusted library code) get the same restored inputs and filled outputs.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import torch

from evaluators import validate as V
from evaluators.context import Context, oracle_of, roofline_finding, tolerances, torch_dtype
from evaluators.launcher import Kernel, LaunchResourceError
from evaluators.timing import Timed, capture_graph, time_interleaved
from evaluators.verify import TIMED_OUTPUT_GUARD, Buffers, RepInputs, TimedOutputCheck
from kernels.launch import LaunchLimitError
from kernels.spec import KernelSpec, Shape, shape_label

GRAPH_SUFFIX = "@graph"


def _compiled_reference(spec: KernelSpec) -> Callable[..., None]:
    """torch.compile of the fp32 reference, writing rounded results into the outputs, or of
    the spec's own ``compiled`` program where it names one.

    Compiled afresh for every shape and dtype (static shapes, caches reset): the peer gets
    kernels specialised to the shape, as a serving engine's compiled graph would, instead of
    a dynamic-shape kernel or, past dynamo's recompile limit, silent eager fallback.
    """
    torch._dynamo.reset()

    def body(t: dict[str, torch.Tensor], shape: dict[str, int], constants: Any) -> None:
        expected = spec.reference(t, shape, constants)
        for name, value in expected.items():
            t[name].copy_(value)

    return torch.compile(spec.compiled or body, dynamic=False)


def peer_fns(spec: KernelSpec) -> dict[str, Callable[..., None]]:
    """Every peer of the spec by name, ``torch_compile`` included (compiled afresh)."""
    fns: dict[str, Callable[..., None]] = dict(spec.peers)
    fns["torch_compile"] = _compiled_reference(spec)
    return fns


def _check_peer(
    spec: KernelSpec, name: str, fn: Callable[..., None], shape: Shape, dtype: str, ctx: Context
) -> str | None:
    """Runs a peer once on fresh inputs and checks it against the reference: a peer whose
    semantics differ from ours is not a fair comparison."""
    gen = torch.Generator(device=ctx.device).manual_seed(7)
    t = spec.make_inputs(shape, torch_dtype(dtype), gen, "random", ctx.device)
    expected = spec.reference({k: v.clone() for k, v in t.items()}, shape, spec.constants)
    fn(t, shape, spec.constants)
    torch.cuda.synchronize()
    finding = V.check_outputs({a.name: t[a.name] for a in spec.written_args}, expected,
                              tolerances(spec, dtype, 2.0), spec.compare)
    return finding.message if finding else None


def _load_ours(ctx: Context, spec: KernelSpec, job: dict[str, Any], shapes: list[Shape],
               failed: dict[str, str]) -> dict[str, Kernel]:
    """Our binaries of the job; one the device refuses goes to ``failed``."""
    ours = {}
    for name, part in job.get("kernels", {}).items():
        try:
            ours[name] = ctx.kernel(spec, part, shapes)
        except (LaunchResourceError, LaunchLimitError) as exc:
            failed[name] = f"RESOURCE_ERROR: {exc}"
    return ours


class _Ours:
    """Our kernels on one shape: each launched on the shared working set, verified after
    every timed launch, owner of its implementations' names (``<name>`` and ``<name>@graph``)."""

    def __init__(self, ctx: Context, spec: KernelSpec, shape: Shape, dtype: str, job: dict[str, Any],
                 inputs: RepInputs, work: Buffers, baseline: Kernel | None) -> None:
        self.ctx, self.spec, self.shape, self.dtype, self.inputs, self.work = ctx, spec, shape, dtype, inputs, work
        self.warmup, self.repetitions = job["warmup"], job["repetitions"]
        self.oracle = oracle_of(baseline, shape) if baseline is not None else None
        self.checks: dict[str, TimedOutputCheck] = {}
        self.owner: dict[str, str] = {}

    def timed(self, name: str, kernel: Kernel, graph: bool) -> Timed:
        """One of our kernels, launched directly or (``graph``) captured in a CUDA graph and
        replayed, timed exactly as the peers are, every timed launch verified."""
        label = shape_label(self.shape)
        args = kernel.args(self.work, self.shape)
        launch: Callable[[], None] = lambda: kernel.launch(label, args)  # noqa: E731
        if graph:
            # One launch on restored inputs and poisoned outputs instead of the capture's own
            # warm-up, which would run on whatever the working set holds.
            self.inputs.restore(self.work, 0)
            kernel.launch(label, args)
            launch = capture_graph(lambda: kernel.launch(label, args, on_current_stream=True), warmup=0).replay
        impl = f"{name}{GRAPH_SUFFIX}" if graph else name
        assert self.oracle is not None, "our kernels are verified against the baseline: the job must carry it"
        check = TimedOutputCheck(self.inputs, self.oracle, tolerances(self.spec, self.dtype, 2.0), self.spec.compare,
                                 self.warmup, self.repetitions, f"(shape {label}, {self.dtype}, in the peers' loop)")
        self.checks[impl], self.owner[impl] = check, name
        return Timed(impl, lambda i: self.inputs.restore(self.work, i), launch, lambda i: check.check(i, self.work))

    def failures(self, samples: dict[str, Any]) -> dict[str, str]:
        """Per kernel of ours, the first guard that fired on this shape."""
        out: dict[str, str] = {}
        for impl, check in self.checks.items():
            finding = check.finding()
            kind = TIMED_OUTPUT_GUARD if finding else ""
            if finding is None:
                finding = roofline_finding(self.spec, self.shape, self.dtype, samples[impl].median_ms, self.ctx.copy_bw)
                kind = "roofline"
            if finding is not None:
                out.setdefault(self.owner[impl], f"REJECTED ({kind}): {finding.message}")
        return out


def _peer_impls(ctx: Context, spec: KernelSpec, shape: Shape, dtype: str, inputs: RepInputs,
                work: Buffers, errors: dict[str, str]) -> list[Timed]:
    """The peers that agree with the reference on this shape, each captured in a graph."""
    impls = []
    for name, fn in peer_fns(spec).items():
        if name in errors:
            continue
        try:
            wrong = _check_peer(spec, name, fn, shape, dtype, ctx)
            if wrong:
                errors[name] = f"disagrees with the reference: {wrong}"
                continue
            graph = capture_graph(functools.partial(fn, work, shape, spec.constants))
            impls.append(Timed(name, lambda i: inputs.restore(work, i), graph.replay))
        except Exception as exc:  # a peer that cannot run here (missing package, unsupported dtype)
            errors[name] = f"{type(exc).__name__}: {exc}"[:500]
    return impls


def _input_sets(ctx: Context, spec: KernelSpec, shape: Shape, dtype: str) -> list[Buffers]:
    return [spec.make_inputs(shape, torch_dtype(dtype), torch.Generator(device=ctx.device).manual_seed(20_000 + k),
                             "random", ctx.device) for k in (0, 1)]


def run_peers(ctx: Context, job: dict[str, Any], beat: Callable[[str], None]) -> dict[str, Any]:
    """Times peers and our kernels on each shape; returns medians in ms.

    Job keys: kernel_dir, dtype, shapes, warmup, repetitions; ``kernels`` ({name: {cubin,
    launches}}) our binaries, timed in the same interleaved loop and verified against
    ``baseline`` ({cubin, launches}, our baseline's binary); ``graph_ours`` to time each of
    them a second time, as ``<name>@graph``, through a CUDA graph like the peers (what the
    launch mechanism alone changes); ``peers`` False to time our kernels alone.

    Returns:
        ``peers`` ({implementation: {shape label: median ms}}), ``iqr`` (the same for the
        spreads), ``errors`` ({peer: why it was not timed}), ``failed`` ({our kernel: the
        guard that fired}; none of its times are reported) and ``copy_bw_bytes_per_s``.
    """
    spec: KernelSpec = ctx.spec(job["kernel_dir"])
    dtype, shapes = job["dtype"], job["shapes"]
    failed: dict[str, str] = {}
    ours = _load_ours(ctx, spec, job, shapes, failed)
    baseline = ctx.kernel(spec, job["baseline"], shapes) if job.get("kernels") else None
    times: dict[str, dict[str, float]] = {}
    spreads: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for shape in shapes:
        label = shape_label(shape)
        inputs = RepInputs(spec, _input_sets(ctx, spec, shape, dtype), job["warmup"] + job["repetitions"],
                           torch.Generator(device=ctx.device).manual_seed(random.randint(0, 2**31)))
        # One working set for every implementation: copies would sit at other addresses, and
        # where a short kernel's few pages fall could then differ between implementations.
        work = inputs.buffer()
        mine = _Ours(ctx, spec, shape, dtype, job, inputs, work, baseline)
        live = {n: k for n, k in ours.items() if n not in failed}
        impls = [mine.timed(n, k, graph=False) for n, k in live.items()]
        if job.get("graph_ours"):
            impls += [mine.timed(n, k, graph=True) for n, k in live.items()]
        if job.get("peers", True):
            impls += _peer_impls(ctx, spec, shape, dtype, inputs, work, errors)
        # Our kernels launch on the stream they were loaded on and the events go to the current
        # one: if they differ, the events would time nothing (see timing.capture_graph).
        current = torch.cuda.current_stream().cuda_stream
        stray = [n for n, k in live.items() if k.stream.ptr != current]
        if stray:
            raise RuntimeError(f"{', '.join(stray)} would launch on another stream than the timing events")
        samples = time_interleaved(impls, ctx.flush, job["warmup"], job["repetitions"])
        for name, why in mine.failures(samples).items():
            failed.setdefault(name, why)
        for name, s in samples.items():
            times.setdefault(name, {})[label] = s.median_ms
            spreads.setdefault(name, {})[label] = s.iqr_ms
        beat(f"peers {label}")
    for name in failed:  # a failed kernel's times are never reported, not even those of shapes it passed
        for impl in (name, f"{name}{GRAPH_SUFFIX}"):
            times.pop(impl, None)
            spreads.pop(impl, None)
    return {"peers": times, "iqr": spreads, "errors": errors, "failed": failed, "copy_bw_bytes_per_s": ctx.copy_bw}
