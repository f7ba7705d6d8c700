"""transpose_2d: out [cols, rows] = x [rows, cols] transposed."""

from __future__ import annotations

from kernels import draws
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    r, c = shape["rows"], shape["cols"]
    x = torch.randn(r, c, generator=generator, device=device)
    if case == "ramp":
        # Every element distinct and exact in the element type (mod 2048): a swapped index shows.
        x = (torch.arange(r * c, device=device) % 2048).float().reshape(r, c)
    return {"out": torch.empty(c, r, device=device, dtype=dtype), "x": x.to(dtype)}


def reference(inputs, shape, constants):
    return {"out": inputs["x"].float().t().contiguous()}


def torch_eager(t, shape, constants):
    t["out"].copy_(t["x"].t())


SPEC = KernelSpec(
    name="transpose_2d",
    description=(
        "2-D transpose (layout change between a token-major and a feature-major buffer). x has shape "
        "[rows, cols] and out [cols, rows], both row-major and contiguous; out[j, i] = x[i, j], copied "
        "exactly. cols is a multiple of 8; rows can be any size (odd token counts occur). "
        "Memory-bound: reads and writes rows * cols elements."
    ),
    args=(
        Arg("out", "tensor", role="out"),
        Arg("x", "tensor"),
        Arg("rows", "int"),
        Arg("cols", "int", multiple_of=8),
    ),
    search_shapes=(
        {"rows": 1, "cols": 4096},
        {"rows": 16, "cols": 5120},
        {"rows": 128, "cols": 8192},
        {"rows": 333, "cols": 3584},
        {"rows": 512, "cols": 14336},
        {"rows": 1024, "cols": 4096},
        {"rows": 4096, "cols": 8192},
        {"rows": 8192, "cols": 1024},
    ),
    heldout_shapes=(
        {"rows": 7, "cols": 2048},
        {"rows": 77, "cols": 7168},
        {"rows": 2048, "cols": 5120},
        {"rows": 8191, "cols": 3584},
        {"rows": 1, "cols": 2056},
        {"rows": 129, "cols": 5128},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["rows"] * s["cols"] * (4 if dt == "float32" else 2),
    flops=lambda s: 0,
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("ramp",),
    heldout_draw=draws.row_draw(8, 256, 16384, rows="rows", cols="cols"),
    peers={"torch_eager": torch_eager},
)
