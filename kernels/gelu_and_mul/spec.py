"""gelu_and_mul: x [T, 2d] -> out [T, d], out = gelu(x[:, :d]) * x[:, d:] (erf gelu, fp32 math)."""

from __future__ import annotations

from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, d = shape["num_tokens"], shape["d"]
    if case == "zeros":
        x = torch.zeros(t, 2 * d, device=device)
    elif case == "wide":
        # Magnitudes from 1e-4 to ~150 with random signs: tiny values, the erf tails (where
        # gelu(v) -> 0 or v) and large products that still fit fp16.
        mag = 10 ** (torch.rand(t, 2 * d, generator=generator, device=device) * 6.2 - 4.0)
        sign = torch.randint(0, 2, (t, 2 * d), generator=generator, device=device) * 2 - 1
        x = mag * sign
    else:
        x = torch.randn(t, 2 * d, generator=generator, device=device) * 2.0
    return {"out": torch.empty(t, d, device=device, dtype=dtype), "x": x.to(dtype)}


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
        "computed in fp32 and rounded once to the element type. 2*d*sizeof(scalar_t) is a multiple "
        "of 16 bytes. Memory-bound: reads 2d and writes d elements per token."
    ),
    args=(
        Arg("out", "tensor", role="out"),
        Arg("x", "tensor"),
        Arg("num_tokens", "int"),
        Arg("d", "int"),
    ),
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
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 3 * s["num_tokens"] * s["d"] * (4 if dt == "float32" else 2),
    flops=lambda s: 10 * s["num_tokens"] * s["d"],
    dtypes=("float16", "bfloat16"),
    edge_cases=("zeros", "wide"),
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer},
)
