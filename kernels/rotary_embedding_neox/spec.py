"""rotary_embedding_neox: rotate query and key in place by position, NeoX pairing (i, i + rot/2)."""

from __future__ import annotations

from functools import partial

from kernels import rotary
from kernels.spec import KernelSpec

SPEC = KernelSpec(
    name="rotary_embedding_neox",
    description=(
        "Rotary position embedding, NeoX style, in place on query [num_tokens, num_heads, head_size] "
        "and key [num_tokens, num_kv_heads, head_size] (contiguous). positions is int64 [num_tokens] "
        "in [0, max_position); cos_sin_cache is fp32 [max_position, rot_dim], cos in columns "
        "[0, rot_dim/2) and sin in [rot_dim/2, rot_dim). For every head and i < rot_dim/2, with "
        "c = cache[pos, i], s = cache[pos, rot_dim/2 + i], x = v[i], y = v[i + rot_dim/2] (fp32): "
        "v[i] <- x*c - y*s, v[i + rot_dim/2] <- y*c + x*s, each rounded once. Elements at "
        "index >= rot_dim (partial rotary) are left unchanged. " + rotary.ALIGNMENT_NOTE + " Memory-bound."
    ),
    args=rotary.ARGS,
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
        {"num_tokens": 1, "num_heads": 7, "num_kv_heads": 1, "head_size": 72, "rot_dim": 48, "max_position": 4097},
        {"num_tokens": 129, "num_heads": 5, "num_kv_heads": 5, "head_size": 120, "rot_dim": 80, "max_position": 131073},
    ),
    make_inputs=rotary.make_inputs,
    reference=partial(rotary.reference, neox=True),
    bytes_moved=rotary.bytes_moved,
    flops=rotary.flops,
    dtypes=("float16", "bfloat16"),
    edge_cases=rotary.EDGE_CASES,
    heldout_draw=rotary.heldout_draw,
    peers={"torch_eager": partial(rotary.torch_eager, neox=True), "flashinfer": partial(rotary.flashinfer, neox=True)},
    compiled=partial(rotary.torch_eager, neox=True),
)
