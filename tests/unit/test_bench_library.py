"""The library benchmark's results, table, merge and plot, fed with a synthetic peers reply.

The timing itself needs a GPU (the marked test at the end); everything that turns a reply
into numbers, markdown and a PNG runs here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evaluators.gpu import EvaluatorError
from experiments import bench_library
from experiments.bench_library import (
    bench_kernel,
    find_best,
    kernel_result,
    main,
    merge,
    plot_kernel,
    to_markdown,
    write_outputs,
)
from kernels.spec import load_kernel, shape_label

COPY_BW = 4.0e12
META = {"command": "python -m experiments.bench_library --kernel silu_and_mul", "git_commit": "abc1234",
        "gpu": "NVIDIA H200", "date": "2026-11-30T00:00:00+00:00", "best_dir": "runs/sweep-x", "timing": "t"}


def _reply(times_us: dict[str, float], skip: tuple[str, str] | None = None) -> dict[str, Any]:
    """Every implementation at a fixed time on every search shape of silu_and_mul."""
    labels = [shape_label(s) for s in load_kernel("silu_and_mul").shapes("search")]
    peers = {name: {lab: us / 1e3 for lab in labels if (name, lab) != skip} for name, us in times_us.items()}
    return {"peers": peers, "iqr": {n: dict.fromkeys(v, 1e-4) for n, v in peers.items()},
            "errors": {"liger": "ModuleNotFoundError: No module named 'liger_kernel'"}, "copy_bw_bytes_per_s": COPY_BW}


@pytest.fixture
def result() -> dict[str, Any]:
    reply = _reply({"baseline": 30.0, "best": 10.0, "torch_compile": 20.0, "torch_eager": 40.0, "flashinfer": 9.0})
    return kernel_result(load_kernel("silu_and_mul"), "float16", "search", reply, {"variant_id": "v1", "source": "s.cu"})


def test_kernel_result_has_a_row_per_shape_with_bandwidth_and_speedups(result):
    spec = load_kernel("silu_and_mul")
    shapes = spec.shapes("search")
    assert [r["label"] for r in result["rows"]] == [shape_label(s) for s in shapes]
    row, shape = result["rows"][-1], shapes[-1]
    nbytes = spec.bytes_moved(shape, "float16")
    best = row["impl"]["best"]
    assert best["median_us"] == pytest.approx(10.0) and best["iqr_us"] == pytest.approx(0.1)
    assert best["copy_bw_fraction"] == pytest.approx(nbytes / 10e-6 / COPY_BW)
    s = result["summary"]
    assert s["ours"] == "best"
    assert s["speedup_over"] == pytest.approx({"baseline": 3.0, "torch_compile": 2.0, "torch_eager": 4.0,
                                               "flashinfer": 0.9})
    largest = max(shapes, key=lambda sh: spec.bytes_moved(sh, "float16"))
    assert s["largest_shape"] == shape_label(largest)
    assert result["peer_errors"] == {"liger": "ModuleNotFoundError: No module named 'liger_kernel'"}


def test_without_a_best_kernel_the_baseline_is_ours_and_missing_shapes_are_left_out():
    spec = load_kernel("silu_and_mul")
    first = shape_label(spec.shapes("search")[0])
    reply = _reply({"baseline": 10.0, "torch_compile": 5.0}, skip=("torch_compile", first))
    r = kernel_result(spec, "float16", "search", reply, None)
    assert r["summary"]["ours"] == "baseline" and r["summary"]["speedup_over"] == {"torch_compile": pytest.approx(0.5)}
    assert "torch_compile" not in r["rows"][0]["impl"] and "torch_compile" in r["rows"][1]["impl"]


def test_markdown_names_the_run_and_every_implementation(result):
    md = to_markdown({**META, "failed": {"rmsnorm float16": "best does not compile"}}, [result])
    for fact in ("`python -m experiments.bench_library --kernel silu_and_mul`", "abc1234", "NVIDIA H200",
                 "2026-11-30", "vs torch_compile", "vs flashinfer", "Not timed: liger", "rmsnorm float16"):
        assert fact in md, fact
    summary_line = next(line for line in md.splitlines() if line.startswith("| silu_and_mul | float16"))
    # one loop: the figures say they have no spread
    assert "| best | 1 |" in summary_line and "2.000x (one run, no spread)" in summary_line
    assert "0.900x (one run, no spread)" in summary_line
    assert md.count("| [") == len(result["rows"])  # one line per shape


def test_merge_replaces_the_same_kernel_and_dtype_and_keeps_the_rest(result):
    old = [{**result, "summary": {"old": True}}, {**result, "kernel": "rmsnorm"}]
    merged = merge(old, [result])
    assert [(r["kernel"], r["dtype"]) for r in merged] == [("rmsnorm", "float16"), ("silu_and_mul", "float16")]
    assert merged[1]["summary"] == result["summary"]


def test_find_best_reads_a_sweep_or_run_directory(tmp_path):
    run = tmp_path / "sweep" / "sweep-1"
    (run / "best").mkdir(parents=True)
    (run / "best" / "rmsnorm.cu").write_text("// source")
    (run / "best" / "rmsnorm.json").write_text(json.dumps({"dtype": "float16", "params": {"BLOCK": 256}}))
    for where in (tmp_path / "sweep", run):
        found = find_best(where, "rmsnorm")
        assert found is not None and found[0].read_text() == "// source" and found[1]["params"] == {"BLOCK": 256}
    assert find_best(run, "silu_and_mul") is None and find_best(None, "rmsnorm") is None


class _RecordingTimer:
    """Answers time_peers_full like the GPU evaluator would, and keeps what it was asked.

    ``loops``: what each successive call answers, as {implementation: us} on every shape, a
    reply's ``failed`` entries as ``{"failed": {...}}`` merged in, or an exception to raise;
    past the end, every implementation of ours and torch.compile at 10 us.
    """

    def __init__(self, loops: list[Any] | None = None) -> None:
        self.ours: dict[str, Any] = {}
        self.loops = list(loops or [])
        self.fresh: list[bool] = []

    def time_peers_full(self, kernel: str, dtype: str, shape_set: str, ours: dict[str, Any],
                        repetitions: int = 100, graph_ours: bool = False, fresh_process: bool = False) -> dict[str, Any]:
        self.ours = ours
        self.fresh.append(fresh_process)
        loop = self.loops.pop(0) if self.loops else {**dict.fromkeys(ours, 10.0), "torch_compile": 10.0}
        if isinstance(loop, Exception):
            raise loop
        failed = loop.pop("failed", {})
        return {**_reply(loop), "failed": failed}


def _best_dir(tmp_path: Path) -> Path:
    best = tmp_path / "best"
    best.mkdir(exist_ok=True)
    (best / "silu_and_mul.cu").write_text(load_kernel("silu_and_mul").baseline_source())
    (best / "silu_and_mul.json").write_text(json.dumps({"dtype": "float16", "params": {}, "variant": {"id": "v9"}}))
    return tmp_path


def test_every_ratio_is_the_median_of_three_fresh_loops_with_its_range(tmp_path):
    loops = [{"baseline": 30.0, "best": 10.0, "torch_compile": 11.0},
             {"baseline": 33.0, "best": 11.0, "torch_compile": 9.9},
             {"baseline": 24.0, "best": 8.0, "torch_compile": 9.6}]  # vs torch.compile 1.1, 0.9, 1.2
    timer = _RecordingTimer(loops)
    r = bench_kernel(timer, "silu_and_mul", "float16", "search", _best_dir(tmp_path), 100, repeats=3)
    assert timer.fresh == [True, True, True]  # each loop in a fresh sandbox process
    assert r["loops"] == 3 and len(r["loop_runs_ms"]) == 3
    s = r["summary"]
    assert s["speedup_over"]["baseline"] == pytest.approx(3.0)
    tc = s["spreads"]["torch_compile"]
    assert (tc["median"], tc["low"], tc["high"], tc["runs"], tc["verdict"]) == (
        pytest.approx(1.1), pytest.approx(0.9), pytest.approx(1.2), 3, "tie")
    assert s["speedup_over"]["torch_compile"] == pytest.approx(1.1)  # the median loop, not one loop's figure
    assert r["rows"][0]["impl"]["best"]["median_us"] == pytest.approx(10.0)  # per shape: median time over loops
    line = next(x for x in to_markdown(META, [r]).splitlines() if x.startswith("| silu_and_mul | float16"))
    assert "| best | 3 |" in line and "1.100x [0.900-1.200] tie" in line and "3.000x [3.000-3.000] faster" in line


def test_a_failed_loop_is_recorded_and_a_kernel_failing_in_any_loop_gets_no_times(tmp_path):
    loops = [{"baseline": 30.0, "best": 10.0, "torch_compile": 20.0},
             EvaluatorError("worker crashed"),
             {"baseline": 30.0, "torch_compile": 20.0, "failed": {"best": "INCORRECT: out[3] differs"}}]
    r = bench_kernel(_RecordingTimer(loops), "silu_and_mul", "float16", "search", _best_dir(tmp_path), 100)
    assert r["peer_errors"]["loop (run 2)"] == "worker crashed"
    assert r["ours_failed"] == {"best": "run 3: INCORRECT: out[3] differs"}
    assert all("best" not in row["impl"] for row in r["rows"])  # its times of loop 1 are dropped too
    assert r["summary"]["ours"] == "baseline" and r["loops"] == 2
    assert r["summary"]["spreads"]["torch_compile"]["runs"] == 2


def test_no_loop_at_all_fails_the_kernel(tmp_path):
    with pytest.raises(EvaluatorError, match="worker crashed"):
        bench_kernel(_RecordingTimer([EvaluatorError("worker crashed")] * 3), "silu_and_mul", "float16", "search",
                     None, 100)


def test_main_takes_repeats_and_writes_the_ranges(tmp_path, monkeypatch):
    import evaluators.gpu

    timers: list[_RecordingTimer] = []

    class _Evaluator(_RecordingTimer):
        def __init__(self, **_: object) -> None:
            super().__init__()
            timers.append(self)

        def info(self) -> dict[str, str]:
            return {"gpu": "test GPU"}

        def close(self) -> None:
            pass

    monkeypatch.setattr(bench_library, "exit_without_gpu", lambda program: None)
    monkeypatch.setattr(evaluators.gpu, "GpuEvaluator", _Evaluator)
    out = tmp_path / "lib"
    assert main(["--kernel", "silu_and_mul", "--repeats", "4", "--out", str(out), "--no-plots"]) == 0
    assert timers[0].fresh == [True] * 4
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["meta"]["repeats"] == 4 and "4 fresh sandbox processes" in data["meta"]["timing"]
    assert data["results"][0]["loops"] == 4
    assert "[1.000-1.000] tie" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("best_dtype, timed", [("float16", ["baseline", "best"]), ("bfloat16", ["baseline"])])
def test_the_best_kernel_is_timed_only_in_the_dtype_it_was_validated_in(tmp_path, best_dtype, timed):
    best = tmp_path / "best"
    best.mkdir()
    source = load_kernel("silu_and_mul").baseline_source()
    (best / "silu_and_mul.cu").write_text(source)
    (best / "silu_and_mul.json").write_text(json.dumps({"dtype": best_dtype, "params": {}, "variant": {"id": "v9"}}))
    timer = _RecordingTimer()
    r = bench_kernel(timer, "silu_and_mul", "float16", "search", tmp_path, 100)
    assert list(timer.ours) == timed
    assert (r["best"] or {}).get("variant_id") == ("v9" if "best" in timed else None)


def test_write_outputs_without_plots(tmp_path, result):
    files = write_outputs(tmp_path / "out" / "sweep-h200", META, [result], plots=False)
    assert [f.name for f in files] == ["sweep-h200.json", "sweep-h200.md"]
    assert json.loads(files[0].read_text())["results"][0]["summary"] == result["summary"]


def test_plot_is_a_png_with_the_timing_in_its_title(tmp_path, result):
    pytest.importorskip("matplotlib", reason="matplotlib is the optional 'plots' extra; not installed here")
    path = plot_kernel(result, tmp_path / "silu.png", "NVIDIA H200")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
def test_bench_library_on_the_gpu(tmp_path):
    out = tmp_path / "bench"
    assert main(["--kernel", "silu_and_mul", "--repetitions", "20", "--repeats", "3", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    result = data["results"][0]
    row = result["rows"][0]
    assert {"baseline", "torch_eager", "torch_compile"} <= set(row["impl"])
    assert result["loops"] == 3 and result["summary"]["spreads"]["torch_compile"]["runs"] == 3
    print(to_markdown(data["meta"], data["results"]))
    assert data["meta"]["gpu"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert Path(str(out) + "-silu_and_mul-float16.png").is_file()
