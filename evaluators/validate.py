"""Output comparison and the integrity checks that do not need timing.

Pure torch: runs on the CPU in tests and on the GPU in the worker. Every check returns a
:class:`Finding` (what went wrong, written for the planner) or None.
"""

from __future__ import annotations

import torch

from evaluators import mismatch_device

# The comparisons live with the kernel specs (the CPU checks use them too); re-exported here.
from kernels.compare import (
    Finding,
    bitwise_equal,
    check_inputs_unchanged,
    check_outputs,
    compare,
    index_of,
    mismatch_finding,
    mismatch_mask,
)

__all__ = [
    "FLOAT_SENTINEL", "Finding", "bitwise_equal", "check_inputs_unchanged", "check_outputs", "compare",
    "index_of", "mismatch_finding", "mismatch_mask", "mismatch_stats", "mismatch_stats_into", "poison_", "unwritten",
]

# A second poison value for float outputs: finite, exact in fp16/bf16/fp8 e4m3, and unlikely
# to be produced by a real kernel; an element equal to it after one launch and NaN after the
# other was never written.
FLOAT_SENTINEL = -448.0


def poison_(t: torch.Tensor, which: int) -> None:
    """Fills an output buffer so that unwritten elements are recognisable afterwards.

    ``which`` 0 writes NaN (or the integer minimum), 1 a finite sentinel (integer maximum).
    """
    if t.dtype.is_floating_point:
        t.fill_(float("nan") if which == 0 else FLOAT_SENTINEL)
    elif t.dtype == torch.bool:
        t.fill_(which == 0)
    else:
        info = torch.iinfo(t.dtype)
        t.fill_(info.min if which == 0 else info.max)


def mismatch_stats(got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """``[bad elements, flat index of the first, got there, expected there]`` as a float64
    tensor on the device of ``got``, computed without a host synchronisation."""
    bad = mismatch_mask(got, expected, rtol, atol).reshape(-1)
    first = bad.view(torch.uint8).argmax().reshape(1)  # the first True (argmax returns the first maximum)
    at = [_element(t, first).to(torch.float64) for t in (got, expected)]
    return torch.cat([bad.sum().to(torch.float64).reshape(1), first.to(torch.float64), *at])


def mismatch_stats_into(row: torch.Tensor, got: torch.Tensor, expected: torch.Tensor, rtol: float,
                        atol: float) -> None:
    """:func:`mismatch_stats` written into the float64 device tensor ``row``, in one pass over
    the data where :mod:`evaluators.mismatch_device` supports the pair (same dtype, contiguous,
    on a GPU), else through the torch operators."""
    if mismatch_device.supported(got, expected):
        mismatch_device.checker(got.device).stats_into(row, got, expected, rtol, atol)
    else:
        row.copy_(mismatch_stats(got, expected, rtol, atol))


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _element(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Element ``index`` (a one-element device tensor) of flat ``t`` as fp32, gathered as raw
    bits so that dtypes without an indexing kernel (fp8) work too."""
    bits = t.reshape(-1).view(_SAME_SIZE_INT[t.element_size()]).index_select(0, index)
    return bits.view(t.dtype).to(torch.float32)


def unwritten(name: str, after_nan: torch.Tensor, after_sentinel: torch.Tensor, context: str = "") -> Finding | None:
    """Elements that kept the poison through two launches with different poisons."""
    if after_nan.dtype.is_floating_point:
        a = after_nan.to(torch.float32)
        b = after_sentinel.to(torch.float32)
        left = torch.isnan(a) & (b == FLOAT_SENTINEL)
    else:
        info = torch.iinfo(after_nan.dtype) if after_nan.dtype != torch.bool else None
        if info is None:
            return None
        left = (after_nan == info.min) & (after_sentinel == info.max)
    n = int(left.sum())
    if n == 0:
        return None
    flat = int(torch.nonzero(left.reshape(-1))[0])
    return Finding(
        "partial_output",
        f"{name}: {n} of {left.numel()} output elements were never written, first at "
        f"{list(index_of(flat, tuple(after_nan.shape)))} {context}".rstrip(),
    )
