"""gelu_tanh_and_mul: x [T, 2d] -> out [T, d], out = gelu_tanh(x[:, :d]) * x[:, d:] (fp32 math)."""

from __future__ import annotations

from kernels import gated
from kernels.peer import Peer
from kernels.spec import KernelSpec


def reference(inputs, shape, constants):
    import torch

    d = shape["d"]
    x = inputs["x"].float()
    return {"out": torch.nn.functional.gelu(x[:, :d], approximate="tanh") * x[:, d:]}


def torch_eager(t, shape, constants):
    import torch

    d = shape["d"]
    x = t["x"]
    torch.mul(torch.nn.functional.gelu(x[:, :d], approximate="tanh"), x[:, d:], out=t["out"])


def flashinfer(t, shape, constants):
    import flashinfer as fi

    fi.activation.gelu_tanh_and_mul(t["x"], out=t["out"])


def _liger_split(t, shape, constants, scratch):
    """Liger's GEGLU takes the gate and up projections as two contiguous tensors, as a model
    that computes them with two matmuls holds them: split outside the timed window."""
    d = shape["d"]
    x = t["x"]
    if not scratch:
        scratch["gate"] = x[:, :d].clone()
        scratch["up"] = x[:, d:].clone()
    scratch["gate"].copy_(x[:, :d])
    scratch["up"].copy_(x[:, d:])


def _liger(t, shape, constants, scratch):
    from liger_kernel.ops.geglu import LigerGELUMulFunction

    return {"out": LigerGELUMulFunction.apply(scratch["gate"], scratch["up"])}


liger = Peer(_liger, stage=_liger_split,
             note="gate and up as two contiguous tensors, split outside the window; returns a new tensor (no copy timed)")


SPEC = KernelSpec(
    name="gelu_tanh_and_mul",
    description=(
        "GeGLU activation with the tanh approximation of gelu (Gemma-2, Gemma-3). x has shape "
        "[num_tokens, 2*d] (gate then up, row-major, contiguous); out has shape [num_tokens, d]. "
        "out[t, i] = g(x[t, i]) * x[t, d + i] with "
        "g(v) = 0.5 * v * (1 + tanh(0.7978845608 * (v + 0.044715 * v^3))), computed in fp32 and "
        "rounded once to the element type. "
        "d is a multiple of 8, so the out rows and both halves of every x row start on 16-byte "
        "boundaries; nothing larger is promised (d = 8 * an odd number occurs, and x can pass "
        "2^31 elements: index in 64 bits). "
        "Memory-bound: reads 2d and writes d elements per token."
    ),
    args=gated.ARGS,
    # Gemma-2-2B 9216, Gemma-2-9B 14336, Gemma-3-12B 15360, Gemma-3-27B 21504, Gemma-2-27B 36864.
    search_shapes=(
        {"num_tokens": 1, "d": 14336},
        {"num_tokens": 16, "d": 36864},
        {"num_tokens": 128, "d": 14336},
        {"num_tokens": 333, "d": 9216},
        {"num_tokens": 512, "d": 21504},
        {"num_tokens": 1024, "d": 14336},
        {"num_tokens": 4096, "d": 9216},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "d": 21504},
        {"num_tokens": 77, "d": 15360},
        {"num_tokens": 2048, "d": 14336},
        {"num_tokens": 8191, "d": 9216},
        {"num_tokens": 3, "d": 14344},
        {"num_tokens": 129, "d": 2312},
        gated.HUGE_SHAPE,
    ),
    make_inputs=gated.make_inputs,
    reference=reference,
    bytes_moved=gated.bytes_moved,
    flops=lambda s: 12 * s["num_tokens"] * s["d"],
    dtypes=("float16", "bfloat16"),
    edge_cases=gated.EDGE_CASES,
    heldout_draw=gated.heldout_draw,
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer, "liger_kernel": liger},
    compiled=torch_eager,
)
