"""The LLM-serving kernels of the library on the CPU.

For each kernel: it loads; its inputs have the declared dtypes and shapes for every tiny
shape, dtype and edge case; its fp32 reference agrees with a plain Python loop written
independently from the description; its torch_eager peer agrees with the reference; its
baseline compiles with NVRTC for every dtype and its launch header resolves on every shape.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from evaluators.compile import compile_variant
from kernels import list_kernels, load_kernel
from kernels.launch import parse_launch_header

NEW_KERNELS = (
    "rmsnorm",
    "gemma_fused_add_rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "rotary_embedding_neox",
    "rotary_embedding_gptj",
    "per_token_fp8_quant",
    "topk_softmax",
    "merge_attn_states_multi",
    "layernorm",
    "reshape_and_cache",
)

_ROPE_FULL = {"num_tokens": 3, "num_heads": 2, "num_kv_heads": 1, "head_size": 8, "rot_dim": 8, "max_position": 16}
_ROPE_PARTIAL = {"num_tokens": 3, "num_heads": 3, "num_kv_heads": 2, "head_size": 12, "rot_dim": 4, "max_position": 5}

# Tiny shapes per kernel: together they cover the variations the symbols allow (partial
# rotary, both renormalise settings, an odd expert count).
TINY = {
    "rmsnorm": [{"num_tokens": 3, "hidden": 16}],
    "gemma_fused_add_rmsnorm": [{"num_tokens": 3, "hidden": 16}],
    "gelu_and_mul": [{"num_tokens": 3, "d": 8}],
    "gelu_tanh_and_mul": [{"num_tokens": 3, "d": 8}],
    "rotary_embedding_neox": [_ROPE_FULL, _ROPE_PARTIAL],
    "rotary_embedding_gptj": [_ROPE_FULL, _ROPE_PARTIAL],
    "per_token_fp8_quant": [{"num_tokens": 4, "hidden": 16}],
    "topk_softmax": [
        {"num_tokens": 4, "num_experts": 8, "topk": 2, "renormalize": 1},
        {"num_tokens": 5, "num_experts": 12, "topk": 3, "renormalize": 0},
    ],
    "merge_attn_states_multi": [{"num_states": 3, "num_tokens": 4, "num_heads": 2, "head_dim": 8}],
    "layernorm": [{"num_tokens": 3, "hidden": 16}],
    "reshape_and_cache": [{"num_tokens": 5, "num_kv_heads": 2, "head_size": 4, "block_size": 4, "num_blocks": 3}],
}


def _tensor_shapes(name: str, s: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor argument, written out from the descriptions."""
    t = s.get("num_tokens", 0)
    if name in ("rmsnorm", "layernorm"):
        h = s["hidden"]
        shapes = {"out": (t, h), "input": (t, h), "weight": (h,)}
        return {**shapes, "bias": (h,)} if name == "layernorm" else shapes
    if name == "gemma_fused_add_rmsnorm":
        return {"input": (t, s["hidden"]), "residual": (t, s["hidden"]), "weight": (s["hidden"],)}
    if name in ("gelu_and_mul", "gelu_tanh_and_mul"):
        return {"out": (t, s["d"]), "x": (t, 2 * s["d"])}
    if name.startswith("rotary_embedding"):
        return {
            "positions": (t,),
            "query": (t, s["num_heads"], s["head_size"]),
            "key": (t, s["num_kv_heads"], s["head_size"]),
            "cos_sin_cache": (s["max_position"], s["rot_dim"]),
        }
    if name == "per_token_fp8_quant":
        return {"out": (t, s["hidden"]), "scales": (t,), "input": (t, s["hidden"])}
    if name == "topk_softmax":
        k = s["topk"]
        return {"topk_weights": (t, k), "topk_ids": (t, k), "gating_output": (t, s["num_experts"])}
    if name == "merge_attn_states_multi":
        p, h, d = s["num_states"], s["num_heads"], s["head_dim"]
        return {"v_out": (t, h, d), "lse_out": (t, h), "v": (p, t, h, d), "lse": (p, t, h)}
    if name == "reshape_and_cache":
        h, d = s["num_kv_heads"], s["head_size"]
        cache = (s["num_blocks"], h, s["block_size"], d)
        return {"key": (t, h, d), "value": (t, h, d), "key_cache": cache, "value_cache": cache, "slot_mapping": (t,)}
    raise KeyError(name)


def _cases(name: str) -> list[tuple[str, dict[str, int], str, str]]:
    spec = load_kernel(name)
    return [
        (name, shape, dtype, case)
        for shape in TINY[name]
        for dtype in spec.dtypes
        for case in ("random", *spec.edge_cases)
    ]


ALL_CASES = [c for n in NEW_KERNELS for c in _cases(n)]
CASE_IDS = [f"{n}-{'x'.join(map(str, s.values()))}-{d}-{c}" for n, s, d, c in ALL_CASES]


def _inputs(name, shape, dtype, case, seed=0):
    spec = load_kernel(name)
    return spec, spec.make_inputs(shape, getattr(torch, dtype), torch.Generator().manual_seed(seed), case, "cpu")


# ---------------------------------------------------------------- loading and inputs


def test_the_library_has_at_least_twelve_kernels():
    names = list_kernels()
    if len(names) < 12:
        pytest.skip(f"only {len(names)} kernels so far ({', '.join(names)}); the others are still being written")
    assert set(NEW_KERNELS) <= set(names)


@pytest.mark.parametrize("name", NEW_KERNELS)
def test_kernel_loads_with_peers_and_distinct_shape_sets(name):
    spec = load_kernel(name)
    assert spec.name == name and spec.baseline_path.parent.name == name
    assert "torch_eager" in spec.peers
    assert {"float16", "bfloat16"} <= set(spec.dtypes)
    tokens = [s["num_tokens"] for s in spec.search_shapes]
    assert {1, 16, 128, 512, 1024, 4096} <= set(tokens)
    assert any(t % 2 for t in tokens), "search shapes need an odd token count"
    key = lambda s: tuple(sorted(s.items()))  # noqa: E731
    assert not {key(s) for s in spec.search_shapes} & {key(s) for s in spec.heldout_shapes}


@pytest.mark.parametrize(("name", "shape", "dtype", "case"), ALL_CASES, ids=CASE_IDS)
def test_inputs_have_the_declared_dtypes_and_shapes(name, shape, dtype, case):
    spec, inputs = _inputs(name, shape, dtype, case)
    declared = {a.name: a for a in spec.args if a.kind == "tensor"}
    assert set(inputs) == set(declared)
    expected_shapes = _tensor_shapes(name, shape)
    for arg_name, tensor in inputs.items():
        assert tensor.device.type == "cpu"
        assert tensor.dtype == getattr(torch, declared[arg_name].tensor_dtype(dtype)), arg_name
        assert tuple(tensor.shape) == expected_shapes[arg_name], arg_name
        assert tensor.is_contiguous(), arg_name
        if not declared[arg_name].written and tensor.is_floating_point():
            values = tensor.float()
            if name == "merge_attn_states_multi" or (name, case) == ("topk_softmax", "masked"):
                values = values[~torch.isneginf(values)]  # -inf marks an empty state or a masked expert
            assert torch.isfinite(values).all(), f"{arg_name} has non-finite inputs"


# ---------------------------------------------------------------- references against plain loops


def _rows(t):
    return t.double().tolist()


def _loop_rmsnorm(i, s, c):
    w = _rows(i["weight"])
    out = []
    for x in _rows(i["input"]):
        r = 1.0 / math.sqrt(sum(v * v for v in x) / s["hidden"] + c["eps"])
        out.append([v * r * wi for v, wi in zip(x, w, strict=True)])
    return {"out": out}


def _loop_gemma(i, s, c):
    w = _rows(i["weight"])
    out, res = [], []
    for a, b in zip(_rows(i["input"]), _rows(i["residual"]), strict=True):
        x = [p + q for p, q in zip(a, b, strict=True)]
        r = 1.0 / math.sqrt(sum(v * v for v in x) / s["hidden"] + c["eps"])
        res.append(x)
        out.append([v * r * (1.0 + wi) for v, wi in zip(x, w, strict=True)])
    return {"input": out, "residual": res}


def _gated(act):
    def loop(i, s, c):
        d = s["d"]
        return {"out": [[act(g) * u for g, u in zip(row[:d], row[d:], strict=True)] for row in _rows(i["x"])]}

    return loop


def _gelu(v):
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def _gelu_tanh(v):
    return 0.5 * v * (1.0 + math.tanh(0.7978845608 * (v + 0.044715 * v**3)))


def _loop_rotary(neox):
    def loop(i, s, c):
        rot, half = s["rot_dim"], s["rot_dim"] // 2
        cache = _rows(i["cos_sin_cache"])
        out = {}
        for name in ("query", "key"):
            data = _rows(i[name])
            for t, pos in enumerate(i["positions"].tolist()):
                for head in data[t]:
                    for j in range(half):
                        a, b = (j, j + half) if neox else (2 * j, 2 * j + 1)
                        cos, sin = cache[pos][j], cache[pos][half + j]
                        x, y = head[a], head[b]
                        head[a], head[b] = x * cos - y * sin, y * cos + x * sin
            out[name] = data
        assert rot <= s["head_size"]
        return out

    return loop


def _loop_fp8(i, s, c):
    out, scales = [], []
    for x in _rows(i["input"]):
        amax = max(abs(v) for v in x)
        scale = amax / 448.0 if amax > 0 else 1.0
        scales.append(scale)
        out.append([min(max(v / scale, -448.0), 448.0) for v in x])
    return {"out": out, "scales": scales}


def _loop_topk(i, s, c):
    weights, ids = [], []
    for row in _rows(i["gating_output"]):
        m = max(row)
        e = [math.exp(v - m) for v in row]
        p = [v / sum(e) for v in e]
        chosen = sorted(range(len(p)), key=lambda j: (-p[j], j))[: s["topk"]]
        w = [p[j] for j in chosen]
        if s["renormalize"]:
            w = [v / sum(w) for v in w]
        weights.append(w)
        ids.append(chosen)
    return {"topk_weights": weights, "topk_ids": ids}


def _loop_merge_multi(i, s, c):
    v, lse = _rows(i["v"]), _rows(i["lse"])
    v_out, lse_out = [], []
    for t in range(s["num_tokens"]):
        v_out.append([])
        lse_out.append([])
        for h in range(s["num_heads"]):
            ls = [lse[p][t][h] for p in range(s["num_states"])]
            m = max(ls)
            if m == -math.inf:
                v_out[t].append([0.0] * s["head_dim"])
                lse_out[t].append(-math.inf)
                continue
            w = [2.0 ** (x - m) for x in ls]
            total = sum(w)
            v_out[t].append(
                [sum(v[p][t][h][d] * w[p] for p in range(s["num_states"])) / total for d in range(s["head_dim"])]
            )
            lse_out[t].append(math.log2(total) + m)
    return {"v_out": v_out, "lse_out": lse_out}


def _loop_layernorm(i, s, c):
    w, b = _rows(i["weight"]), _rows(i["bias"])
    out = []
    for x in _rows(i["input"]):
        mean = sum(x) / len(x)
        var = sum((v - mean) ** 2 for v in x) / len(x)
        r = 1.0 / math.sqrt(var + c["eps"])
        out.append([(v - mean) * r * wi + bi for v, wi, bi in zip(x, w, b, strict=True)])
    return {"out": out}


def _loop_reshape_and_cache(i, s, c):
    out = {}
    for src, dst in (("key", "key_cache"), ("value", "value_cache")):
        cache, data = _rows(i[dst]), _rows(i[src])
        for t, slot in enumerate(i["slot_mapping"].tolist()):
            if slot < 0:
                continue
            block, offset = divmod(slot, s["block_size"])
            for h in range(s["num_kv_heads"]):
                cache[block][h][offset] = list(data[t][h])
        out[dst] = cache
    return out


LOOPS = {
    "rmsnorm": _loop_rmsnorm,
    "gemma_fused_add_rmsnorm": _loop_gemma,
    "gelu_and_mul": _gated(_gelu),
    "gelu_tanh_and_mul": _gated(_gelu_tanh),
    "rotary_embedding_neox": _loop_rotary(neox=True),
    "rotary_embedding_gptj": _loop_rotary(neox=False),
    "per_token_fp8_quant": _loop_fp8,
    "topk_softmax": _loop_topk,
    "merge_attn_states_multi": _loop_merge_multi,
    "layernorm": _loop_layernorm,
    "reshape_and_cache": _loop_reshape_and_cache,
}
# The fp32 reference against a float64 loop: a few fp32 roundings, relative to the values
# that enter (layernorm's offset case subtracts a mean of 300 in fp32).
LOOP_TOLERANCE = {"layernorm": (1e-5, 2e-4)}


@pytest.mark.parametrize(("name", "shape", "dtype", "case"), ALL_CASES, ids=CASE_IDS)
def test_reference_matches_a_plain_loop(name, shape, dtype, case):
    spec, inputs = _inputs(name, shape, dtype, case, seed=3)
    before = {k: v.clone() for k, v in inputs.items()}
    expected = spec.reference(inputs, shape, spec.constants)
    for k, v in inputs.items():
        assert torch.equal(v.view(torch.uint8), before[k].view(torch.uint8)), f"reference changed {k}"
    assert set(expected) == {a.name for a in spec.written_args}
    rtol, atol = LOOP_TOLERANCE.get(name, (2e-6, 1e-6))
    for arg_name, value in LOOPS[name](inputs, shape, spec.constants).items():
        got = expected[arg_name]
        if not inputs[arg_name].is_floating_point():
            assert got.dtype == inputs[arg_name].dtype
            assert got.tolist() == value, f"{arg_name} differs"
            continue
        assert got.dtype == torch.float32
        want = torch.tensor(value, dtype=torch.float64)
        got = got.double()
        assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{arg_name}: inf positions differ"
        finite = torch.isfinite(want)
        torch.testing.assert_close(got[finite], want[finite], rtol=rtol, atol=atol)


# ---------------------------------------------------------------- torch_eager peers


def _check_close(spec, name, got, expected, dtype):
    if spec.compare is not None:
        message = spec.compare(name, got, expected)
        assert message is None, message
        return
    if not got.is_floating_point():
        assert torch.equal(got.long(), expected.long()), name
        return
    rtol, atol = spec.tolerance(str(got.dtype).removeprefix("torch."))
    g, e = got.double(), expected.double()
    assert torch.equal(torch.isinf(g), torch.isinf(e)), f"{name}: inf positions differ"
    finite = torch.isfinite(e)
    assert ((g - e).abs()[finite] <= atol + rtol * e.abs()[finite]).all(), f"{name} ({dtype})"


@pytest.mark.parametrize(("name", "shape", "dtype", "case"), ALL_CASES, ids=CASE_IDS)
def test_torch_eager_peer_writes_what_the_reference_expects(name, shape, dtype, case):
    spec, inputs = _inputs(name, shape, dtype, case, seed=5)
    expected = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
    spec.peers["torch_eager"](inputs, shape, spec.constants)
    for arg in spec.written_args:
        got = inputs[arg.name]
        _check_close(spec, arg.name, got, expected[arg.name], dtype)


class _HostReads(TorchDispatchMode):
    """Records every op that copies a tensor's value to the host (``.item()``, indexing with
    a 0-dim tensor, ``if tensor:``): a CUDA-graph capture fails on any of them."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", NEW_KERNELS)
def test_torch_programs_timed_as_peers_never_read_values_on_the_host(name):
    # The peers are timed by CUDA-graph replay: a host read inside one (a capture error on the
    # GPU) would leave the kernel without its torch_eager and torch.compile figures.
    spec = load_kernel(name)
    programs = {"torch_eager": spec.peers["torch_eager"]}
    if spec.compiled is not None:
        programs["compiled"] = spec.compiled
    for case in ("random", *spec.edge_cases):
        for label, fn in programs.items():
            _, inputs = _inputs(name, spec.search_shapes[1], "float16", case)
            with _HostReads() as mode:
                fn(inputs, spec.search_shapes[1], spec.constants)
            assert not mode.reads, f"{label} reads {mode.reads} on the host ({case})"


@pytest.mark.parametrize("name", [n for n in NEW_KERNELS if load_kernel(n).compiled is not None])
def test_the_program_given_to_torch_compile_writes_what_the_reference_expects(name):
    spec = load_kernel(name)
    for case in ("random", *spec.edge_cases):
        shape = spec.search_shapes[2]
        _, inputs = _inputs(name, shape, "float16", case, seed=3)
        expected = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
        spec.compiled(inputs, shape, spec.constants)
        for arg in spec.written_args:
            _check_close(spec, arg.name, inputs[arg.name], expected[arg.name], "float16")


# ---------------------------------------------------------------- edge cases say what they claim


def test_fp8_compare_admits_one_e4m3_step_and_nothing_more():
    spec, inputs = _inputs("per_token_fp8_quant", {"num_tokens": 6, "hidden": 64}, "bfloat16", "outlier")
    expected = spec.reference(inputs, {"num_tokens": 6, "hidden": 64}, spec.constants)
    quantised = expected["out"].to(torch.float8_e4m3fn)
    assert spec.compare("out", quantised, expected["out"]) is None
    assert spec.compare("scales", expected["scales"].clone(), expected["scales"]) is None
    # Two e4m3 steps away from one value: refused, with the position in the message.
    wrong = quantised.float()
    wrong[2, 5] = expected["out"][2, 5] * (1 + 2 * 2.0**-3) + 2 * 2.0**-9
    assert "out[2, 5]" in spec.compare("out", wrong.to(torch.float8_e4m3fn), expected["out"])
    nan = quantised.float()
    nan[0, 0] = float("nan")
    assert spec.compare("out", nan, expected["out"]) is not None
    assert spec.compare("scales", expected["scales"] * (1 + 1e-4), expected["scales"]) is not None


def test_fp8_zero_rows_get_scale_one_and_zero_values():
    shape = {"num_tokens": 4, "hidden": 32}
    spec, inputs = _inputs("per_token_fp8_quant", shape, "float16", "zero_rows")
    expected = spec.reference(inputs, shape, spec.constants)
    assert torch.equal(expected["scales"][::2], torch.ones(2))
    assert torch.equal(expected["out"][::2], torch.zeros(2, 32))
    assert (expected["scales"][1::2] != 1.0).all()


def test_topk_ties_go_to_the_lower_expert_index():
    shape = {"num_tokens": 3, "num_experts": 16, "topk": 4, "renormalize": 0}
    spec, inputs = _inputs("topk_softmax", shape, "float16", "ties")
    expected = spec.reference(inputs, shape, spec.constants)
    assert expected["topk_ids"].tolist() == [[0, 1, 2, 3]] * 3
    torch.testing.assert_close(expected["topk_weights"], torch.full((3, 4), 1 / 16))
    # The random case contains exact ties too, so the rule is exercised on every run.
    spec, rand = _inputs("topk_softmax", {**shape, "num_tokens": 64}, "bfloat16", "random")
    assert any(len(set(row)) < len(row) for row in rand["gating_output"].tolist())


def test_merge_multi_edge_cases_contain_what_they_claim():
    shape = {"num_states": 4, "num_tokens": 6, "num_heads": 3, "head_dim": 8}
    spec, inputs = _inputs("merge_attn_states_multi", shape, "float16", "all_neg_inf")
    expected = spec.reference(inputs, shape, spec.constants)
    assert torch.isneginf(expected["lse_out"][::2]).all() and torch.isfinite(expected["lse_out"][1::2]).all()
    assert not expected["v_out"][::2].any()
    spec, inputs = _inputs("merge_attn_states_multi", shape, "float16", "neg_inf_state")
    assert (torch.isneginf(inputs["lse"]).sum(dim=0) == 1).all()


def test_reshape_and_cache_skips_negative_slots_and_keeps_old_entries():
    shape = {"num_tokens": 9, "num_kv_heads": 2, "head_size": 4, "block_size": 4, "num_blocks": 4}
    spec, inputs = _inputs("reshape_and_cache", shape, "bfloat16", "skip_slots")
    slots = inputs["slot_mapping"]
    valid = slots[slots >= 0].tolist()
    assert (slots < 0).any() and len(set(valid)) == len(valid)
    expected = spec.reference(inputs, shape, spec.constants)
    differs = (expected["key_cache"] != inputs["key_cache"].float()).any(dim=3).any(dim=1)
    changed = {(b, o) for b, o in torch.nonzero(differs).tolist()}  # (block, offset) pairs
    assert changed == {(slot // 4, slot % 4) for slot in valid}
    # Only padding tokens: nothing at all is written.
    inputs["slot_mapping"].fill_(-1)
    expected = spec.reference(inputs, shape, spec.constants)
    assert torch.equal(expected["value_cache"], inputs["value_cache"].float())


# ---------------------------------------------------------------- baselines compile and launch


@pytest.fixture(scope="module")
def cubin_cache(tmp_path_factory) -> Path:
    # A private cache: NVRTC must really run, not hand back a cubin from an earlier session.
    return tmp_path_factory.mktemp("cubin")


@pytest.mark.parametrize("name", NEW_KERNELS)
def test_baseline_compiles_for_every_dtype(name, cubin_cache):
    spec = load_kernel(name)
    for dtype in spec.dtypes:
        result = compile_variant(spec.baseline_source(), spec.name, dtype, {}, cache_dir=cubin_cache)
        assert result.ok, f"{name} [{dtype}]:\n{result.log}"
        assert result.cubin and not result.cached
        assert result.spill_bytes == 0


@pytest.mark.parametrize("name", NEW_KERNELS)
def test_baseline_launch_resolves_on_every_shape(name):
    spec = load_kernel(name)
    launch = parse_launch_header(spec.baseline_source())
    assert launch.tune == {}
    for shape in (*spec.search_shapes, *spec.heldout_shapes):
        cfg = launch.resolve(shape, {})
        assert math.prod(cfg.block) <= 1024, (shape, cfg.block)
        assert cfg.grid[0] < 2**31 and cfg.grid[1] <= 65535 and cfg.grid[2] <= 65535
        assert cfg.smem_bytes <= 48 * 1024, "more than 48 KB of dynamic shared memory needs an opt-in"
