"""The one place where kernel time is measured.

Protocol (REFERENCE.md section 4): per shape, warm-up launches, then repetitions in which
every timed launch is preceded by restoring its inputs and flushing the L2 cache; one CUDA
event pair around the single launch; implementations interleaved in one process (A B, B A,
...) so that clock and thermal drift cancel; median and inter-quartile range reported.

The flush (a memset several times the L2 size) is queued right before the start event, so
the GPU is still busy with it while the host queues the launch: host-side launch overhead
stays out of the measured window, for our launches and for graph-replayed peers alike.

The flush only evicts what the L2 may evict: lines in a persisting carve-out (a nonzero
``cudaLimitPersistingL2CacheSize`` with an access-policy window on the stream) survive it,
and so do lines loaded with an ``evict_last`` hint unless their priority is reset first
(:class:`Flusher` does, over the loop's working set).
:func:`l2_persistence` reads both, and every timing job records them (:func:`l2_finding`
says when a time cannot be trusted).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

FLUSH_BYTES = 256 * 1024 * 1024  # > 4x the H200's 60 MB L2


@dataclass(frozen=True)
class Samples:
    """Per-launch kernel times in milliseconds for one implementation on one shape."""

    times_ms: tuple[float, ...]
    cut: bool = False  # timing stopped early (clearly slower than the best so far)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def iqr_ms(self) -> float:
        if len(self.times_ms) < 4:
            return 0.0
        q = statistics.quantiles(self.times_ms, n=4)
        return q[2] - q[0]


LINE_BYTES = 128  # the L2 line applypriority works on

# Gives every L2 line of [p, p + lines * 128) normal eviction priority (PTX applypriority,
# sm_80+); a line that is not in the L2 is left alone. Data stays as it is: nothing is
# discarded or written.
_DEMOTE_SOURCE = r"""
extern "C" __global__ void l2_demote(const char* p, unsigned long long lines) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < lines;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        asm volatile("applypriority.global.L2::evict_normal [%0], 128;" :: "l"(p + i * 128) : "memory");
    }
}
"""


def line_ranges(tensors: Iterable[torch.Tensor]) -> list[tuple[int, int]]:
    """``(first line's address, number of 128-byte lines)`` covering each tensor's storage
    span (empty tensors left out); no GPU needed."""
    out = []
    for t in tensors:
        if t.numel() == 0:
            continue
        start = t.data_ptr()
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
        end = start + (last + 1) * t.element_size()
        first = start - start % LINE_BYTES
        out.append((first, -(-(end - first) // LINE_BYTES)))
    return out


class Flusher:
    """Evicts the L2 cache by writing a buffer several times its size.

    A write of several L2 sizes evicts only lines of normal priority first: a line some
    earlier kernel loaded with an ``evict_last`` hint (Triton emits them for data a reduction
    reads twice; any candidate can too) outlives the flush and turns the next implementation's
    DRAM reads of it into L2 hits. On an H200 that made the baselines of fused_add_rmsnorm and
    merge_attn_states_lse up to 1.4x faster in a loop beside torch.compile's programs
    (``experiments/results/timing-neighbours-h200.md``). So the working set of a loop is
    registered with :meth:`cover`, and every flush first gives each of its lines normal
    priority, then writes the buffer.
    """

    def __init__(self, device: torch.device, nbytes: int = FLUSH_BYTES) -> None:
        self.buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.ranges: list[tuple[int, int]] = []
        self.demote = True  # False: the former flush, for the probe that measures what it changes
        self._function: object | None = None
        self._streams: dict[int, object] = {}

    def cover(self, tensors: Iterable[torch.Tensor]) -> None:
        """The tensors every timed implementation reads or writes from now on (the working set
        of the loop about to run); replaces those of the previous loop."""
        self.ranges = line_ranges(tensors)

    def __call__(self) -> None:
        if self.demote and self.ranges:
            self._demote()
        self.buf.zero_()

    def _demote(self) -> None:
        import cupy
        import numpy as np

        if self._function is None:
            self._function = cupy.RawKernel(_DEMOTE_SOURCE, "l2_demote").kernel
        ptr = torch.cuda.current_stream().cuda_stream
        stream = self._streams.get(ptr)
        if stream is None:
            stream = self._streams[ptr] = cupy.cuda.ExternalStream(ptr)
        for first, lines in self.ranges:
            grid = min(-(-lines // 256), 4096)
            self._function((grid,), (256,), (np.uint64(first), np.uint64(lines)), stream=stream)  # type: ignore[operator]


@dataclass
class Timed:
    """One implementation to time: ``prepare(i)`` restores inputs for launch i (not timed),
    ``launch()`` is the timed work, and ``check(i)``, if given, verifies what timed launch i
    wrote; it runs after the launch's end event is recorded and before anything else is
    queued, so its work stays outside every measured window."""

    name: str
    prepare: Callable[[int], None]
    launch: Callable[[], None]
    check: Callable[[int], None] | None = None


def time_interleaved(
    impls: Sequence[Timed],
    flush: Callable[[], None],
    warmup: int,
    repetitions: int,
    cutoff_ms: dict[str, float] | None = None,
    check_every: int = 10,
    after_rep: Callable[[int, list[str]], None] | None = None,
) -> dict[str, Samples]:
    """Times implementations interleaved, alternating their order every repetition.

    Args:
        impls: the implementations (baseline and candidate, or A and A for the noise floor).
        flush: L2 flush queued before each timed launch.
        warmup: untimed launches of each implementation first (launch indices 0 .. warmup-1).
        repetitions: timed launches of each implementation (launch indices from warmup on);
            every one of them is passed to the implementation's ``check``.
        cutoff_ms: per implementation name, stop timing once its running median exceeds this
            (checked every ``check_every`` repetitions; the others continue alone).
        after_rep: called after every repetition with its launch index and the names of the
            implementations launched in it, after their last end event and before the next
            repetition's first flush (verification that needs every implementation's output).

    Returns:
        Samples per implementation name.
    """
    stream = torch.cuda.current_stream()
    for i in range(warmup):
        for impl in impls:
            impl.prepare(i)
            impl.launch()
    stream.synchronize()
    events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {t.name: [] for t in impls}
    active = list(impls)
    cut: set[str] = set()
    for rep in range(repetitions):
        order = active if rep % 2 == 0 else list(reversed(active))
        for impl in order:
            impl.prepare(warmup + rep)
            flush()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            impl.launch()
            end.record(stream)
            events[impl.name].append((start, end))
            if impl.check is not None:
                impl.check(warmup + rep)
        if after_rep is not None:
            after_rep(warmup + rep, [impl.name for impl in order])
        if cutoff_ms and (rep + 1) % check_every == 0:
            stream.synchronize()
            for impl in list(active):
                limit = cutoff_ms.get(impl.name)
                if limit is not None and len(active) > 1:
                    med = statistics.median(s.elapsed_time(e) for s, e in events[impl.name])
                    if med > limit:
                        active.remove(impl)
                        cut.add(impl.name)
    stream.synchronize()
    return {
        name: Samples(tuple(s.elapsed_time(e) for s, e in pairs), name in cut)
        for name, pairs in events.items()
    }


def gpu_us(work: Callable[[], None], reps: int = 20) -> float:
    """The GPU's time for the work one call of ``work`` queues, microseconds: CUDA events
    around it, median of ``reps`` calls (an L2 flush, a sleep being calibrated)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def l2_persistence(stream_ptr: int, clear: bool = True) -> dict[str, int | str]:
    """The persisting-L2 carve-out of the current device and the access-policy window of a
    stream, in bytes (both must be 0 for the L2 flush to evict everything the timed launch
    reads); ``error`` instead when the runtime cannot be asked.

    With ``clear``, a nonzero carve-out is set to 0 for this process's context first (the
    limit belongs to the context, so nothing outlives the process): the H200 image was seen
    starting contexts with an 11.25 MiB carve-out. What was found then stays on record as
    ``persisting_l2_bytes_found``.
    """
    try:
        from cuda.bindings import runtime as rt
    except ImportError as exc:  # the bindings are a dependency of the GPU extra
        return {"error": f"cuda.bindings missing: {exc}"}
    limit = rt.cudaLimit.cudaLimitPersistingL2CacheSize
    err, carve_out = rt.cudaDeviceGetLimit(limit)
    if err != rt.cudaError_t.cudaSuccess:
        return {"error": f"cudaDeviceGetLimit(cudaLimitPersistingL2CacheSize): {err}"}
    state: dict[str, int | str] = {}
    if carve_out and clear:
        state["persisting_l2_bytes_found"] = int(carve_out)
        (err,) = rt.cudaDeviceSetLimit(limit, 0)
        if err != rt.cudaError_t.cudaSuccess:
            return {**state, "error": f"cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0): {err}"}
        err, carve_out = rt.cudaDeviceGetLimit(limit)
        if err != rt.cudaError_t.cudaSuccess:
            return {**state, "error": f"cudaDeviceGetLimit(cudaLimitPersistingL2CacheSize): {err}"}
    attr = rt.cudaStreamAttrID(rt.cudaStreamAttributeAccessPolicyWindow)
    err, value = rt.cudaStreamGetAttribute(rt.cudaStream_t(stream_ptr), attr)
    if err != rt.cudaError_t.cudaSuccess:
        return {**state, "error": f"cudaStreamGetAttribute(cudaStreamAttributeAccessPolicyWindow): {err}"}
    return {"persisting_l2_bytes": int(carve_out),
            "access_policy_window_bytes": int(value.accessPolicyWindow.num_bytes), **state}


def l2_finding(state: dict[str, int | str]) -> str | None:
    """Why times taken under ``state`` (from :func:`l2_persistence`) are not flushed-L2 times,
    or None when the carve-out and the window are both zero."""
    if "error" in state:
        return f"L2 persistence could not be checked: {state['error']}"
    kept = {k: v for k, v in state.items() if v and k != "persisting_l2_bytes_found"}
    if kept:
        return "L2 persistence is set, so the flush does not evict everything: " + ", ".join(
            f"{k} = {v}" for k, v in kept.items())
    return None


def measure_copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted), median of reps.

    This is the practical ceiling for memory-bound kernels (REFERENCE.md section 1).
    """
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def capture_graph(fn: Callable[[], object], warmup: int = 3) -> torch.cuda.CUDAGraph:
    """Captures ``fn`` in a CUDA graph (after warm-up on a side stream, as torch requires),
    so that a peer is timed as a kernel, not as a Python call.

    Raises what the capture raises (a peer that synchronises cannot be captured), with the
    caller's stream current again: ``torch.cuda.graph`` leaves its capture stream current
    when ending a failed capture raises, and every later launch and event of the process
    would then go to different streams (our kernels to the stream they were loaded on, the
    timing events to the capture stream), so that the events would time nothing.
    """
    origin = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(origin)
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    origin.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    finally:
        if torch.cuda.current_stream() != origin:
            torch.cuda.set_stream(origin)
    torch.cuda.synchronize()
    return graph
