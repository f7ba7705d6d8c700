"""A code generator for kernels no recipe knows: trace the spec's torch reference, classify
the op graph, emit CUDA from schedule templates.

Nothing here knows a kernel by name: the graph alone decides (elementwise maps with
broadcasting, row reductions followed by maps, a top-k along the row, prefix sums along the
row followed by maps (after the row reductions they read, and reduced for one value per row),
rows or columns gathered by index, rows or columns scattered by index, 2-D transposes). A graph outside these kinds gives no schedules, and the agent goes on as before.
"""

from __future__ import annotations

import logging

from agents.embedded.codegen.elementwise import elementwise
from agents.embedded.codegen.emit import Schedule
from agents.embedded.codegen.ir import Program, read_program
from agents.embedded.codegen.rows import online_pairs, rowwise
from agents.embedded.codegen.scan import scan
from agents.embedded.codegen.scatter import column_scatter
from agents.embedded.codegen.trace import Unsupported, trace_reference
from agents.embedded.codegen.transpose import transpose, transpose_wide
from kernels.spec import KernelSpec

__all__ = ["Program", "Schedule", "Unsupported", "classify", "generate", "schedules_for"]

_log = logging.getLogger(__name__)


def classify(spec: KernelSpec) -> Program:
    """The reference's op graph as a program (kind, iteration space, expressions).

    Raises:
        Unsupported: the graph is outside the supported kinds.
    """
    return read_program(spec, trace_reference(spec))


def generate(spec: KernelSpec) -> list[Schedule]:
    """Every schedule that applies to the kernel, best guess first.

    Raises:
        Unsupported: the graph is outside the supported kinds.
    """
    program = classify(spec)
    out: list[Schedule] = []
    if program.kind == "transpose":
        return [transpose(spec, program), transpose_wide(spec, program)]
    if program.kind == "scan":
        return [scan(spec, program)]
    if any(space == "colscatter" for space, _ in program.outputs.values()):
        return [column_scatter(spec, program)]
    if program.kind == "elementwise":
        for flat in (True, False):
            try:
                out.append(elementwise(spec, program, flat))
            except Unsupported:
                continue
        return out
    if program.topk is not None:  # picks one at a time, by the threads of one block
        return [rowwise(spec, program, mode) for mode in ("block", "warp")]
    out = [rowwise(spec, program, mode) for mode in ("block", "warp", "cluster")]
    if online_pairs(program):  # long rows: one pass fewer (short rows are held in registers anyway)
        out += [rowwise(spec, program, mode, online=True) for mode in ("block", "cluster")]
    return out


def schedules_for(spec: KernelSpec) -> dict[str, Schedule]:
    """The generated schedules by plan name (empty for an unsupported graph, and for a graph
    the generator fails on in a way it did not foresee: the agent's other steps still apply to
    the kernel, so the failure is logged, not raised into the search)."""
    try:
        return {s.name: s for s in generate(spec)}
    except Unsupported:
        return {}
    except Exception:
        _log.warning("the code generator failed on %s; no generated schedules", spec.name, exc_info=True)
        return {}
