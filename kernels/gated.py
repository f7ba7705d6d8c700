"""What the gated-activation kernels (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul) share:
the argument list, the inputs and the traffic. Each spec supplies its activation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernels.spec import Arg

ARGS = (
    Arg("out", "tensor", role="out"),
    Arg("x", "tensor"),
    Arg("num_tokens", "int"),
    Arg("d", "int"),
)
EDGE_CASES = ("zeros", "wide")


def make_inputs(shape: Mapping[str, int], dtype: Any, generator: Any, case: str, device: Any) -> dict[str, Any]:
    """x [T, 2d] (gate then up) and out [T, d].

    Cases: ``zeros``; ``wide``: magnitudes from 1e-4 to ~150 with random signs, which reaches
    the activations' saturating tails and overflowing intermediates (exp, the cubic term of
    gelu_tanh) while the products stay inside fp16's range; else normal with std 2.
    """
    import torch

    t, d = shape["num_tokens"], shape["d"]
    if case == "zeros":
        x = torch.zeros(t, 2 * d, device=device)
    elif case == "wide":
        mag = 10 ** (torch.rand(t, 2 * d, generator=generator, device=device) * 6.2 - 4.0)
        sign = torch.randint(0, 2, (t, 2 * d), generator=generator, device=device) * 2 - 1
        x = mag * sign
    else:
        x = torch.randn(t, 2 * d, generator=generator, device=device) * 2.0
    return {"out": torch.empty(t, d, device=device, dtype=dtype), "x": x.to(dtype)}


def bytes_moved(s: Mapping[str, int], dt: str) -> int:
    """Reads 2d and writes d elements per token."""
    return 3 * s["num_tokens"] * s["d"] * (4 if dt == "float32" else 2)
