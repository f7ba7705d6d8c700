"""per_token_fp8_quant: input [T, H] -> fp8 e4m3 out [T, H] and one fp32 scale per token."""

from __future__ import annotations

import math

from kernels import draws
from kernels.spec import Arg, KernelSpec

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device)
    if case == "zero_rows":
        x[::2] = 0.0  # every other row is all zero: scale 1, q 0 by definition
    elif case == "outlier":
        # One large value per row and the rest ~1e-3: most quantised values land in the
        # e4m3 subnormal range, where the step is absolute (2^-9), not relative.
        x = x * 1e-3
        cols = torch.randint(0, h, (t,), generator=generator, device=device)
        x[torch.arange(t, device=device), cols] = 100.0
    elif case == "range":
        # Rows from 1e-6 (fp16 subnormals) up to an eighth of the element type's maximum (bf16
        # far past fp16's range): the scale is taken in fp32 whatever the magnitude.
        top = math.log10(float(torch.finfo(dtype).max) / 8.0)
        exponent = torch.rand(t, 1, generator=generator, device=device) * (top + 6.0) - 6.0
        exponent[-1] = top
        x = x * torch.pow(10.0, exponent)
    return {
        "out": torch.empty(t, h, device=device, dtype=torch.float8_e4m3fn),
        "scales": torch.empty(t, device=device, dtype=torch.float32),
        "input": x.to(dtype),
    }


def _scales(x):
    import torch

    amax = x.abs().amax(dim=-1, keepdim=True)
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def reference(inputs, shape, constants):
    x = inputs["input"].float()
    scale = _scales(x)
    # The exact quotient before e4m3 rounding; compare() allows one e4m3 step around it.
    return {"out": (x / scale).clamp(-FP8_MAX, FP8_MAX), "scales": scale.squeeze(-1)}


def _allowed_error(expected):
    import torch

    # One e4m3 step at the expected magnitude: 2^(exponent - 3) for normals, 2^-9 below 2^-6.
    mag = expected.abs().clamp(min=2.0**-6)
    return torch.exp2(torch.floor(torch.log2(mag)) - 3)


def compare(name, got, expected):
    """Quantised values within one e4m3 step of input/scale; scales within 1e-6 relative."""
    import torch

    g, e = got.float(), expected.float()
    if g.shape != e.shape:
        return f"{name}: shape {tuple(g.shape)}, expected {tuple(e.shape)}"
    tol = _allowed_error(e) if name == "out" else 1e-6 * e.abs()
    bad = ~((g - e).abs() <= tol)  # NaN in got counts as a mismatch
    if not bool(bad.any()):
        return None
    idx = tuple(int(i) for i in torch.nonzero(bad)[0])
    return (
        f"{name}{list(idx)}: got {g[idx].item():.6g}, expected {e[idx].item():.6g} "
        f"(allowed error {tol[idx].item():.3g}); {int(bad.sum())} of {bad.numel()} elements differ"
    )


def torch_eager(t, shape, constants):
    x = t["input"].float()
    scale = _scales(x)
    t["scales"].copy_(scale.squeeze(-1))
    t["out"].copy_((x / scale).clamp(-FP8_MAX, FP8_MAX))


SPEC = KernelSpec(
    name="per_token_fp8_quant",
    description=(
        "Dynamic per-token FP8 quantisation before an fp8 GEMM. input has shape [num_tokens, hidden] "
        "(row-major, contiguous); out is float8_e4m3fn [num_tokens, hidden]; scales is fp32 "
        "[num_tokens]. Per row, in fp32: amax = max |x|; scale = amax / 448, except that an all-zero "
        "row gets scale = 1 (its out is all 0); out = e4m3(clamp(x / scale, -448, 448)) with "
        "round-to-nearest-even; scales[t] = scale. Checked as: scales within 1e-6 relative, and "
        "every out value within one e4m3 step of x / scale (so out * scale dequantises to x within "
        "one rounding step). hidden is a multiple of 16 (16-byte rows of the fp8 output, as the fp8 "
        "GEMM that reads it requires); nothing larger is promised. Memory-bound: reads hidden elements, writes hidden bytes per token."
    ),
    args=(
        Arg("out", "tensor", dtype="float8_e4m3fn", role="out"),
        Arg("scales", "tensor", dtype="float32", role="out"),
        Arg("input", "tensor"),
        Arg("num_tokens", "int"),
        Arg("hidden", "int", multiple_of=16),
    ),
    # Hidden and intermediate sizes that feed fp8 GEMMs (Llama-3, DeepSeek-V3, Qwen2.5).
    search_shapes=(
        {"num_tokens": 1, "hidden": 4096},
        {"num_tokens": 16, "hidden": 7168},
        {"num_tokens": 128, "hidden": 14336},
        {"num_tokens": 333, "hidden": 5120},
        {"num_tokens": 512, "hidden": 18432},
        {"num_tokens": 1024, "hidden": 4096},
        {"num_tokens": 4096, "hidden": 7168},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "hidden": 8192},
        {"num_tokens": 77, "hidden": 2048},
        {"num_tokens": 2048, "hidden": 14336},
        {"num_tokens": 8191, "hidden": 3584},
        {"num_tokens": 1, "hidden": 2064},
        {"num_tokens": 129, "hidden": 4112},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["hidden"] * ((4 if dt == "float32" else 2) + 1) + 4),
    flops=lambda s: 3 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16"),
    edge_cases=("zero_rows", "outlier", "range"),
    heldout_draw=draws.row_draw(16),
    compare=compare,
    peers={"torch_eager": torch_eager},
    compiled=torch_eager,
)
