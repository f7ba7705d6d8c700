"""The evaluator interface: one request in, one :class:`Evaluation` out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernels.folders import KernelRef
from kernels.variant import Variant
from kernels.verdict import Evaluation

if TYPE_CHECKING:
    from evaluators.admit import Artifact
    from kernels.spec import KernelSpec


@dataclass(frozen=True)
class TimingConfig:
    """How hard to time. ``full`` is the reported protocol; ``screen`` is for cheap trials.

    Attributes:
        warmup: launches before timing, per implementation and shape.
        repetitions: timed launches per implementation and shape (L2 flushed before each).
        cutoff: stop timing a candidate early once its running median is this many times
            slower than ``EvalRequest.best_ms`` on some shape (tinygrad-style); 0 disables.
    """

    warmup: int = 20
    repetitions: int = 100
    cutoff: float = 0.0

    @staticmethod
    def full() -> TimingConfig:
        return TimingConfig(20, 100, 0.0)

    @staticmethod
    def screen() -> TimingConfig:
        return TimingConfig(5, 20, 3.0)


@dataclass(frozen=True)
class EvalRequest:
    """Evaluate one variant of one kernel at one parameter assignment and dtype.

    Attributes:
        kernel: the kernel's reference (folder and digest, see :mod:`kernels.folders`), or a
            library kernel name or folder path.
        variant: the candidate.
        params: tunable parameter values (missing ones take their defaults).
        dtype: run dtype.
        shape_set: ``search`` or ``heldout``.
        timing: repetitions and cutoff.
        seeds: random seeds for validation inputs (edge cases are always added).
        best_ms: per-shape best times so far (for the early cutoff), keyed by shape label.
        time: False to validate only.
        noise_floor: also time the baseline against itself (A/A) and report the spread.
        extra_shapes: shapes added to the spec's set for this run: the tester's shapes for
            ``search``, the shapes drawn for this run from the spec's held-out ranges for
            ``heldout`` (the search never sees either held-out list).
    """

    kernel: KernelRef | str
    variant: Variant
    params: dict[str, int] = field(default_factory=dict)
    dtype: str = "float16"
    shape_set: str = "search"
    timing: TimingConfig = field(default_factory=TimingConfig)
    seeds: tuple[int, ...] = (0, 1)
    best_ms: dict[str, float] = field(default_factory=dict)
    time: bool = True
    noise_floor: bool = False
    extra_shapes: tuple[dict[str, int], ...] = ()

    def shapes(self, spec: KernelSpec) -> tuple[dict[str, int], ...]:
        """The shapes to evaluate: the spec's set, plus ``extra_shapes``."""
        return spec.shapes(self.shape_set) + tuple(dict(s) for s in self.extra_shapes)


class Evaluator(ABC):
    """Compiles, validates and times variants. Implementations: the GPU sandbox evaluator
    (:mod:`evaluators.gpu`) and a CPU stand-in for tests (:mod:`evaluators.standin`)."""

    @abstractmethod
    def evaluate(self, request: EvalRequest, artifact: Artifact | None = None) -> Evaluation:
        """Returns a verdict; kernel faults become statuses, never exceptions.

        ``artifact`` is the candidate as :func:`evaluators.admit.admit` made it for this
        request's kernel, dtype and parameters (a compile task's output, shipped as a Ray
        object); without one the evaluator admits the source itself.
        """

    def time_peers(self, kernel: KernelRef | str, dtype: str, shape_set: str = "search",
                   ours: dict[str, tuple[str, dict[str, int]]] | None = None) -> dict[str, dict[str, float]]:
        """Graph-timed production peers (FlashInfer, torch.compile, torch eager) on the
        kernel's shapes, with our own kernels ``{name: (source, params)}`` in the same
        interleaved loop: ``{implementation: {shape label: median ms}}``; peers that cannot
        run are left out. Stand-ins return ``{}``."""
        return self.time_peers_full(kernel, dtype, shape_set, ours)["peers"]

    def time_peers_full(self, kernel: KernelRef | str, dtype: str, shape_set: str = "search",
                        ours: dict[str, tuple[str, dict[str, int]]] | None = None,
                        repetitions: int = 100, graph_ours: bool = False, fresh_process: bool = False,
                        compile_trials: int | None = None, peers: bool = True,
                        compile_cache: str | None = None,
                        exclude_peers: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
        """Like :meth:`time_peers`, with ``errors`` (``{peer: why it was not timed}``),
        ``failed`` (``{our kernel: why}``: ours get the evaluator's guards in this loop, and one
        that fails them is reported there, never timed) and, on a GPU, spreads (``iqr``) and
        the copy bandwidth. ``graph_ours`` also times each of our kernels through a CUDA
        graph, as ``<name>@graph``. ``fresh_process``: the loop in a new process (one of
        several independent repetitions); ``compile_trials``: fresh compilations per
        torch.compile mode; ``peers`` False times our kernels alone; ``compile_cache``: the
        folder this loop's torch.compile programs were compiled into ahead of it
        (:mod:`evaluators.peer_compile`); ``exclude_peers`` ({peer: {shape label: why}}): calls
        not to make (they ended a process there). Stand-ins time nothing."""
        return {"peers": {}, "errors": {}}

    def time_round(self, kernel: KernelRef | str, dtype: str, loops: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """A round of loops in one process, each of ``loops`` the keyword arguments of
        :meth:`time_peers_full` (``shape_set``, ``ours``, ``compile_trials``, ``peers``,
        ``compile_cache``, ``exclude_peers``); each loop's reply in order. Here one loop after the other, the
        first in a fresh process; the GPU evaluator sets them all up before it times any."""
        return [self.time_peers_full(kernel, dtype, fresh_process=i == 0, **dict(loop)) for i, loop in enumerate(loops)]

    def close(self) -> None:  # noqa: B027 - optional
        """Releases worker processes and GPU memory."""
