"""rotary_embedding_gptj: rotate query and key in place by position, GPT-J pairing (2i, 2i + 1)."""

from __future__ import annotations

from functools import partial

from kernels import rotary
from kernels.spec import KernelSpec

SPEC = KernelSpec(
    name="rotary_embedding_gptj",
    description=(
        "Rotary position embedding, GPT-J (interleaved) style, in place on query "
        "[num_tokens, num_heads, head_size] and key [num_tokens, num_kv_heads, head_size] "
        "(contiguous). positions is int64 [num_tokens] in [0, max_position); cos_sin_cache is fp32 "
        "[max_position, rot_dim], cos in columns [0, rot_dim/2) and sin in [rot_dim/2, rot_dim). "
        "For every head and i < rot_dim/2, with c = cache[pos, i], s = cache[pos, rot_dim/2 + i], "
        "x = v[2i], y = v[2i + 1] (fp32): v[2i] <- x*c - y*s, v[2i + 1] <- y*c + x*s, each rounded "
        "once. Elements at index >= rot_dim (partial rotary) are left unchanged. " + rotary.ALIGNMENT_NOTE + " Memory-bound."
    ),
    args=rotary.ARGS,
    # DeepSeek-V3 MLA rope part 128/1/64, GPT-J-6B 16/16/256 with rot_dim 64,
    # ChatGLM2-6B 32/2/128 with rot_dim 64, Llama-3-8B 32/8/128 interleaved.
    search_shapes=(
        {"num_tokens": 1, "num_heads": 128, "num_kv_heads": 1, "head_size": 64, "rot_dim": 64, "max_position": 4096},
        {"num_tokens": 16, "num_heads": 16, "num_kv_heads": 16, "head_size": 256, "rot_dim": 64, "max_position": 2048},
        {"num_tokens": 128, "num_heads": 32, "num_kv_heads": 2, "head_size": 128, "rot_dim": 64, "max_position": 8192},
        {"num_tokens": 333, "num_heads": 32, "num_kv_heads": 8, "head_size": 128, "rot_dim": 128, "max_position": 4096},
        {"num_tokens": 512, "num_heads": 128, "num_kv_heads": 1, "head_size": 64, "rot_dim": 64, "max_position": 4096},
        {"num_tokens": 1024, "num_heads": 16, "num_kv_heads": 16, "head_size": 256, "rot_dim": 64, "max_position": 2048},
        {"num_tokens": 4096, "num_heads": 32, "num_kv_heads": 8, "head_size": 128, "rot_dim": 128, "max_position": 4096},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "num_heads": 32, "num_kv_heads": 2, "head_size": 128, "rot_dim": 64, "max_position": 32768},
        {"num_tokens": 77, "num_heads": 128, "num_kv_heads": 1, "head_size": 64, "rot_dim": 64, "max_position": 8192},
        {"num_tokens": 2048, "num_heads": 32, "num_kv_heads": 8, "head_size": 128, "rot_dim": 128, "max_position": 8192},
        {"num_tokens": 8191, "num_heads": 16, "num_kv_heads": 16, "head_size": 256, "rot_dim": 64, "max_position": 2048},
        {"num_tokens": 1, "num_heads": 9, "num_kv_heads": 3, "head_size": 88, "rot_dim": 16, "max_position": 2049},
        {"num_tokens": 129, "num_heads": 3, "num_kv_heads": 1, "head_size": 104, "rot_dim": 48, "max_position": 131071},
    ),
    make_inputs=rotary.make_inputs,
    reference=partial(rotary.reference, neox=False),
    bytes_moved=rotary.bytes_moved,
    flops=rotary.flops,
    dtypes=("float16", "bfloat16"),
    edge_cases=rotary.EDGE_CASES,
    heldout_draw=rotary.heldout_draw,
    peers={"torch_eager": partial(rotary.torch_eager, neox=False), "flashinfer": partial(rotary.flashinfer, neox=False)},
    compiled=partial(rotary.torch_eager, neox=False),
)
