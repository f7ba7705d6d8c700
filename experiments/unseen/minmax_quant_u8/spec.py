"""minmax_quant_u8: per-row asymmetric uint8 quantisation: q = round((x - min) / scale), scale and min per row."""

from __future__ import annotations

from kernels import draws, edges
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device)
    if case == "constant_rows":
        # Every other row holds one repeated value: max == min, so scale is 1 and q is 0.
        x[::2] = x[::2, :1]
    elif case == "range":
        x = x * edges.row_scales(t, h, dtype, generator, device)
    elif case == "offset":
        # All-positive rows far from zero: the minimum, not zero, anchors the grid.
        x = 50.0 + x
    return {
        "q": torch.empty(t, h, device=device, dtype=torch.uint8),
        "scales": torch.empty(t, device=device, dtype=torch.float32),
        "mins": torch.empty(t, device=device, dtype=torch.float32),
        "x": x.to(dtype),
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    lo = x.amin(dim=-1, keepdim=True)
    hi = x.amax(dim=-1, keepdim=True)
    scale = torch.where(hi > lo, (hi - lo) / 255.0, torch.ones_like(hi))
    q = ((x - lo) / scale).round().clamp(0.0, 255.0).to(torch.uint8)
    return {"q": q, "scales": scale.squeeze(-1), "mins": lo.squeeze(-1)}


def compare(name, got, expected):
    """q within one step of the reference (x / scale can round either way at a half), scales
    and mins within 1e-6 relative."""
    import torch

    if got.shape != expected.shape:
        return f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    g, e = got.double(), expected.double()
    tol = torch.ones_like(e) if name == "q" else 1e-6 * e.abs() + 1e-30
    bad = ~((g - e).abs() <= tol)
    if not bool(bad.any()):
        return None
    idx = tuple(int(i) for i in torch.nonzero(bad)[0])
    return (f"{name}{list(idx)}: got {g[idx].item():.6g}, expected {e[idx].item():.6g}; "
            f"{int(bad.sum())} of {bad.numel()} elements differ")


def torch_eager(t, shape, constants):
    import torch

    x = t["x"].float()
    lo = x.amin(dim=-1, keepdim=True)
    hi = x.amax(dim=-1, keepdim=True)
    scale = torch.where(hi > lo, (hi - lo) / 255.0, torch.ones_like(hi))
    t["q"].copy_(((x - lo) / scale).round().clamp(0.0, 255.0))
    t["scales"].copy_(scale.squeeze(-1))
    t["mins"].copy_(lo.squeeze(-1))


SPEC = KernelSpec(
    name="minmax_quant_u8",
    description=(
        "Per-token asymmetric 8-bit quantisation (activations or KV cache). x has shape "
        "[num_tokens, hidden] (row-major, contiguous); q is uint8 [num_tokens, hidden]; scales and "
        "mins are fp32 [num_tokens]. Per row, in fp32: lo = min x, hi = max x, scale = (hi - lo) / 255 "
        "if hi > lo else 1; q = clamp(round_half_even((x - lo) / scale), 0, 255); scales[t] = scale, "
        "mins[t] = lo (dequantise as q * scale + lo). Checked as: q within 1 of the reference, scales "
        "and mins within 1e-6 relative. hidden is a multiple of 16 and nothing larger is promised. "
        "Memory-bound: reads hidden elements and writes hidden bytes per token."
    ),
    args=(
        Arg("q", "tensor", dtype="uint8", role="out"),
        Arg("scales", "tensor", dtype="float32", role="out"),
        Arg("mins", "tensor", dtype="float32", role="out"),
        Arg("x", "tensor"),
        Arg("num_tokens", "int"),
        Arg("hidden", "int", multiple_of=16),
    ),
    search_shapes=(
        {"num_tokens": 1, "hidden": 4096},
        {"num_tokens": 16, "hidden": 7168},
        {"num_tokens": 128, "hidden": 14336},
        {"num_tokens": 333, "hidden": 5120},
        {"num_tokens": 512, "hidden": 18432},
        {"num_tokens": 1024, "hidden": 4096},
        {"num_tokens": 4096, "hidden": 8192},
        # KV cache: one row per (token, kv head) of head_dim 128.
        {"num_tokens": 32768, "hidden": 128},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "hidden": 8192},
        {"num_tokens": 77, "hidden": 2048},
        {"num_tokens": 2048, "hidden": 14336},
        {"num_tokens": 8191, "hidden": 3584},
        {"num_tokens": 1, "hidden": 2064},
        {"num_tokens": 129, "hidden": 4112},
        {"num_tokens": 16383, "hidden": 144},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["hidden"] * ((4 if dt == "float32" else 2) + 1) + 8),
    flops=lambda s: 4 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("constant_rows", "range", "offset"),
    heldout_draw=draws.row_draw(16),
    compare=compare,
    peers={"torch_eager": torch_eager},
)
