"""The CPU stand-in evaluator: real compile errors, forced outcomes, deterministic fake times."""

from __future__ import annotations

import pytest

from evaluators.api import EvalRequest
from evaluators.standin import DEVICE_NAME, StandinEvaluator
from kernels import load_kernel
from kernels.variant import Variant
from kernels.verdict import Status


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    spec = load_kernel("silu_and_mul")
    return spec, StandinEvaluator(cache_dir=tmp_path_factory.mktemp("cubin"))


def _eval(evaluator, source, **kw):
    return evaluator.evaluate(EvalRequest("silu_and_mul", Variant("silu_and_mul", source), **kw))


def test_compile_errors_are_real(setup):
    spec, ev = setup
    out = _eval(ev, spec.baseline_source().replace("expf(-g)", "expf(-g, 1)"))
    assert out.status is Status.COMPILE_ERROR and "expf" in out.message
    assert _eval(ev, "// no launch header\n").status is Status.COMPILE_ERROR


def test_baseline_is_ok_and_marked_as_standin(setup):
    spec, ev = setup
    out = _eval(ev, spec.baseline_source())
    assert out.status is Status.OK and out.extra["evaluator"] == "standin"
    assert len(out.shapes) == len(spec.search_shapes)
    assert 0.9 < out.speedup < 1.1
    assert ev.device_name == DEVICE_NAME and ev.time_peers("silu_and_mul", "float16") == {}


def test_timing_is_deterministic_and_rewards_intrinsics(setup):
    spec, ev = setup
    fast = spec.baseline_source().replace("expf(", "__expf(")
    a, b = _eval(ev, fast), _eval(ev, fast)
    assert a.speedup == b.speedup
    assert a.speedup > _eval(ev, spec.baseline_source()).speedup


@pytest.mark.parametrize("marker, status", [("crash", Status.CRASH), ("incorrect", Status.INCORRECT),
                                            ("timeout", Status.TIMEOUT), ("rejected", Status.REJECTED)])
def test_markers_force_outcomes(setup, marker, status):
    spec, ev = setup
    assert _eval(ev, f"// standin: {marker}\n" + spec.baseline_source()).status is status


def test_heldout_marker_only_fails_on_heldout(setup):
    spec, ev = setup
    src = "// standin: incorrect-heldout\n" + spec.baseline_source()
    assert _eval(ev, src).status is Status.OK
    held = _eval(ev, src, shape_set="heldout")
    assert held.status is Status.INCORRECT


def test_params_reach_the_launch_and_bad_values_are_refused(setup):
    spec, ev = setup
    src = spec.baseline_source().replace("block=(256,)", "block=(BLOCK,)").replace(
        "// launch:", "// tune: BLOCK=128,2048\n// launch:")
    assert _eval(ev, src, params={"BLOCK": 2048}).status is Status.RESOURCE_ERROR
    assert _eval(ev, src, params={"BLOCK": 64}).status is Status.COMPILE_ERROR
    assert _eval(ev, src, params={"BLOCK": 128}).params == {"BLOCK": 128}
