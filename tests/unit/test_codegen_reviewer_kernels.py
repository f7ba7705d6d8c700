"""Kernels written here, none of them in ``experiments/unseen`` or the library, go through the
embedded agent's code generator as the unseen ones do: each is classified, gets schedules, and
every schedule (cluster ones aside: the CPU has no distributed shared memory) computes the
spec's reference when run on the CPU (``tests/cuda_on_cpu.py``), on small shapes with rows off
vector boundaries, in fp16 and fp32, on the random inputs and every edge case of the spec, at
the default tuning and at the last value of every tune parameter.

The kernels: an elementwise map with a per-column and a per-row operand, a softmax at a
temperature, a per-row absmax quantisation to int8 values with a per-row fp32 scale, a row
standardisation without weights, a gather of rows by int64 index times a per-row scale, a
clip with a dead zone (clamp and where with scalar constants), a softmax with a bias and a
bool mask, a clamped SwiGLU whose reference splits its input with ``chunk``, a residual add
rounded to the element type followed by a plain layer norm (two outputs; its float32 runs
catch a rounding traced at float16 and emitted as one to ``__half``), an int8
dequantisation with a per-column zero point and a per-row scale, a mix of the
activations torch keeps as core ops (elu, leaky_relu, relu6, sign, softshrink) after a
nan_to_num, on inputs holding NaN and infinities, a per-head RMS norm (qk-norm) whose
reference views each row as heads of head_dim and back, the log-probability of each
row's chosen token (a log-softmax read at one column per row, then ``[:, 0]``), and a scaled
token embedding plus a position embedding (two gathers, one by ``index_select``, with ids that
count from the end when negative, as torch's indexing does), a per-group int8 quantisation
(groups of 128 along the row, through a view of the row as [hidden // 128, 128]), a fake fp8
quantisation (a rounding to e4m3 inside the expression), an fp16 argument rounded to
bfloat16 (a cast that keeps the size), rows scattered with ``scatter`` (each row's slot
expanded along it) times an explicitly expanded column operand, a greedy pick with its
confidence (a softmax's max with its index, and an argmin, NaN and ties as torch has them), and
columns gathered by an index row (``x[:, perm]``, negative entries from the end), a rotary
embedding written with ``rotate_half`` (``cat`` of a row's negated second half and its first, with
cos and sin broadcast over the heads), two inputs of different widths joined by ``cat``, and routing weights picked from each row by
that row's own indices (``torch.gather`` along the row by an index matrix), scaled per row, and
two rotary embeddings as serving engines write them natively (one cache row of cos then sin,
picked by position and split with ``chunk``; over the heads of a flat query, and on one head),
a partial rotary (the first ``rot_dim`` of each head rotated, the rest passed through), and key
heads repeated over their query group (``repeat_interleave``) and RMS-normalised per head, a mixture
of experts' combine (top-k expert outputs weighted by fp32 routing weights, summed over the
experts) and a masked mean and a max over a sequence (reductions over the dimension next to the
row's, one of them divided by a count of bools), a repetition penalty (logits at each row's
generated ids, which repeat, gathered, penalised and scattered back in place) and a dense routing
matrix (top-k weights scattered along the columns of a tensor of zeros the reference makes), and
four around ``torch.topk``: a MoE gating (softmax, top-k, renormalised), a router's softmax over
its top-k logits (int64 ids; smallest first in a variant), a biased top-k whose unbiased scores
are gathered at the picks, and top-k sampling's filter (a softmax of the logits at or above the
k-th largest: reductions after the picks); and int4 weights unpacked with bitwise ops (low and
high nibbles joined by cat), and the float ops log10, hypot, copysign, fmax and signbit on
NaN, infinities and signed zeros; and sampling by the inverse of the cumulative distribution
(a softmax's running sum written, and the count of its entries below a uniform draw). Each
folder's baseline is also run, so that a spec and its baseline agree before the generator is
judged against the spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.embedded.codegen import classify, generate
from evaluators import validate as V
from evaluators.context import tolerances
from kernels.launch import parse_launch_header
from kernels.spec import KernelSpec
from tests import cuda_on_cpu
from tests.unit.test_codegen import _kernel_here
from tests.unit.test_codegen_cpu_run import _poisoned

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(bool(cuda_on_cpu.available()), reason=cuda_on_cpu.available() or "ok")


# ---------------------------------------------------------------- the kernel folders

# out[t, i] = silu(x[t, i]) * scale[i] + shift[t]: a per-column and a per-row (fp32) operand.
SILU_SCALE_SHIFT = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device) * 3.0
    if case == "wide":
        x = x * 25.0  # silu's exp(-x) overflows fp32 for x below -88: silu(x) is -0 there
    return {
        "out": torch.empty(t, h, device=device, dtype=dtype),
        "x": x.to(dtype),
        "scale": (torch.rand(h, generator=generator, device=device) + 0.5).to(dtype),
        "shift": torch.randn(t, generator=generator, device=device),
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    return {"out": torch.nn.functional.silu(x) * inputs["scale"].float() + inputs["shift"][:, None]}


SPEC = KernelSpec(
    name="silu_scale_shift",
    description=(
        "out[t, i] = silu(x[t, i]) * scale[i] + shift[t] in fp32, rounded once. x and out are "
        "[num_tokens, hidden], scale is [hidden] (element type), shift is fp32 [num_tokens]. "
        "hidden is a multiple of 4."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("scale", "tensor"),
          Arg("shift", "tensor", dtype="float32"), Arg("num_tokens", "int"), Arg("hidden", "int", multiple_of=4)),
    search_shapes=({"num_tokens": 64, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1028},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 6 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("wide",),
)
'''

SILU_SCALE_SHIFT_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void silu_scale_shift(scalar_t* out, const scalar_t* x, const scalar_t* scale,
                                            const float* shift, int num_tokens, int hidden) {
    const long long t = blockIdx.x;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = static_cast<float>(x[t * hidden + i]);
        const float s = v / (1.0f + expf(-v));
        out[t * hidden + i] = static_cast<scalar_t>(s * static_cast<float>(scale[i]) + shift[t]);
    }
}
'''

# out = softmax(x / temperature) per row.
SOFTMAX_TEMPERATURE = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, v = shape["num_tokens"], shape["vocab"]
    x = torch.randn(t, v, generator=generator, device=device) * 4.0
    if case == "large":
        x = 300.0 + x * 10.0  # exp overflows unless the row's maximum is subtracted first
    elif case == "masked":
        x = torch.where(torch.rand(t, v, generator=generator, device=device) < 0.3, float("-inf"), x)
        x[:, 0] = 1.0  # every row keeps a finite logit
    return {"out": torch.empty(t, v, device=device, dtype=dtype), "x": x.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    return {"out": torch.softmax(inputs["x"].float() / constants["temperature"], dim=-1)}


SPEC = KernelSpec(
    name="softmax_temperature",
    description=(
        "Sampling probabilities: out[t, :] = softmax(x[t, :] / temperature) in fp32, rounded once. "
        "x and out are [num_tokens, vocab]; -inf logits give 0. vocab has no alignment."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("num_tokens", "int"), Arg("vocab", "int"),
          Arg("temperature", "float")),
    search_shapes=({"num_tokens": 16, "vocab": 32000},),
    heldout_shapes=({"num_tokens": 7, "vocab": 32001},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["vocab"] * (4 if dt == "float32" else 2),
    flops=lambda s: 5 * s["num_tokens"] * s["vocab"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("large", "masked"),
    constants={"temperature": 0.7},
)
'''

SOFTMAX_TEMPERATURE_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void softmax_temperature(scalar_t* out, const scalar_t* x, int num_tokens, int vocab,
                                               float temperature) {
    const long long t = blockIdx.x;
    float m = -INFINITY;
    for (int i = 0; i < vocab; ++i) m = fmaxf(m, static_cast<float>(x[t * vocab + i]) / temperature);
    float s = 0.0f;
    for (int i = 0; i < vocab; ++i) s += expf(static_cast<float>(x[t * vocab + i]) / temperature - m);
    for (int i = 0; i < vocab; ++i) {
        out[t * vocab + i] = static_cast<scalar_t>(expf(static_cast<float>(x[t * vocab + i]) / temperature - m) / s);
    }
}
'''

# Symmetric per-row int8 quantisation: int8 values in [-127, 127] and a per-row fp32 scale.
ABSMAX_QUANT_ROWS = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device) * 2.0
    if case == "zero_rows":
        x[::2] = 0.0  # absmax 0: the scale is 1 and every value 0
    return {
        "q": torch.empty(t, h, device=device, dtype=torch.int8),
        "scales": torch.empty(t, device=device, dtype=torch.float32),
        "x": x.to(dtype),
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(x / scale), -127.0, 127.0).to(torch.int8)
    return {"q": q, "scales": scale.squeeze(-1)}


def compare(name, got, expected):
    """q within one step (x / scale may round either way at a half), scales within 1e-6
    relative."""
    import torch

    g, e = got.double(), expected.double()
    if g.shape != e.shape:
        return f"{name}: shape {tuple(g.shape)}, expected {tuple(e.shape)}"
    tol = torch.ones_like(e) if name == "q" else 1e-6 * e.abs() + 1e-30
    bad = ~((g - e).abs() <= tol)
    if not bool(bad.any()):
        return None
    idx = tuple(int(i) for i in bad.nonzero()[0])
    return f"{name}{list(idx)}: got {g[idx].item():.6g}, expected {e[idx].item():.6g}; {int(bad.sum())} differ"


SPEC = KernelSpec(
    name="absmax_quant_rows",
    description=(
        "Per-token symmetric int8 quantisation. x is [num_tokens, hidden]; q is int8 [num_tokens, "
        "hidden]; scales is fp32 [num_tokens]. Per row, in fp32: a = max |x|, "
        "scale = a / 127 if a > 0 else 1, q = clamp(round_half_even(x / scale), -127, 127). "
        "hidden is a multiple of 4."
    ),
    args=(Arg("q", "tensor", dtype="int8", role="out"), Arg("scales", "tensor", dtype="float32", role="out"),
          Arg("x", "tensor"), Arg("num_tokens", "int"), Arg("hidden", "int", multiple_of=4)),
    search_shapes=({"num_tokens": 64, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1028},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["hidden"] * ((4 if dt == "float32" else 2) + 1) + 4),
    flops=lambda s: 3 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("zero_rows",),
    compare=compare,
)
'''

ABSMAX_QUANT_ROWS_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void absmax_quant_rows(signed char* q, float* scales, const scalar_t* x, int num_tokens, int hidden) {
    const long long t = blockIdx.x;
    float a = 0.0f;
    for (int i = 0; i < hidden; ++i) a = fmaxf(a, fabsf(static_cast<float>(x[t * hidden + i])));
    const float scale = a > 0.0f ? a / 127.0f : 1.0f;
    scales[t] = scale;
    for (int i = 0; i < hidden; ++i) {
        const float v = rintf(static_cast<float>(x[t * hidden + i]) / scale);
        q[t * hidden + i] = static_cast<signed char>(fminf(fmaxf(v, -127.0f), 127.0f));
    }
}
'''

# out = (x - mean) / sqrt(var + eps) per row, biased variance, no weights.
STANDARDISE_ROWS = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device)
    if case == "offset":
        x = 20.0 + x  # rows far from zero: a one-pass variance cancels
    elif case == "zero_rows":
        x[::2] = 0.0  # variance 0: the rows come out 0 (sqrt(eps) divides)
    return {"out": torch.empty(t, h, device=device, dtype=dtype), "x": x.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    mu = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, unbiased=False, keepdim=True)
    return {"out": (x - mu) / torch.sqrt(var + constants["eps"])}


SPEC = KernelSpec(
    name="standardise_rows",
    description=(
        "Row standardisation: out[t, :] = (x[t, :] - mean) / sqrt(var + eps) with the biased "
        "variance, in fp32, rounded once; eps = 1e-5, no weight or bias. x and out are "
        "[num_tokens, hidden]; hidden is a multiple of 2."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("num_tokens", "int"),
          Arg("hidden", "int", multiple_of=2), Arg("eps", "float")),
    search_shapes=({"num_tokens": 64, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1026},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 5 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("offset", "zero_rows"),
    constants={"eps": 1e-5},
)
'''

# The sums in double: one thread adding 4096 fp32 values near 20 in order loses up to 5e-5 of
# the mean, more than fp32's tolerance, and the baseline must meet its own reference.
STANDARDISE_ROWS_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void standardise_rows(scalar_t* out, const scalar_t* x, int num_tokens, int hidden, float eps) {
    const long long t = blockIdx.x;
    double s = 0.0;
    for (int i = 0; i < hidden; ++i) s += static_cast<float>(x[t * hidden + i]);
    const float mu = static_cast<float>(s / hidden);
    double d2 = 0.0;
    for (int i = 0; i < hidden; ++i) {
        const float d = static_cast<float>(x[t * hidden + i]) - mu;
        d2 += static_cast<double>(d) * d;
    }
    const float inv = 1.0f / sqrtf(static_cast<float>(d2 / hidden) + eps);
    for (int i = 0; i < hidden; ++i) {
        out[t * hidden + i] = static_cast<scalar_t>((static_cast<float>(x[t * hidden + i]) - mu) * inv);
    }
}
'''

# out[t, :] = table[ids[t], :] * row_scale[t], int64 ids, fp32 scales.
GATHER_SCALE_ROWS = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, v = shape["num_tokens"], shape["hidden"], shape["vocab"]
    ids = torch.randint(0, v, (t,), generator=generator, device=device)
    if case == "edge_ids":
        ids = torch.where(torch.arange(t, device=device) % 2 == 0, v - 1, 0)  # the table's last and first rows
    return {
        "out": torch.empty(t, h, device=device, dtype=dtype),
        "table": torch.randn(v, h, generator=generator, device=device).to(dtype),
        "ids": ids.to(torch.int64),
        "row_scale": torch.rand(t, generator=generator, device=device) * 2.0 + 0.25,
    }


def reference(inputs, shape, constants):
    return {"out": inputs["table"][inputs["ids"]].float() * inputs["row_scale"][:, None]}


SPEC = KernelSpec(
    name="gather_scale_rows",
    description=(
        "Scaled row lookup: out[t, :] = table[ids[t], :] * row_scale[t] in fp32, rounded once. "
        "table is [vocab, hidden], ids int64 [num_tokens] in [0, vocab), row_scale fp32 "
        "[num_tokens], out [num_tokens, hidden]. hidden is a multiple of 4."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("table", "tensor"), Arg("ids", "tensor", dtype="int64"),
          Arg("row_scale", "tensor", dtype="float32"), Arg("num_tokens", "int"),
          Arg("hidden", "int", multiple_of=4), Arg("vocab", "int")),
    search_shapes=({"num_tokens": 64, "hidden": 4096, "vocab": 32000},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1028, "vocab": 32000},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("edge_ids",),
)
'''

GATHER_SCALE_ROWS_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void gather_scale_rows(scalar_t* out, const scalar_t* table, const long long* ids,
                                             const float* row_scale, int num_tokens, int hidden, int vocab) {
    const long long t = blockIdx.x;
    const scalar_t* src = table + ids[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        out[t * hidden + i] = static_cast<scalar_t>(static_cast<float>(src[i]) * row_scale[t]);
    }
}
'''

# out = 0 where |x| < dead, else clamp(x, -cap, cap).
CLIP_DEADZONE = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device) * 4.0
    if case == "small":
        x = x * 0.02  # most values inside the dead zone
    return {"out": torch.empty(t, h, device=device, dtype=dtype), "x": x.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    clipped = torch.clamp(x, -constants["cap"], constants["cap"])
    return {"out": torch.where(x.abs() < constants["dead"], 0.0, clipped)}


SPEC = KernelSpec(
    name="clip_deadzone",
    description=(
        "out[t, i] = 0 if |x[t, i]| < dead else clamp(x[t, i], -cap, cap); cap = 6, dead = 0.05. "
        "x and out are [num_tokens, hidden]; hidden has no alignment."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("num_tokens", "int"), Arg("hidden", "int"),
          Arg("cap", "float"), Arg("dead", "float")),
    search_shapes=({"num_tokens": 64, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1027},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 3 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("small",),
    constants={"cap": 6.0, "dead": 0.05},
)
'''

CLIP_DEADZONE_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void clip_deadzone(scalar_t* out, const scalar_t* x, int num_tokens, int hidden,
                                         float cap, float dead) {
    const long long t = blockIdx.x;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = static_cast<float>(x[t * hidden + i]);
        out[t * hidden + i] = static_cast<scalar_t>(fabsf(v) < dead ? 0.0f : fminf(fmaxf(v, -cap), cap));
    }
}
'''


# out = softmax(x + bias) per row, masked positions -inf: a bool mask, read in every pass of
# the row (not kept in the float register cache).
MASKED_SOFTMAX_BIAS = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, v = shape["num_tokens"], shape["cols"]
    x = torch.randn(t, v, generator=generator, device=device) * 3.0
    mask = torch.rand(t, v, generator=generator, device=device) < (0.9 if case == "mostly_masked" else 0.2)
    mask[:, 0] = False  # every row keeps a position
    return {"out": torch.empty(t, v, device=device, dtype=dtype), "x": x.to(dtype),
            "bias": torch.randn(v, generator=generator, device=device).to(dtype), "mask": mask}


def reference(inputs, shape, constants):
    import torch

    y = (inputs["x"].float() + inputs["bias"].float()).masked_fill(inputs["mask"], float("-inf"))
    return {"out": torch.softmax(y, dim=-1)}


SPEC = KernelSpec(
    name="masked_softmax_bias",
    description=(
        "Attention-style probabilities: out[t, :] = softmax(x[t, :] + bias) in fp32 with the "
        "positions where mask[t, i] is true at -inf, rounded once. x, mask and out are "
        "[num_tokens, cols]; bias is [cols]; mask is bool."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("bias", "tensor"), Arg("mask", "tensor", dtype="bool"),
          Arg("num_tokens", "int"), Arg("cols", "int")),
    search_shapes=({"num_tokens": 64, "cols": 4096},),
    heldout_shapes=({"num_tokens": 7, "cols": 1001},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * s["cols"] * (1 + 2 * (4 if dt == "float32" else 2)),
    flops=lambda s: 5 * s["num_tokens"] * s["cols"],
    dtypes=("float16", "float32"),
    edge_cases=("mostly_masked",),
)
'''

MASKED_SOFTMAX_BIAS_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void masked_softmax_bias(scalar_t* out, const scalar_t* x, const scalar_t* bias, const bool* mask,
                                               int num_tokens, int cols) {
    const long long t = blockIdx.x;
    float m = -INFINITY, s = 0.0f;
    for (int i = 0; i < cols; ++i) {
        if (!mask[t * cols + i]) m = fmaxf(m, static_cast<float>(x[t * cols + i]) + static_cast<float>(bias[i]));
    }
    for (int i = 0; i < cols; ++i) {
        if (!mask[t * cols + i]) s += expf(static_cast<float>(x[t * cols + i]) + static_cast<float>(bias[i]) - m);
    }
    for (int i = 0; i < cols; ++i) {
        const float e = mask[t * cols + i] ? 0.0f : expf(static_cast<float>(x[t * cols + i]) + static_cast<float>(bias[i]) - m);
        out[t * cols + i] = static_cast<scalar_t>(e / s);
    }
}
'''

# A clamped SwiGLU whose reference splits its [t, 2d] input with chunk (split_with_sizes and
# getitem in the graph) rather than slicing it.
SWIGLU_CHUNK_CLAMP = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, d = shape["num_tokens"], shape["d"]
    return {"out": torch.empty(t, d, device=device, dtype=dtype),
            "x": (torch.randn(t, 2 * d, generator=generator, device=device) * 5.0).to(dtype)}


def reference(inputs, shape, constants):
    import torch

    gate, up = inputs["x"].float().chunk(2, dim=-1)
    gate = gate.clamp(max=constants["limit"])
    up = up.clamp(-constants["limit"], constants["limit"])
    return {"out": torch.nn.functional.silu(gate) * (up + 1.0)}


SPEC = KernelSpec(
    name="swiglu_chunk_clamp",
    description=(
        "out[t, i] = silu(min(g, limit)) * (clamp(u, -limit, limit) + 1) in fp32, rounded once, "
        "with g = x[t, i] and u = x[t, d + i]. x is [num_tokens, 2 * d], out [num_tokens, d]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("num_tokens", "int"), Arg("d", "int"),
          Arg("limit", "float")),
    search_shapes=({"num_tokens": 64, "d": 4096},),
    heldout_shapes=({"num_tokens": 7, "d": 1000},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 3 * s["num_tokens"] * s["d"] * (4 if dt == "float32" else 2),
    flops=lambda s: 8 * s["num_tokens"] * s["d"],
    dtypes=("float16", "float32"),
    constants={"limit": 7.0},
)
'''

SWIGLU_CHUNK_CLAMP_CU = '''// launch: grid=(num_tokens,) block=(64,) smem=0
extern "C" __global__ void swiglu_chunk_clamp(scalar_t* out, const scalar_t* x, int num_tokens, int d, float limit) {
    const long long t = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = fminf(static_cast<float>(x[t * 2 * d + i]), limit);
        const float u = fminf(fmaxf(static_cast<float>(x[t * 2 * d + d + i]), -limit), limit);
        out[t * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * (u + 1.0f));
    }
}
'''

# res_out = x + res rounded to the inputs' type, out = layer_norm(res_out) without weights: the
# reference rounds an intermediate to the element type (.to(x.dtype)), which a float16 trace
# cannot tell from a rounding to float16.
ADD_LAYERNORM_PLAIN = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    return {"out": torch.empty(t, h, device=device, dtype=dtype), "res_out": torch.empty(t, h, device=device, dtype=dtype),
            "x": torch.randn(t, h, generator=generator, device=device).to(dtype),
            "res": torch.randn(t, h, generator=generator, device=device).to(dtype)}


def reference(inputs, shape, constants):
    import torch

    s = (inputs["x"].float() + inputs["res"].float()).to(inputs["x"].dtype).float()
    return {"res_out": s, "out": torch.nn.functional.layer_norm(s, (s.shape[-1],), eps=constants["eps"])}


SPEC = KernelSpec(
    name="add_layernorm_plain",
    description=(
        "res_out = x + res, rounded to the element type; out = layer norm of res_out over each "
        "row (biased variance, eps), no weight or bias, in fp32, rounded once. All [num_tokens, hidden]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("res_out", "tensor", role="out"), Arg("x", "tensor"),
          Arg("res", "tensor"), Arg("num_tokens", "int"), Arg("hidden", "int"), Arg("eps", "float")),
    search_shapes=({"num_tokens": 64, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1001},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 4 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 8 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "float32"),
    constants={"eps": 1e-5},
)
'''

ADD_LAYERNORM_PLAIN_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void add_layernorm_plain(scalar_t* out, scalar_t* res_out, const scalar_t* x, const scalar_t* res,
                                               int num_tokens, int hidden, float eps) {
    const long long t = blockIdx.x;
    float mean = 0.0f, var = 0.0f;
    for (int i = 0; i < hidden; ++i) {
        const scalar_t s = static_cast<scalar_t>(static_cast<float>(x[t * hidden + i]) + static_cast<float>(res[t * hidden + i]));
        res_out[t * hidden + i] = s;
        mean += static_cast<float>(s);
    }
    mean /= hidden;
    for (int i = 0; i < hidden; ++i) {
        const float c = static_cast<float>(res_out[t * hidden + i]) - mean;
        var += c * c;
    }
    const float r = rsqrtf(var / hidden + eps);
    for (int i = 0; i < hidden; ++i) out[t * hidden + i] = static_cast<scalar_t>((static_cast<float>(res_out[t * hidden + i]) - mean) * r);
}
'''

# out = (q - zero[i]) * scale[t]: int8 values, an int8 per-column zero point, an fp32 per-row scale.
DEQUANT_INT8_ROWS = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    return {"out": torch.empty(t, h, device=device, dtype=dtype),
            "q": torch.randint(-128, 128, (t, h), generator=generator, device=device, dtype=torch.int8),
            "scale": torch.rand(t, generator=generator, device=device) + 0.01,
            "zero": torch.randint(-4, 4, (h,), generator=generator, device=device, dtype=torch.int8)}


def reference(inputs, shape, constants):
    return {"out": (inputs["q"].float() - inputs["zero"].float()) * inputs["scale"][:, None]}


SPEC = KernelSpec(
    name="dequant_int8_rows",
    description=(
        "out[t, i] = (q[t, i] - zero[i]) * scale[t] in fp32, rounded once. q is int8 "
        "[num_tokens, hidden], zero int8 [hidden], scale fp32 [num_tokens]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("q", "tensor", dtype="int8"), Arg("scale", "tensor", dtype="float32"),
          Arg("zero", "tensor", dtype="int8"), Arg("num_tokens", "int"), Arg("hidden", "int")),
    search_shapes=({"num_tokens": 64, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1001},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * s["hidden"] * (1 + (4 if dt == "float32" else 2)),
    flops=lambda s: 2 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "float32"),
)
'''

DEQUANT_INT8_ROWS_CU = '''// launch: grid=(num_tokens,) block=(64,) smem=0
extern "C" __global__ void dequant_int8_rows(scalar_t* out, const signed char* q, const float* scale,
                                             const signed char* zero, int num_tokens, int hidden) {
    const long long t = blockIdx.x;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        out[t * hidden + i] = static_cast<scalar_t>((static_cast<float>(q[t * hidden + i]) - static_cast<float>(zero[i])) * scale[t]);
    }
}
'''


# Activations torch keeps as core ops (elu, leaky_relu, hardtanh for relu6, sign) and the
# isnan/isinf tests of nan_to_num, on inputs holding NaN and infinities.
ACTIVATION_MIX = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device) * 4.0
    if case == "non_finite":
        x.view(-1)[::7] = float("nan")
        x.view(-1)[3::11] = float("inf")
        x.view(-1)[5::13] = float("-inf")
    return {"out": torch.empty(t, h, device=device, dtype=dtype), "x": x.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    F = torch.nn.functional
    x = torch.nan_to_num(inputs["x"].float(), nan=0.0, posinf=100.0, neginf=-100.0)
    return {"out": F.relu6(x) + F.elu(x, alpha=0.5) + F.leaky_relu(x, 0.1) * torch.sign(x) + F.softshrink(x, 0.5)}


SPEC = KernelSpec(
    name="activation_mix",
    description=(
        "x = nan_to_num(x, nan=0, posinf=100, neginf=-100); out = relu6(x) + elu(x, 0.5) + "
        "leaky_relu(x, 0.1) * sign(x) + softshrink(x, 0.5), in fp32, rounded once. [num_tokens, hidden]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("num_tokens", "int"), Arg("hidden", "int")),
    search_shapes=({"num_tokens": 64, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1001},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 20 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "float32"),
    edge_cases=("non_finite",),
)
'''

ACTIVATION_MIX_CU = '''// launch: grid=(num_tokens,) block=(64,) smem=0
extern "C" __global__ void activation_mix(scalar_t* out, const scalar_t* x, int num_tokens, int hidden) {
    const long long t = blockIdx.x;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = static_cast<float>(x[t * hidden + i]);
        v = v != v ? 0.0f : (fabsf(v) > 3.0e38f ? (v > 0.0f ? 100.0f : -100.0f) : v);
        const float sign = v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : 0.0f);
        const float shrink = v > 0.5f ? v - 0.5f : (v < -0.5f ? v + 0.5f : 0.0f);
        const float r = fminf(fmaxf(v, 0.0f), 6.0f) + (v > 0.0f ? v : 0.5f * expm1f(v)) + (v > 0.0f ? v : 0.1f * v) * sign + shrink;
        out[t * hidden + i] = static_cast<scalar_t>(r);
    }
}
'''


# Per-head RMS norm of q or k (qk-norm): a [t, heads * d] row viewed as heads rows of d,
# normalised with a [d] weight, and viewed back.
HEAD_RMSNORM = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, d = shape["num_tokens"], shape["heads"], shape["head_dim"]
    return {"out": torch.empty(t, h * d, device=device, dtype=dtype),
            "x": torch.randn(t, h * d, generator=generator, device=device).to(dtype),
            "weight": (torch.rand(d, generator=generator, device=device) + 0.5).to(dtype)}


def reference(inputs, shape, constants):
    import torch

    t, h, d = shape["num_tokens"], shape["heads"], shape["head_dim"]
    x = inputs["x"].float().view(t, h, d)
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + constants["eps"]) * inputs["weight"].float()
    return {"out": y.view(t, h * d)}


SPEC = KernelSpec(
    name="head_rmsnorm",
    description=(
        "qk-norm: each head's head_dim values of x[t, :] (heads of them per row) RMS-normalised "
        "(mean of squares plus eps) and times weight, in fp32, rounded once. x and out are "
        "[num_tokens, heads * head_dim], weight [head_dim]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("weight", "tensor"), Arg("num_tokens", "int"),
          Arg("heads", "int"), Arg("head_dim", "int", multiple_of=8), Arg("eps", "float")),
    search_shapes=({"num_tokens": 64, "heads": 32, "head_dim": 128},),
    heldout_shapes=({"num_tokens": 7, "heads": 5, "head_dim": 64},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["heads"] * s["head_dim"] * (4 if dt == "float32" else 2),
    flops=lambda s: 4 * s["num_tokens"] * s["heads"] * s["head_dim"],
    dtypes=("float16", "float32"),
    constants={"eps": 1e-6},
)
'''

HEAD_RMSNORM_CU = '''// launch: grid=(num_tokens * heads,) block=(1,) smem=0
extern "C" __global__ void head_rmsnorm(scalar_t* out, const scalar_t* x, const scalar_t* weight, int num_tokens,
                                        int heads, int head_dim, float eps) {
    const long long r = blockIdx.x;
    float s = 0.0f;
    for (int i = 0; i < head_dim; ++i) s += static_cast<float>(x[r * head_dim + i]) * static_cast<float>(x[r * head_dim + i]);
    const float k = rsqrtf(s / head_dim + eps);
    for (int i = 0; i < head_dim; ++i) {
        out[r * head_dim + i] = static_cast<scalar_t>(static_cast<float>(x[r * head_dim + i]) * k * static_cast<float>(weight[i]));
    }
}
'''


# The log-probability of each row's chosen token (RL and sampling): a log-softmax over the
# vocabulary read at one column per row (gather by index), then ``[:, 0]`` (select).
TOKEN_LOGPROB = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, v = shape["num_tokens"], shape["vocab"]
    x = torch.randn(t, v, generator=generator, device=device) * 3.0
    ids = torch.randint(0, v, (t,), generator=generator, device=device)
    if case == "edge_ids":
        ids[::2] = v - 1
        ids[1::2] = 0
    return {"out": torch.empty(t, device=device, dtype=torch.float32), "x": x.to(dtype), "ids": ids}


def reference(inputs, shape, constants):
    import torch

    logp = torch.log_softmax(inputs["x"].float(), dim=-1)
    return {"out": logp.gather(-1, inputs["ids"][:, None])[:, 0]}


SPEC = KernelSpec(
    name="token_logprob",
    description=(
        "out[t] = log_softmax(x[t, :])[ids[t]] in fp32. x is [num_tokens, vocab], ids int64 "
        "[num_tokens] in [0, vocab), out fp32 [num_tokens]."
    ),
    args=(Arg("out", "tensor", role="out", dtype="float32"), Arg("x", "tensor"), Arg("ids", "tensor", dtype="int64"),
          Arg("num_tokens", "int"), Arg("vocab", "int")),
    search_shapes=({"num_tokens": 64, "vocab": 32000},),
    heldout_shapes=({"num_tokens": 7, "vocab": 32001},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * s["vocab"] * (4 if dt == "float32" else 2),
    flops=lambda s: 3 * s["num_tokens"] * s["vocab"],
    dtypes=("float16", "float32"),
    edge_cases=("edge_ids",),
)
'''

TOKEN_LOGPROB_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void token_logprob(float* out, const scalar_t* x, const long long* ids, int num_tokens, int vocab) {
    const long long t = blockIdx.x;
    float m = -INFINITY, s = 0.0f;
    for (int i = 0; i < vocab; ++i) m = fmaxf(m, static_cast<float>(x[t * vocab + i]));
    for (int i = 0; i < vocab; ++i) s += expf(static_cast<float>(x[t * vocab + i]) - m);
    out[t] = static_cast<float>(x[t * vocab + ids[t]]) - m - logf(s);
}
'''

# out[t] = tok_table[ids[t]] * w[t] + pos_table.index_select(0, positions)[t]: two gathers, one
# written with index_select, ids counting from the end when negative (as torch indexes).
EMBED_POS_SUM = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, v, p = shape["num_tokens"], shape["hidden"], shape["vocab"], shape["max_pos"]
    ids = torch.randint(0, v, (t,), generator=generator, device=device)
    positions = torch.randint(0, p, (t,), generator=generator, device=device)
    if case == "edge_ids":  # each table's first and last rows
        even = torch.arange(t, device=device) % 2 == 0
        ids = torch.where(even, v - 1, 0)
        positions = torch.where(even, 0, p - 1)
    if case == "from_end":  # every other id negative: row v + id
        ids = torch.where(torch.arange(t, device=device) % 2 == 1, ids - v, ids)
    return {
        "out": torch.empty(t, h, device=device, dtype=dtype),
        "tok_table": torch.randn(v, h, generator=generator, device=device).to(dtype),
        "pos_table": torch.randn(p, h, generator=generator, device=device).to(dtype),
        "ids": ids,
        "positions": positions,
        "w": torch.rand(t, generator=generator, device=device) * 2.0 + 0.25,
    }


def reference(inputs, shape, constants):
    tok = inputs["tok_table"][inputs["ids"]].float()  # torch counts a negative id from the end
    pos = inputs["pos_table"].index_select(0, inputs["positions"]).float()
    return {"out": tok * inputs["w"][:, None] + pos}


SPEC = KernelSpec(
    name="embed_pos_sum",
    description=(
        "out[t, :] = tok_table[ids[t], :] * w[t] + pos_table[positions[t], :] in fp32, rounded once. "
        "tok_table is [vocab, hidden], pos_table [max_pos, hidden], ids int64 [num_tokens] in "
        "[-vocab, vocab) (a negative id counts from the end), positions int64 [num_tokens] in "
        "[0, max_pos), w fp32 [num_tokens], out [num_tokens, hidden]. hidden is a multiple of 8."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("tok_table", "tensor"), Arg("pos_table", "tensor"),
          Arg("ids", "tensor", dtype="int64"), Arg("positions", "tensor", dtype="int64"),
          Arg("w", "tensor", dtype="float32"), Arg("num_tokens", "int"), Arg("hidden", "int", multiple_of=8),
          Arg("vocab", "int"), Arg("max_pos", "int")),
    search_shapes=({"num_tokens": 64, "hidden": 4096, "vocab": 32000, "max_pos": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1032, "vocab": 32000, "max_pos": 2048},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 3 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 2 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "float32"),
    edge_cases=("edge_ids", "from_end"),
)
'''

EMBED_POS_SUM_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void embed_pos_sum(scalar_t* out, const scalar_t* tok_table, const scalar_t* pos_table,
                                         const long long* ids, const long long* positions, const float* w,
                                         int num_tokens, int hidden, int vocab, int max_pos) {
    const long long t = blockIdx.x;
    const long long id = ids[t] < 0 ? ids[t] + vocab : ids[t];
    const scalar_t* a = tok_table + id * hidden;
    const scalar_t* b = pos_table + positions[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        out[t * hidden + i] = static_cast<scalar_t>(static_cast<float>(a[i]) * w[t] + static_cast<float>(b[i]));
    }
}
'''

# q, scale = per-group int8 quantisation, groups of 128 along the row: the reference views the row
# as [hidden // 128, 128], so the generator's rows are num_tokens * (hidden // 128) groups.
GROUP_QUANT_INT8 = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device) * 2.0
    if case == "zero_groups":
        x.view(t, h // 128, 128)[:, ::2] = 0.0  # absmax 0: the scale is 1e-10 and every value 0
    elif case == "outliers":
        x[:, ::37] = 300.0  # one value per group dominates its scale, the rest round to few steps
    return {
        "q": torch.empty(t, h, device=device, dtype=torch.int8),
        "scale": torch.empty(t, h // 128, device=device, dtype=torch.float32),
        "x": x.to(dtype),
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    t, h = x.shape
    g = x.reshape(t, h // 128, 128)
    amax = g.abs().amax(dim=-1, keepdim=True)
    scale = torch.clamp(amax / 127.0, min=1e-10)
    q = torch.clamp(torch.round(g / scale), -127.0, 127.0).to(torch.int8)
    return {"q": q.reshape(t, h), "scale": scale.squeeze(-1)}


def compare(name, got, expected):
    """q within one step (x / scale may round either way at a half), scales within 1e-6
    relative."""
    import torch

    g, e = got.double(), expected.double()
    if g.shape != e.shape:
        return f"{name}: shape {tuple(g.shape)}, expected {tuple(e.shape)}"
    tol = torch.ones_like(e) if name == "q" else 1e-6 * e.abs() + 1e-30
    bad = ~((g - e).abs() <= tol)
    if not bool(bad.any()):
        return None
    idx = tuple(int(i) for i in bad.nonzero()[0])
    return f"{name}{list(idx)}: got {g[idx].item():.6g}, expected {e[idx].item():.6g}; {int(bad.sum())} differ"


SPEC = KernelSpec(
    name="group_quant_int8",
    description=(
        "Per-group symmetric int8 quantisation of activations (groups of 128 contiguous elements "
        "of a row). x is [num_tokens, hidden]; q is int8 [num_tokens, hidden]; scale is fp32 "
        "[num_tokens, hidden / 128], row-major. Per group, in fp32: a = max |x|, "
        "scale = max(a / 127, 1e-10), q = clamp(round_half_even(x / scale), -127, 127). "
        "hidden is a multiple of 128."
    ),
    args=(Arg("q", "tensor", dtype="int8", role="out"), Arg("scale", "tensor", dtype="float32", role="out"),
          Arg("x", "tensor"), Arg("num_tokens", "int"), Arg("hidden", "int", multiple_of=128)),
    search_shapes=({"num_tokens": 64, "hidden": 7168},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1152},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["hidden"] * ((4 if dt == "float32" else 2) + 1) + 4 * (s["hidden"] // 128)),
    flops=lambda s: 3 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("zero_groups", "outliers"),
    compare=compare,
)
'''

GROUP_QUANT_INT8_CU = '''// launch: grid=(num_tokens * (hidden // 128),) block=(1,) smem=0
extern "C" __global__ void group_quant_int8(signed char* q, float* scale, const scalar_t* x, int num_tokens, int hidden) {
    const long long g = blockIdx.x;  // group g covers elements [g * 128, g * 128 + 128) of the flat tensor
    float a = 0.0f;
    for (int i = 0; i < 128; ++i) a = fmaxf(a, fabsf(static_cast<float>(x[g * 128 + i])));
    const float s = fmaxf(a / 127.0f, 1e-10f);
    scale[g] = s;
    for (int i = 0; i < 128; ++i) {
        const float v = rintf(static_cast<float>(x[g * 128 + i]) / s);
        q[g * 128 + i] = static_cast<signed char>(fminf(fmaxf(v, -127.0f), 127.0f));
    }
}
'''

# out = e4m3(clamp(x / scale[0])) * scale[0]: a rounding to fp8 in the middle of the expression.
FAKE_QUANT_FP8 = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device) * 4.0
    scale = torch.rand(1, generator=generator, device=device) * 0.05 + 0.01
    if case == "saturate":
        x = x * 100.0  # most values past 448 * scale: clamped
    elif case == "tiny":
        x = x * 1e-3  # quotients in e4m3's subnormal range (below 2^-6)
    return {
        "out": torch.empty(t, h, device=device, dtype=dtype),
        "x": x.to(dtype),
        "scale": scale,
    }


def reference(inputs, shape, constants):
    import torch

    q = torch.clamp(inputs["x"].float() / inputs["scale"][0], -448.0, 448.0)
    return {"out": q.to(torch.float8_e4m3fn).float() * inputs["scale"][0]}


SPEC = KernelSpec(
    name="fake_quant_fp8",
    description=(
        "Fake (per-tensor) fp8 quantisation: out[t, i] = e4m3(clamp(x[t, i] / scale[0], -448, 448)) "
        "* scale[0], the quotient in fp32 rounded to nearest even e4m3, the product in fp32 rounded "
        "once to the element type. x and out are [num_tokens, hidden], scale a one-element fp32 "
        "tensor. hidden is a multiple of 8."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"),
          Arg("scale", "tensor", dtype="float32"), Arg("num_tokens", "int"), Arg("hidden", "int", multiple_of=8)),
    search_shapes=({"num_tokens": 64, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1032},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2) + 4,
    flops=lambda s: 3 * s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("saturate", "tiny"),
)
'''

FAKE_QUANT_FP8_CU = '''// launch: grid=(cdiv(num_tokens * hidden, 256),) block=(256,) smem=0
extern "C" __global__ void fake_quant_fp8(scalar_t* out, const scalar_t* x, const float* scale,
                                            int num_tokens, int hidden) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < static_cast<long long>(num_tokens) * hidden) {
        const float q = fminf(fmaxf(static_cast<float>(x[i]) / scale[0], -448.0f), 448.0f);
        out[i] = static_cast<scalar_t>(static_cast<float>(__nv_fp8_e4m3(q)) * scale[0]);
    }
}
'''

# out = where(keep[t], bf16(x) * y, 0): an fp16 argument rounded to bfloat16, a cast of the same size.
BF16_ROUND_MUL = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device)
    y = torch.randn(t, h, generator=generator, device=device)
    keep = torch.rand(t, generator=generator, device=device) < 0.6
    if case == "none_kept":
        keep = torch.zeros(t, device=device, dtype=torch.bool)
    elif case == "padding_garbage":
        # Dropped (padding) tokens hold garbage, NaN and inf included: they still give 0.
        keep = torch.arange(t, device=device) % 2 == 0
        x = torch.where(keep[:, None], x, float("nan"))
        y = torch.where(keep[:, None], y, float("inf"))
    return {
        "out": torch.empty(t, h, device=device, dtype=dtype),
        "x": x.to(dtype),
        "y": y.to(dtype),
        "keep": keep,
    }


def reference(inputs, shape, constants):
    import torch

    prod = inputs["x"].to(torch.bfloat16).float() * inputs["y"].float()
    return {"out": torch.where(inputs["keep"][:, None], prod, 0.0)}


SPEC = KernelSpec(
    name="bf16_round_mul",
    description=(
        "out[t, i] = bf16(x[t, i]) * y[t, i] in fp32 (x rounded to bfloat16 first), rounded once, where keep[t], else 0 (whatever x "
        "and y hold there). x, y and out are [num_tokens, hidden]; keep is bool [num_tokens]. "
        "hidden has no alignment."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("y", "tensor"),
          Arg("keep", "tensor", dtype="bool"), Arg("num_tokens", "int"), Arg("hidden", "int")),
    search_shapes=({"num_tokens": 64, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1001},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 3 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2) + s["num_tokens"],
    flops=lambda s: s["num_tokens"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("none_kept", "padding_garbage"),
)
'''

BF16_ROUND_MUL_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void bf16_round_mul(scalar_t* out, const scalar_t* x, const scalar_t* y, const bool* keep,
                                            int num_tokens, int hidden) {
    const long long t = blockIdx.x;
    const bool k = keep[t];
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = k ? static_cast<float>(__float2bfloat16(static_cast<float>(x[t * hidden + i]))) * static_cast<float>(y[t * hidden + i]) : 0.0f;
        out[t * hidden + i] = static_cast<scalar_t>(v);
    }
}
'''

# state[slots[t]] = x[t] * gain, written with scatter along the rows (the slot of each row expanded
# over it) and an explicitly expanded column operand.
GAIN_SLOT_SCATTER = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, s = shape["num_tokens"], shape["hidden"], shape["num_slots"]
    slots = torch.randperm(s, generator=generator, device=device)[:t]
    if case == "ends":
        # The buffer's last row, then its first: the last ends the buffer exactly.
        rest = torch.randperm(s - 2, generator=generator, device=device) + 1
        slots = torch.cat([torch.tensor([s - 1, 0], device=device), rest])[:t]
    return {
        "state": torch.randn(s, h, generator=generator, device=device).to(dtype),
        "x": torch.randn(t, h, generator=generator, device=device).to(dtype),
        "gain": (torch.rand(h, generator=generator, device=device) + 0.5).to(dtype),
        "slots": slots.to(torch.int64),
    }


def reference(inputs, shape, constants):
    state, x = inputs["state"].float(), inputs["x"].float()
    t, h = x.shape
    rows = inputs["slots"][:, None].expand(-1, h)  # one slot per row, repeated along it
    return {"state": state.scatter(0, rows, x * inputs["gain"].float()[None, :].expand(t, -1))}


SPEC = KernelSpec(
    name="gain_slot_scatter",
    description=(
        "Per-request state write-back: state[slots[t], :] = x[t, :] * gain in fp32, rounded once; every other row of "
        "state keeps its contents. state is [num_slots, hidden] (read and written in place), x "
        "[num_tokens, hidden], gain [hidden], slots int64 [num_tokens], distinct, each in [0, num_slots). hidden is a "
        "multiple of 8."
    ),
    args=(Arg("state", "tensor", role="inout"), Arg("x", "tensor"), Arg("gain", "tensor"), Arg("slots", "tensor", dtype="int64"),
          Arg("num_tokens", "int"), Arg("hidden", "int", multiple_of=8), Arg("num_slots", "int")),
    search_shapes=({"num_tokens": 64, "hidden": 4096, "num_slots": 256},),
    heldout_shapes=({"num_tokens": 7, "hidden": 1032, "num_slots": 300},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (2 * s["hidden"] * (4 if dt == "float32" else 2) + 8),
    flops=lambda s: 0,
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("ends",),
)
'''

GAIN_SLOT_SCATTER_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void gain_slot_scatter(scalar_t* state, const scalar_t* x, const scalar_t* gain,
                                             const long long* slots, int num_tokens, int hidden, int num_slots) {
    const long long t = blockIdx.x;
    scalar_t* dst = state + slots[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        dst[i] = static_cast<scalar_t>(static_cast<float>(x[t * hidden + i]) * static_cast<float>(gain[i]));
    }
}
'''

# A greedy pick with its confidence: softmax(x).max(dim=-1) (values and indices) and argmin(x), ties
# to the first column, NaN as torch treats it.
ROW_MAXPROB_ARGMAX = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, v = shape["num_tokens"], shape["vocab"]
    x = torch.randn(t, v, generator=generator, device=device) * 3.0
    if case == "ties":
        x = torch.randint(-4, 4, (t, v), generator=generator, device=device).float()  # many maxima: the first wins
    elif case == "masked":
        x = torch.where(torch.rand(t, v, generator=generator, device=device) < 0.6, float("-inf"), x)
        x[:, -1] = 0.5  # every row keeps a finite logit
    elif case == "nan":
        x[:, (7 * torch.arange(t, device=device)) % v] = float("nan")  # one NaN per row, somewhere
    return {"prob": torch.empty(t, device=device, dtype=torch.float32),
            "idx": torch.empty(t, device=device, dtype=torch.int64),
            "low": torch.empty(t, device=device, dtype=torch.int64),
            "x": x.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    prob, idx = torch.softmax(x, dim=-1).max(dim=-1)
    return {"prob": prob, "idx": idx, "low": torch.argmin(x, dim=-1)}


SPEC = KernelSpec(
    name="row_maxprob_argmax",
    description=(
        "Greedy pick with its confidence: idx[t] = argmax_i x[t, i] (the first index among equal "
        "maxima, int64), prob[t] = max_i softmax(x[t, :])_i = 1 / sum_i exp(x[t, i] - max) in fp32, "
        "low[t] = argmin_i x[t, i] (int64). A row holding NaN: prob NaN, idx 0, low its first NaN "
        "(torch's max and min keep NaN). x is [num_tokens, vocab]; -inf logits are masked. vocab "
        "has no alignment."
    ),
    args=(Arg("prob", "tensor", role="out", dtype="float32"), Arg("idx", "tensor", role="out", dtype="int64"),
          Arg("low", "tensor", role="out", dtype="int64"),
          Arg("x", "tensor"), Arg("num_tokens", "int"), Arg("vocab", "int")),
    search_shapes=({"num_tokens": 64, "vocab": 32000},),
    heldout_shapes=({"num_tokens": 7, "vocab": 32001},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["vocab"] * (4 if dt == "float32" else 2) + 20),
    flops=lambda s: 3 * s["num_tokens"] * s["vocab"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("ties", "masked", "nan"),
)
'''

ROW_MAXPROB_ARGMAX_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void row_maxprob_argmax(float* prob, long long* idx, long long* low, const scalar_t* x,
                                              int num_tokens, int vocab) {
    const long long t = blockIdx.x;
    float m = -INFINITY, lo = INFINITY;
    long long best = 0, least = 0, first_nan = -1;
    for (int i = 0; i < vocab; ++i) {
        const float v = static_cast<float>(x[t * vocab + i]);
        if (v != v) {
            if (first_nan < 0) first_nan = i;
            continue;
        }
        if (v > m) { m = v; best = i; }
        if (v < lo) { lo = v; least = i; }
    }
    float s = 0.0f;
    for (int i = 0; i < vocab; ++i) s += expf(static_cast<float>(x[t * vocab + i]) - m);  // NaN stays NaN
    prob[t] = 1.0f / s;
    idx[t] = first_nan >= 0 ? 0 : best;
    low[t] = first_nan >= 0 ? first_nan : least;
}
'''

# out[t, j] = x[t, perm[j]]: columns gathered by an int32 index row, from a row of another length.
COL_PERMUTE_GATHER = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, hi, ho = shape["num_tokens"], shape["hidden_in"], shape["hidden_out"]
    x = torch.randn(t, hi, generator=generator, device=device) * 2.0
    perm = torch.randint(0, hi, (ho,), generator=generator, device=device)
    if case == "edge_cols":
        # The row's last and first columns, alternately: the last ends the row exactly.
        perm = torch.where(torch.arange(ho, device=device) % 2 == 0, hi - 1, 0)
    if case == "from_end":  # every other index negative: column hidden_in + index
        perm = torch.where(torch.arange(ho, device=device) % 2 == 1, perm - hi, perm)
    return {
        "out": torch.empty(t, ho, device=device, dtype=dtype),
        "x": x.to(dtype),
        "perm": perm.to(torch.int32),
    }


def reference(inputs, shape, constants):
    return {"out": inputs["x"][:, inputs["perm"].long()].float()}


SPEC = KernelSpec(
    name="col_permute_gather",
    description=(
        "Column gather (a channel permutation of activations ahead of a reordered weight layout): "
        "out[t, j] = x[t, perm[j]], copied exactly. x is [num_tokens, hidden_in], perm int32 "
        "[hidden_out] with values in [-hidden_in, hidden_in) (repeats allowed; a negative one counts from "
        "the end), out [num_tokens, hidden_out]. "
        "hidden_in and hidden_out are multiples of 8."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("perm", "tensor", dtype="int32"),
          Arg("num_tokens", "int"), Arg("hidden_in", "int", multiple_of=8), Arg("hidden_out", "int", multiple_of=8)),
    search_shapes=({"num_tokens": 64, "hidden_in": 4096, "hidden_out": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden_in": 1032, "hidden_out": 1032},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["hidden_in"] + s["hidden_out"]) * (4 if dt == "float32" else 2),
    flops=lambda s: 0,
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("edge_cols", "from_end"),
)
'''

COL_PERMUTE_GATHER_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void col_permute_gather(scalar_t* out, const scalar_t* x, const int* perm, int num_tokens,
                                              int hidden_in, int hidden_out) {
    const long long t = blockIdx.x;
    for (int j = threadIdx.x; j < hidden_out; j += blockDim.x) {
        const int p = perm[j] < 0 ? perm[j] + hidden_in : perm[j];
        out[t * hidden_out + j] = x[t * hidden_in + p];
    }
}
'''

# NeoX-style rotary by rotate_half: the row's two halves swapped, the first negated, by ``cat``.
ROPE_ROTATE_HALF = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, d = shape["num_tokens"], shape["heads"], shape["head_dim"]
    x = torch.randn(t, h, d, generator=generator, device=device) * 2.0
    angle = torch.rand(t, d, generator=generator, device=device) * 6.3
    if case == "large":
        # Large, but not so large that the sum's cancellation turns one rounding of the two
        # products (an fma, as any compiler may contract them) into an fp32 mismatch.
        x = x * 16.0
    return {
        "out": torch.empty(t, h, d, device=device, dtype=dtype),
        "x": x.to(dtype),
        "cos": torch.cos(angle),
        "sin": torch.sin(angle),
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return {"out": x * inputs["cos"][:, None, :] + rotated * inputs["sin"][:, None, :]}


SPEC = KernelSpec(
    name="rope_rotate_half",
    description=(
        "Rotary embedding as written with rotate_half: out = x * cos + cat(-x2, x1) * sin per head, where "
        "x1 and x2 are the first and second halves of each head's row, in fp32, rounded once. x and out are "
        "[num_tokens, heads, head_dim]; cos and sin are fp32 [num_tokens, head_dim], the same for every head. "
        "head_dim is even."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("cos", "tensor", dtype="float32"),
          Arg("sin", "tensor", dtype="float32"), Arg("num_tokens", "int"), Arg("heads", "int"),
          Arg("head_dim", "int", multiple_of=2)),
    search_shapes=({"num_tokens": 64, "heads": 32, "head_dim": 128},),
    heldout_shapes=({"num_tokens": 7, "heads": 5, "head_dim": 72},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (2 * s["num_tokens"] * s["heads"] * s["head_dim"] * (4 if dt == "float32" else 2)
                               + 8 * s["num_tokens"] * s["head_dim"]),
    flops=lambda s: 3 * s["num_tokens"] * s["heads"] * s["head_dim"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("large",),
)
'''

ROPE_ROTATE_HALF_CU = '''// launch: grid=(num_tokens * heads,) block=(64,) smem=0
extern "C" __global__ void rope_rotate_half(scalar_t* out, const scalar_t* x, const float* cos, const float* sin,
                                            int num_tokens, int heads, int head_dim) {
    const long long row = blockIdx.x;
    const long long t = row / heads;
    const int half = head_dim / 2;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float v = static_cast<float>(x[row * head_dim + i]);
        const float r = i < half ? -static_cast<float>(x[row * head_dim + i + half])
                                 : static_cast<float>(x[row * head_dim + i - half]);
        out[row * head_dim + i] = static_cast<scalar_t>(v * cos[t * head_dim + i] + r * sin[t * head_dim + i]);
    }
}
'''

# Two inputs of different widths joined along the row by ``cat``, times a per-row scale.
CONCAT_ROWS_SCALE = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, da, db = shape["num_tokens"], shape["dim_a"], shape["dim_b"]
    return {
        "out": torch.empty(t, da + db, device=device, dtype=dtype),
        "a": torch.randn(t, da, generator=generator, device=device).to(dtype),
        "b": (torch.randn(t, db, generator=generator, device=device) * 5.0 + 3.0).to(dtype),
        "scale": torch.rand(t, generator=generator, device=device) + 0.5,
    }


def reference(inputs, shape, constants):
    import torch

    joined = torch.cat([inputs["a"], inputs["b"]], dim=-1).float()
    return {"out": joined * inputs["scale"][:, None]}


SPEC = KernelSpec(
    name="concat_rows_scale",
    description=(
        "out[t, :] = cat(a[t, :], b[t, :]) * scale[t] in fp32, rounded once. a is [num_tokens, dim_a], b "
        "[num_tokens, dim_b], out [num_tokens, dim_a + dim_b], scale fp32 [num_tokens]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("a", "tensor"), Arg("b", "tensor"),
          Arg("scale", "tensor", dtype="float32"), Arg("num_tokens", "int"), Arg("dim_a", "int"),
          Arg("dim_b", "int")),
    search_shapes=({"num_tokens": 64, "dim_a": 4096, "dim_b": 1024},),
    heldout_shapes=({"num_tokens": 7, "dim_a": 1000, "dim_b": 37},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * (s["dim_a"] + s["dim_b"]) * (4 if dt == "float32" else 2),
    flops=lambda s: s["num_tokens"] * (s["dim_a"] + s["dim_b"]),
    dtypes=("float16", "bfloat16", "float32"),
)
'''

CONCAT_ROWS_SCALE_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void concat_rows_scale(scalar_t* out, const scalar_t* a, const scalar_t* b, const float* scale,
                                             int num_tokens, int dim_a, int dim_b) {
    const long long t = blockIdx.x;
    const int width = dim_a + dim_b;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = i < dim_a ? static_cast<float>(a[t * dim_a + i]) : static_cast<float>(b[t * dim_b + i - dim_a]);
        out[t * width + i] = static_cast<scalar_t>(v * scale[t]);
    }
}
'''

# Each row's own columns picked by a row of indices (torch.gather along the row), scaled per row.
ROW_PICK_SCALE = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, e, k = shape["num_tokens"], shape["num_experts"], shape["top_k"]
    ids = torch.randint(0, e, (t, k), generator=generator, device=device)
    if case == "edges":  # the row's last and first columns, alternately
        ids = torch.where(torch.arange(k, device=device) % 2 == 0, e - 1, 0).expand(t, k).contiguous()
    return {
        "out": torch.empty(t, k, device=device, dtype=dtype),
        "probs": torch.rand(t, e, generator=generator, device=device).to(dtype),
        "ids": ids,
        "scale": torch.rand(t, generator=generator, device=device) + 0.5,
    }


def reference(inputs, shape, constants):
    import torch

    picked = torch.gather(inputs["probs"].float(), -1, inputs["ids"])
    return {"out": picked * inputs["scale"][:, None]}


SPEC = KernelSpec(
    name="row_pick_scale",
    description=(
        "Routing weights of the chosen experts: out[t, j] = probs[t, ids[t, j]] * scale[t] in fp32, rounded "
        "once. probs is [num_tokens, num_experts], ids int64 [num_tokens, top_k] with values in "
        "[0, num_experts), scale fp32 [num_tokens], out [num_tokens, top_k]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("probs", "tensor"), Arg("ids", "tensor", dtype="int64"),
          Arg("scale", "tensor", dtype="float32"), Arg("num_tokens", "int"), Arg("num_experts", "int"),
          Arg("top_k", "int")),
    search_shapes=({"num_tokens": 4096, "num_experts": 256, "top_k": 8},),
    heldout_shapes=({"num_tokens": 7, "num_experts": 60, "top_k": 3},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * s["top_k"] * (8 + 2 * (4 if dt == "float32" else 2)),
    flops=lambda s: s["num_tokens"] * s["top_k"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("edges",),
)
'''

ROW_PICK_SCALE_CU = '''// launch: grid=(num_tokens,) block=(32,) smem=0
extern "C" __global__ void row_pick_scale(scalar_t* out, const scalar_t* probs, const long long* ids,
                                          const float* scale, int num_tokens, int num_experts, int top_k) {
    const long long t = blockIdx.x;
    for (int j = threadIdx.x; j < top_k; j += blockDim.x) {
        const float p = static_cast<float>(probs[t * num_experts + ids[t * top_k + j]]);
        out[t * top_k + j] = static_cast<scalar_t>(p * scale[t]);
    }
}
'''

# Position ids of a padded batch: a running count of the mask along each row (a prefix sum).
POSITIONS_FROM_MASK = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    b, s = shape["batch"], shape["seq"]
    lengths = torch.randint(0, s + 1, (b, 1), generator=generator, device=device)
    mask = torch.arange(s, device=device)[None, :] >= s - lengths  # left padding
    if case == "holes":
        mask = torch.rand(b, s, generator=generator, device=device) < 0.7
    return {"positions": torch.empty(b, s, device=device, dtype=torch.int64), "mask": mask.to(torch.int32)}


def reference(inputs, shape, constants):
    import torch

    mask = inputs["mask"]
    positions = torch.cumsum(mask, dim=-1) - 1
    return {"positions": positions.masked_fill(mask == 0, 1)}


SPEC = KernelSpec(
    name="positions_from_mask",
    description=(
        "Position ids of a padded batch: positions[b, i] = (number of ones in mask[b, :i+1]) - 1 where "
        "mask[b, i] is 1, and 1 where it is 0. mask is int32 [batch, seq] of zeros and ones, positions int64."
    ),
    args=(Arg("positions", "tensor", role="out", dtype="int64"), Arg("mask", "tensor", dtype="int32"),
          Arg("batch", "int"), Arg("seq", "int")),
    search_shapes=({"batch": 64, "seq": 4096},),
    heldout_shapes=({"batch": 7, "seq": 1000},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["batch"] * s["seq"] * 12,
    flops=lambda s: s["batch"] * s["seq"],
    dtypes=("float32",),
    edge_cases=("holes",),
)
'''

POSITIONS_FROM_MASK_CU = '''// launch: grid=(cdiv(batch, 64),) block=(64,) smem=0
extern "C" __global__ void positions_from_mask(long long* positions, const int* mask, int batch, int seq) {
    const long long b = blockIdx.x * 64LL + threadIdx.x;
    if (b >= batch) return;
    long long run = 0;
    for (int i = 0; i < seq; ++i) {
        const int m = mask[b * seq + i];
        run += m;
        positions[b * seq + i] = m == 0 ? 1 : run - 1;
    }
}
'''

# A weighted running sum along each row (a cumulative distribution), scaled per row.
WEIGHTED_CUMSUM_ROWS = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, n = shape["num_tokens"], shape["cols"]
    x = torch.rand(t, n, generator=generator, device=device)
    if case == "sparse":
        x = torch.where(x < 0.9, torch.zeros_like(x), x)
    return {
        "out": torch.empty(t, n, device=device, dtype=dtype),
        "x": x.to(dtype),
        "w": torch.rand(n, generator=generator, device=device) + 0.5,
        "scale": torch.rand(t, generator=generator, device=device) + 0.5,
    }


def reference(inputs, shape, constants):
    import torch

    weighted = inputs["x"].float() * inputs["w"][None, :]
    return {"out": torch.cumsum(weighted, dim=-1) * inputs["scale"][:, None]}


SPEC = KernelSpec(
    name="weighted_cumsum_rows",
    description=(
        "out[t, i] = scale[t] * sum over j <= i of x[t, j] * w[j], summed in fp32, rounded once. x and out are "
        "[num_tokens, cols], w fp32 [cols], scale fp32 [num_tokens]; x is non-negative."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("w", "tensor", dtype="float32"),
          Arg("scale", "tensor", dtype="float32"), Arg("num_tokens", "int"), Arg("cols", "int")),
    search_shapes=({"num_tokens": 256, "cols": 4096},),
    heldout_shapes=({"num_tokens": 7, "cols": 1000},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["cols"] * (4 if dt == "float32" else 2) + 4 * s["cols"],
    flops=lambda s: 3 * s["num_tokens"] * s["cols"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("sparse",),
    # Sums of thousands of fp32 terms in another order than torch's differ by more than 2e-5.
    tolerances={"float32": (1e-4, 1e-5)},
)
'''

WEIGHTED_CUMSUM_ROWS_CU = '''// launch: grid=(num_tokens,) block=(32,) smem=0
extern "C" __global__ void weighted_cumsum_rows(scalar_t* out, const scalar_t* x, const float* w, const float* scale,
                                                int num_tokens, int cols) {
    // One row per block, one thread walking it: the running sum is sequential.
    if (threadIdx.x != 0) return;
    const long long t = blockIdx.x;
    float run = 0.0f;
    for (int i = 0; i < cols; ++i) {
        run += static_cast<float>(x[t * cols + i]) * w[i];
        out[t * cols + i] = static_cast<scalar_t>(run * scale[t]);
    }
}
'''

# A causal mask over attention scores: a column past the row is -inf (two aranges compared).
CAUSAL_MASK_SCALE = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    h, s = shape["heads"], shape["seq"]
    return {
        "out": torch.empty(h, s, s, device=device, dtype=dtype),
        "scores": (torch.randn(h, s, s, generator=generator, device=device) * 3.0).to(dtype),
    }


def reference(inputs, shape, constants):
    import torch

    scores = inputs["scores"].float() * constants["scale"]
    s = scores.shape[-1]
    rows = torch.arange(s, device=scores.device)[:, None]
    cols = torch.arange(s, device=scores.device)[None, :]
    return {"out": scores.masked_fill(cols > rows, float("-inf"))}


SPEC = KernelSpec(
    name="causal_mask_scale",
    description=(
        "out[h, i, j] = scores[h, i, j] * scale where j <= i, and -inf where j > i, in fp32, rounded once. "
        "scores and out are [heads, seq, seq]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("scores", "tensor"), Arg("heads", "int"), Arg("seq", "int"),
          Arg("scale", "float")),
    search_shapes=({"heads": 32, "seq": 512},),
    heldout_shapes=({"heads": 3, "seq": 37},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["heads"] * s["seq"] * s["seq"] * (4 if dt == "float32" else 2),
    flops=lambda s: s["heads"] * s["seq"] * s["seq"],
    dtypes=("float16", "bfloat16", "float32"),
    constants={"scale": 0.125},
)
'''

CAUSAL_MASK_SCALE_CU = '''// launch: grid=(heads * seq,) block=(128,) smem=0
extern "C" __global__ void causal_mask_scale(scalar_t* out, const scalar_t* scores, int heads, int seq, float scale) {
    const long long row = blockIdx.x;
    const int i = static_cast<int>(row % seq);
    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        const float v = static_cast<float>(scores[row * seq + j]) * scale;
        out[row * seq + j] = static_cast<scalar_t>(j > i ? -INFINITY : v);
    }
}
'''

# Padding past each row's length zeroed, the rest scaled (positions from an arange).
LENGTH_MASK_ROWS = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, n = shape["num_tokens"], shape["cols"]
    lengths = torch.randint(0, n + 1, (t,), generator=generator, device=device)
    if case == "ends":  # empty and full rows, alternately
        lengths = torch.where(torch.arange(t, device=device) % 2 == 0, 0, n)
    return {
        "out": torch.empty(t, n, device=device, dtype=dtype),
        "x": torch.randn(t, n, generator=generator, device=device).to(dtype),
        "lengths": lengths.to(torch.int32),
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    positions = torch.arange(x.shape[-1], device=x.device)
    keep = positions[None, :] < inputs["lengths"][:, None]
    return {"out": torch.where(keep, x * constants["gain"], 0.0)}


SPEC = KernelSpec(
    name="length_mask_rows",
    description=(
        "out[t, i] = x[t, i] * gain for i < lengths[t], else 0, in fp32, rounded once. x and out are "
        "[num_tokens, cols], lengths int32 [num_tokens] in [0, cols]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("lengths", "tensor", dtype="int32"),
          Arg("num_tokens", "int"), Arg("cols", "int"), Arg("gain", "float")),
    search_shapes=({"num_tokens": 256, "cols": 4096},),
    heldout_shapes=({"num_tokens": 7, "cols": 1000},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["num_tokens"] * s["cols"] * (4 if dt == "float32" else 2) + 4 * s["num_tokens"],
    flops=lambda s: s["num_tokens"] * s["cols"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("ends",),
    constants={"gain": 1.5},
)
'''

LENGTH_MASK_ROWS_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void length_mask_rows(scalar_t* out, const scalar_t* x, const int* lengths, int num_tokens,
                                            int cols, float gain) {
    const long long t = blockIdx.x;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = static_cast<float>(x[t * cols + i]) * gain;
        out[t * cols + i] = static_cast<scalar_t>(i < lengths[t] ? v : 0.0f);
    }
}
'''

# Rotary embedding as a model's Python writes it: cos and sin rows picked by each token's
# position from caches and broadcast over the heads, the row's halves swapped by ``cat``.
ROPE_CACHED_POSITIONS = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, d, p = shape["num_tokens"], shape["heads"], shape["head_dim"], shape["max_pos"]
    angle = torch.rand(p, d, generator=generator, device=device) * 6.3
    positions = torch.randint(0, p, (t,), generator=generator, device=device)
    if case == "ends":  # the caches' first and last rows
        positions = torch.where(torch.arange(t, device=device) % 2 == 0, 0, p - 1)
    return {
        "out": torch.empty(t, h, d, device=device, dtype=dtype),
        "x": (torch.randn(t, h, d, generator=generator, device=device) * 2.0).to(dtype),
        "positions": positions,
        "cos_cache": torch.cos(angle),
        "sin_cache": torch.sin(angle),
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    cos = inputs["cos_cache"][inputs["positions"]].unsqueeze(1)
    sin = inputs["sin_cache"][inputs["positions"]].unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return {"out": x * cos + rotated * sin}


SPEC = KernelSpec(
    name="rope_cached_positions",
    description=(
        "Rotary embedding with cos and sin rows picked by position: out = x * cos_cache[positions[t]] + "
        "cat(-x2, x1) * sin_cache[positions[t]] per head, in fp32, rounded once. x and out are "
        "[num_tokens, heads, head_dim]; positions int64 [num_tokens] in [0, max_pos); the caches fp32 "
        "[max_pos, head_dim]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("positions", "tensor", dtype="int64"),
          Arg("cos_cache", "tensor", dtype="float32"), Arg("sin_cache", "tensor", dtype="float32"),
          Arg("num_tokens", "int"), Arg("heads", "int"), Arg("head_dim", "int", multiple_of=2),
          Arg("max_pos", "int")),
    search_shapes=({"num_tokens": 64, "heads": 32, "head_dim": 128, "max_pos": 4096},),
    heldout_shapes=({"num_tokens": 7, "heads": 5, "head_dim": 72, "max_pos": 100},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (2 * s["num_tokens"] * s["heads"] * s["head_dim"] * (4 if dt == "float32" else 2)
                               + s["num_tokens"] * (8 + 8 * s["head_dim"])),
    flops=lambda s: 3 * s["num_tokens"] * s["heads"] * s["head_dim"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("ends",),
)
'''

ROPE_CACHED_POSITIONS_CU = '''// launch: grid=(num_tokens * heads,) block=(64,) smem=0
extern "C" __global__ void rope_cached_positions(scalar_t* out, const scalar_t* x, const long long* positions,
                                                 const float* cos_cache, const float* sin_cache, int num_tokens,
                                                 int heads, int head_dim, int max_pos) {
    const long long row = blockIdx.x;
    const long long p = positions[row / heads];
    const int half = head_dim / 2;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float v = static_cast<float>(x[row * head_dim + i]);
        const float r = i < half ? -static_cast<float>(x[row * head_dim + i + half])
                                 : static_cast<float>(x[row * head_dim + i - half]);
        out[row * head_dim + i] = static_cast<scalar_t>(v * cos_cache[p * head_dim + i] + r * sin_cache[p * head_dim + i]);
    }
}
'''

# A rotary embedding as serving engines write it natively: one cache of [max_pos, rot_dim]
# holding cos in its first half and sin in its second, the row picked by position and split
# with chunk, the query kept flat as [tokens, heads * head_dim] and viewed as heads inside.
ROPE_COS_SIN_CACHE = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, d, p = shape["num_tokens"], shape["heads"], shape["head_dim"], shape["max_pos"]
    angle = torch.rand(p, d // 2, generator=generator, device=device) * 6.3
    positions = torch.randint(0, p, (t,), generator=generator, device=device)
    if case == "ends":  # the cache's first and last rows
        positions = torch.where(torch.arange(t, device=device) % 2 == 0, 0, p - 1)
    return {
        "out": torch.empty(t, h * d, device=device, dtype=dtype),
        "query": (torch.randn(t, h * d, generator=generator, device=device) * 2.0).to(dtype),
        "positions": positions,
        "cos_sin_cache": torch.cat((torch.cos(angle), torch.sin(angle)), dim=-1),
    }


def reference(inputs, shape, constants):
    import torch

    t, h, d = shape["num_tokens"], shape["heads"], shape["head_dim"]
    cos, sin = inputs["cos_sin_cache"][inputs["positions"]].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = torch.chunk(inputs["query"].view(t, h, d).float(), 2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return {"out": rotated.reshape(t, h * d)}


SPEC = KernelSpec(
    name="rope_cos_sin_cache",
    description=(
        "Rotary embedding (neox halves) with cos and sin in one cache: row positions[t] of "
        "cos_sin_cache [max_pos, head_dim] holds cos in its first half and sin in its second; per "
        "head, out = (x1 * cos - x2 * sin, x2 * cos + x1 * sin) for the query's halves x1, x2, in fp32, "
        "rounded once. query and out are [num_tokens, heads * head_dim]; positions int64 [num_tokens] "
        "in [0, max_pos); the cache fp32."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("query", "tensor"), Arg("positions", "tensor", dtype="int64"),
          Arg("cos_sin_cache", "tensor", dtype="float32"), Arg("num_tokens", "int"), Arg("heads", "int"),
          Arg("head_dim", "int", multiple_of=2), Arg("max_pos", "int")),
    search_shapes=({"num_tokens": 64, "heads": 32, "head_dim": 128, "max_pos": 4096},),
    heldout_shapes=({"num_tokens": 7, "heads": 5, "head_dim": 72, "max_pos": 100},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (2 * s["num_tokens"] * s["heads"] * s["head_dim"] * (4 if dt == "float32" else 2)
                               + s["num_tokens"] * (8 + 4 * s["head_dim"])),
    flops=lambda s: 3 * s["num_tokens"] * s["heads"] * s["head_dim"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("ends",),
)
'''

ROPE_COS_SIN_CACHE_CU = '''// launch: grid=(num_tokens * heads,) block=(64,) smem=0
extern "C" __global__ void rope_cos_sin_cache(scalar_t* out, const scalar_t* query, const long long* positions,
                                              const float* cos_sin_cache, int num_tokens, int heads, int head_dim,
                                              int max_pos) {
    const long long row = blockIdx.x;
    const float* cs = cos_sin_cache + positions[row / heads] * head_dim;
    const int half = head_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float x1 = static_cast<float>(query[row * head_dim + i]);
        const float x2 = static_cast<float>(query[row * head_dim + i + half]);
        out[row * head_dim + i] = static_cast<scalar_t>(x1 * cs[i] - x2 * cs[half + i]);
        out[row * head_dim + i + half] = static_cast<scalar_t>(x2 * cs[i] + x1 * cs[half + i]);
    }
}
'''

# The same rotary on one head ([tokens, rot_dim], as a shared rope key is): the gathered row is
# the iteration space's own row, and chunk splits it in place.
ROPE_ONE_HEAD_CACHE = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, d, p = shape["num_tokens"], shape["rot_dim"], shape["max_pos"]
    angle = torch.rand(p, d // 2, generator=generator, device=device) * 6.3
    positions = torch.randint(0, p, (t,), generator=generator, device=device)
    if case == "ends":  # the cache's first and last rows, by negative positions for the last
        positions = torch.where(torch.arange(t, device=device) % 2 == 0, 0, -1)
    return {
        "out": torch.empty(t, d, device=device, dtype=dtype),
        "key": (torch.randn(t, d, generator=generator, device=device) * 2.0).to(dtype),
        "positions": positions,
        "cos_sin_cache": torch.cat((torch.cos(angle), torch.sin(angle)), dim=-1),
    }


def reference(inputs, shape, constants):
    import torch

    cos, sin = inputs["cos_sin_cache"][inputs["positions"]].chunk(2, dim=-1)
    x1, x2 = inputs["key"].float().chunk(2, dim=-1)
    return {"out": torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)}


SPEC = KernelSpec(
    name="rope_one_head_cache",
    description=(
        "Rotary embedding (neox halves) of one head per token with cos and sin in one cache: row "
        "positions[t] of cos_sin_cache [max_pos, rot_dim] (a negative position counts from the end) holds "
        "cos in its first half and sin in its second; out = (x1 * cos - x2 * sin, x2 * cos + x1 * sin) for "
        "the key's halves, in fp32, rounded once. key and out are [num_tokens, rot_dim]; positions int64."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("key", "tensor"), Arg("positions", "tensor", dtype="int64"),
          Arg("cos_sin_cache", "tensor", dtype="float32"), Arg("num_tokens", "int"),
          Arg("rot_dim", "int", multiple_of=2), Arg("max_pos", "int")),
    search_shapes=({"num_tokens": 4096, "rot_dim": 64, "max_pos": 4096},),
    heldout_shapes=({"num_tokens": 7, "rot_dim": 72, "max_pos": 100},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (2 * s["num_tokens"] * s["rot_dim"] * (4 if dt == "float32" else 2)
                               + s["num_tokens"] * (8 + 4 * s["rot_dim"])),
    flops=lambda s: 3 * s["num_tokens"] * s["rot_dim"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("ends",),
)
'''

ROPE_ONE_HEAD_CACHE_CU = '''// launch: grid=(num_tokens,) block=(64,) smem=0
extern "C" __global__ void rope_one_head_cache(scalar_t* out, const scalar_t* key, const long long* positions,
                                               const float* cos_sin_cache, int num_tokens, int rot_dim, int max_pos) {
    const long long row = blockIdx.x;
    const long long p = positions[row] < 0 ? positions[row] + max_pos : positions[row];
    const float* cs = cos_sin_cache + p * rot_dim;
    const int half = rot_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float x1 = static_cast<float>(key[row * rot_dim + i]);
        const float x2 = static_cast<float>(key[row * rot_dim + i + half]);
        out[row * rot_dim + i] = static_cast<scalar_t>(x1 * cs[i] - x2 * cs[half + i]);
        out[row * rot_dim + i + half] = static_cast<scalar_t>(x2 * cs[i] + x1 * cs[half + i]);
    }
}
'''

# A partial rotary (rot_dim of each head rotated, the rest passed through, as some models
# rotate a quarter of the head): pieces sliced out of a slice, a cat of three, a width that is
# the difference of two symbols, and a spec whose rot_dim is below head_dim in every shape.
ROPE_PARTIAL = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, d, r, p = shape["num_tokens"], shape["heads"], shape["head_dim"], shape["rot_dim"], shape["max_pos"]
    angle = torch.rand(p, r // 2, generator=generator, device=device) * 6.3
    positions = torch.randint(0, p, (t,), generator=generator, device=device)
    if case == "ends":
        positions = torch.where(torch.arange(t, device=device) % 2 == 0, 0, p - 1)
    return {
        "out": torch.empty(t, h, d, device=device, dtype=dtype),
        "x": (torch.randn(t, h, d, generator=generator, device=device) * 2.0).to(dtype),
        "positions": positions,
        "cos_sin_cache": torch.cat((torch.cos(angle), torch.sin(angle)), dim=-1),
    }


def reference(inputs, shape, constants):
    import torch

    r = shape["rot_dim"]
    cos, sin = inputs["cos_sin_cache"][inputs["positions"]].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    x = inputs["x"].float()
    rot, rest = x[..., :r], x[..., r:]
    x1, x2 = rot.chunk(2, dim=-1)
    return {"out": torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)}


SPEC = KernelSpec(
    name="rope_partial",
    description=(
        "Partial rotary embedding: the first rot_dim of each head's head_dim rotated in neox halves by "
        "cos and sin from row positions[t] of cos_sin_cache [max_pos, rot_dim] (cos in its first half, "
        "sin in its second), the other head_dim - rot_dim values passed through; fp32 math, rounded once. "
        "x and out are [num_tokens, heads, head_dim]; rot_dim < head_dim."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("positions", "tensor", dtype="int64"),
          Arg("cos_sin_cache", "tensor", dtype="float32"), Arg("num_tokens", "int"), Arg("heads", "int"),
          Arg("head_dim", "int", multiple_of=2), Arg("rot_dim", "int", multiple_of=2), Arg("max_pos", "int")),
    search_shapes=({"num_tokens": 64, "heads": 32, "head_dim": 128, "rot_dim": 32, "max_pos": 4096},),
    heldout_shapes=({"num_tokens": 7, "heads": 5, "head_dim": 72, "rot_dim": 18, "max_pos": 100},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (2 * s["num_tokens"] * s["heads"] * s["head_dim"] * (4 if dt == "float32" else 2)
                               + s["num_tokens"] * (8 + 4 * s["rot_dim"])),
    flops=lambda s: 3 * s["num_tokens"] * s["heads"] * s["rot_dim"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("ends",),
)
'''

ROPE_PARTIAL_CU = '''// launch: grid=(num_tokens * heads,) block=(64,) smem=0
extern "C" __global__ void rope_partial(scalar_t* out, const scalar_t* x, const long long* positions,
                                        const float* cos_sin_cache, int num_tokens, int heads, int head_dim,
                                        int rot_dim, int max_pos) {
    const long long row = blockIdx.x;
    const float* cs = cos_sin_cache + positions[row / heads] * rot_dim;
    const int half = rot_dim / 2;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float v = static_cast<float>(x[row * head_dim + i]);
        float o = v;
        if (i < half) {
            o = v * cs[i] - static_cast<float>(x[row * head_dim + i + half]) * cs[half + i];
        } else if (i < rot_dim) {
            o = v * cs[i - half] + static_cast<float>(x[row * head_dim + i - half]) * cs[i];
        }
        out[row * head_dim + i] = static_cast<scalar_t>(o);
    }
}
'''

# Key heads repeated over their query group (grouped-query attention) and RMS-normalised per
# head, scaled by a per-column weight: the repeat makes a [T, KVH, REP, D] value that a reshape
# merges into [T, H, D].
KV_REPEAT_NORM = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, g, r, d = shape["num_tokens"], shape["kv_heads"], shape["group"], shape["head_dim"]
    return {
        "out": torch.empty(t, g * r, d, device=device, dtype=dtype),
        "k": torch.randn(t, g, d, generator=generator, device=device).to(dtype),
        "weight": (1.0 + 0.1 * torch.randn(d, generator=generator, device=device)).to(dtype),
    }


def reference(inputs, shape, constants):
    import torch

    k = inputs["k"].float().repeat_interleave(shape["group"], dim=1)
    return {"out": k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * inputs["weight"].float()}


SPEC = KernelSpec(
    name="kv_repeat_norm",
    description=(
        "Key heads repeated over their query group and RMS-normalised per head: out[t, h] = "
        "k[t, h // group] * rsqrt(mean(k[t, h // group]^2) + 1e-6) * weight, in fp32, rounded once. k is "
        "[num_tokens, kv_heads, head_dim], out [num_tokens, kv_heads * group, head_dim], weight [head_dim]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("k", "tensor"), Arg("weight", "tensor"), Arg("num_tokens", "int"),
          Arg("kv_heads", "int"), Arg("group", "int"), Arg("head_dim", "int")),
    search_shapes=({"num_tokens": 64, "kv_heads": 8, "group": 4, "head_dim": 128},),
    heldout_shapes=({"num_tokens": 7, "kv_heads": 2, "group": 3, "head_dim": 72},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (s["num_tokens"] * s["kv_heads"] * s["head_dim"] * (1 + s["group"])
                               * (4 if dt == "float32" else 2)),
    flops=lambda s: 4 * s["num_tokens"] * s["kv_heads"] * s["group"] * s["head_dim"],
    dtypes=("float16", "bfloat16", "float32"),
)
'''

KV_REPEAT_NORM_CU = '''// launch: grid=(num_tokens * kv_heads * group,) block=(1,) smem=0
extern "C" __global__ void kv_repeat_norm(scalar_t* out, const scalar_t* k, const scalar_t* weight, int num_tokens,
                                          int kv_heads, int group, int head_dim) {
    const long long row = blockIdx.x;  // (t, h) with h = kv * group + j
    const long long src = (row / (static_cast<long long>(kv_heads) * group)) * kv_heads
                          + (row % (static_cast<long long>(kv_heads) * group)) / group;
    double ss = 0.0;
    for (int i = 0; i < head_dim; ++i) {
        const double v = static_cast<float>(k[src * head_dim + i]);
        ss += v * v;
    }
    const float inv = rsqrtf(static_cast<float>(ss / head_dim) + 1e-6f);
    for (int i = 0; i < head_dim; ++i) {
        out[row * head_dim + i] = static_cast<scalar_t>(static_cast<float>(k[src * head_dim + i]) * inv
                                                        * static_cast<float>(weight[i]));
    }
}
'''

# A mixture of experts' combine: each token's top_k expert outputs weighted by its routing
# weights (fp32) and summed over the experts, plus the shared expert's output: a reduction over
# the dimension next to the row's.
MOE_COMBINE = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, k, d = shape["num_tokens"], shape["top_k"], shape["hidden"]
    w = torch.rand(t, k, generator=generator, device=device)
    return {
        "out": torch.empty(t, d, device=device, dtype=dtype),
        "expert_out": torch.randn(t, k, d, generator=generator, device=device).to(dtype),
        "weights": w / w.sum(-1, keepdim=True),
        "shared": torch.randn(t, d, generator=generator, device=device).to(dtype),
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["expert_out"].float() * inputs["weights"].unsqueeze(-1)
    return {"out": x.sum(dim=1) + inputs["shared"].float()}


SPEC = KernelSpec(
    name="moe_combine",
    description=(
        "out[t, i] = sum_j expert_out[t, j, i] * weights[t, j] + shared[t, i] in fp32, rounded once. "
        "expert_out is [num_tokens, top_k, hidden], weights fp32 [num_tokens, top_k], shared and out "
        "[num_tokens, hidden]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("expert_out", "tensor"), Arg("weights", "tensor", dtype="float32"),
          Arg("shared", "tensor"), Arg("num_tokens", "int"), Arg("top_k", "int"), Arg("hidden", "int")),
    search_shapes=({"num_tokens": 64, "top_k": 8, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "top_k": 3, "hidden": 1000},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (s["num_tokens"] * s["hidden"] * (s["top_k"] + 2) * (4 if dt == "float32" else 2)
                               + 4 * s["num_tokens"] * s["top_k"]),
    flops=lambda s: 2 * s["num_tokens"] * s["top_k"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
)
'''

MOE_COMBINE_CU = '''// launch: grid=(num_tokens,) block=(128,) smem=0
extern "C" __global__ void moe_combine(scalar_t* out, const scalar_t* expert_out, const float* weights,
                                       const scalar_t* shared, int num_tokens, int top_k, int hidden) {
    const long long t = blockIdx.x;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < top_k; ++j) {
            acc += static_cast<float>(expert_out[(t * top_k + j) * hidden + i]) * weights[t * top_k + j];
        }
        out[t * hidden + i] = static_cast<scalar_t>(acc + static_cast<float>(shared[t * hidden + i]));
    }
}
'''

# A mean over each sequence's valid positions (a bool mask per position), and the largest value
# over all of them: two reductions over the sequence, the dimension next to the row's; a
# sequence with no valid position divides 0 by 0, NaN as in torch.
MASKED_MEAN_MAX_POOL = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    b, s, d = shape["batch"], shape["seq"], shape["hidden"]
    mask = torch.rand(b, s, generator=generator, device=device) < 0.7
    if case == "empty":
        mask[0] = False
    return {
        "mean": torch.empty(b, d, device=device, dtype=dtype),
        "peak": torch.empty(b, d, device=device, dtype=dtype),
        "x": torch.randn(b, s, d, generator=generator, device=device).to(dtype),
        "mask": mask,
    }


def reference(inputs, shape, constants):
    import torch

    x = inputs["x"].float()
    m = inputs["mask"][:, :, None]
    total = torch.where(m, x, 0.0).sum(dim=1)
    count = m.sum(dim=1)
    return {"mean": total / count, "peak": x.amax(dim=-2)}


SPEC = KernelSpec(
    name="masked_mean_max_pool",
    description=(
        "mean[b, i] = sum of x[b, s, i] over the positions s with mask[b, s], divided by their count (fp32; "
        "NaN for none); peak[b, i] = max over every s of x[b, s, i]. x is [batch, seq, hidden], mask bool "
        "[batch, seq], mean and peak [batch, hidden]."
    ),
    args=(Arg("mean", "tensor", role="out"), Arg("peak", "tensor", role="out"), Arg("x", "tensor"),
          Arg("mask", "tensor", dtype="bool"), Arg("batch", "int"), Arg("seq", "int"), Arg("hidden", "int")),
    search_shapes=({"batch": 8, "seq": 128, "hidden": 1024},),
    heldout_shapes=({"batch": 3, "seq": 17, "hidden": 100},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["batch"] * s["hidden"] * (s["seq"] + 2) * (4 if dt == "float32" else 2),
    flops=lambda s: 2 * s["batch"] * s["seq"] * s["hidden"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("empty",),
)
'''

MASKED_MEAN_MAX_POOL_CU = '''// launch: grid=(batch,) block=(128,) smem=0
extern "C" __global__ void masked_mean_max_pool(scalar_t* mean, scalar_t* peak, const scalar_t* x, const bool* mask,
                                                int batch, int seq, int hidden) {
    const long long b = blockIdx.x;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float total = 0.0f, top = -INFINITY;
        int count = 0;
        for (int s = 0; s < seq; ++s) {
            const float v = static_cast<float>(x[(b * seq + s) * hidden + i]);
            if (mask[b * seq + s]) { total += v; ++count; }
            top = fmaxf(top, v);
        }
        mean[b * hidden + i] = static_cast<scalar_t>(total / static_cast<float>(count));
        peak[b * hidden + i] = static_cast<scalar_t>(top);
    }
}
'''

# A repetition penalty: each row's logits at the tokens already generated (ids, which repeat)
# divided by the penalty where positive and multiplied where negative, written in place: a
# gather and a scatter along the columns by one index matrix.
REPETITION_PENALTY = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    b, v, n = shape["batch"], shape["vocab"], shape["history"]
    ids = torch.randint(0, v, (b, n), generator=generator, device=device)
    if case == "repeats":
        ids = ids % 3  # every id many times over
    return {
        "logits": (torch.randn(b, v, generator=generator, device=device) * 4).to(dtype),
        "ids": ids,
    }


def reference(inputs, shape, constants):
    import torch

    logits = inputs["logits"].clone()
    ids = inputs["ids"]
    score = torch.gather(logits, 1, ids).float()
    score = torch.where(score < 0, score * constants["penalty"], score / constants["penalty"])
    logits.scatter_(1, ids, score.to(logits.dtype))
    return {"logits": logits}


SPEC = KernelSpec(
    name="repetition_penalty",
    description=(
        "In place: logits[b, ids[b, j]] divided by penalty where positive, multiplied where negative, once per "
        "distinct id of the row whatever its repeats. logits is [batch, vocab], ids int64 [batch, history]."
    ),
    args=(Arg("logits", "tensor", role="inout"), Arg("ids", "tensor", dtype="int64"), Arg("batch", "int"),
          Arg("vocab", "int"), Arg("history", "int"), Arg("penalty", "float")),
    search_shapes=({"batch": 64, "vocab": 32000, "history": 512},),
    heldout_shapes=({"batch": 3, "vocab": 1000, "history": 5000},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["batch"] * s["history"] * (8 + 2 * (4 if dt == "float32" else 2)),
    flops=lambda s: s["batch"] * s["history"],
    dtypes=("float16", "bfloat16", "float32"),
    constants={"penalty": 1.3},
    edge_cases=("repeats",),
)
'''

REPETITION_PENALTY_CU = '''// launch: grid=(batch,) block=(1,) smem=0
extern "C" __global__ void repetition_penalty(scalar_t* logits, const long long* ids, int batch, int vocab,
                                              int history, float penalty) {
    const long long b = blockIdx.x;
    for (int j = 0; j < history; ++j) {
        const long long c = ids[b * history + j];
        bool first = true;
        for (int i = 0; i < j; ++i) first = first && ids[b * history + i] != c;
        if (!first) continue;
        const float s = static_cast<float>(logits[b * vocab + c]);
        logits[b * vocab + c] = static_cast<scalar_t>(s < 0.0f ? s * penalty : s / penalty);
    }
}
'''

# A mixture of experts' dense routing matrix: each token's top_k weights at their experts'
# columns, zeros elsewhere: a scatter along the columns into a tensor the reference makes.
DENSE_ROUTING = '''from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, e, k = shape["num_tokens"], shape["num_experts"], shape["top_k"]
    ids = torch.rand(t, e, generator=generator, device=device).topk(k, dim=-1).indices
    return {
        "out": torch.empty(t, e, device=device, dtype=dtype),
        "ids": ids.to(torch.int32),
        "weights": torch.rand(t, k, generator=generator, device=device),
    }


def reference(inputs, shape, constants):
    import torch

    out = torch.zeros(shape["num_tokens"], shape["num_experts"], device=inputs["ids"].device)
    return {"out": out.scatter(1, inputs["ids"].long(), inputs["weights"])}


SPEC = KernelSpec(
    name="dense_routing",
    description=(
        "out[t, ids[t, j]] = weights[t, j] and 0 in every other column. ids int32 [num_tokens, top_k] "
        "(distinct in a row), weights fp32 [num_tokens, top_k], out [num_tokens, num_experts]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("ids", "tensor", dtype="int32"), Arg("weights", "tensor", dtype="float32"),
          Arg("num_tokens", "int"), Arg("num_experts", "int"), Arg("top_k", "int")),
    search_shapes=({"num_tokens": 256, "num_experts": 64, "top_k": 8},),
    heldout_shapes=({"num_tokens": 7, "num_experts": 10, "top_k": 3},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (8 * s["top_k"] + s["num_experts"] * (4 if dt == "float32" else 2)),
    flops=lambda s: 0,
    dtypes=("float16", "bfloat16", "float32"),
)
'''

DENSE_ROUTING_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void dense_routing(scalar_t* out, const int* ids, const float* weights, int num_tokens,
                                         int num_experts, int top_k) {
    const long long t = blockIdx.x;
    for (int e = 0; e < num_experts; ++e) out[t * num_experts + e] = static_cast<scalar_t>(0.0f);
    for (int j = 0; j < top_k; ++j) out[t * num_experts + ids[t * top_k + j]] = static_cast<scalar_t>(weights[t * top_k + j]);
}
'''

# MoE gating: softmax over the experts in fp32, the top-k experts, their probabilities
# renormalised to sum to one (a row reduction, a top-k, a reduction over the picks).
MOE_TOPK_GATING = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, e, k = shape["num_tokens"], shape["num_experts"], shape["top_k"]
    # Distinct logits in every row (a shuffled grid, exact in fp16 and bf16 up to 512 experts):
    # no two experts tie, so the picks do not depend on the order torch gives equal values.
    grid = torch.argsort(torch.rand(t, e, generator=generator, device=device), dim=-1).float()
    logits = (grid - e / 2) / 8.0
    if case == "large":
        logits = grid - e / 2 + 60.0  # exp overflows fp32 unless the row max is subtracted
    return {
        "weights": torch.empty(t, k, device=device, dtype=torch.float32),
        "ids": torch.empty(t, k, device=device, dtype=torch.int32),
        "logits": logits.to(dtype),
    }


def reference(inputs, shape, constants):
    import torch

    probs = torch.softmax(inputs["logits"].float(), dim=-1)
    weights, ids = torch.topk(probs, shape["top_k"], dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return {"weights": weights, "ids": ids.to(torch.int32)}


SPEC = KernelSpec(
    name="moe_topk_gating",
    description=(
        "MoE gating: p = softmax(logits[t, :]) in fp32; ids[t, :] the top_k experts by p, largest first; "
        "weights[t, j] = p[ids[t, j]] / sum of the top_k p. logits [num_tokens, num_experts], weights fp32 and "
        "ids int32 [num_tokens, top_k]."
    ),
    args=(Arg("weights", "tensor", role="out", dtype="float32"), Arg("ids", "tensor", role="out", dtype="int32"),
          Arg("logits", "tensor"), Arg("num_tokens", "int"), Arg("num_experts", "int"), Arg("top_k", "int")),
    search_shapes=({"num_tokens": 256, "num_experts": 64, "top_k": 8}, {"num_tokens": 1024, "num_experts": 128, "top_k": 4}),
    heldout_shapes=({"num_tokens": 7, "num_experts": 40, "top_k": 6},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (8 * s["top_k"] + s["num_experts"] * (4 if dt == "float32" else 2)),
    flops=lambda s: 4 * s["num_tokens"] * s["num_experts"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("large",),
)
'''

MOE_TOPK_GATING_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void moe_topk_gating(float* weights, int* ids, const scalar_t* logits, int num_tokens,
                                           int num_experts, int top_k) {
    const long long t = blockIdx.x;
    const scalar_t* row = logits + t * num_experts;
    float m = __int_as_float(0xff800000);
    for (int e = 0; e < num_experts; ++e) m = fmaxf(m, static_cast<float>(row[e]));
    float s = 0.0f;
    for (int e = 0; e < num_experts; ++e) s += expf(static_cast<float>(row[e]) - m);
    float total = 0.0f, last = 0.0f;
    int prev = -1;
    for (int j = 0; j < top_k; ++j) {
        int best = -1;
        float bp = 0.0f;
        for (int e = 0; e < num_experts; ++e) {
            const float p = expf(static_cast<float>(row[e]) - m) / s;
            const bool after = prev < 0 || p < last || (p == last && e > prev);
            if (after && (best < 0 || p > bp)) { best = e; bp = p; }
        }
        weights[t * top_k + j] = bp;
        ids[t * top_k + j] = best;
        total += bp;
        prev = best;
        last = bp;
    }
    for (int j = 0; j < top_k; ++j) weights[t * top_k + j] /= total;
}
'''

# A router as Mixtral writes it: the top-k of the raw logits, then a softmax over the picked
# values alone (reductions over the picks), and the experts' ids as int64.
ROUTER_TOPK_SOFTMAX = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, e, k = shape["num_tokens"], shape["num_experts"], shape["top_k"]
    grid = torch.argsort(torch.rand(t, e, generator=generator, device=device), dim=-1).float()
    return {
        "weights": torch.empty(t, k, device=device, dtype=dtype),
        "ids": torch.empty(t, k, device=device, dtype=torch.int64),
        "logits": ((grid - e / 2) / 4.0).to(dtype),
    }


def reference(inputs, shape, constants):
    import torch

    values, ids = inputs["logits"].float().topk(shape["top_k"], dim=-1)
    return {"weights": torch.softmax(values, dim=-1), "ids": ids}


SPEC = KernelSpec(
    name="router_topk_softmax",
    description=(
        "Router: ids[t, :] the top_k columns of logits[t, :], largest first (int64); weights[t, :] the softmax of "
        "their logits, in fp32, rounded once. logits [num_tokens, num_experts], weights and ids [num_tokens, top_k]."
    ),
    args=(Arg("weights", "tensor", role="out"), Arg("ids", "tensor", role="out", dtype="int64"),
          Arg("logits", "tensor"), Arg("num_tokens", "int"), Arg("num_experts", "int"), Arg("top_k", "int")),
    search_shapes=({"num_tokens": 256, "num_experts": 8, "top_k": 2}, {"num_tokens": 1024, "num_experts": 64, "top_k": 6}),
    heldout_shapes=({"num_tokens": 7, "num_experts": 40, "top_k": 3},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["top_k"] * 10 + s["num_experts"] * 2),
    flops=lambda s: 2 * s["num_tokens"] * s["num_experts"],
    dtypes=("float16", "bfloat16", "float32"),
)
'''

ROUTER_TOPK_SOFTMAX_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void router_topk_softmax(scalar_t* weights, long long* ids, const scalar_t* logits,
                                               int num_tokens, int num_experts, int top_k) {
    const long long t = blockIdx.x;
    const scalar_t* row = logits + t * num_experts;
    float last = 0.0f, top = 0.0f;
    int prev = -1;
    for (int j = 0; j < top_k; ++j) {
        int best = -1;
        float bv = 0.0f;
        for (int e = 0; e < num_experts; ++e) {
            const float v = static_cast<float>(row[e]);
            const bool after = prev < 0 || v < last || (v == last && e > prev);
            if (after && (best < 0 || v > bv)) { best = e; bv = v; }
        }
        ids[t * top_k + j] = best;
        if (j == 0) top = bv;
        prev = best;
        last = bv;
    }
    float s = 0.0f;
    for (int j = 0; j < top_k; ++j) s += expf(static_cast<float>(row[ids[t * top_k + j]]) - top);
    for (int j = 0; j < top_k; ++j) {
        weights[t * top_k + j] = static_cast<scalar_t>(expf(static_cast<float>(row[ids[t * top_k + j]]) - top) / s);
    }
}
'''

# A router as DeepSeek-V3 scores its experts: sigmoid scores; the top-k of the scores plus a
# per-expert bias choose the experts, whose unbiased scores are gathered at the picks'
# columns, renormalised and scaled.
BIASED_TOPK_ROUTER = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, e, k = shape["num_tokens"], shape["num_experts"], shape["top_k"]
    grid = torch.argsort(torch.rand(t, e, generator=generator, device=device), dim=-1).float()
    # A bias on a coarser grid than the logits' steps after the sigmoid: the biased scores of
    # a row stay distinct (no ties for torch.topk to order its own way).
    bias = torch.randint(0, 4, (e,), generator=generator, device=device).float() * 0.25
    return {
        "weights": torch.empty(t, k, device=device, dtype=torch.float32),
        "ids": torch.empty(t, k, device=device, dtype=torch.int32),
        "logits": ((grid - e / 2) / 16.0).to(dtype),
        "bias": bias,
    }


def reference(inputs, shape, constants):
    import torch

    scores = torch.sigmoid(inputs["logits"].float())
    _, ids = torch.topk(scores + inputs["bias"], shape["top_k"], dim=-1)
    weights = scores.gather(1, ids)
    weights = weights / weights.sum(dim=-1, keepdim=True) * constants["scale"]
    return {"weights": weights, "ids": ids.to(torch.int32)}


SPEC = KernelSpec(
    name="biased_topk_router",
    description=(
        "Router: s = sigmoid(logits[t, :]) in fp32; ids[t, :] the top_k experts by s + bias (fp32 [num_experts]); "
        "weights[t, j] = s[ids[t, j]] / sum over j of s[ids[t, j]] * scale. weights fp32 and ids int32 "
        "[num_tokens, top_k]."
    ),
    args=(Arg("weights", "tensor", role="out", dtype="float32"), Arg("ids", "tensor", role="out", dtype="int32"),
          Arg("logits", "tensor"), Arg("bias", "tensor", dtype="float32"), Arg("num_tokens", "int"),
          Arg("num_experts", "int"), Arg("top_k", "int"), Arg("scale", "float")),
    search_shapes=({"num_tokens": 256, "num_experts": 256, "top_k": 8},),
    heldout_shapes=({"num_tokens": 7, "num_experts": 40, "top_k": 6},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (8 * s["top_k"] + s["num_experts"] * 2) + 4 * s["num_experts"],
    flops=lambda s: 4 * s["num_tokens"] * s["num_experts"],
    constants={"scale": 2.5},
)
'''

BIASED_TOPK_ROUTER_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void biased_topk_router(float* weights, int* ids, const scalar_t* logits, const float* bias,
                                              int num_tokens, int num_experts, int top_k, float scale) {
    const long long t = blockIdx.x;
    const scalar_t* row = logits + t * num_experts;
    float last = 0.0f, total = 0.0f;
    int prev = -1;
    for (int j = 0; j < top_k; ++j) {
        int best = -1;
        float bv = 0.0f;
        for (int e = 0; e < num_experts; ++e) {
            const float v = 1.0f / (1.0f + expf(-static_cast<float>(row[e]))) + bias[e];
            const bool after = prev < 0 || v < last || (v == last && e > prev);
            if (after && (best < 0 || v > bv)) { best = e; bv = v; }
        }
        ids[t * top_k + j] = best;
        const float s = 1.0f / (1.0f + expf(-static_cast<float>(row[best])));
        weights[t * top_k + j] = s;
        total += s;
        prev = best;
        last = bv;
    }
    for (int j = 0; j < top_k; ++j) weights[t * top_k + j] = weights[t * top_k + j] / total * scale;
}
'''

# Top-k sampling's filter: the logits at a temperature, every one below the k-th largest
# set to -inf, then a softmax (row reductions after the picks, over the whole row).
TOPK_FILTER_SOFTMAX = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    b, v = shape["batch"], shape["vocab"]
    x = torch.randn(b, v, generator=generator, device=device) * 3.0
    if case == "ties":
        x = x.round()  # many logits equal the k-th: all of them are kept
    return {"probs": torch.empty(b, v, device=device, dtype=dtype), "logits": x.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    x = inputs["logits"].float() / constants["temperature"]
    kth = torch.topk(x, shape["top_k"], dim=-1).values[:, -1:]
    return {"probs": torch.softmax(x.masked_fill(x < kth, float("-inf")), dim=-1)}


SPEC = KernelSpec(
    name="topk_filter_softmax",
    description=(
        "Top-k sampling: x = logits[b, :] / temperature in fp32; probs[b, :] = softmax of x with every value below "
        "the top_k-th largest of its row set to -inf, rounded once. logits and probs [batch, vocab]."
    ),
    args=(Arg("probs", "tensor", role="out"), Arg("logits", "tensor"), Arg("batch", "int"), Arg("vocab", "int"),
          Arg("top_k", "int"), Arg("temperature", "float")),
    search_shapes=({"batch": 64, "vocab": 32000, "top_k": 50},),
    heldout_shapes=({"batch": 3, "vocab": 1000, "top_k": 7},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["batch"] * s["vocab"] * (4 if dt == "float32" else 2),
    flops=lambda s: 4 * s["batch"] * s["vocab"],
    constants={"temperature": 0.8},
    edge_cases=("ties",),
)
'''

TOPK_FILTER_SOFTMAX_CU = '''// launch: grid=(batch,) block=(1,) smem=0
extern "C" __global__ void topk_filter_softmax(scalar_t* probs, const scalar_t* logits, int batch, int vocab,
                                               int top_k, float temperature) {
    const long long b = blockIdx.x;
    const scalar_t* row = logits + b * vocab;
    float last = 0.0f;
    int prev = -1;
    for (int j = 0; j < top_k; ++j) {
        int best = -1;
        float bv = 0.0f;
        for (int i = 0; i < vocab; ++i) {
            const float v = static_cast<float>(row[i]) / temperature;
            const bool after = prev < 0 || v < last || (v == last && i > prev);
            if (after && (best < 0 || v > bv)) { best = i; bv = v; }
        }
        prev = best;
        last = bv;
    }
    float m = __int_as_float(0xff800000), s = 0.0f;
    for (int i = 0; i < vocab; ++i) m = fmaxf(m, static_cast<float>(row[i]) / temperature);
    for (int i = 0; i < vocab; ++i) {
        const float v = static_cast<float>(row[i]) / temperature;
        s += v < last ? 0.0f : expf(v - m);
    }
    for (int i = 0; i < vocab; ++i) {
        const float v = static_cast<float>(row[i]) / temperature;
        probs[b * vocab + i] = static_cast<scalar_t>(v < last ? 0.0f : expf(v - m) / s);
    }
}
'''

# int4 weights unpacked: each byte's low nibble then its high one, the two halves of the row
# joined by cat, offset by 8 and scaled per row (bitwise ops of integers).
INT4_UNPACK_SCALE = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, p = shape["num_tokens"], shape["width"]
    return {
        "out": torch.empty(t, 2 * p, device=device, dtype=dtype),
        "packed": torch.randint(0, 256, (t, p), generator=generator, device=device).to(torch.uint8),
        "scale": torch.rand(t, 1, generator=generator, device=device) + 0.01,
    }


def reference(inputs, shape, constants):
    import torch

    q = inputs["packed"].to(torch.int32)
    lo, hi = (q & 0xF) - 8, (q >> 4) - 8
    return {"out": torch.cat([lo, hi], dim=-1).float() * inputs["scale"]}


SPEC = KernelSpec(
    name="int4_unpack_scale",
    description=(
        "out[t, j] = ((packed[t, j] & 15) - 8) * scale[t] and out[t, width + j] = ((packed[t, j] >> 4) - 8) * "
        "scale[t], rounded once. packed uint8 [num_tokens, width], scale fp32 [num_tokens, 1], out "
        "[num_tokens, 2 * width]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("packed", "tensor", dtype="uint8"), Arg("scale", "tensor", dtype="float32"),
          Arg("num_tokens", "int"), Arg("width", "int")),
    search_shapes=({"num_tokens": 4096, "width": 2048},),
    heldout_shapes=({"num_tokens": 7, "width": 100},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["width"] * (5 if dt == "float32" else 3) + 4),
    flops=lambda s: 4 * s["num_tokens"] * s["width"],
)
'''

INT4_UNPACK_SCALE_CU = '''// launch: grid=(num_tokens,) block=(1,) smem=0
extern "C" __global__ void int4_unpack_scale(scalar_t* out, const unsigned char* packed, const float* scale,
                                             int num_tokens, int width) {
    const long long t = blockIdx.x;
    for (int j = 0; j < width; ++j) {
        const int q = packed[t * width + j];
        out[t * 2 * width + j] = static_cast<scalar_t>(static_cast<float>((q & 15) - 8) * scale[t]);
        out[t * 2 * width + width + j] = static_cast<scalar_t>(static_cast<float>((q >> 4) - 8) * scale[t]);
    }
}
'''

# Float ops torch has beyond the usual maps: log10, hypot, copysign, fmax (which drops a NaN,
# where maximum keeps it) and signbit, on inputs holding NaN, infinities and signed zeros.
FLOAT_OPS_MIX = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h = shape["num_tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator, device=device) * 4.0
    y = torch.randn(t, h, generator=generator, device=device) * 4.0
    if case == "special":
        specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0], device=device)
        x = specials[torch.randint(0, 7, (t, h), generator=generator, device=device)]
        y = specials[torch.randint(0, 7, (t, h), generator=generator, device=device)]
    return {"out": torch.empty(t, h, device=device, dtype=dtype), "x": x.to(dtype), "y": y.to(dtype)}


def reference(inputs, shape, constants):
    import torch

    x, y = inputs["x"].float(), inputs["y"].float()
    magnitude = torch.log10(torch.hypot(x, y) + 1.0) * torch.copysign(torch.ones_like(x), x)
    return {"out": magnitude + torch.fmax(x, y) + torch.where(torch.signbit(y), 0.5, 0.0)}


SPEC = KernelSpec(
    name="float_ops_mix",
    description=(
        "out = log10(hypot(x, y) + 1) * copysign(1, x) + fmax(x, y) + (0.5 where y's sign bit is set), in fp32, "
        "rounded once. x, y and out [num_tokens, hidden]."
    ),
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("y", "tensor"), Arg("num_tokens", "int"),
          Arg("hidden", "int")),
    search_shapes=({"num_tokens": 4096, "hidden": 4096},),
    heldout_shapes=({"num_tokens": 7, "hidden": 100},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 3 * s["num_tokens"] * s["hidden"] * (4 if dt == "float32" else 2),
    flops=lambda s: 12 * s["num_tokens"] * s["hidden"],
    edge_cases=("special",),
)
'''

FLOAT_OPS_MIX_CU = '''// launch: grid=(cdiv(num_tokens * hidden, 256),) block=(256,) smem=0
extern "C" __global__ void float_ops_mix(scalar_t* out, const scalar_t* x, const scalar_t* y, int num_tokens, int hidden) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<long long>(num_tokens) * hidden) return;
    const float a = static_cast<float>(x[i]), b = static_cast<float>(y[i]);
    const float m = log10f(hypotf(a, b) + 1.0f) * copysignf(1.0f, a);
    out[i] = static_cast<scalar_t>(m + fmaxf(a, b) + (signbit(b) ? 0.5f : 0.0f));
}
'''

# Sampling by the inverse of the cumulative distribution: a softmax (row reductions) whose
# running sum is written, and the count of its entries below each row's uniform draw (a
# reduction of the scan) as the sampled id.
SAMPLE_FROM_CDF = '''
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    b, v = shape["batch"], shape["vocab"]
    x = torch.randn(b, v, generator=generator, device=device) * 2.0
    if case == "peaked":
        x[:, 0] += 30.0  # nearly all the mass on the first id
    x = x.to(dtype)
    # Each draw in the middle of a likely id's step of the distribution (one of the 8 most likely,
    # at least a tenth of the likeliest): a running sum in fp32, in any order, is far closer to
    # the exact one than half such a step, so the sampled id is well defined.
    p = torch.softmax(x.double(), dim=-1)
    top = torch.topk(p, min(8, v), dim=-1)
    pick = torch.randint(0, 1 << 20, (b, 1), generator=generator, device=device)
    likely = (top.values >= top.values[:, :1] / 10).sum(dim=-1, keepdim=True)
    j = top.indices.gather(1, pick % likely)
    u = p.cumsum(dim=-1).gather(1, j) - p.gather(1, j) / 2
    return {
        "cdf": torch.empty(b, v, device=device, dtype=torch.float32),
        "ids": torch.empty(b, device=device, dtype=torch.int32),
        "logits": x,
        "u": u.squeeze(1).float(),
    }


def reference(inputs, shape, constants):
    import torch

    cdf = torch.softmax(inputs["logits"].float(), dim=-1).cumsum(dim=-1)
    ids = (cdf < inputs["u"][:, None]).sum(dim=-1).clamp(max=shape["vocab"] - 1)
    return {"cdf": cdf, "ids": ids.to(torch.int32)}


SPEC = KernelSpec(
    name="sample_from_cdf",
    description=(
        "cdf[b, :] = cumsum(softmax(logits[b, :])) in fp32; ids[b] = the number of cdf[b, :] entries below u[b], "
        "at most vocab - 1. logits [batch, vocab], u fp32 [batch], cdf fp32 [batch, vocab], ids int32 [batch]."
    ),
    args=(Arg("cdf", "tensor", role="out", dtype="float32"), Arg("ids", "tensor", role="out", dtype="int32"),
          # The draws sit inside a likely id's step of the logits' distribution: neither is
          # perturbed by the timing loops, which would move a draw next to a step's edge.
          Arg("logits", "tensor", perturb=False), Arg("u", "tensor", dtype="float32", perturb=False),
          Arg("batch", "int"), Arg("vocab", "int")),
    search_shapes=({"batch": 64, "vocab": 32000},),
    heldout_shapes=({"batch": 3, "vocab": 1000},),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["batch"] * (s["vocab"] * (8 if dt == "float32" else 6) + 8),
    flops=lambda s: 4 * s["batch"] * s["vocab"],
    edge_cases=("peaked",),
)
'''

SAMPLE_FROM_CDF_CU = '''// launch: grid=(batch,) block=(1,) smem=0
extern "C" __global__ void sample_from_cdf(float* cdf, int* ids, const scalar_t* logits, const float* u, int batch,
                                           int vocab) {
    const long long b = blockIdx.x;
    const scalar_t* row = logits + b * vocab;
    float m = __int_as_float(0xff800000), s = 0.0f;
    for (int i = 0; i < vocab; ++i) m = fmaxf(m, static_cast<float>(row[i]));
    for (int i = 0; i < vocab; ++i) s += expf(static_cast<float>(row[i]) - m);
    float run = 0.0f;
    int below = 0;
    for (int i = 0; i < vocab; ++i) {
        run += expf(static_cast<float>(row[i]) - m) / s;
        cdf[b * vocab + i] = run;
        below += run < u[b] ? 1 : 0;
    }
    ids[b] = below < vocab - 1 ? below : vocab - 1;
}
'''

FOLDERS = {
    "silu_scale_shift": (SILU_SCALE_SHIFT, SILU_SCALE_SHIFT_CU),
    "softmax_temperature": (SOFTMAX_TEMPERATURE, SOFTMAX_TEMPERATURE_CU),
    "absmax_quant_rows": (ABSMAX_QUANT_ROWS, ABSMAX_QUANT_ROWS_CU),
    "standardise_rows": (STANDARDISE_ROWS, STANDARDISE_ROWS_CU),
    "gather_scale_rows": (GATHER_SCALE_ROWS, GATHER_SCALE_ROWS_CU),
    "clip_deadzone": (CLIP_DEADZONE, CLIP_DEADZONE_CU),
    "masked_softmax_bias": (MASKED_SOFTMAX_BIAS, MASKED_SOFTMAX_BIAS_CU),
    "swiglu_chunk_clamp": (SWIGLU_CHUNK_CLAMP, SWIGLU_CHUNK_CLAMP_CU),
    "add_layernorm_plain": (ADD_LAYERNORM_PLAIN, ADD_LAYERNORM_PLAIN_CU),
    "dequant_int8_rows": (DEQUANT_INT8_ROWS, DEQUANT_INT8_ROWS_CU),
    "activation_mix": (ACTIVATION_MIX, ACTIVATION_MIX_CU),
    "head_rmsnorm": (HEAD_RMSNORM, HEAD_RMSNORM_CU),
    "token_logprob": (TOKEN_LOGPROB, TOKEN_LOGPROB_CU),
    "embed_pos_sum": (EMBED_POS_SUM, EMBED_POS_SUM_CU),
    "group_quant_int8": (GROUP_QUANT_INT8, GROUP_QUANT_INT8_CU),
    "fake_quant_fp8": (FAKE_QUANT_FP8, FAKE_QUANT_FP8_CU),
    "bf16_round_mul": (BF16_ROUND_MUL, BF16_ROUND_MUL_CU),
    "gain_slot_scatter": (GAIN_SLOT_SCATTER, GAIN_SLOT_SCATTER_CU),
    "row_maxprob_argmax": (ROW_MAXPROB_ARGMAX, ROW_MAXPROB_ARGMAX_CU),
    "col_permute_gather": (COL_PERMUTE_GATHER, COL_PERMUTE_GATHER_CU),
    "rope_rotate_half": (ROPE_ROTATE_HALF, ROPE_ROTATE_HALF_CU),
    "concat_rows_scale": (CONCAT_ROWS_SCALE, CONCAT_ROWS_SCALE_CU),
    "row_pick_scale": (ROW_PICK_SCALE, ROW_PICK_SCALE_CU),
    "positions_from_mask": (POSITIONS_FROM_MASK, POSITIONS_FROM_MASK_CU),
    "weighted_cumsum_rows": (WEIGHTED_CUMSUM_ROWS, WEIGHTED_CUMSUM_ROWS_CU),
    "causal_mask_scale": (CAUSAL_MASK_SCALE, CAUSAL_MASK_SCALE_CU),
    "length_mask_rows": (LENGTH_MASK_ROWS, LENGTH_MASK_ROWS_CU),
    "rope_cached_positions": (ROPE_CACHED_POSITIONS, ROPE_CACHED_POSITIONS_CU),
    "rope_cos_sin_cache": (ROPE_COS_SIN_CACHE, ROPE_COS_SIN_CACHE_CU),
    "rope_one_head_cache": (ROPE_ONE_HEAD_CACHE, ROPE_ONE_HEAD_CACHE_CU),
    "rope_partial": (ROPE_PARTIAL, ROPE_PARTIAL_CU),
    "kv_repeat_norm": (KV_REPEAT_NORM, KV_REPEAT_NORM_CU),
    "moe_combine": (MOE_COMBINE, MOE_COMBINE_CU),
    "masked_mean_max_pool": (MASKED_MEAN_MAX_POOL, MASKED_MEAN_MAX_POOL_CU),
    "repetition_penalty": (REPETITION_PENALTY, REPETITION_PENALTY_CU),
    "dense_routing": (DENSE_ROUTING, DENSE_ROUTING_CU),
    "moe_topk_gating": (MOE_TOPK_GATING, MOE_TOPK_GATING_CU),
    "router_topk_softmax": (ROUTER_TOPK_SOFTMAX, ROUTER_TOPK_SOFTMAX_CU),
    "biased_topk_router": (BIASED_TOPK_ROUTER, BIASED_TOPK_ROUTER_CU),
    "topk_filter_softmax": (TOPK_FILTER_SOFTMAX, TOPK_FILTER_SOFTMAX_CU),
    "int4_unpack_scale": (INT4_UNPACK_SCALE, INT4_UNPACK_SCALE_CU),
    "float_ops_mix": (FLOAT_OPS_MIX, FLOAT_OPS_MIX_CU),
    "sample_from_cdf": (SAMPLE_FROM_CDF, SAMPLE_FROM_CDF_CU),
}

# Small shapes: one row and up to 40, row lengths on and off 8-element (16-byte) vectors, a
# row longer than a block's registers hold for the row kernels.
SHAPES: dict[str, list[dict[str, int]]] = {
    "sample_from_cdf": [{"batch": 3, "vocab": 1000}, {"batch": 1, "vocab": 37}, {"batch": 2, "vocab": 9001}],
    "int4_unpack_scale": [{"num_tokens": 3, "width": 64}, {"num_tokens": 5, "width": 37}, {"num_tokens": 1, "width": 1000}],
    "float_ops_mix": [{"num_tokens": 3, "hidden": 100}, {"num_tokens": 1, "hidden": 37}],
    "moe_topk_gating": [{"num_tokens": 5, "num_experts": 64, "top_k": 8}, {"num_tokens": 1, "num_experts": 9, "top_k": 2},
                        {"num_tokens": 3, "num_experts": 300, "top_k": 37}],
    "router_topk_softmax": [{"num_tokens": 5, "num_experts": 8, "top_k": 2}, {"num_tokens": 3, "num_experts": 61, "top_k": 6}],
    "biased_topk_router": [{"num_tokens": 5, "num_experts": 256, "top_k": 8}, {"num_tokens": 2, "num_experts": 13, "top_k": 3}],
    "topk_filter_softmax": [{"batch": 3, "vocab": 1000, "top_k": 7}, {"batch": 1, "vocab": 37, "top_k": 36},
                            {"batch": 2, "vocab": 9001, "top_k": 50}],
    "repetition_penalty": [{"batch": 3, "vocab": 100, "history": 20}, {"batch": 1, "vocab": 7, "history": 1},
                           {"batch": 2, "vocab": 50, "history": 2100}],
    "dense_routing": [{"num_tokens": 5, "num_experts": 64, "top_k": 8}, {"num_tokens": 1, "num_experts": 3, "top_k": 1},
                      {"num_tokens": 3, "num_experts": 300, "top_k": 37}],
    "moe_combine": [{"num_tokens": 3, "top_k": 4, "hidden": 64}, {"num_tokens": 1, "top_k": 1, "hidden": 10},
                    {"num_tokens": 5, "top_k": 3, "hidden": 136}],
    "masked_mean_max_pool": [{"batch": 2, "seq": 9, "hidden": 64}, {"batch": 1, "seq": 1, "hidden": 12},
                             {"batch": 3, "seq": 5, "hidden": 1000}],
    "kv_repeat_norm": [{"num_tokens": 3, "kv_heads": 2, "group": 4, "head_dim": 64},
                       {"num_tokens": 1, "kv_heads": 1, "group": 2, "head_dim": 10},
                       {"num_tokens": 2, "kv_heads": 3, "group": 3, "head_dim": 136}],
    "rope_partial": [{"num_tokens": 3, "heads": 4, "head_dim": 64, "rot_dim": 16, "max_pos": 50},
                     {"num_tokens": 1, "heads": 2, "head_dim": 10, "rot_dim": 4, "max_pos": 3},
                     {"num_tokens": 5, "heads": 3, "head_dim": 136, "rot_dim": 34, "max_pos": 7}],
    "rope_one_head_cache": [{"num_tokens": 3, "rot_dim": 64, "max_pos": 50}, {"num_tokens": 1, "rot_dim": 8, "max_pos": 3},
                            {"num_tokens": 5, "rot_dim": 136, "max_pos": 7}, {"num_tokens": 4, "rot_dim": 10, "max_pos": 4}],
    "rope_cos_sin_cache": [{"num_tokens": 3, "heads": 4, "head_dim": 64, "max_pos": 50},
                           {"num_tokens": 1, "heads": 2, "head_dim": 8, "max_pos": 3},
                           {"num_tokens": 5, "heads": 3, "head_dim": 136, "max_pos": 7},
                           {"num_tokens": 2, "heads": 2, "head_dim": 10, "max_pos": 4}],
    "rope_cached_positions": [{"num_tokens": 3, "heads": 4, "head_dim": 64, "max_pos": 50},
                              {"num_tokens": 1, "heads": 2, "head_dim": 8, "max_pos": 3},
                              {"num_tokens": 5, "heads": 3, "head_dim": 136, "max_pos": 7}],
    "causal_mask_scale": [{"heads": 2, "seq": 40}, {"heads": 1, "seq": 7}, {"heads": 3, "seq": 100}],
    "length_mask_rows": [{"num_tokens": 3, "cols": 100}, {"num_tokens": 1, "cols": 9},
                         {"num_tokens": 6, "cols": 1000}],
    "positions_from_mask": [{"batch": 3, "seq": 100}, {"batch": 1, "seq": 7}, {"batch": 2, "seq": 2500}],
    "weighted_cumsum_rows": [{"num_tokens": 3, "cols": 100}, {"num_tokens": 1, "cols": 9},
                             {"num_tokens": 2, "cols": 2500}],
    "row_pick_scale": [{"num_tokens": 3, "num_experts": 64, "top_k": 8}, {"num_tokens": 1, "num_experts": 8, "top_k": 2},
                       {"num_tokens": 5, "num_experts": 100, "top_k": 37}],
    "rope_rotate_half": [{"num_tokens": 3, "heads": 4, "head_dim": 64}, {"num_tokens": 1, "heads": 2, "head_dim": 8},
                         {"num_tokens": 2, "heads": 3, "head_dim": 136}, {"num_tokens": 2, "heads": 1, "head_dim": 10}],
    "concat_rows_scale": [{"num_tokens": 3, "dim_a": 40, "dim_b": 24}, {"num_tokens": 1, "dim_a": 1000, "dim_b": 8},
                          {"num_tokens": 5, "dim_a": 37, "dim_b": 100}],
    "col_permute_gather": [{"num_tokens": 3, "hidden_in": 104, "hidden_out": 40},
                           {"num_tokens": 1, "hidden_in": 8, "hidden_out": 1000},
                           {"num_tokens": 5, "hidden_in": 264, "hidden_out": 264}],
    "row_maxprob_argmax": [{"num_tokens": 3, "vocab": 100}, {"num_tokens": 1, "vocab": 37}, {"num_tokens": 2, "vocab": 9001}],
    "gain_slot_scatter": [{"num_tokens": 5, "hidden": 264, "num_slots": 50}, {"num_tokens": 1, "hidden": 1000, "num_slots": 3},
                          {"num_tokens": 17, "hidden": 40, "num_slots": 17}],
    "fake_quant_fp8": [{"num_tokens": 1, "hidden": 8}, {"num_tokens": 3, "hidden": 1000}, {"num_tokens": 17, "hidden": 264}],
    "bf16_round_mul": [{"num_tokens": 6, "hidden": 37}, {"num_tokens": 4, "hidden": 1000}],
    "group_quant_int8": [{"num_tokens": 3, "hidden": 256}, {"num_tokens": 1, "hidden": 128},
                         {"num_tokens": 5, "hidden": 640}],
    "embed_pos_sum": [{"num_tokens": 5, "hidden": 264, "vocab": 50, "max_pos": 13},
                      {"num_tokens": 1, "hidden": 1000, "vocab": 7, "max_pos": 3},
                      {"num_tokens": 17, "hidden": 40, "vocab": 300, "max_pos": 64}],
    "silu_scale_shift": [{"num_tokens": 1, "hidden": 100}, {"num_tokens": 3, "hidden": 1000},
                         {"num_tokens": 17, "hidden": 36}],
    "softmax_temperature": [{"num_tokens": 4, "vocab": 1000}, {"num_tokens": 1, "vocab": 100},
                            {"num_tokens": 9, "vocab": 37}, {"num_tokens": 2, "vocab": 9000}],
    "absmax_quant_rows": [{"num_tokens": 5, "hidden": 264}, {"num_tokens": 3, "hidden": 1000},
                          {"num_tokens": 40, "hidden": 100}],
    "standardise_rows": [{"num_tokens": 5, "hidden": 264}, {"num_tokens": 1, "hidden": 1000},
                         {"num_tokens": 12, "hidden": 50}, {"num_tokens": 2, "hidden": 9002}],
    "gather_scale_rows": [{"num_tokens": 5, "hidden": 264, "vocab": 50}, {"num_tokens": 1, "hidden": 100, "vocab": 7},
                          {"num_tokens": 33, "hidden": 36, "vocab": 40}],
    "clip_deadzone": [{"num_tokens": 3, "hidden": 1000}, {"num_tokens": 1, "hidden": 7},
                      {"num_tokens": 20, "hidden": 101}],
    "masked_softmax_bias": [{"num_tokens": 3, "cols": 100}, {"num_tokens": 1, "cols": 1003},
                            {"num_tokens": 2, "cols": 9000}],
    "swiglu_chunk_clamp": [{"num_tokens": 3, "d": 100}, {"num_tokens": 5, "d": 37}, {"num_tokens": 1, "d": 1000}],
    "add_layernorm_plain": [{"num_tokens": 3, "hidden": 100}, {"num_tokens": 2, "hidden": 2003},
                            {"num_tokens": 1, "hidden": 9000}],
    "dequant_int8_rows": [{"num_tokens": 3, "hidden": 100}, {"num_tokens": 5, "hidden": 37}],
    "activation_mix": [{"num_tokens": 3, "hidden": 100}, {"num_tokens": 1, "hidden": 37}],
    "head_rmsnorm": [{"num_tokens": 3, "heads": 4, "head_dim": 64}, {"num_tokens": 1, "heads": 2, "head_dim": 8},
                     {"num_tokens": 2, "heads": 3, "head_dim": 136}],
    "token_logprob": [{"num_tokens": 3, "vocab": 100}, {"num_tokens": 1, "vocab": 37}, {"num_tokens": 2, "vocab": 9001}],
}

# What the generator is expected to make of each kernel: its kind and every schedule's name.
EXPECTED: dict[str, tuple[str, set[str]]] = {
    "sample_from_cdf": ("scan", {"codegen:scan/block"}),
    "int4_unpack_scale": ("elementwise", {"codegen:elementwise/rows"}),
    "float_ops_mix": ("elementwise", {"codegen:elementwise/rows", "codegen:elementwise/flat"}),
    "moe_topk_gating": ("rowwise", {"codegen:rows/block", "codegen:rows/warp"}),
    "router_topk_softmax": ("rowwise", {"codegen:rows/block", "codegen:rows/warp"}),
    "biased_topk_router": ("rowwise", {"codegen:rows/block", "codegen:rows/warp"}),
    "topk_filter_softmax": ("rowwise", {"codegen:rows/block", "codegen:rows/warp"}),
    "repetition_penalty": ("elementwise", {"codegen:scatter/block"}),
    "dense_routing": ("elementwise", {"codegen:scatter/block"}),
    "moe_combine": ("elementwise", {"codegen:elementwise/rows"}),
    "masked_mean_max_pool": ("elementwise", {"codegen:elementwise/rows"}),
    "kv_repeat_norm": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster"}),
    "rope_partial": ("elementwise", {"codegen:elementwise/rows"}),
    "rope_one_head_cache": ("elementwise", {"codegen:elementwise/rows"}),
    "rope_cos_sin_cache": ("elementwise", {"codegen:elementwise/rows"}),
    "rope_cached_positions": ("elementwise", {"codegen:elementwise/rows"}),
    "causal_mask_scale": ("elementwise", {"codegen:elementwise/rows"}),
    "length_mask_rows": ("elementwise", {"codegen:elementwise/rows"}),
    "positions_from_mask": ("scan", {"codegen:scan/block"}),
    "weighted_cumsum_rows": ("scan", {"codegen:scan/block"}),
    "row_pick_scale": ("elementwise", {"codegen:elementwise/rows"}),
    "rope_rotate_half": ("elementwise", {"codegen:elementwise/rows"}),
    "concat_rows_scale": ("elementwise", {"codegen:elementwise/rows"}),
    "col_permute_gather": ("elementwise", {"codegen:elementwise/rows"}),
    "row_maxprob_argmax": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster",
                                       "codegen:rows/block+online", "codegen:rows/cluster+online"}),
    "gain_slot_scatter": ("elementwise", {"codegen:elementwise/rows"}),
    "fake_quant_fp8": ("elementwise", {"codegen:elementwise/rows", "codegen:elementwise/flat"}),
    "bf16_round_mul": ("elementwise", {"codegen:elementwise/rows"}),
    "group_quant_int8": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster"}),
    "embed_pos_sum": ("elementwise", {"codegen:elementwise/rows"}),
    "silu_scale_shift": ("elementwise", {"codegen:elementwise/rows"}),
    "softmax_temperature": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster",
                                        "codegen:rows/block+online", "codegen:rows/cluster+online"}),
    "absmax_quant_rows": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster"}),
    "standardise_rows": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster"}),
    "gather_scale_rows": ("elementwise", {"codegen:elementwise/rows"}),
    "clip_deadzone": ("elementwise", {"codegen:elementwise/rows", "codegen:elementwise/flat"}),
    "masked_softmax_bias": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster",
                                        "codegen:rows/block+online", "codegen:rows/cluster+online"}),
    "swiglu_chunk_clamp": ("elementwise", {"codegen:elementwise/rows"}),
    "add_layernorm_plain": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster"}),
    "dequant_int8_rows": ("elementwise", {"codegen:elementwise/rows"}),
    "activation_mix": ("elementwise", {"codegen:elementwise/rows", "codegen:elementwise/flat"}),
    "head_rmsnorm": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster"}),
    "token_logprob": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster",
                                  "codegen:rows/block+online", "codegen:rows/cluster+online"}),
}


def _spec(name: str, tmp_path: Path) -> KernelSpec:
    text, baseline = FOLDERS[name]
    return _kernel_here(tmp_path, name, text, baseline)


def _dtypes(spec: KernelSpec) -> list[str]:
    order: tuple[str, ...] = ("float16", "float32", "bfloat16")
    return [d for d in order if d in spec.dtypes][:2]


# ---------------------------------------------------------------- running and comparing


def _check(spec: KernelSpec, source: str, dtype: str, params: dict[str, int], workdir: Path) -> int:
    """Runs ``source`` once (one compilation) on every shape of SHAPES x every input case of
    the spec and compares each run's written tensors with the reference; returns the runs."""
    made = []
    for n, shape in enumerate(SHAPES[spec.name]):
        spec.check_shape(shape)
        for case in ("random", *spec.edge_cases):
            gen = torch.Generator().manual_seed(n)
            made.append((shape, case, spec.make_inputs(shape, getattr(torch, dtype), gen, case, "cpu")))
    results = cuda_on_cpu.run(spec, source, dtype, params,
                              [(shape, _poisoned(spec, inputs)) for shape, _, inputs in made], workdir)
    for (shape, case, inputs), got_bytes in zip(made, results, strict=True):
        got = {k: torch.from_numpy(b.copy()).view(inputs[k].dtype).reshape(inputs[k].shape) for k, b in got_bytes.items()}
        want = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
        context = f"({spec.name}, shape {shape}, case {case}, {dtype}, {params})"
        finding = V.check_outputs(got, want, tolerances(spec, dtype), spec.compare, context)
        assert finding is None, finding.message
    return len(made)


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_the_baselines_compute_the_reference(name: str, tmp_path: Path) -> None:
    """The folder itself is consistent: its baseline computes its reference, in fp16 and fp32."""
    spec = _spec(name, tmp_path)
    for dtype in _dtypes(spec):
        assert _check(spec, spec.baseline_source(), dtype, {}, tmp_path / f"baseline-{dtype}")


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_each_kernel_is_classified_and_gets_schedules(name: str, tmp_path: Path) -> None:
    spec = _spec(name, tmp_path)
    kind, schedules = EXPECTED[name]
    program = classify(spec)
    assert program.kind == kind
    assert set(program.outputs) == {a.name for a in spec.written_args}
    names = [s.name for s in generate(spec)]
    assert names, f"{name}: no schedule"
    assert set(names) == schedules


def _schedule_cases() -> list[Any]:
    out = []
    for name in sorted(FOLDERS):
        for schedule in sorted(EXPECTED[name][1]):
            if "cluster" in schedule:  # distributed shared memory: GPU only
                continue
            out.append(pytest.param(name, schedule, id=f"{name}-{schedule.removeprefix('codegen:')}"))
    return out


@pytest.mark.parametrize(("name", "schedule_name"), _schedule_cases())
def test_generated_schedule_computes_the_reference_on_the_cpu(name: str, schedule_name: str, tmp_path: Path) -> None:
    spec = _spec(name, tmp_path)
    schedules = {s.name: s for s in generate(spec)}
    assert schedule_name in schedules, f"{name}: {schedule_name} not generated (got {sorted(schedules)})"
    source = schedules[schedule_name].source
    tune = parse_launch_header(source).tune
    ran = 0
    for params in ({}, {k: v[-1] for k, v in tune.items()}):
        for dtype in _dtypes(spec):
            workdir = tmp_path / f"run-{dtype}-{len(params)}"
            ran += _check(spec, source, dtype, params, workdir)
    assert ran


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_generated_schedules_pass_admission_and_compile(name: str, tmp_path: Path) -> None:
    """Every schedule, cluster ones included, passes admission and compiles with NVRTC (as
    the evaluator compiles it) in every dtype of the spec, at the last value of every tune
    parameter, without spilling its register cache."""
    from tests.unit.test_codegen import _admits_everywhere

    spec = _spec(name, tmp_path)
    assert set(_admits_everywhere(spec, tmp_path / "cache")) == EXPECTED[name][1]


@pytest.mark.parametrize(("changed", "why"), [
    ('x.sum(dim=1) * torch.rsqrt(inputs["shared"].float().pow(2).mean(-1, keepdim=True))', "beside row reductions"),
    ('torch.softmax(x, dim=1).sum(dim=1) + inputs["shared"].float()', "_softmax over the next-to-last dimension"),
])
def test_what_a_loop_over_the_next_to_last_dimension_cannot_give_is_refused(changed: str, why: str, tmp_path: Path):
    """moe_combine's fold beside a row reduction (a second pass over the reduced row) or a
    softmax over the experts (a reduction that its own loop would need twice) is refused."""
    from agents.embedded.codegen import Unsupported

    text, baseline = FOLDERS["moe_combine"]
    original = 'x.sum(dim=1) + inputs["shared"].float()'
    assert original in text
    spec = _kernel_here(tmp_path, "moe_combine", text.replace(original, changed), baseline)
    with pytest.raises(Unsupported, match=why):
        classify(spec)


@pytest.mark.parametrize("changed", [
    '(x.sum(dim=1, keepdim=True) + inputs["shared"].float()[:, None]).squeeze(1)',
    'x.mean(dim=-2) * shape["top_k"] + inputs["shared"].float()',
    '(inputs["expert_out"] * inputs["weights"].unsqueeze(-1).to(inputs["expert_out"].dtype)).sum(1) + inputs["shared"]',
], ids=["keepdim", "mean-times-a-size", "in-the-element-type"])
def test_moe_combine_written_other_ways_gets_correct_schedules(changed: str, tmp_path: Path):
    """The same combine with keepdim, as a mean times a shape symbol (a number made from the
    shape), and computed in the element type throughout (each product and the sum rounded to
    it, as torch does; a sum that cancels is made of those roundings)."""
    text, baseline = FOLDERS["moe_combine"]
    original = 'x.sum(dim=1) + inputs["shared"].float()'
    spec = _kernel_here(tmp_path, "moe_combine", text.replace(original, changed), baseline)
    schedules = generate(spec)
    assert [s.name for s in schedules] == ["codegen:elementwise/rows"]
    for dtype in _dtypes(spec):
        assert _check(spec, schedules[0].source, dtype, {}, tmp_path / f"run-{dtype}")


@pytest.mark.parametrize(("changed", "why"), [
    ('torch.topk(probs, shape["top_k"], dim=-1, sorted=False)', "unsorted top-k"),
    ('torch.topk(probs, 1, dim=-1)', "top-k of one"),
    ('torch.topk(probs.cumsum(-1), shape["top_k"], dim=-1)', "a scan"),
    ('torch.topk(probs, shape["top_k"], dim=0)', "another dimension than the row"),
    ('torch.topk(probs + torch.topk(probs, 2, dim=-1).values[:, :1], shape["top_k"], dim=-1)', "more than one top-k"),
])
def test_what_a_top_k_cannot_be_is_refused(changed: str, why: str, tmp_path: Path):
    """An unsorted top-k (torch leaves its order open), a top-1 (a max), a top-k of prefix sums,
    a top-k over the rows' dimension, and a top-k of another top-k's values are refused, not
    generated wrong."""
    from agents.embedded.codegen import Unsupported

    text, baseline = FOLDERS["moe_topk_gating"]
    original = 'torch.topk(probs, shape["top_k"], dim=-1)'
    assert original in text
    spec = _kernel_here(tmp_path, "moe_topk_gating", text.replace(original, changed), baseline)
    with pytest.raises(Unsupported, match=why):
        classify(spec)


def test_a_smallest_first_top_k_gets_correct_schedules(tmp_path: Path):
    """``largest=False``: the router's k smallest logits, smallest first, and a softmax over them."""
    text, baseline = FOLDERS["router_topk_softmax"]
    original = '.topk(shape["top_k"], dim=-1)'
    spec = _kernel_here(tmp_path, "router_topk_softmax", text.replace(original, '.topk(shape["top_k"], dim=-1, largest=False)'),
                        baseline)
    schedules = generate(spec)
    assert [s.name for s in schedules] == ["codegen:rows/block", "codegen:rows/warp"]
    for schedule in schedules:
        for dtype in _dtypes(spec):
            assert _check(spec, schedule.source, dtype, {}, tmp_path / f"run-{schedule.name[-4:]}-{dtype}")


@pytest.mark.parametrize("select", [0, 1])
def test_equal_values_are_picked_in_column_order(select: int, tmp_path: Path):
    """Rows of many equal logits (where torch.topk leaves the order open): the generated picks
    follow a stable descending sort, the lower column first, in every schedule, on rows that
    fit a thread's registers and on longer ones, with a pass per pick (SELECT=0) and with the
    radix select (SELECT=1), whose ties at the k-th value are cut by column."""
    spec = _spec("moe_topk_gating", tmp_path)
    cases = []
    for n, (t, e, k) in enumerate([(4, 64, 8), (2, 300, 37), (3, 5000, 20)]):
        gen = torch.Generator().manual_seed(n)
        logits = torch.randint(-2, 3, (t, e), generator=gen).float().to(torch.float16)
        made = {"weights": torch.empty(t, k), "ids": torch.empty(t, k, dtype=torch.int32), "logits": logits}
        cases.append(({"num_tokens": t, "num_experts": e, "top_k": k}, made))
    for schedule in generate(spec):
        results = cuda_on_cpu.run(spec, schedule.source, "float16", {"SELECT": select},
                                  [(shape, _poisoned(spec, made)) for shape, made in cases], tmp_path / schedule.name[-4:])
        for (shape, made), got in zip(cases, results, strict=True):
            probs = torch.softmax(made["logits"].float(), dim=-1)
            ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :shape["top_k"]]
            got_ids = torch.from_numpy(got["ids"].copy()).view(torch.int32).reshape(ids.shape)
            assert torch.equal(got_ids.long(), ids), (schedule.name, shape)
            weights = probs.gather(1, ids)
            got_w = torch.from_numpy(got["weights"].copy()).view(torch.float32).reshape(ids.shape)
            torch.testing.assert_close(got_w, weights / weights.sum(-1, keepdim=True))


def test_both_selections_pick_alike_on_special_values(tmp_path: Path):
    """NaN (ranked first, as torch.topk ranks it), infinities, -0 beside +0 (equal: column
    order), rows with more ties at the k-th value than picks, k up to the row's length, and a
    block whose last rows are past the end (rows/warp, 4 rows a block): the radix select
    (SELECT=1) and a pass per pick (SELECT=0) write the same bits, and the ids are a stable
    descending sort's."""
    spec = _spec("router_topk_softmax", tmp_path)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 1.0])
    cases = []
    for n, (t, e, k) in enumerate([(3, 40, 9), (5, 300, 33), (2, 16, 16), (1, 700, 8)]):
        gen = torch.Generator().manual_seed(n)
        logits = torch.randint(-3, 4, (t, e), generator=gen).float()
        picks = torch.randint(0, e, (t, e // 3), generator=gen)
        logits.scatter_(1, picks, special[torch.randint(0, len(special), picks.shape, generator=gen)])
        made = {"weights": torch.empty(t, k, dtype=torch.float16), "ids": torch.empty(t, k, dtype=torch.int64),
                "logits": logits.to(torch.float16)}
        cases.append(({"num_tokens": t, "num_experts": e, "top_k": k}, made))
    for schedule in generate(spec):
        got = {select: cuda_on_cpu.run(spec, schedule.source, "float16", {"SELECT": select},
                                       [(shape, _poisoned(spec, made)) for shape, made in cases],
                                       tmp_path / f"{schedule.name[-4:]}-{select}")
               for select in (0, 1)}
        for i, (shape, made) in enumerate(cases):
            a, b = got[0][i], got[1][i]
            assert a["ids"].tobytes() == b["ids"].tobytes() and a["weights"].tobytes() == b["weights"].tobytes(), \
                (schedule.name, shape)
            x = made["logits"].float()
            # torch's stable sort puts NaN first descending but orders -0 after +0 (by bits):
            # zeros are made equal first, as the schedules and torch.topk's comparisons hold them.
            x = torch.where(x == 0, torch.zeros_like(x), x)
            ids = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :shape["top_k"]]
            got_ids = torch.from_numpy(a["ids"].copy()).view(torch.int64).reshape(ids.shape)
            assert torch.equal(got_ids, ids), (schedule.name, shape)


@pytest.mark.parametrize("changed", [
    'torch.gather(inputs["table"], 0, inputs["ids"][:, None].expand(-1, inputs["table"].shape[1]))',
    'torch.take_along_dim(inputs["table"], inputs["ids"][:, None], dim=0)',
], ids=["gather-dim0", "take_along_dim"])
def test_rows_gathered_along_dimension_zero_get_correct_schedules(changed: str, tmp_path: Path):
    """gather_scale_rows's ``table[ids]`` written as a gather along dimension 0 by the ids
    repeated along each row, and as take_along_dim (whose wrap of negative ids is the gather's
    own): read as the same gather of rows."""
    text, baseline = FOLDERS["gather_scale_rows"]
    original = 'return {"out": inputs["table"][inputs["ids"]]'
    assert original in text
    changed = f'import torch\n\n    return {{"out": {changed}'
    spec = _kernel_here(tmp_path, "gather_scale_rows", text.replace(original, changed), baseline)
    schedules = generate(spec)
    assert [s.name for s in schedules] == ["codegen:elementwise/rows"]
    for dtype in _dtypes(spec):
        assert _check(spec, schedules[0].source, dtype, {}, tmp_path / f"run-{dtype}")


@pytest.mark.parametrize("changed", [
    'ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :shape["top_k"]]\n'
    '    weights = probs.gather(1, ids)',
    'values, order = probs.sort(dim=-1, descending=True)\n'
    '    weights, ids = values[:, :shape["top_k"]], order[:, :shape["top_k"]]',
], ids=["stable-sort-indices", "sort-values-and-indices"])
def test_a_sort_read_as_its_first_k_columns_is_a_top_k(changed: str, tmp_path: Path):
    """moe_topk_gating's top-k written as a sort whose first k columns alone are read (the
    library's own topk_softmax reference does so): the same program, every schedule computing
    the reference."""
    text, baseline = FOLDERS["moe_topk_gating"]
    original = 'weights, ids = torch.topk(probs, shape["top_k"], dim=-1)'
    assert original in text
    spec = _kernel_here(tmp_path, "moe_topk_gating", text.replace(original, changed), baseline)
    assert classify(spec).topk is not None
    schedules = generate(spec)
    assert [s.name for s in schedules] == ["codegen:rows/block", "codegen:rows/warp"]
    for schedule in schedules:
        assert _check(spec, schedule.source, "float16", {}, tmp_path / f"run-{schedule.name[-4:]}")


def test_a_sort_read_whole_is_refused(tmp_path: Path):
    from agents.embedded.codegen import Unsupported

    text, baseline = FOLDERS["moe_topk_gating"]
    original = 'weights, ids = torch.topk(probs, shape["top_k"], dim=-1)'
    changed = ('order = probs.sort(dim=-1, descending=True).indices\n'
               '    weights, ids = probs.gather(1, order[:, :shape["top_k"]]), order[:, 1:shape["top_k"] + 1]')
    spec = _kernel_here(tmp_path, "moe_topk_gating", text.replace(original, changed), baseline)
    with pytest.raises(Unsupported, match="sort read otherwise"):
        classify(spec)
