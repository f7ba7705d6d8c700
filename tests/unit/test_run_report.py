"""The run's written report: report.md in every run directory, every dispatch member's
source beside the winner's, a stand-in run's summary that says its times are synthetic, and
a progress line that says what it waits for and which speedup it shows."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

from search.progress import Progress
from search.report import print_summary
from search.run_report import REPORT_FILE, dispatch_lines, write_member_sources, write_run_report

SHAPES = [{"label": "[1, 4096]", "baseline_ms": 1.0, "best_ms": 0.5, "speedup": 2.0, "copy_bw_fraction": 0.1,
           "loop_ms": {}}, {"label": "[64, 4096]", "baseline_ms": 2.0, "best_ms": 1.0, "speedup": 2.0,
                            "copy_bw_fraction": 0.2, "loop_ms": {}}]
DISPATCH = {"members": [{"variant_id": "aaaa", "params": {}}, {"variant_id": "bbbb", "params": {"BLOCK": 256}}],
            "table": {"[1, 4096]": 1, "[64, 4096]": 0}}


def _summary(evaluator: str, dispatch: dict | None = None) -> dict:
    kernel = {"kernel": "silu_and_mul", "dtype": "float16", "winner": "aaaa", "params": {}, "dispatch": dispatch,
              "final_status": "OK", "heldout_status": "OK", "speedup_search": 2.0, "speedup_heldout": 1.9,
              "noise_floor": None, "shapes": SHAPES, "speedup_over_peers": {}, "spreads": {}, "peer_runs": 0,
              "l2_findings": [], "peer_errors": {}, "peer_failures": {}, "rejected_on_heldout": [],
              "variants_evaluated": 3, "trials_evaluated": 5, "sanitizer_status": "SKIPPED",
              "lineage": [{"id": "aaaa", "author": "agent-0", "note": "vec", "transformation": ""},
                          {"id": "base", "author": "baseline", "note": "baseline", "transformation": ""}]}
    out = {"run_id": "r1", "evaluator": evaluator, "gpu": "cpu-standin" if evaluator == "standin" else "H100",
           "wall_s": 3.0, "gpu_busy_fraction": 0.5, "kernels": [kernel], "command": "python -m search.run"}
    if evaluator == "standin":
        out["warning"] = "STAND-IN EVALUATOR: synthetic numbers"
    return out


def _printed(summary: dict) -> str:
    text = io.StringIO()
    print_summary(summary, text)
    return text.getvalue()


def test_a_standin_summary_says_synthetic_and_drops_the_gpu_protocol():
    out = _printed(_summary("standin"))
    assert "synthetic" in out and "baseline (synthetic)" in out
    for gpu_words in ("CUDA event", "L2", "noise floor", "ratios:", "vs baseline"):
        assert gpu_words not in out, gpu_words
    gpu = _printed(_summary("gpu"))
    assert "CUDA events" in gpu and "speedups: 'best screened' on the progress line is the screening score" in gpu


def test_dispatch_members_are_written_beside_the_winner_and_named_in_the_report(tmp_path: Path):
    best = tmp_path / "best"
    best.mkdir()
    members = [{"variant": {"source": "// member 0\n"}}, {"variant": {"source": "// member 1\n"}}]
    (best / "silu_and_mul.json").write_text(json.dumps({"kernel": "silu_and_mul", "dispatch": {"members": members}}))
    assert write_member_sources(tmp_path) == [best / "silu_and_mul.member1.cu"]
    assert (best / "silu_and_mul.member1.cu").read_text() == "// member 1\n"
    lines = dispatch_lines(_summary("gpu", DISPATCH)["kernels"][0])
    assert lines[1].endswith("in best/silu_and_mul.cu, shapes [64, 4096]")
    assert lines[2].endswith("in best/silu_and_mul.member1.cu, shapes [1, 4096]") and "{'BLOCK': 256}" in lines[2]
    assert "best/silu_and_mul.member1.cu" in _printed(_summary("gpu", DISPATCH))


def test_every_run_gets_a_report_md(tmp_path: Path):
    path = write_run_report(tmp_path, _summary("standin", DISPATCH), print_summary)
    assert path == tmp_path / REPORT_FILE
    text = path.read_text()
    assert text.startswith("# Run r1") and "**STAND-IN EVALUATOR: synthetic numbers**" in text
    assert "`best/silu_and_mul.cu`" in text and "best/silu_and_mul.member1.cu" in text
    assert "```\n!! STAND-IN" in text  # the printed summary, verbatim


def test_the_progress_line_says_what_it_waits_for_and_which_speedup_it_shows():
    st = SimpleNamespace(rounds_done=0, baseline_scored=object(), name="k", best=lambda: SimpleNamespace(score=1.25))
    ctl = SimpleNamespace(states=[st], config=SimpleNamespace(search=SimpleNamespace(rounds=2)), cache={"a": 1},
                          start=0.0, pool=SimpleNamespace(busy_s=0.0),
                          waiting=lambda: {"agent answer": 8, "compile": 1})
    line = Progress(stream=io.StringIO(), evaluator_kind="standin").line(ctl)
    assert "best screened k=1.250x" in line and line.endswith("| waiting for 8 agent answers, 1 compile")
    ctl.waiting = dict
    assert "waiting" not in Progress(stream=io.StringIO()).line(ctl)
