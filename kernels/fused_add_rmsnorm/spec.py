"""fused_add_rmsnorm: residual <- input + residual; input <- rmsnorm(residual) * weight, in place."""

from __future__ import annotations

from kernels import draws, edges
from kernels.spec import Arg, KernelSpec

EPS = 1e-6


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]

    def randn(*size):
        return torch.randn(*size, generator=generator, device=device)

    if case == "zeros":
        # x = 0 everywhere: r = rsqrt(eps) is large but finite and the output must be exactly 0.
        inp = torch.zeros(t, h, device=device)
        res = torch.zeros(t, h, device=device)
    elif case == "tiny":
        # mean(x^2) far below eps: eps dominates, so a kernel that drops or misplaces eps fails.
        inp = randn(t, h) * 1e-4
        res = randn(t, h) * 1e-4
    elif case == "large":
        # |x| up to ~1e4: x^2 overflows fp16 (so the sum must be in fp32) while x itself and
        # the normalised output stay finite in fp16.
        inp = randn(t, h) * 1e3
        res = randn(t, h) * 1e3
    elif case == "range":
        # Rows from 1e-2 up to the element type's range (bf16 far past fp16's); the sum of
        # input and residual and its fp32 sum of squares stay finite.
        scale = edges.row_scales(t, h, dtype, generator, device)
        inp = randn(t, h) * scale
        res = randn(t, h) * scale
    else:
        inp = randn(t, h)
        res = randn(t, h)
    weight = 1.0 + 0.5 * randn(h)
    return {
        "input": inp.to(dtype),
        "residual": res.to(dtype),
        "weight": weight.to(dtype),
    }


def _normalise(x, weight, eps):
    """fp32 rmsnorm of the fp32 sum x (the unrounded residual) times the weight."""
    import torch

    r = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return x * r * weight.float()


def reference(inputs, shape, constants):
    x = inputs["input"].float() + inputs["residual"].float()
    return {"input": _normalise(x, inputs["weight"], constants["eps"]), "residual": x}


def torch_eager(t, shape, constants):
    x = t["input"].float() + t["residual"].float()
    t["residual"].copy_(x)
    t["input"].copy_(_normalise(x, t["weight"], constants["eps"]))


def flashinfer(t, shape, constants):
    import flashinfer as fi

    fi.norm.fused_add_rmsnorm(t["input"], t["residual"], t["weight"], constants["eps"])


def _bytes_moved(shape, dtype):
    # Read input, residual and weight; write input and residual.
    t, h = shape["num_tokens"], shape["hidden"]
    return (4 * t * h + h) * (4 if dtype == "float32" else 2)


SPEC = KernelSpec(
    name="fused_add_rmsnorm",
    description=(
        "Residual add fused with RMSNorm, in place, as between LLM transformer layers. input and "
        "residual have shape [num_tokens, hidden] (row-major, contiguous), weight [hidden]. Per row, "
        "in fp32: x = input + residual; residual <- x rounded to the element type; "
        "r = 1 / sqrt(mean(x^2) + eps) with the sum of squares accumulated in fp32; "
        "input <- x * r * weight rounded once. eps = 1e-6. Using the rounded residual for the "
        "second pass is accepted (1-2 ulp). hidden is a multiple of 8 (16-byte rows); nothing larger is promised. "
        "Memory-bound: reads 2 rows and the weight, writes 2 rows per token."
    ),
    args=(
        Arg("input", "tensor", role="inout"),
        Arg("residual", "tensor", role="inout"),
        Arg("weight", "tensor"),
        Arg("num_tokens", "int"),
        Arg("hidden", "int", multiple_of=8),
        Arg("eps", "float"),
    ),
    search_shapes=(
        {"num_tokens": 1, "hidden": 4096},
        {"num_tokens": 16, "hidden": 4096},
        {"num_tokens": 128, "hidden": 11008},
        {"num_tokens": 256, "hidden": 4096},
        {"num_tokens": 512, "hidden": 14336},
        {"num_tokens": 1024, "hidden": 4096},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "hidden": 5120},
        {"num_tokens": 5, "hidden": 18432},
        {"num_tokens": 64, "hidden": 2048},
        {"num_tokens": 333, "hidden": 8192},
        {"num_tokens": 1023, "hidden": 3584},
        {"num_tokens": 2048, "hidden": 7168},
        {"num_tokens": 1, "hidden": 4104},
        {"num_tokens": 129, "hidden": 1800},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=_bytes_moved,
    flops=lambda s: 5 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16"),
    edge_cases=("zeros", "tiny", "large", "range"),
    heldout_draw=draws.row_draw(8),
    constants={"eps": EPS},
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer},
    compiled=torch_eager,
)
