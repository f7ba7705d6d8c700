"""What an op checks before it launches: dtypes, layout and sizes, from the manifest alone.

The kernel's C arguments are the spec's tensors and its integer shape symbols. The op takes
only the tensors (and the float constants); every symbol is solved from the tensors' sizes
with the rules the ship step derived from the spec (each dimension is a constant times a
product of symbols, e.g. ``x: [num_tokens, 2*d]``). Every dimension is then checked against
its rule, so tensors that disagree with each other are refused, and every symbol against its
promise (``min_value``, ``multiple_of``, the 32-bit range of the kernel's ``int``).

Sizes may be symbolic while ``torch.compile`` traces: the arithmetic below works on them
(it adds guards, no graph break).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import DtypeError, LayoutError, ShapeError

INT32_MAX = 2**31 - 1
SCALAR = "scalar"  # a tensor of the op's run dtype (the kernel's scalar_t)


@dataclass(frozen=True)
class DimRule:
    """One tensor dimension as ``num / den * product(symbols)``."""

    num: int
    den: int
    symbols: tuple[str, ...]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DimRule:
        return cls(int(d["num"]), int(d["den"]), tuple(d["symbols"]))

    def to_dict(self) -> dict[str, Any]:
        return {"num": self.num, "den": self.den, "symbols": list(self.symbols)}

    def value(self, env: Mapping[str, Any]) -> Any:
        product: Any = 1
        for s in self.symbols:
            product = product * env[s]
        return product * self.num // self.den

    def text(self) -> str:
        """The rule as a reader writes it: ``2*d``, ``rot_dim/2``, ``num_heads*head_size``, ``3``."""
        parts = ([str(self.num)] if self.num != 1 or not self.symbols else []) + list(self.symbols)
        return "*".join(parts) + (f"/{self.den}" if self.den != 1 else "")


@dataclass(frozen=True)
class ArgInfo:
    """One C argument of the kernel, as the spec declares it."""

    name: str
    kind: str  # tensor, int or float
    dtype: str = SCALAR
    role: str = "in"
    min_value: int = 1
    multiple_of: int = 1

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ArgInfo:
        return cls(d["name"], d["kind"], d.get("dtype", SCALAR), d.get("role", "in"),
                   int(d.get("min_value", 1)), int(d.get("multiple_of", 1)))

    @property
    def written(self) -> bool:
        return self.kind == "tensor" and self.role in ("out", "inout")


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


def _shape_text(sizes: Sequence[Any]) -> str:
    return "[" + ", ".join(str(s) for s in sizes) + "]"


class Signature:
    """The checks of one op.

    Args:
        kernel: the op's name (the kernel's entry symbol).
        args: the kernel's C arguments in order.
        dims: per tensor argument, one rule per dimension.
        dtypes: the run dtypes the op was shipped for.
        align_bytes: the alignment every tensor's data pointer must have.
    """

    def __init__(self, kernel: str, args: Sequence[ArgInfo], dims: Mapping[str, Sequence[DimRule]],
                 dtypes: Sequence[str], align_bytes: int) -> None:
        self.kernel = kernel
        self.args = tuple(args)
        # in argument order: a symbol is read off the first tensor that shows it
        self.dims = {a.name: tuple(dims[a.name]) for a in args if a.kind == "tensor"}
        self.dtypes = tuple(dtypes)
        self.align_bytes = align_bytes
        self.tensors = tuple(a for a in self.args if a.kind == "tensor")
        self.symbols = tuple(a for a in self.args if a.kind == "int")
        self.floats = tuple(a for a in self.args if a.kind == "float")
        self._minimum = {a.name: a.min_value for a in self.symbols}

    def layout_text(self, name: str) -> str:
        return _shape_text([r.text() for r in self.dims[name]])

    def check(self, tensors: Mapping[str, Any], *, pointers: bool) -> tuple[str, dict[str, Any]]:
        """All checks; returns the run dtype and the shape symbols.

        Args:
            tensors: the op's tensor arguments by name.
            pointers: also check data-pointer alignment and overlap (real tensors only).

        Raises:
            DtypeError, LayoutError, ShapeError: see :mod:`._errors`.
        """
        dtype = self.check_dtypes(tensors)
        self.check_layout(tensors, pointers=pointers)
        return dtype, self.solve(tensors)

    def check_dtypes(self, tensors: Mapping[str, Any]) -> str:
        scalar = {a.name: dtype_name(tensors[a.name].dtype) for a in self.tensors if a.dtype == SCALAR}
        found = sorted(set(scalar.values()))
        if len(found) > 1:
            listed = ", ".join(f"{n}={d}" for n, d in scalar.items())
            raise DtypeError(f"{self.kernel}: {', '.join(scalar)} must share one dtype, got {listed}")
        run = found[0] if found else self.dtypes[0]
        if run not in self.dtypes:
            raise DtypeError(f"{self.kernel}: shipped for {', '.join(self.dtypes)}, got {run} tensors "
                             f"(ship a run of that dtype to add it)")
        for a in self.tensors:
            got = dtype_name(tensors[a.name].dtype)
            if a.dtype != SCALAR and got != a.dtype:
                raise DtypeError(f"{self.kernel}: {a.name} must be {a.dtype}, got {got}")
        return run

    def check_layout(self, tensors: Mapping[str, Any], *, pointers: bool) -> None:
        devices = {str(tensors[a.name].device) for a in self.tensors}
        if len(devices) > 1:
            raise LayoutError(f"{self.kernel}: all tensors must be on one device, got {', '.join(sorted(devices))}")
        for a in self.tensors:
            t = tensors[a.name]
            if not t.is_contiguous():
                raise LayoutError(f"{self.kernel}: {a.name} must be contiguous (strides {tuple(t.stride())} for "
                                  f"shape {tuple(t.shape)}); call .contiguous() first")
        if not pointers:
            return
        spans = {}
        for a in self.tensors:
            t = tensors[a.name]
            ptr = t.data_ptr()
            if ptr % self.align_bytes:
                raise LayoutError(f"{self.kernel}: {a.name}'s data pointer {ptr:#x} is not {self.align_bytes}-byte "
                                  f"aligned (a view with an offset?); the kernel was verified on aligned buffers")
            spans[a.name] = (ptr, ptr + t.numel() * t.element_size())
        for w in (a for a in self.tensors if a.written):
            start, end = spans[w.name]
            for other, (o_start, o_end) in spans.items():
                if other != w.name and start < o_end and o_start < end:
                    raise LayoutError(f"{self.kernel}: {w.name} overlaps {other} in memory; the kernel was "
                                      f"verified on separate buffers")

    def solve(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """The shape symbols from the tensors' sizes, each dimension and promise checked.

        Raises:
            ShapeError: a wrong rank, a size that fits no integer symbol, sizes that disagree,
                or a symbol below its minimum, off its multiple, or above the 32-bit range.
        """
        sizes = {a.name: tuple(tensors[a.name].shape) for a in self.tensors}
        for name, rules in self.dims.items():
            if len(sizes[name]) != len(rules):
                raise ShapeError(f"{self.kernel}: {name} must be {len(rules)}-D {self.layout_text(name)}, "
                                 f"got shape {_shape_text(sizes[name])}")
        known = self._solve_symbols(sizes)
        for name, rules in self.dims.items():
            expected = [r.value(known) for r in rules]
            if any(e != s for e, s in zip(expected, sizes[name], strict=True)):
                env = ", ".join(f"{k}={v}" for k, v in known.items())
                raise ShapeError(f"{self.kernel}: {name} has shape {_shape_text(sizes[name])}, expected "
                                 f"{self.layout_text(name)} = {_shape_text(expected)} with {env}")
        for a in self.symbols:
            value = known[a.name]
            if value % a.multiple_of:
                raise ShapeError(f"{self.kernel}: {a.name}={value} is not a multiple of {a.multiple_of}, "
                                 f"the alignment the kernel was verified for")
            if value > INT32_MAX:
                raise ShapeError(f"{self.kernel}: {a.name}={value} does not fit the kernel's 32-bit int")
        return known

    def _solve_symbols(self, sizes: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
        """Solves symbols one at a time from dimensions with a single unknown symbol."""
        known: dict[str, Any] = {}
        progress = True
        while progress and len(known) < len(self.symbols):
            progress = False
            for name, rules in self.dims.items():
                for axis, rule in enumerate(rules):
                    unknown = [s for s in rule.symbols if s not in known]
                    if len(unknown) != 1:
                        continue
                    rest: Any = 1
                    for s in rule.symbols:
                        if s != unknown[0]:
                            rest = rest * known[s]
                    size = sizes[name][axis]
                    if rest == 0:
                        continue  # a zero flag elsewhere in the product tells nothing about this symbol
                    if size * rule.den % (rule.num * rest):
                        raise ShapeError(f"{self.kernel}: dimension {axis} of {name} is {size}, which is not "
                                         f"{rule.text()} for an integer {unknown[0]} "
                                         f"({name} must be {self.layout_text(name)})")
                    value = size * rule.den // (rule.num * rest)
                    minimum = self._minimum[unknown[0]]
                    if value < minimum:
                        raise ShapeError(f"{self.kernel}: {unknown[0]}={value} (from {name} of shape "
                                         f"{_shape_text(sizes[name])}) is below its minimum {minimum}")
                    known[unknown[0]] = value
                    progress = True
        missing = [a.name for a in self.symbols if a.name not in known]
        if missing:
            raise ShapeError(f"{self.kernel}: cannot tell {', '.join(missing)} from the tensors' sizes")
        return {a.name: known[a.name] for a in self.symbols}
