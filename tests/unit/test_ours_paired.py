"""CPU tests of the evaluator's paired check (evaluators.ours.OursOnShape.paired): a candidate's
every timed launch is compared with the baseline's timed launch of the same repetition,
whichever of the two runs first. The kernels are torch functions on CPU tensors, driven in
the order time_interleaved drives them (A B, then B A)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from evaluators.ours import OursOnShape
from evaluators.verify import TIMED_OUTPUT_GUARD, RepInputs
from kernels.spec import load_kernel

SHAPE = {"num_tokens": 8, "d": 64}
WARMUP, REPS = 2, 8


class _TorchKernel:
    """A stand-in for a loaded kernel: ``args`` keeps the buffers, ``launch`` computes
    silu_and_mul into ``out``; ``wrong_on`` names launches (counted from 0) that write garbage."""

    def __init__(self, wrong_on: set[int] | None = None) -> None:
        self.wrong_on, self.launches = wrong_on or set(), 0

    def args(self, tensors: dict[str, torch.Tensor], shape: dict[str, int]) -> dict[str, torch.Tensor]:
        return tensors

    def launch(self, label: str, args: dict[str, torch.Tensor]) -> None:
        x = args["x"].float()
        out = torch.nn.functional.silu(x[:, :SHAPE["d"]]) * x[:, SHAPE["d"]:]
        if self.launches in self.wrong_on:
            out = out + 100.0
        args["out"].copy_(out)
        self.launches += 1


def _loop(wrong_on: set[int]) -> tuple[OursOnShape, dict[str, Any]]:
    spec = load_kernel("silu_and_mul")
    sets = [spec.make_inputs(SHAPE, torch.float16, torch.Generator().manual_seed(10 + k), "random", "cpu")
            for k in (0, 1)]
    inputs = RepInputs(spec, sets, WARMUP + REPS, torch.Generator().manual_seed(0))
    work = inputs.buffer()
    ours = OursOnShape(None, spec, SHAPE, "float16", WARMUP, REPS, inputs, work, None)  # type: ignore[arg-type]
    base, cand = ours.paired(("baseline", _TorchKernel()), ("candidate", _TorchKernel(wrong_on)))
    for i in range(WARMUP):  # warm-ups: launched, not checked
        for t in (base, cand):
            t.prepare(i)
            t.launch()
    for rep in range(REPS):
        for t in ((base, cand) if rep % 2 == 0 else (cand, base)):
            t.prepare(WARMUP + rep)
            t.launch()
            assert t.check is not None
            t.check(WARMUP + rep)
    return ours, ours.checks


def test_a_correct_candidate_passes_in_either_order():
    ours, checks = _loop(set())
    assert set(checks) == {"candidate"} and checks["candidate"].checked == REPS
    assert ours.failures({}) == {}


@pytest.mark.parametrize("rep", [0, 1, REPS - 1])  # baseline first, candidate first, the last
def test_a_wrong_timed_launch_is_named_whichever_ran_first(rep):
    ours, _ = _loop({WARMUP + rep})
    failed = ours.failures({})
    assert set(failed) == {"candidate"}
    guard, finding = failed["candidate"]
    assert guard == TIMED_OUTPUT_GUARD
    assert f"timed launch {rep + 1} of {REPS}" in finding.message
