"""gemma_fused_add_rmsnorm: residual += input; input = rmsnorm(residual) * (1 + weight), in place."""

from __future__ import annotations

from kernels import draws, edges
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device)
    res = torch.randn(t, h, generator=generator, device=device)
    if case == "zeros":
        x.zero_()
        res.zero_()
    elif case == "cancel":
        # residual = -input: the sum is exactly zero in every row, so only eps keeps r finite.
        res = -x.to(dtype).float()
    elif case == "large":
        # |x + residual| up to ~900: its square overflows fp16, the sum must stay in fp32.
        x, res = x * 150.0, res * 150.0
    elif case == "range":
        # Rows from 1e-2 up to the element type's range (bf16 far past fp16's).
        scale = edges.row_scales(t, h, dtype, generator, device)
        x, res = x * scale, res * scale
    # Gemma stores weight around 0 and scales by (1 + weight).
    w = 0.3 * torch.randn(h, generator=generator, device=device)
    return {"input": x.to(dtype), "residual": res.to(dtype), "weight": w.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    x = inputs["input"].float() + inputs["residual"].float()
    r = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + constants["eps"])
    return {"input": x * r * (1.0 + inputs["weight"].float()), "residual": x}


def torch_eager(t, shape, constants):
    import torch

    x = t["input"].float() + t["residual"].float()
    t["residual"].copy_(x)
    r = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + constants["eps"])
    t["input"].copy_(x * r * (1.0 + t["weight"].float()))


def flashinfer(t, shape, constants):
    import flashinfer as fi

    fi.norm.gemma_fused_add_rmsnorm(t["input"], t["residual"], t["weight"], constants["eps"])


SPEC = KernelSpec(
    name="gemma_fused_add_rmsnorm",
    description=(
        "Gemma's residual add + RMSNorm, in place. input and residual have shape "
        "[num_tokens, hidden] (row-major, contiguous), weight has shape [hidden]. Per row, in fp32: "
        "x = input + residual; residual <- x (rounded to the element type); "
        "r = rsqrt(sum(x^2) / hidden + eps); input <- x * r * (1 + weight), rounded once. "
        "eps = 1e-6. Both input and residual are overwritten; whether the second pass uses x before "
        "or after rounding is free (the tolerance admits either). hidden is a multiple of 8 (16-byte "
        "rows); nothing larger is promised. Memory-bound: reads two and "
        "writes two rows per token."
    ),
    args=(
        Arg("input", "tensor", role="inout"),
        Arg("residual", "tensor", role="inout"),
        Arg("weight", "tensor"),
        Arg("num_tokens", "int"),
        Arg("hidden", "int", multiple_of=8),
        Arg("eps", "float"),
    ),
    # Gemma-2-2B 2304, Gemma-2-9B 3584, Gemma-3-12B 3840, Gemma-2-27B 4608, Gemma-3-27B 5376.
    search_shapes=(
        {"num_tokens": 1, "hidden": 3584},
        {"num_tokens": 16, "hidden": 3584},
        {"num_tokens": 128, "hidden": 4608},
        {"num_tokens": 333, "hidden": 2304},
        {"num_tokens": 512, "hidden": 3584},
        {"num_tokens": 1024, "hidden": 4608},
        {"num_tokens": 4096, "hidden": 3584},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "hidden": 2304},
        {"num_tokens": 77, "hidden": 5376},
        {"num_tokens": 2048, "hidden": 3840},
        {"num_tokens": 8191, "hidden": 3584},
        {"num_tokens": 1, "hidden": 2312},
        {"num_tokens": 255, "hidden": 1160},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (4 * s["num_tokens"] + 1) * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 6 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16"),
    edge_cases=("zeros", "cancel", "large", "range"),
    heldout_draw=draws.row_draw(8),
    constants={"eps": 1e-6},
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer},
    compiled=torch_eager,
)
