"""The shapes and inputs the evaluator judges on, on the CPU: every spec keeps its promised
alignment, held-out sets have tails at exactly that alignment, per-run draws are seeded and
never repeat search shapes, huge shapes are marked (and never materialised here), and the
edge cases span each dtype's range with a finite fp32 reference."""

from __future__ import annotations

import random

import pytest
import torch

from kernels import draws, edges
from kernels.spec import HUGE_ELEMENTS, KernelSpecError, list_kernels, load_kernel

LIBRARY = list_kernels()
# Never build inputs on the CPU for a shape with a tensor above this many elements.
CPU_ELEMENTS = 2**22
# Estimated device memory of one validation case of a huge shape must stay under this.
HUGE_BUDGET_BYTES = 40e9


def _key(shape):
    return tuple(sorted(shape.items()))


def _all_shapes(spec):
    return (*spec.search_shapes, *spec.heldout_shapes)


@pytest.mark.parametrize("name", LIBRARY)
def test_every_fixed_shape_honours_the_promised_alignment(name):
    spec = load_kernel(name)
    for shape in _all_shapes(spec):
        for arg, multiple in spec.alignment.items():
            assert shape[arg] % multiple == 0, (shape, arg, multiple)


def test_a_shape_off_the_promised_alignment_is_refused():
    spec = load_kernel("silu_and_mul")
    with pytest.raises(KernelSpecError, match="multiple of 8"):
        spec.check_shape({"num_tokens": 3, "d": 1004})
    spec.check_shape({"num_tokens": 3, "d": 1000})


@pytest.mark.parametrize("name", LIBRARY)
def test_rows_promise_16_bytes_and_no_more(name):
    """Every kernel promises an alignment on its row-length argument, the one 16-byte rows
    need (8 fp16/bf16 elements; 16 for fp8 rows), never a larger power of two."""
    spec = load_kernel(name)
    promised = {a: m for a, m in spec.alignment.items() if m > 1}
    if name == "topk_softmax":
        assert not promised  # rows of 8 to 256 experts, any count: nothing is promised
        return
    assert promised, "no alignment promised on any size"
    assert set(promised.values()) <= {8, 16}


@pytest.mark.parametrize("name", LIBRARY)
def test_heldout_set_has_a_tail_at_exactly_the_promised_alignment(name):
    """For every size argument some held-out value is ``multiple`` times an odd number: the
    size sits at the promised alignment and at no larger power of two (odd counts for
    arguments with no promise)."""
    spec = load_kernel(name)
    sizes = [a for a in spec.args if a.kind == "int" and a.min_value >= 1]
    for arg in sizes:
        values = [s[arg.name] for s in spec.heldout_shapes]
        assert any((v // arg.multiple_of) % 2 == 1 for v in values), (arg.name, values)


@pytest.mark.parametrize("name", LIBRARY)
def test_heldout_tokens_include_1_and_an_odd_count_above_64(name):
    tokens = [s["num_tokens"] for s in load_kernel(name).heldout_shapes]
    assert 1 in tokens or 3 in tokens
    assert any(t % 2 and t > 64 for t in tokens)


@pytest.mark.parametrize("name", LIBRARY)
def test_draws_are_deterministic_aligned_moderate_and_new(name):
    spec = load_kernel(name)
    search = {_key(s) for s in spec.search_shapes}
    seen = set()
    for seed in range(8):
        drawn = spec.draw_heldout(seed)
        assert drawn == spec.draw_heldout(seed)
        assert 2 <= len(drawn) <= 3
        for shape in drawn:
            spec.check_shape(shape)
            assert _key(shape) not in search
            assert spec.largest_tensor_elements(shape) <= draws.DRAW_MAX_ELEMENTS
            for arg, multiple in spec.alignment.items():
                if multiple > 1:
                    assert (shape[arg] // multiple) % 2 == 1, (shape, arg)  # at the alignment, no more
            assert shape["num_tokens"] % 2 == 1
            seen.add(_key(shape))
    assert len(seen) >= 20, "different seeds must give different shapes"


def test_draw_helpers():
    rng = random.Random(0)
    values = [draws.at_alignment(rng, 100, 1000, 8) for _ in range(200)]
    assert all(100 <= v <= 1000 and v % 8 == 0 and (v // 8) % 2 == 1 for v in values)
    assert len(set(values)) > 30
    with pytest.raises(ValueError):
        draws.at_alignment(rng, 17, 23, 8)  # 8 * odd: 8, 24 lie outside
    with pytest.raises(ValueError, match="within"):
        draws.draw_shapes(rng, lambda r, i: {"n": 2**40}, lambda s: s["n"], attempts=5)


def test_a_draw_outside_the_spec_is_an_error():
    import dataclasses

    spec = load_kernel("silu_and_mul")
    bad = dataclasses.replace(spec, heldout_draw=lambda rng: ({"num_tokens": 3, "d": 12},))
    with pytest.raises(KernelSpecError, match="heldout_draw"):
        bad.draw_heldout(0)


HUGE = {"silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "merge_attn_states_multi"}


def _validation_bytes(spec, shape, dtype=torch.float16):
    """A worst-case estimate of one validation case on the device (evaluators/worker.py):
    inputs, their pristine copy and the reference's copy; the fp32 reference transients (two
    fp32 copies of everything read); the expected fp32 outputs; four output copies (two
    launches each of candidate and baseline)."""
    made = spec.make_inputs(shape, dtype, torch.Generator(), "random", torch.device("meta"))
    size = {n: t.numel() * t.element_size() for n, t in made.items()}
    numel = {n: t.numel() for n, t in made.items()}
    inputs = sum(size.values())
    read = sum(4 * numel[a.name] for a in spec.read_args)
    written = [a.name for a in spec.written_args]
    return 3 * inputs + 2 * read + sum(4 * numel[n] for n in written) + 4 * sum(size[n] for n in written)


@pytest.mark.parametrize("name", LIBRARY)
def test_huge_shapes_pass_2_31_elements_within_the_memory_budget(name):
    spec = load_kernel(name)
    huge = [s for s in spec.heldout_shapes if spec.is_huge(s)]
    assert len(huge) == (1 if name in HUGE else 0)
    assert not any(spec.is_huge(s) for s in spec.search_shapes)
    for shape in huge:
        assert spec.largest_tensor_elements(shape) >= HUGE_ELEMENTS
        assert _validation_bytes(spec, shape) < HUGE_BUDGET_BYTES * 1.25, _validation_bytes(spec, shape) / 1e9
        assert all(v < 2**31 for v in shape.values())  # each size still fits the int arguments


def test_tensor_elements_come_from_meta_tensors():
    spec = load_kernel("silu_and_mul")
    assert spec.tensor_elements({"num_tokens": 3, "d": 8}) == {"out": 24, "x": 48}
    huge = spec.tensor_elements({"num_tokens": 74899, "d": 14336})  # nothing is allocated
    assert huge["x"] == 2 * 74899 * 14336 > HUGE_ELEMENTS


def _cpu_shapes(spec):
    """Held-out shapes small enough to build here: the huge ones are never materialised."""
    small = [s for s in spec.heldout_shapes if spec.largest_tensor_elements(s) <= CPU_ELEMENTS]
    return sorted(small, key=spec.largest_tensor_elements)[:2]


@pytest.mark.parametrize("name", LIBRARY)
def test_edge_cases_have_a_finite_reference_on_the_tail_shapes(name):
    spec = load_kernel(name)
    for shape in _cpu_shapes(spec):
        for dtype in spec.dtypes:
            for case in ("random", *spec.edge_cases):
                inputs = spec.make_inputs(shape, getattr(torch, dtype), torch.Generator().manual_seed(0), case, "cpu")
                expected = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
                for out_name, value in expected.items():
                    if not value.is_floating_point():
                        continue
                    finite = value[~torch.isneginf(value)]  # -inf lse: an empty state, by definition
                    assert torch.isfinite(finite).all(), (shape, dtype, case, out_name)
                    out_dtype = inputs[out_name].dtype
                    if out_dtype in (torch.float16, torch.bfloat16):
                        # The rounded answer is representable: finite where the reference is.
                        assert torch.isfinite(finite.to(out_dtype)).all(), (shape, dtype, case, out_name)


RANGE_KERNELS = [n for n in LIBRARY if "range" in load_kernel(n).edge_cases]


@pytest.mark.parametrize("name", RANGE_KERNELS)
def test_range_case_reaches_beyond_fp16_on_bf16_runs(name):
    """bf16 inputs of the range case pass fp16's maximum (so fp16 arithmetic shows) while the
    fp16 inputs stay finite."""
    spec = load_kernel(name)
    shape = _cpu_shapes(spec)[0]
    big = {}
    for dtype in ("float16", "bfloat16"):
        inputs = spec.make_inputs(shape, getattr(torch, dtype), torch.Generator().manual_seed(1), "range", "cpu")
        scalar = [a.name for a in spec.read_args if a.dtype == "scalar"]
        values = torch.cat([inputs[n].float().flatten() for n in scalar])
        assert torch.isfinite(values).all()
        big[dtype] = float(values.abs().max())
    assert big["bfloat16"] > 1e6 > 65504.0 >= big["float16"]


def test_largest_row_scale_keeps_squares_finite_in_fp32():
    for dtype in (torch.float16, torch.bfloat16):
        for row in (8, 128, 28672):
            scale = edges.largest_row_scale(dtype, row)
            assert (2 * 5 * scale) ** 2 * row < edges.FP32_MAX
            assert 2 * 5 * scale < float(torch.finfo(dtype).max)


def test_merge_gap_case_has_gaps_above_126_and_empty_marks():
    spec = load_kernel("merge_attn_states_lse")
    shape = {"num_tokens": 33, "num_heads": 7, "head_dim": 8}
    inputs = spec.make_inputs(shape, torch.bfloat16, torch.Generator().manual_seed(0), "gap", "cpu")
    sa, sb = inputs["s_a"], inputs["s_b"]
    finite = (sa > -1e29) & (sb > -1e29)
    gaps = (sa - sb).abs()[finite]
    assert gaps.min() >= 126 and gaps.max() > 300
    assert bool((sa == -1e30).any() and (sb == -1e30).any() and ((sa == -1e30) & (sb == -1e30)).any())
    ref = spec.reference(inputs, shape, spec.constants)
    assert torch.isfinite(ref["v_out"]).all() and torch.isfinite(ref["s_out"]).all()
    # A side with a gap past 126 gets weight 2^-gap, which is 0 in fp32: v_out is the other side.
    big_a = finite & (sa - sb > 126)
    assert torch.equal(ref["v_out"][big_a], inputs["v_a"].float()[big_a])


def test_topk_masked_case_ties_at_zero_go_to_the_lower_ids():
    spec = load_kernel("topk_softmax")
    shape = {"num_tokens": 64, "num_experts": 9, "topk": 8, "renormalize": 0}
    inputs = spec.make_inputs(shape, torch.float16, torch.Generator().manual_seed(0), "masked", "cpu")
    logits = inputs["gating_output"].float()
    assert torch.isneginf(logits).any() and torch.isfinite(logits[:, 0]).all()
    ref = spec.reference(inputs, shape, spec.constants)
    for row in range(shape["num_tokens"]):
        masked = torch.nonzero(torch.isneginf(logits[row])).flatten().tolist()
        picked_masked = [i for i in ref["topk_ids"][row].tolist() if i in masked]
        assert picked_masked == masked[: len(picked_masked)]  # in index order


def test_skipped_slots_are_any_negative_value():
    spec = load_kernel("reshape_and_cache")
    shape = {"num_tokens": 9, "num_kv_heads": 1, "head_size": 8, "block_size": 8, "num_blocks": 3}
    inputs = spec.make_inputs(shape, torch.float16, torch.Generator().manual_seed(0), "skip_slots", "cpu")
    negative = set(inputs["slot_mapping"][inputs["slot_mapping"] < 0].tolist())
    assert {-1, -2, -(2**40)} <= negative
    ref = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
    slots = inputs["slot_mapping"]
    written = torch.zeros(shape["num_blocks"] * shape["block_size"], dtype=torch.bool)
    written[slots[slots >= 0]] = True
    before = inputs["key_cache"].float().transpose(1, 2).reshape(written.numel(), -1)
    after = ref["key_cache"].transpose(1, 2).reshape(written.numel(), -1)
    assert torch.equal(after[~written], before[~written])  # negative slots wrote nothing
    valid = torch.nonzero(slots >= 0).flatten()
    assert torch.equal(after[slots[valid]], inputs["key"].float()[valid].reshape(len(valid), -1))
