"""The one-pass device check of timed launches (:mod:`evaluators.mismatch_device`) gives the
statistics row the torch operators give (:func:`evaluators.validate.mismatch_stats`), for every
dtype it takes, on tensors large enough for many blocks. GPU machine:
``python -m pytest -m gpu tests/gpu/test_mismatch_device_gpu.py``."""

from __future__ import annotations

import math

import pytest
import torch

from evaluators import mismatch_device
from evaluators import validate as V

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8, torch.int16, torch.int32,
          torch.int64, torch.bool]


def _expected(dtype: torch.dtype, n: int, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return (torch.randn(n, generator=gen, device="cuda") * 10).to(dtype)
    if dtype == torch.bool:
        return torch.rand(n, generator=gen, device="cuda") < 0.5
    return torch.randint(0, 100, (n,), generator=gen, device="cuda").to(dtype)


def _same(a: list[float], b: list[float]) -> bool:
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


def _rows(got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> tuple[list[float], list[float]]:
    row = torch.full((4,), -7.0, dtype=torch.float64, device="cuda")
    assert mismatch_device.supported(got, expected)
    mismatch_device.checker(got.device).stats_into(row, got, expected, rtol, atol)
    return row.tolist(), V.mismatch_stats(got, expected, rtol, atol).tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 1000, 5_000_003])
def test_the_device_row_is_the_torch_row(dtype, n):
    gen = torch.Generator(device="cuda").manual_seed(n)
    expected = _expected(dtype, n, gen)
    rtol, atol = 2e-2, 1e-3
    got = expected.clone()
    if dtype.is_floating_point:
        # differences clearly inside the tolerance pass in both (the 16-bit torch path computes
        # in 16 bits; decisions away from the limit agree)
        got = (expected.float() * (1 + 0.25 * rtol)).to(dtype)
    device, torch_row = _rows(got, expected, rtol, atol)
    assert device[0] == torch_row[0] == 0.0
    # planted mismatches, the first of them somewhere past the first block
    at = sorted({n - 1, n // 2, n // 3} if n > 1 else {0})
    for i in at:
        got[i] = (expected[i].float() + 50).to(dtype) if dtype != torch.bool else ~expected[i]
    device, torch_row = _rows(got, expected, rtol, atol)
    assert device[0] == len(at) and device[1] == at[0]
    assert _same(device, torch_row), (device, torch_row)
    # the counters were reset: the same pair again gives the same row, a clean pair a clean row
    assert _same(_rows(got, expected, rtol, atol)[0], device)
    assert _rows(expected.clone(), expected, rtol, atol)[0][0] == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_special_values_are_judged_as_by_the_torch_operators(dtype):
    expected = torch.tensor([math.inf, -math.inf, math.nan, 1.0, math.nan, 2.0, math.inf], device="cuda").to(dtype)
    got = torch.tensor([math.inf, math.inf, math.nan, math.nan, 0.0, math.inf, 5.0], device="cuda").to(dtype)
    device, torch_row = _rows(got, expected, 1e-2, 1e-3)
    assert device[0] == 5.0 and device[1] == 1.0  # -inf vs inf first; nan vs 1, 0 vs nan, inf vs 2, 5 vs inf
    assert _same(device, torch_row)


def test_pairs_it_does_not_take_go_through_the_torch_operators():
    expected = torch.randn(100, device="cuda")
    got = expected.half()  # mixed dtypes
    assert not mismatch_device.supported(got, expected)
    row = torch.zeros(4, dtype=torch.float64, device="cuda")
    got[7] = 99.0
    V.mismatch_stats_into(row, got, expected, 1e-2, 1e-3)
    assert row.tolist()[:2] == [1.0, 7.0]
    strided = torch.randn(10, 10, device="cuda").t()
    assert not mismatch_device.supported(strided, strided.clone())
