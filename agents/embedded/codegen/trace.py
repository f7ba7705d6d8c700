"""Tracing a spec's torch reference into an aten op graph, on the meta device.

The reference is traced twice, at two probe shapes whose symbols are distinct odd primes
times each symbol's promised multiple, so that every size in the graph can be written back
as an expression over the shape symbols (:func:`fit_size`): a size seen as 40 at one probe
and 232 at the other, with ``vocab`` 40 and 232, is ``vocab``. The two traces must have the
same ops in the same order: a reference whose graph depends on the shape's values (Python
branches on a size) is not one graph, and is refused.

One source serves every dtype of the spec (``scalar_t``), but a trace is taken at one dtype.
A reference that rounds an intermediate to its inputs' type (``s.to(x.dtype)``, the rounding
of a residual written back) shows, in a float16 trace, the same cast as one that rounds to
float16 whatever the inputs are. So a spec with a half type and another dtype is traced a
third time at the other dtype: casts to the traced half type that disappear there follow the
element type and are emitted as casts to ``scalar_t``; casts that stay are fixed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kernels.spec import KernelSpec

_PRIMES_A = (3, 5, 7, 11, 13, 17, 19)
_PRIMES_B = (23, 29, 31, 37, 41, 43, 47)


class Unsupported(ValueError):
    """The reference is outside what the generator handles; the message says what."""


@dataclass(frozen=True)
class Trace:
    """Two traces of one reference and the probe shapes they were taken at.

    Attributes:
        graphs: the fx graphs at probe A and probe B (same ops, same order).
        probes: the two shapes.
        inputs: tensor argument names in placeholder order.
        outputs: written argument names in the order the graph returns them.
        element_casts: the dtype (``"float16"`` or ``"bfloat16"``) the graphs were traced at
            when their casts to it follow the element type (see the module docstring); None
            when they are fixed, or there are none.
    """

    graphs: tuple[Any, Any]
    probes: tuple[dict[str, int], dict[str, int]]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    element_casts: str | None = None


HALF_TYPES = ("float16", "bfloat16")


def probe_shapes(spec: KernelSpec) -> tuple[dict[str, int], dict[str, int]]:
    """Two shapes with every symbol at its multiple times a distinct odd prime, in the order
    the spec's own shapes keep: where one symbol is at most another in every search and
    held-out shape, and below it in some (a rotary's ``rot_dim`` and ``head_dim``, a top-k's
    ``k`` and its row), it is below it at both probes too; a reference slicing one by the
    other would not trace otherwise.

    Raises:
        Unsupported: a symbol may be 0 (a flag): a branch on it would be traced one way only.
    """
    ints = [a for a in spec.args if a.kind == "int"]
    if len(ints) > len(_PRIMES_A):
        raise Unsupported(f"more than {len(_PRIMES_A)} shape symbols")
    if any(a.min_value < 1 for a in ints):
        raise Unsupported("a shape symbol may be 0 (a flag): the graph may branch on it")
    a = {arg.name: arg.multiple_of * p for arg, p in zip(ints, _PRIMES_A, strict=False)}
    b = {arg.name: arg.multiple_of * p for arg, p in zip(ints, _PRIMES_B, strict=False)}
    below = _kept_below(spec, [arg.name for arg in ints])
    if all(a[x] < a[y] and b[x] < b[y] for y, xs in below.items() for x in xs):
        return a, b
    multiple = {arg.name: arg.multiple_of for arg in ints}
    # Smallest first (a symbol after every symbol kept below it), each at the smallest unused
    # prime that puts it above them; probe B's primes are none of probe A's, so that no size
    # has the same ratio to a symbol at both probes by chance (see fit_size).
    order = sorted(below, key=lambda y: len(below[y]))
    used: set[int] = set()
    probes = []
    for _ in range(2):
        probe: dict[str, int] = {}
        for y in order:
            floor = max((probe[x] for x in below[y]), default=0)
            p = next(p for p in _primes() if p not in used and multiple[y] * p > floor)
            used.add(p)
            probe[y] = multiple[y] * p
        probes.append(probe)
    return probes[0], probes[1]


def _kept_below(spec: KernelSpec, names: list[str]) -> dict[str, list[str]]:
    """Per symbol, the symbols at most it in every shape the spec lists and below it in one."""
    known = [*spec.search_shapes, *spec.heldout_shapes]
    return {y: [x for x in names if x != y and known and all(s[x] <= s[y] for s in known)
                and any(s[x] < s[y] for s in known)] for y in names}


def _primes() -> Iterator[int]:
    """The odd primes, from 3."""
    n = 3
    while True:
        if all(n % d for d in range(3, math.isqrt(n) + 1, 2)):
            yield n
        n += 2


def _decompositions() -> dict[Any, Any]:
    """Core ATen decompositions, plus layer norm's (a core op) into its mean and variance, so
    the program reads it as row reductions and maps, and those of the core activations
    (``elu``, ``leaky_relu``, ``hardtanh`` for relu6, ``sign``...) into the comparisons, selects
    and maps the program reads."""
    import torch
    from torch._decomp import core_aten_decompositions, get_decompositions

    aten = torch.ops.aten
    more = [aten.native_layer_norm, aten.var_mean, aten.elu, aten.leaky_relu, aten.hardtanh, aten.sign, aten.sgn,
            aten.hardshrink, aten.softshrink, aten.glu, aten.logaddexp, aten.heaviside]
    return {**core_aten_decompositions(), **get_decompositions(more)}


def _trace_at(spec: KernelSpec, shape: dict[str, int], dtype: str) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    meta = torch.device("meta")
    try:
        made = spec.make_inputs(shape, getattr(torch, dtype), torch.Generator(), "random", meta)
    except Exception as exc:  # noqa: BLE001 - any failure of user code means "cannot trace"
        raise Unsupported(f"make_inputs fails on the meta device: {exc}") from None
    names = tuple(a.name for a in spec.args if a.kind == "tensor")
    outputs = tuple(a.name for a in spec.written_args)

    def fn(*tensors: Any) -> tuple[Any, ...]:
        result = spec.reference(dict(zip(names, tensors, strict=True)), dict(shape), dict(spec.constants))
        return tuple(result[n] for n in outputs)

    try:
        graph = make_fx(fn, decomposition_table=_decompositions(), tracing_mode="real")(
            *(made[n] for n in names))
    except Exception as exc:  # noqa: BLE001
        raise Unsupported(f"the reference does not trace: {type(exc).__name__}: {exc}") from None
    return graph.graph, names, outputs


def trace_dtype(spec: KernelSpec) -> str:
    """The dtype a spec is traced at: its first half type, so that the roundings to the
    element type a reference makes are in the graph (at float32 they are no ops), else its
    first dtype."""
    return next((d for d in spec.dtypes if d in HALF_TYPES), spec.dtypes[0])


def _casts_to(graph: Any, dtype: str) -> int:
    """How many value casts (``_to_copy``) in ``graph`` produce ``dtype``."""
    count = 0
    for n in graph.nodes:
        if n.op == "call_function" and str(n.target).split(".")[1:2] == ["_to_copy"]:
            val = n.meta.get("val")
            count += val is not None and str(getattr(val, "dtype", "")) == f"torch.{dtype}"
    return count


def trace_reference(spec: KernelSpec, dtype: str | None = None) -> Trace:
    """Traces ``spec.reference`` at the two probe shapes (at :func:`trace_dtype` by default).

    Raises:
        Unsupported: it does not trace, or the two graphs differ, or some of its casts to the
            traced half type follow the element type and others do not.
    """
    dtype = dtype or trace_dtype(spec)
    a, b = probe_shapes(spec)
    ga, names, outputs = _trace_at(spec, a, dtype)
    gb, _, _ = _trace_at(spec, b, dtype)
    ops_a = [(n.op, str(n.target)) for n in ga.nodes]
    ops_b = [(n.op, str(n.target)) for n in gb.nodes]
    if ops_a != ops_b:
        raise Unsupported("the reference's graph depends on the shape's values")
    element = None
    own = _casts_to(ga, dtype) if dtype in HALF_TYPES else 0
    other = next((d for d in spec.dtypes if d != dtype), None)
    if own and other is not None:
        there = _casts_to(_trace_at(spec, a, other)[0], dtype)
        if there == 0:
            element = dtype
        elif there != own:
            raise Unsupported(f"some casts to {dtype} follow the element type and some do not")
    return Trace((ga, gb), (a, b), names, outputs, element)


def fit_size(value_a: int, value_b: int, probes: tuple[dict[str, int], dict[str, int]]) -> str:
    """The expression ``c * s1 * s2 ...`` over the shape symbols that gives ``value_a`` at
    probe A and ``value_b`` at probe B (fewest symbols first); else one with a symbol divided
    by a constant that divides it at both probes, ``(hidden // 128) * num_tokens`` (the groups
    of a row, as ``x.view(t, h // 128, 128)`` makes them): a probe is an odd prime times the
    symbol's ``multiple_of``, so such a constant divides every size the spec allows.

    Else the sum of two symbols, ``(dim_a + dim_b)`` (a row joined by a cat), or their
    difference, ``(head_dim - rot_dim)``, or a symbol off by a constant, ``(vocab - 1)``.

    Raises:
        Unsupported: no such product of at most three symbols, nor such a sum.
    """
    if value_a == value_b:
        return str(value_a)
    names = sorted(probes[0])

    def divisions(combo: tuple[str, ...]) -> Iterator[tuple[int, str | None]]:
        """(d, the symbol divided by d) for each symbol of ``combo`` and each d > 1 dividing it
        at both probes."""
        for split in combo:
            common = math.gcd(probes[0][split], probes[1][split])
            yield from ((d, split) for d in range(2, common + 1) if common % d == 0)

    for divided in (False, True):
        for k in (1, 2, 3):
            for combo in itertools.combinations(names, k):
                pa = math.prod(probes[0][s] for s in combo)
                pb = math.prod(probes[1][s] for s in combo)
                for d, split in divisions(combo) if divided else [(1, None)]:
                    if pa and value_a * d % pa == 0 and value_a * d // pa * pb == value_b * d and value_a * d // pa > 0:
                        c = value_a * d // pa
                        terms = ([str(c)] if c != 1 else []) + [f"({s} // {d})" if s == split else s for s in combo]
                        return " * ".join(terms)
    # A row that a cat joins from pieces of two sizes: their sum, parenthesised (one term of a
    # product to c_size and the launch header); or what is left of one past the other (the
    # columns a partial rotary passes through, head_dim - rot_dim).
    for first, second in itertools.combinations(names, 2):
        if probes[0][first] + probes[0][second] == value_a and probes[1][first] + probes[1][second] == value_b:
            return f"({first} + {second})"
    for first, second in itertools.permutations(names, 2):
        if probes[0][first] - probes[0][second] == value_a and probes[1][first] - probes[1][second] == value_b:
            return f"({first} - {second})"
    # A symbol off by a constant (the last index, vocab - 1): the same offset at both probes.
    for name in names:
        d = value_a - probes[0][name]
        if d != 0 and value_b - probes[1][name] == d and abs(d) < min(probes[0][name], probes[1][name]):
            return f"({name} {'+' if d > 0 else '-'} {abs(d)})"
    raise Unsupported(f"a size ({value_a} / {value_b} at the probes) is neither a product of shape symbols "
                      "nor the sum or difference of two")
