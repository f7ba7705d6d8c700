"""gelu_and_mul: x [T, 2d] -> out [T, d], out = gelu(x[:, :d]) * x[:, d:] (erf gelu, fp32 math)."""

from __future__ import annotations

from kernels import gated
from kernels.spec import KernelSpec


def reference(inputs, shape, constants):
    import torch

    d = shape["d"]
    x = inputs["x"].float()
    return {"out": torch.nn.functional.gelu(x[:, :d]) * x[:, d:]}


def torch_eager(t, shape, constants):
    import torch

    d = shape["d"]
    x = t["x"]
    torch.mul(torch.nn.functional.gelu(x[:, :d]), x[:, d:], out=t["out"])


def flashinfer(t, shape, constants):
    import flashinfer as fi

    fi.activation.gelu_and_mul(t["x"], out=t["out"])


SPEC = KernelSpec(
    name="gelu_and_mul",
    description=(
        "GeGLU activation of an LLM MLP (exact erf gelu, as in Gemma-7B). x has shape "
        "[num_tokens, 2*d] (gate then up, row-major, contiguous); out has shape [num_tokens, d]. "
        "out[t, i] = gelu(x[t, i]) * x[t, d + i] with gelu(v) = 0.5 * v * (1 + erf(v / sqrt(2))), "
        "computed in fp32 and rounded once to the element type. "
        "d is a multiple of 8, so the out rows and both halves of every x row start on 16-byte "
        "boundaries; nothing larger is promised (d = 8 * an odd number occurs, and x can pass "
        "2^31 elements: index in 64 bits). "
        "Memory-bound: reads 2d and writes d elements per token."
    ),
    args=gated.ARGS,
    # Gemma-2B 16384, Gemma-7B 24576, BERT/ViT-style 3072 and 4096, Phi-2 10240.
    search_shapes=(
        {"num_tokens": 1, "d": 24576},
        {"num_tokens": 16, "d": 16384},
        {"num_tokens": 128, "d": 24576},
        {"num_tokens": 333, "d": 10240},
        {"num_tokens": 512, "d": 16384},
        {"num_tokens": 1024, "d": 24576},
        {"num_tokens": 4096, "d": 16384},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "d": 10240},
        {"num_tokens": 77, "d": 3072},
        {"num_tokens": 2048, "d": 24576},
        {"num_tokens": 8191, "d": 4096},
        {"num_tokens": 1, "d": 9224},
        {"num_tokens": 255, "d": 3080},
        gated.HUGE_SHAPE,
    ),
    make_inputs=gated.make_inputs,
    reference=reference,
    bytes_moved=gated.bytes_moved,
    flops=lambda s: 10 * s["num_tokens"] * s["d"],
    dtypes=("float16", "bfloat16"),
    edge_cases=gated.EDGE_CASES,
    heldout_draw=gated.heldout_draw,
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer},
    compiled=torch_eager,
)
