"""silu_and_mul: x [T, 2d] -> out [T, d], out = silu(x[:, :d]) * x[:, d:] (fp32 math)."""

from __future__ import annotations

from kernels import gated
from kernels.spec import KernelSpec


def reference(inputs, shape, constants):
    import torch

    d = shape["d"]
    x = inputs["x"].float()
    return {"out": torch.nn.functional.silu(x[:, :d]) * x[:, d:]}


def torch_eager(t, shape, constants):
    import torch

    d = shape["d"]
    x = t["x"]
    t["out"].copy_(torch.nn.functional.silu(x[:, :d]) * x[:, d:])


def flashinfer(t, shape, constants):
    import flashinfer as fi

    fi.activation.silu_and_mul(t["x"], out=t["out"])


SPEC = KernelSpec(
    name="silu_and_mul",
    description=(
        "SwiGLU activation of an LLM MLP. x has shape [num_tokens, 2*d] (gate then up, row-major, "
        "contiguous); out has shape [num_tokens, d]. out[t, i] = silu(x[t, i]) * x[t, d + i] with "
        "silu(v) = v / (1 + exp(-v)), computed in fp32 and rounded once to the element type. "
        "d is a multiple of 8, so the out rows and both halves of every x row start on 16-byte "
        "boundaries; nothing larger is promised (d = 8 * an odd number occurs, and x can pass "
        "2^31 elements: index in 64 bits). "
        "Memory-bound: reads 2d and writes d elements per token."
    ),
    args=gated.ARGS,
    search_shapes=(
        {"num_tokens": 1, "d": 11008},
        {"num_tokens": 16, "d": 14336},
        {"num_tokens": 128, "d": 14336},
        {"num_tokens": 512, "d": 11008},
        {"num_tokens": 1024, "d": 13824},
        {"num_tokens": 4096, "d": 14336},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "d": 18944},
        {"num_tokens": 77, "d": 768},
        {"num_tokens": 333, "d": 28672},
        {"num_tokens": 2048, "d": 18432},
        {"num_tokens": 8191, "d": 4096},
        {"num_tokens": 1, "d": 11000},
        {"num_tokens": 129, "d": 1352},
        gated.HUGE_SHAPE,
    ),
    make_inputs=gated.make_inputs,
    reference=reference,
    bytes_moved=gated.bytes_moved,
    flops=lambda s: 6 * s["num_tokens"] * s["d"],
    dtypes=("float16", "bfloat16"),
    edge_cases=gated.EDGE_CASES,
    heldout_draw=gated.heldout_draw,
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer},
    compiled=torch_eager,
)
