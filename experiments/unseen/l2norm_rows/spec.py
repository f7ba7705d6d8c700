"""l2norm_rows: out = x / max(||x||_2, eps) per row (fp32 math), out of place."""

from __future__ import annotations

from kernels import draws, edges
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device)
    if case == "zeros":
        x[::2] = 0.0  # all-zero rows: the norm is clamped to eps and the row stays 0
    elif case == "range":
        x = x * edges.row_scales(t, h, dtype, generator, device)
    elif case == "tiny":
        x = x * 1e-4  # squares near fp16's subnormals: only an fp32 sum keeps them
    return {"out": torch.empty(t, h, device=device, dtype=dtype), "x": x.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    return {"out": torch.nn.functional.normalize(inputs["x"].float(), p=2.0, dim=-1, eps=constants["eps"])}


def torch_eager(t, shape, constants):
    import torch

    t["out"].copy_(torch.nn.functional.normalize(t["x"].float(), p=2.0, dim=-1, eps=constants["eps"]))


SPEC = KernelSpec(
    name="l2norm_rows",
    description=(
        "Row-wise L2 normalisation (QK-norm of some models, embedding normalisation). x and out have "
        "shape [num_tokens, hidden] (row-major, contiguous). Per row, in fp32: n = sqrt(sum x^2), "
        "out = x / max(n, eps), rounded once to the element type; eps = 1e-12. hidden is a multiple "
        "of 8 and nothing larger is promised. Memory-bound: reads and writes hidden elements per row."
    ),
    args=(
        Arg("out", "tensor", role="out"),
        Arg("x", "tensor"),
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
        # One row per (token, head) of head_dim 128.
        {"num_tokens": 65536, "hidden": 128},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "hidden": 2048},
        {"num_tokens": 77, "hidden": 7168},
        {"num_tokens": 2048, "hidden": 5120},
        {"num_tokens": 8191, "hidden": 3584},
        {"num_tokens": 32767, "hidden": 128},
        {"num_tokens": 1, "hidden": 2056},
        {"num_tokens": 129, "hidden": 5128},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 3 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("zeros", "range", "tiny"),
    heldout_draw=draws.row_draw(8),
    constants={"eps": 1e-12},
    peers={"torch_eager": torch_eager},
)
