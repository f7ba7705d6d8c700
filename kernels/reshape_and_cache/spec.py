"""reshape_and_cache: scatter each token's key and value into a paged KV cache (HND layout)."""

from __future__ import annotations

from kernels import draws
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, d = shape["num_tokens"], shape["num_kv_heads"], shape["head_size"]
    bs, nb = shape["block_size"], shape["num_blocks"]
    if t > nb * bs:
        raise ValueError(f"{t} tokens do not fit in {nb} blocks of {bs} slots")
    if case == "contiguous":
        slots = torch.arange(t, device=device)  # prefill into fresh, consecutive blocks
    else:
        # Distinct slots in random order, as after many sequences came and went.
        slots = torch.randperm(nb * bs, generator=generator, device=device)[:t]
        if case == "skip_slots":
            # Padding tokens: nothing is written for any negative slot, not only -1.
            marks = torch.tensor([-1, -2, -(2**40)], device=device)
            skipped = slots[::3]
            slots[::3] = marks[torch.arange(skipped.numel(), device=device) % 3]
    # The caches hold older entries that must survive untouched.
    return {
        "key": torch.randn(t, h, d, generator=generator, device=device).to(dtype),
        "value": torch.randn(t, h, d, generator=generator, device=device).to(dtype),
        "key_cache": torch.randn(nb, h, bs, d, generator=generator, device=device).to(dtype),
        "value_cache": torch.randn(nb, h, bs, d, generator=generator, device=device).to(dtype),
        "slot_mapping": slots.to(torch.int64),
    }


def _scatter(cache, src, slots, block_size):
    """Writes src[t] to cache[slot // block_size, :, slot % block_size, :] for slot >= 0.

    Shapes stay static (no boolean masking, which syncs with the host and breaks CUDA-graph
    capture): a token with slot < 0 rewrites the entry of the first valid token with that
    token's own data, an exact no-op whatever order the duplicate writes land in. With no valid
    token at all, every write puts entry 0 back unchanged.

    Every index is a tensor, never a Python number: indexing with a 0-dim tensor reads it on
    the host, which a CUDA-graph capture forbids.
    """
    import torch

    valid = slots >= 0
    first = torch.argmax(valid.to(torch.int32)).view(1)
    any_valid = valid.any()
    fallback_slot = torch.where(any_valid, slots.index_select(0, first), 0)
    src = src.to(cache.dtype)
    fallback_src = torch.where(any_valid, src.index_select(0, first), cache[0, :, 0, :].unsqueeze(0))
    target = torch.where(valid, slots, fallback_slot)
    data = torch.where(valid[:, None, None], src, fallback_src)
    # Two advanced indices around a slice: the token dimension comes first in the result.
    cache[target // block_size, :, target % block_size, :] = data


def reference(inputs, shape, constants):
    out = {}
    for src, dst in (("key", "key_cache"), ("value", "value_cache")):
        cache = inputs[dst].float()  # a copy: the inputs stay as they were
        _scatter(cache, inputs[src], inputs["slot_mapping"], shape["block_size"])
        out[dst] = cache
    return out


def torch_eager(t, shape, constants):
    _scatter(t["key_cache"], t["key"], t["slot_mapping"], shape["block_size"])
    _scatter(t["value_cache"], t["value"], t["slot_mapping"], shape["block_size"])


def _draw_one(rng, index):
    tokens, block_size = draws.tokens(rng, index), draws.at_alignment(rng, 8, 72, 8)
    # Room for every token and a few blocks more, an odd count of blocks.
    blocks = draws.at_alignment(rng, -(-tokens // block_size) + 1, -(-tokens // block_size) + 64)
    return {"num_tokens": tokens, "num_kv_heads": draws.at_alignment(rng, 1, 15),
            "head_size": draws.at_alignment(rng, 40, 256, 8), "block_size": block_size, "num_blocks": blocks}


def _draw(rng):
    """Three shapes per run: odd token, head and block counts, head_size = 8 * odd,
    block_size = 8 * odd (24, 40, ...: not a power of two)."""
    return draws.draw_shapes(
        rng, _draw_one, lambda s: s["num_blocks"] * s["block_size"] * s["num_kv_heads"] * s["head_size"]
    )


SPEC = KernelSpec(
    name="reshape_and_cache",
    description=(
        "Paged KV-cache write of a serving engine. key and value are [num_tokens, num_kv_heads, "
        "head_size] (contiguous); key_cache and value_cache are [num_blocks, num_kv_heads, "
        "block_size, head_size] (HND paged layout, contiguous); slot_mapping is int64 [num_tokens]. "
        "For each token t with slot = slot_mapping[t] >= 0: block = slot / block_size, "
        "offset = slot % block_size, and key_cache[block, h, offset, :] = key[t, h, :] for every "
        "head h (the same for value). Tokens with any slot < 0 write nothing; distinct tokens have "
        "distinct slots; every cache entry not written keeps its old value. A pure copy: "
        "memory-bound, reads and writes 2 * num_kv_heads * head_size elements per token. head_size is a "
        "multiple of 8 (16-byte rows) and block_size of 8 (not necessarily a power of two); nothing "
        "larger is promised."
    ),
    args=(
        Arg("key", "tensor"),
        Arg("value", "tensor"),
        Arg("key_cache", "tensor", role="inout"),
        Arg("value_cache", "tensor", role="inout"),
        Arg("slot_mapping", "tensor", dtype="int64"),
        Arg("num_tokens", "int"),
        Arg("num_kv_heads", "int"),
        Arg("head_size", "int", multiple_of=8),
        Arg("block_size", "int", multiple_of=8),
        Arg("num_blocks", "int"),
    ),
    # Llama-3-8B 8 kv heads, LLaMA-7B 32, Qwen2.5-7B 4, Gemma-2-9B 8 x 256; blocks of 16-64.
    search_shapes=(
        {"num_tokens": 1, "num_kv_heads": 8, "head_size": 128, "block_size": 16, "num_blocks": 64},
        {"num_tokens": 16, "num_kv_heads": 32, "head_size": 128, "block_size": 16, "num_blocks": 128},
        {"num_tokens": 128, "num_kv_heads": 8, "head_size": 128, "block_size": 16, "num_blocks": 512},
        {"num_tokens": 333, "num_kv_heads": 8, "head_size": 256, "block_size": 16, "num_blocks": 256},
        {"num_tokens": 512, "num_kv_heads": 4, "head_size": 128, "block_size": 16, "num_blocks": 1024},
        {"num_tokens": 1024, "num_kv_heads": 8, "head_size": 128, "block_size": 32, "num_blocks": 512},
        {"num_tokens": 4096, "num_kv_heads": 8, "head_size": 128, "block_size": 16, "num_blocks": 512},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "num_kv_heads": 4, "head_size": 128, "block_size": 64, "num_blocks": 16},
        {"num_tokens": 77, "num_kv_heads": 32, "head_size": 128, "block_size": 16, "num_blocks": 64},
        {"num_tokens": 2048, "num_kv_heads": 8, "head_size": 128, "block_size": 32, "num_blocks": 128},
        {"num_tokens": 8191, "num_kv_heads": 8, "head_size": 128, "block_size": 16, "num_blocks": 1024},
        {"num_tokens": 1, "num_kv_heads": 1, "head_size": 72, "block_size": 8, "num_blocks": 3},
        {"num_tokens": 129, "num_kv_heads": 3, "head_size": 40, "block_size": 24, "num_blocks": 33},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (
        4 * s["num_kv_heads"] * s["head_size"] * (4 if dt == "float32" else 2) + 8
    ),
    flops=lambda s: 0,
    dtypes=("float16", "bfloat16"),
    edge_cases=("skip_slots", "contiguous"),
    heldout_draw=_draw,
    peers={"torch_eager": torch_eager},
    # The scatter in place, as an engine would compile it: the fp32 reference returns whole
    # copies of the caches, and compiling it would time copying them.
    compiled=torch_eager,
)
