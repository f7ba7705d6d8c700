"""The op graph read as a program over a [R, C] iteration space, and its classification.

Every value of the traced graph is given a *space* from its shape: ``full`` (varies along the
rows and the columns: the shape of the largest computed value, collapsed to [R, C] with C its
last dimension), ``row`` (one value per row: [rows..., 1] or [rows...]), ``col`` (one value per
column, broadcast over rows: [C]) or ``scalar``. A value is an expression tree over the
element (r, c): loads of tensor arguments (contiguous, a slice of the last dimension, or a row
picked by an index), constants, the kernel's float arguments, positions along a dimension
(``arange``), elementwise ops, per-row reductions over the columns, prefix sums along the row
(``cumsum``), the value of a full expression at one column per row (``gather`` by index), and
reductions over the dimension next to the row's (``x.sum(dim=-2)``: the iteration space is then
the reduced shape, and each element loops over that dimension itself, see :class:`Fold`). An output may be written by rows at an index (``target[index] =
values`` into an inout argument: a scatter), or element by element at the columns an index
matrix names (``target.scatter(1, index, values)``: a :class:`ColumnScatter`). A 2-D permuted copy is read as a transpose instead.
A ``torch.topk`` along the row (:class:`TopK`) makes a third space, ``pick`` ([rows..., k]):
its values and indices are :class:`Pick` values held one per thread of the row, reduced over
(:class:`PickReduce`), taken at one pick (:class:`PickAt`) or used as the columns at which
another value of the row is read; outputs of that shape are written one value per pick.

Anything else (reductions over other dimensions, or over the next-to-last beside row reductions, partial broadcasts, data-dependent sizes,
ops not listed in :data:`UNARY` / :data:`BINARY`) raises :class:`Unsupported`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from agents.embedded.codegen.trace import Trace, Unsupported, fit_size
from kernels.launch import evaluate
from kernels.spec import _C_TYPES, SCALAR, KernelSpec

FLOAT, INT, BOOL = "float", "int", "bool"

# aten op -> C expression template over the operand ({0}); results are fp32.
UNARY: dict[str, str] = {
    "neg": "(-{0})", "abs": "fabsf({0})", "exp": "expf({0})", "log": "logf({0})", "sqrt": "sqrtf({0})",
    "rsqrt": "rsqrtf({0})", "sigmoid": "(1.0f / (1.0f + expf(-{0})))", "tanh": "tanhf({0})",
    "erf": "erff({0})", "reciprocal": "(1.0f / {0})", "exp2": "exp2f({0})", "log2": "log2f({0})",
    "expm1": "expm1f({0})", "log1p": "log1pf({0})", "sin": "sinf({0})", "cos": "cosf({0})",
    "floor": "floorf({0})", "ceil": "ceilf({0})", "trunc": "truncf({0})", "round": "rintf({0})",
    "relu": "cg_relu({0})", "silu": "({0} / (1.0f + expf(-{0})))", "sign": "cg_sign({0})",
    "tan": "tanf({0})", "sinh": "sinhf({0})", "cosh": "coshf({0})", "asin": "asinf({0})", "acos": "acosf({0})",
    "atan": "atanf({0})", "asinh": "asinhf({0})", "acosh": "acoshf({0})", "atanh": "atanhf({0})",
    "erfc": "erfcf({0})", "log10": "log10f({0})", "lgamma": "lgammaf({0})",
}
# aten ops testing a float into a bool -> C function.
TESTS: dict[str, str] = {"isnan": "cg_isnan", "isinf": "cg_isinf", "signbit": "signbit"}
# Binary aten ops read into an Op of the same name (the emitter writes each one's C).
BINARY = frozenset({"add", "sub", "mul", "div", "maximum", "minimum", "pow", "atan2", "fmod", "remainder",
                    "copysign", "hypot", "fmax", "fmin"})
# Bitwise ops of integers (unpacking packed int4, masks of bits) -> C operator.
BITWISE: dict[str, str] = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "__and__": "&", "__or__": "|",
                           "__xor__": "^", "bitwise_left_shift": "<<", "__lshift__": "<<",
                           "bitwise_right_shift": ">>", "__rshift__": ">>"}
COMPARE: dict[str, str] = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}
# Writes of rows by index (``target[index] = values``), and where their values stand among
# their arguments.
_VALUES_AT = {"index_put": 2, "scatter": 3}
# Pieces of a tensor along a dimension (``chunk``, ``split``), taken by ``getitem``.
_SPLITS = {"split_with_sizes", "split"}
_VIEWS = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "clone", "alias",
          "contiguous", "lift_fresh_copy", "detach", "broadcast_in_dim"}
# Loads inside a Fold, read at each of its positions.
FOLD_READS = ("fold", "foldrow")
# Reductions that may run over the dimension next to the row's (a Fold), as the kind they fold by.
_FOLDS = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min"}
# The C type of a torch dtype named in a cast: the spec's argument types. Other integer casts
# go through long long.
_TORCH_TO_C = dict(_C_TYPES)


@dataclass(frozen=True)
class Load:
    """Element (r, c) of a tensor argument: at ``r * row_stride + offset + c`` (``full``), at
    ``c`` (``col``), ``r`` (``row``), 0 (``scalar``), or at ``index * row_stride + c`` with
    ``index`` a row expression (``gather``), or at ``r * row_stride + index`` with ``index`` a
    column's load (``colgather``: column c reads the argument's column index[c]). A gather by an
    index the kernel is given has the count it wraps by in ``rows`` (the table's rows, the
    argument's columns): a negative index counts from the end, as in torch. A gather's
    ``offset`` is where its piece starts in the table's row (a ``chunk`` of a gathered row).
    ``colshift``: a piece of a row ``width`` wide that a ``cat`` puts at column ``shift``; column
    c reads the piece's column c - shift, clamped into the piece, so that the columns of the
    other pieces (whose value a ``where`` on the column drops) read inside it too; with an
    ``index``, the piece is in a gathered row (as for ``gather``).
    ``fold``: inside a :class:`Fold`, at ``r * row_stride + k * C + c`` for its position k (an
    argument of the folded shape, ``row_stride`` its K * C); ``foldrow``: at ``r * row_stride
    + k`` (one value per row and position, [..., K, 1]; ``row_stride`` is K)."""

    arg: str
    access: str
    row_stride: str = "C"
    offset: str = "0"
    index: Any = None
    rows: str = ""
    shift: str = ""
    width: str = ""


def by_index(leaf: Load) -> bool:
    """Whether a load's row is one an index picks (a gathered row, or a cat's piece of one)."""
    return leaf.access == "gather" or (leaf.access == "colshift" and leaf.index is not None)


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    ctype: str


@dataclass(frozen=True)
class Param:
    """A float argument of the kernel by ``name``; ``__cols`` is the row's length, ``__size``
    the size expression ``size`` as a float (where a ``cat`` puts a piece, a mean's divisor), and
    ``__isize`` the same as a 64-bit integer (a size the reference computes with)."""

    name: str
    size: str = ""


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple[Any, ...]
    ctype: str
    extra: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Reduce:
    """A reduction over the columns of one row: ``sum``, ``max`` or ``min`` of ``body``."""

    kind: str
    body: Any
    index: int


@dataclass(frozen=True, eq=False)
class Scan:
    """The inclusive prefix sum of ``body`` along the row, at the element's column
    (``cumsum(x, dim=-1)``), accumulated in fp32 for floats and in 64 bits for integers and
    bools (``ctype``)."""

    body: Any
    ctype: str


@dataclass(frozen=True, eq=False)
class Fold:
    """A reduction over the dimension next to the row's, ``count`` long (``x.sum(dim=-2)``: a
    mixture of experts' weighted sum over each token's top-k, a mean over a sequence):
    ``kind`` (``sum``, ``max`` or ``min``) of ``body``, accumulated in ``ctype`` (fp32 for
    floats, 64 bits for integers). Each element of the reduced shape loops over k itself; the
    body's ``fold`` and ``foldrow`` loads are read at each k, V-wide along the row as any other
    load. An element's own loop keeps every read coalesced along the row, and needs no
    second pass: the dimension is short (a top-k, a few heads) in the kernels it serves."""

    kind: str
    body: Any
    count: str
    ctype: str


@dataclass(frozen=True, eq=False)
class ColumnIndex:
    """The element's own column in its row, as a float (exact below 2^24 columns): what an
    argmax reads to name the first column holding the row's maximum."""


@dataclass(frozen=True)
class AtColumn:
    """``body`` (a full expression) evaluated at column ``column`` (a row expression)."""

    body: Any
    column: Any


@dataclass(frozen=True)
class RowOf:
    """The row of a partly broadcast tensor that the iteration space's row r reads: r split
    into the full shape's row dimensions (``dims``, size expressions, outermost first), the
    digits of the dimensions the tensor has (``keep``) recombined over its own sizes."""

    dims: tuple[str, ...]
    keep: tuple[bool, ...]


@dataclass(frozen=True)
class Scatter:
    """An output written by rows: row r of ``value`` goes to row ``index`` (a row expression;
    negative counts from the end, as torch's indexing does) of the written argument ``arg``,
    which has ``rows`` rows; its other rows keep what they held."""

    arg: str
    index: Any
    value: Any
    rows: str


@dataclass(frozen=True)
class ColumnScatter:
    """An output written by columns: element (r, c) of ``value`` goes to column ``column`` (an
    integer expression of the element: an index matrix's entry; negative counts from the end, as
    in torch) of row r of the written argument ``arg``, ``width`` columns wide. The columns no
    index names keep what the argument held (``fill`` None: an inout argument the reference
    scatters into), or hold ``fill`` (a constant: the reference scattered into a tensor it made,
    ``torch.zeros(...).scatter(1, ids, w)``)."""

    arg: str
    column: Any
    value: Any
    width: str
    fill: Any = None


@dataclass(frozen=True, eq=False)
class TopK:
    """``torch.topk`` along the row: the ``count`` columns of ``key`` (a full expression) that
    rank first, largest (or smallest) first, NaN counting as the largest as in torch, and equal
    values in column order. Picked one at a time, each a pass over the row that keeps the best
    element ranked after the previous pick, and a reduction of (value, column) pairs over the
    row's threads: ``count`` is a top-k (a few experts, a sampler's k), not a sort."""

    key: Any
    count: str
    largest: bool


@dataclass(frozen=True, eq=False)
class Pick:
    """The value (``part`` ``value``, fp32) or column (``index``, an integer) of one pick of
    the program's :class:`TopK`: pick j is held by thread j of its row, so an expression over
    picks is a per-thread row value, and an output of one value per pick ([rows, count]) is
    written by the row's first ``count`` threads."""

    part: str


@dataclass(frozen=True, eq=False)
class PickReduce:
    """A reduction over the picks (``sum``, ``max`` or ``min`` of ``body``, an expression of
    :class:`Pick` values): a row value (a renormalisation's sum, a softmax over the picks)."""

    kind: str
    body: Any
    index: int


@dataclass(frozen=True, eq=False)
class PickAt:
    """``body`` (an expression over picks) at pick ``at`` (a size expression; ``last`` for the
    final pick): a row value (``values[:, -1:]``, the k-th largest, a top-k filter's bar)."""

    body: Any
    at: str
    index: int


@dataclass
class Program:
    """What the emitter needs.

    Attributes:
        kind: ``elementwise``, ``rowwise``, ``scan`` (prefix sums along the row, then maps)
            or ``transpose``.
        rows, cols: R and C as launch expressions over the shape symbols.
        outputs: written argument -> (space, expression); space ``scatter`` holds a
            :class:`Scatter`, space ``colscatter`` a :class:`ColumnScatter`.
        reductions: in dependency order.
        dtypes: tensor argument -> torch dtype name (``scalar`` for the run's type).
        transposed: for ``transpose``, the permuted argument and its [rows, cols] expressions.
        topk: the row's top-k (a ``rowwise`` program only); outputs of space ``pick`` hold one
            value per pick.
        picked: the row values made from the picks (:class:`PickReduce`, :class:`PickAt`), in
            dependency order.
    """

    kind: str
    rows: str
    cols: str
    outputs: dict[str, tuple[str, Any]]
    reductions: list[Reduce] = field(default_factory=list)
    dtypes: dict[str, str] = field(default_factory=dict)
    transposed: tuple[str, str, str] | None = None
    topk: TopK | None = None
    picked: list[Any] = field(default_factory=list)

    @property
    def has_gather(self) -> bool:
        return any(isinstance(n, Load) and by_index(n) for n in walk(self.all_roots()))

    def all_roots(self) -> list[Any]:
        roots = [e for _, e in self.outputs.values()] + [r.body for r in self.reductions]
        return roots + ([self.topk.key] if self.topk else []) + [p.body for p in self.picked]


def walk(roots: list[Any]) -> list[Any]:
    """Every node reachable from ``roots`` (each once), reductions' bodies included."""
    seen: dict[int, Any] = {}
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        if isinstance(node, Op):
            stack.extend(node.args)
        elif isinstance(node, Reduce | Scan | Fold | PickReduce | PickAt):
            stack.append(node.body)
        elif isinstance(node, AtColumn):
            stack.extend((node.body, node.column))
        elif isinstance(node, Load) and node.index is not None:
            stack.append(node.index)
        elif isinstance(node, Scatter):
            stack.extend((node.index, node.value))
        elif isinstance(node, ColumnScatter):
            stack.extend((node.column, node.value))
    return list(seen.values())


def ctype_of(node: Any) -> str:
    if isinstance(node, Load):
        return "load"
    if isinstance(node, Const):
        return node.ctype
    if isinstance(node, Param):
        return INT if node.name == "__isize" else FLOAT
    if isinstance(node, Reduce | ColumnIndex | PickReduce):
        return FLOAT
    if isinstance(node, Pick):
        return FLOAT if node.part == "value" else INT
    if isinstance(node, PickAt):
        return ctype_of(node.body)
    if isinstance(node, RowOf):
        return INT
    if isinstance(node, AtColumn):
        return ctype_of(node.body)
    return node.ctype


def _kind_of_dtype(dtype: Any) -> str:
    import torch

    if dtype == torch.bool:
        return BOOL
    return FLOAT if dtype.is_floating_point else INT


@dataclass(frozen=True)
class _Arange:
    """An arange not yet placed along a dimension: ``start + step * i``, of kind ``kind``."""

    start: int | float
    step: int | float
    kind: str


@dataclass(frozen=True)
class _Gathered:
    """Rows of the 2-D argument ``table`` picked by the index argument ``index``, not yet
    placed against the iteration space (see :meth:`_Reader.place_gather`); ``start``: where
    the value begins in the table's row at the two probes (a ``chunk`` of the gathered rows)."""

    table: str
    row_stride: str
    rows: str
    index: str
    start: tuple[int, int] = (0, 0)


@dataclass
class _Val:
    """A graph value: its expression (None for an argument not yet read) and shapes at both probes."""

    expr: Any
    shape: tuple[int, ...]
    shape_b: tuple[int, ...]
    arg: str | None = None  # a tensor argument, read lazily so slices and gathers see it whole
    dtype: Any = None


class _Reader:
    def __init__(self, spec: KernelSpec, trace: Trace) -> None:
        self.spec = spec
        self.trace = trace
        self.reductions: list[Reduce] = []
        self.dtypes = {a.name: a.dtype for a in spec.args if a.kind == "tensor"}
        self.full: tuple[int, ...] = ()
        self.full_b: tuple[int, ...] = ()
        self.splits: dict[Any, tuple[int, list[int], list[int]]] = {}  # split node -> dim, sizes at A and B
        self.pairs: dict[Any, tuple[_Val, _Val]] = {}  # max.dim node -> its values and indices
        self.placed: dict[tuple[Any, ...], Load] = {}  # (gathered rows, shape at A, at B) -> their load
        # A reduction over the dimension next to the row's: that dimension's place, and the
        # shape it is taken over at both probes (the iteration space is that shape without it).
        self.fold: tuple[int, tuple[int, ...], tuple[int, ...]] | None = None
        # A top-k along the row: it, the shape of its picks at both probes ([rows..., k]), and
        # the row values made from the picks.
        self.topk: TopK | None = None
        self.pick: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self.picked: list[Any] = []

    # ---- spaces
    def space(self, shape: tuple[int, ...]) -> str:
        if self.pick is not None and tuple(shape) == self.pick[0]:
            return "pick"
        if self.fold is not None and len(shape) == len(self.fold[1]):
            # A value of the folded shape's rank: along the folded dimension it varies (``fold``
            # for an element's, ``foldrow`` for a row's value at each k) or is broadcast (that
            # dimension dropped, it is a value of the iteration space).
            at, folded = self.fold[0], self.fold[1]
            rest = (*shape[:at], *shape[at + 1:])
            if shape[at] == folded[at]:
                if rest == self.full:
                    return "fold"
                if rest == (*self.full[:-1], 1):
                    return "foldrow"
                raise Unsupported(f"a value of shape {list(shape)} does not broadcast simply against {list(folded)}")
            if shape[at] == 1:
                shape = rest
        s = list(shape)
        while s and s[0] == 1 and len(s) > len(self.full):
            s.pop(0)
        if math.prod(s) == 1:
            return "scalar"
        rows = list(self.full[:-1])
        if s == list(self.full) or self.coarser(tuple(s)):
            return "full"
        if s == rows + [1] or (s == rows and rows) or (rows and self.coarser((*s, 1) if s[-1:] != [1] else tuple(s), rows=True)):
            return "row"
        stripped = list(s)
        while stripped and stripped[0] == 1:
            stripped.pop(0)
        if stripped == [self.full[-1]]:
            return "col"
        if self.broadcast_keep(tuple(shape)) is not None:
            return "bcast"
        raise Unsupported(f"a value of shape {list(shape)} does not broadcast simply against {list(self.full)}")

    def broadcast_keep(self, shape: tuple[int, ...], shape_b: tuple[int, ...] | None = None,
                       any_width: bool = False) -> tuple[bool, ...] | None:
        """For a shape broadcast against the full one (aligned from the right, each dimension
        the full one's or 1, the last the row's length or 1): per row dimension, whether the
        value has it; None for any other shape. Without ``shape_b`` only probe A is compared;
        ``any_width``: the last dimension may be of any length (a piece of the row)."""
        pad = len(self.full) - len(shape)
        if pad < 0:
            return None
        ones = (1,) * pad
        # A dimension as its sizes at the probes compared (probe A alone without shape_b).
        mine = list(zip(ones + tuple(shape), ones + tuple(shape_b if shape_b is not None else shape), strict=True))
        full = list(zip(self.full, self.full_b if shape_b is not None else self.full, strict=True))
        keep = []
        for dim, whole in zip(mine[:-1], full[:-1], strict=True):
            if dim == (1, 1):
                keep.append(False)
            elif dim == whole:
                keep.append(True)
            else:
                return None
        if mine[-1] not in (full[-1], (1, 1)) and not any_width:
            return None
        return tuple(keep)

    def size_expr(self, a: int, b: int) -> str:
        return fit_size(a, b, self.trace.probes)

    def row_sizes(self) -> tuple[str, ...]:
        """The iteration space's row dimensions as size expressions, outermost first."""
        return tuple(self.size_expr(a, b) for a, b in zip(self.full[:-1], self.full_b[:-1], strict=True))

    # ---- reading arguments
    def read(self, v: _Val) -> Any:
        if isinstance(v.expr, _Arange):
            return self.place(v.expr, v.shape, v.shape_b)
        if isinstance(v.expr, _Gathered):
            return self.place_gather(v.expr, v.shape, v.shape_b)
        if v.expr is not None:
            return v.expr
        assert v.arg is not None
        if self.narrow(v):  # a whole argument a cat puts in a row (see concat)
            return Load(v.arg, "full", row_stride=self.size_expr(v.shape[-1], v.shape_b[-1]))
        space = self.space(v.shape)
        if space == "pick":
            raise Unsupported("an argument read per pick of a top-k")
        if space in FOLD_READS:
            return self.fold_load(v, space)
        if space != "bcast":
            return Load(v.arg, space)
        # Broadcast over some row dimensions ([H, D] or [T, 1, D] against [T, H, D]): the row
        # it reads is a function of r, a whole row (a gather by that row) or one value of it.
        keep = self.broadcast_keep(v.shape, v.shape_b)
        if keep is None:
            raise Unsupported(f"a value of shapes {list(v.shape)} and {list(v.shape_b)} at the two probes")
        dims = self.row_sizes()
        index = RowOf(dims, keep)
        if v.shape[-1] == 1 and self.full[-1] != 1:
            return Load(v.arg, "row", index=index)
        return Load(v.arg, "gather", index=index)

    def fold_load(self, v: _Val, space: str) -> Load:
        """An argument of the folded shape (``fold``), or one value per row and position
        (``foldrow``, [..., K, 1]), checked at probe B as well."""
        assert self.fold is not None and v.arg is not None
        at, folded, folded_b = self.fold
        rest_b = (*v.shape_b[:at], *v.shape_b[at + 1:])
        want = self.full_b if space == "fold" else (*self.full_b[:-1], 1)
        if len(v.shape_b) != len(folded_b) or v.shape_b[at] != folded_b[at] or rest_b != want:
            raise Unsupported(f"a value of shapes {list(v.shape)} and {list(v.shape_b)} at the two probes")
        count = self.size_expr(folded[at], folded_b[at])
        if space == "fold":
            return Load(v.arg, "fold", row_stride=f"{count} * {self.size_expr(self.full[-1], self.full_b[-1])}")
        return Load(v.arg, "foldrow", row_stride=count)

    def choose_fold(self, computed: list[Any], nodes_a: list[Any], nodes_b: list[Any]) -> bool:
        """Takes as the iteration space the shape that the graph's reductions over the dimension
        next to the row's leave (all of them over the same shape); False when there are none."""
        folds = [n for n in computed if _fold_dim(n) is not None]
        if not folds:
            return False
        shapes = [(tuple(n.args[0].meta["val"].shape), tuple(nodes_b[nodes_a.index(n)].args[0].meta["val"].shape))
                  for n in folds]
        folded, folded_b = max(shapes, key=lambda ab: math.prod(ab[0]))
        at = len(folded) - 2
        for sa, sb in shapes:  # the others: the same, or broadcast along some dimensions ([B, S, 1])
            for mine, whole in ((sa, folded), (sb, folded_b)):
                if len(mine) != len(whole) or mine[at] != whole[at] \
                        or any(m not in (w, 1) for m, w in zip(mine, whole, strict=True)):
                    raise Unsupported("reductions over the next-to-last dimension of values of different shapes")
        if 1 in (folded[at], folded_b[at]):
            raise Unsupported("a reduction over a dimension of one")
        self.fold = (at, folded, folded_b)
        self.full = (*folded[:at], *folded[at + 1:])
        self.full_b = (*folded_b[:at], *folded_b[at + 1:])
        return True

    def fold_reduction(self, name: str, first: _Val, dtype: Any) -> Any:
        """``sum``, ``mean``, ``amax`` or ``amin`` over the dimension next to the row's, of
        result type ``dtype`` (the input's for floats: a lazily widened argument's value keeps
        the argument's own type, so the result's is the one to go by)."""
        assert self.fold is not None
        if name not in _FOLDS:
            raise Unsupported(f"{name} over the next-to-last dimension")
        if self.space(first.shape) not in FOLD_READS:
            raise Unsupported(f"{name} over the next-to-last dimension of a value broadcast along it")
        body = self.read(first)
        if any(isinstance(n, Fold) for n in walk([body])):
            raise Unsupported("a reduction over the next-to-last dimension of another one")
        at, folded, folded_b = self.fold
        count = self.size_expr(folded[at], folded_b[at])
        ctype = _kind_of_dtype(dtype)
        if ctype != FLOAT and name != "sum":
            raise Unsupported(f"{name} of integers over the next-to-last dimension")
        import torch

        half = dtype in (torch.float16, torch.bfloat16)
        if half:
            # What torch sums is the half tensor: each position's value rounded to it, summed in
            # fp32, the sum rounded to it again. A sum that cancels is made of those roundings.
            body = _cast(body, dtype, self.trace.element_casts)
        fold: Any = Fold(_FOLDS[name], body, count, INT if ctype != FLOAT else FLOAT)
        if name == "mean":
            fold = Op("div", (fold, Param("__size", count)), FLOAT)
        return _cast(fold, dtype, self.trace.element_casts) if half else fold

    def constant(self, x: Any) -> Any:
        if isinstance(x, bool):
            return Const(x, BOOL)
        if isinstance(x, int):
            return Const(x, INT)
        if isinstance(x, float):
            for name, value in self.spec.constants.items():
                if value == x or (math.isnan(value) and math.isnan(x)):
                    return Param(name)
            return Const(x, FLOAT)
        raise Unsupported(f"constant {x!r}")

    def operand(self, env: dict[Any, _Val], x: Any, xb: Any = None) -> Any:
        """A node's value, or a constant (``xb``: the same argument at probe B)."""
        if hasattr(x, "op"):
            return self.read(env[x])
        if isinstance(x, int | float) and isinstance(xb, int | float) and x != xb and not (x != x and xb != xb):
            return self.shape_constant(x, xb)
        return self.constant(x)

    def shape_constant(self, a: float, b: float) -> Any:
        """A number that differs between the two probes: the row's length (a mean's divisor)
        or its reciprocal, or any size the shape symbols make (``* shape["top_k"]``, ``/
        shape["hidden"]``: :func:`trace.fit_size`), an integer where the reference has one;
        any other shape-made number is one the program cannot say."""
        cols = Param("__cols")
        if (a, b) == (self.full[-1], self.full_b[-1]):
            return cols
        if a and b and math.isclose(1 / a, self.full[-1]) and math.isclose(1 / b, self.full_b[-1]):
            return Op("div", (Const(1.0, FLOAT), cols), FLOAT)
        whole = all(float(x).is_integer() and x > 0 for x in (a, b))
        try:
            if whole:
                size = self.size_expr(int(a), int(b))
                return Param("__isize", size) if isinstance(a, int) and isinstance(b, int) else Param("__size", size)
            if a > 0 and b > 0 and all(math.isclose(1 / x, round(1 / x)) for x in (a, b)):
                return Op("div", (Const(1.0, FLOAT), Param("__size", self.size_expr(round(1 / a), round(1 / b)))), FLOAT)
        except Unsupported:
            pass
        raise Unsupported(f"a constant made from the shape ({a} and {b} at the two probes)")

    # ---- the graph
    def run(self) -> Program:
        import torch

        ga, gb = self.trace.graphs
        nodes_a, nodes_b = list(ga.nodes), list(gb.nodes)
        computed = [n for n in nodes_a if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)]
        permutes = [n for n in computed if _opname(n) in ("permute", "transpose", "t")]
        if permutes:
            return self.transpose(nodes_a, nodes_b, permutes)
        if not computed:
            raise Unsupported("the reference computes nothing")
        # The iteration space: the largest value the graph computes, not an argument merely cast
        # or sliced (a gated activation's input row is twice its output row).
        lazy = {"_to_copy", "slice", "getitem", *_VIEWS, *_VALUES_AT}
        work = [n for n in computed if _opname(n) not in lazy] or computed
        picks = self.choose_topk(nodes_a, nodes_b)
        folded = not picks and self.choose_fold(computed, nodes_a, nodes_b)
        if not folded and not picks:
            big = max(range(len(nodes_a)), key=lambda i: _numel(nodes_a[i]) if nodes_a[i] in work else -1)
            self.full = tuple(nodes_a[big].meta["val"].shape)
            self.full_b = tuple(nodes_b[big].meta["val"].shape)
            self.refine(nodes_a, nodes_b, computed)
        scatters = [i for i, n in enumerate(nodes_a) if n in computed and _opname(n) in _VALUES_AT]
        if scatters and folded:
            raise Unsupported("a scatter beside a reduction over the next-to-last dimension")
        if scatters and picks:
            raise Unsupported("a scatter beside a top-k")
        if scatters:
            # What a scatter writes is the iteration space (its values' rows), not its target.
            at = _VALUES_AT[_opname(nodes_a[scatters[0]])]
            if _along_columns(nodes_a[scatters[0]]):
                at = 2  # a scatter along the columns writes one element per entry of its index
            values = [n.args[at] if len(n.args) > at else None for n in (nodes_a[scatters[0]], nodes_b[scatters[0]])]
            kept: list[Any] = [v for v in values if hasattr(v, "meta")]
            if len(kept) != 2:
                raise Unsupported("a scatter of a constant")
            self.full, self.full_b = (tuple(v.meta["val"].shape) for v in kept)
        if len(self.full) == 0:
            raise Unsupported("no tensor dimension to iterate over")
        rows = self.size_expr(math.prod(self.full[:-1]), math.prod(self.full_b[:-1]))
        cols = self.size_expr(self.full[-1], self.full_b[-1])
        env: dict[Any, _Val] = {}
        placeholders = iter(self.trace.inputs)
        outputs: dict[str, tuple[str, Any]] = {}
        for na, nb in zip(nodes_a, nodes_b, strict=True):
            if na.op == "placeholder":
                name = next(placeholders)
                val = na.meta["val"]
                env[na] = _Val(None, tuple(val.shape), tuple(nb.meta["val"].shape), arg=name, dtype=val.dtype)
            elif na.op == "call_function":
                env[na] = self.node(env, na, nb)
            elif na.op == "get_attr":
                raise Unsupported("a tensor made from Python values in the reference (torch.tensor(...))")
            elif na.op == "output":
                results = na.args[0]
                for name, res in zip(self.trace.outputs, results, strict=True):
                    v = env[res]
                    if isinstance(v.expr, Scatter):
                        outputs[name] = ("scatter", self.scatter_output(name, v.expr))
                        continue
                    if isinstance(v.expr, ColumnScatter):
                        outputs[name] = ("colscatter", self.column_scatter_output(name, v.expr))
                        continue
                    space = self.space(v.shape)
                    if space in ("col", "bcast", *FOLD_READS) or (space == "scalar" and math.prod(self.full[:-1]) != 1):
                        raise Unsupported(f"output {name} is not one value per element or per row")
                    outputs[name] = (space, self.read(v))
        if folded and (self.reductions or _has_at_column(outputs)
                       or any(isinstance(n, Scan) for n in walk([e for _, e in outputs.values()]))):
            raise Unsupported("a reduction over the next-to-last dimension beside row reductions or scans")
        if any(isinstance(n, Scan) for n in walk([e for _, e in outputs.values()])):
            if picks:
                raise Unsupported("a scan beside a top-k")
            return self.scan_program(rows, cols, outputs)
        if picks:
            return self.topk_program(rows, cols, outputs)
        kind = "rowwise" if self.reductions or _has_at_column(outputs) else "elementwise"
        if any(s == "colscatter" for s, _ in outputs.values()) and (kind != "elementwise" or len(outputs) != 1):
            raise Unsupported("a scatter along the columns beside other outputs or row reductions")
        if kind == "elementwise" and any(s not in ("full", "scatter", "row", "colscatter") for s, _ in outputs.values()):
            raise Unsupported("an elementwise graph with a single-value output")
        if kind == "rowwise" and any(s == "scatter" for s, _ in outputs.values()):
            raise Unsupported("a scatter after row reductions")
        return Program(kind, rows, cols, outputs, self.reductions, self.dtypes)

    def refine(self, nodes_a: list[Any], nodes_b: list[Any], computed: list[Any]) -> None:
        """Takes as the iteration space a computed value of the same elements whose row
        dimensions split the chosen one's (kv heads expanded over their group before a reshape
        merges them, [T, KVH, REP, D] for [T, H, D]): the rows keep their row-major order, and a
        value broadcast over the finer dimensions can then be read (:meth:`coarser`)."""
        for na, nb in zip(nodes_a, nodes_b, strict=True):
            if na not in computed:
                continue
            sa, sb = tuple(na.meta["val"].shape), tuple(nb.meta["val"].shape)
            if len(sa) > len(self.full) and _splits(sa, self.full) and _splits(sb, self.full_b):
                self.full, self.full_b = sa, sb

    def coarser(self, shape: tuple[int, ...], rows: bool = False) -> bool:
        """Whether ``shape`` is the iteration space (``rows``: one value per row, [..., 1]) with
        some of its row dimensions merged."""
        whole = (*self.full[:-1], 1) if rows else self.full
        return len(shape) < len(whole) and _splits(whole, tuple(shape))

    def scan_program(self, rows: str, cols: str, outputs: dict[str, tuple[str, Any]]) -> Program:
        """A program whose outputs hold prefix sums along the row: row reductions its scans
        read (a softmax's max and sum), computed first; reductions of what the scans give (a
        count of a cumulative distribution below a threshold), accumulated in the scan's own
        pass and read by one-per-row outputs only; nothing else a single pass over the row
        cannot give (gathers at a column, column reads by scalars, scatters, scans of scans)."""
        if _has_at_column(outputs):
            raise Unsupported("a scan beside a gather at one column per row")
        after = {r.index for r in self.reductions if any(isinstance(n, Scan) for n in walk([r.body]))}
        if any(space not in ("full", "row") for space, _ in outputs.values()):
            raise Unsupported("a scan program with an output that is not one value per element or per row")
        # (a reduction that reads one of these reads a scan, so it is one of them)
        full = [e for space, e in outputs.values() if space == "full"] + [r.body for r in self.reductions if r.index in after]
        if any(isinstance(n, Reduce) and n.index in after for n in walk(full)):
            raise Unsupported("a reduction of a scan read by an element or by another such reduction")
        nodes = walk([e for _, e in outputs.values()])
        if any(isinstance(n, Load) and n.access in ("colgather", "colshift") for n in nodes):
            raise Unsupported("a scan program reading columns by index or by cat")
        if any(isinstance(n, Scan) for s in nodes if isinstance(s, Scan) for n in walk([s.body])):
            raise Unsupported("a scan of a scan")
        return Program("scan", rows, cols, outputs, self.reductions, self.dtypes)

    def scan(self, first: _Val | None, na: Any, shape: tuple[int, ...], shape_b: tuple[int, ...], dtype: Any) -> _Val:
        """``cumsum(x, dim=-1)`` of a value with the iteration space's rows and columns."""
        dim = na.args[1] if len(na.args) > 1 else na.kwargs.get("dim")
        if first is None or dim not in (-1, len(shape) - 1):
            raise Unsupported("a cumsum along another dimension than the row")
        if self.space(shape) != "full" or len(shape) != len(self.full):
            raise Unsupported("a cumsum of something other than the iteration space's rows")
        kind = _kind_of_dtype(dtype)
        body = self.read(first)
        if kind == FLOAT:
            # torch sums in fp32 and rounds each prefix once to a narrower output type.
            scan = _cast(Scan(Op("tofloat", (body,), FLOAT), FLOAT), dtype, self.trace.element_casts)
            return _Val(scan, shape, shape_b, dtype=dtype)
        return _Val(Scan(body, INT), shape, shape_b, dtype=dtype)

    def arange(self, na: Any, nb: Any, shape: tuple[int, ...], shape_b: tuple[int, ...], dtype: Any) -> _Val:
        """``torch.arange(start, end, step)``: kept as a :class:`_Arange` until the dimension it
        runs along is known (:meth:`place`)."""
        ends = (na.args, nb.args)
        starts = [a[0] if len(a) > 1 else 0 for a in ends]
        steps = [a[2] if len(a) > 2 else 1 for a in ends]
        if starts[0] != starts[1] or steps[0] != steps[1]:
            raise Unsupported("an arange whose start or step is made from the shape")
        return _Val(_Arange(starts[0], steps[0], _kind_of_dtype(dtype)), shape, shape_b, dtype=dtype)

    def place(self, r: _Arange, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> Any:
        """An arange seen at ``shape`` (itself, or a view of it such as ``[:, None]``), aligned
        from the right against the iteration space: its one dimension longer than 1 must be one
        of the space's, at both probes. Along the row it is the column's index; along a row
        dimension, that dimension's digit of the row (a mask by length, a causal mask's rows and
        columns); times ``step`` plus ``start``."""
        pad = len(self.full) - len(shape)
        dims = list(zip(self.full, self.full_b, strict=True))
        mine = [(1, 1)] * pad + list(zip(shape, shape_b, strict=True)) if pad >= 0 else []
        at = [j for j, d in enumerate(mine) if d != (1, 1)]
        if len(at) != 1 or mine[at[0]] != dims[at[0]]:
            raise Unsupported("an arange that does not run along one dimension of the iteration space")
        if at[0] == len(dims) - 1:
            index: Any = ColumnIndex() if r.kind == FLOAT else Op("toint", (ColumnIndex(),), INT, ("long long",))
        else:
            sizes = self.row_sizes()
            index = RowOf(sizes, tuple(j == at[0] for j in range(len(sizes))))
            index = Op("tofloat", (index,), FLOAT) if r.kind == FLOAT else index
        if r.step != 1:
            index = Op("mul", (index, _as_kind(self.constant(r.step), r.kind)), r.kind)
        if r.start != 0:
            index = Op("add", (index, _as_kind(self.constant(r.start), r.kind)), r.kind)
        return index

    def node(self, env: dict[Any, _Val], na: Any, nb: Any) -> _Val:
        import torch

        name = _opname(na)
        val = na.meta.get("val")
        if name in _SPLITS:
            return self.split(env, na, nb)
        if name in ("topk", "sort"):
            return self.top_k(env, na, nb)
        if name in ("max", "min") and isinstance(val, tuple | list):
            if self.narrow(env[na.args[0]]):  # as for any reduction (below)
                raise Unsupported(f"{name} of a piece narrower than the row")
            return self.extreme_pair(env, na, nb)
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"{name} returns no single tensor")
        shape, shape_b = tuple(val.shape), tuple(nb.meta["val"].shape)
        kind = _kind_of_dtype(val.dtype)
        args, args_b = na.args, nb.args
        first = env.get(args[0]) if args and hasattr(args[0], "op") else None

        def operands(n: int) -> list[Any]:
            return [self.operand(env, x, y) for x, y in zip(args[:n], args_b[:n], strict=True)]

        def out(expr: Any) -> _Val:
            return _Val(expr, shape, shape_b, dtype=val.dtype)

        if name in _VIEWS and first is not None and first.expr is None and (shape, shape_b) == (first.shape, first.shape_b):
            return first  # a view that changes nothing (an expand to the argument's own shape)
        # A gather's table is read at its index, by its own width, whatever the row's.
        # So is a scatter's target along the columns, written at its index's columns.
        table = args[0] if (name in ("gather", "index_select", "index", "embedding") or _along_columns(na)) \
            and args and args[0] in env else None
        piece = name == "getitem" and args[0] in self.splits  # a split's piece: a narrower range of it
        if name != "cat" and name not in _NARROW_OK and not piece \
                and any(self.narrow(env[x]) for x in args if x in env and x is not table):
            # A piece narrower than the row means its own columns to elementwise ops and to cat
            # only: a reduction or a view would read it as if it were the whole row.
            raise Unsupported(f"{name} of a piece narrower than the row")
        if name == "cat":
            return self.concat(env, na, nb, shape, shape_b)
        if name == "select" and first is not None and first.shape[args[1]] == 1 and first.shape_b[args_b[1]] == 1:
            name = "squeeze"  # x[:, 0] of a dimension of one: the same elements, that dimension dropped
        if name in _VIEWS:
            assert first is not None
            if isinstance(first.expr, _Arange):  # a view places it (arange(n)[:, None])
                return out(self.place(first.expr, shape, shape_b))
            if isinstance(first.expr, _Gathered):
                # A gathered row seen through a view (table[ids][:, None, :]) is placed where it
                # is read (see read), at its last shape: a slice may still take a piece of it.
                return _Val(first.expr, shape, shape_b, dtype=first.dtype)
            if first.expr is None and name == "expand":
                # Explicit broadcasting: the argument's memory has its own shape, not the
                # expanded one, so it is read by its own shape (a row, a column...) and broadcast.
                self.space(shape)
                return out(self.read(first))
            if first.expr is None:  # an argument seen through a view: still read lazily
                return _Val(None, shape, shape_b, arg=first.arg, dtype=first.dtype)
            if name != "expand" and first.shape == self.full and first.shape_b == self.full_b \
                    and math.prod(shape) == math.prod(self.full) and math.prod(shape_b) == math.prod(self.full_b):
                # A reshape of a whole value (heads split out of a row and merged back): every
                # value is contiguous, so its elements keep their places in the iteration space.
                return _Val(first.expr, self.full, self.full_b, dtype=val.dtype)
            self.space(shape)
            return out(first.expr)
        if name in ("slice", "select") and self.pick is not None and first is not None and first.expr is not None \
                and self.space(first.shape) == "pick":
            return self.pick_at(first, na, nb, shape, shape_b)
        if name == "_to_copy":
            assert first is not None
            if first.expr is None and kind == FLOAT and first.dtype.is_floating_point \
                    and val.dtype in (torch.float32, torch.float64, first.dtype):
                # A widening cast of an argument: read it lazily still (the cast happens at the
                # load, exactly). float16 to bfloat16 is not one: it keeps the size and rounds.
                return _Val(None, shape, shape_b, arg=first.arg, dtype=first.dtype)
            return out(_cast(self.read(first), val.dtype, self.trace.element_casts))
        if name == "slice":
            return self.slice(first, na, nb, shape, shape_b)
        if name == "getitem":
            return self.piece(env, na, nb, shape, shape_b)
        if name in ("index", "embedding", "index_select"):
            return self.gather_rows(env, na, name, shape, shape_b)
        if name == "index_put":
            return self.scatter_rows(env, na, shape, shape_b)
        if name == "scatter":
            return self.scatter_along_rows(env, na, shape, shape_b)
        if name in ("scalar_tensor", "full", "full_like", "zeros_like", "ones_like", "zeros", "ones"):
            at = {"zeros_like": None, "ones_like": None, "zeros": None, "ones": None, "scalar_tensor": 0}.get(name, 1)
            value = {"zeros_like": 0, "ones_like": 1, "zeros": 0, "ones": 1}.get(name, args[at] if at is not None and len(args) > at else 0)
            value_b = nb.args[at] if at is not None and len(nb.args) > at else value
            constant = self.shape_constant(value, value_b) if value != value_b and value == value else self.constant(value)
            return out(_as_kind(constant, kind))
        if name in UNARY:
            return out(Op(name, (self.read(first),), FLOAT))  # type: ignore[arg-type]
        if name in TESTS:
            return out(Op(name, (self.read(first),), BOOL))  # type: ignore[arg-type]
        if name == "gelu":
            approx = na.kwargs.get("approximate", "none")
            return out(Op("gelu_tanh" if approx == "tanh" else "gelu", (self.read(first),), FLOAT))  # type: ignore[arg-type]
        if name in ("logical_not", "bitwise_not") and kind == BOOL:
            return out(Op("not", (self.read(first),), BOOL))  # type: ignore[arg-type]
        if name in BINARY:
            a, b = operands(2)
            if len(args) > 2 or "alpha" in na.kwargs:
                alpha = na.kwargs.get("alpha", args[2] if len(args) > 2 else 1)
                b = Op("mul", (b, self.constant(alpha)), FLOAT)
            return out(Op(name, (a, b), kind))
        if name in COMPARE:
            a, b = operands(2)
            return out(Op(name, (a, b), BOOL))
        if name in BITWISE and kind == INT:
            a, b = operands(2)
            return out(Op("bits", (a, b), INT, (BITWISE[name],)))
        if name in ("logical_and", "logical_or", "bitwise_and", "bitwise_or") and kind == BOOL:
            a, b = operands(2)
            return out(Op("and" if name.endswith("and") else "or", (a, b), BOOL))
        if name == "where":
            c, a, b = operands(3)
            return out(Op("where", (c, a, b), kind))
        if name in ("clamp", "clamp_min", "clamp_max"):
            def bounds(n: Any) -> tuple[Any, Any]:
                lo = n.args[1] if name != "clamp_max" and len(n.args) > 1 else None
                hi = n.args[2] if name == "clamp" and len(n.args) > 2 else (n.args[1] if name == "clamp_max" else None)
                return n.kwargs.get("min", lo), n.kwargs.get("max", hi)

            def bound(x: Any, xb: Any) -> Any:
                """A bound: a tensor (per row, column or element), a number both probes share,
                or a size the shape makes (``clamp(max=vocab - 1)``)."""
                if hasattr(x, "op"):
                    return self.operand(env, x)
                if x != xb:
                    return self.shape_constant(x, xb)
                return self.constant(float(x))

            (lo, hi), (lo_b, hi_b) = bounds(na), bounds(nb)
            expr = self.read(first)  # type: ignore[arg-type]
            if lo is not None:
                expr = Op("maximum", (expr, bound(lo, lo_b)), FLOAT)
            if hi is not None:
                expr = Op("minimum", (expr, bound(hi, hi_b)), FLOAT)
            return out(expr)
        if name == "masked_fill":
            _, mask, fill = operands(3)
            return out(Op("where", (mask, fill, self.read(first)), kind))  # type: ignore[arg-type]
        if name in ("sum", "amax", "amin", "mean", "var", "linalg_vector_norm", "_log_softmax", "_softmax", "logsumexp",
                    "argmax", "argmin"):
            return out(self.reduction(name, first, na))
        if name == "gather":
            return self.at_column(env, na, first, shape, shape_b)
        if name == "cumsum":
            return self.scan(first, na, shape, shape_b, val.dtype)
        if name == "arange":
            return self.arange(na, nb, shape, shape_b, val.dtype)
        raise Unsupported(f"aten op {name} is not supported")

    def slice(self, first: _Val | None, na: Any, nb: Any, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> _Val:
        assert first is not None
        if isinstance(first.expr, Pick) and (shape, shape_b) == self.pick:  # a sort's first k columns
            return _Val(first.expr, shape, shape_b, dtype=first.dtype)
        dim = na.args[1] if len(na.args) > 1 else 0
        step = na.args[4] if len(na.args) > 4 else 1
        start_a, start_b = (n.args[2] if len(n.args) > 2 else 0 for n in (na, nb))
        return self.row_range(first, dim, step, max(0, start_a), max(0, start_b), shape, shape_b)

    def split(self, env: dict[Any, _Val], na: Any, nb: Any) -> _Val:
        """``split_with_sizes`` (``chunk``, ``split``): its pieces are read where ``getitem``
        takes them (:meth:`piece`); the node itself stands for its input."""
        name = _opname(na)
        first = env[na.args[0]]

        def sizes(n: Any, total: int) -> list[int]:
            size = n.args[1]
            if name == "split":  # one size for every piece but the last
                size = [min(size, total - i) for i in range(0, total, size)]
            return list(size)

        dim = na.args[2] if len(na.args) > 2 else 0
        self.splits[na] = (dim, sizes(na, first.shape[dim]), sizes(nb, first.shape_b[dim]))
        return first

    def piece(self, env: dict[Any, _Val], na: Any, nb: Any, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> _Val:
        """``getitem`` of a split's pieces (a contiguous range of the split input's last
        dimension), or of a max's values and indices."""
        source, i = na.args
        if source in self.pairs and isinstance(i, int):
            return self.pairs[source][i]
        if source not in self.splits or not isinstance(i, int):
            raise Unsupported("getitem of something other than a split")
        dim, sizes_a, sizes_b = self.splits[source]
        return self.row_range(env[source], dim, 1, sum(sizes_a[:i]), sum(sizes_b[:i]), shape, shape_b)

    def narrow(self, v: _Val) -> bool:
        """Whether a value is a piece of the iteration space's row: its rows, fewer columns
        (more than one: a column of one is a row value). Beside a reduction over the dimension
        next to the row's, a value as wide as that dimension is one value per row and position
        ([B, S] of a [B, S, D] value), seen through a view before it is read."""
        if self.fold is not None and (v.shape[-1:], v.shape_b[-1:]) == ((self.fold[1][-2],), (self.fold[2][-2],)):
            return False
        if self.pick is not None and (v.shape, v.shape_b) == self.pick:
            return False
        return (len(v.shape) == len(self.full) > 0 and v.shape[:-1] == self.full[:-1]
                and v.shape_b[:-1] == self.full_b[:-1] and v.shape[-1] < self.full[-1] and v.shape_b[-1] < self.full_b[-1]
                and (v.shape[-1], v.shape_b[-1]) != (1, 1))

    def concat(self, env: dict[Any, _Val], na: Any, nb: Any, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> _Val:
        """``cat`` along the row: column c takes the piece it falls in, read at c less the
        piece's start (:func:`_shifted`), chosen by a ``where`` on the column. Each piece is an
        elementwise expression of its own columns, or a row value (a column of one)."""
        dim = na.args[1] if len(na.args) > 1 else na.kwargs.get("dim", 0)
        if dim not in (-1, len(shape) - 1):
            raise Unsupported("a cat along another dimension than the row")
        if self.space(shape) != "full" or len(shape) != len(self.full):
            raise Unsupported("a cat that is not the iteration space's row")
        pieces: list[tuple[str, Any]] = []  # (its first column, its expression)
        at_a = at_b = 0
        for xa in na.args[0]:
            v = env[xa]
            wa, wb = v.shape[-1], v.shape_b[-1]
            if (wa, wb) == (0, 0):
                continue
            if len(v.shape) != len(shape) or v.shape[:-1] != shape[:-1] or v.shape_b[:-1] != shape_b[:-1]:
                raise Unsupported("a cat of pieces with other rows")
            start = "0" if (at_a, at_b) == (0, 0) else self.size_expr(at_a, at_b)
            width = self.size_expr(wa, wb)
            pieces.append((start, _shifted(self.read(v), start, width, {})))
            at_a, at_b = at_a + wa, at_b + wb
        if not pieces:
            raise Unsupported("a cat of empty pieces")
        kind = _kind_of_dtype(na.meta["val"].dtype)
        column = ColumnIndex()
        expr = pieces[-1][1]
        for (_, piece), (start, _) in zip(reversed(pieces[:-1]), reversed(pieces[1:]), strict=True):
            expr = Op("where", (Op("lt", (column, Param("__size", start)), BOOL), piece, expr), kind)
        return _Val(expr, shape, shape_b, dtype=na.meta["val"].dtype)

    def row_range(self, first: _Val, dim: int, step: int, start_a: int, start_b: int, shape: tuple[int, ...],
                  shape_b: tuple[int, ...]) -> _Val:
        """The elements ``start`` onwards of an argument's rows (last dimension), in the
        iteration space's row; or of rows gathered from a table (the same piece of each)."""
        last = dim in (-1, len(first.shape) - 1)
        if isinstance(first.expr, _Gathered) and step == 1 and last:  # placed where it is read
            g = first.expr
            return _Val(_Gathered(g.table, g.row_stride, g.rows, g.index, (g.start[0] + start_a, g.start[1] + start_b)),
                        shape, shape_b, dtype=first.dtype)
        if isinstance(first.expr, Load) and first.expr.access in ("full", "gather") and step == 1 and last \
                and self.narrow(_Val(None, shape, shape_b)):
            # A range of a range of an argument's row (a chunk of x[..., :rot]) or of a gathered
            # row (cache[positions].chunk(2, -1)): the offsets add up.
            at_a, at_b = self.at_probes(first.expr.offset)
            return _Val(replace(first.expr, offset=self.size_expr(at_a + start_a, at_b + start_b)), shape, shape_b,
                        dtype=first.dtype)
        if first.expr is not None or step != 1 or not last:
            raise Unsupported("a slice other than a contiguous range of an argument's last dimension")
        parent = self.size_expr(first.shape[-1], first.shape_b[-1])
        piece = _Val(None, shape, shape_b)
        if len(first.shape) != len(shape) or (not self.narrow(piece) and self.space(shape) != "full"):
            raise Unsupported("a slice that is not the iteration space's row or a piece of it")
        expr = Load(first.arg or "", "full", row_stride=parent, offset=self.size_expr(start_a, start_b))
        return _Val(expr, shape, shape_b, dtype=first.dtype)

    def at_probes(self, size: str) -> tuple[int, int]:
        """A size expression (made by :func:`fit_size`) at the two probes."""
        at_a, at_b = (evaluate(size, p) for p in self.trace.probes)
        return at_a, at_b

    def gather_rows(self, env: dict[Any, _Val], na: Any, name: str, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> _Val:
        """``table[idx]``, ``embedding(table, idx)`` or ``table.index_select(0, idx)``: row r of
        a 2-D argument's row idx[r] (negative ones from the end)."""
        if name == "index" and len(na.args[1]) == 2 and na.args[1][0] is None:  # x[:, perm]
            return self.gather_columns(env[na.args[0]], self.column_index(env[na.args[1][1]]), shape, shape_b)
        if name == "index" and len(na.args[1]) != 1:
            raise Unsupported("indexing by several tensors")
        if name == "index_select":
            if na.args[1] in (1, -1):
                return self.gather_columns(env[na.args[0]], self.column_index(env[na.args[2]]), shape, shape_b)
            if na.args[1] not in (0, -2):
                raise Unsupported("an index_select along another dimension than the rows")
            table, idx = na.args[0], na.args[2]
        else:
            table, idx = (na.args[0], na.args[1][0]) if name == "index" else (na.args[0], na.args[1])
        t = env[table]
        if t.expr is not None or len(t.shape) != 2:
            raise Unsupported("a gather from something other than a 2-D argument")
        stride = self.size_expr(t.shape[-1], t.shape_b[-1])
        rows = self.size_expr(t.shape[0], t.shape_b[0])
        i = env[idx]
        if i.expr is None and i.arg is not None and len(shape) < len(self.full):
            # Rows picked for a value that a view broadcasts over other dimensions next
            # (``cos_cache[positions][:, None, :]`` against [T, H, D]): placed by that view.
            return _Val(_Gathered(t.arg or "", stride, rows, i.arg), shape, shape_b, dtype=t.dtype)
        index = self.read(i)
        if self.space(shape) != "full" or self.space(i.shape) != "row":
            raise Unsupported("a gather whose rows are not the iteration space's rows")
        return _Val(Load(t.arg or "", "gather", row_stride=stride, index=index, rows=rows), shape, shape_b,
                    dtype=t.dtype)

    def place_gather(self, g: _Gathered, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> Load:
        """Rows of a table picked by an index argument, seen at ``shape``: the row dimensions it
        keeps (:meth:`broadcast_keep`) are the index's, so the iteration space's row r reads the
        index at r's digits of those dimensions, and the table's row there. One load per
        placement, however often it is read (each read of a value places it again)."""
        key = (g, shape, shape_b)
        if key not in self.placed:
            self.placed[key] = self._place_gather(g, shape, shape_b)
        return self.placed[key]

    def _place_gather(self, g: _Gathered, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> Load:
        whole = (shape[-1], shape_b[-1]) == (self.full[-1], self.full_b[-1])
        # A piece of the row (a chunk of the gathered rows) meets other pieces of its width only:
        # torch's broadcasting has checked that against the values it is combined with.
        piece = self.narrow(_Val(None, (*self.full[:-1], shape[-1]), (*self.full_b[:-1], shape_b[-1])))
        keep = self.broadcast_keep(shape, shape_b, any_width=piece)
        if keep is None or not (whole or piece):
            raise Unsupported("a gathered row that does not broadcast against the iteration space")
        dims = self.row_sizes()
        at = Load(g.index, "row", index=RowOf(dims, keep))
        offset = "0" if g.start == (0, 0) else self.size_expr(*g.start)
        return Load(g.table, "gather", row_stride=g.row_stride, index=at, rows=g.rows, offset=offset)

    def index_load(self, expr: Any) -> Load | None:
        """The integer argument an index reads, through widenings (``perm.long()``), else None."""
        while isinstance(expr, Op) and expr.name == "toint" and expr.extra == ("long long",):
            expr = expr.args[0]
        if isinstance(expr, Load) and self.dtypes.get(expr.arg) in ("int32", "int64"):
            return expr
        return None

    def column_index(self, idx: _Val) -> Load:
        """The load of an index row that a column gather reads (one entry per column)."""
        if self.space(idx.shape) != "col":
            raise Unsupported("a column gather by an index that differs between rows")
        index = self.index_load(self.read(idx))
        if index is None or index.access != "col":
            raise Unsupported("a column gather by a computed index")
        return index

    def gather_columns(self, t: _Val, index: Load, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> _Val:
        """Column c of each row read from column index[c] (a ``col`` index: ``x[:, perm]``,
        ``index_select`` or ``gather`` along the columns by one index row) or index[r, c] (a
        ``full`` one: ``gather`` by a row of indices per row) of an argument's same row: the
        argument's rows may be of another length than the iteration space's."""
        if t.expr is not None or t.arg is None or len(t.shape) != len(self.full):
            raise Unsupported("a column gather from something other than an argument with the rows' dimensions")
        if self.space(shape) != "full" or t.shape[:-1] != self.full[:-1] or t.shape_b[:-1] != self.full_b[:-1]:
            raise Unsupported("a column gather whose rows are not the iteration space's rows")
        width = self.size_expr(t.shape[-1], t.shape_b[-1])
        return _Val(Load(t.arg, "colgather", row_stride=width, index=index, rows=width), shape, shape_b,
                    dtype=t.dtype)

    def scatter_rows(self, env: dict[Any, _Val], na: Any, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> _Val:
        """``target[index] = values``: row r of the values to row index[r] of a 2-D argument."""
        target, indices, values = na.args[:3]
        if (na.args[3] if len(na.args) > 3 else na.kwargs.get("accumulate", False)):
            raise Unsupported("a scatter that accumulates")
        if len(indices) != 1 or not hasattr(indices[0], "op"):
            raise Unsupported("a scatter by several index tensors")
        if not hasattr(values, "op") or self.space(env[values].shape) != "full" or self.space(env[indices[0]].shape) != "row":
            raise Unsupported("a scatter whose values are not the iteration space's rows, one index each")
        return self.scatter(env[target], self.read(env[indices[0]]), env[values], na, shape, shape_b)

    def scatter(self, t: _Val, index: Any, values: _Val, na: Any, shape: tuple[int, ...],
                shape_b: tuple[int, ...]) -> _Val:
        """Row r of ``values`` to row ``index`` (a row expression) of the 2-D argument ``t``."""
        if t.expr is not None or t.arg is None or len(t.shape) != 2:
            raise Unsupported("a scatter into something other than a 2-D argument")
        if (t.shape[-1], t.shape_b[-1]) != (self.full[-1], self.full_b[-1]):
            raise Unsupported("a scatter into rows of another length")
        rows = self.size_expr(t.shape[0], t.shape_b[0])
        return _Val(Scatter(t.arg, index, self.read(values), rows), shape, shape_b, dtype=na.meta["val"].dtype)

    def scatter_along_rows(self, env: dict[Any, _Val], na: Any, shape: tuple[int, ...],
                           shape_b: tuple[int, ...]) -> _Val:
        """``target.scatter(0, index, values)`` whose index is one row index repeated along
        each row (``slots[:, None].expand(-1, h)``): ``target[slots] = values`` written another way."""
        if _along_columns(na):
            return self.scatter_columns(env, na, shape, shape_b)
        if len(na.args) != 4 or na.kwargs.get("reduce") or not hasattr(na.args[3], "op"):
            raise Unsupported("a scatter that reduces, or of a number")
        target, dim, index, values = na.args
        if dim not in (0, -2):
            raise Unsupported("a scatter along the columns of a value computed per row")
        if self.space(env[values].shape) != "full" or self.space(env[index].shape) != "full":
            raise Unsupported("a scatter whose values are not the iteration space's rows")
        idx = self.read(env[index])
        if not (isinstance(idx, Load) and idx.access == "row"):
            raise Unsupported("a scatter whose index differs along a row")
        return self.scatter(env[target], idx, env[values], na, shape, shape_b)

    def scatter_columns(self, env: dict[Any, _Val], na: Any, shape: tuple[int, ...],
                        shape_b: tuple[int, ...]) -> _Val:
        """``target.scatter(1, index, values)`` (or of one number): element (r, j) of the values
        to column index[r, j] of row r of a 2-D target, an argument or a constant tensor."""
        if len(na.args) != 4 or na.kwargs.get("reduce"):
            raise Unsupported("a scatter along the columns that reduces")
        target, _, index, values = na.args
        t, idx = env[target], env[index]
        if len(self.full) != 2 or len(t.shape) != 2 or (t.shape[0], t.shape_b[0]) != (self.full[0], self.full_b[0]):
            raise Unsupported("a scatter along the columns of other than 2-D rows, one row of the index per row")
        if self.space(idx.shape) != "full":
            raise Unsupported("a scatter along the columns whose index is not one entry per element")
        column = self.read(idx)
        if self.index_load(column) is None:
            raise Unsupported("a scatter along the columns by an index that is not integer")
        if hasattr(values, "op"):
            if self.space(env[values].shape) != "full":
                raise Unsupported("a scatter along the columns of values not one per index entry")
            value = self.read(env[values])
        else:
            value = self.constant(values)
        width = self.size_expr(t.shape[-1], t.shape_b[-1])
        own = self.index_load(column)
        if any(isinstance(n, Load) and n.arg == t.arg and (n.access != "colgather" or n.index != own)
               for n in walk([value])):
            # (the schedule keeps apart only one column's read and write: codegen.scatter)
            raise Unsupported("a scatter along the columns of values read from other columns of its target")
        if t.expr is None and t.arg is not None:
            scatter = ColumnScatter(t.arg, column, value, width)
        elif isinstance(t.expr, Const):
            scatter = ColumnScatter("", column, value, width, fill=t.expr)
        else:
            raise Unsupported("a scatter along the columns into a computed tensor")
        return _Val(scatter, shape, shape_b, dtype=na.meta["val"].dtype)

    def column_scatter_output(self, name: str, scatter: ColumnScatter) -> ColumnScatter:
        """The scatter an output is: into itself as an inout argument, or into a constant tensor
        (then it writes every column of the output: the constant where no index names one)."""
        role = next((a.role for a in self.spec.args if a.name == name), None)
        if scatter.fill is not None:
            return replace(scatter, arg=name)
        if scatter.arg != name or role != "inout":
            raise Unsupported(f"output {name} is a scatter into {scatter.arg}, not into itself as an inout argument")
        return scatter

    def scatter_output(self, name: str, scatter: Scatter) -> Scatter:
        """The scatter an output is, if it writes into that same argument, which the kernel
        reads and writes (its unwritten rows are the argument's own)."""
        role = next((a.role for a in self.spec.args if a.name == name), None)
        if scatter.arg != name or role != "inout":
            raise Unsupported(f"output {name} is a scatter into {scatter.arg}, not into itself as an inout argument")
        return scatter

    def reduction(self, name: str, first: _Val | None, na: Any) -> Any:
        assert first is not None
        if name == "linalg_vector_norm":
            order = na.args[1] if len(na.args) > 1 else 2
            dims = na.args[2] if len(na.args) > 2 else None
            if order != 2:
                raise Unsupported("a vector norm other than L2")
        else:
            dims = na.args[1] if len(na.args) > 1 else None
        if isinstance(dims, int):
            dims = [dims]
        if self.fold is not None and dims and len(dims) == 1 and len(first.shape) == len(self.fold[1]) \
                and dims[0] % len(first.shape) == self.fold[0]:
            return self.fold_reduction(name, first, na.meta["val"].dtype)
        if not dims or len(dims) != 1 or dims[0] not in (-1, len(first.shape) - 1):
            raise Unsupported(f"{name} over dimensions {dims}, not the last one")
        picks = self.pick is not None and self.space(first.shape) == "pick"
        if not picks and self.space(first.shape) != "full":
            raise Unsupported(f"{name} of a value that is not one per element")
        if picks and name in ("var", "linalg_vector_norm", "argmax", "argmin"):
            raise Unsupported(f"{name} over the picks of a top-k")
        x = self.read(first)
        # Over the picks of a top-k: the same reductions, over the row's first count threads.
        red: Callable[[str, Any], Any] = self.pick_reduce if picks else self.reduce
        cols = Param("__size", self.topk.count) if picks and self.topk else Param("__cols")
        if name == "sum":
            return red("sum", x)
        if name == "amax":
            return red("max", x)
        if name == "amin":
            return red("min", x)
        if name == "mean":
            return Op("div", (red("sum", x), Op("tofloat", (cols,), FLOAT)), FLOAT)
        if name == "var":  # two passes, as torch: the mean, then the squared deviations from it
            correction = na.kwargs.get("correction", na.args[2] if len(na.args) > 2 else 1)
            width = Op("tofloat", (cols,), FLOAT)
            dev = Op("sub", (x, Op("div", (self.reduce("sum", x), width), FLOAT)), FLOAT)
            total = self.reduce("sum", Op("mul", (dev, dev), FLOAT))
            less = Const(float(1 if correction is None else correction), FLOAT)
            return Op("div", (total, Op("sub", (width, less), FLOAT)), FLOAT)
        if name == "linalg_vector_norm":
            return Op("sqrt", (self.reduce("sum", Op("mul", (x, x), FLOAT)),), FLOAT)
        if name in ("argmax", "argmin"):
            return self.extreme(x, "max" if name == "argmax" else "min")[1]
        m = red("max", x)
        # A row of -inf only: torch gives NaN; subtracting a max of -inf gives NaN too.
        shifted = Op("sub", (x, m), FLOAT)
        total = red("sum", Op("exp", (shifted,), FLOAT))
        if name == "_softmax":
            return Op("div", (Op("exp", (shifted,), FLOAT), total), FLOAT)
        if name == "_log_softmax":
            return Op("sub", (shifted, Op("log", (total,), FLOAT)), FLOAT)
        return Op("add", (Op("log", (total,), FLOAT), m), FLOAT)  # logsumexp

    def extreme(self, x: Any, kind: str) -> tuple[Reduce, Op]:
        """The row's max (or min) and the first column holding it, in two passes as softmax's:
        NaN counts as the extreme, as in torch (the max and min keep NaN, so a row holding one
        names its first NaN)."""
        m = self.reduce(kind, x)
        same = Op("or", (Op("eq", (x, m), BOOL),
                         Op("and", (Op("isnan", (x,), BOOL), Op("isnan", (m,), BOOL)), BOOL)), BOOL)
        first_col = self.reduce("min", Op("where", (same, ColumnIndex(), Const(math.inf, FLOAT)), FLOAT))
        return m, Op("toint", (first_col,), INT, ("long long",))

    def extreme_pair(self, env: dict[Any, _Val], na: Any, nb: Any) -> _Val:
        """``x.max(dim=-1)`` (or ``min``): its values and indices are read where ``getitem``
        takes them (:meth:`piece`); the node itself stands for its input."""
        first = env[na.args[0]]
        dim = na.args[1] if len(na.args) > 1 else None
        if dim not in (-1, len(first.shape) - 1) or self.space(first.shape) != "full":
            raise Unsupported(f"{_opname(na)} over dimension {dim}, not the last one of a value per element")
        m, idx = self.extreme(self.read(first), _opname(na))
        (va, ia), (vb, ib) = na.meta["val"], nb.meta["val"]
        self.pairs[na] = (_Val(m, tuple(va.shape), tuple(vb.shape), dtype=va.dtype),
                          _Val(idx, tuple(ia.shape), tuple(ib.shape), dtype=ia.dtype))
        return first

    def reduce(self, kind: str, body: Any) -> Reduce:
        r = Reduce(kind, body, len(self.reductions))
        self.reductions.append(r)
        return r

    # ---- a top-k along the row
    def choose_topk(self, nodes_a: list[Any], nodes_b: list[Any]) -> bool:
        """Takes as the iteration space the row a ``topk`` ranks, and its picks' shape as the
        ``pick`` space; False when the graph has no top-k. A ``sort`` along the row whose values
        and indices are only read as their first k columns (``x.sort(descending=True).indices[:,
        :k]``) is the same top-k, in the stable sort's order."""
        tops = [i for i, n in enumerate(nodes_a) if n.op == "call_function" and _opname(n) in ("topk", "sort")]
        if not tops:
            return False
        if len(tops) > 1:
            raise Unsupported("more than one top-k or sort")
        na, nb = nodes_a[tops[0]], nodes_b[tops[0]]
        x_a, x_b = (tuple(n.args[0].meta["val"].shape) for n in (na, nb))

        def arg(n: Any, at: int, key: str, default: Any) -> Any:
            return n.args[at] if len(n.args) > at else n.kwargs.get(key, default)

        if _opname(na) == "sort":
            stable = "stable" in str(na.target)  # sort.stable(x, *, stable, dim, descending)
            dim = na.kwargs.get("dim", -1) if stable else arg(na, 1, "dim", -1)
            largest = na.kwargs.get("descending", False) if stable else arg(na, 2, "descending", False)
            (k_a, k_b), na_dim = (self.sorted_prefix(n) for n in (na, nb)), dim
        else:
            k_a, k_b, na_dim, largest = arg(na, 1, "k", None), arg(nb, 1, "k", None), arg(na, 2, "dim", -1), \
                arg(na, 3, "largest", True)
            if not arg(na, 4, "sorted", True):
                raise Unsupported("an unsorted top-k (torch leaves its order open)")
        if not x_a or na_dim not in (-1, len(x_a) - 1):
            raise Unsupported("a top-k along another dimension than the row")
        if not (isinstance(k_a, int) and isinstance(k_b, int)) or (k_a, k_b) == (1, 1):
            raise Unsupported("a top-k of one (a max and its index)")
        if k_a >= x_a[-1] or k_b >= x_b[-1]:
            raise Unsupported("a top-k of the whole row (a sort)")
        self.full, self.full_b = x_a, x_b
        self.pick = ((*x_a[:-1], k_a), (*x_b[:-1], k_b))
        self.topk = TopK(None, self.size_expr(k_a, k_b), bool(largest))
        return True

    @staticmethod
    def sorted_prefix(sort: Any) -> int:
        """How many of a sort's first columns the graph reads: every read of its values and
        indices must be ``[..., :k]`` with the same k (else it is a sort, refused)."""
        ends = set()
        for item in sort.users:
            for use in item.users:
                args = list(use.args) + [None] * 5
                if _opname(use) != "slice" or args[1] not in (-1, len(sort.args[0].meta["val"].shape) - 1) \
                        or args[2] not in (0, None) or args[4] not in (1, None) or not isinstance(args[3], int):
                    raise Unsupported("a sort read otherwise than as its first k columns")
                ends.add(args[3])
        if len(ends) != 1:
            raise Unsupported("a sort read as first columns of different widths")
        return ends.pop()

    def top_k(self, env: dict[Any, _Val], na: Any, nb: Any) -> _Val:
        """``torch.topk`` of a value of the iteration space: its values and indices are read
        where ``getitem`` takes them (:meth:`piece`), as :class:`Pick` values."""
        first = env[na.args[0]]
        assert self.topk is not None and self.pick is not None
        if self.space(first.shape) != "full" or len(first.shape) != len(self.full) or self.narrow(first):
            raise Unsupported("a top-k of something other than the iteration space's rows")
        if not first.dtype.is_floating_point:
            raise Unsupported("a top-k of integers or bools")
        key = self.read(first)
        self.topk = replace(self.topk, key=key)
        (va, ia), (vb, ib) = na.meta["val"], nb.meta["val"]
        self.pairs[na] = (_Val(Pick("value"), tuple(va.shape), tuple(vb.shape), dtype=va.dtype),
                          _Val(Pick("index"), tuple(ia.shape), tuple(ib.shape), dtype=ia.dtype))
        return first

    def pick_reduce(self, kind: str, body: Any) -> PickReduce:
        r = PickReduce(kind, body, len(self.picked))
        self.picked.append(r)
        return r

    def pick_at(self, first: _Val, na: Any, nb: Any, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> _Val:
        """``values[:, j]`` or ``values[:, j:j + 1]`` of an expression over the picks: at a fixed
        pick, or at the last (``[:, -1:]``, the k-th value)."""
        assert self.pick is not None
        name = _opname(na)
        if na.args[1] not in (-1, len(first.shape) - 1) or (name == "slice" and (shape[-1], shape_b[-1]) != (1, 1)):
            raise Unsupported("a piece of the picks of a top-k wider than one")
        at = []
        for n, picked in ((na, self.pick[0]), (nb, self.pick[1])):
            j = n.args[2] if len(n.args) > 2 else 0
            at.append(j + picked[-1] if j < 0 else j)
        k_a, k_b = self.pick[0][-1], self.pick[1][-1]
        if (at[0], at[1]) == (k_a - 1, k_b - 1):
            where = "last"
        elif at[0] == at[1]:
            where = str(at[0])
        else:
            raise Unsupported("a pick at a place made from the shape")
        node = PickAt(self.read(first), where, len(self.picked))
        self.picked.append(node)
        return _Val(node, shape, shape_b, dtype=na.meta["val"].dtype)

    def topk_program(self, rows: str, cols: str, outputs: dict[str, tuple[str, Any]]) -> Program:
        """A row program around a top-k: row reductions, the picks, the row values made from
        them, then reductions over the row that read those (a top-k filter's softmax)."""
        assert self.topk is not None
        if self.topk.key is None:  # its values and indices unused: traced, then dropped
            raise Unsupported("a top-k whose picks are not used")
        if any(space not in ("full", "row", "pick") for space, _ in outputs.values()):
            raise Unsupported("a top-k beside outputs other than elements, rows or picks")
        roots = [e for _, e in outputs.values()] + [r.body for r in self.reductions] + [self.topk.key]
        if any(isinstance(n, Fold | Scan) for n in walk(roots + [p.body for p in self.picked])):
            raise Unsupported("a top-k beside a scan or a reduction over the next-to-last dimension")

        after = {r.index for r in self.reductions if of_picks(r.body)}
        for p in self.picked:
            if any(isinstance(n, Reduce) and n.index in after for n in walk([p.body])):
                raise Unsupported("a value of the picks made from a row reduction that reads them")
        return Program("rowwise", rows, cols, outputs, self.reductions, self.dtypes, topk=self.topk, picked=self.picked)

    def at_column(self, env: dict[Any, _Val], na: Any, first: _Val | None, shape: tuple[int, ...], shape_b: tuple[int, ...]) -> _Val:
        assert first is not None
        dim = na.args[1]
        idx = env[na.args[2]]
        if self.pick is not None and dim in (-1, len(first.shape) - 1) and self.space(idx.shape) == "pick" \
                and self.space(first.shape) == "full":
            # The picks' columns of another value of the row (probs.gather(1, topk_ids)).
            return _Val(AtColumn(self.read(first), self.read(idx)), shape, shape_b, dtype=na.meta["val"].dtype)
        if dim in (-1, len(first.shape) - 1) and shape[-1] != 1 and self.space(idx.shape) == "full":
            # One index row for every row (perm[None].expand(t, -1)), or a row of indices per
            # row (torch.gather(probs, -1, topk_ids)): column c reads column index[r, c].
            index = self.index_load(self.read(idx))
            if index is not None and index.access in ("col", "full"):
                return self.gather_columns(first, index, shape, shape_b)
        if dim in (0, -2) and len(first.shape) == 2 and first.expr is None and first.arg is not None \
                and self.space(shape) == "full" and self.space(idx.shape) == "full":
            # Rows picked by an index repeated along each row (torch.gather(table, 0,
            # ids[:, None].expand(-1, h)), take_along_dim(table, ids[:, None], 0)): table[ids].
            rows = self.size_expr(first.shape[0], first.shape_b[0])
            index = self.read(idx)
            if isinstance(index, Op) and index.name == "remainder" and index.args[1] == Param("__isize", rows):
                index = index.args[0]  # take_along_dim's wrap of negative ids: the gather's own
            row = self.index_load(index)
            if row is not None and row.access == "row":
                stride = self.size_expr(first.shape[-1], first.shape_b[-1])
                return _Val(Load(first.arg, "gather", row_stride=stride, index=row, rows=rows), shape, shape_b,
                            dtype=first.dtype)
        if dim not in (-1, len(first.shape) - 1) or self.space(first.shape) != "full" or self.space(idx.shape) != "row":
            raise Unsupported("a gather that does not pick one column per row")
        if shape[-1] != 1:
            raise Unsupported("a gather of several columns per row")
        return _Val(AtColumn(self.read(first), self.read(idx)), shape, shape_b, dtype=na.meta["val"].dtype)

    def transpose(self, nodes_a: list[Any], nodes_b: list[Any], permutes: list[Any]) -> Program:
        if len(permutes) != 1 or len(self.trace.outputs) != 1:
            raise Unsupported("more than one permute, or several outputs, around a transpose")
        p = permutes[0]
        order = p.args[1] if _opname(p) == "permute" else [1, 0]
        src = p.args[0]
        while src.op == "call_function" and _opname(src) in ("_to_copy", *_VIEWS):
            src = src.args[0]
        if src.op != "placeholder" or list(order) != [1, 0] or len(src.meta["val"].shape) != 2:
            raise Unsupported("a permute other than a 2-D transpose of an argument")
        arg = self.trace.inputs[[n for n in nodes_a if n.op == "placeholder"].index(src)]
        i = nodes_a.index(src)
        rows = self.size_expr(src.meta["val"].shape[0], nodes_b[i].meta["val"].shape[0])
        cols = self.size_expr(src.meta["val"].shape[1], nodes_b[i].meta["val"].shape[1])
        allowed = {"_to_copy", "permute", "transpose", "t", "clone", *_VIEWS}
        if any(_opname(n) not in allowed for n in nodes_a if n.op == "call_function"):
            raise Unsupported("a transpose with other ops around it")
        out = self.trace.outputs[0]
        return Program("transpose", cols, rows, {out: ("full", Load(arg, "full"))}, [], self.dtypes, (arg, rows, cols))


# Ops that read a piece narrower than the row as its own columns: elementwise ones.
_NARROW_OK = frozenset({*UNARY, *TESTS, *BINARY, *COMPARE, *BITWISE, "gelu", "where", "clamp", "clamp_min", "clamp_max",
                        "masked_fill", "logical_not", "bitwise_not", "logical_and", "logical_or", "bitwise_and",
                        "bitwise_or", "_to_copy", "clone", "contiguous", "alias", "detach", "lift_fresh_copy"})


def _shifted(node: Any, start: str, width: str, memo: dict[int, Any]) -> Any:
    """A piece's expression as a cat places it: each of its column loads at column c reads the
    piece's column c - ``start`` (clamped into its ``width``); row values are as they were."""
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, Load):
        if node.access in ("full", "gather"):
            # (a gathered row keeps its index and its table's row count, which a negative index wraps by)
            out: Any = Load(node.arg, "colshift", row_stride=node.row_stride, offset=node.offset, width=width,
                            shift=start, index=node.index, rows=node.rows)
        elif node.access in ("row", "scalar"):
            out = node
        else:
            raise Unsupported(f"a cat of a piece read by {node.access}")
    elif isinstance(node, Op):
        out = Op(node.name, tuple(_shifted(a, start, width, memo) for a in node.args), node.ctype, node.extra)
    elif isinstance(node, Const | Param | Reduce | AtColumn | RowOf):
        out = node
    else:
        raise Unsupported(f"a cat of a piece holding {type(node).__name__}")
    memo[id(node)] = out
    return out


def _fold_dim(node: Any) -> int | None:
    """The dimension a ``sum``, ``mean``, ``amax`` or ``amin`` node reduces over when it is the
    one next to the row's (of a value of two or more dimensions), else None."""
    if node.op != "call_function" or _opname(node) not in _FOLDS or not node.args or not hasattr(node.args[0], "meta"):
        return None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dims = [dims] if isinstance(dims, int) else dims
    rank = len(node.args[0].meta["val"].shape)
    if not dims or len(dims) != 1 or rank < 2 or dims[0] % rank != rank - 2:
        return None
    return rank - 2


def _along_columns(node: Any) -> bool:
    """Whether a ``scatter`` node writes along the last dimension of a 2-D target."""
    if _opname(node) != "scatter" or len(node.args) < 2 or not hasattr(node.args[0], "meta"):
        return False
    return len(node.args[0].meta["val"].shape) == 2 and node.args[1] in (1, -1)


def of_picks(node: Any) -> bool:
    """Whether ``node`` reads the picks of a top-k."""
    return any(isinstance(n, Pick | PickReduce | PickAt) for n in walk([node]))


def _has_at_column(outputs: dict[str, tuple[str, Any]]) -> bool:
    return any(isinstance(n, AtColumn) for n in walk([e for _, e in outputs.values()]))


def _opname(node: Any) -> str:
    """The op's name without overload; an in-place op (``add_``) by its functional name: on a
    value the reference computed it is the same value (a reference leaves its inputs alone,
    which kernels.check verifies)."""
    target = node.target
    name = getattr(target, "__name__", str(target)).split(".")[0]
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def _splits(fine: tuple[int, ...], coarse: tuple[int, ...]) -> bool:
    """Whether ``fine`` has ``coarse``'s last dimension and its row dimensions are
    ``coarse``'s, each split into consecutive factors (dimensions of one aside)."""
    if not fine or not coarse or fine[-1] != coarse[-1] or math.prod(fine) != math.prod(coarse):
        return False
    rows = [d for d in fine[:-1] if d != 1]
    for d in (d for d in coarse[:-1] if d != 1):
        product = 1
        while product < d and rows:
            product *= rows.pop(0)
        if product != d:
            return False
    return not rows


def _numel(node: Any) -> int:
    val = node.meta.get("val")
    return int(val.numel()) if val is not None and hasattr(val, "numel") else -1


def _as_kind(c: Any, kind: str) -> Any:
    if isinstance(c, Const):
        return Const(bool(c.value) if kind == BOOL else (int(c.value) if kind == INT else float(c.value)), kind)
    return c


def _cast(src: Any, to: Any, element: str | None = None) -> Any:
    """``src`` cast to torch dtype ``to``; a cast to ``element`` (the traced half type, when
    casts to it follow the element type) is a rounding to ``scalar_t``."""
    import torch

    kind = _kind_of_dtype(to)
    if kind == FLOAT and to not in (torch.float32, torch.float64):
        # A narrower float (float16, bfloat16, float8_e4m3fn): a rounding, wherever it stands
        # (a fake quantisation rounds to fp8 and computes on).
        name = str(to).split(".")[1]
        if name not in _TORCH_TO_C:
            raise Unsupported(f"a cast to {name}")
        return Op("round_to", (src,), FLOAT, ("scalar_t" if name == element else _TORCH_TO_C[name],))
    if kind == FLOAT:
        return Op("tofloat", (src,), FLOAT)
    if kind == BOOL:
        return Op("tobool", (src,), BOOL)
    return Op("toint", (src,), INT, (_TORCH_TO_C.get(str(to).split(".")[1], "long long"),))


def read_program(spec: KernelSpec, trace: Trace) -> Program:
    """The traced graph as a :class:`Program`.

    Raises:
        Unsupported: the graph is outside the supported kinds.
    """
    program = _Reader(spec, trace).run()
    for name in program.outputs:
        if program.dtypes.get(name) not in (SCALAR, "float32", "uint8", "int8", "int32", "int64", "float16",
                                            "bfloat16", "float8_e4m3fn"):
            raise Unsupported(f"output {name} of type {program.dtypes.get(name)}")
    return program
