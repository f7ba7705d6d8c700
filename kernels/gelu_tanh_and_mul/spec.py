"""gelu_tanh_and_mul: x [T, 2d] -> out [T, d], out = gelu_tanh(x[:, :d]) * x[:, d:] (fp32 math)."""

from __future__ import annotations

from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, d = shape["num_tokens"], shape["d"]
    if case == "zeros":
        x = torch.zeros(t, 2 * d, device=device)
    elif case == "wide":
        # Magnitudes from 1e-4 to ~150 with random signs: the cubic term overflows fp16 long
        # before tanh saturates, so it has to be evaluated in fp32.
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
    return {"out": torch.nn.functional.gelu(x[:, :d], approximate="tanh") * x[:, d:]}


def torch_eager(t, shape, constants):
    import torch

    d = shape["d"]
    x = t["x"]
    torch.mul(torch.nn.functional.gelu(x[:, :d], approximate="tanh"), x[:, d:], out=t["out"])


def flashinfer(t, shape, constants):
    import flashinfer as fi

    fi.activation.gelu_tanh_and_mul(t["x"], out=t["out"])


def liger(t, shape, constants):
    from liger_kernel.ops.geglu import LigerGELUMulFunction

    # Liger's GEGLU takes separate contiguous gate and up tensors and returns a new one, so
    # this peer's time includes splitting x and copying into out.
    d = shape["d"]
    x = t["x"]
    t["out"].copy_(LigerGELUMulFunction.apply(x[:, :d].contiguous(), x[:, d:].contiguous()))


SPEC = KernelSpec(
    name="gelu_tanh_and_mul",
    description=(
        "GeGLU activation with the tanh approximation of gelu (Gemma-2, Gemma-3). x has shape "
        "[num_tokens, 2*d] (gate then up, row-major, contiguous); out has shape [num_tokens, d]. "
        "out[t, i] = g(x[t, i]) * x[t, d + i] with "
        "g(v) = 0.5 * v * (1 + tanh(0.7978845608 * (v + 0.044715 * v^3))), computed in fp32 and "
        "rounded once to the element type. 2*d*sizeof(scalar_t) is a multiple of 16 bytes. "
        "Memory-bound: reads 2d and writes d elements per token."
    ),
    args=(
        Arg("out", "tensor", role="out"),
        Arg("x", "tensor"),
        Arg("num_tokens", "int"),
        Arg("d", "int"),
    ),
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
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 3 * s["num_tokens"] * s["d"] * (4 if dt == "float32" else 2),
    flops=lambda s: 12 * s["num_tokens"] * s["d"],
    dtypes=("float16", "bfloat16"),
    edge_cases=("zeros", "wide"),
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer, "liger_kernel": liger},
)
