"""log_softmax_rows: out = log_softmax(x) over each row of logits (fp32 math), out of place."""

from __future__ import annotations

from kernels import draws
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, v = shape["num_tokens"], shape["vocab"]
    x = torch.randn(t, v, generator=generator, device=device) * 3.0
    if case == "large":
        # Logits around 200: exp overflows fp32 unless the row maximum is subtracted first.
        x = 200.0 + x * 15.0
    elif case == "masked":
        # About a third of the logits masked to -inf (their log-probability is -inf); column 0
        # stays finite so every row has a maximum.
        x = torch.where(torch.rand(t, v, generator=generator, device=device) < 0.3, float("-inf"), x)
        x[:, 0] = 0.0
    return {"out": torch.empty(t, v, device=device, dtype=dtype), "x": x.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    return {"out": torch.log_softmax(inputs["x"].float(), dim=-1)}


def torch_eager(t, shape, constants):
    import torch

    t["out"].copy_(torch.log_softmax(t["x"], dim=-1))


SPEC = KernelSpec(
    name="log_softmax_rows",
    description=(
        "Log-softmax of sampling logits. x and out have shape [num_tokens, vocab] (row-major, "
        "contiguous). Per row, in fp32: out[t, i] = x[t, i] - max_j x[t, j] - log(sum_j exp(x[t, j] - max)), "
        "rounded once to the element type; -inf logits give -inf. vocab is a multiple of 8 (16-byte rows) "
        "and nothing larger is promised. Memory-bound: reads and writes vocab elements per token."
    ),
    args=(
        Arg("out", "tensor", role="out"),
        Arg("x", "tensor"),
        Arg("num_tokens", "int"),
        Arg("vocab", "int", multiple_of=8),
    ),
    # Vocabularies of Llama-2 (32000), Llama-3 (128256), Qwen2 (151936), Phi-3 (32064).
    search_shapes=(
        {"num_tokens": 1, "vocab": 128256},
        {"num_tokens": 16, "vocab": 32000},
        {"num_tokens": 128, "vocab": 151936},
        {"num_tokens": 333, "vocab": 32064},
        {"num_tokens": 512, "vocab": 128256},
        {"num_tokens": 1024, "vocab": 32000},
        {"num_tokens": 4096, "vocab": 32000},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "vocab": 152064},
        {"num_tokens": 77, "vocab": 49152},
        {"num_tokens": 2048, "vocab": 102400},
        {"num_tokens": 8191, "vocab": 32000},
        {"num_tokens": 1, "vocab": 32008},
        {"num_tokens": 129, "vocab": 50280},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["vocab"] * (4 if dt == "float32" else 2),
    flops=lambda s: 4 * s["num_tokens"] * s["vocab"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("large", "masked"),
    heldout_draw=draws.row_draw(8, 1024, 131072, cols="vocab"),
    peers={"torch_eager": torch_eager},
)
