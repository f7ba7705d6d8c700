"""bias_gelu: out = gelu(x + bias) with bias broadcast over rows (exact erf GELU, fp32 math)."""

from __future__ import annotations

from kernels import draws
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device) * 2.0
    bias = torch.randn(h, generator=generator, device=device) * 0.5
    if case == "zeros":
        x = torch.zeros(t, h, device=device)
    elif case == "wide":
        # Magnitudes from 1e-4 to ~150 with random signs: erf saturates, x + bias stays finite.
        mag = 10 ** (torch.rand(t, h, generator=generator, device=device) * 6.2 - 4.0)
        x = mag * (torch.randint(0, 2, (t, h), generator=generator, device=device) * 2 - 1)
    return {"out": torch.empty(t, h, device=device, dtype=dtype), "x": x.to(dtype), "bias": bias.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    return {"out": torch.nn.functional.gelu(inputs["x"].float() + inputs["bias"].float())}


def torch_eager(t, shape, constants):
    import torch

    t["out"].copy_(torch.nn.functional.gelu(t["x"] + t["bias"]))


SPEC = KernelSpec(
    name="bias_gelu",
    description=(
        "Bias add and GELU of an MLP (GPT-2/BERT-style up projection epilogue). x and out have shape "
        "[num_tokens, hidden] (row-major, contiguous), bias has shape [hidden]. "
        "out[t, i] = gelu(x[t, i] + bias[i]) with gelu(v) = 0.5 v (1 + erf(v / sqrt(2))), in fp32, "
        "rounded once to the element type. hidden is a multiple of 8 and nothing larger is promised; "
        "x can pass 2^31 elements (index in 64 bits). Memory-bound: reads and writes hidden elements per token."
    ),
    args=(
        Arg("out", "tensor", role="out"),
        Arg("x", "tensor"),
        Arg("bias", "tensor"),
        Arg("num_tokens", "int"),
        Arg("hidden", "int", multiple_of=8),
    ),
    search_shapes=(
        {"num_tokens": 1, "hidden": 11008},
        {"num_tokens": 16, "hidden": 14336},
        {"num_tokens": 128, "hidden": 3072},
        {"num_tokens": 333, "hidden": 4096},
        {"num_tokens": 512, "hidden": 11008},
        {"num_tokens": 1024, "hidden": 13824},
        {"num_tokens": 4096, "hidden": 14336},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "hidden": 18944},
        {"num_tokens": 77, "hidden": 768},
        {"num_tokens": 2048, "hidden": 18432},
        {"num_tokens": 8191, "hidden": 4096},
        {"num_tokens": 1, "hidden": 11000},
        {"num_tokens": 129, "hidden": 1352},
        {"num_tokens": 149797, "hidden": 14336},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (2 * s["num_tokens"] + 1) * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 10 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("zeros", "wide"),
    heldout_draw=draws.row_draw(8, 256, 28672),
    peers={"torch_eager": torch_eager},
)
