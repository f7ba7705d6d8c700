"""rotary_embedding_neox: rotate query and key in place by position, NeoX pairing (i, i + rot/2)."""

from __future__ import annotations

from kernels.spec import Arg, KernelSpec

STYLE_NEOX = True


def make_inputs(shape, dtype, generator, case, device):
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
    return {
        "positions": pos,
        "query": q.to(dtype),
        "key": k.to(dtype),
        "cos_sin_cache": torch.cat([angles.cos(), angles.sin()], dim=-1).contiguous(),
    }


def _pair_views(x, rot):
    """The two halves of every rotated pair: NeoX (i, i + rot/2) or GPT-J (2i, 2i + 1)."""
    if STYLE_NEOX:
        return x[..., : rot // 2], x[..., rot // 2 : rot]
    return x[..., 0:rot:2], x[..., 1:rot:2]


def _cos_sin(inputs, rot):
    cache = inputs["cos_sin_cache"][inputs["positions"]]
    return cache[:, None, : rot // 2], cache[:, None, rot // 2 : rot]


def reference(inputs, shape, constants):
    rot = shape["rot_dim"]
    cos, sin = _cos_sin(inputs, rot)
    out = {}
    for name in ("query", "key"):
        x = inputs[name].float().clone()
        a, b = _pair_views(x, rot)
        a_new, b_new = a * cos - b * sin, b * cos + a * sin
        a.copy_(a_new)
        b.copy_(b_new)
        out[name] = x
    return out


def torch_eager(t, shape, constants):
    rot = shape["rot_dim"]
    cos, sin = _cos_sin(t, rot)
    for name in ("query", "key"):
        a, b = _pair_views(t[name], rot)
        af, bf = a.float(), b.float()  # copies: the writes below do not disturb them
        a.copy_(af * cos - bf * sin)
        b.copy_(bf * cos + af * sin)


def flashinfer(t, shape, constants):
    import flashinfer as fi

    n = shape["num_tokens"]
    fi.rope.apply_rope_with_cos_sin_cache_inplace(
        t["positions"], t["query"].view(n, -1), t["key"].view(n, -1), shape["head_size"],
        t["cos_sin_cache"], is_neox=STYLE_NEOX,
    )


SPEC = KernelSpec(
    name="rotary_embedding_neox",
    description=(
        "Rotary position embedding, NeoX style, in place on query [num_tokens, num_heads, head_size] "
        "and key [num_tokens, num_kv_heads, head_size] (contiguous). positions is int64 [num_tokens] "
        "in [0, max_position); cos_sin_cache is fp32 [max_position, rot_dim], cos in columns "
        "[0, rot_dim/2) and sin in [rot_dim/2, rot_dim). For every head and i < rot_dim/2, with "
        "c = cache[pos, i], s = cache[pos, rot_dim/2 + i], x = v[i], y = v[i + rot_dim/2] (fp32): "
        "v[i] <- x*c - y*s, v[i + rot_dim/2] <- y*c + x*s, each rounded once. Elements at "
        "index >= rot_dim (partial rotary) are left unchanged. Memory-bound."
    ),
    args=(
        Arg("positions", "tensor", dtype="int64"),
        Arg("query", "tensor", role="inout"),
        Arg("key", "tensor", role="inout"),
        Arg("cos_sin_cache", "tensor", dtype="float32"),
        Arg("num_tokens", "int"),
        Arg("num_heads", "int"),
        Arg("num_kv_heads", "int"),
        Arg("head_size", "int"),
        Arg("rot_dim", "int"),
        Arg("max_position", "int"),
    ),
    # Llama-3-8B 32/8/128, Qwen2.5-7B 28/4/128, LLaMA-13B 40/40/128, Llama-70B 64/8/128,
    # Gemma-2-9B 16/8/256, Phi-2 32/32/80 with rot_dim 32.
    search_shapes=(
        {"num_tokens": 1, "num_heads": 32, "num_kv_heads": 8, "head_size": 128, "rot_dim": 128, "max_position": 4096},
        {"num_tokens": 16, "num_heads": 28, "num_kv_heads": 4, "head_size": 128, "rot_dim": 128, "max_position": 4096},
        {"num_tokens": 128, "num_heads": 40, "num_kv_heads": 40, "head_size": 128, "rot_dim": 128, "max_position": 4096},
        {"num_tokens": 333, "num_heads": 16, "num_kv_heads": 8, "head_size": 256, "rot_dim": 256, "max_position": 8192},
        {"num_tokens": 512, "num_heads": 32, "num_kv_heads": 8, "head_size": 128, "rot_dim": 128, "max_position": 8192},
        {"num_tokens": 1024, "num_heads": 64, "num_kv_heads": 8, "head_size": 128, "rot_dim": 128, "max_position": 4096},
        {"num_tokens": 4096, "num_heads": 32, "num_kv_heads": 8, "head_size": 128, "rot_dim": 128, "max_position": 4096},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "num_heads": 32, "num_kv_heads": 32, "head_size": 80, "rot_dim": 32, "max_position": 2048},
        {"num_tokens": 77, "num_heads": 28, "num_kv_heads": 4, "head_size": 128, "rot_dim": 128, "max_position": 32768},
        {"num_tokens": 2048, "num_heads": 16, "num_kv_heads": 8, "head_size": 256, "rot_dim": 256, "max_position": 4096},
        {"num_tokens": 8191, "num_heads": 32, "num_kv_heads": 8, "head_size": 128, "rot_dim": 128, "max_position": 8192},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (
        8 + 4 * s["rot_dim"] + 2 * (s["num_heads"] + s["num_kv_heads"]) * s["rot_dim"] * (4 if dt == "float32" else 2)
    ),
    flops=lambda s: 3 * s["num_tokens"] * (s["num_heads"] + s["num_kv_heads"]) * s["rot_dim"],
    dtypes=("float16", "bfloat16"),
    edge_cases=("zero_positions", "last_position"),
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer},
)
