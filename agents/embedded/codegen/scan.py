"""Scan schedule: prefix sums along the row (``cumsum(x, dim=-1)``), then maps.

- ``scan/block``: one row per block (blocks take further rows in turn), the row walked in
  tiles of BLOCK * ITEMS columns. Each thread sums its ITEMS consecutive elements (the scan's
  body computed at each, scalar loads), the block scans the threads' totals in shared memory
  (Hillis-Steele, log2(BLOCK) steps), and each element's prefix is the carry of the earlier
  tiles plus the threads before it plus its own running sum; the outputs' maps are computed
  there and stored. fp32 sums for floats (as torch accumulates them), 64-bit for integers.

Row reductions the scans read (a softmax's max and sum before its cumulative sum) are passes
over the row before its tiles, each reduced over the block; reductions of the scans' values (a
count of a cumulative distribution below a threshold) accumulate in the tiles' pass and are
reduced over the block after the last tile, for the row's one-per-row outputs.

A row is one block's work, so few long rows leave most SMs idle; the evaluator times it
against the other proposals like any kernel.
"""

from __future__ import annotations

from agents.embedded.codegen.cuda_text import PRELUDE
from agents.embedded.codegen.emit import (
    IDENTITY,
    OPCODE,
    Emitter,
    Schedule,
    block_entry,
    entry_params,
    header,
    rows_grid,
)
from agents.embedded.codegen.ir import FLOAT, Program, Reduce, Scan, walk
from kernels.spec import KernelSpec


def _reads_scan(r: Reduce) -> bool:
    return any(isinstance(n, Scan) for n in walk([r.body]))


def _before_lines(em: Emitter, program: Program) -> list[str]:
    """The row reductions the scans read, in dependency order: a strided pass over the row
    each (scalar loads), reduced over the block."""
    lines: list[str] = []
    for r in (r for r in program.reductions if not _reads_scan(r)):
        body = em.scalar_expr(r.body, "cg_c")
        lines += em.take_row_lines()
        lines += [f"float cg_acc{r.index} = {IDENTITY[r.kind]};",
                  "for (cg_idx cg_c = threadIdx.x; cg_c < cg_cols; cg_c += BLOCK) {",
                  f"    cg_acc{r.index} = cg_combine<{OPCODE[r.kind]}>(cg_acc{r.index}, static_cast<float>({body}));",
                  "}",
                  f"const float cg_red{r.index} = cg_group_reduce<{OPCODE[r.kind]}>(cg_acc{r.index}, {IDENTITY[r.kind]});"]
    return lines


def scan(spec: KernelSpec, program: Program) -> Schedule:
    em = Emitter(spec, program)
    scans = [n for n in walk(program.all_roots()) if isinstance(n, Scan)]
    bases = em.leaf_bases("cg_row")
    bases = em.take_row_lines() + bases  # a gathered row's index is a row value: defined first
    before = _before_lines(em, program)
    types = ["float" if s.ctype == FLOAT else "long long" for s in scans]
    bodies = [em.scalar_expr(s.body, "cg_c") for s in scans]
    for k, s in enumerate(scans):
        em.scan_text[id(s)] = f"cg_x{k}"

    def each(*templates: str) -> list[str]:
        """For each scan k in turn, a line per template: {k} its index, {t} its C type, {b} its
        body at column cg_c."""
        return [tp.format(k=k, t=t, b=b) for k, (t, b) in enumerate(zip(types, bodies, strict=True)) for tp in templates]

    stores = [f"{name}[cg_obase + cg_c] = {em.store_value(name, em.scalar_expr(e, 'cg_c'), em.kind(e))};"
              for name, (space, e) in program.outputs.items() if space == "full"]
    after = [r for r in program.reductions if _reads_scan(r)]
    stores += [f"cg_acc{r.index} = cg_combine<{OPCODE[r.kind]}>(cg_acc{r.index}, static_cast<float>("
               f"{em.scalar_expr(r.body, 'cg_c')}));" for r in after]
    row_defs = em.take_row_lines()
    ends = [f"const float cg_red{r.index} = cg_group_reduce<{OPCODE[r.kind]}>(cg_acc{r.index}, {IDENTITY[r.kind]});"
            for r in after]
    row_stores = [f"{name}[cg_row] = {em.store_value(name, em.row_expr(e), em.kind(e))};"
                  for name, (space, e) in program.outputs.items() if space == "row"]
    ends += ["if (threadIdx.x == 0) {", *("    " + x for x in em.take_row_lines() + row_stores), "}"] if row_stores else []
    text = [
        PRELUDE,
        f"__device__ __forceinline__ void cg_run({entry_params(spec)}) {{",
        "    using cg_idx = long long;",
        f"    const cg_idx cg_cols = {em.cols};",
        *("    " + x for x in each("__shared__ {t} cg_s{k}[BLOCK];")),
        f"    for (cg_idx cg_row = blockIdx.x; cg_row < {em.rows}; cg_row += gridDim.x) {{",
        "        const cg_idx cg_obase = cg_row * cg_cols;",
        *("        " + x for x in bases + before + row_defs + each("{t} cg_carry{k} = 0;")),
        *("        " + x for x in (f"float cg_acc{r.index} = {IDENTITY[r.kind]};" for r in after)),
        "        for (cg_idx cg_t = 0; cg_t < cg_cols; cg_t += static_cast<cg_idx>(BLOCK) * ITEMS) {",
        "            const cg_idx cg_c0 = cg_t + static_cast<cg_idx>(threadIdx.x) * ITEMS;",
        "            // This thread's running sums over its ITEMS consecutive columns.",
        *("            " + x for x in each("{t} cg_v{k}[ITEMS];", "{t} cg_run{k} = 0;")),
        "            #pragma unroll",
        "            for (int cg_i = 0; cg_i < ITEMS; ++cg_i) {",
        "                const cg_idx cg_c = cg_c0 + cg_i;",
        *("                " + x for x in each("if (cg_c < cg_cols) cg_run{k} += static_cast<{t}>({b});",
                                                 "cg_v{k}[cg_i] = cg_run{k};")),
        "            }",
        "            // The threads' totals scanned across the block (inclusive).",
        *("            " + x for x in each("cg_s{k}[threadIdx.x] = cg_run{k};")),
        "            __syncthreads();",
        "            for (int cg_off = 1; cg_off < BLOCK; cg_off <<= 1) {",
        *("                " + x for x in each("const {t} cg_a{k} = threadIdx.x >= cg_off ? cg_s{k}[threadIdx.x - cg_off] : static_cast<{t}>(0);")),
        "                __syncthreads();",
        *("                " + x for x in each("cg_s{k}[threadIdx.x] += cg_a{k};")),
        "                __syncthreads();",
        "            }",
        *("            " + x for x in each("const {t} cg_excl{k} = cg_carry{k} + (threadIdx.x > 0 ? cg_s{k}[threadIdx.x - 1] : static_cast<{t}>(0));")),
        *("            " + x for x in each("cg_carry{k} += cg_s{k}[BLOCK - 1];")),
        "            __syncthreads();  // the next tile's totals overwrite the shared sums",
        "            #pragma unroll",
        "            for (int cg_i = 0; cg_i < ITEMS; ++cg_i) {",
        "                const cg_idx cg_c = cg_c0 + cg_i;",
        "                if (cg_c < cg_cols) {",
        *("                    " + x for x in each("const {t} cg_x{k} = cg_excl{k} + cg_v{k}[cg_i];") + stores),
        "                }",
        "            }",
        "        }",
        *("        " + x for x in ends),
        "    }",
        "}",
        "",
        *block_entry(spec),
    ]
    tune = {"BLOCK": (256, 512, 1024, 128), "ITEMS": (4, 1, 2, 8)}
    head = header(rows_grid(program.rows), "(BLOCK,)", tune, "scan/block: a row per block in tiles of BLOCK * ITEMS columns, "
                  "running sums per thread, the threads' totals scanned in shared memory", spec)
    return Schedule("codegen:scan/block", head + "\n".join(text) + "\n")
