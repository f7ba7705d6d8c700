"""Elementwise schedules: maps over one or more inputs with broadcasting.

- ``elementwise/rows``: blocks over (row, column chunk); 16-byte vector loads and stores of
  every tensor when the row length, strides, offsets and pointers allow it, else scalar code;
  a scalar tail for the last partial vector. A thread issues the loads of all its vectors
  before their math and stores. An output scattered by rows (``target[index] =
  values``) is stored at its index's row; a per-row output once per row.
- ``elementwise/flat``: the same over one flat row of R*C elements, when every access is
  contiguous.
"""

from __future__ import annotations

from agents.embedded.codegen.cuda_text import PRELUDE
from agents.embedded.codegen.emit import (
    Emitter,
    Schedule,
    c_size,
    entry,
    entry_args,
    entry_params,
    header,
)
from agents.embedded.codegen.ir import ColumnIndex, Fold, Load, Program, RowOf, by_index, walk
from agents.embedded.codegen.trace import Unsupported
from agents.embedded.launch_fill import FILL_BLOCKS, fill_threads
from kernels.spec import KernelSpec


def elementwise(spec: KernelSpec, program: Program, flat: bool) -> Schedule:
    em = Emitter(spec, program)
    outputs = list(program.outputs)
    scattered = {n: e for n, (space, e) in program.outputs.items() if space == "scatter"}
    per_row = {n: e for n, (space, e) in program.outputs.items() if space == "row"}
    if flat and (scattered or per_row):
        raise Unsupported("the flat schedule has no rows to scatter or to write once")
    if flat and any(isinstance(n, Fold) for n in walk(program.all_roots())):
        raise Unsupported("the flat schedule has no rows for a reduction over the next-to-last dimension")
    if flat:
        if any(by_index(leaf) or leaf.row_stride != "C" or leaf.offset != "0" for leaf in em.full_leaves) \
                or em.col_leaves() or any(n.access == "row" for n in em.row_loads) \
                or any(isinstance(n, ColumnIndex | RowOf) for n in walk(program.all_roots())):
            # (one flat row of R*C elements has no column or row of the kernel's to test)
            raise Unsupported("the flat schedule needs contiguous accesses only")
        em.cols = f"({em.rows} * {em.cols})"
        rows_launch, cols_launch = "1", f"{program.rows} * {program.cols}"
    else:
        rows_launch, cols_launch = program.rows, program.cols
    bases = em.leaf_bases("cg_row")
    bases = em.take_row_lines() + bases  # a gathered row's index is a row value: defined first
    # A scattered output's row is its index (a row value; negative counts from the end).
    scatter_bases = []
    for n, sc in scattered.items():
        index = em.row_expr(sc.index)
        em.out_base[n] = f"cg_obase_{n}"
        scatter_bases.append(f"const cg_idx cg_obase_{n} = ({index} < 0 ? {index} + {c_size(sc.rows)} : {index}) "
                             f"* {em.cols};")
    exprs = [(f"out:{n}", e.value if space == "scatter" else e) for n, (space, e) in program.outputs.items()
             if space != "row"]
    body = em.chunk_body(exprs, "cg_c")
    # A per-row output is written once, by the chunk that holds the row's first column.
    row_stores = [f"{n}[cg_row] = {em.store_value(n, em.row_expr(e), em.kind(e))};" for n, e in per_row.items()]
    once = ["if (cg_c == 0) {", *("    " + x for x in row_stores), "}"] if row_stores else []
    body += once
    chunk = "cg_begin + (static_cast<cg_idx>(cg_j) * blockDim.x + threadIdx.x) * V"
    row_defs = em.take_row_lines()  # every row value the bodies use (chunk_body named them all)
    row_lines = ["const cg_idx cg_obase = cg_row * " + em.cols + ";", *bases]
    # In the vector path the row values the loads do not need (a scattered row's index, a
    # per-row scalar) are read after the staged loads are issued: read first, ptxas put the
    # index's arithmetic ahead of the vector loads, which then waited a trip to memory for it.
    staged = em.staged_loops(exprs, "CG_N", "cg_j", chunk, "cg_c < cg_vend", once, between=row_defs + scatter_bases)
    assert not em.take_row_lines(), "the staged loops named a row value the chunk body did not"
    args = entry_args(spec)
    text = [
        PRELUDE,
        "// One V-wide chunk of one row at column cg_c; used with V = 1, for data off vector boundaries",
        "// and for the tail past the last whole vector.",
        f"template <int V, typename cg_idx>\n__device__ __forceinline__ void cg_chunk_at({entry_params(spec)}, cg_idx cg_row, cg_idx cg_c) {{",
        *("    " + b for b in row_lines + row_defs + scatter_bases),
        *("    " + b for b in body),
        "}",
        "",
        f"template <int V, typename cg_idx>\n__device__ __forceinline__ void cg_run({entry_params(spec)}) {{",
        f"    const cg_idx cg_cols = {em.cols};",
        "    // A 2-D grid: blockIdx.x is the column chunk, blockIdx.y the group of blockDim.y rows, so",
        "    // no thread divides to find its place (the divisions took ~45 of the ~360 instructions of",
        "    // a thread with one vector of an erf activation). More row groups than grid.y allows",
        "    // (65535) are taken in turn by the same blocks.",
        "    const cg_idx cg_size = static_cast<cg_idx>(blockDim.x) * 8 * ITEMS;",
        "    const cg_idx cg_begin = static_cast<cg_idx>(blockIdx.x) * cg_size;",
        "    const cg_idx cg_end = min(cg_cols, cg_begin + cg_size);",
        "    const cg_idx cg_vend = cg_begin + (cg_end - cg_begin) / V * V;",
        f"    for (cg_idx cg_row = static_cast<cg_idx>(blockIdx.y) * blockDim.y + threadIdx.y; cg_row < {c_size(rows_launch)};",
        "         cg_row += static_cast<cg_idx>(gridDim.y) * blockDim.y) {",
        "        if constexpr (V == 1) {",
        "            // Data off vector boundaries: one element at a time. Staged, single elements would take",
        "            // 8 * ITEMS registers per input, and a kernel is given the registers of its larger path.",
        "            for (cg_idx cg_c = cg_begin + threadIdx.x; cg_c < cg_end; cg_c += blockDim.x) {",
        f"                cg_chunk_at<1, cg_idx>({args}, cg_row, cg_c);",
        "            }",
        "        } else {",
        *("            " + b for b in row_lines),
        "            // The thread's CG_N chunks of the block's share: every load first, so that they are all in",
        "            // flight together (a load-compute-store loop waits for each chunk's loads in turn), then",
        "            // the math and the stores; the chunks of a step are consecutive across the threads.",
        "            constexpr int CG_N = (8 * ITEMS + V - 1) / V;",
        *("            " + x for x in staged),
        "            // What is left past the last whole vector, one element at a time.",
        "            for (cg_idx cg_c = cg_vend + threadIdx.x; cg_c < cg_end; cg_c += blockDim.x) {",
        f"                cg_chunk_at<1, cg_idx>({args}, cg_row, cg_c);",
        "            }",
        "        }",
        "    }",
        "}",
    ]
    # Threads along a row: one per 8 * ITEMS elements, in steps of 8 (a warp may hold several
    # short rows), at most BLOCK; the rest of BLOCK takes further rows, but no more than keep
    # FILL_BLOCKS blocks: a few hundred short rows packed 16 to a block of 512 left most SMs idle.
    # A small launch (a few long rows) takes smaller blocks, down to a warp, until it too has
    # about FILL_BLOCKS (see fill_threads).
    tx = f"min(BLOCK, max(8, 8 * cdiv({cols_launch}, 64 * ITEMS)), {fill_threads(rows_launch, cols_launch)})"
    ry = f"max(1, min(BLOCK // {tx}, cdiv({rows_launch}, {FILL_BLOCKS})))"
    grid = f"(cdiv({cols_launch}, {tx} * 8 * ITEMS), min(cdiv({rows_launch}, {ry}), 65535))"
    tune: dict[str, tuple[int, ...]] = {"BLOCK": (256, 128, 512), "ITEMS": (2, 1, 4)}
    if any(leaf.access == "colshift" for leaf in em.full_leaves):
        # A cat reads every piece at each element (clamped loads; a where keeps one), one
        # scalar load per piece beside the staged vectors: at ITEMS 4 and 512 threads a
        # rotate_half rope took the 128 registers ptxas had and spilled 116 bytes.
        tune["ITEMS"] = (2, 1)
    name = "elementwise/flat" if flat else "elementwise/rows"
    head = header(grid, f"({tx}, {ry})", tune, f"{name}: 16-byte vectors with a scalar tail, fp32 math", spec)
    call = _call(em, args, rows_launch, cols_launch, bool(scattered))
    vectors = em.vector_ok([n for n in outputs if n not in per_row])
    return Schedule("codegen:" + name, head + "\n".join(text) + "\n"
                    + entry(spec, "BLOCK", vectors, call, scalar=f"cg_run<1, long long>({args})"))

# Every index of the 32-bit copy stays below this: the row loop's and the last chunk's
# overshoot past the data (up to 65535 * 1024 rows, BLOCK * 8 * ITEMS columns) must not wrap.
INT32_LIMIT = 2**31 - 2**27


def _call(em: Emitter, args: str, rows: str, cols: str, scattered: bool) -> str:
    """The entry's call of cg_run: the 32-bit copy when every tensor's last element sits below
    INT32_LIMIT (decided at launch from the sizes), else the 64-bit one. A gathered or scattered
    row is an index read from memory, with no size to bound it by: those programs are 64-bit."""
    if scattered or any(by_index(leaf) for leaf in em.full_leaves):
        return "cg_run<{v}, long long>(" + args + ")"
    wide = [f"{c_size(rows, 'long long')} * {c_size(cols, 'long long')}"]  # outputs, row-major
    for leaf in em.full_leaves:
        stride = c_size(cols, "long long") if leaf.row_stride == "C" else c_size(leaf.row_stride, "long long")
        wide.append(f"{c_size(rows, 'long long')} * {stride} + {c_size(leaf.offset, 'long long')} + "
                    f"{c_size(cols, 'long long')}")
    for leaf in (n for n in walk(em.p.all_roots()) if isinstance(n, Load) and n.access == "foldrow"):
        wide.append(f"{c_size(rows, 'long long')} * {c_size(leaf.row_stride, 'long long')}")
    fits = " && ".join(f"{w} < {INT32_LIMIT}LL" for w in dict.fromkeys(wide))
    return f"if ({fits}) cg_run<{{v}}, int>({args}); else cg_run<{{v}}, long long>({args})"

