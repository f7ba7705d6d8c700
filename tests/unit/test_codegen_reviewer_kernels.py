"""Kernels written here, none of them in ``experiments/unseen`` or the library, go through the
embedded agent's code generator as the unseen ones do: each is classified, gets schedules, and
every schedule (cluster ones aside: the CPU has no distributed shared memory) computes the
spec's reference when run on the CPU (``tests/cuda_on_cpu.py``), on small shapes with rows off
vector boundaries, in fp16 and fp32, on the random inputs and every edge case of the spec, at
the default tuning and at the last value of every tune parameter.

The kernels: an elementwise map with a per-column and a per-row operand, a softmax at a
temperature, a per-row absmax quantisation to int8 values with a per-row fp32 scale, a row
standardisation without weights, a gather of rows by int64 index times a per-row scale, and a
clip with a dead zone (clamp and where with scalar constants). Each folder's baseline is also
run, so that a spec and its baseline agree before the generator is judged against the spec.
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

FOLDERS = {
    "silu_scale_shift": (SILU_SCALE_SHIFT, SILU_SCALE_SHIFT_CU),
    "softmax_temperature": (SOFTMAX_TEMPERATURE, SOFTMAX_TEMPERATURE_CU),
    "absmax_quant_rows": (ABSMAX_QUANT_ROWS, ABSMAX_QUANT_ROWS_CU),
    "standardise_rows": (STANDARDISE_ROWS, STANDARDISE_ROWS_CU),
    "gather_scale_rows": (GATHER_SCALE_ROWS, GATHER_SCALE_ROWS_CU),
    "clip_deadzone": (CLIP_DEADZONE, CLIP_DEADZONE_CU),
}

# Small shapes: one row and up to 40, row lengths on and off 8-element (16-byte) vectors, a
# row longer than a block's registers hold for the row kernels.
SHAPES: dict[str, list[dict[str, int]]] = {
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
}

# What the generator is expected to make of each kernel: its kind and every schedule's name.
EXPECTED: dict[str, tuple[str, set[str]]] = {
    "silu_scale_shift": ("elementwise", {"codegen:elementwise/rows"}),
    "softmax_temperature": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster",
                                        "codegen:rows/block+online", "codegen:rows/cluster+online"}),
    "absmax_quant_rows": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster"}),
    "standardise_rows": ("rowwise", {"codegen:rows/block", "codegen:rows/warp", "codegen:rows/cluster"}),
    "gather_scale_rows": ("elementwise", {"codegen:elementwise/rows"}),
    "clip_deadzone": ("elementwise", {"codegen:elementwise/rows", "codegen:elementwise/flat"}),
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
