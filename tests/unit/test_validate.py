"""CPU tests of the output checks and integrity findings used by the sandbox worker."""

from __future__ import annotations

import math

import pytest
import torch

from evaluators import validate as V


def test_compare_accepts_values_within_tolerance_and_reports_first_mismatch():
    expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert V.compare("out", expected.half(), expected, 4e-3, 1e-4) is None
    got = expected.clone()
    got[1, 0] = 3.1
    finding = V.compare("out", got, expected, 4e-3, 1e-4, "(shape [2, 2])")
    assert finding is not None and finding.kind == "mismatch"
    assert "out[1, 0]" in finding.message and "expected 3" in finding.message and "got 3.1" in finding.message
    assert "1 of 4" in finding.message and "(shape [2, 2])" in finding.message


def test_compare_treats_nan_and_inf_as_failures_unless_reference_has_them():
    expected = torch.tensor([1.0, math.inf, math.nan, -math.inf])
    assert V.compare("o", expected.clone(), expected, 1e-3, 1e-5) is None
    got = expected.clone()
    got[0] = math.nan
    assert V.compare("o", got, expected, 1e-3, 1e-5) is not None
    got = expected.clone()
    got[1] = -math.inf  # wrong sign of infinity
    assert V.compare("o", got, expected, 1e-3, 1e-5) is not None
    got = expected.clone()
    got[2] = 0.0  # reference NaN, kernel finite
    assert V.compare("o", got, expected, 1e-3, 1e-5) is not None


def test_compare_integers_exactly_and_shapes():
    e = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert V.compare("ids", e.clone(), e, 0.1, 10.0) is None
    assert V.compare("ids", torch.tensor([1, 2, 4], dtype=torch.int32), e, 0.1, 10.0) is not None
    assert "shape" in V.compare("ids", e[:2], e, 0.1, 1.0).message


def test_precision_downgrade_fails_fp16_tolerance():
    x = torch.linspace(-4, 4, 4096)
    expected = torch.nn.functional.silu(x) * x
    # bf16-precision arithmetic passed off as an fp16 result: errors of ~2^-8 relative
    downgraded = (torch.nn.functional.silu(x.bfloat16()) * x.bfloat16()).half()
    assert V.compare("out", downgraded, expected, 4e-3, 1e-4) is not None
    assert V.compare("out", expected.half(), expected, 4e-3, 1e-4) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64])
def test_unwritten_elements_are_found_through_two_poisons(dtype):
    a = torch.empty(8, dtype=dtype)
    b = torch.empty(8, dtype=dtype)
    V.poison_(a, 0)
    V.poison_(b, 1)
    a[:6] = 1
    b[:6] = 1
    finding = V.unwritten("out", a, b)
    assert finding is not None and finding.kind == "partial_output"
    assert "2 of 8" in finding.message and "[6]" in finding.message
    a[6:] = 0
    b[6:] = 0
    assert V.unwritten("out", a, b) is None


def test_a_kernel_that_writes_nan_is_not_called_partial():
    a = torch.full((4,), math.nan)
    b = torch.full((4,), math.nan)  # wrote NaN both times: a wrong result, not unwritten memory
    assert V.unwritten("out", a, b) is None


def test_input_mutation_is_detected_bitwise():
    x = torch.randn(16).half()
    pristine = {"x": x.clone()}
    assert V.check_inputs_unchanged({"x": x}, pristine, ["x"]) is None
    x[3] = -x[3]
    finding = V.check_inputs_unchanged({"x": x}, pristine, ["x"])
    assert finding is not None and finding.kind == "input_mutation" and finding.is_guard


def test_bitwise_equal_distinguishes_signed_zero_and_nan_payloads():
    assert V.bitwise_equal(torch.tensor([0.0]), torch.tensor([0.0]))
    assert not V.bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert V.bitwise_equal(torch.tensor([math.nan]), torch.tensor([math.nan]))


def test_check_outputs_uses_the_spec_hook_when_given():
    def as_sets(name, got, expected):
        return None if set(got.tolist()) == set(expected.tolist()) else f"{name}: sets differ"

    got = {"ids": torch.tensor([3, 1, 2])}
    assert V.check_outputs(got, {"ids": torch.tensor([1, 2, 3])}, {}, as_sets) is None
    finding = V.check_outputs(got, {"ids": torch.tensor([1, 2, 4])}, {}, as_sets)
    assert finding is not None and "sets differ" in finding.message


def test_device_side_statistics_agree_with_compare():
    # mismatch_stats (no host synchronisation, used after every timed launch) must give the
    # verdict and the first element compare gives.
    gen = torch.Generator().manual_seed(3)
    expected = torch.randn(64, 33, generator=gen)
    expected[0, 1], expected[5, 7], expected[9, 9] = math.inf, math.nan, -math.inf
    for bad_at in [None, (0, 0), (0, 1), (5, 7), (9, 9), (63, 32)]:
        got = expected.clone().half()
        if bad_at is not None:
            got[bad_at] = 7.0 if math.isfinite(float(expected[bad_at])) else 0.0
        finding = V.compare("o", got, expected, 1e-3, 1e-5)
        n_bad, first, got_v, exp_v = V.mismatch_stats(got, expected, 1e-3, 1e-5).tolist()
        assert (finding is None) == (n_bad == 0)
        if finding is not None:
            idx = list(V.index_of(int(first), (64, 33)))
            assert idx == list(bad_at) and f"o{idx}" in finding.message
            assert got_v == float(got[bad_at]) and (exp_v == float(expected[bad_at]) or math.isnan(exp_v))


def test_integer_outputs_must_be_equal_in_the_device_statistics():
    e = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    got = e.clone()
    assert V.mismatch_stats(got, e, 0.5, 10.0)[0] == 0
    got[1, 1] = 5
    assert V.mismatch_stats(got, e, 0.5, 10.0).tolist() == [1.0, 3.0, 5.0, 4.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sixteen_bit_pairs_are_judged_as_in_fp32_away_from_the_limit(dtype):
    # Candidate against baseline, both in the run dtype, is computed in that dtype; decisions
    # must match fp32 arithmetic for differences clearly inside or outside the tolerance.
    gen = torch.Generator().manual_seed(5)
    e = (torch.randn(4096, generator=gen) * 10).to(dtype)
    rtol, atol = 2e-2, 2e-5
    scale = torch.where(torch.rand(4096, generator=gen) < 0.5, 0.5, 1.5)  # half inside, half outside
    g = (e.float() + scale * rtol * e.float().abs()).to(dtype)
    native = V.mismatch_mask(g, e, rtol, atol)
    wide = V.mismatch_mask(g.float(), e.float(), rtol, atol)
    assert torch.equal(native, wide)
    assert 1000 < int(native.sum()) < 3000
    for special in (math.inf, -math.inf, math.nan):
        e2, g2 = e.clone(), e.clone()
        e2[0] = special
        assert bool(V.mismatch_mask(g2, e2, rtol, atol)[0])  # finite where the reference is not
        g2[0] = special
        assert not bool(V.mismatch_mask(g2, e2, rtol, atol)[0])  # the same special value passes


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bool, torch.int32, torch.bfloat16])
def test_device_side_statistics_gather_the_first_bad_element_of_any_dtype(dtype):
    expected = torch.zeros(4, 3).to(dtype)
    got = expected.clone()
    got[2, 1] = 1
    assert V.mismatch_stats(got, expected, 0.1, 0.01).tolist() == [1.0, 7.0, 1.0, 0.0]


def test_statistics_into_a_row_fall_back_to_the_torch_operators_off_the_gpu():
    # mismatch_stats_into takes the one-pass device check only on a GPU; on the CPU (and for
    # pairs the device check does not take) the row is the torch operators' row.
    e = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    got = e.clone()
    got[1, 0] = 9.0
    row = torch.zeros(4, dtype=torch.float64)
    V.mismatch_stats_into(row, got, e, 0.01, 0.01)
    assert row.tolist() == V.mismatch_stats(got, e, 0.01, 0.01).tolist() == [1.0, 2.0, 9.0, 3.0]
