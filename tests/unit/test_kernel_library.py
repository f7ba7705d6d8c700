"""The kernel library on the CPU: specs load, references are right, every source compiles.

Covers every kernel folder (``kernels.list_kernels()``) and every hand-written variant under
``experiments/results/variants/<kernel>/``, so kernels and variants added later are checked too.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from evaluators.compile import compile_variant
from kernels import KernelSpecError, check_signature, list_kernels, load_kernel
from kernels.launch import parse_launch_header
from kernels.spec import LIBRARY_DIR

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = list_kernels()
VARIANT_FILES = sorted((ROOT / "experiments" / "results" / "variants").glob("*/*.cu"))


def _sources() -> list[tuple[str, str, str]]:
    """(label, kernel name, source) for every baseline and every hand-written variant."""
    out = [(f"{n}/baseline.cu", n, (LIBRARY_DIR / n / "baseline.cu").read_text()) for n in LIBRARY]
    out += [(f"{p.parent.name}/{p.name}", p.parent.name, p.read_text()) for p in VARIANT_FILES]
    return out


SOURCES = _sources()
SOURCE_IDS = [label for label, _, _ in SOURCES]


def _smallest_shape(spec) -> dict[str, int]:
    return min(spec.search_shapes, key=lambda s: math.prod(s.values()))


# ---------------------------------------------------------------- every library kernel loads


@pytest.mark.parametrize("name", LIBRARY)
def test_library_kernel_loads_with_a_plain_baseline(name):
    spec = load_kernel(name)
    assert spec.name == name
    assert spec.directory == (LIBRARY_DIR / name).resolve()
    assert spec.description.strip()
    # The baseline is the fixed starting point: tunable parameters would make it a moving target.
    assert parse_launch_header(spec.baseline_source()).tune == {}
    for shape in (*spec.search_shapes, *spec.heldout_shapes):
        assert spec.flops(shape) >= 0  # 0 only for pure copies (reshape_and_cache)
        for dtype in spec.dtypes:
            assert spec.bytes_moved(shape, dtype) > 0


@pytest.mark.parametrize("name", LIBRARY)
def test_heldout_shapes_include_a_token_count_that_is_not_a_multiple_of_8(name):
    spec = load_kernel(name)
    if "num_tokens" not in spec.shape_symbols:
        pytest.skip("no token dimension")
    assert any(s["num_tokens"] % 8 for s in spec.heldout_shapes)


@pytest.mark.parametrize("name", LIBRARY)
def test_inputs_and_reference_fit_the_argument_list(name):
    spec = load_kernel(name)
    shape = _smallest_shape(spec)
    tensor_args = {a.name: a for a in spec.args if a.kind == "tensor"}
    for dtype in spec.dtypes:
        for case in ("random", *spec.edge_cases):
            gen = torch.Generator().manual_seed(0)
            inputs = spec.make_inputs(shape, getattr(torch, dtype), gen, case, "cpu")
            assert set(inputs) == set(tensor_args), case
            for arg_name, tensor in inputs.items():
                assert tensor.dtype == getattr(torch, tensor_args[arg_name].tensor_dtype(dtype))
                assert tensor.is_contiguous()
            expected = spec.reference(inputs, shape, spec.constants)
            assert set(expected) == {a.name for a in spec.written_args}, case
            for arg_name, value in expected.items():
                # Float outputs are expected in fp32; integer outputs (ids) in their own dtype.
                want = torch.float32 if inputs[arg_name].is_floating_point() else inputs[arg_name].dtype
                assert value.dtype == want
                assert value.shape == inputs[arg_name].shape
                assert not value.isnan().any(), f"{case}: NaN in the expected {arg_name}"


def test_the_new_kernels_keep_rows_16_byte_aligned():
    for name, dim in (("fused_add_rmsnorm", "hidden"), ("merge_attn_states_lse", "head_dim")):
        spec = load_kernel(name)
        assert all(s[dim] % 8 == 0 for s in (*spec.search_shapes, *spec.heldout_shapes))


# ---------------------------------------------------------------- spec-loading errors


_TOY_SPEC = """
from kernels.spec import Arg, KernelSpec

SPEC = KernelSpec(
    name="toy",
    description="copies x to out",
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("n", "int")),
    search_shapes={search},
    heldout_shapes={heldout},
    make_inputs=lambda *a: {{}},
    reference=lambda *a: {{}},
    bytes_moved=lambda s, d: 4 * s["n"],
    flops=lambda s: 0,
)
"""
_TOY_BASELINE = """// launch: grid=({grid},) block=(128,) smem=0
extern "C" __global__ void toy({params}) {{}}
"""
_GOOD_PARAMS = "scalar_t* out, const scalar_t* x, int n"


def _toy_kernel(
    root: Path, search="({'n': 64},)", heldout="({'n': 7},)", params=_GOOD_PARAMS, grid="n"
):
    folder = root / "toy"
    folder.mkdir()
    (folder / "spec.py").write_text(_TOY_SPEC.format(search=search, heldout=heldout))
    if params is not None:
        (folder / "baseline.cu").write_text(_TOY_BASELINE.format(grid=grid, params=params))
    return folder


def test_a_consistent_toy_kernel_loads(tmp_path):
    spec = load_kernel(_toy_kernel(tmp_path))
    assert spec.name == "toy" and spec.shape_symbols == ("n",)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"search": "({'m': 64},)"}, r"must give exactly \['n'\]"),
        ({"heldout": "({'n': 7}, {'n': 64})"}, "held-out shapes repeat search shapes"),
        ({"params": "scalar_t* out, int n"}, "must take 3 arguments"),
        (
            {"params": "float* out, const scalar_t* x, int n"},
            "argument out must be of type scalar_t",
        ),
        ({"params": "scalar_t* out, const scalar_t* x, float n"}, "argument n must be of type int"),
        ({"grid": "cdiv(n, ROWS)"}, "baseline launch header"),
        ({"params": None}, "missing .*baseline.cu"),
    ],
    ids=[
        "shape-misses-symbol",
        "heldout-equals-search",
        "too-few-args",
        "wrong-pointer-type",
        "wrong-int-type",
        "unknown-launch-name",
        "no-baseline",
    ],
)
def test_inconsistent_kernel_folders_fail_with_a_clear_message(tmp_path, kwargs, message):
    with pytest.raises(KernelSpecError, match=message):
        load_kernel(_toy_kernel(tmp_path, **kwargs))


def test_unknown_kernel_name_lists_the_library():
    with pytest.raises(KernelSpecError, match="silu_and_mul"):
        load_kernel("no_such_kernel")


# ---------------------------------------------------------------- references vs plain loops


def _rows(t: torch.Tensor) -> list:
    return t.double().tolist()


def _loop_fused_add_rmsnorm(inputs, shape, eps):
    inp, res, w = _rows(inputs["input"]), _rows(inputs["residual"]), _rows(inputs["weight"])
    out_rows, res_rows = [], []
    for a_row, b_row in zip(inp, res, strict=True):
        x = [a + b for a, b in zip(a_row, b_row, strict=True)]
        r = 1.0 / math.sqrt(sum(v * v for v in x) / shape["hidden"] + eps)
        res_rows.append(x)
        out_rows.append([v * r * wi for v, wi in zip(x, w, strict=True)])
    return {"input": out_rows, "residual": res_rows}


def _loop_merge(inputs, shape, eps):
    va, vb = _rows(inputs["v_a"]), _rows(inputs["v_b"])
    sa, sb = _rows(inputs["s_a"]), _rows(inputs["s_b"])
    v_out, s_out = [], []
    for t in range(shape["num_tokens"]):
        v_out.append([])
        s_out.append([])
        for h in range(shape["num_heads"]):
            a, b = sa[t][h], sb[t][h]
            if a == -math.inf and b == -math.inf:
                v_out[t].append([0.0] * shape["head_dim"])
                s_out[t].append(-math.inf)
                continue
            m = max(a, b)
            wa, wb = 2.0 ** (a - m), 2.0 ** (b - m)
            total = wa + wb
            v_out[t].append(
                [x * wa / total + y * wb / total for x, y in zip(va[t][h], vb[t][h], strict=True)]
            )
            s_out[t].append(math.log2(total) + m)
    return {"v_out": v_out, "s_out": s_out}


def _silu(g):
    # Written so that exp never overflows: the range case reaches |g| ~ 1e19.
    if g >= 0:
        return g / (1.0 + math.exp(-g))
    e = math.exp(g)
    return g * e / (1.0 + e)


def _loop_silu_and_mul(inputs, shape, eps):
    d = shape["d"]
    out = []
    for row in _rows(inputs["x"]):
        out.append([_silu(g) * u for g, u in zip(row[:d], row[d:], strict=True)])
    return {"out": out}


LOOPS = {
    "fused_add_rmsnorm": (_loop_fused_add_rmsnorm, {"num_tokens": 3, "hidden": 16}),
    "merge_attn_states_lse": (_loop_merge, {"num_tokens": 3, "num_heads": 4, "head_dim": 8}),
    "silu_and_mul": (_loop_silu_and_mul, {"num_tokens": 3, "d": 8}),
}


def _cases(name):
    spec = load_kernel(name)
    return [(name, dtype, case) for dtype in spec.dtypes for case in ("random", *spec.edge_cases)]


@pytest.mark.parametrize(("name", "dtype", "case"), [c for n in LOOPS for c in _cases(n)])
def test_reference_matches_a_plain_loop(name, dtype, case):
    spec = load_kernel(name)
    loop, shape = LOOPS[name]
    inputs = spec.make_inputs(
        shape, getattr(torch, dtype), torch.Generator().manual_seed(3), case, "cpu"
    )
    expected = spec.reference(inputs, shape, spec.constants)
    looped = loop(inputs, shape, spec.constants.get("eps", 0.0))
    for arg_name, value in looped.items():
        want = torch.tensor(value, dtype=torch.float64)
        got = expected[arg_name].double()
        # -inf (an empty merged state) must sit exactly where the loop puts it.
        assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{arg_name}: inf positions differ"
        finite = torch.isfinite(want)
        torch.testing.assert_close(got[finite], want[finite], rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", ["random", "zeros", "tiny", "large"])
def test_rmsnorm_cases_stay_finite_in_the_element_type(dtype, case):
    spec = load_kernel("fused_add_rmsnorm")
    shape = {"num_tokens": 4, "hidden": 4096}
    inputs = spec.make_inputs(
        shape, getattr(torch, dtype), torch.Generator().manual_seed(1), case, "cpu"
    )
    x = inputs["input"].float() + inputs["residual"].float()
    expected = spec.reference(inputs, shape, spec.constants)
    for value in expected.values():
        assert torch.isfinite(value.to(getattr(torch, dtype))).all()
    mean_sq = x.pow(2).mean(dim=-1)
    if case == "zeros":
        assert torch.equal(expected["input"], torch.zeros_like(x))
    elif case == "tiny":
        assert (mean_sq < spec.constants["eps"]).all()  # eps dominates the denominator
    elif case == "large":
        assert x.abs().max() > 256.0  # x^2 exceeds fp16's range: only an fp32 sum survives


def test_merge_edge_cases_contain_what_they_claim():
    spec = load_kernel("merge_attn_states_lse")
    shape = {"num_tokens": 5, "num_heads": 8, "head_dim": 8}
    neg = spec.make_inputs(shape, torch.float16, torch.Generator().manual_seed(2), "neg_inf", "cpu")
    a_empty, b_empty = torch.isneginf(neg["s_a"]), torch.isneginf(neg["s_b"])
    assert (a_empty & b_empty).any() and (a_empty & ~b_empty).any() and (~a_empty & b_empty).any()
    expected = spec.reference(neg, shape, spec.constants)
    both = a_empty & b_empty
    assert torch.isneginf(expected["s_out"][both]).all()
    assert torch.equal(expected["v_out"][both], torch.zeros_like(expected["v_out"][both]))
    one_sided = a_empty & ~b_empty
    torch.testing.assert_close(expected["v_out"][one_sided], neg["v_b"][one_sided].float())
    torch.testing.assert_close(expected["s_out"][one_sided], neg["s_b"][one_sided])
    ext = spec.make_inputs(shape, torch.float16, torch.Generator().manual_seed(2), "extreme", "cpu")
    assert ((ext["s_a"] - ext["s_b"]).abs() >= 59.9).all()
    assert torch.isfinite(spec.reference(ext, shape, spec.constants)["v_out"]).all()


# ---------------------------------------------------------------- every source compiles and launches


@pytest.fixture(scope="module")
def cubin_cache(tmp_path_factory) -> Path:
    # A private cache: the test must run NVRTC, not read a cubin compiled by an earlier run.
    return tmp_path_factory.mktemp("cubin")


def test_every_variant_folder_names_a_library_kernel():
    assert {p.parent.name for p in VARIANT_FILES} <= set(LIBRARY)
    assert {"silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse"} <= {
        p.parent.name for p in VARIANT_FILES
    }


@pytest.mark.parametrize(("label", "name", "source"), SOURCES, ids=SOURCE_IDS)
def test_source_compiles_for_every_dtype(label, name, source, cubin_cache):
    spec = load_kernel(name)
    params = parse_launch_header(source).default_params()
    for dtype in spec.dtypes:
        result = compile_variant(source, spec.name, dtype, params, cache_dir=cubin_cache)
        assert result.ok, f"{label} [{dtype}]:\n{result.log}"
        assert result.registers is not None and result.cubin


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", VARIANT_FILES, ids=[f"{p.parent.name}/{p.name}" for p in VARIANT_FILES]
)
def test_hand_written_variant_compiles_without_spills_at_every_tuning(path, cubin_cache):
    spec = load_kernel(path.parent.name)
    source = path.read_text()
    for params in parse_launch_header(source).param_grid():
        for dtype in spec.dtypes:
            result = compile_variant(source, spec.name, dtype, params, cache_dir=cubin_cache)
            assert result.ok, f"{path.name} {params} [{dtype}]:\n{result.log}"
            assert result.spill_bytes == 0, f"{path.name} {params} [{dtype}] spills registers"


@pytest.mark.parametrize(("label", "name", "source"), SOURCES, ids=SOURCE_IDS)
def test_launch_header_resolves_on_every_shape(label, name, source):
    spec = load_kernel(name)
    launch = parse_launch_header(source)
    spec.check_launch(launch)
    for params in launch.param_grid():
        for shape in (*spec.search_shapes, *spec.heldout_shapes):
            cfg = launch.resolve(shape, params)
            assert all(g > 0 for g in cfg.grid) and all(b > 0 for b in cfg.block)
            assert math.prod(cfg.block) <= 1024, f"{label} {params} {shape}: {cfg.block}"
            assert cfg.grid[0] < 2**31 and cfg.grid[1] <= 65535 and cfg.grid[2] <= 65535


@pytest.mark.parametrize(("label", "name", "source"), SOURCES, ids=SOURCE_IDS)
def test_signature_matches_the_spec(label, name, source):
    spec = load_kernel(name)
    check_signature(spec, source)
    # The same file with an argument dropped is refused: the check is not vacuous here.
    first_int = next(a.name for a in spec.args if a.kind == "int")
    broken = source.replace(f"int {first_int},", "", 1)
    assert broken != source
    with pytest.raises(KernelSpecError):
        check_signature(spec, broken)
