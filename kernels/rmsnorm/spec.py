"""rmsnorm: out = input * rsqrt(mean(input^2) + eps) * weight per row (fp32 math), out of place."""

from __future__ import annotations

from kernels import draws, edges
from kernels.peer import Peer
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    if case == "zeros":
        # All-zero rows: the result is 0 only if eps keeps rsqrt finite.
        x = torch.zeros(t, h, device=device)
    elif case == "large":
        # |x| up to ~600: x^2 overflows fp16, so the sum of squares must stay in fp32.
        x = torch.randn(t, h, generator=generator, device=device) * 200.0
    elif case == "range":
        # Rows from 1e-2 up to the element type's range (bf16 far past fp16's), each row's
        # sum of squares still finite in fp32.
        x = torch.randn(t, h, generator=generator, device=device) * edges.row_scales(t, h, dtype, generator, device)
    else:
        x = torch.randn(t, h, generator=generator, device=device)
    w = 1.0 + 0.5 * torch.randn(h, generator=generator, device=device)
    return {
        "out": torch.empty(t, h, device=device, dtype=dtype),
        "input": x.to(dtype),
        "weight": w.to(dtype),
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["input"].float()
    r = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + constants["eps"])
    return {"out": x * r * inputs["weight"].float()}


def torch_eager(t, shape, constants):
    import torch

    x = t["input"].float()
    r = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + constants["eps"])
    t["out"].copy_(x * r * t["weight"].float())


def flashinfer(t, shape, constants):
    import flashinfer as fi

    fi.norm.rmsnorm(t["input"], t["weight"], constants["eps"], out=t["out"])


def _liger(t, shape, constants, scratch):
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    # Liger returns a new tensor: returned, so that no copy into out is timed.
    return {"out": LigerRMSNormFunction.apply(t["input"], t["weight"], constants["eps"], 0.0, "llama", False)}


liger = Peer(_liger, note="returns a new tensor (no copy timed)")


SPEC = KernelSpec(
    name="rmsnorm",
    description=(
        "RMSNorm of an LLM layer, out of place. input and out have shape [num_tokens, hidden] "
        "(row-major, contiguous), weight has shape [hidden]. Per row: "
        "r = rsqrt(sum(x^2) / hidden + eps) with x and the sum in fp32, then "
        "out[t, i] = x[t, i] * r * weight[i], rounded once to the element type. eps = 1e-6. "
        "input and weight are not modified. hidden is a multiple of 8 (16-byte rows) and nothing larger "
        "is promised. Memory-bound: reads and writes hidden elements per token."
    ),
    args=(
        Arg("out", "tensor", role="out"),
        Arg("input", "tensor"),
        Arg("weight", "tensor"),
        Arg("num_tokens", "int"),
        Arg("hidden", "int", multiple_of=8),
        Arg("eps", "float"),
    ),
    search_shapes=(
        {"num_tokens": 1, "hidden": 4096},
        {"num_tokens": 16, "hidden": 5120},
        {"num_tokens": 128, "hidden": 8192},
        {"num_tokens": 333, "hidden": 3584},
        {"num_tokens": 512, "hidden": 7168},
        {"num_tokens": 1024, "hidden": 4096},
        {"num_tokens": 4096, "hidden": 8192},
        # QK-norm: one row per (token, head) of head_dim 128 (Qwen3).
        {"num_tokens": 16384, "hidden": 128},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "hidden": 2048},
        {"num_tokens": 77, "hidden": 7168},
        {"num_tokens": 2048, "hidden": 5120},
        {"num_tokens": 8191, "hidden": 3584},
        {"num_tokens": 4096, "hidden": 128},
        {"num_tokens": 1, "hidden": 2056},
        {"num_tokens": 129, "hidden": 5128},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (2 * s["num_tokens"] + 1) * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 4 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16"),
    edge_cases=("zeros", "large", "range"),
    heldout_draw=draws.row_draw(8),
    constants={"eps": 1e-6},
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer, "liger_kernel": liger},
    compiled=torch_eager,
)
