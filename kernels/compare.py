"""Outputs against their expected values, and inputs against their copies from before a launch.

Pure torch, so it runs wherever a kernel's outputs are: on the GPU in the evaluator's worker,
on the CPU in ``python -m kernels.check`` and the CPU run of a variant (:mod:`kernels.cpu_check`).
Every check returns a :class:`Finding` (what went wrong, written for the planner) or None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernels.spec import KernelSpec


@dataclass(frozen=True)
class Finding:
    """A failed check.

    Attributes:
        kind: ``mismatch`` (INCORRECT) or a guard name (REJECTED): ``input_mutation``,
            ``partial_output``, ``nondeterminism``, ``replay``, ``roofline``.
        message: first bad element with expected/got, or what the guard saw.
    """

    kind: str
    message: str

    @property
    def is_guard(self) -> bool:
        return self.kind != "mismatch"


def index_of(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The multi-dimensional index of flat position ``flat`` in a row-major tensor of ``shape``."""
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return tuple(reversed(idx))


def mismatch_mask(got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """Elements outside ``|got - expected| <= atol + rtol * |expected|``, as a bool tensor,
    without a host synchronisation (the timing loop calls it after every timed launch).

    NaN and infinities must match the reference exactly (same place, same sign); integer
    tensors must be equal. The arithmetic is fp32, except when both tensors are fp16 or both
    bf16 (our baseline's outputs against a candidate's, after every timed launch): it stays
    in that type, for half the memory traffic. A difference of two values within a factor of
    two of each other is exact there, and rounding the limit moves it by under 0.5%.
    """
    if not got.dtype.is_floating_point and not expected.dtype.is_floating_point:
        return got.to(torch.int64) != expected.to(torch.int64)
    same_16 = got.dtype == expected.dtype and got.dtype in (torch.float16, torch.bfloat16)
    g = got if same_16 else got.to(torch.float32)
    e = expected if same_16 else expected.to(torch.float32)
    # |g - e| - rtol * |e| is NaN wherever either side is NaN or the reference is infinite (the
    # comparison then fails): only exact equality (the same infinity) or NaN against NaN pass
    # there. Elementwise ops on 16-bit tensors compute in fp32 before rounding.
    excess = (g - e).abs_().sub_(e.abs(), alpha=rtol)
    ok = torch.le(excess, atol)
    ok.logical_or_(g == e).logical_or_(torch.isnan(g).logical_and_(torch.isnan(e)))
    return ok.logical_not_()


def compare(
    name: str,
    got: torch.Tensor,
    expected: torch.Tensor,
    rtol: float,
    atol: float,
    context: str = "",
) -> Finding | None:
    """Elementwise check ``|got - expected| <= atol + rtol * |expected|`` (see
    :func:`mismatch_mask`). The message names the first bad element."""
    if tuple(got.shape) != tuple(expected.shape):
        return Finding("mismatch", f"{name}: shape {tuple(got.shape)} != expected {tuple(expected.shape)} {context}")
    bad = mismatch_mask(got, expected, rtol, atol)
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    flat = int(torch.nonzero(bad.reshape(-1))[0])
    gv = got.reshape(-1)[flat].item()
    ev = expected.reshape(-1)[flat].item()
    return mismatch_finding(name, tuple(got.shape), flat, gv, ev, n_bad, rtol, atol, context)


def mismatch_finding(name: str, shape: tuple[int, ...], flat: int, got: float, expected: float, n_bad: int,
                     rtol: float, atol: float, context: str = "") -> Finding:
    """The ``mismatch`` finding naming the first bad element and how many are bad."""
    numel = 1
    for dim in shape:
        numel *= dim
    return Finding(
        "mismatch",
        f"{name}{list(index_of(flat, shape))}: expected {expected:.6g}, got {got:.6g} "
        f"({n_bad} of {numel} elements outside rtol={rtol:g} atol={atol:g}) {context}".rstrip(),
    )


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def check_inputs_unchanged(
    inputs: dict[str, torch.Tensor], pristine: dict[str, torch.Tensor], names: list[str], context: str = ""
) -> Finding | None:
    """Input-only tensors must be bitwise unchanged after the launch."""
    for name in names:
        if not bitwise_equal(inputs[name], pristine[name]):
            diff = (inputs[name].contiguous().view(torch.uint8) != pristine[name].contiguous().view(torch.uint8))
            n = int(diff.sum())
            return Finding(
                "input_mutation",
                f"input {name} was modified by the kernel ({n} bytes changed) {context}; "
                "only out/inout arguments may be written".rstrip(),
            )
    return None


def check_outputs(
    written: dict[str, torch.Tensor],
    expected: dict[str, Any],
    tolerance: dict[str, tuple[float, float]],
    compare_hook: Any = None,
    context: str = "",
) -> Finding | None:
    """Compares every written argument with its expected value (or the spec's hook)."""
    for name, got in written.items():
        if compare_hook is not None:
            msg = compare_hook(name, got, expected[name])
            if msg:
                return Finding("mismatch", f"{msg} {context}".rstrip())
            continue
        rtol, atol = tolerance[name]
        finding = compare(name, got, expected[name], rtol, atol, context)
        if finding:
            return finding
    return None


def tolerances(spec: KernelSpec, dtype: str, scale: float = 1.0) -> dict[str, tuple[float, float]]:
    """(rtol, atol) of every written argument at the run dtype, times ``scale``."""
    out = {}
    for a in spec.written_args:
        rtol, atol = spec.tolerance(a.tensor_dtype(dtype))
        out[a.name] = (rtol * scale, atol * scale)
    return out
