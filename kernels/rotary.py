"""Rotary position embedding with a cos/sin cache: what the NeoX and GPT-J kernels share.

The two kernels differ only in which elements form a rotated pair; the functions here take
``neox`` and the two specs bind it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from kernels import draws, edges
from kernels.spec import Arg

# head_size is a multiple of 8 (16-byte head rows in fp16/bf16), rot_dim of 16 (each NeoX half
# and each cache half starts on a 16-byte boundary); nothing larger is promised.
ARGS = (
        Arg("positions", "tensor", dtype="int64"),
        Arg("query", "tensor", role="inout"),
        Arg("key", "tensor", role="inout"),
        Arg("cos_sin_cache", "tensor", dtype="float32"),
        Arg("num_tokens", "int"),
        Arg("num_heads", "int"),
        Arg("num_kv_heads", "int"),
        Arg("head_size", "int", multiple_of=8),
        Arg("rot_dim", "int", multiple_of=16),
        Arg("max_position", "int"),
)
EDGE_CASES = ("zero_positions", "last_position", "range")
ALIGNMENT_NOTE = (
    "head_size is a multiple of 8 and rot_dim of 16 (16-byte rows and halves); nothing larger is "
    "promised (head_size = 8 * odd and rot_dim = 16 * odd occur)."
)


def make_inputs(shape: Mapping[str, int], dtype: Any, generator: Any, case: str, device: Any) -> dict[str, Any]:
    import torch

    t, rot, max_pos = shape["num_tokens"], shape["rot_dim"], shape["max_position"]
    hs = shape["head_size"]
    if case == "zero_positions":
        pos = torch.zeros(t, dtype=torch.int64, device=device)  # cos = 1, sin = 0: identity
    elif case == "last_position":
        pos = torch.full((t,), max_pos - 1, dtype=torch.int64, device=device)  # last cache row
    else:
        pos = torch.randint(0, max_pos, (t,), generator=generator, device=device)
    # The cache a model builds: cos and sin of position * base^(-2i/rot), base 10000.
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, device=device, dtype=torch.float32) / rot))
    angles = torch.arange(max_pos, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    q = torch.randn(t, shape["num_heads"], hs, generator=generator, device=device)
    k = torch.randn(t, shape["num_kv_heads"], hs, generator=generator, device=device)
    if case == "range":
        # Tokens from 1e-2 up to the element type's range (bf16 far past fp16's): the
        # rotation must be done in fp32, not in the element type.
        row = hs * max(shape["num_heads"], shape["num_kv_heads"])
        scale = edges.row_scales(t, row, dtype, generator, device)[:, :, None]
        q, k = q * scale, k * scale
        # Rotations by multiples of pi (cos = +-1, sin = 0): x c - y s of two huge, nearly
        # equal products would cancel, and then where a correct kernel rounds (an fma or a
        # product rounded first) would decide the result; a single product is exact enough,
        # and any arithmetic in the element type still overflows.
        half_turns = torch.arange(max_pos, device=device, dtype=torch.float32)[:, None].expand_as(angles)
        angles = half_turns * math.pi
        cache = torch.cat([torch.cos(angles).round(), torch.zeros_like(angles)], dim=-1)
    else:
        cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    return {
        "positions": pos,
        "query": q.to(dtype),
        "key": k.to(dtype),
        "cos_sin_cache": cache.contiguous(),
    }


def _pair_views(x: Any, rot: int, neox: bool) -> tuple[Any, Any]:
    """The two halves of every rotated pair: NeoX (i, i + rot/2) or GPT-J (2i, 2i + 1)."""
    if neox:
        return x[..., : rot // 2], x[..., rot // 2 : rot]
    return x[..., 0:rot:2], x[..., 1:rot:2]


def _cos_sin(inputs: Mapping[str, Any], rot: int) -> tuple[Any, Any]:
    cache = inputs["cos_sin_cache"][inputs["positions"]]
    return cache[:, None, : rot // 2], cache[:, None, rot // 2 : rot]


def reference(inputs: Mapping[str, Any], shape: Mapping[str, int], constants: Any, neox: bool) -> dict[str, Any]:
    rot = shape["rot_dim"]
    cos, sin = _cos_sin(inputs, rot)
    out = {}
    for name in ("query", "key"):
        x = inputs[name].float().clone()
        a, b = _pair_views(x, rot, neox)
        a_new, b_new = a * cos - b * sin, b * cos + a * sin
        a.copy_(a_new)
        b.copy_(b_new)
        out[name] = x
    return out


def torch_eager(t: Mapping[str, Any], shape: Mapping[str, int], constants: Any, neox: bool) -> None:
    rot = shape["rot_dim"]
    cos, sin = _cos_sin(t, rot)
    for name in ("query", "key"):
        a, b = _pair_views(t[name], rot, neox)
        af, bf = a.float(), b.float()  # copies: the writes below do not disturb them
        a.copy_(af * cos - bf * sin)
        b.copy_(bf * cos + af * sin)


def flashinfer(t: Mapping[str, Any], shape: Mapping[str, int], constants: Any, neox: bool) -> None:
    import flashinfer as fi

    n = shape["num_tokens"]
    fi.rope.apply_rope_with_cos_sin_cache_inplace(
        t["positions"], t["query"].view(n, -1), t["key"].view(n, -1), shape["head_size"],
        t["cos_sin_cache"], is_neox=neox,
    )


def bytes_moved(s: Mapping[str, int], dt: str) -> int:
    return s["num_tokens"] * (
        8 + 4 * s["rot_dim"] + 2 * (s["num_heads"] + s["num_kv_heads"]) * s["rot_dim"] * (4 if dt == "float32" else 2)
    )


def flops(s: Mapping[str, int]) -> int:
    return 3 * s["num_tokens"] * (s["num_heads"] + s["num_kv_heads"]) * s["rot_dim"]


def _draw_one(rng: random.Random, index: int) -> dict[str, int]:
    heads = draws.at_alignment(rng, 1, 63)
    head_size = draws.at_alignment(rng, 40, 256, 8)
    return {
        "num_tokens": draws.tokens(rng, index), "num_heads": heads,
        "num_kv_heads": draws.at_alignment(rng, 1, heads), "head_size": head_size,
        "rot_dim": draws.at_alignment(rng, 16, head_size, 16), "max_position": draws.at_alignment(rng, 2049, 131071),
    }


def heldout_draw(rng: random.Random) -> tuple[dict[str, int], ...]:
    """Three shapes per run: odd token and head counts, head_size = 8 * odd, rot_dim = 16 * odd,
    an odd max_position up to 131071 (positions that large)."""
    return draws.draw_shapes(rng, _draw_one, lambda s: s["num_tokens"] * s["num_heads"] * s["head_size"])
