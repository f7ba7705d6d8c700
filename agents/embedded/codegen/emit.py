"""CUDA from a :class:`~agents.embedded.codegen.ir.Program`, by schedule templates.

Schedules (each choice a ``// tune:`` parameter):

- ``elementwise/rows``: blocks over (row, column chunk); 16-byte vector loads and stores of
  every tensor when the row length, strides, offsets and pointers allow it, else scalar code;
  a scalar tail for the last partial vector. ``elementwise/flat``: the same over one flat row
  of R*C elements, when every access is contiguous.
- ``rows/warp`` (one row per warp, ROWS rows per block), ``rows/block`` (a row per group of
  threads sized to the row, short rows several to a block) and ``rows/cluster`` (sm_90: below
  SPLIT rows a row split over a cluster of CL blocks, partials combined through distributed
  shared memory; else as rows/block): one pass over the row per level of dependent reductions,
  the first ITEMS vectors of each thread kept in registers between passes, the rest re-read;
  fp32 accumulation, warp shuffles then shared memory across warps. ``+online`` (block and
  cluster): a max and a sum of exp(x - max) over the same row in one pass (online softmax).
- ``transpose/tiled``: tiles of 32 x 32 blocks of VW x VW elements through shared memory,
  each block transposed in registers, VW-wide vector loads and stores both ways (scalar where
  a row length or pointer forbids them), conflict-free shared memory. ``transpose/wide``:
  TILE x TILE tiles, 16-byte vectors both ways, XOR-swizzled shared memory.

All offsets are 64-bit. The entry point has the spec's exact name and argument list.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from agents.embedded.codegen.ir import (
    BOOL,
    COMPARE,
    FLOAT,
    INT,
    UNARY,
    AtColumn,
    Const,
    Load,
    Op,
    Param,
    Program,
    Reduce,
    ctype_of,
    walk,
)
from agents.embedded.codegen.trace import Unsupported
from kernels.spec import _C_TYPES, SCALAR, KernelSpec

_PRELUDE = """\
constexpr int VEC = 16 / sizeof(scalar_t);

// V elements of T, aligned for one (or, past 16 bytes, several) wide loads.
template <typename T, int V>
struct alignas(sizeof(T) * V >= 16 ? 16 : sizeof(T) * V) Pack {
    T v[V];
};

// Maximum and minimum that keep NaN, as torch does (fmaxf would drop it).
__device__ __forceinline__ float cg_max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
__device__ __forceinline__ float cg_min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
__device__ __forceinline__ float cg_relu(float a) { return a != a ? a : fmaxf(a, 0.0f); }

__device__ __forceinline__ bool cg_aligned(const void* p, unsigned bytes) {
    return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

template <int OP>
__device__ __forceinline__ float cg_combine(float a, float b) {
    return OP == 0 ? a + b : (OP == 1 ? cg_max(a, b) : cg_min(a, b));
}

template <int OP>
__device__ __forceinline__ float cg_warp_reduce(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = cg_combine<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Reduces over the blockDim.x threads of one row (threadIdx.y): every thread gets the result.
// Called by every thread of the block (rows past the end too), so the barriers are uniform.
template <int OP>
__device__ __forceinline__ float cg_group_reduce(float v, float identity) {
    __shared__ float part[32][33];
    v = cg_warp_reduce<OP>(v);
    if (blockDim.x > 32) {
        const int lane = threadIdx.x & 31;
        __syncthreads();  // the previous reduction's reads of part are done
        if (lane == 0) part[threadIdx.y][threadIdx.x >> 5] = v;
        __syncthreads();
        v = lane < static_cast<int>(blockDim.x >> 5) ? part[threadIdx.y][lane] : identity;
        v = cg_warp_reduce<OP>(v);
    }
    return v;
}
"""

# Hopper thread-block clusters (sm_90): the CL blocks of one row synchronise with the cluster
# barrier and read each other's shared memory (distributed shared memory), so a row is split
# over CL SMs without a second kernel or a workspace. Only worth it when there are too few rows
# to fill the GPU: with SPLIT rows or more, each block of a cluster takes a row of its own.
_CLUSTER_PRELUDE = """\
__device__ __forceinline__ void cg_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ float cg_cluster_read(const float* p, unsigned rank) {
    const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
    unsigned remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

// The block's reduction, then the CL blocks' partials combined in rank order (so every block
// of the cluster gets the same bits). The first barrier keeps a block from overwriting its
// partial while another still reads the previous one.
template <int OP>
__device__ __forceinline__ float cg_cluster_reduce(float v, float identity, bool split) {
    __shared__ float cg_partial;
    v = cg_group_reduce<OP>(v, identity);
    if (!split) return v;  // the same for every block of the cluster: the barriers stay uniform
    cg_cluster_sync();
    if (threadIdx.x == 0) cg_partial = v;
    cg_cluster_sync();
    float acc = identity;
#pragma unroll
    for (int r = 0; r < CL; ++r) acc = cg_combine<OP>(acc, cg_cluster_read(&cg_partial, r));
    return acc;
}
"""

# Online softmax statistics: a max m and a sum s of exp(x - m) in one pass over the row instead
# of two (Milakov and Gimelshein, 2018). The pair (m, s) rescales s whenever m grows.
# Elements of -inf and empty pairs add nothing; NaN makes both NaN (as cg_max keeps NaN); the
# caller's fix-up (cg_online_end) gives NaN where the two-pass formula does: a max of +-inf.
_ONLINE_PRELUDE = """\
__device__ __forceinline__ void cg_online(float& m, float& s, float x) {
    if (x != x || m != m) { m = m + x; s = s + x; return; }
    if (x > m) { s = (s == 0.0f ? 0.0f : s * expf(m - x)) + 1.0f; m = x; }
    else if (x != __int_as_float(0xff800000)) { s += expf(x - m); }
}

// Commutative (the same bits whichever pair comes first), so butterfly shuffles agree.
__device__ __forceinline__ void cg_online_combine(float& m, float& s, float m2, float s2) {
    if (m != m || m2 != m2) { m = m + m2; s = s + s2; return; }
    const float top = fmaxf(m, m2);
    const float a = s == 0.0f ? 0.0f : s * expf(m - top);
    const float b = s2 == 0.0f ? 0.0f : s2 * expf(m2 - top);
    m = top;
    s = a + b;
}

__device__ __forceinline__ void cg_online_warp(float& m, float& s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        cg_online_combine(m, s, m2, s2);
    }
}

// Over the blockDim.x threads of one row, as cg_group_reduce: every thread gets the pair.
__device__ __forceinline__ void cg_online_group(float& m, float& s) {
    __shared__ float pm[32][33], ps[32][33];
    cg_online_warp(m, s);
    if (blockDim.x > 32) {
        const int lane = threadIdx.x & 31;
        __syncthreads();
        if (lane == 0) { pm[threadIdx.y][threadIdx.x >> 5] = m; ps[threadIdx.y][threadIdx.x >> 5] = s; }
        __syncthreads();
        const bool has = lane < static_cast<int>(blockDim.x >> 5);
        m = has ? pm[threadIdx.y][lane] : __int_as_float(0xff800000);
        s = has ? ps[threadIdx.y][lane] : 0.0f;
        cg_online_warp(m, s);
    }
}

// The two-pass formula's sum for a max of +-inf (a row of -inf only, or one holding +inf): NaN.
__device__ __forceinline__ float cg_online_end(float m, float s, long long cols) {
    return (cols > 0 && (m == __int_as_float(0xff800000) || m == __int_as_float(0x7f800000)))
        ? __int_as_float(0x7fffffff) : s;
}
"""

_CLUSTER_ONLINE_PRELUDE = """\
// The pair over the CL blocks of a split row, folded in rank order as cg_cluster_reduce does.
__device__ __forceinline__ void cg_cluster_online(float& m, float& s, bool split) {
    __shared__ float cg_pm, cg_ps;
    cg_online_group(m, s);
    if (!split) return;
    cg_cluster_sync();
    if (threadIdx.x == 0) { cg_pm = m; cg_ps = s; }
    cg_cluster_sync();
    m = __int_as_float(0xff800000);
    s = 0.0f;
#pragma unroll
    for (int r = 0; r < CL; ++r) cg_online_combine(m, s, cg_cluster_read(&cg_pm, r), cg_cluster_read(&cg_ps, r));
}
"""

_POS_INF = "__int_as_float(0x7f800000)"
_NEG_INF = "__int_as_float(0xff800000)"
_IDENTITY = {"sum": "0.0f", "max": _NEG_INF, "min": _POS_INF}
_OPCODE = {"sum": 0, "max": 1, "min": 2}


@dataclass(frozen=True)
class Schedule:
    """One generated variant: its plan name and its source."""

    name: str
    source: str


def c_size(expr: str) -> str:
    """A launch-style size expression (``2 * d``) as 64-bit C."""
    terms = [f"{t}LL" if t.isdigit() else f"static_cast<long long>({t})" for t in expr.split(" * ")]
    return "(" + " * ".join(terms) + ")"


def _float_literal(x: float) -> str:
    if math.isnan(x):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(x):
        return _POS_INF if x > 0 else _NEG_INF
    return f"{float(x)!r}f"


class _Emitter:
    """Writes statements for the expressions of one program."""

    def __init__(self, spec: KernelSpec, program: Program) -> None:
        self.spec = spec
        self.p = program
        self.cols = c_size(program.cols)
        self.rows = c_size(program.rows)
        self.dtypes = program.dtypes
        self.names: dict[int, str] = {}
        self.counter = 0
        self.row_lines: list[str] = []
        self.row_done: dict[int, str] = {}
        self.full_leaves: list[Load] = []
        for node in walk(program.all_roots()):
            if isinstance(node, Load) and node.access in ("full", "gather") and node not in self.full_leaves:
                self.full_leaves.append(node)
        self.row_loads: list[Load] = [n for n in walk(program.all_roots()) if isinstance(n, Load) and n.access in ("row", "scalar")]
        self._row_only: dict[int, bool] = {}

    # ---- types
    def c_type(self, arg: str) -> str:
        d = self.dtypes[arg]
        return "scalar_t" if d == SCALAR else _C_TYPES[d]

    def is_float_arg(self, arg: str) -> bool:
        return self.dtypes[arg] in (SCALAR, "float32", "float16", "bfloat16")

    def kind(self, node: object) -> str:
        k = ctype_of(node)
        if k == "load":
            assert isinstance(node, Load)
            return FLOAT if self.is_float_arg(node.arg) else INT
        return k

    def c_kind(self, kind: str) -> str:
        return {FLOAT: "float", INT: "long long", BOOL: "bool"}[kind]

    # ---- spaces
    def row_only(self, node: object) -> bool:
        """True when the value depends on the row alone (computed once per row)."""
        key = id(node)
        if key not in self._row_only:
            if isinstance(node, Load):
                res = node.access in ("row", "scalar")
            elif isinstance(node, Reduce | AtColumn | Const | Param):
                res = True
            elif isinstance(node, Op):
                res = all(self.row_only(a) for a in node.args)
            else:
                res = True
            self._row_only[key] = res
        return self._row_only[key]

    def take_row_lines(self) -> list[str]:
        """The row values defined since the last call, in order (for the caller to place)."""
        lines, self.row_lines = self.row_lines, []
        return lines

    def used_leaves(self, exprs: list[tuple[str, object]]) -> set[int]:
        """Indices of the full leaves that ``exprs`` read."""
        return {self.full_leaves.index(n) for _, e in exprs for n in walk([e])
                if isinstance(n, Load) and n in self.full_leaves}

    def fresh(self) -> str:
        self.counter += 1
        return f"cg_t{self.counter}"

    # ---- leaves
    def leaf_base(self, leaf: Load) -> str:
        i = self.full_leaves.index(leaf)
        return f"cg_base{i}"

    def leaf_bases(self, row: str) -> list[str]:
        """Per full leaf, its row's first element (64-bit)."""
        out = []
        for i, leaf in enumerate(self.full_leaves):
            stride = self.cols if leaf.row_stride == "C" else c_size(leaf.row_stride)
            if leaf.access == "gather":
                idx = self.row_expr(leaf.index)
                out.append(f"const long long cg_base{i} = static_cast<long long>({idx}) * {stride};")
            else:
                out.append(f"const long long cg_base{i} = {row} * {stride} + {c_size(leaf.offset)};")
        return out

    # ---- row values
    def row_expr(self, node: object) -> str:
        """The C name or literal of a row-only value, defining it in ``row_lines`` once."""
        if isinstance(node, Const):
            return self.literal(node)
        if isinstance(node, Param):
            return "static_cast<float>(" + self.cols + ")" if node.name == "__cols" else node.name
        key = id(node)
        if key in self.row_done:
            return self.row_done[key]
        if isinstance(node, Reduce):
            return f"cg_red{node.index}"
        if isinstance(node, Load):
            value = f"{node.arg}[{'cg_row' if node.access == 'row' else '0'}]"
            text = self.convert_load(node.arg, value)
        elif isinstance(node, AtColumn):
            col = self.row_expr(node.column)
            name = self.fresh() + "_col"
            self.row_lines.append(f"const long long {name} = static_cast<long long>({col});")
            text = self.scalar_expr(node.body, name)
        else:
            assert isinstance(node, Op)
            text = self.op_text(node, [self.row_expr(a) for a in node.args])
        name = self.fresh()
        self.row_lines.append(f"const {self.c_kind(self.kind(node))} {name} = {text};")
        self.row_done[key] = name
        return name

    def scalar_expr(self, node: object, col: str) -> str:
        """A full expression at one column (a gather by index), with scalar loads."""
        if self.row_only(node):
            return self.row_expr(node)
        if isinstance(node, Load):
            if node.access == "col":
                return self.convert_load(node.arg, f"{node.arg}[{col}]")
            return self.convert_load(node.arg, f"{node.arg}[{self.leaf_base(node)} + {col}]")
        assert isinstance(node, Op)
        return self.op_text(node, [self.scalar_expr(a, col) for a in node.args])

    def convert_load(self, arg: str, value: str) -> str:
        kind = "float" if self.is_float_arg(arg) else "long long"
        return f"static_cast<{kind}>({value})"

    def literal(self, c: Const) -> str:
        if c.ctype == BOOL:
            return "true" if c.value else "false"
        if c.ctype == INT:
            return f"{int(c.value)}LL"
        return _float_literal(float(c.value))

    def op_text(self, node: Op, args: list[str]) -> str:
        name = node.name
        kinds = [self.kind(a) for a in node.args]
        if name == "pow":
            exponent = node.args[1]
            if isinstance(exponent, Const) and float(exponent.value) == 2.0:
                return f"({args[0]} * {args[0]})"
            if isinstance(exponent, Const) and float(exponent.value) == 0.5:
                return f"sqrtf({args[0]})"
            if isinstance(exponent, Const) and float(exponent.value) == 1.0:
                return args[0]
            return f"powf({args[0]}, static_cast<float>({args[1]}))"
        if name in UNARY:
            return UNARY[name].format(*args)
        if name == "gelu":
            return f"(0.5f * {args[0]} * (1.0f + erff({args[0]} * 0.70710678118654752f)))"
        if name == "gelu_tanh":
            a = args[0]
            return f"(0.5f * {a} * (1.0f + tanhf(0.7978845608028654f * ({a} + 0.044715f * {a} * {a} * {a}))))"
        if name in ("add", "sub", "mul", "div"):
            sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[name]
            if node.ctype == FLOAT or FLOAT in kinds:
                return f"(static_cast<float>({args[0]}) {sym} static_cast<float>({args[1]}))"
            return f"({args[0]} {sym} {args[1]})"
        if name in ("maximum", "minimum"):
            fn = "cg_max" if name == "maximum" else "cg_min"
            return f"{fn}(static_cast<float>({args[0]}), static_cast<float>({args[1]}))"
        if name == "atan2":
            return f"atan2f({args[0]}, {args[1]})"
        if name in COMPARE:
            if FLOAT in kinds:
                return f"(static_cast<float>({args[0]}) {COMPARE[name]} static_cast<float>({args[1]}))"
            return f"({args[0]} {COMPARE[name]} {args[1]})"
        if name == "not":
            return f"(!{args[0]})"
        if name in ("and", "or"):
            return f"({args[0]} {'&&' if name == 'and' else '||'} {args[1]})"
        if name == "where":
            t = self.c_kind(node.ctype)
            return f"({args[0]} ? static_cast<{t}>({args[1]}) : static_cast<{t}>({args[2]}))"
        if name == "tofloat":
            return f"static_cast<float>({args[0]})"
        if name == "round_to":
            return f"static_cast<float>(static_cast<{node.extra[0]}>({args[0]}))"
        if name == "tobool":
            return f"({args[0]} != 0)"
        if name == "toint":
            return f"static_cast<long long>(static_cast<{node.extra[0]}>(static_cast<long long>({args[0]})))"
        raise Unsupported(f"no C for op {name}")

    # ---- element bodies
    def element_expr(self, node: object, leaf: dict[int, str], lines: list[str], memo: dict[int, str]) -> str:
        """A full expression for element ``e`` of the current vector, as statements in ``lines``."""
        if self.row_only(node):
            return self.row_expr(node)
        key = id(node)
        if key in memo:
            return memo[key]
        if isinstance(node, Load):
            text = leaf[key]
        else:
            assert isinstance(node, Op)
            args = [self.element_expr(a, leaf, lines, memo) for a in node.args]
            name = self.fresh()
            lines.append(f"const {self.c_kind(node.ctype)} {name} = {self.op_text(node, args)};")
            text = name
        memo[key] = text
        return text

    def store_value(self, arg: str, value: str, kind: str) -> str:
        ct = self.c_type(arg)
        if ct in ("scalar_t", "__half", "__nv_bfloat16", "float"):
            return f"static_cast<{ct}>(static_cast<float>({value}))"
        if kind == FLOAT:
            return f"static_cast<{ct}>(static_cast<long long>({value}))"
        return f"static_cast<{ct}>({value})"

    def col_leaves(self) -> list[Load]:
        return [n for n in walk(self.p.all_roots()) if isinstance(n, Load) and n.access == "col"]

    def vector_ok(self, full_outputs: list[str]) -> str:
        """The run-time condition for the V-wide path (row length, strides, offsets, pointers)."""
        conds = [f"{self.cols} % VEC == 0"]
        for leaf in self.full_leaves:
            if leaf.row_stride != "C":
                conds.append(f"{c_size(leaf.row_stride)} % VEC == 0")
            if leaf.offset != "0":
                conds.append(f"{c_size(leaf.offset)} % VEC == 0")
        ptrs = {leaf.arg for leaf in self.full_leaves} | {leaf.arg for leaf in self.col_leaves()} | set(full_outputs)
        for arg in sorted(ptrs):
            conds.append(f"cg_aligned({arg}, sizeof({self.c_type(arg)}) * VEC >= 16 ? 16 : sizeof({self.c_type(arg)}) * VEC)")
        return " && ".join(conds)

    def chunk_body(self, exprs: list[tuple[str, object]], cached: set[int], fill: set[int],
                   col0: str, slot: str | None) -> list[str]:
        """Statements for one V-wide chunk at column ``col0``: loads (or register reads),
        then per element either a reduction update (``("red:K", body)``) or an output store
        (``("out:NAME", expr)``). Cached leaves in ``fill`` are loaded and kept in registers
        (slot ``slot``); other cached leaves are read from there."""
        lines: list[str] = []
        leaf_text: dict[int, str] = {}
        needed = [n for _, e in exprs for n in walk([e]) if isinstance(n, Load) and not self.row_only(n)]
        by_value: dict[Load, str] = {}  # equal loads reached through two paths are one load
        for leaf in needed:
            if leaf in by_value:
                leaf_text[id(leaf)] = by_value[leaf]
                continue
            self._leaf_code(leaf, cached, fill, col0, slot, lines, leaf_text)
            by_value[leaf] = leaf_text[id(leaf)]
        return self._element_loop(exprs, lines, leaf_text, col0)

    def _leaf_code(self, leaf: Load, cached: set[int], fill: set[int], col0: str, slot: str | None,
                   lines: list[str], leaf_text: dict[int, str]) -> None:
        """Loads one leaf's V elements (or reads them from registers) and names element e."""
        if leaf.access == "col":
            i = self.col_leaves().index(leaf)
            lines.append(f"const Pack<{self.c_type(leaf.arg)}, V> cg_c{i} = *reinterpret_cast<const Pack<{self.c_type(leaf.arg)}, V>*>({leaf.arg} + {col0});")
            leaf_text[id(leaf)] = self.convert_load(leaf.arg, f"cg_c{i}.v[e]")
            return
        i = self.full_leaves.index(leaf)
        if i in cached and slot is not None and i not in fill:
            leaf_text[id(leaf)] = f"cg_cache{i}[{slot}][e]"
            return
        lines.append(f"const Pack<{self.c_type(leaf.arg)}, V> cg_p{i} = *reinterpret_cast<const Pack<{self.c_type(leaf.arg)}, V>*>({leaf.arg} + cg_base{i} + {col0});")
        leaf_text[id(leaf)] = self.convert_load(leaf.arg, f"cg_p{i}.v[e]")
        if i in cached and slot is not None:
            lines.append(f"#pragma unroll\nfor (int e = 0; e < V; ++e) cg_cache{i}[{slot}][e] = {leaf_text[id(leaf)]};")
            leaf_text[id(leaf)] = f"cg_cache{i}[{slot}][e]"

    def _element_loop(self, exprs: list[tuple[str, object]], lines: list[str], leaf_text: dict[int, str],
                      col0: str) -> list[str]:
        """The per-element loop over the chunk: reduction updates and output stores."""
        outs = [(what, e) for what, e in exprs if what.startswith("out:")]
        for what, _ in outs:
            arg = what[4:]
            lines.append(f"Pack<{self.c_type(arg)}, V> cg_o_{arg};")
        lines.append("#pragma unroll")
        lines.append("for (int e = 0; e < V; ++e) {")
        memo: dict[int, str] = {}
        body: list[str] = []
        for what, expr in exprs:
            value = self.element_expr(expr, leaf_text, body, memo)
            if what.startswith("online:"):
                i_max, i_sum = what[7:].split(":")
                body.append(f"cg_online(cg_acc{i_max}, cg_acc{i_sum}, static_cast<float>({value}));")
            elif what.startswith("red:"):
                r = self.p.reductions[int(what[4:])]
                body.append(f"cg_acc{r.index} = cg_combine<{_OPCODE[r.kind]}>(cg_acc{r.index}, static_cast<float>({value}));")
            else:
                arg = what[4:]
                body.append(f"cg_o_{arg}.v[e] = {self.store_value(arg, value, self.kind(expr))};")
        lines += ["    " + b for b in body]
        lines.append("}")
        for what, _ in outs:
            arg = what[4:]
            lines.append(f"*reinterpret_cast<Pack<{self.c_type(arg)}, V>*>({arg} + cg_obase + {col0}) = cg_o_{arg};")
        return lines


def _params(spec: KernelSpec) -> str:
    out = []
    for a, (ctype, is_ptr) in zip(spec.args, spec.c_signature(), strict=True):
        if is_ptr:
            const = "const " if a.role == "in" else ""
            # inout tensors may be read and written through two names: no __restrict__ there.
            restrict = " __restrict__" if a.role != "inout" else ""
            out.append(f"{const}{ctype}*{restrict} {a.name}")
        else:
            out.append(f"{ctype} {a.name}")
    return ", ".join(out)


def _arg_names(spec: KernelSpec) -> str:
    return ", ".join(a.name for a in spec.args)


def _header(grid: str, block: str, tune: Mapping[str, tuple[int, ...]], what: str, spec: KernelSpec) -> str:
    lines = [f"// {spec.name}: generated from the traced reference ({what})."]
    lines.append(f"// launch: grid={grid} block={block} smem=0")
    lines += [f"// tune: {k}=" + ",".join(str(v) for v in vals) for k, vals in tune.items()]
    lines += [f"#ifndef {k}\n#define {k} {vals[0]}\n#endif" for k, vals in tune.items()]
    return "\n".join(lines) + "\n"


def _entry(spec: KernelSpec, bound: str, cond: str, call: str, attrs: str = "") -> str:
    return (
        f'extern "C" __global__ void __launch_bounds__({bound}){attrs} {spec.name}({_params(spec)}) {{\n'
        f"    if ({cond}) {{\n        {call.format(v='VEC')};\n    }} else {{\n        {call.format(v='1')};\n    }}\n}}\n"
    )


# ---------------------------------------------------------------- elementwise


def elementwise(spec: KernelSpec, program: Program, flat: bool) -> Schedule:
    em = _Emitter(spec, program)
    outputs = list(program.outputs)
    if flat:
        if any(leaf.access == "gather" or leaf.row_stride != "C" or leaf.offset != "0" for leaf in em.full_leaves) \
                or em.col_leaves() or any(n.access == "row" for n in em.row_loads):
            raise Unsupported("the flat schedule needs contiguous accesses only")
        em.cols = f"({em.rows} * {em.cols})"
        rows_launch, cols_launch = "1", f"{program.rows} * {program.cols}"
    else:
        rows_launch, cols_launch = program.rows, program.cols
    bases = em.leaf_bases("cg_row")
    bases = em.take_row_lines() + bases  # a gathered row's index is a row value: defined first
    body = em.chunk_body([(f"out:{n}", e) for n, (_, e) in program.outputs.items()], set(), set(), "cg_c", None)
    row_defs = em.take_row_lines()
    args = _arg_names(spec)
    text = [
        _PRELUDE,
        "// One V-wide chunk of one row at column cg_c (V = 1 for tails and unaligned data).",
        f"template <int V>\n__device__ __forceinline__ void cg_chunk_at({_params(spec)}, long long cg_row, long long cg_c) {{",
        f"    const long long cg_obase = cg_row * {em.cols};",
        *("    " + b for b in bases),
        *("    " + d for d in row_defs),
        *("    " + b for b in body),
        "}",
        "",
        f"template <int V>\n__device__ __forceinline__ void cg_run({_params(spec)}) {{",
        f"    const long long cg_cols = {em.cols};",
        "    const long long cg_size = static_cast<long long>(BLOCK) * 8 * ITEMS;",
        "    const long long cg_chunks = (cg_cols + cg_size - 1) / cg_size;",
        "    const long long cg_row = static_cast<long long>(blockIdx.x) / cg_chunks;",
        "    const long long cg_begin = static_cast<long long>(blockIdx.x) % cg_chunks * cg_size;",
        "    const long long cg_end = min(cg_cols, cg_begin + cg_size);",
        "    // Whole vectors, then what is left past the last whole vector one element at a time.",
        "    const long long cg_vend = cg_begin + (cg_end - cg_begin) / V * V;",
        "    for (long long cg_c = cg_begin + static_cast<long long>(threadIdx.x) * V; cg_c < cg_vend;",
        "         cg_c += static_cast<long long>(BLOCK) * V) {",
        f"        cg_chunk_at<V>({args}, cg_row, cg_c);",
        "    }",
        "    for (long long cg_c = cg_vend + threadIdx.x; cg_c < cg_end; cg_c += BLOCK) {",
        f"        cg_chunk_at<1>({args}, cg_row, cg_c);",
        "    }",
        "}",
    ]
    grid = f"(cdiv({cols_launch}, BLOCK * 8 * ITEMS),)" if flat else f"({rows_launch} * cdiv({cols_launch}, BLOCK * 8 * ITEMS),)"
    tune = {"BLOCK": (256, 128, 512), "ITEMS": (2, 1, 4)}
    name = "elementwise/flat" if flat else "elementwise/rows"
    head = _header(grid, "(BLOCK,)", tune, f"{name}: 16-byte vectors with a scalar tail, fp32 math", spec)
    call = "cg_run<{v}>(" + args + ")"
    return Schedule("codegen:" + name, head + "\n".join(text) + "\n" + _entry(spec, "BLOCK", em.vector_ok(outputs), call))


# ---------------------------------------------------------------- row reductions


def online_pairs(program: Program) -> dict[int, int]:
    """Sums of ``exp(x - max(x))`` over a row whose max is a reduction of the same ``x``, by
    the sum's index -> the max's index: each such pair can be computed in one pass."""
    pairs: dict[int, int] = {}
    for r in program.reductions:
        body = r.body
        if r.kind != "sum" or not (isinstance(body, Op) and body.name == "exp"):
            continue
        inner = body.args[0]
        if not (isinstance(inner, Op) and inner.name == "sub" and isinstance(inner.args[1], Reduce)):
            continue
        top = inner.args[1]
        if top.kind == "max" and top.body == inner.args[0] and top.index not in pairs.values():
            pairs[r.index] = top.index
    return pairs


def _levels(program: Program, fused: Mapping[int, int] | None = None) -> list[list[Reduce]]:
    """Reductions grouped so that each group depends only on earlier groups (one pass each);
    a sum in ``fused`` (sum -> max, see :func:`online_pairs`) goes with its max."""
    fused = fused or {}
    level: dict[int, int] = {}
    for r in program.reductions:  # in creation order: dependencies come first
        if r.index in fused:
            level[r.index] = level[fused[r.index]]
            continue
        inner = [n for n in walk([r.body]) if isinstance(n, Reduce) and n is not r]
        level[r.index] = 1 + max((level[n.index] for n in inner), default=-1)
    out: list[list[Reduce]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for r in program.reductions:
        out[level[r.index]].append(r)
    return out


def _pass(em: _Emitter, exprs: list[tuple[str, object]], cached: set[int], fill: set[int]) -> list[str]:
    """One pass over the row: the first ITEMS vectors of each thread (kept in registers), then
    the rest of the row, re-read."""
    regs = em.chunk_body(exprs, cached, fill, "cg_c", "cg_j")
    rest = em.chunk_body(exprs, cached, set(), "cg_c", None)
    return [
        "#pragma unroll",
        "for (int cg_j = 0; cg_j < ITEMS; ++cg_j) {",
        "    const long long cg_i = cg_lane + static_cast<long long>(cg_j) * cg_g;",
        "    if (cg_active && cg_i < cg_nvec) {",
        "        const long long cg_c = cg_i * V;",
        *("        " + b for b in regs),
        "    }",
        "}",
        "for (long long cg_i = cg_lane + static_cast<long long>(ITEMS) * cg_g; cg_active && cg_i < cg_nvec; cg_i += cg_g) {",
        "    const long long cg_c = cg_i * V;",
        *("    " + b for b in rest),
        "}",
    ]


def rowwise(spec: KernelSpec, program: Program, mode: str, online: bool = False) -> Schedule:
    """Row reductions then maps. ``mode``: ``warp`` (one row per warp), ``block`` (one row per
    block) or ``cluster`` (one row per cluster of CL blocks, sm_90). ``online``: each max and
    sum of exp(x - max) pair (:func:`online_pairs`; there must be one) in one pass."""
    em = _Emitter(spec, program)
    cluster = mode == "cluster"
    fused = online_pairs(program) if online else {}
    if online and not fused:
        raise Unsupported("no max and sum of exp(x - max) to compute online")
    partner = {i_max: i_sum for i_sum, i_max in fused.items()}
    reduce_fn = "cg_cluster_reduce" if cluster else "cg_group_reduce"
    cached = {i for i, leaf in enumerate(em.full_leaves) if em.is_float_arg(leaf.arg)}
    # Registers kept per thread: cached leaves x ITEMS x 8 floats, at most 64.
    items = tuple(v for v in (4, 2, 8, 1) if max(1, len(cached)) * v * 8 <= 64) or (1,)
    bases = em.leaf_bases("cg_row")
    lines = em.take_row_lines() + bases
    lines += [f"float cg_cache{i}[ITEMS][V];" for i in sorted(cached)]
    filled: set[int] = set()
    extra = ", cg_split" if cluster else ""
    for group in _levels(program, fused):
        plain = [r for r in group if r.index not in fused and r.index not in partner]
        exprs: list[tuple[str, object]] = [(f"red:{r.index}", r.body) for r in plain]
        exprs += [(f"online:{r.index}:{partner[r.index]}", r.body) for r in group if r.index in partner]
        fill = (em.used_leaves(exprs) & cached) - filled
        body = _pass(em, exprs, cached, fill)
        filled |= fill
        lines += em.take_row_lines()
        lines += [f"float cg_acc{r.index} = {_IDENTITY[r.kind]};" for r in group]
        lines += body
        lines += [f"const float cg_red{r.index} = {reduce_fn}<{_OPCODE[r.kind]}>(cg_acc{r.index}, {_IDENTITY[r.kind]}{extra});"
                  for r in plain]
        for r in group:
            if r.index in partner:
                i_max, i_sum = r.index, partner[r.index]
                lines += [f"{'cg_cluster_online' if cluster else 'cg_online_group'}(cg_acc{i_max}, cg_acc{i_sum}{extra});",
                          f"const float cg_red{i_max} = cg_acc{i_max};",
                          f"const float cg_red{i_sum} = cg_online_end(cg_acc{i_max}, cg_acc{i_sum}, cg_cols);"]
    full_out = [(f"out:{n}", e) for n, (space, e) in program.outputs.items() if space == "full"]
    if full_out:
        body = _pass(em, full_out, cached, (em.used_leaves(full_out) & cached) - filled)
        lines += em.take_row_lines()
        lines += body
    row_out = [(n, e) for n, (space, e) in program.outputs.items() if space != "full"]
    if row_out:
        stores = []
        for name, expr in row_out:
            value = em.row_expr(expr)
            stores.append(f"{name}[cg_row] = {em.store_value(name, value, em.kind(expr))};")
        leader = "cg_lane == 0"  # the row's first thread (of the cluster's first block)
        lines += [f"if (cg_active && {leader}) {{", *("    " + x for x in em.take_row_lines() + stores), "}"]
    if cluster:
        lines.append("if (cg_split) cg_cluster_sync();  // no block leaves while another may read its shared memory")
        place = [
            "    // As the launch header computes it: CL blocks per row below SPLIT rows, else one.",
            f"    const bool cg_split = {em.rows} < SPLIT;",
            "    // Split: CL blocks per row. Else blockDim.y rows per block, as in rows/block.",
            "    const long long cg_r = cg_split ? static_cast<long long>(blockIdx.x) / CL",
            "                                    : static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;",
            f"    const bool cg_active = cg_r < {em.rows};  // the grid is rounded up to whole clusters",
            "    const int cg_lane = (cg_split ? static_cast<int>(blockIdx.x % CL) * blockDim.x : 0) + threadIdx.x;",
            "    const int cg_g = (cg_split ? CL : 1) * blockDim.x;",
        ]
    else:
        place = [
            "    const long long cg_r = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;",
            "    // Threads of rows past the end still take part in the block's barriers.",
            f"    const bool cg_active = cg_r < {em.rows};",
            "    const int cg_lane = threadIdx.x;",
            "    const int cg_g = blockDim.x;",
        ]
    text = [
        _PRELUDE,
        *([_CLUSTER_PRELUDE] if cluster else []),
        *([_ONLINE_PRELUDE] if online else []),
        *([_CLUSTER_ONLINE_PRELUDE] if online and cluster else []),
        f"template <int V>\n__device__ __forceinline__ void cg_run({_params(spec)}) {{",
        f"    const long long cg_cols = {em.cols};",
        *place,
        "    const long long cg_row = cg_active ? cg_r : 0;",
        "    const long long cg_obase = cg_row * cg_cols;",
        "    const long long cg_nvec = cg_cols / V;",
        *("    " + x for x in lines),
        "}",
    ]
    outputs = [n for n, (space, _) in program.outputs.items() if space == "full"]
    call = "cg_run<{v}>(" + _arg_names(spec) + ")"
    bound, attrs = "512", ""
    if mode == "warp":
        grid, block, bound = f"(cdiv({program.rows}, ROWS),)", "(32, ROWS)", "32 * ROWS"
        tune = {"ROWS": (4, 2, 8, 1), "ITEMS": items}
        what = "one row per warp, ROWS rows per block"
    elif mode == "block":
        # Threads per row: a warp per 256 * ITEMS elements (ITEMS 16-byte vectors of 16-bit
        # elements per thread), 32 to 512; rows too short for 256 threads share a block.
        tx = f"min(512, max(32, 32 * cdiv({program.cols}, 256 * ITEMS)))"
        ry = f"max(1, 256 // {tx})"
        grid, block = f"(cdiv({program.rows}, {ry}),)", f"({tx}, {ry})"
        tune = {"ITEMS": items}
        what = "one row per block of threads sized to the row, short rows several to a block"
    else:
        split = f"(1 + (CL - 1) * min(1, max(0, SPLIT - {program.rows})))"  # blocks per row: CL or 1
        tx = f"min(512, max(32, 32 * cdiv({program.cols}, 256 * ITEMS * {split})))"
        ry = f"max(1, (256 // {tx}) * (2 - min(2, {split})))"  # rows per block: 1 when split
        grid, block = f"(CL * cdiv(cdiv({program.rows}, {ry}) * {split}, CL),)", f"({tx}, {ry})"
        # A row split CL ways is short per block: 4 vectors per thread hold a 128K-element fp16
        # row in 8 blocks of 512; 8 spill at fp32 with the cluster code, 1 puts its cache on
        # the stack there.
        tune = {"CL": (8, 4, 2), "ITEMS": tuple(v for v in items if v in (2, 4)) or items, "SPLIT": (128, 512, 32)}
        attrs = " __cluster_dims__(CL, 1, 1)"
        # At least one block per SM: without it ptxas caps registers low and spills here.
        bound = "512, 1"
        what = ("below SPLIT rows one row per cluster of CL blocks (sm_90), partial reductions combined through "
                "distributed shared memory; else as rows/block")
    if online and mode != "warp":
        bound = "512, 1"  # as for clusters: without it ptxas caps registers low and spills here
    name = f"rows/{mode}" + ("+online" if online else "")
    what += "; max and sum of exp(x - max) in one pass" if online else ""
    head = _header(grid, block, tune, f"{name}: {what}; ITEMS vectors per thread kept in registers between passes, "
                   "fp32 accumulation", spec)
    return Schedule(f"codegen:{name}", head + "\n".join(text) + "\n" + _entry(spec, bound, em.vector_ok(outputs), call, attrs))


# ---------------------------------------------------------------- transpose


_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint8": 1, "int8": 1, "bool": 1,
          "float8_e4m3fn": 1}


def _element_bytes(spec: KernelSpec, dtype: str) -> int:
    """The largest size an argument of ``dtype`` takes over the spec's run dtypes."""
    if dtype == SCALAR:
        return max(_BYTES[d] for d in spec.dtypes)
    return _BYTES.get(dtype, 8)


def transpose(spec: KernelSpec, program: Program) -> Schedule:
    """Tiles of 32 x 32 blocks of VW x VW elements. A thread reads VW rows of one VW-wide
    vector, transposes the VW x VW block in registers and parks its VW columns in shared
    memory as VW-wide words (one plane per column, rows padded to 33 words: conflict-free both
    ways); the write side reads them back along the tile's other axis and stores VW-wide
    vectors of the output rows. Scalar code where a row length or a pointer forbids vectors."""
    assert program.transposed is not None
    arg, rows, cols = program.transposed
    out = next(iter(program.outputs))
    em = _Emitter(spec, program)
    ct_in, ct_out = em.c_type(arg), em.c_type(out)
    size = max(_element_bytes(spec, em.dtypes[arg]), _element_bytes(spec, em.dtypes[out]))
    # Shared memory: VW planes of 32 x 33 words of VW elements; at most 32 bytes per block of
    # VW x VW keeps it under 34 KB, inside the 48 KB a static array may take.
    widths = tuple(w for w in (2, 4, 1) if w * w * size <= 32) or (1,)
    text = [
        _PRELUDE,
        f"__device__ __forceinline__ void cg_run({_params(spec)}) {{",
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
        "            if (cg_vstore && cg_i + VW <= cg_rows) {",
        f"                *reinterpret_cast<Pack<{ct_out}, VW>*>({out} + j * cg_rows + cg_i) = o;",
        "            } else {",
        "#pragma unroll",
        f"                for (int r = 0; r < VW; ++r) if (cg_i + r < cg_rows) {out}[j * cg_rows + cg_i + r] = o.v[r];",
        "            }",
        "        }",
        "    }",
        "}",
    ]
    grid = f"(cdiv({cols}, 32 * VW) * cdiv({rows}, 32 * VW),)"
    tune = {"VW": widths, "TY": (8, 4, 16)}
    head = _header(grid, "(32, TY)", tune, "transpose/tiled: 32 x 32 blocks of VW x VW elements through shared memory, "
                   "VW-wide vectors both ways", spec)
    entry = f'extern "C" __global__ void __launch_bounds__(512) {spec.name}({_params(spec)}) {{\n    cg_run({_arg_names(spec)});\n}}\n'
    return Schedule("codegen:transpose/tiled", head + "\n".join(text) + "\n" + entry)


def transpose_wide(spec: KernelSpec, program: Program) -> Schedule:
    """TILE x TILE tiles moved with 16-byte vectors both ways. Loads park whole vectors in shared
    memory, XOR-swizzled by the row's vector group so that neither the vector writes nor the
    column reads on the way out collide on a bank; each thread then gathers VL elements of one
    tile column and stores them as one vector of the output row. Scalar code where a row length
    or a pointer forbids vectors."""
    assert program.transposed is not None
    arg, rows, cols = program.transposed
    out = next(iter(program.outputs))
    em = _Emitter(spec, program)
    ct_in, ct_out = em.c_type(arg), em.c_type(out)
    size = _element_bytes(spec, em.dtypes[arg])
    # A tile of at most 32 KB of input elements, and at least two vectors along its rows.
    tiles = tuple(t for t in (64, 128, 32) if t * t * size <= 32 * 1024 and t * size >= 32) or (32,)
    vl = f"(16 / static_cast<int>(sizeof({ct_in})))"
    text = [
        _PRELUDE,
        f"constexpr int VL = {vl};  // elements of one 16-byte input vector",
        "constexpr int GROUPS = TILE / VL;  // vectors along a tile row",
        f"__device__ __forceinline__ void cg_run({_params(spec)}) {{",
        f"    __shared__ Pack<{ct_in}, VL> cg_tile[TILE][GROUPS];",
        f"    const long long cg_rows = {c_size(rows)};",
        f"    const long long cg_cols = {c_size(cols)};",
        "    const long long cg_tiles_x = (cg_cols + TILE - 1) / TILE;",
        "    const long long cg_i0 = static_cast<long long>(blockIdx.x) / cg_tiles_x * TILE;",
        "    const long long cg_j0 = static_cast<long long>(blockIdx.x) % cg_tiles_x * TILE;",
        f"    const bool cg_vload = cg_cols % VL == 0 && cg_aligned({arg}, 16);",
        f"    const bool cg_vstore = cg_rows % VL == 0 && cg_aligned({out}, sizeof(Pack<{ct_out}, VL>));",
        "    for (int v = threadIdx.x; v < TILE * GROUPS; v += NT) {",
        "        const int r = v / GROUPS, g = v % GROUPS;",
        "        const long long i = cg_i0 + r, j = cg_j0 + static_cast<long long>(g) * VL;",
        f"        Pack<{ct_in}, VL> a;",
        "        if (i < cg_rows) {",
        "            if (cg_vload && j + VL <= cg_cols) {",
        f"                a = *reinterpret_cast<const Pack<{ct_in}, VL>*>({arg} + i * cg_cols + j);",
        "            } else {",
        "#pragma unroll",
        f"                for (int e = 0; e < VL; ++e) if (j + e < cg_cols) a.v[e] = {arg}[i * cg_cols + j + e];",
        "            }",
        "        }",
        "        cg_tile[r][g ^ ((r / VL) % GROUPS)] = a;  // swizzled: see the reads below",
        "    }",
        "    __syncthreads();",
        "    for (int w = threadIdx.x; w < TILE * GROUPS; w += NT) {",
        "        const int c = w / GROUPS, g = w % GROUPS;  // tile column c, input rows g*VL ... g*VL+VL-1",
        "        const long long j = cg_j0 + c, i = cg_i0 + static_cast<long long>(g) * VL;",
        "        if (j >= cg_cols || i >= cg_rows) continue;",
        f"        Pack<{ct_out}, VL> o;",
        "#pragma unroll",
        f"        for (int e = 0; e < VL; ++e) o.v[e] = static_cast<{ct_out}>(cg_tile[g * VL + e][(c / VL) ^ g].v[c % VL]);",
        "        if (cg_vstore && i + VL <= cg_rows) {",
        f"            *reinterpret_cast<Pack<{ct_out}, VL>*>({out} + j * cg_rows + i) = o;",
        "        } else {",
        "#pragma unroll",
        f"            for (int e = 0; e < VL; ++e) if (i + e < cg_rows) {out}[j * cg_rows + i + e] = o.v[e];",
        "        }",
        "    }",
        "}",
    ]
    grid = f"(cdiv({cols}, TILE) * cdiv({rows}, TILE),)"
    tune = {"TILE": tiles, "NT": (256, 128, 512)}
    head = _header(grid, "(NT,)", tune, "transpose/wide: TILE x TILE tiles, 16-byte vectors both ways through swizzled "
                   "shared memory", spec)
    entry = f'extern "C" __global__ void __launch_bounds__(512) {spec.name}({_params(spec)}) {{\n    cg_run({_arg_names(spec)});\n}}\n'
    return Schedule("codegen:transpose/wide", head + "\n".join(text) + "\n" + entry)
