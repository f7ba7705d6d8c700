"""Transpose schedules: a 2-D transpose (a layout change) through shared memory.

- ``transpose/tiled``: tiles of 32 x 32 blocks of VW x VW elements, each block transposed in
  registers, VW-wide vector loads and stores both ways (scalar where a row length or pointer
  forbids them), conflict-free shared memory.
- ``transpose/wide``: TILE x TILE tiles, 16-byte vectors both ways, XOR-swizzled shared memory;
  coalesced single elements on a side whose rows are off vector boundaries.
"""

from __future__ import annotations

from agents.embedded.codegen.cuda_text import PRELUDE
from agents.embedded.codegen.emit import Emitter, Schedule, c_size, entry_args, entry_params, header
from agents.embedded.codegen.ir import Program
from kernels.spec import SCALAR, KernelSpec


def _element_bytes(spec: KernelSpec, dtype: str) -> int:
    """The largest size an argument of ``dtype`` takes over the spec's run dtypes."""
    import torch

    return max(getattr(torch, d).itemsize for d in (spec.dtypes if dtype == SCALAR else (dtype,)))


def _entry(spec: KernelSpec) -> str:
    """The entry point: one call of ``cg_run`` (blocks of at most 512 threads)."""
    return (f'extern "C" __global__ void __launch_bounds__(512) {spec.name}({entry_params(spec)}) {{\n'
            f"    cg_run({entry_args(spec)});\n}}\n")


def _store_lines(out: str, ct_out: str, width: str, start: str, var: str, indent: str) -> list[str]:
    """Stores pack ``o`` at output row ``j`` from column ``start``: one vector store where the
    row holds the whole pack and vectors are allowed (``cg_vstore``), else element by element."""
    return [
        f"{indent}if (cg_vstore && {start} + {width} <= cg_rows) {{",
        f"{indent}    cg_store<{ct_out}, {width}>({out} + j * cg_rows + {start}, o);",
        f"{indent}}} else {{",
        "#pragma unroll",
        f"{indent}    for (int {var} = 0; {var} < {width}; ++{var}) if ({start} + {var} < cg_rows) "
        f"{out}[j * cg_rows + {start} + {var}] = o.v[{var}];",
        f"{indent}}}",
    ]


def transpose(spec: KernelSpec, program: Program) -> Schedule:
    """Tiles of 32 x 32 blocks of VW x VW elements. A thread reads VW rows of one VW-wide
    vector, transposes the VW x VW block in registers and parks its VW columns in shared
    memory as VW-wide words (one plane per column, rows padded to 33 words: conflict-free both
    ways); the write side reads them back along the tile's other axis and stores VW-wide
    vectors of the output rows. Scalar code where a row length or a pointer forbids vectors."""
    assert program.transposed is not None
    arg, rows, cols = program.transposed
    out = next(iter(program.outputs))
    em = Emitter(spec, program)
    ct_in, ct_out = em.c_type(arg), em.c_type(out)
    size = max(_element_bytes(spec, em.dtypes[arg]), _element_bytes(spec, em.dtypes[out]))
    # Shared memory: VW planes of 32 x 33 words of VW elements; at most 32 bytes per block of
    # VW x VW keeps it under 34 KB, inside the 48 KB a static array may take.
    widths = tuple(w for w in (2, 4, 1) if w * w * size <= 32) or (1,)
    text = [
        PRELUDE,
        f"__device__ __forceinline__ void cg_run({entry_params(spec)}) {{",
        f"    __shared__ Pack<{ct_in}, VW> cg_tile[VW][32][33];",
        f"    const long long cg_rows = {c_size(rows)};",
        f"    const long long cg_cols = {c_size(cols)};",
        "    const long long cg_tiles_x = (cg_cols + 32 * VW - 1) / (32 * VW);",
        "    const long long cg_i0 = static_cast<long long>(blockIdx.x) / cg_tiles_x * (32 * VW);",
        "    const long long cg_j0 = static_cast<long long>(blockIdx.x) % cg_tiles_x * (32 * VW);",
        "    // Vectors only where every row starts on a vector boundary.",
        f"    const bool cg_vload = cg_cols % VW == 0 && cg_aligned({arg}, sizeof(Pack<{ct_in}, VW>));",
        f"    const bool cg_vstore = cg_rows % VW == 0 && cg_aligned({out}, sizeof(Pack<{ct_out}, VW>));",
        "    const long long cg_j = cg_j0 + static_cast<long long>(threadIdx.x) * VW;",
        "    for (int s = threadIdx.y; s < 32; s += blockDim.y) {",
        f"        Pack<{ct_in}, VW> a[VW];",
        "#pragma unroll",
        "        for (int r = 0; r < VW; ++r) {",
        "            const long long i = cg_i0 + static_cast<long long>(s) * VW + r;",
        "            if (i >= cg_rows) continue;",
        "            if (cg_vload && cg_j + VW <= cg_cols) {",
        f"                a[r] = *reinterpret_cast<const Pack<{ct_in}, VW>*>({arg} + i * cg_cols + cg_j);",
        "            } else {",
        "#pragma unroll",
        f"                for (int c = 0; c < VW; ++c) if (cg_j + c < cg_cols) a[r].v[c] = {arg}[i * cg_cols + cg_j + c];",
        "            }",
        "        }",
        "#pragma unroll",
        "        for (int c = 0; c < VW; ++c) {",
        f"            Pack<{ct_in}, VW> b;",
        "#pragma unroll",
        "            for (int r = 0; r < VW; ++r) b.v[r] = a[r].v[c];",
        "            cg_tile[c][s][threadIdx.x] = b;",
        "        }",
        "    }",
        "    __syncthreads();",
        "    const long long cg_i = cg_i0 + static_cast<long long>(threadIdx.x) * VW;",
        "    if (cg_i >= cg_rows) return;",
        "    for (int s = threadIdx.y; s < 32; s += blockDim.y) {",
        "#pragma unroll",
        "        for (int c = 0; c < VW; ++c) {",
        "            const long long j = cg_j0 + static_cast<long long>(s) * VW + c;",
        "            if (j >= cg_cols) continue;",
        f"            const Pack<{ct_in}, VW> b = cg_tile[c][threadIdx.x][s];",
        f"            Pack<{ct_out}, VW> o;",
        "#pragma unroll",
        f"            for (int r = 0; r < VW; ++r) o.v[r] = static_cast<{ct_out}>(b.v[r]);",
        *_store_lines(out, ct_out, "VW", "cg_i", "r", " " * 12),
        "        }",
        "    }",
        "}",
    ]
    grid = f"(cdiv({cols}, 32 * VW) * cdiv({rows}, 32 * VW),)"
    tune = {"VW": widths, "TY": (8, 4, 16)}
    head = header(grid, "(32, TY)", tune, "transpose/tiled: 32 x 32 blocks of VW x VW elements through shared memory, "
                   "VW-wide vectors both ways", spec)
    return Schedule("codegen:transpose/tiled", head + "\n".join(text) + "\n" + _entry(spec))


def transpose_wide(spec: KernelSpec, program: Program) -> Schedule:
    """TILE x TILE tiles moved with 16-byte vectors both ways. A thread issues all its loads
    into registers first, then parks the whole vectors in shared memory, XOR-swizzled by the
    row's vector group so that neither the vector writes nor the column reads on the way out
    collide on a bank; each thread then gathers VL elements of one tile column and stores them
    as one vector of the output row. Where a row length or a pointer forbids vectors, that side
    moves single elements with consecutive threads on consecutive elements of a row."""
    assert program.transposed is not None
    arg, rows, cols = program.transposed
    out = next(iter(program.outputs))
    em = Emitter(spec, program)
    ct_in, ct_out = em.c_type(arg), em.c_type(out)
    size = _element_bytes(spec, em.dtypes[arg])
    # A tile of at most 16 KB of input elements (a thread's share of it is held in registers
    # between the loads and the shared-memory stores: a 32 KB tile spilled at 128 threads), and
    # at least two vectors along its rows.
    tiles = tuple(t for t in (64, 128, 32) if t * t * size <= 16 * 1024 and t * size >= 32) or (32,)
    vl = f"(16 / static_cast<int>(sizeof({ct_in})))"
    text = [
        PRELUDE,
        f"constexpr int VL = {vl};  // elements of one 16-byte input vector",
        "constexpr int GROUPS = TILE / VL;  // vectors along a tile row",
        "constexpr int CG_ELEMS = (TILE * TILE + NT - 1) / NT;  // elements per thread on the scalar load path",
        "// The vector group where tile row r keeps its group g: XOR-swizzled by r's group of VL rows,",
        "// so the VL rows a thread reads down a column on the way out lie in different banks.",
        "__device__ __forceinline__ int cg_swizzle(int r, int g) { return g ^ ((r / VL) % GROUPS); }",
        "// At file scope, so that the out-of-line scalar paths below reach it as shared memory.",
        f"__shared__ Pack<{ct_in}, VL> cg_tile[TILE][GROUPS];",
        "",
        "// The scalar paths (a side whose rows are off vector boundaries: rare) are out of line, so",
        "// that the vector paths' code follows the entry: inline, the compiler laid the unrolled",
        "// scalar load first, ~11 KB the common launch jumped over (nvdisasm, sm_90, TILE=64).",
        f"__device__ __noinline__ void cg_load_scalar(const {ct_in}* __restrict__ {arg}, long long cg_rows, "
        "long long cg_cols, long long cg_i0, long long cg_j0) {",
        "    // Consecutive threads read consecutive elements of a row (a thread reading VL elements in",
        "    // a row would spread a warp's loads over 32 / GROUPS rows, VL loads into the same sectors).",
        "#pragma unroll",
        "    for (int k = 0; k < CG_ELEMS; ++k) {",
        "        const int w = threadIdx.x + k * NT, r = w / TILE, c = w % TILE;",
        "        const long long i = cg_i0 + r, j = cg_j0 + c;",
        f"        if (w < TILE * TILE && i < cg_rows && j < cg_cols) cg_tile[r][cg_swizzle(r, c / VL)].v[c % VL] = {arg}[i * cg_cols + j];",
        "    }",
        "}",
        "",
        f"__device__ __noinline__ void cg_store_scalar({ct_out}* __restrict__ {out}, long long cg_rows, "
        "long long cg_cols, long long cg_i0, long long cg_j0) {",
        "    // Consecutive threads take consecutive tile rows, so each warp store fills consecutive",
        "    // elements of one output row (a thread storing VL elements of a row would touch",
        "    // 32 / GROUPS rows' sectors VL times each). A thread reads one vector of its tile row (VL",
        "    // tile columns) and stores its VL elements to VL output rows: one shared-memory read",
        "    // instead of VL, in half the wavefronts at 16-bit elements.",
        "    for (int w = threadIdx.x; w < TILE * GROUPS; w += NT) {",
        "        const int g = w / TILE, r = w % TILE;",
        "        const long long i = cg_i0 + r;",
        "        if (i >= cg_rows) continue;",
        f"        const Pack<{ct_in}, VL> b = cg_tile[r][cg_swizzle(r, g)];",
        "#pragma unroll",
        "        for (int e = 0; e < VL; ++e) {",
        "            const long long j = cg_j0 + static_cast<long long>(g) * VL + e;",
        f"            if (j < cg_cols) {out}[j * cg_rows + i] = static_cast<{ct_out}>(b.v[e]);",
        "        }",
        "    }",
        "}",
        "",
        f"__device__ __forceinline__ void cg_run({entry_params(spec)}) {{",
        f"    const long long cg_rows = {c_size(rows)};",
        f"    const long long cg_cols = {c_size(cols)};",
        "    // Tiles of one block row are consecutive blocks; blockIdx.x and the tile count fit 32 bits.",
        "    const unsigned cg_tiles_x = static_cast<unsigned>((cg_cols + TILE - 1) / TILE);",
        "    const long long cg_i0 = static_cast<long long>(blockIdx.x / cg_tiles_x) * TILE;",
        "    const long long cg_j0 = static_cast<long long>(blockIdx.x % cg_tiles_x) * TILE;",
        f"    const bool cg_vload = cg_cols % VL == 0 && cg_aligned({arg}, 16);",
        f"    const bool cg_vstore = cg_rows % VL == 0 && cg_aligned({out}, sizeof(Pack<{ct_out}, VL>));",
        "    if (cg_vload) {",
        "        // Every load of a thread is issued before the first shared-memory store, so they are all",
        "        // in flight together (a load-store loop waits for each load before the next).",
        "        constexpr int PER = (TILE * GROUPS + NT - 1) / NT;  // vectors per thread",
        f"        Pack<{ct_in}, VL> cg_a[PER];",
        "#pragma unroll",
        "        for (int k = 0; k < PER; ++k) {",
        "            const int v = threadIdx.x + k * NT;",
        "            const int r = v / GROUPS, g = v % GROUPS;",
        "            const long long i = cg_i0 + r, j = cg_j0 + static_cast<long long>(g) * VL;",
        f"            if (v < TILE * GROUPS && i < cg_rows && j < cg_cols) cg_a[k] = *reinterpret_cast<const Pack<{ct_in}, VL>*>({arg} + i * cg_cols + j);",
        "        }",
        "#pragma unroll",
        "        for (int k = 0; k < PER; ++k) {",
        "            const int v = threadIdx.x + k * NT;",
        "            const int r = v / GROUPS, g = v % GROUPS;",
        "            if (v < TILE * GROUPS) cg_tile[r][cg_swizzle(r, g)] = cg_a[k];",
        "        }",
        "    } else {",
        f"        cg_load_scalar({arg}, cg_rows, cg_cols, cg_i0, cg_j0);",
        "    }",
        "    __syncthreads();",
        "    if (cg_vstore) {",
        "        for (int w = threadIdx.x; w < TILE * GROUPS; w += NT) {",
        "            const int c = w / GROUPS, g = w % GROUPS;  // tile column c, input rows g*VL ... g*VL+VL-1",
        "            const long long j = cg_j0 + c, i = cg_i0 + static_cast<long long>(g) * VL;",
        "            if (j >= cg_cols || i >= cg_rows) continue;  // a whole vector of the row when i is in it",
        f"            Pack<{ct_out}, VL> o;",
        "#pragma unroll",
        f"            for (int e = 0; e < VL; ++e) o.v[e] = static_cast<{ct_out}>(cg_tile[g * VL + e][cg_swizzle(g * VL, c / VL)].v[c % VL]);",
        f"            cg_store<{ct_out}, VL>({out} + j * cg_rows + i, o);",
        "        }",
        "    } else {",
        f"        cg_store_scalar({out}, cg_rows, cg_cols, cg_i0, cg_j0);",
        "    }",
        "}",
    ]
    grid = f"(cdiv({cols}, TILE) * cdiv({rows}, TILE),)"
    tune = {"TILE": tiles, "NT": (256, 128, 512)}
    head = header(grid, "(NT,)", tune, "transpose/wide: TILE x TILE tiles, 16-byte vectors both ways through swizzled "
                   "shared memory", spec)
    return Schedule("codegen:transpose/wide", head + "\n".join(text) + "\n" + _entry(spec))
