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
EDGE_CASES = ("zeros", "wide", "range", "outliers")
# |x| of the outlier channels: LLM activations reach hundreds to thousands in a few channels,
# whatever the element type.
OUTLIER_LOW, OUTLIER_HIGH = 100.0, 2000.0
# Gates where gelu's fp32 value is a difference of nearly equal numbers (1 + erf or 1 + tanh
# near 0, or exactly 0 where a more accurate formula is not); see _calm_tail.
_TAIL_LOW, _TAIL_HIGH, _TAIL_UP_MAX = -12.0, -2.5, 100.0
ALIGNMENT_NOTE = "d is a multiple of 8 (no larger alignment is promised)"


def _range_magnitude(dtype: Any) -> float:
    """The largest |x| of the ``range`` case: products of two such values stay finite in the
    element type, so bf16 inputs reach far beyond fp16's range."""
    import torch

    return 0.9 * math.sqrt(float(torch.finfo(dtype).max))


def _log_uniform(shape: tuple[int, int], low: float, high: float, generator: Any, device: Any) -> Any:
    import torch

    u = torch.rand(shape, generator=generator, device=device)
    return 10 ** (u * (math.log10(high) - math.log10(low)) + math.log10(low))


def _outliers(t: int, d: int, generator: Any, device: Any) -> Any:
    """x [T, 2d] of normal values (std 2) with outlier channels (the same columns in every
    token) of |x| from :data:`OUTLIER_LOW` to :data:`OUTLIER_HIGH`, three kinds, each on about
    an eighth of the channels: a large negative gate with a large up (gate * up, up to 4e6,
    overflows fp16 while the result is about 0), a large positive gate with an ordinary up, and
    an ordinary gate with a large up. Every result stays well inside fp16's range."""
    import torch

    x = torch.randn(t, 2 * d, generator=generator, device=device) * 2.0
    gate, up = x[:, :d], x[:, d:]
    kind = torch.randint(0, 8, (d,), generator=generator, device=device)
    big_gate = _log_uniform((t, d), OUTLIER_LOW, OUTLIER_HIGH, generator, device)
    sign = torch.randint(0, 2, (t, d), generator=generator, device=device) * 2 - 1
    big_up = _log_uniform((t, d), OUTLIER_LOW, OUTLIER_HIGH, generator, device) * sign
    # torch.where, not masked assignment: the evaluator sizes inputs on the meta device.
    gate = torch.where(kind == 0, -big_gate, torch.where(kind == 1, big_gate, gate))
    up = torch.where((kind == 0) | (kind == 2), big_up, up)
    return torch.cat([gate, up], dim=1)


def _calm_tail(x: Any, d: int) -> Any:
    """Where the gate lies in gelu's negative tail (-12 to -2.5), |up| at most 100: there fp32
    gelu carries an absolute error of about |gate| * 6e-8 (1 + erf rounds to a multiple of
    6e-8, or to 0), which a huge up would magnify past every tolerance, so two correct fp32
    formulas (1 + erf and erfc, 1 + tanh and a sigmoid, two libraries' erf) would disagree.
    Elsewhere the inputs are untouched."""
    import torch

    gate, up = x[:, :d], x[:, d:]
    tail = (gate >= _TAIL_LOW) & (gate <= _TAIL_HIGH)
    return torch.cat([gate, torch.where(tail, up.clamp(-_TAIL_UP_MAX, _TAIL_UP_MAX), up)], dim=1)


def make_inputs(shape: Mapping[str, int], dtype: Any, generator: Any, case: str, device: Any) -> dict[str, Any]:
    """x [T, 2d] (gate then up) and out [T, d].

    Cases: ``zeros``; ``wide``: magnitudes from 1e-4 to ~150 with random signs, which reaches
    the activations' saturating tails and overflowing intermediates (exp, the cubic term of
    gelu_tanh) while the products stay inside fp16's range; ``range``: magnitudes spread
    log-uniformly from 1e-4 to the square root of the element type's maximum (~1.6e19 for
    bf16, ~230 for fp16), so fp16 arithmetic on bf16 data overflows; ``outliers``: outlier
    channels of |x| in the hundreds to thousands in every dtype (see :func:`_outliers`), so a
    kernel that forms gate * up in fp16 overflows; else normal with std 2. In ``range`` and
    ``outliers`` a gate in gelu's negative tail meets no huge up (see :func:`_calm_tail`).
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
        if case == "range":
            x = _calm_tail(x, d)
    elif case == "outliers":
        x = _calm_tail(_outliers(t, d, generator, device), d)
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
