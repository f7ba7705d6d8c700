"""kv_cache_write: cache[slots[t], :] = k[t, :] (one layer's key or value rows into a token cache)."""

from __future__ import annotations

from kernels import draws
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, s = shape["num_tokens"], shape["hidden"], shape["num_slots"]
    k = torch.randn(t, h, generator=generator, device=device)
    cache = torch.randn(s, h, generator=generator, device=device)
    slots = torch.randperm(s, generator=generator, device=device)[:t]
    if case == "ends":
        # The cache's last row first, then its first row: the last ends the cache exactly.
        rest = torch.randperm(s - 2, generator=generator, device=device) + 1
        slots = torch.cat([torch.tensor([s - 1, 0], device=device), rest])[:t]
    elif case == "from_end":
        # Negative slots count from the end, as torch's indexing does (distinct after wrapping).
        slots = torch.where(torch.arange(t, device=device) % 2 == 1, slots - s, slots)
    return {"cache": cache.to(dtype), "k": k.to(dtype), "slots": slots.to(torch.int64)}


def reference(inputs, shape, constants):
    cache = inputs["cache"].float().clone()
    cache[inputs["slots"]] = inputs["k"].float()
    return {"cache": cache}


def torch_eager(t, shape, constants):
    t["cache"][t["slots"]] = t["k"]


def _draw_one(rng, index):
    return {"num_tokens": draws.tokens(rng, index), "hidden": draws.at_alignment(rng, 128, 4096, 8),
            "num_slots": draws.at_alignment(rng, 20000, 200000)}


SPEC = KernelSpec(
    name="kv_cache_write",
    description=(
        "Writes one layer's new key (or value) rows into a token-indexed cache: cache has shape "
        "[num_slots, hidden] and k [num_tokens, hidden], both row-major and contiguous; slots is int64 "
        "[num_tokens] with distinct values, each in [-num_slots, num_slots) (a negative slot counts from the "
        "end, as torch's indexing does). cache[slots[t], :] = k[t, :], copied exactly; every other row of cache "
        "keeps its contents. hidden is a multiple of 8 (16-byte rows) and nothing larger is promised. "
        "Memory-bound: reads and writes hidden elements per token."
    ),
    args=(
        Arg("cache", "tensor", role="inout"),
        Arg("k", "tensor"),
        Arg("slots", "tensor", dtype="int64"),
        Arg("num_tokens", "int"),
        Arg("hidden", "int", multiple_of=8),
        Arg("num_slots", "int"),
    ),
    search_shapes=(
        {"num_tokens": 1, "hidden": 1024, "num_slots": 65536},
        {"num_tokens": 16, "hidden": 512, "num_slots": 131072},
        {"num_tokens": 128, "hidden": 1024, "num_slots": 65536},
        {"num_tokens": 333, "hidden": 2048, "num_slots": 65536},
        {"num_tokens": 512, "hidden": 1024, "num_slots": 262144},
        {"num_tokens": 1024, "hidden": 256, "num_slots": 65536},
        {"num_tokens": 4096, "hidden": 1024, "num_slots": 65536},
        {"num_tokens": 8192, "hidden": 2048, "num_slots": 32768},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "hidden": 1024, "num_slots": 65536},
        {"num_tokens": 77, "hidden": 640, "num_slots": 40000},
        {"num_tokens": 2048, "hidden": 1024, "num_slots": 131072},
        {"num_tokens": 8191, "hidden": 512, "num_slots": 65536},
        {"num_tokens": 129, "hidden": 4104, "num_slots": 30000},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (2 * s["hidden"] * (4 if dt == "float32" else 2) + 8),
    flops=lambda s: 0,
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("ends", "from_end"),
    heldout_draw=lambda rng: draws.draw_shapes(rng, _draw_one, lambda s: s["num_slots"] * s["hidden"]),
    peers={"torch_eager": torch_eager},
    compiled=torch_eager,
)
