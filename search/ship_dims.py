"""Each tensor dimension of a kernel as a rule over its shape symbols, read off the spec.

A shipped op receives tensors, not the kernel's integer arguments, so it must tell
``num_tokens`` and ``d`` from ``x``'s size. The spec says how its tensors are shaped only
through ``make_inputs``; this module runs it on torch's ``meta`` device (nothing allocated) at
a search shape and at that shape with one symbol scaled at a time, and writes every dimension
as ``num / den * product(symbols)`` (``x: [num_tokens, 2*d]``, ``cos_sin_cache:
[max_position, rot_dim]``). The rules are then checked on every search and held-out shape,
and the op's own solver must recover every symbol from them: a spec whose tensors hide a
symbol, or whose sizes are not such products, is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from kernels.spec import KernelSpec
from search.ship_template._checks import ArgInfo, DimRule, Signature
from search.ship_template._errors import ShapeError

SCALE = 3  # odd, so a symbol scaled by it keeps its multiple_of promise


class DimsError(ValueError):
    """A spec whose tensor sizes cannot be described as products of its shape symbols."""


def _sizes(spec: KernelSpec, shape: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    import torch

    made = spec.make_inputs(shape, torch.float16, torch.Generator(), "random", torch.device("meta"))
    tensors = {a.name for a in spec.args if a.kind == "tensor"}
    missing = tensors - set(made)
    if missing:
        raise DimsError(f"{spec.name}: make_inputs gives no {sorted(missing)}")
    return {name: tuple(int(s) for s in made[name].shape) for name in sorted(tensors)}


def derive_dims(spec: KernelSpec) -> dict[str, list[DimRule]]:
    """The rule of every dimension of every tensor argument.

    Raises:
        DimsError: a dimension is not a constant times a product of symbols, or the rules do
            not reproduce the sizes of every shape of the spec.
    """
    base = dict(spec.search_shapes[0])
    at_base = _sizes(spec, base)
    scaled = {s: _sizes(spec, {**base, s: base[s] * SCALE}) for s in spec.shape_symbols}
    rules: dict[str, list[DimRule]] = {}
    for name, sizes in at_base.items():
        rules[name] = []
        for axis, size in enumerate(sizes):
            symbols = []
            for s in spec.shape_symbols:
                other = scaled[s][name]
                if len(other) != len(sizes):
                    raise DimsError(f"{spec.name}: the rank of {name} changes with {s}")
                if other[axis] == size * SCALE:
                    symbols.append(s)
                elif other[axis] != size:
                    raise DimsError(f"{spec.name}: dimension {axis} of {name} is not a constant times a "
                                    f"product of shape symbols (it goes from {size} to {other[axis]} when "
                                    f"{s} is multiplied by {SCALE})")
            product = 1
            for s in symbols:
                product *= base[s]
            coef = Fraction(size, product)
            rules[name].append(DimRule(coef.numerator, coef.denominator, tuple(symbols)))
    solver = Signature(spec.name, arg_infos(spec), rules, spec.dtypes, align_bytes=1)
    for shape in (*spec.search_shapes, *spec.heldout_shapes):
        _check_rules(spec, rules, solver, shape)
    return rules


def arg_infos(spec: KernelSpec) -> list[ArgInfo]:
    """The spec's C arguments as the shipped op reads them (the manifest's ``args``)."""
    return [ArgInfo(a.name, a.kind, a.dtype, a.role, a.min_value, a.multiple_of) for a in spec.args]


def _check_rules(spec: KernelSpec, rules: Mapping[str, list[DimRule]], solver: Signature,
                 shape: Mapping[str, int]) -> None:
    """The rules give the spec's sizes at ``shape``, and the op's solver finds ``shape`` again."""
    import torch

    sizes = _sizes(spec, shape)
    for name, got in sizes.items():
        expected = tuple(r.value(shape) for r in rules[name])
        if expected != got:
            raise DimsError(f"{spec.name}: {name} at {dict(shape)} has sizes {got}, the derived rules give "
                            f"{expected}")
    tensors = {name: torch.empty(s, device="meta") for name, s in sizes.items()}
    try:
        solved = solver.solve(tensors)
    except ShapeError as exc:
        raise DimsError(f"{spec.name}: the op could not read the shape back from its tensors: {exc}") from None
    if solved != dict(shape):
        raise DimsError(f"{spec.name}: the tensors of {dict(shape)} read back as {solved}")


def manifest_dims(rules: Mapping[str, list[DimRule]]) -> dict[str, list[dict[str, Any]]]:
    return {name: [r.to_dict() for r in rs] for name, rs in rules.items()}
