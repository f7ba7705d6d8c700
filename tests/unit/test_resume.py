"""Reproducible runs and exact resume, on the CPU (local Ray, stand-in evaluator, toy agent).

- the same seed gives the same records, proposal for proposal and evaluation for evaluation
  (whatever order Ray returned results in);
- resuming a finished run evaluates nothing and rewrites nothing;
- a run cut short (its records truncated at one moment, as a kill leaves them) and resumed
  ends with the same records as the uninterrupted run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from kernels.records import read_jsonl
from kernels.spec import shape_label
from search.run import Prepared, build_parser, resolve_config, resolve_kernels, run_search

TOY = "tests.unit.search_toy_agent:ToyAgent"
RECORD_FILES = ("evaluations", "proposals", "replies", "rounds")
# Fields that differ between two runs of the same search: clocks, run ids and durations.
VOLATILE = {"time", "busy_s", "compile_s", "eval_s", "run_id", "key"}


def _prepare(run_dir: Path, *extra: str) -> Prepared:
    args = build_parser().parse_args(
        ["--evaluator", "standin", "--kernel", "silu_and_mul", "--agent", TOY, "--population", "3",
         "--rounds", "3", "--variants", "3", "--trials", "3", "--seed", "7", "--out", str(run_dir.parent), *extra]
    )
    config = resolve_config(args)
    run_dir.mkdir(parents=True)
    return Prepared(config, resolve_kernels(config), run_dir, resume=False)


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _normalised(run_dir: Path) -> dict[str, list[str]]:
    """Each record file as a sorted list of lines without volatile fields (the order of lines
    follows Ray's timing; their content must not)."""
    return {name: sorted(json.dumps(_strip(d), sort_keys=True) for d in read_jsonl(run_dir / f"{name}.jsonl"))
            for name in RECORD_FILES}


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_same_seed_gives_the_same_records(local_ray, tmp_path):
    first = _prepare(tmp_path / "a")
    second = _prepare(tmp_path / "b")
    summary_a = run_search(first, "test")
    summary_b = run_search(second, "test")
    a, b = _normalised(first.run_dir), _normalised(second.run_dir)
    assert len(a["evaluations"]) > 10 and len(a["replies"]) == 3 * 3
    for name in RECORD_FILES:
        assert a[name] == b[name], f"{name}.jsonl differs between two runs with the same seed"
    assert summary_a["kernels"][0]["winner"] == summary_b["kernels"][0]["winner"]
    shutil.rmtree(tmp_path / "b")


def test_resuming_a_finished_run_changes_nothing(local_ray, tmp_path, capsys):
    prep = _prepare(tmp_path / "run")
    summary = run_search(prep, "test")
    before = _snapshot(prep.run_dir)
    again = run_search(Prepared(prep.config, prep.kernels, prep.run_dir, resume=True), "test --resume")
    assert _snapshot(prep.run_dir) == before  # records, best/, summary.json: byte for byte
    assert again == summary
    assert "nothing evaluated again" in capsys.readouterr().out


def _cut_at(run_dir: Path, moment: float) -> None:
    """Leaves the run directory as a kill at ``moment`` would: each record file up to that
    moment, nothing written at the end of a run."""
    for name in RECORD_FILES:
        path = run_dir / f"{name}.jsonl"
        kept = [line for line in path.read_text().splitlines(keepends=True) if json.loads(line)["time"] <= moment]
        path.write_text("".join(kept))
    for name in ("summary.json", "evaluations.parquet", "best.parquet"):
        (run_dir / name).unlink()
    shutil.rmtree(run_dir / "best")


def test_cut_short_run_resumes_to_the_same_records(local_ray, tmp_path):
    whole = _prepare(tmp_path / "whole")
    run_search(whole, "test")
    reference = _normalised(whole.run_dir)
    times = sorted(json.loads(line)["time"] for line in (whole.run_dir / "evaluations.jsonl").read_text().splitlines())
    for fraction in (0.3, 0.7):
        cut = tmp_path / f"cut{fraction}"
        shutil.copytree(whole.run_dir, cut)
        _cut_at(cut, times[int(len(times) * fraction)])
        assert len(_normalised(cut)["evaluations"]) < len(reference["evaluations"])
        summary = run_search(Prepared(whole.config, whole.kernels, cut, resume=True), "test --resume")
        assert _normalised(cut) == reference, f"resumed at {fraction:.0%} of the run"
        assert summary["resumed"] is True and summary["attempts"] == 2
        attempts = json.loads((cut / "attempts.json").read_text())
        assert summary["wall_s"] == sum(a["wall_s"] for a in attempts)


def test_a_resumed_run_replays_the_answers_of_its_end(local_ray, tmp_path):
    """The end of a run (sanitizer, peers' loops) takes minutes on a GPU: a run killed there
    and resumed takes the answers on record instead of asking again."""
    prep = _prepare(tmp_path / "run")
    run_search(prep, "test")
    path = prep.run_dir / "answers.jsonl"
    answers = list(read_jsonl(path))
    # The sanitizer's (a stand-in says SKIPPED) and each of the peers' loops (none timed here), on
    # the search shapes and on the spec's held-out shapes.
    assert sorted({a["method"] for a in answers}) == ["sanitize", "time_round"]
    # one answer per round: its search-shape loop and its held-out one
    assert sum(a["method"] == "time_round" for a in answers) == prep.config.evaluator.peer_runs
    assert all(len(a["value"]["loops"]) == 2 for a in answers if a["method"] == "time_round")
    # As a kill in the end of the run leaves it; the answer on record is marked to be recognised.
    for name in ("summary.json", "evaluations.parquet", "best.parquet"):
        (prep.run_dir / name).unlink()
    shutil.rmtree(prep.run_dir / "best")
    marked = [dict(a, value=dict(a["value"], summary="as recorded")) if a["method"] == "sanitize" else a
              for a in answers]
    path.write_text("".join(json.dumps(a) + "\n" for a in marked))
    run_search(Prepared(prep.config, prep.kernels, prep.run_dir, resume=True), "test --resume")
    assert list(read_jsonl(path)) == marked  # nothing asked again, nothing recorded twice
    best = json.loads(next((prep.run_dir / "best").glob("*.json")).read_text())
    assert best["sanitizer"]["summary"] == "as recorded"


def test_compile_ahead_asks_one_compilation_per_shape_set_before_the_loops_and_again_on_resume(local_ray, tmp_path,
                                                                                               capsys):
    """--compile-ahead: the end of the run asks the evaluator to compile the programs of each
    kernel's loops once per shape set (non-exclusive calls, like the sanitizer's) before the
    loops; a stand-in has nothing to compile and says so, and the loops then compile for
    themselves. What is compiled lies on one machine's disk, so it is not recorded: a resumed
    run compiles again for the rounds it has not done, and for none of those it has."""
    prep = _prepare(tmp_path / "run", "--compile-ahead")
    assert prep.config.evaluator.compile_ahead
    run_search(prep, "test")
    path = prep.run_dir / "answers.jsonl"
    answers = list(read_jsonl(path))
    loops = prep.config.evaluator.peer_runs
    assert [a["method"] for a in answers if a["method"] != "sanitize"] == ["time_round"] * loops
    err = capsys.readouterr().err
    assert f"nothing compiled ahead for {loops} loops (stand-in evaluator: no peers to compile)" in err
    # Cut after the first round: the resumed run compiles ahead for the two rounds left only.
    first = next(i for i, a in enumerate(answers) if a["method"] == "time_round")
    path.write_text("".join(json.dumps(a) + "\n" for a in answers[:first + 1]))
    for name in ("summary.json", "evaluations.parquet", "best.parquet"):
        (prep.run_dir / name).unlink()
    shutil.rmtree(prep.run_dir / "best")
    run_search(Prepared(prep.config, prep.kernels, prep.run_dir, resume=True), "test --resume")
    err = capsys.readouterr().err
    assert f"nothing compiled ahead for {loops - 1} loops (stand-in evaluator: no peers to compile)" in err
    assert f"for {loops} loops" not in err
    assert [a["method"] for a in read_jsonl(path) if a["method"] != "sanitize"] == ["time_round"] * loops


def _journal_trials(run_dir: Path) -> dict[str, list[tuple[int, str, dict[str, Any], float | None]]]:
    """Every study in the run's Optuna journal: its trials as (number, state, params, value)."""
    import optuna

    from search.tuning import JOURNAL, journal_storage

    storage = journal_storage(run_dir / JOURNAL)
    return {name: [(t.number, t.state.name, dict(t.params), t.value)
                   for t in optuna.load_study(study_name=name, storage=storage).trials]
            for name in sorted(optuna.get_all_study_names(storage))}


def test_the_studies_are_on_disk_and_a_resumed_run_rebuilds_them_as_they_were(local_ray, tmp_path):
    """optuna.journal holds one study per tuned variant, its trials those the records hold;
    a run cut short and resumed ends with the same studies, trial for trial."""
    whole = _prepare(tmp_path / "whole")
    run_search(whole, "test")
    studies = _journal_trials(whole.run_dir)
    assert studies and all(trials for trials in studies.values())
    # every trial told is a screening the records hold (the defaults' first one among them)
    screened = {(e["variant"]["id"], json.dumps(e["params"], sort_keys=True))
                for e in read_jsonl(whole.run_dir / "evaluations.jsonl") if e["stage"] == "screen"}
    told = {(name.split(".")[1], json.dumps(params, sort_keys=True))
            for name, trials in studies.items() for _, state, params, _ in trials if state in ("COMPLETE", "FAIL")}
    assert told and told <= screened
    times = sorted(json.loads(line)["time"] for line in (whole.run_dir / "evaluations.jsonl").read_text().splitlines())
    cut = tmp_path / "cut"
    shutil.copytree(whole.run_dir, cut)
    _cut_at(cut, times[len(times) // 2])
    run_search(Prepared(whole.config, whole.kernels, cut, resume=True), "test --resume")
    assert _journal_trials(cut) == studies


def test_the_summary_says_where_the_wall_time_went(local_ray, tmp_path, capsys):
    """Every run's summary has the seconds of each stage, in order, and of each kind of call of
    the end of the run (counted once where calls overlap); the end prints a line per loop with
    how many are left."""
    prep = _prepare(tmp_path / "run")
    summary = run_search(prep, "test")
    stages = summary["stage_s"]
    assert list(stages) == ["set-up", "search", "held-out", "end set-up", "sanitizer, final timing and peers", "report"]
    assert all(v >= 0 for v in stages.values())
    assert sum(stages.values()) <= summary["wall_s"] + 1.0
    assert {"sanitize", "time_round", "evaluate"} <= set(summary["end_calls_s"])
    loops = 2 * prep.config.evaluator.peer_runs  # search and held-out shapes
    err = capsys.readouterr().err
    assert f"{loops} loops done, 0 to go" in err and f"1 loops done, {loops - 1} to go" in err
    held = summary["kernels"][0]["heldout_loops"]
    assert held["loops"] == 0 or held["loops"] == prep.config.evaluator.peer_runs  # the stand-in times nothing
    assert held["shapes"] == [shape_label(s) for s in prep.kernels[0][0].heldout_shapes]
