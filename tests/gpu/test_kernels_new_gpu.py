"""GPU: a kernel folder written with ``kernels.new`` and filled until ``kernels.check`` passes
is one the evaluator runs: its baseline is OK on the search and held-out shapes, and a wrong
variant of it is INCORRECT. Run on the GPU machine:
``python -m pytest tests/gpu/test_kernels_new_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from evaluators.api import EvalRequest, TimingConfig
from kernels import check, new
from kernels.spec import kernel_ref
from kernels.variant import Variant
from kernels.verdict import Status
from tests.unit.test_kernels_new import fill

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def evaluator():
    from evaluators.gpu import GpuEvaluator

    ev = GpuEvaluator(step_timeout_s=60.0)
    yield ev
    ev.close()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_checked_skeleton_runs_on_the_gpu(evaluator, tmp_path, dtype):
    folder = new.write_skeleton("scale2", tmp_path)
    fill(folder)
    assert check.main([str(folder)]) == 0
    baseline = (folder / "baseline.cu").read_text()
    wrong = baseline.replace("2.0f * static_cast<float>(x[i])", "3.0f * static_cast<float>(x[i])")
    assert wrong != baseline

    def verdict(source: str, shape_set: str) -> Status:
        request = EvalRequest(kernel_ref(folder), Variant("scale2", source), dtype=dtype, shape_set=shape_set,
                              timing=TimingConfig.screen())
        return evaluator.evaluate(request).status

    assert verdict(baseline, "search") is Status.OK
    assert verdict(baseline, "heldout") is Status.OK
    assert verdict(wrong, "search") is Status.INCORRECT
