"""A kernel's outputs on the CPU against its spec's reference: correctness without a GPU.

The kernel runs on the CPU emulator (:mod:`kernels.cpu_run`) at small shapes (the smallest
shapes of the set asked for, at most :data:`MAX_ELEMENTS` elements in all of a shape's tensors,
at most :data:`SHAPE_COUNT` of them) on every input case of the spec (``random`` and each edge
case), with its output buffers filled with NaN first; each written tensor is compared with the
reference at the run dtype's tolerances (the integrity guards, such as inputs left unchanged,
are the GPU evaluator's).
``python -m kernels.check`` checks baselines this way, ``python -m evaluators.check --cpu`` any
variant, and the stand-in evaluator every proposal.

Verdicts (:class:`CpuVerdict`): ``OK``; ``INCORRECT`` (an output differs from the reference);
``CRASH`` (the program aborted,
faulted or ran past its time limit); ``REJECTED`` with guard :data:`UNVERIFIED` when the
emulator cannot run the kernel at all (no host compiler or CUDA headers, or a construct it does
not model: inline PTX, thread-block clusters, an intrinsic its shim lacks): such a kernel is
not known to be correct, so it is never OK. Verdicts are cached on disk by everything that
changes them.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kernels import cpu_run
from kernels.folders import folder_digest
from kernels.launch import LaunchSpecError
from kernels.nvrtc import cache_root
from kernels.records import atomic_write
from kernels.spec import KernelSpec, Shape, shape_key, shape_label
from kernels.verdict import Status

MAX_ELEMENTS = 2**20  # per shape, all tensors together: a few seconds at most on the emulator
SHAPE_COUNT = 2
UNVERIFIED = "cpu_unverified"  # the guard of a kernel the emulator cannot run
_VERSION = "1"  # bump when what a verdict means changes
# (input case, shape, the inputs made for it, the reference's outputs on them)
_Run = tuple[str, dict[str, int], dict[str, Any], dict[str, Any]]


@dataclass(frozen=True)
class CpuVerdict:
    """The outcome of running a kernel on the CPU emulator.

    Attributes:
        status: OK, INCORRECT, CRASH, RESOURCE_ERROR or REJECTED (see the module docstring).
        message: one line for the planner or the user: the first mismatch with its case, dtype
            and shape, or why the kernel could not be run.
        guard: :data:`UNVERIFIED` where the status is REJECTED, else "".
        shapes: the shapes it ran on.
        cases: the input cases it ran on.
    """

    status: Status
    message: str
    guard: str = ""
    shapes: tuple[dict[str, int], ...] = ()
    cases: tuple[str, ...] = ()

    @property
    def verified(self) -> bool:
        """True when the kernel ran and every output matched."""
        return self.status is Status.OK


def cpu_shapes(spec: KernelSpec, pool: Sequence[Shape] | None = None, count: int = SHAPE_COUNT,
               max_elements: int = MAX_ELEMENTS) -> list[dict[str, int]]:
    """The ``count`` smallest shapes of ``pool`` (default: the search shapes) within
    ``max_elements``, or the smallest one alone when none is that small."""
    sizes = [(sum(spec.tensor_elements(s).values()), i) for i, s in enumerate(pool or spec.search_shapes)]
    shapes = [dict((pool or spec.search_shapes)[i]) for _, i in sorted(sizes)]
    small = [s for (n, _), s in zip(sorted(sizes), shapes, strict=True) if n <= max_elements]
    return small[:count] or shapes[:1]


def _key(spec: KernelSpec, source: str, dtype: str, params: Mapping[str, int], runs: Sequence[_Run]) -> str:
    """Everything a verdict depends on: the emulator, the source, dtype and parameters, the
    kernel folder, and the very inputs and expected outputs (shared input helpers outside the
    folder may change them), with the tolerances."""
    import torch

    h = hashlib.sha256()
    parts = [_VERSION, Path(cpu_run.__file__).read_text(), str(cpu_run.CXX), source, dtype,
             json.dumps(dict(sorted(params.items()))), folder_digest(spec.directory) if spec.directory else spec.name,
             json.dumps(sorted(spec.tolerance(d) for d in ("float16", "bfloat16", "float32")))]
    for part in parts:
        h.update(part.encode())
        h.update(b"\1")
    read = {a.name for a in spec.read_args}  # an out buffer's bytes are whatever torch.empty gave
    for case, shape, made, want in runs:
        h.update(f"{case}{sorted(shape.items())}".encode())
        tensors = {**{k: v for k, v in made.items() if k in read}, **{f"want {k}": v for k, v in want.items()}}
        for name, t in sorted(tensors.items()):
            h.update(name.encode())
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def check_on_cpu(spec: KernelSpec, source: str, dtype: str, params: Mapping[str, int] | None = None,
                 shapes: Sequence[Shape] | None = None, cache_dir: Path | None = None) -> CpuVerdict:
    """Runs ``source`` on the CPU at ``shapes`` (default :func:`cpu_shapes`) on every input
    case and compares with the reference (see the module docstring).

    Args:
        spec: the kernel's spec.
        source: the variant file (launch header and code).
        dtype: the run dtype.
        params: tune parameters; those not given take the launch header's defaults.
        shapes: the shapes to run on.
        cache_dir: where verdicts are kept (``cpu/`` under it; default the compile cache).
    """
    chosen = [dict(s) for s in (shapes or cpu_shapes(spec))]
    cases = ("random", *spec.edge_cases)
    why_not = cpu_run.available()
    if why_not:
        return CpuVerdict(Status.REJECTED, f"not checked on the CPU: the emulator cannot run here ({why_not})",
                          UNVERIFIED, tuple(chosen), cases)
    params = dict(params or {})
    runs = _prepare(spec, dtype, chosen, cases)
    key = _key(spec, source, dtype, params, runs)
    path = (cache_dir or cache_root()) / "cpu" / key[:2] / f"{key}.json"
    if path.is_file():
        d = json.loads(path.read_text())
        return CpuVerdict(Status(d["status"]), d["message"], d["guard"],
                          tuple(d["shapes"]), tuple(d["cases"]))
    verdict = _run_and_compare(spec, source, dtype, params, runs)
    atomic_write(path, json.dumps(dict(asdict(verdict), status=verdict.status.value)).encode())
    return verdict


def _prepare(spec: KernelSpec, dtype: str, shapes: list[dict[str, int]], cases: tuple[str, ...]) -> list[_Run]:
    """Per case and shape: the inputs (seeded) and the reference's outputs on them."""
    import torch

    runs = []
    for case in cases:
        for shape in shapes:
            made = spec.make_inputs(shape, getattr(torch, dtype), torch.Generator().manual_seed(0), case,
                                    torch.device("cpu"))
            runs.append((case, shape, made, spec.reference({k: v.clone() for k, v in made.items()}, shape,
                                                             spec.constants)))
    return runs


def _poisoned_bytes(spec: KernelSpec, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Every tensor's bytes, ``out`` buffers filled with NaN (integers with 0x55 bytes) so that
    an element left unwritten cannot pass for a result."""
    import torch

    out = {}
    for a in spec.args:
        if a.kind != "tensor":
            continue
        t = inputs[a.name].clone()
        if a.role == "out":
            if t.is_floating_point():
                t.fill_(float("nan"))
            else:
                t.view(torch.uint8).fill_(0x55)
        out[a.name] = t.contiguous().view(torch.uint8).numpy()
    return out


def _run_and_compare(spec: KernelSpec, source: str, dtype: str, params: dict[str, int],
                     runs: list[_Run]) -> CpuVerdict:
    import torch

    from kernels.compare import check_outputs, tolerances

    shapes = tuple({shape_key(shape): dict(shape) for _, shape, _, _ in runs}.values())
    cases = tuple(dict.fromkeys(case for case, _, _, _ in runs))

    def verdict(status: Status, message: str, guard: str = "") -> CpuVerdict:
        return CpuVerdict(status, message, guard, shapes, cases)

    with tempfile.TemporaryDirectory(prefix="ksearch-cpu-") as tmp:
        try:
            results = cpu_run.run(spec, source, dtype, params,
                                  [(shape, _poisoned_bytes(spec, made)) for _, shape, made, _ in runs], Path(tmp))
        except cpu_run.CpuRunError as exc:
            if exc.stage == "build":
                return verdict(Status.REJECTED, "not checked on the CPU: the emulator cannot build this kernel "
                               f"(inline PTX, clusters or an intrinsic it lacks?): {exc.first_line()}", UNVERIFIED)
            return verdict(Status.CRASH, f"the kernel failed on the CPU emulator ({dtype}): {exc.first_line()}")
        except LaunchSpecError as exc:
            return verdict(Status.RESOURCE_ERROR, f"launch on the CPU emulator: {exc}")
    for (case, shape, made, want), got in zip(runs, results, strict=True):
        where = f"(on the CPU emulator: case {case}, {dtype}, shape {shape_label(shape)}, params {params})"
        written = {k: torch.from_numpy(b.copy()).view(made[k].dtype).reshape(made[k].shape) for k, b in got.items()}
        finding = check_outputs(written, want, tolerances(spec, dtype), spec.compare, where)
        if finding is not None:
            return verdict(Status.INCORRECT, finding.message)
    return verdict(Status.OK, f"outputs match the reference on the CPU emulator ({dtype}; shapes "
                   f"{', '.join(shape_label(s) for s in shapes)}; cases {', '.join(cases)})")
