"""Our kernels in a timing loop: the one way both the evaluator (:mod:`evaluators.worker`)
and the peers' loop (:mod:`evaluators.peers`) set them up.

Every implementation of one shape works on one working set (the same addresses for all of
them: where a short kernel's few pages fall must not differ between the kernels compared),
restored before every launch from the loop's input plan (:class:`evaluators.verify.RepInputs`)
and L2-flushed by :func:`evaluators.timing.time_interleaved`. A kernel under verification has
every timed launch checked against our baseline on the same inputs, right after the launch's
end event (outside every window): in the peers' loop the checker runs the baseline in a buffer
of its own (:meth:`OursOnShape.timed`); in the evaluator, where the baseline is timed in the
same loop, against the baseline's timed launch of the same repetition (:meth:`OursOnShape.paired`).

Before this was shared, the evaluator gave the baseline and the candidate a working set each
and compared them after every repetition, while the peers' loop shared one working set, so
"vs baseline" and "vs peers" were ratios of measurements set up differently. A reported gap
(fused_add_rmsnorm [256, 4096]: 18.06 us in the evaluator, 12.16 us in the loop) did not
come back when ``experiments/timing_truth.py`` timed both set-ups side by side on the H200
(evaluator / loop 0.955-1.011, ``experiments/results/timing-truth-h200.json``); sanitizer runs
overlapping timed calls on the same GPU, since stopped in :mod:`search.pool`, are one
cause that fits it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evaluators.context import Context, oracle_of, roofline_finding, tolerances
from evaluators.launcher import Kernel
from evaluators.timing import Samples, Timed, capture_graph
from evaluators.verify import TIMED_OUTPUT_GUARD, Buffers, RepInputs, TimedOutputCheck
from kernels.spec import KernelSpec, Shape, shape_label

GRAPH_SUFFIX = "@graph"


class OursOnShape:
    """Our kernels on one shape, launched on the shared working set ``work``; owner of their
    implementations' names (``<name>`` and ``<name>@graph``).

    Args:
        ctx: the worker's context.
        spec, shape, dtype: what is timed.
        warmup, repetitions: the loop's (launch index = warmup + repetition).
        inputs: the loop's input plan.
        work: the shared working set (``inputs.buffer()``).
        baseline: our trusted baseline, the oracle of every verified launch (None: nothing
            of ours is verified).
        where: appended to a failed check's message (e.g. ``in the peers' loop``).
    """

    def __init__(self, ctx: Context, spec: KernelSpec, shape: Shape, dtype: str, warmup: int, repetitions: int,
                 inputs: RepInputs, work: Buffers, baseline: Kernel | None, where: str = "") -> None:
        self.ctx, self.spec, self.shape, self.dtype, self.inputs, self.work = ctx, spec, shape, dtype, inputs, work
        self.warmup, self.repetitions, self.where = warmup, repetitions, where
        self.oracle = oracle_of(baseline, shape) if baseline is not None else None
        self.checks: dict[str, TimedOutputCheck] = {}
        self.owner: dict[str, str] = {}

    def timed(self, name: str, kernel: Kernel, graph: bool = False, verify: bool = True) -> Timed:
        """One of our kernels, launched directly or (``graph``) captured in a CUDA graph and
        replayed, timed exactly as the peers are; with ``verify``, every timed launch is
        checked against the baseline."""
        label = shape_label(self.shape)
        args = kernel.args(self.work, self.shape)
        launch: Callable[[], None] = lambda: kernel.launch(label, args)  # noqa: E731
        if graph:
            # One launch on restored inputs and filled outputs instead of the capture's own
            # warm-up, which would run on whatever the working set holds.
            self.inputs.restore(self.work, 0)
            kernel.launch(label, args)
            launch = capture_graph(lambda: kernel.launch(label, args, on_current_stream=True), warmup=0).replay
        impl = f"{name}{GRAPH_SUFFIX}" if graph else name
        self.owner[impl] = name
        prepare = lambda i: self.inputs.restore(self.work, i)  # noqa: E731
        if not verify:
            return Timed(impl, prepare, launch)
        assert self.oracle is not None, "our kernels are verified against the baseline: give it"
        context = f"(shape {label}, {self.dtype}{', ' + self.where if self.where else ''})"
        check = TimedOutputCheck(self.inputs, self.oracle, tolerances(self.spec, self.dtype, 2.0), self.spec.compare,
                                 self.warmup, self.repetitions, context)
        self.checks[impl] = check
        return Timed(impl, prepare, launch, lambda i: check.check(i, self.work))

    def paired(self, trusted: tuple[str, Kernel], verified: tuple[str, Kernel]) -> tuple[Timed, Timed]:
        """Two of our kernels for one loop, the second's every timed launch checked against the
        first's timed launch of the same repetition (both run on that launch index's inputs):
        whichever of the two runs first in a repetition has its outputs kept in a buffer of
        the checker's, and the second is compared with them. The same check as :meth:`timed`
        with ``verify``, without an extra launch of the trusted kernel and a restore of the
        inputs for it after every timed launch (the evaluator, where the baseline is timed
        beside the candidate anyway)."""
        label = shape_label(self.shape)
        (t_name, t_kernel), (v_name, v_kernel) = trusted, verified
        context = f"(shape {label}, {self.dtype}{', ' + self.where if self.where else ''})"
        check = TimedOutputCheck(self.inputs, None, tolerances(self.spec, self.dtype, 2.0), self.spec.compare,
                                 self.warmup, self.repetitions, context)
        self.checks[v_name] = check
        self.owner[t_name], self.owner[v_name] = t_name, v_name
        kept = {n: self.work[n].clone() for n in self.inputs.written}
        first_of: dict[int, str] = {}  # launch index -> the one of the two that ran first in it

        def after(name: str) -> Callable[[int], None]:
            def hook(i: int) -> None:
                if first_of.pop(i, None) is None:
                    first_of[i] = name
                    for n, t in kept.items():
                        t.copy_(self.work[n])
                    return
                got, expected = (self.work, kept) if name == v_name else (kept, self.work)
                check.compare(i, got, expected)
            return hook

        prepare = lambda i: self.inputs.restore(self.work, i)  # noqa: E731
        t_args, v_args = t_kernel.args(self.work, self.shape), v_kernel.args(self.work, self.shape)
        return (Timed(t_name, prepare, lambda: t_kernel.launch(label, t_args), after(t_name)),
                Timed(v_name, prepare, lambda: v_kernel.launch(label, v_args), after(v_name)))

    def failures(self, samples: dict[str, Samples]) -> dict[str, tuple[str, Any]]:
        """Per kernel of ours, the first guard that fired on this shape: ``(guard, finding)``."""
        out: dict[str, tuple[str, Any]] = {}
        for impl, check in self.checks.items():
            finding = check.finding()
            kind = TIMED_OUTPUT_GUARD
            if finding is None and impl in samples:
                finding = roofline_finding(self.spec, self.shape, self.dtype, samples[impl].median_ms, self.ctx.copy_bw)
                kind = "roofline"
            if finding is not None:
                out.setdefault(self.owner[impl], (kind, finding))
        return out
