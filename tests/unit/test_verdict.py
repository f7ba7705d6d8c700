"""Verdict records: the geometric mean and the JSON round trip of evaluations."""

from __future__ import annotations

import json
import math

import pytest

from kernels.verdict import Evaluation, ShapeResult, Status, geomean


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([2.0, 8.0], 4.0),
        ([3.0], 3.0),
        ([1.0, 1.0, 1.0], 1.0),
        ([0.5, 2.0], 1.0),
        ([1e300] * 1000, 1e300),  # the plain product overflows to inf
        ([1e-300] * 1000, 1e-300),  # the plain product underflows to 0
        ([1e308, 1e-308], 1.0),
        ([1e200, 1e200, 1e-100], 1e100),
    ],
)
def test_geomean_is_computed_in_log_space(values: list[float], expected: float) -> None:
    assert geomean(values) == pytest.approx(expected, rel=1e-9)


def test_geomean_accepts_any_iterable() -> None:
    assert geomean(v for v in (1.0, 4.0, 16.0)) == pytest.approx(4.0)


@pytest.mark.parametrize("values", [[], [0.0], [1.0, -2.0], [1.0, math.nan], [math.inf], [1.0, -math.inf]])
def test_geomean_refuses_empty_and_non_positive_input(values: list[float]) -> None:
    with pytest.raises(ValueError):
        geomean(values)


def _shape(n: int, candidate_ms: float, baseline_ms: float, **kw: float) -> ShapeResult:
    return ShapeResult({"num_tokens": n, "d": 4096}, candidate_ms, baseline_ms, **kw)  # type: ignore[arg-type]


def _evaluation() -> Evaluation:
    return Evaluation(
        status=Status.OK,
        message="",
        kernel="silu_and_mul",
        dtype="float16",
        variant_id="0123456789abcdef",
        params={"BLOCK": 256, "VEC": 8},
        shapes=(
            _shape(1, 0.004, 0.008, candidate_iqr_ms=0.0002, bytes_moved=24576, repetitions=100),
            _shape(4096, 0.09, 0.18, copy_bw_fraction=0.93, repetitions=100),
        ),
        registers=24,
        smem_bytes=0,
        compile_s=0.2,
        eval_s=3.5,
        noise_floor=0.01,
        extra={"tuned_trials": 12},
    )


def test_shape_speedup_is_baseline_over_candidate() -> None:
    assert _shape(1, 0.05, 0.1).speedup == pytest.approx(2.0)
    assert _shape(1, 0.2, 0.1).speedup == pytest.approx(0.5)


def test_shape_speedup_clamps_the_candidate_at_the_roofline() -> None:
    # A time below what the bytes moved allow cannot count for more than the roofline.
    assert _shape(1, 0.001, 0.1, roofline_ms=0.05).speedup == pytest.approx(2.0)
    assert _shape(1, 0.08, 0.1, roofline_ms=0.05).speedup == pytest.approx(1.25)


@pytest.mark.parametrize(("candidate_ms", "roofline_ms"), [(0.0, 0.0), (-1.0, 0.0), (math.nan, 0.0), (0.0, math.nan)])
def test_shape_without_a_positive_time_is_refused_at_construction(candidate_ms: float, roofline_ms: float) -> None:
    with pytest.raises(ValueError, match="positive time"):
        _shape(1, candidate_ms, 0.1, roofline_ms=roofline_ms)


def test_shape_with_zero_candidate_time_still_counts_at_the_roofline() -> None:
    assert _shape(1, 0.0, 0.1, roofline_ms=0.05).speedup == pytest.approx(2.0)


def test_evaluation_speedup_is_the_geomean_of_shape_speedups() -> None:
    assert _evaluation().speedup == pytest.approx(2.0)
    mixed = Evaluation(Status.OK, shapes=(_shape(1, 1.0, 4.0), _shape(2, 1.0, 1.0)))
    assert mixed.speedup == pytest.approx(2.0)


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.OK])
def test_failed_evaluations_have_no_speedup(status: Status) -> None:
    evaluation = Evaluation(status, message="why", shapes=(_shape(1, 1.0, 2.0),))
    assert evaluation.speedup is None
    assert not status.is_ok
    assert evaluation.to_dict()["speedup"] is None


def test_ok_without_shapes_has_no_speedup() -> None:
    assert Evaluation(Status.OK).speedup is None


def test_evaluation_survives_a_json_round_trip() -> None:
    original = _evaluation()
    record = json.loads(json.dumps(original.to_dict()))
    assert record["status"] == "OK"
    assert record["speedup"] == pytest.approx(2.0)
    assert record["shapes"][0]["speedup"] == pytest.approx(2.0)
    restored = Evaluation.from_dict(record)
    assert restored == original
    assert isinstance(restored.status, Status)
    assert isinstance(restored.shapes, tuple)
    assert all(isinstance(s, ShapeResult) for s in restored.shapes)


def test_failed_evaluation_survives_a_json_round_trip() -> None:
    original = Evaluation(Status.COMPILE_ERROR, message="variant.cu(5): error: ...", kernel="rmsnorm")
    assert Evaluation.from_dict(json.loads(json.dumps(original.to_dict()))) == original


def test_from_dict_ignores_fields_it_does_not_know() -> None:
    record = _evaluation().to_dict()
    record["added_in_a_later_version"] = {"anything": [1, 2]}
    record["shapes"][1]["p99_ms"] = 0.2
    assert Evaluation.from_dict(record) == _evaluation()


def test_from_dict_fills_defaults_for_fields_an_old_record_lacks() -> None:
    restored = Evaluation.from_dict({"status": "TIMEOUT", "message": "watchdog fired after 30 s"})
    assert restored.status is Status.TIMEOUT
    assert restored.shapes == ()
    assert restored.params == {}
    shape = ShapeResult.from_dict({"shape": {"n": 1}, "candidate_ms": 1.0, "baseline_ms": 3.0})
    assert shape.speedup == pytest.approx(3.0)


def test_status_serialises_as_its_name() -> None:
    for status in Status:
        assert Status(status.value) is status
        assert json.loads(json.dumps({"s": status}))["s"] == status.value
