"""logits_mask_fill: out = x where mask is set, else -inf (grammar-constrained decoding)."""

from __future__ import annotations

import math

from kernels import draws
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, v = shape["num_tokens"], shape["vocab"]
    x = torch.randn(t, v, generator=generator, device=device) * 3.0
    allowed = torch.rand(t, v, generator=generator, device=device) < 0.5
    if case == "none_allowed":
        allowed = torch.zeros(t, v, dtype=torch.bool, device=device)
    elif case == "mask_values":
        # Any nonzero byte allows the token, not only 1.
        allowed = torch.randint(0, 256, (t, v), generator=generator, device=device) > 0
        x = torch.randint(0, 256, (t, v), generator=generator, device=device).float() * 0.5
    mask = allowed.to(torch.uint8)
    if case == "mask_values":
        mask = (mask * torch.randint(1, 256, (t, v), generator=generator, device=device)).to(torch.uint8)
    return {"out": torch.empty(t, v, device=device, dtype=dtype), "x": x.to(dtype), "mask": mask}


def reference(inputs, shape, constants):
    return {"out": inputs["x"].float().masked_fill(inputs["mask"] == 0, constants["fill"])}


def torch_eager(t, shape, constants):
    t["out"].copy_(t["x"].masked_fill(t["mask"] == 0, constants["fill"]))


SPEC = KernelSpec(
    name="logits_mask_fill",
    description=(
        "Token mask of constrained decoding. x and out have shape [num_tokens, vocab] (row-major, "
        "contiguous); mask is uint8 [num_tokens, vocab]. out[t, i] = x[t, i] if mask[t, i] != 0, else "
        "fill (-inf), in the element type. vocab is a multiple of 8 and nothing larger is promised; "
        "x can pass 2^31 elements (index in 64 bits). Memory-bound: reads x and mask, writes out."
    ),
    args=(
        Arg("out", "tensor", role="out"),
        Arg("x", "tensor"),
        Arg("mask", "tensor", dtype="uint8"),
        Arg("num_tokens", "int"),
        Arg("vocab", "int", multiple_of=8),
        Arg("fill", "float"),
    ),
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
        # Just past 2^31 elements: a 32-bit offset wraps on the last rows.
        {"num_tokens": 16745, "vocab": 128256},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * s["vocab"] * (2 * (4 if dt == "float32" else 2) + 1),
    flops=lambda s: s["num_tokens"] * s["vocab"],
    # No float32: with its 2^31-element held-out shape, the evaluator's copies of fp32 logits
    # (inputs, outputs, baseline outputs, reference, fills) outgrew the H200's 140 GB.
    dtypes=("float16", "bfloat16"),
    edge_cases=("none_allowed", "mask_values"),
    constants={"fill": -math.inf},
    heldout_draw=draws.row_draw(8, 1024, 131072, cols="vocab"),
    peers={"torch_eager": torch_eager},
)
