"""Every adversarial fixture through the GPU evaluator: each must get its verdict (and guard),
and the evaluator must keep answering after every fault. Winners' latent bugs through
compute-sanitizer. Run on the GPU machine: ``python -m pytest -m gpu tests/gpu/test_adversarial.py``."""

from __future__ import annotations

import pytest
import torch

from evaluators.api import EvalRequest, TimingConfig
from evaluators.sanitize import SanitizerStatus, sanitize
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Status
from tests.adversarial.index import Fixture, fixtures

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TIMING = TimingConfig(5, 20, 0.0)
FIXTURES = fixtures()
FAULTS = (Status.CRASH, Status.TIMEOUT, Status.RESOURCE_ERROR, Status.REJECTED, Status.INCORRECT)


def _param(fx: Fixture):
    marks = [pytest.mark.xfail(reason=f"known gap: {fx.known_gap}", strict=False)] if fx.known_gap else []
    return pytest.param(fx, id=fx.name, marks=marks)


@pytest.fixture(scope="module")
def evaluator():
    from evaluators.gpu import GpuEvaluator

    ev = GpuEvaluator(device=0)
    yield ev
    ev.close()


def _evaluate(evaluator, kernel: str, source: str, dtype: str = "float16", **kw):
    return evaluator.evaluate(EvalRequest(kernel, Variant(kernel, source), dtype=dtype, timing=TIMING, **kw))


def _run_on(fx: Fixture) -> tuple[str, str]:
    """The dtype and shape set a fixture's verdict is judged on (index fields, where it has them)."""
    return fx.dtype, fx.shape_set


@pytest.mark.parametrize("fx", [_param(f) for f in FIXTURES])
def test_fixture_gets_its_verdict(evaluator, fx: Fixture):
    expected = Status(fx.status)
    dtype, shape_set = _run_on(fx)
    pid_before = evaluator.info()["pid"]
    ev = _evaluate(evaluator, fx.kernel, fx.source(), dtype, shape_set=shape_set)
    if fx.sanitizer == "memcheck" and ev.status is Status.CRASH:
        # An out-of-bounds access faults or not depending on where the allocator put the
        # buffer it overruns: a CRASH is a right verdict too (the sanitizer test finds it).
        return
    assert ev.status is expected, f"{fx.file}: {ev.status.value} guard={ev.guard!r}: {ev.message}"
    if expected is Status.REJECTED:
        assert ev.guard == fx.guard, f"{fx.file}: guard {ev.guard!r}: {ev.message}"
    elif expected is Status.COMPILE_ERROR:
        assert ev.guard in ("", fx.guard)
    for text in fx.message_contains:
        assert text.lower() in ev.message.lower(), f"{fx.file}: {text!r} not in {ev.message!r}"
    if expected is Status.OK:
        assert ev.speedup is not None and ev.speedup > 0
        assert len(ev.shapes) == len(load_kernel(fx.kernel).shapes(shape_set))
    if expected in FAULTS:
        # The fault must cost one verdict only: the baseline evaluates correctly right after.
        spec = load_kernel(fx.kernel)
        base = _evaluate(evaluator, fx.kernel, spec.baseline_source(), dtype, time=False)
        assert base.status is Status.OK, f"after {fx.file}: baseline got {base.status.value}: {base.message}"
        if expected in (Status.CRASH, Status.TIMEOUT):
            assert evaluator.info()["pid"] != pid_before, "a faulted sandbox must be replaced"


SANITIZED = [f for f in FIXTURES if f.sanitizer]
HONEST = [f for f in FIXTURES if f.name.startswith("honest_")]


@pytest.mark.parametrize("fx", SANITIZED, ids=[f.name for f in SANITIZED])
def test_sanitizer_finds_latent_bug(fx: Fixture):
    report = sanitize(fx.kernel, fx.source(), "float16", tools=(fx.sanitizer,))
    if report.status is SanitizerStatus.UNAVAILABLE:
        pytest.skip(report.message)
    tool = report.tool(fx.sanitizer)
    assert tool.status is SanitizerStatus.FINDINGS, f"{fx.file}: {tool.status.value} {tool.message}\n{tool.output_tail}"
    assert tool.errors > 0 and any(fx.kernel in f for f in tool.findings), tool.findings


@pytest.mark.parametrize("fx", HONEST, ids=[f.name for f in HONEST])
def test_sanitizer_passes_honest_kernels(fx: Fixture):
    report = sanitize(fx.kernel, fx.source(), "float16")
    if report.status is SanitizerStatus.UNAVAILABLE:
        pytest.skip(report.message)
    assert report.clean, report.summary() + "\n" + "\n".join(t.output_tail for t in report.tools)
