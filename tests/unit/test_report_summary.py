"""search.report: the summary reads the records through EvalRecord and takes no peer ratio
for an implementation that failed verification in the peers' loop."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from kernels.folders import KernelRef
from kernels.records import EvalRecord, Stage
from kernels.spec import kernel_ref
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status
from search.records import RunRecords
from search.report import build_summary, print_summary, write_tables

K = "silu_and_mul"
SHAPES = ({"num_tokens": 1, "d": 4096}, {"num_tokens": 64, "d": 4096})
LABELS = ("[1, 4096]", "[64, 4096]")


def _evaluation(status: Status = Status.OK) -> Evaluation:
    shapes = tuple(ShapeResult(shape=s, candidate_ms=0.5, baseline_ms=1.0) for s in SHAPES) if status.is_ok else ()
    return Evaluation(status=status, kernel=K, dtype="float16", shapes=shapes)


def _result(winner: Variant, **extra: Any) -> SimpleNamespace:
    state = SimpleNamespace(name=K, dtype="float16", ref=kernel_ref(K), lineage=lambda vid: [
        {"id": vid, "author": "a", "note": "n", "transformation": ""}])
    peers = {"best": dict.fromkeys(LABELS, 0.5), "torch_compile": dict.fromkeys(LABELS, 0.6),
             "flashinfer": dict.fromkeys(LABELS, 0.4)}
    fields = {"peer_failures": {}, "rejected_why": {}, **extra}
    return SimpleNamespace(state=state, winner=SimpleNamespace(variant=winner, params={}, score=2.0),
                           heldout=_evaluation(), final=_evaluation(), peers=peers, peer_errors={},
                           rejected=[], sanitizer={}, **fields)


@pytest.fixture
def run_dir(tmp_path: Path) -> tuple[Path, Variant]:
    winner = Variant(K, "// winner\n")
    rec = RunRecords(tmp_path / "run", "r")
    for i, (stage, status) in enumerate([(Stage.SCREEN, Status.OK), (Stage.SCREEN, Status.INCORRECT),
                                         (Stage.FULL, Status.OK)]):
        variant = winner if status.is_ok else Variant(K, f"// loser {i}\n")
        rec.evaluation(EvalRecord("r", K, "float16", 0, "a", stage, i, variant, _evaluation(status)))
    rec.close()
    return tmp_path / "run", winner


def test_summary_counts_from_typed_records_and_ratios_from_the_loop(run_dir):
    path, winner = run_dir
    k = build_summary(path, [_result(winner)], {"run_id": "r"})["kernels"][0]
    assert (k["variants_evaluated"], k["trials_evaluated"], k["evaluations"]) == (2, 2, 3)
    assert KernelRef.from_dict(k["kernel_ref"]) == kernel_ref(K)  # reports find the folder through it
    assert k["speedup_over_peers"] == {"torch_compile": pytest.approx(1.2), "flashinfer": pytest.approx(0.8)}
    assert k["peer_failures"] == {}


def test_a_peer_that_failed_verification_gets_no_ratio(run_dir):
    path, winner = run_dir
    k = build_summary(path, [_result(winner, peer_failures={"flashinfer": "out[3] differs"})], {})["kernels"][0]
    assert k["speedup_over_peers"] == {"torch_compile": pytest.approx(1.2)}
    assert all("flashinfer" not in s["loop_ms"] for s in k["shapes"])
    assert k["peer_failures"] == {"flashinfer": "out[3] differs"}


def test_the_summary_takes_peer_failures_from_the_real_kernel_result():
    from search.finalize import KernelResult

    assert "peer_failures" in {f.name for f in dataclasses.fields(KernelResult)}


def test_when_our_winner_failed_verification_in_the_loop_no_ratio_is_taken(run_dir):
    path, winner = run_dir
    summary = build_summary(path, [_result(winner, peer_failures={"best": "NaN in out"})], {})
    k = summary["kernels"][0]
    assert k["speedup_over_peers"] == {}
    assert all("best" not in s["loop_ms"] for s in k["shapes"])
    text = io.StringIO()
    print_summary(summary, text)
    assert "best failed verification in the peers' loop" in text.getvalue() and "vs torch_compile" not in text.getvalue()


def test_tables_come_from_typed_records(run_dir):
    path, _ = run_dir
    evals, _ = write_tables(path)
    table = pl.read_parquet(evals)
    assert table["status"].to_list() == ["OK", "INCORRECT", "OK"]
    assert table["stage"].to_list() == ["screen", "screen", "full"]
    assert table["speedup"].to_list()[0] == pytest.approx(2.0)


def _loop(best: float, baseline: float, compiled: float) -> dict[str, dict[str, float]]:
    return {"best": dict.fromkeys(LABELS, best), "baseline": dict.fromkeys(LABELS, baseline),
            "torch_compile": dict.fromkeys(LABELS, compiled)}


def test_three_loops_give_medians_ranges_per_kernel_and_per_shape_and_the_print_says_which_time(run_dir):
    path, winner = run_dir
    runs = [_loop(0.5, 1.0, 0.55), _loop(0.5, 1.1, 0.45), _loop(0.5, 0.9, 0.6)]  # vs torch.compile 1.1, 0.9, 1.2
    summary = build_summary(path, [_result(winner, peer_runs=runs)], {"run_id": "r"})
    k = summary["kernels"][0]
    assert k["peer_runs"] == 3 and k["speedup_search_source"] == "loop"
    assert k["speedup_search"] == pytest.approx(2.0)  # the median loop's baseline / best, not the evaluator's
    tc = k["spreads"]["torch_compile"]
    assert (tc["median"], tc["low"], tc["high"], tc["verdict"]) == (pytest.approx(1.1), pytest.approx(0.9),
                                                                    pytest.approx(1.2), "tie")
    for s in k["shapes"]:  # each shape carries its own ratios over the loops
        assert s["loop_spreads"]["baseline"]["low"] == pytest.approx(1.8)
        assert s["loop_spreads"]["torch_compile"]["verdict"] == "tie"
    text = io.StringIO()
    print_summary(summary, text)
    out = text.getvalue()
    assert "times: kernel times" in out and "CUDA-graph replay" in out and "evaluator (one run)" in out
    assert "vs baseline (search shapes): 2.000x [1.800-2.200] faster (loop)" in out
    assert "vs torch_compile: 1.100x [0.900-1.200] tie" in out
    assert "median over 3 end-of-run loop(s)" in out


def test_without_loops_the_print_says_the_ratio_is_the_evaluators_single_run(run_dir):
    path, winner = run_dir
    summary = build_summary(path, [_result(winner)], {})
    text = io.StringIO()
    print_summary(summary, text)
    assert "(evaluator, one run)" in text.getvalue() and "(one run, no spread)" in text.getvalue()
