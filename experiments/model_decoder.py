"""A Llama/Qwen-style decoder for the model benchmark, with its kernels swappable.

Each layer: residual add + RMSNorm, q/k/v projections, NeoX rotary embedding with a cos/sin
cache, attention through ``scaled_dot_product_attention`` (grouped-query), output
projection, residual add + RMSNorm, SiLU-gated MLP. Random weights; nothing is downloaded.

The three kernels the engine ships are behind :class:`TorchOps` (what a model written in
plain PyTorch does, as Hugging Face's and vLLM's native paths do) and :class:`ShippedOps`
(the shipped ``torch.library`` ops, called the way a serving engine calls its kernels: in
place, outputs preallocated). q, k and v come from three projections so that query and key
are contiguous, as the shipped rotary op requires; every configuration does the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

EPS = 1e-6


@dataclass(frozen=True)
class ModelShape:
    """Llama-3-8B's layer sizes by default."""

    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    layers: int = 4
    max_position: int = 8192


@dataclass
class Layer:
    in_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    post_norm: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor


def make_weights(shape: ModelShape, dtype: torch.dtype, device: str, seed: int = 0) -> tuple[list[Layer], torch.Tensor]:
    """Random layers (scaled so activations stay O(1) through the stack) and the fp32 cos/sin
    cache ``[max_position, head_dim]`` (cos in the first half, sin in the second)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def w(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=g, device=device) / rows**0.5).to(dtype)

    def norm() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(shape.hidden, generator=g, device=device)).to(dtype)

    q_dim, kv_dim = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    layers = [Layer(norm(), w(shape.hidden, q_dim), w(shape.hidden, kv_dim), w(shape.hidden, kv_dim),
                    w(q_dim, shape.hidden), norm(), w(shape.hidden, 2 * shape.intermediate),
                    w(shape.intermediate, shape.hidden)) for _ in range(shape.layers)]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, shape.head_dim, 2, device=device, dtype=torch.float32)
                                  / shape.head_dim))
    angles = torch.arange(shape.max_position, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return layers, torch.cat([angles.cos(), angles.sin()], dim=-1).contiguous()


class TorchOps:
    """The three kernels in plain PyTorch (fp32 normalisation and rotation, SiLU in the model dtype)."""

    name = "torch"

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        summed = x.float() + residual.float()
        normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + EPS)
        return (normed * w.float()).to(x.dtype), summed.to(x.dtype)

    def rotary(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cache[positions].unsqueeze(1).chunk(2, dim=-1)

        def rotate(t: torch.Tensor) -> torch.Tensor:
            a, b = t.float().chunk(2, dim=-1)
            return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(t.dtype)

        return rotate(q), rotate(k)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        d = gate_up.shape[-1] // 2
        return F.silu(gate_up[:, :d]) * gate_up[:, d:]


class ShippedOps:
    """The same three steps through the shipped package's in-place ops."""

    name = "shipped"

    def __init__(self, package: Any) -> None:
        self.p = package

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.p.fused_add_rmsnorm(x, residual, w, EPS)
        return x, residual

    def rotary(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.p.rotary_embedding_neox(positions, q, k, cache)
        return q, k

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype, device=gate_up.device)
        self.p.silu_and_mul(out, gate_up)
        return out


@dataclass
class StepInputs:
    """One step's inputs: the hidden states and residual entering the stack, the positions,
    and for decode a KV cache per layer ([batch, kv_heads, context, head_dim], the new token
    written at the last slot); for prefill ``caches`` is empty and attention is causal."""

    x: torch.Tensor
    residual: torch.Tensor
    positions: torch.Tensor
    caches: list[tuple[torch.Tensor, torch.Tensor]]


def make_inputs(shape: ModelShape, tokens: int, context: int, decode: bool, dtype: torch.dtype,
                device: str, seed: int = 1) -> StepInputs:
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, shape.hidden, generator=g, device=device).to(dtype)
    residual = torch.randn(tokens, shape.hidden, generator=g, device=device).to(dtype)
    if decode:
        positions = torch.full((tokens,), context - 1, dtype=torch.int64, device=device)
        caches = [tuple(torch.randn(tokens, shape.kv_heads, context, shape.head_dim, generator=g,
                                    device=device).to(dtype) for _ in range(2)) for _ in range(shape.layers)]
    else:
        positions = torch.arange(tokens, dtype=torch.int64, device=device)
        caches = []
    return StepInputs(x, residual, positions, caches)  # type: ignore[arg-type]


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None,
               shape: ModelShape) -> torch.Tensor:
    tokens = q.shape[0]
    if cache is not None:  # decode: one new token per sequence, appended at the cache's last slot
        k_cache, v_cache = cache
        k_cache[:, :, -1].copy_(k)
        v_cache[:, :, -1].copy_(v)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, enable_gqa=True)
        return out.reshape(tokens, shape.heads * shape.head_dim)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                         v.transpose(0, 1).unsqueeze(0), is_causal=True, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(tokens, shape.heads * shape.head_dim)


def step(ops: Any, layers: list[Layer], cos_sin: torch.Tensor, inp: StepInputs,
         shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward step through every layer; returns the hidden states and the residual.

    The inputs are cloned first, so a replayed CUDA graph computes the same step each time.
    """
    x, residual = inp.x.clone(), inp.residual.clone()
    tokens = x.shape[0]
    for i, w in enumerate(layers):
        x, residual = ops.add_rmsnorm(x, residual, w.in_norm)
        q = (x @ w.wq).view(tokens, shape.heads, shape.head_dim)
        k = (x @ w.wk).view(tokens, shape.kv_heads, shape.head_dim)
        v = (x @ w.wv).view(tokens, shape.kv_heads, shape.head_dim)
        q, k = ops.rotary(inp.positions, q, k, cos_sin)
        x = _attention(q, k, v, inp.caches[i] if inp.caches else None, shape) @ w.wo
        x, residual = ops.add_rmsnorm(x, residual, w.post_norm)
        x = ops.silu_and_mul(x @ w.w_gate_up) @ w.w_down
    return x, residual
