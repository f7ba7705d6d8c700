"""Column-scatter schedule: element (r, j) of the values to column index[r, j] of row r.

- ``scatter/block``: one row per block (blocks take further rows in turn). A target the
  reference made (``torch.zeros(...).scatter(1, ids, w)``) is first filled with its constant,
  the whole row, before a barrier; then each thread computes its entries' values and columns
  (scalar loads) and stores them.

When the values read the target itself (a penalty applied to the logits at the ids: the
reference gathers, computes, then scatters), an index named twice in a row must still read the
original element: a write by one thread must not be read by another. Such values may read the
target at their own column only (else the generator refuses the graph). A row of at most BLOCK *
ITEMS entries is therefore read whole, into registers, before a barrier and then written; a
longer row is written by each column's first entry only (each entry looks for its column among
the row's earlier entries), so that no element is both read and written by two threads.
Duplicate entries with different values (a ``scatter`` whose source differs at one column)
have no defined order in torch either.
"""

from __future__ import annotations

from agents.embedded.codegen.cuda_text import PRELUDE
from agents.embedded.codegen.emit import (
    Emitter,
    Schedule,
    block_entry,
    c_size,
    entry_params,
    header,
    rows_grid,
)
from agents.embedded.codegen.ir import ColumnIndex, ColumnScatter, Load, Program, walk
from agents.embedded.codegen.trace import Unsupported
from kernels.spec import KernelSpec


def column_scatter(spec: KernelSpec, program: Program) -> Schedule:
    (name, (space, sc)), = program.outputs.items()
    assert space == "colscatter" and isinstance(sc, ColumnScatter)
    if any(isinstance(n, ColumnIndex) for n in walk(program.all_roots())):
        raise Unsupported("a scatter along the columns of values that read their own column")
    em = Emitter(spec, program)
    bases = em.take_row_lines() + em.leaf_bases("cg_row")
    width = c_size(sc.width)

    def column(at: str) -> str:
        """The column entry ``at`` of the row names, counted from the end when negative."""
        return f"cg_wrap(static_cast<cg_idx>({em.scalar_expr(sc.column, at)}), {width})"

    value = em.store_value(name, em.scalar_expr(sc.value, "cg_j"), em.kind(sc.value))
    row_defs = em.take_row_lines()
    # (the reader admits such reads at the entry's own column only: ir._Reader.scatter_columns)
    reads_target = any(isinstance(n, Load) and n.arg == name for n in walk([sc.value]))
    fill = []
    if sc.fill is not None:
        fill_value = em.store_value(name, em.row_expr(sc.fill), em.kind(sc.fill))
        fill = [
            "        // The target the reference made: every column holds the constant first.",
            "        for (cg_idx cg_c = threadIdx.x; cg_c < cg_width; cg_c += blockDim.x) {",
            f"            {name}[cg_obase + cg_c] = {fill_value};",
            "        }",
            "        __syncthreads();",
        ]
    if reads_target:
        write = [
            "        if (cg_cols <= static_cast<cg_idx>(BLOCK) * ITEMS) {",
            "            // The whole row read before any write: a column named twice reads its original value.",
            f"            {em.c_type(name)} cg_v[ITEMS];",
            "            cg_idx cg_at[ITEMS];",
            "            #pragma unroll",
            "            for (int cg_i = 0; cg_i < ITEMS; ++cg_i) {",
            "                const cg_idx cg_j = threadIdx.x + static_cast<cg_idx>(cg_i) * BLOCK;",
            "                cg_at[cg_i] = -1;",
            "                if (cg_j < cg_cols) {",
            f"                    cg_at[cg_i] = {column('cg_j')};",
            f"                    cg_v[cg_i] = {value};",
            "                }",
            "            }",
            "            __syncthreads();",
            "            #pragma unroll",
            "            for (int cg_i = 0; cg_i < ITEMS; ++cg_i) {",
            f"                if (cg_at[cg_i] >= 0) {name}[cg_obase + cg_at[cg_i]] = cg_v[cg_i];",
            "            }",
            "        } else {",
            "            // A longer row: each column written by its first entry only.",
            "            for (cg_idx cg_j = threadIdx.x; cg_j < cg_cols; cg_j += blockDim.x) {",
            f"                const cg_idx cg_col = {column('cg_j')};",
            "                bool cg_first = true;",
            "                for (cg_idx cg_i = 0; cg_i < cg_j && cg_first; ++cg_i) {",
            f"                    cg_first = {column('cg_i')} != cg_col;",
            "                }",
            f"                if (cg_first) {name}[cg_obase + cg_col] = {value};",
            "            }",
            "        }",
        ]
    else:
        write = [
            "        for (cg_idx cg_j = threadIdx.x; cg_j < cg_cols; cg_j += blockDim.x) {",
            f"            {name}[cg_obase + {column('cg_j')}] = {value};",
            "        }",
        ]
    text = [
        PRELUDE,
        "template <typename I>",
        "__device__ __forceinline__ I cg_wrap(I c, I n) { return c < 0 ? c + n : c; }",
        "",
        f"__device__ __forceinline__ void cg_run({entry_params(spec)}) {{",
        "    using cg_idx = long long;",
        f"    const cg_idx cg_cols = {em.cols};",
        f"    const cg_idx cg_width = {width};",
        f"    for (cg_idx cg_row = blockIdx.x; cg_row < {em.rows}; cg_row += gridDim.x) {{",
        "        const cg_idx cg_obase = cg_row * cg_width;",
        *("        " + x for x in bases + row_defs),
        *fill,
        *write,
        "    }",
        "}",
        "",
        *block_entry(spec),
    ]
    # Rows of a few entries (a top-k) waste most of a large block: small blocks are in the space.
    blocks = (128, 32, 64, 256, 512, 1024)
    tune = {"BLOCK": blocks, "ITEMS": (4, 2, 8)} if reads_target else {"BLOCK": blocks}
    head = header(rows_grid(program.rows), "(BLOCK,)", tune, "scatter/block: a row per block, scalar loads and stores at the "
                  "index's columns", spec)
    return Schedule("codegen:scatter/block", head + "\n".join(text) + "\n")
