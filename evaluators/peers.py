"""Timing production peers beside our kernels, inside the sandbox worker (GPU only).

Every peer (the spec's ``peers``: torch eager, FlashInfer, Liger; plus ``torch_compile`` of
the fp32 reference or of the spec's ``compiled`` program) is captured in a CUDA graph and timed by graph replay with the same
protocol as our kernels (:mod:`evaluators.timing`): inputs restored and L2 flushed before
every repetition, all implementations interleaved and working on the same tensors. So every
figure is kernel time, not the time of a Python call (REFERENCE.md section 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from evaluators import validate as V
from evaluators.launcher import Kernel
from evaluators.timing import Timed, capture_graph, time_interleaved
from kernels.launch import LaunchConfig
from kernels.spec import KernelSpec, Shape, shape_label

if TYPE_CHECKING:  # the worker imports this module lazily; no import cycle at run time
    from evaluators.worker import Context

InputSets = list[dict[str, torch.Tensor]]  # two input sets, alternated between repetitions


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


def _peer_fns(spec: KernelSpec) -> dict[str, Callable[..., None]]:
    fns: dict[str, Callable[..., None]] = dict(spec.peers)
    fns["torch_compile"] = _compiled_reference(spec)
    return fns


def _check_peer(
    spec: KernelSpec, name: str, fn: Callable[..., None], shape: Shape, dtype: str, ctx: Context
) -> str | None:
    """Runs a peer once on fresh inputs and checks it against the reference: a peer whose
    semantics differ from ours is not a fair comparison."""
    gen = torch.Generator(device=ctx.device).manual_seed(7)
    t = spec.make_inputs(shape, getattr(torch, dtype), gen, "random", ctx.device)
    expected = spec.reference({k: v.clone() for k, v in t.items()}, shape, spec.constants)
    fn(t, shape, spec.constants)
    torch.cuda.synchronize()
    tol: dict[str, tuple[float, float]] = {}
    for a in spec.written_args:
        rtol, atol = spec.tolerance(a.tensor_dtype(dtype))
        tol[a.name] = (rtol * 2, atol * 2)
    finding = V.check_outputs({a.name: t[a.name] for a in spec.written_args}, expected, tol, spec.compare)
    return finding.message if finding else None


class _Working:
    """The one set of working tensors every implementation of a shape reads and writes, and
    the step that restores what is read from input set i % 2 before repetition i (so an
    in-place kernel never sees its own output).

    Shared, not one copy per implementation: each copy would sit at other addresses, and
    where a short kernel's few pages fall (translation misses, memory channels) could then
    differ between implementations for no reason in their code.
    """

    def __init__(self, spec: KernelSpec, sets: InputSets) -> None:
        self.sets = sets
        self.buf = {n: v.clone() for n, v in sets[0].items()}
        self.readable = [a.name for a in spec.read_args]

    def prepare(self, i: int) -> None:
        for n in self.readable:
            self.buf[n].copy_(self.sets[i % 2][n])


def _timed_graph(name: str, fn: Callable[..., None], spec: KernelSpec, shape: Shape, work: _Working) -> Timed:
    graph = capture_graph(lambda: fn(work.buf, shape, spec.constants))
    return Timed(name, work.prepare, graph.replay)


def _timed_kernel(name: str, kernel: Kernel, shape: Shape, work: _Working, graph: bool = False) -> Timed:
    """One of our kernels, launched directly or (``graph``) captured in a CUDA graph and
    replayed, timed exactly as the peers are."""
    args = kernel.args(work.buf, shape)
    label = shape_label(shape)
    if graph:
        return Timed(name, work.prepare, capture_graph(lambda: kernel.launch(label, args, on_current_stream=True)).replay)
    return Timed(name, work.prepare, lambda: kernel.launch(label, args))


def run_peers(ctx: Context, job: dict[str, Any], beat: Callable[[str], None]) -> dict[str, Any]:
    """Times peers (and optionally our kernels) on each shape; returns medians in ms.

    Job keys: kernel_dir, dtype, shapes, warmup, repetitions, and optionally ``kernels``
    ({name: {cubin, launches}}) to time our own binaries in the same interleaved loop, and
    ``graph_ours`` to time each of them a second time, as ``<name>@graph``, through a CUDA
    graph like the peers (what the launch mechanism alone changes).
    """
    spec: KernelSpec = ctx.spec(job["kernel_dir"])
    dtype, shapes = job["dtype"], job["shapes"]
    ours = {
        name: Kernel(part["cubin"], spec, {shape_label(s): LaunchConfig(*c) for s, c in zip(shapes, part["launches"], strict=True)})
        for name, part in job.get("kernels", {}).items()
    }
    times: dict[str, dict[str, float]] = {}
    spreads: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for shape in shapes:
        label = shape_label(shape)
        sets = [spec.make_inputs(shape, getattr(torch, dtype), torch.Generator(device=ctx.device).manual_seed(20_000 + k),
                                 "random", ctx.device) for k in (0, 1)]
        work = _Working(spec, sets)
        impls = [_timed_kernel(n, k, shape, work) for n, k in ours.items()]
        if job.get("graph_ours"):
            impls += [_timed_kernel(f"{n}@graph", k, shape, work, graph=True) for n, k in ours.items()]
        fns = _peer_fns(spec)
        for name, fn in fns.items():
            if name in errors:
                continue
            try:
                wrong = _check_peer(spec, name, fn, shape, dtype, ctx)
                if wrong:
                    errors[name] = f"disagrees with the reference: {wrong}"
                    continue
                impls.append(_timed_graph(name, fn, spec, shape, work))
            except Exception as exc:  # a peer that cannot run here (missing package, unsupported dtype)
                errors[name] = f"{type(exc).__name__}: {exc}"[:500]
        # Our kernels launch on the stream they were loaded on and the events go to the current
        # one: if they differ, the events would time nothing (see timing.capture_graph).
        current = torch.cuda.current_stream().cuda_stream
        stray = [n for n, k in ours.items() if k.stream.ptr != current]
        if stray:
            raise RuntimeError(f"{', '.join(stray)} would launch on another stream than the timing events")
        samples = time_interleaved(impls, ctx.flush, job["warmup"], job["repetitions"])
        for name, s in samples.items():
            times.setdefault(name, {})[label] = s.median_ms
            spreads.setdefault(name, {})[label] = s.iqr_ms
        beat(f"peers {label}")
    return {"peers": times, "iqr": spreads, "errors": errors, "copy_bw_bytes_per_s": ctx.copy_bw}
