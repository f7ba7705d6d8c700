"""CUDA from a :class:`~agents.embedded.codegen.ir.Program`: what every schedule template shares.

:class:`Emitter` writes C statements for a program's expressions (row values once per row,
element values per vector element, loads of 16-byte vectors or single elements); the entry
helpers write a kernel's header (launch and ``// tune:`` lines) and its entry point, with the
spec's exact name and argument list. The schedules themselves live beside this module:
:mod:`~agents.embedded.codegen.elementwise`, :mod:`~agents.embedded.codegen.rows` and
:mod:`~agents.embedded.codegen.transpose`. All offsets are 64-bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from agents.embedded.codegen.cuda_text import NEG_INF, POS_INF
from agents.embedded.codegen.ir import (
    BOOL,
    COMPARE,
    FLOAT,
    FOLD_READS,
    INT,
    TESTS,
    UNARY,
    AtColumn,
    ColumnIndex,
    Const,
    Fold,
    Load,
    Op,
    Param,
    Pick,
    PickAt,
    PickReduce,
    Program,
    Reduce,
    RowOf,
    Scan,
    by_index,
    ctype_of,
    walk,
)
from agents.embedded.codegen.trace import Unsupported
from kernels.spec import _C_TYPES, SCALAR, KernelSpec

IDENTITY = {"sum": "0.0f", "max": NEG_INF, "min": POS_INF}
OPCODE = {"sum": 0, "max": 1, "min": 2}


@dataclass(frozen=True)
class Schedule:
    """One generated variant: its plan name and its source."""

    name: str
    source: str


def c_size(expr: str, index: str = "cg_idx") -> str:
    """A launch-style size expression (``2 * d``) as C of the index type (``cg_idx``: 64-bit
    unless a schedule runs a 32-bit copy; ``index="long long"`` for a bound that must not wrap).
    A term ``(hidden // 128)`` (an exact quotient, :func:`trace.fit_size`) is C's ``/``."""
    return "(" + " * ".join(f"static_cast<{index}>({t.replace(' // ', ' / ')})" for t in expr.split(" * ")) + ")"


def _float_literal(x: float) -> str:
    if math.isnan(x):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(x):
        return POS_INF if x > 0 else NEG_INF
    return f"{float(x)!r}f"


# Column accesses read one element at a time (at an index's element, at a cat's shifted column).
SCALAR_READ = ("colgather", "colshift")


def _fed(node: object) -> bool:
    """Whether a reduction's result (or a top-k's pick, which follows the row's reductions)
    flows into ``node``."""
    return any(isinstance(n, Reduce | Pick | PickReduce | PickAt) for n in walk([node]))


class Emitter:
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
        self.element_col = "cg_c"  # the current chunk's first column (set by each element loop)
        self.full_leaves: list[Load] = []
        for node in walk(program.all_roots()):
            if isinstance(node, Load) and node.access in ("full", "gather", "fold", *SCALAR_READ) \
                    and node not in self.full_leaves:
                self.full_leaves.append(node)
        self.row_loads: list[Load] = [n for n in walk(program.all_roots()) if isinstance(n, Load) and n.access in ("row", "scalar")]
        self._row_only: dict[int, bool] = {}
        self.out_base: dict[str, str] = {}  # output -> its row's first element, where not cg_obase
        self.at_cols: dict[int, str] = {}  # AtColumn -> the name of its column
        self.preloaded: dict[tuple[int, int], str] = {}  # (AtColumn, its Load) -> the value read early
        self.scan_text: dict[int, str] = {}  # Scan -> the name of its value at the current column
        self.fold_text: dict[int, str] = {}  # Fold -> its accumulator at element e of the current chunk

    # ---- types
    def c_type(self, arg: str) -> str:
        d = self.dtypes[arg]
        return "scalar_t" if d == SCALAR else _C_TYPES[d]

    def is_float_arg(self, arg: str) -> bool:
        return self.dtypes[arg] in (SCALAR, "float32", "float16", "bfloat16", "float8_e4m3fn")

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
            elif isinstance(node, ColumnIndex | Scan | Fold):
                res = False
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
        """Per full leaf, its row's first element (of the index type)."""
        out = []
        for i, leaf in enumerate(self.full_leaves):
            stride = self.cols if leaf.row_stride == "C" else c_size(leaf.row_stride)
            if by_index(leaf):
                idx = self.row_expr(leaf.index)
                if leaf.rows:  # a given index: a negative one counts from the end, as in torch
                    idx = f"({idx} < 0 ? {idx} + {c_size(leaf.rows)} : {idx})"
                at = "" if leaf.offset == "0" else f" + {c_size(leaf.offset)}"
                out.append(f"const cg_idx cg_base{i} = static_cast<cg_idx>({idx}) * {stride}{at};")
            else:
                out.append(f"const cg_idx cg_base{i} = {row} * {stride} + {c_size(leaf.offset)};")
        return out

    # ---- row values
    def row_expr(self, node: object) -> str:
        """The C name or literal of a row-only value, defining it in ``row_lines`` once."""
        if isinstance(node, Const):
            return self.literal(node)
        if isinstance(node, Param):
            if node.name in ("__cols", "__size"):
                return "static_cast<float>(" + (self.cols if node.name == "__cols" else c_size(node.size)) + ")"
            if node.name == "__isize":
                return "static_cast<long long>(" + c_size(node.size, "long long") + ")"
            return node.name
        key = id(node)
        if key in self.row_done:
            return self.row_done[key]
        if isinstance(node, Reduce):
            return f"cg_red{node.index}"
        if isinstance(node, Pick):  # this thread's pick (rows.topk_lines)
            return "cg_pv" if node.part == "value" else "cg_pc"
        if isinstance(node, PickReduce):
            return f"cg_pr{node.index}"
        if isinstance(node, PickAt):
            return f"cg_pa{node.index}"
        if isinstance(node, RowOf):
            text = self.row_of(node)
        elif isinstance(node, Load):
            where = self.row_expr(node.index) if node.index is not None else "cg_row" if node.access == "row" else "0"
            text = self.convert_load(node.arg, f"{node.arg}[{where}]")
        elif isinstance(node, AtColumn):
            text = self.scalar_expr(node.body, self._at_col(node), node)
        else:
            assert isinstance(node, Op)
            text = self.op_text(node, [self.row_expr(a) for a in node.args])
        name = self.fresh()
        self.row_lines.append(f"const {self.c_kind(self.kind(node))} {name} = {text};")
        self.row_done[key] = name
        return name

    @staticmethod
    def row_of(node: RowOf) -> str:
        """The row a partly broadcast tensor reads at row cg_row: the digits of cg_row over the
        full row dimensions, those of the kept dimensions recombined over the tensor's sizes."""
        terms = []
        for j, kept in enumerate(node.keep):
            if not kept:
                continue
            digit = "cg_row"
            inner = [d for d in node.dims[j + 1:]]
            if inner:
                digit = f"({digit} / {c_size(' * '.join(inner))})"
            if j > 0:
                digit = f"({digit} % {c_size(node.dims[j])})"
            weight = [d for d, k in zip(node.dims[j + 1:], node.keep[j + 1:], strict=True) if k]
            terms.append(f"{digit} * {c_size(' * '.join(weight))}" if weight else digit)
        return " + ".join(terms) or "0LL"

    def _at_col(self, node: AtColumn) -> str:
        """The name of an AtColumn's column, defined in ``row_lines`` once."""
        if id(node) not in self.at_cols:
            col = self.row_expr(node.column)
            name = self.fresh() + "_col"
            self.row_lines.append(f"const cg_idx {name} = static_cast<cg_idx>({col});")
            self.at_cols[id(node)] = name
        return self.at_cols[id(node)]

    def scalar_expr(self, node: object, col: str, at: AtColumn | None = None) -> str:
        """A full expression at one column (a gather by index), with scalar loads (or the
        values :meth:`preload_gathers` read for the AtColumn ``at``)."""
        if self.row_only(node):
            return self.row_expr(node)
        if isinstance(node, ColumnIndex):
            return f"static_cast<float>({col})"
        if isinstance(node, Scan):
            return self.scan_text[id(node)]  # the scan schedule's running value at this column
        if isinstance(node, Load):
            if at is not None and (id(at), id(node)) in self.preloaded:
                return self.preloaded[(id(at), id(node))]
            if node.access == "col":
                return self.convert_load(node.arg, f"{node.arg}[{col}]")
            if node.access == "colgather":  # at its index's element at this column
                return self._column_gather(node, {node.index: self.scalar_expr(node.index, col, at)})
            if node.access == "colshift":
                return self._column_shift(node, col)
            return self.convert_load(node.arg, f"{node.arg}[{self.leaf_base(node)} + {col}]")
        assert isinstance(node, Op)
        return self.op_text(node, [self.scalar_expr(a, col, at) for a in node.args])

    def preload_row_values(self, exprs: Sequence[object]) -> None:
        """Defines now, in ``row_lines``, the loads of row values in ``exprs`` that no reduction
        feeds (an index, a per-row scalar). For a row's outputs, computed after its reductions:
        read there, each was a trip to memory the row's writer waited for at the end; placed
        with the row's first loads, they are in flight with them."""
        for node in walk(list(exprs)):
            if isinstance(node, Load) and node.access in ("row", "scalar") and not _fed(node):
                self.row_expr(node)

    def preload_gathers(self, exprs: Sequence[object]) -> None:
        """Defines now, in ``row_lines``, the elements that the gathers of ``exprs`` read at a
        row-valued column no reduction feeds, for :meth:`scalar_expr` to use later. The caller
        places them after the first pass's loads (their address waits for the index), so that
        they are in flight during the reduction."""
        for node in walk(list(exprs)):
            if not isinstance(node, AtColumn) or _fed(node.column):
                continue
            col = self._at_col(node)
            for leaf in walk([node.body]):
                if isinstance(leaf, Load) and not self.row_only(leaf) and (id(node), id(leaf)) not in self.preloaded:
                    name = self.fresh()
                    self.row_lines.append(f"const {self.c_kind(self.kind(leaf))} {name} = {self.scalar_expr(leaf, col)};")
                    self.preloaded[(id(node), id(leaf))] = name

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
        if name in TESTS:
            return f"{TESTS[name]}(static_cast<float>({args[0]}))"
        if name == "gelu":
            return f"(0.5f * {args[0]} * (1.0f + erff({args[0]} * 0.70710678118654752f)))"
        if name == "gelu_tanh":
            a = args[0]
            # as g * sigmoid(2u): see the gated_act recipes (agents/embedded/recipes)
            return f"({a} / (1.0f + expf(-1.5957691216057308f * ({a} + 0.044715f * {a} * {a} * {a}))))"
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
        if name in ("copysign", "hypot", "fmax", "fmin"):  # (fmax and fmin drop a NaN, as torch's do)
            return f"{name}f(static_cast<float>({args[0]}), static_cast<float>({args[1]}))"
        if name == "bits":  # integers (64-bit: a narrower type's result is its low bits, kept at the store)
            return f"(static_cast<long long>({args[0]}) {node.extra[0]} static_cast<long long>({args[1]}))"
        if name in ("fmod", "remainder") and FLOAT not in kinds:
            # Integers: C's % truncates as torch.fmod does; remainder takes the divisor's sign.
            return f"({args[0]} % {args[1]})" if name == "fmod" else f"cg_remainder_int({args[0]}, {args[1]})"
        if name == "fmod":
            return f"fmodf(static_cast<float>({args[0]}), static_cast<float>({args[1]}))"
        if name == "remainder":
            return f"cg_remainder(static_cast<float>({args[0]}), static_cast<float>({args[1]}))"
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
        elif isinstance(node, ColumnIndex):
            text = f"static_cast<float>({self.element_col} + e)"
        elif isinstance(node, Fold):
            text = self.fold_text[key]
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
        if ct in ("scalar_t", "__half", "__nv_bfloat16", "float", "__nv_fp8_e4m3"):
            # fp8: round to nearest even, saturating at +-448 (cuda_fp8.h's conversion)
            return f"static_cast<{ct}>(static_cast<float>({value}))"
        if kind == FLOAT:
            return f"static_cast<{ct}>(static_cast<long long>({value}))"
        return f"static_cast<{ct}>({value})"

    def col_leaves(self) -> list[Load]:
        return [n for n in walk(self.p.all_roots()) if isinstance(n, Load) and n.access == "col"]

    def vector_ok(self, full_outputs: list[str]) -> str:
        """The run-time condition for the V-wide path (row length, strides, offsets, pointers)."""
        conds = [f"{self.cols} % VEC == 0"]
        gathered = {leaf.arg for leaf in self.full_leaves if leaf.access in SCALAR_READ}  # read by scalars
        for leaf in self.full_leaves:
            if leaf.access in SCALAR_READ:
                continue
            if leaf.row_stride != "C":
                conds.append(f"{c_size(leaf.row_stride)} % VEC == 0")
            if leaf.offset != "0":
                conds.append(f"{c_size(leaf.offset)} % VEC == 0")
        ptrs = ({leaf.arg for leaf in self.full_leaves} - gathered) | {leaf.arg for leaf in self.col_leaves()} \
            | set(full_outputs)
        for arg in sorted(ptrs):
            conds.append(f"cg_aligned({arg}, sizeof({self.c_type(arg)}) * VEC >= 16 ? 16 : sizeof({self.c_type(arg)}) * VEC)")
        return " && ".join(conds)

    def chunk_body(self, exprs: list[tuple[str, object]], col0: str) -> list[str]:
        """Statements for one V-wide chunk at column ``col0``: its loads, then per element either
        a reduction update (``("red:K", body)``) or an output store (``("out:NAME", expr)``)."""
        lines: list[str] = []
        leaf_text: dict[int, str] = {}
        needed = self._needed(exprs)
        by_value: dict[Load, str] = {}  # equal loads reached through two paths are one load
        for leaf in needed:
            if leaf in by_value:
                leaf_text[id(leaf)] = by_value[leaf]
                continue
            self._leaf_code(leaf, col0, lines, leaf_text)
            by_value[leaf] = leaf_text[id(leaf)]
        return self._element_loop(exprs, lines, leaf_text, col0)

    def staged_loops(self, exprs: list[tuple[str, object]], count: str, slot: str, col: str, guard: str,
                     after: Sequence[str] = (), cached: AbstractSet[int] = frozenset(),
                     fill: AbstractSet[int] = frozenset(), between: Sequence[str] = ()) -> list[str]:
        """A thread's ``count`` V-wide chunks in two unrolled loops over ``slot``: first every
        chunk's loads, into arrays indexed by the slot (so that they are all in flight
        together; a load-compute-store loop waits for each chunk's loads in turn), then
        ``between`` (what only the stores need, such as a scattered row's base computed from a
        loaded index: before the loads, ptxas waited for the index there before issuing them),
        then every chunk's element loop reading them, followed by ``after``. ``col``: the chunk's first
        column (``cg_c``); ``guard``: whether the chunk exists. Full leaves in ``cached`` live
        in the register cache ``cg_cache{i}[slot]`` (declared by the caller): those in ``fill``
        are loaded into it here, the others are read from it and not loaded. In such a pass
        the columns' vectors (a weight, read by every row, so mostly from L2) are loaded at
        use instead: staged as well, they took 16-64 more registers per thread at ITEMS 4-8
        (ptxas reports for rms and layer norm) on top of the cache."""
        decls: list[str] = []
        loads: list[str] = []
        inline_cols: list[str] = []
        leaf_text: dict[int, str] = {}
        by_value: dict[Load, str] = {}
        needed = self._needed(exprs)
        for leaf in needed:
            if leaf not in by_value:
                pack = f"Pack<{self.c_type(leaf.arg)}, V>"
                if leaf.access in SCALAR_READ:
                    text = self._scalar_read(leaf, "cg_c", by_value)
                elif leaf.access == "col":
                    i, src = self.col_leaves().index(leaf), f"{leaf.arg} + cg_c"
                    if cached:  # loaded at use (see above)
                        inline_cols.append(f"const {pack} cg_c{i} = *reinterpret_cast<const {pack}*>({src});")
                        text = f"cg_c{i}.v[e]"
                    else:
                        decls.append(f"{pack} cg_sc{i}[{count}];")
                        loads.append(f"cg_sc{i}[{slot}] = *reinterpret_cast<const {pack}*>({src});")
                        text = f"cg_sc{i}[{slot}].v[e]"
                else:
                    i = self.full_leaves.index(leaf)
                    src = f"{leaf.arg} + cg_base{i} + cg_c"
                    # A cached leaf is kept as loaded (its pack, converted at each use): 16-bit
                    # inputs then take half the registers that fp32 copies took, for the same bits.
                    name = f"cg_cache{i}" if i in cached else f"cg_sp{i}"
                    if i not in cached:
                        decls.append(f"{pack} {name}[{count}];")
                    if i not in cached or i in fill:
                        loads.append(f"{name}[{slot}] = *reinterpret_cast<const {pack}*>({src});")
                    text = f"{name}[{slot}].v[e]"
                by_value[leaf] = text if leaf.access in SCALAR_READ else self.convert_load(leaf.arg, text)
            leaf_text[id(leaf)] = by_value[leaf]
        work = self._element_loop(exprs, inline_cols, leaf_text, "cg_c") + list(after)

        def loop(body: list[str]) -> list[str]:
            return ["#pragma unroll", f"for (int {slot} = 0; {slot} < {count}; ++{slot}) {{",
                    f"    const cg_idx cg_c = {col};", f"    if ({guard}) {{",
                    *("        " + x for x in body), "    }", "}"]

        return decls + (loop(loads) if loads else []) + list(between) + loop(work)

    def _needed(self, exprs: list[tuple[str, object]]) -> list[Load]:
        """The per-element leaves of ``exprs``, column gathers last (they read their index's);
        the loads a Fold reads at each of its positions are its own loop's (:meth:`fold_loop`)."""
        needed = [n for _, e in exprs for n in walk([e])
                  if isinstance(n, Load) and not self.row_only(n) and n.access not in FOLD_READS]
        return [n for n in needed if n.access != "colgather"] + [n for n in needed if n.access == "colgather"]

    def _column_gather(self, leaf: Load, by_value: Mapping[Load, str]) -> str:
        """Element e of a column gather: one scalar load at its index's element e (a negative
        index counts from the end of the row, as in torch)."""
        i = self.full_leaves.index(leaf)
        idx = f"static_cast<cg_idx>({by_value[leaf.index]})"
        at = f"({idx} < 0 ? {idx} + {c_size(leaf.rows)} : {idx})"
        return self.convert_load(leaf.arg, f"{leaf.arg}[cg_base{i} + {at}]")

    def _scalar_read(self, leaf: Load, col0: str, known: Mapping[Load, str]) -> str:
        """Element e of a leaf read by scalars (:data:`SCALAR_READ`) in the chunk at ``col0``;
        ``known``: the texts of the leaves already read (a column gather's index among them)."""
        if leaf.access == "colgather":
            return self._column_gather(leaf, known)
        return self._column_shift(leaf, f"{col0} + e")

    def _column_shift(self, leaf: Load, col: str) -> str:
        """Column ``col`` of a cat's piece: one scalar load at the piece's column col - shift,
        clamped into the piece (the other pieces' columns read it too; a where drops them)."""
        i = self.full_leaves.index(leaf)
        at = f"cg_clamp_col<cg_idx>({col} - {c_size(leaf.shift)}, {c_size(leaf.width)})"
        return self.convert_load(leaf.arg, f"{leaf.arg}[cg_base{i} + {at}]")

    def _leaf_code(self, leaf: Load, col0: str, lines: list[str], leaf_text: dict[int, str]) -> None:
        """Loads one leaf's V elements and names element e."""
        pack = f"Pack<{self.c_type(leaf.arg)}, V>"
        if leaf.access in SCALAR_READ:
            # (a column gather's index is a per-element load, read first; a gathered piece's is its row's)
            known = {leaf.index: leaf_text[id(leaf.index)]} if leaf.access == "colgather" else {}
            leaf_text[id(leaf)] = self._scalar_read(leaf, col0, known)
            return
        if leaf.access == "col":
            name, src = f"cg_c{self.col_leaves().index(leaf)}", f"{leaf.arg} + {col0}"
        else:
            i = self.full_leaves.index(leaf)
            name, src = f"cg_p{i}", f"{leaf.arg} + cg_base{i} + {col0}"
        lines.append(f"const {pack} {name} = *reinterpret_cast<const {pack}*>({src});")
        leaf_text[id(leaf)] = self.convert_load(leaf.arg, f"{name}.v[e]")

    def _element_loop(self, exprs: list[tuple[str, object]], lines: list[str], leaf_text: dict[int, str],
                      col0: str) -> list[str]:
        """The per-element loop over the chunk: reduction updates and output stores."""
        self.element_col = col0  # element e's column is col0 + e
        folds = {id(n): n for _, e in exprs for n in walk([e]) if isinstance(n, Fold)}
        for fold in folds.values():
            lines += self.fold_loop(fold, leaf_text, col0)
        outs = [(what, e) for what, e in exprs if what.startswith("out:")]
        for what, _ in outs:
            arg = what[4:]
            lines.append(f"Pack<{self.c_type(arg)}, V> cg_o_{arg};")
        onlines = [what[7:].split(":") for what, _ in exprs if what.startswith("online:")]
        # An online pair takes the chunk's V values at once, after the loop (cg_online_vec).
        lines += [f"float cg_ov{i_max}[V];" for i_max, _ in onlines]
        lines.append("#pragma unroll")
        lines.append("for (int e = 0; e < V; ++e) {")
        memo: dict[int, str] = {}
        body: list[str] = []
        for what, expr in exprs:
            value = self.element_expr(expr, leaf_text, body, memo)
            if what.startswith("online:"):
                i_max, _ = what[7:].split(":")
                body.append(f"cg_ov{i_max}[e] = static_cast<float>({value});")
            elif what == "pick:":  # a top-k's pass: what it does with an element is rows.topk_lines's
                body.append(f"cg_pick_element(static_cast<float>({value}), static_cast<long long>({self.element_col} + e));")
            elif what.startswith("red:"):
                r = self.p.reductions[int(what[4:])]
                body.append(f"cg_acc{r.index} = cg_combine<{OPCODE[r.kind]}>(cg_acc{r.index}, static_cast<float>({value}));")
            else:
                arg = what[4:]
                body.append(f"cg_o_{arg}.v[e] = {self.store_value(arg, value, self.kind(expr))};")
        lines += ["    " + b for b in body]
        lines.append("}")
        lines += [f"cg_online_vec<V>(cg_acc{i_max}, cg_acc{i_sum}, cg_ov{i_max});" for i_max, i_sum in onlines]
        for what, _ in outs:
            arg = what[4:]
            base = self.out_base.get(arg, "cg_obase")
            lines.append(f"cg_store<{self.c_type(arg)}, V>({arg} + {base} + {col0}, cg_o_{arg});")
        return lines

    def fold_loop(self, fold: Fold, leaf_text: Mapping[int, str], col0: str) -> list[str]:
        """The V accumulators of a Fold over the chunk at ``col0``, and its loop over k: at each
        k the chunk's V-wide loads of the folded arguments and the row's value at k, then the
        body per element. Unrolled by 4, so that four positions' loads are in flight together
        (each one's address is known before any is used)."""
        acc = self.fresh() + "_fold"
        float_acc = fold.ctype == FLOAT
        identity = IDENTITY[fold.kind] if float_acc else "0LL"
        inner = dict(leaf_text)
        by_value: dict[Load, str] = {}
        body: list[str] = []
        for leaf in (n for n in walk([fold.body]) if isinstance(n, Load) and n.access in FOLD_READS):
            if leaf not in by_value:
                name = self.fresh()
                if leaf.access == "fold":
                    pack = f"Pack<{self.c_type(leaf.arg)}, V>"
                    src = f"{leaf.arg} + {self.leaf_base(leaf)} + cg_k * {self.cols} + {col0}"
                    body.append(f"const {pack} {name} = *reinterpret_cast<const {pack}*>({src});")
                    by_value[leaf] = self.convert_load(leaf.arg, f"{name}.v[e]")
                else:
                    at = f"cg_row * {c_size(leaf.row_stride)} + cg_k"
                    body.append(f"const {self.c_kind(self.kind(leaf))} {name} = "
                                f"{self.convert_load(leaf.arg, f'{leaf.arg}[{at}]')};")
                    by_value[leaf] = name
            inner[id(leaf)] = by_value[leaf]
        stmts: list[str] = []
        value = self.element_expr(fold.body, inner, stmts, {})
        if float_acc:
            update = f"{acc}[e] = cg_combine<{OPCODE[fold.kind]}>({acc}[e], static_cast<float>({value}));"
        else:
            update = f"{acc}[e] += static_cast<long long>({value});"
        body += ["#pragma unroll", "for (int e = 0; e < V; ++e) {", *("    " + x for x in stmts), f"    {update}", "}"]
        self.fold_text[id(fold)] = f"{acc}[e]"
        return [f"{'float' if float_acc else 'long long'} {acc}[V];", "#pragma unroll",
                f"for (int e = 0; e < V; ++e) {acc}[e] = {identity};", "#pragma unroll 4",
                f"for (cg_idx cg_k = 0; cg_k < {c_size(fold.count)}; ++cg_k) {{", *("    " + x for x in body), "}"]


def entry_params(spec: KernelSpec) -> str:
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


def entry_args(spec: KernelSpec) -> str:
    return ", ".join(a.name for a in spec.args)


def rows_grid(rows: str) -> str:
    """A launch grid of one block per row, at most 2^20 blocks (they take further rows in turn)."""
    return f"(max(1, min({rows}, 1048576)),)"


def block_entry(spec: KernelSpec) -> list[str]:
    """The kernel of a schedule whose ``cg_run`` takes the spec's arguments as they are (no
    vector path to choose at launch), with BLOCK threads at most."""
    return [f'extern "C" __global__ void __launch_bounds__(BLOCK) {spec.name}({entry_params(spec)}) {{',
            f"    cg_run({entry_args(spec)});", "}"]


def header(grid: str, block: str, tune: Mapping[str, tuple[int, ...]], what: str, spec: KernelSpec) -> str:
    lines = [f"// {spec.name}: generated from the traced reference ({what})."]
    lines.append(f"// launch: grid={grid} block={block} smem=0")
    lines += [f"// tune: {k}=" + ",".join(str(v) for v in vals) for k, vals in tune.items()]
    lines += [f"#ifndef {k}\n#define {k} {vals[0]}\n#endif" for k, vals in tune.items()]
    return "\n".join(lines) + "\n"


def entry(spec: KernelSpec, bound: str, cond: str, call: str, attrs: str = "", scalar: str = "") -> str:
    """The kernel: ``call`` with V = VEC where ``cond`` holds, else the scalar path (``scalar``,
    by default ``call`` with V = 1) in a ``__noinline__`` function of its own.

    Out of line because the compiler laid the scalar path first, before the vector path,
    whichever way the condition was written (``__builtin_expect``, an inverted test; nvdisasm,
    sm_90): the common launch then jumped over kilobytes of code it never runs (kernels
    without such code were 0.15-0.85 us faster on 1-16 rows in lean-paths-h200, one run
    each; experiments.code_fetch asks why). Off vector boundaries is rare, so the call costs
    nothing where it matters; the call's registers are counted in the kernel's."""
    body = scalar or call.format(v="1")
    args = entry_args(spec)
    return (
        f"__device__ __noinline__ void cg_run_scalar({entry_params(spec)}) {{\n    {body};\n}}\n\n"
        f'extern "C" __global__ void __launch_bounds__({bound}){attrs} {spec.name}({entry_params(spec)}) {{\n'
        f"    if ({cond}) {{\n        {call.format(v='VEC')};\n    }} else {{\n        cg_run_scalar({args});\n    }}\n}}\n"
    )
