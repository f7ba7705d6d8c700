"""embedding_gather: out[t, :] = weight[ids[t], :] (token embedding lookup), int32 ids."""

from __future__ import annotations

from kernels import draws
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, v = shape["num_tokens"], shape["hidden"], shape["vocab"]
    weight = torch.randn(v, h, generator=generator, device=device)
    ids = torch.randint(0, v, (t,), generator=generator, device=device)
    if case == "edge_ids":
        # The first and last rows of the table, repeated: the last row ends the table exactly.
        ids = torch.where(torch.arange(t, device=device) % 2 == 0, v - 1, 0)
    elif case == "range":
        weight = weight * 1e4 if dtype != torch.float16 else weight * 1e4 / 4
    return {
        "out": torch.empty(t, h, device=device, dtype=dtype),
        "weight": weight.to(dtype),
        "ids": ids.to(torch.int32),
    }


def reference(inputs, shape, constants):
    return {"out": inputs["weight"][inputs["ids"].long()].float()}


def torch_eager(t, shape, constants):
    import torch

    torch.index_select(t["weight"], 0, t["ids"], out=t["out"])


def _draw_one(rng, index):
    return {"num_tokens": draws.tokens(rng, index), "hidden": draws.at_alignment(rng, 1024, 8192, 8),
            "vocab": draws.at_alignment(rng, 1000, 8000)}


SPEC = KernelSpec(
    name="embedding_gather",
    description=(
        "Token embedding lookup. weight has shape [vocab, hidden] (row-major, contiguous); ids is int32 "
        "[num_tokens] with values in [0, vocab); out has shape [num_tokens, hidden]. "
        "out[t, :] = weight[ids[t], :], copied exactly. hidden is a multiple of 8 (16-byte rows) and "
        "nothing larger is promised. Memory-bound: reads and writes hidden elements per token."
    ),
    args=(
        Arg("out", "tensor", role="out"),
        Arg("weight", "tensor"),
        Arg("ids", "tensor", dtype="int32"),
        Arg("num_tokens", "int"),
        Arg("hidden", "int", multiple_of=8),
        Arg("vocab", "int"),
    ),
    search_shapes=(
        {"num_tokens": 1, "hidden": 2048, "vocab": 32000},
        {"num_tokens": 16, "hidden": 5120, "vocab": 32000},
        {"num_tokens": 128, "hidden": 8192, "vocab": 128256},
        {"num_tokens": 333, "hidden": 3584, "vocab": 151936},
        {"num_tokens": 512, "hidden": 4096, "vocab": 32000},
        {"num_tokens": 1024, "hidden": 2048, "vocab": 32000},
        {"num_tokens": 4096, "hidden": 4096, "vocab": 128256},
        {"num_tokens": 16384, "hidden": 4096, "vocab": 32000},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "hidden": 2056, "vocab": 32000},
        {"num_tokens": 77, "hidden": 7168, "vocab": 129280},
        {"num_tokens": 2048, "hidden": 5120, "vocab": 152064},
        {"num_tokens": 8191, "hidden": 3584, "vocab": 32001},
        {"num_tokens": 129, "hidden": 4104, "vocab": 32000},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (2 * s["hidden"] * (4 if dt == "float32" else 2) + 4),
    flops=lambda s: 0,
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("edge_ids", "range"),
    heldout_draw=lambda rng: draws.draw_shapes(rng, _draw_one, lambda s: max(s["num_tokens"], s["vocab"]) * s["hidden"]),
    peers={"torch_eager": torch_eager},
)
