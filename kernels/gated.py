"""What the gated-activation kernels (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul) share:
the argument list, the inputs, the held-out draws and the traffic. Each spec supplies its
activation."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from kernels import draws
from kernels.spec import Arg

# d is a multiple of 8: the out rows and both halves of every x row start on 16-byte
# boundaries in fp16/bf16 (the libraries' vector loads need no more, and may assume no more).
D_MULTIPLE = 8
ARGS = (
    Arg("out", "tensor", role="out"),
    Arg("x", "tensor"),
    Arg("num_tokens", "int"),
    Arg("d", "int", multiple_of=D_MULTIPLE),
)
EDGE_CASES = ("zeros", "wide", "range")
ALIGNMENT_NOTE = "d is a multiple of 8 (no larger alignment is promised)"


def _range_magnitude(dtype: Any) -> float:
    """The largest |x| of the ``range`` case: products of two such values stay finite in the
    element type, so bf16 inputs reach far beyond fp16's range."""
    import torch

    return 0.9 * math.sqrt(float(torch.finfo(dtype).max))


def make_inputs(shape: Mapping[str, int], dtype: Any, generator: Any, case: str, device: Any) -> dict[str, Any]:
    """x [T, 2d] (gate then up) and out [T, d].

    Cases: ``zeros``; ``wide``: magnitudes from 1e-4 to ~150 with random signs, which reaches
    the activations' saturating tails and overflowing intermediates (exp, the cubic term of
    gelu_tanh) while the products stay inside fp16's range; ``range``: magnitudes spread
    log-uniformly from 1e-4 to the square root of the element type's maximum (~1.6e19 for
    bf16, ~230 for fp16), so fp16 arithmetic on bf16 data overflows; else normal with std 2.
    """
    import torch

    t, d = shape["num_tokens"], shape["d"]
    if case == "zeros":
        x = torch.zeros(t, 2 * d, device=device)
    elif case in ("wide", "range"):
        top = 2.2 if case == "wide" else math.log10(_range_magnitude(dtype))
        mag = 10 ** (torch.rand(t, 2 * d, generator=generator, device=device) * (top + 4.0) - 4.0)
        sign = torch.randint(0, 2, (t, 2 * d), generator=generator, device=device) * 2 - 1
        x = mag * sign
    else:
        x = torch.randn(t, 2 * d, generator=generator, device=device) * 2.0
    return {"out": torch.empty(t, d, device=device, dtype=dtype), "x": x.to(dtype)}


def bytes_moved(s: Mapping[str, int], dt: str) -> int:
    """Reads 2d and writes d elements per token."""
    return 3 * s["num_tokens"] * s["d"] * (4 if dt == "float32" else 2)


def _draw_one(rng: random.Random, index: int) -> dict[str, int]:
    return {"num_tokens": draws.tokens(rng, index), "d": draws.at_alignment(rng, 256, 28672, D_MULTIPLE)}


def heldout_draw(rng: random.Random) -> tuple[dict[str, int], ...]:
    """Three shapes per run: an odd token count from each tier, d = 8 * odd in [256, 28672]."""
    return draws.draw_shapes(rng, _draw_one, lambda s: 2 * s["num_tokens"] * s["d"])


# x just past 2^31 elements (Llama-3's d, an odd token count): a signed 32-bit offset into x
# wraps on the last token. ~6.4 GB of fp16 inputs; about 37 GB of device memory at the peak of
# one validation case with the fp32 reference.
HUGE_SHAPE = {"num_tokens": 74899, "d": 14336}
