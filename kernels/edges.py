"""Edge-case inputs shared by several specs: values spread over the element type's whole range.

A kernel that does its arithmetic in a narrower type than the spec says (fp16 math on bf16
data, a square in the element type) is right on inputs of ordinary size; only inputs near
the edges of the element type's range show it. These helpers size such inputs from the
dtype, so bf16 runs reach far beyond fp16's range while every result stays finite.
"""

from __future__ import annotations

import math
from typing import Any

FP32_MAX = 3.4028234663852886e38
_LOWEST_SCALE = 1e-2


def largest_row_scale(dtype: Any, row_length: int) -> float:
    """The largest per-row scale of a standard-normal row for which the row, the sum of two
    such rows and the fp32 sum of the row's squares all stay finite (a 5-sigma element is 5x
    the scale): the element type's maximum / 16, and sqrt(fp32 max / row_length) / 16."""
    import torch

    return min(float(torch.finfo(dtype).max) / 16.0, math.sqrt(FP32_MAX / row_length) / 16.0)


def row_scales(rows: int, row_length: int, dtype: Any, generator: Any, device: Any) -> Any:
    """Per-row scales [rows, 1], log-uniform from 1e-2 to :func:`largest_row_scale`; the last
    row always gets the largest (a single row too), the first of several the smallest."""
    import torch

    low, high = math.log10(_LOWEST_SCALE), math.log10(largest_row_scale(dtype, row_length))
    exponent = torch.rand(rows, 1, generator=generator, device=device) * (high - low) + low
    exponent[0] = low
    exponent[-1] = high
    return torch.pow(10.0, exponent)
