"""The model benchmark's independent runs: argument forwarding, combining, reporting (CPU)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from experiments import model_bench
from experiments.model_bench_runs import RunFailed, combine, run_children

CONFIG_NAMES = ("torch", "torch.compile", "shipped", "shipped+compile")


def synthetic_row(phase: str, tokens: int, torch_ms: float, shipped_ms: float, compile_ms: float,
                  shipped_compile_ms: float, rel_l2: float = 1e-3, share: float | None = 0.05) -> dict[str, Any]:
    """One run's row in the shape :func:`experiments.model_bench.bench_case` writes."""
    ms = dict(zip(CONFIG_NAMES, (torch_ms, compile_ms, shipped_ms, shipped_compile_ms), strict=True))
    return {
        "phase": phase, "tokens": tokens, "ms": ms, "ms_min_max": {c: [v, v] for c, v in ms.items()},
        "shipped_over_torch": torch_ms / shipped_ms, "shipped_compile_over_compile": compile_ms / shipped_compile_ms,
        "agreement": {c: {"rel_l2": rel_l2, "max_abs": rel_l2 * 10, "ok": rel_l2 <= model_bench.AGREEMENT_REL_L2}
                      for c in CONFIG_NAMES[1:]},
        "profile": {c: {"share": share, "kernel_us_per_step": 100.0, "swapped_us_per_step": {"silu_and_mul": 5.0}}
                    for c in ("shipped", "shipped+compile")},
    }


def synthetic_meta(date: str = "2026-01-01T00:00:00+00:00") -> dict[str, Any]:
    return {"command": "python -m experiments.model_bench --runs 1", "git_commit": "abc", "gpu": "Test GPU",
            "date": date, "torch": "2.x", "package": "pkg/kernel_ops", "arch": "sm_90", "nvrtc": "13.0",
            "dtype": "bfloat16", "context": 16, "repeats": 5, "runs": 1, "model": "2 layers", "evidence": {}}


# Three runs: decode 1 clearly faster vs torch, a tie (0.98, 1.00, 1.03) vs torch.compile;
# prefill slower vs torch in every run. Shipped times vary so the ratios vary.
THREE_RUNS = [
    {"meta": synthetic_meta(), "rows": [
        synthetic_row("decode", 1, 1.50, 1.00, 1.00, 1.00 / 0.98, rel_l2=1e-3, share=0.05),
        synthetic_row("prefill", 64, 2.00, 2.50, 3.00, 3.00)]},
    {"meta": synthetic_meta(), "rows": [
        synthetic_row("decode", 1, 1.40, 1.00, 1.00, 1.00 / 1.03, rel_l2=5e-3, share=0.07),
        synthetic_row("prefill", 64, 2.00, 2.20, 3.00, 3.00)]},
    {"meta": synthetic_meta(), "rows": [  # rows in another order: matched by phase and tokens
        synthetic_row("prefill", 64, 2.00, 2.40, 3.00, 3.00),
        synthetic_row("decode", 1, 1.30, 1.00, 1.00, 1.00, rel_l2=2e-3, share=None)]},
]


def test_combined_ratios_are_the_median_and_range_of_the_runs_ratios():
    decode, prefill = combine(THREE_RUNS)
    assert (decode["phase"], decode["tokens"], prefill["phase"]) == ("decode", 1, "prefill")
    vs_torch = decode["spreads"]["shipped_over_torch"]
    assert vs_torch["median"] == pytest.approx(1.40) and vs_torch["low"] == pytest.approx(1.30)
    assert vs_torch["high"] == pytest.approx(1.50) and vs_torch["runs"] == 3 and vs_torch["verdict"] == "faster"
    assert decode["shipped_over_torch"] == pytest.approx(1.40)
    vs_compile = decode["spreads"]["shipped_compile_over_compile"]
    assert (vs_compile["low"], vs_compile["median"], vs_compile["high"]) == pytest.approx((0.98, 1.00, 1.03))
    assert vs_compile["verdict"] == "tie"
    assert prefill["spreads"]["shipped_over_torch"]["verdict"] == "slower"
    assert prefill["spreads"]["shipped_over_torch"]["high"] == pytest.approx(2.00 / 2.20)


def test_combined_times_are_the_median_of_the_runs_medians():
    decode, prefill = combine(THREE_RUNS)
    assert decode["ms"]["torch"] == pytest.approx(1.40)
    assert prefill["ms"]["shipped"] == pytest.approx(2.40)
    assert prefill["ms_per_run"]["shipped"] == pytest.approx([2.50, 2.20, 2.40])


def test_agreement_is_the_worst_run_and_the_share_the_median_of_the_runs_that_have_one():
    decode, _ = combine(THREE_RUNS)
    assert decode["agreement"]["shipped"]["rel_l2"] == pytest.approx(5e-3) and decode["agreement"]["shipped"]["ok"]
    assert decode["profile"]["shipped"]["share"] == pytest.approx(0.06)
    assert decode["profile"]["shipped"]["share_min_max"] == pytest.approx([0.05, 0.07])
    bad = json.loads(json.dumps(THREE_RUNS))
    bad[1]["rows"][0]["agreement"]["shipped"]["ok"] = False
    assert combine(bad)[0]["agreement"]["shipped"]["ok"] is False


def test_runs_that_measured_different_cases_are_refused():
    short = [THREE_RUNS[0], {"meta": synthetic_meta(), "rows": THREE_RUNS[1]["rows"][:1]}]
    with pytest.raises(ValueError, match="run 2 measured"):
        combine(short)


def test_each_run_gets_the_parents_settings_one_run_and_its_own_out(tmp_path: Path):
    parser = model_bench.build_parser()
    args = parser.parse_args(["--package", "pkgdir", "--name", "ops", "--dtype", "float16", "--layers", "2",
                              "--batch-sizes", "1,8", "--context", "512", "--prefill", "0", "--repeats", "7",
                              "--runs", "5", "--out", "final"])
    child = parser.parse_args(model_bench.child_argv(args, tmp_path / "run-1"))
    assert child.runs == 1 and child.out == tmp_path / "run-1"
    assert {**vars(child), "runs": args.runs, "out": args.out} == vars(args)


def test_markdown_prints_the_spread_or_says_there_is_none():
    rows = combine(THREE_RUNS)
    many = model_bench.to_markdown({**synthetic_meta(), "runs": 3}, rows)
    assert "3 independent runs" in many and "(one run, no spread)" not in many
    assert "| 1.400x [1.300-1.500] faster |" in many and "1.000x [0.980-1.030] tie" in many
    one = model_bench.to_markdown(synthetic_meta(), THREE_RUNS[0]["rows"])
    assert "- one run: one process" in one and "| 1.500x (one run, no spread) |" in one


FAKE_RUN = """
import json, os, sys
from pathlib import Path
out = Path(sys.argv[1])
i = int(out.name.split("-")[1])
rows = json.loads(sys.argv[2])
out.mkdir(parents=True)
meta = json.loads(sys.argv[3])
meta["date"] = f"date-{i}"
meta["pid"] = os.getpid()
(out / "model-bench.json").write_text(json.dumps({"meta": meta, "rows": rows[i - 1]}))
"""


def test_the_parent_runs_fresh_processes_and_combines_what_they_write():
    rows_per_run = json.dumps([run["rows"] for run in THREE_RUNS])

    def fake(out: Path) -> list[str]:
        return [sys.executable, "-c", FAKE_RUN, str(out), rows_per_run, json.dumps(synthetic_meta())]

    args = model_bench.build_parser().parse_args(["--package", "p", "--runs", "3"])
    meta, rows = model_bench.run_independent(args, "python -m experiments.model_bench --package p", fake)
    assert meta["runs"] == 3 and meta["run_dates"] == ["date-1", "date-2", "date-3"]
    assert meta["command"] == "python -m experiments.model_bench --package p"
    assert meta["pid"] != os.getpid()
    assert rows == combine(THREE_RUNS)
    assert [len(r) for r in meta["per_run_rows"]] == [2, 2, 2]


def test_a_run_that_writes_nothing_stops_the_benchmark():
    def failing(out: Path) -> list[str]:
        return [sys.executable, "-c", "import sys; sys.exit(2)"]

    with pytest.raises(RunFailed, match="run 1 of 2 exited with code 2"):
        run_children(failing, 2, echo=lambda _: None)


def test_fewer_than_one_run_is_refused(capsys: pytest.CaptureFixture[str]):
    assert model_bench.main(["--package", "p", "--runs", "0"]) == 2
    assert capsys.readouterr().err == "error: --runs must be at least 1\n"


def test_without_a_gpu_the_parent_stops_before_starting_runs(capsys: pytest.CaptureFixture[str]):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert model_bench.main(["--package", "p", "--runs", "3"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1 and "run 1/" not in captured.out


def test_a_run_started_as_its_own_process_stops_with_one_line_without_a_gpu(tmp_path: Path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    args = model_bench.build_parser().parse_args(["--package", str(tmp_path / "pkg"), "--runs", "2"])
    with pytest.raises(RunFailed, match="run 1 of 1 exited with code 2"):
        run_children(lambda out: model_bench.child_command(args, out), 1, cwd=tmp_path, echo=lambda _: None)
