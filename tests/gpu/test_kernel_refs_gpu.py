"""GPU: one evaluator judges two libraries' kernels of one name against their own specs.

Library ``a``'s ``scale_rows`` multiplies by 2, library ``b``'s by 3, from one ``baseline.cu``
(the factor is a spec constant). A variant that hard-codes the factor 2 is correct for ``a``
and wrong for ``b``: an evaluator that mixed the two up (a cache keyed by name, a module
replaced in ``sys.modules``, the sandbox worker's loaded specs) would give one of them the
other's verdict. Run on the GPU machine: ``python -m pytest tests/gpu/test_kernel_refs_gpu.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evaluators.api import EvalRequest, TimingConfig
from kernels.spec import kernel_ref
from kernels.variant import Variant
from kernels.verdict import Status
from tests.unit.kernel_folders import BASELINE, write_libraries

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TIMES_TWO = BASELINE.replace("static_cast<float>(x[i]) * factor", "static_cast<float>(x[i]) * 2.0f")


@pytest.fixture(scope="module")
def evaluator():
    from evaluators.gpu import GpuEvaluator

    ev = GpuEvaluator(step_timeout_s=30.0)
    yield ev
    ev.close()


def _verdict(evaluator, folder: Path, source: str, dtype: str) -> Status:
    request = EvalRequest(kernel_ref(folder), Variant("scale_rows", source), dtype=dtype,
                          timing=TimingConfig.screen())
    ev = evaluator.evaluate(request)
    assert ev.shapes or not ev.status.is_ok
    return ev.status


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_same_named_kernels_of_two_libraries_get_their_own_verdicts(evaluator, tmp_path, dtype):
    assert "2.0f" in TIMES_TWO and TIMES_TWO != BASELINE
    lib_a, lib_b = write_libraries(tmp_path)
    a, b = lib_a / "scale_rows", lib_b / "scale_rows"
    # Interleaved, so that whatever the evaluator and its worker keep from one kernel is there
    # when the other comes.
    assert _verdict(evaluator, a, BASELINE, dtype) is Status.OK
    assert _verdict(evaluator, b, BASELINE, dtype) is Status.OK
    assert _verdict(evaluator, a, TIMES_TWO, dtype) is Status.OK
    assert _verdict(evaluator, b, TIMES_TWO, dtype) is Status.INCORRECT
    assert _verdict(evaluator, a, TIMES_TWO, dtype) is Status.OK


def test_the_sanitizer_instruments_an_external_kernel(tmp_path):
    from evaluators.sanitize import find_compute_sanitizer, sanitize
    from evaluators.sanitize_report import SanitizerStatus

    if find_compute_sanitizer() is None:
        pytest.skip("no compute-sanitizer on this machine")
    _, lib_b = write_libraries(tmp_path)
    ref = kernel_ref(lib_b / "scale_rows")
    assert sanitize(ref, BASELINE, "float16", tools=("memcheck",)).clean
    # One write one element past the output: found only if the launcher loaded the folder and
    # the tool instrumented the entry symbol (not a path that names no kernel).
    past_end = BASELINE.replace("    if (i < n) {", "    if (i == 0) { out[n] = out[0]; }\n    if (i < n) {")
    assert past_end != BASELINE
    report = sanitize(ref, past_end, "float16", tools=("memcheck",))
    assert report.tool("memcheck").status is SanitizerStatus.FINDINGS, report.summary()
