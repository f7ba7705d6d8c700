"""experiments/sweep_results.py and experiments/explore_recipes.py on recorded data (no GPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.explore_recipes import candidates, table
from experiments.sweep_results import check_targets, kernel_entry, main, to_markdown
from kernels.folders import KERNEL_ROOT_VAR, KernelRef
from kernels.spec import kernel_ref, load_kernel, shape_label
from search import spread
from tests.unit.kernel_folders import write_libraries


def _kernel(name: str, vs_baseline: float, vs_tc: float | None, heldout: str = "OK", loop_scale: float = 1.0,
            ref: KernelRef | None = None, ranges: dict[str, tuple[float, float, float]] | None = None) -> dict:
    """A summary entry; ``ranges``: per peer, (median, low, high) over three loops, as search.report writes."""
    spec = load_kernel(ref or name)
    shapes = []
    for s in spec.shapes("search"):
        best = spec.bytes_moved(s, "float16") / 2e12 * 1e3  # 2 TB/s, in ms
        loop = {"best": best * loop_scale, "baseline": best * vs_baseline}
        if vs_tc is not None:
            loop["torch_compile"] = best * vs_tc
        shapes.append({"shape": dict(s), "label": shape_label(s), "baseline_ms": best * vs_baseline, "best_ms": best,
                       "speedup": vs_baseline, "copy_bw_fraction": 0.5, "loop_ms": loop})
    over = {"baseline": vs_baseline, **({"torch_compile": vs_tc} if vs_tc is not None else {})}
    return {"kernel": name, "dtype": "float16", "winner": "abc", "params": {}, "speedup_search": vs_baseline,
            "heldout_status": heldout, "speedup_heldout": vs_baseline, "shapes": shapes, "speedup_over_peers": over,
            "variants_evaluated": 3, "evaluations": 9, "sanitizer_status": "CLEAN",
            "lineage": [{"note": "embedded: x"}], "peer_errors": {"flashinfer": "ImportError: no module"},
            **({"kernel_ref": ref.to_dict()} if ref else {}),
            **({"spreads": {p: spread.Spread(*r, runs=3).to_dict() for p, r in ranges.items()}, "peer_runs": 3,
                "speedup_search_source": "loop"} if ranges else {})}


def test_an_external_kernel_is_found_through_its_reference(tmp_path: Path, monkeypatch):
    # Two same-named kernels of a run, one of them now only staged under KSEARCH_KERNEL_ROOT.
    lib_a, lib_b = write_libraries(tmp_path / "libs")
    ref_a, ref_b = (kernel_ref(lib / "scale_rows", "scale_rows@x") for lib in (lib_a, lib_b))
    monkeypatch.setenv(KERNEL_ROOT_VAR, str(tmp_path / "root"))
    shutil.move(lib_b / "scale_rows", tmp_path / "root" / ref_b.digest)
    for ref, shapes in ((ref_a, ["[4096]", "[65536]"]), (ref_b, ["[1024]", "[16384]", "[262144]"])):
        entry = kernel_entry(_kernel("scale_rows@x", 2.0, 1.2, ref=ref))
        assert entry["kernel"] == "scale_rows@x" and entry["largest_shape"] == shapes[-1]


def test_targets_median_heldout_and_slower_than_baseline():
    entries = [kernel_entry(_kernel("silu_and_mul", 2.0, 1.2)), kernel_entry(_kernel("rmsnorm", 0.9, 1.0)),
               kernel_entry(_kernel("layernorm", 1.5, 0.5, heldout="INCORRECT"))]
    t = check_targets(entries)
    assert t["median_vs_torch_compile"] == 1.0 and not t["median_met"]
    assert not t["all_heldout_ok"]
    assert t["slower_than_baseline"] == ["rmsnorm"]
    assert t["below_roofline"] == []


def _tc_entries(*ranges: tuple[float, float, float]) -> list[dict]:
    names = ["silu_and_mul", "rmsnorm", "layernorm"]
    return [kernel_entry(_kernel(n, 2.0, r[0], ranges={"baseline": (2.0, 1.9, 2.1), "torch_compile": r}))
            for n, r in zip(names, ranges, strict=False)]


def test_a_target_is_met_only_when_the_whole_range_meets_it():
    # medians all 1.2x (above both torch.compile targets), but one kernel's range dips to 0.95x
    t = check_targets(_tc_entries((1.2, 1.16, 1.25), (1.2, 0.95, 1.3), (1.2, 1.17, 1.22)))
    assert t["median_vs_torch_compile"] == pytest.approx(1.2)
    assert t["median_vs_torch_compile_range"]["low"] == pytest.approx(1.16)
    assert t["median_verdict"] == "met" and t["median_met"]
    assert t["geomean_vs_torch_compile"] == pytest.approx(1.2)
    # rmsnorm's range straddles 1.0x: the condition "every kernel's whole range >= 1.0x" is not met by it
    assert t["geomean_verdict"] == "within range" and not t["geomean_met"]
    assert t["below_one_vs_torch_compile"] == ["rmsnorm"]
    assert t["verdicts_vs_torch_compile"]["rmsnorm"] == "tie"


def test_a_median_above_the_target_with_the_range_straddling_it_is_within_range():
    t = check_targets(_tc_entries((1.12, 1.05, 1.2), (1.12, 1.08, 1.15), (1.2, 1.0, 1.3)))
    assert t["median_vs_torch_compile"] >= t["median_target"]
    assert t["median_verdict"] == "within range" and not t["median_met"]
    assert t["geomean_vs_torch_compile"] < 1.15 < t["geomean_vs_torch_compile_range"]["high"]
    assert t["geomean_verdict"] == "within range"  # every kernel's range is >= 1.0x, the geomean's straddles 1.15x
    below = check_targets(_tc_entries((1.05, 1.0, 1.09), (1.0, 1.0, 1.02)))
    assert below["median_verdict"] == "not met"
    over = check_targets(_tc_entries((1.2, 1.16, 1.3), (1.25, 1.2, 1.3)))
    assert over["median_verdict"] == "met" and over["geomean_verdict"] == "met"


def test_within_range_is_said_in_the_markdown_and_astra_target_is_not_applicable_without_astra_kernels():
    entries = [kernel_entry(_kernel("rmsnorm", 1.0, 1.12, ranges={"baseline": (1.0, 0.97, 1.04),
                                                                  "torch_compile": (1.12, 1.05, 1.2)}))]
    t = check_targets(entries)
    assert t["flashinfer_astra_verdict"] == "not applicable"
    assert t["slower_than_baseline"] == [] and t["tie_with_baseline"] == ["rmsnorm"]
    summary = {"gpu": "G", "command": "c", "evaluator": "gpu", "n_gpus": 1, "wall_s": 1.0, "gpu_busy_fraction": 0.5}
    text = to_markdown(summary, {}, entries, t)
    assert "**1.120x [1.050-1.200]** (target 1.1x: within range (not met by the whole range))" in text
    assert "(target 1.1x: not applicable)" in text
    assert "tied with it: rmsnorm" in text


def test_loop_times_faster_than_the_roofline_are_flagged():
    e = kernel_entry(_kernel("silu_and_mul", 2.0, 1.2, loop_scale=0.1))  # 10x faster than 50% of copy bw
    assert any(x.startswith("silu_and_mul best") for x in check_targets([e])["below_roofline"])


def test_main_writes_json_and_markdown_from_a_sweep_folder(tmp_path: Path):
    run = tmp_path / "sweep-x" / "run"
    run.mkdir(parents=True)
    summary = {"gpu": "G", "command": "python -m search.sweep", "git_commit": "abc", "date": "d", "evaluator": "gpu",
               "n_gpus": 2, "wall_s": 10.0, "gpu_busy_fraction": 0.8,
               "kernels": [_kernel("silu_and_mul", 2.0, 1.2, ranges={"baseline": (2.0, 1.9, 2.1),
                                                                      "torch_compile": (1.2, 1.15, 1.25)}),
                           _kernel("topk_softmax", 1.2, None)]}
    (run / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "sweep-x" / "sweep.json").write_text(json.dumps({"sweep_id": "x", "run_dir": "run", "skipped": {},
                                                                 "attempts": [{"command": "python -m search.sweep"}]}))
    out = tmp_path / "res" / "sweep-h200"
    assert main([str(tmp_path / "sweep-x"), "--out", str(out), "--no-plots"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["targets"]["kernels_with_torch_compile"] == 1 and data["targets"]["median_met"]
    text = out.with_suffix(".md").read_text()
    assert "| silu_and_mul | 2.000x [1.900-2.100] faster | OK 2.000x | 1.200x [1.150-1.250] faster |" in text
    # a ratio with no repeated loops behind it says so, and where it came from
    assert "| topk_softmax | 1.200x (one evaluator run, no spread) |" in text
    assert "median over the 0-3 end-of-run loops" in text
    assert "Not timed: flashinfer: ImportError" in text


def test_recipe_map_candidates_and_ranking():
    found = candidates("silu_and_mul", max_per_recipe=2)
    assert "baseline" in found and "file:vec_flat.cu" in found
    assert sum(n.startswith("gated_act/tiles") for n in found) == 2
    # recipes as the search's winners were compiled (fast math), or as written; hand files as they are
    from kernels.nvrtc import variant_flags

    tiles = next(n for n in found if n.startswith("gated_act/tiles"))
    assert variant_flags(found[tiles][0]) == ["--use_fast_math"]
    assert variant_flags(candidates("silu_and_mul", max_per_recipe=2, fast_math=False)[tiles][0]) == []
    assert found["file:vec_flat.cu"][0] == (Path(__file__).resolve().parents[2] / "experiments/results/variants/silu_and_mul/vec_flat.cu").read_text()
    assert "--use_fast_math" not in found["baseline"][0]
    reply = {"peers": {"a": {"s1": 1.0, "s2": 2.0}, "torch_compile": {"s1": 2.0, "s2": 2.0}, "b": {"s1": 4.0}}}
    rows = table(reply, ["s1", "s2"])
    assert [r["impl"] for r in rows][0] == "a" and abs(rows[0]["vs_torch_compile"] - 2 ** 0.5) < 1e-9


def test_a_library_of_its_own_is_held_to_the_general_agents_targets():
    """A sweep of ``--library`` kernels (no recipes) reports issue 16's targets: geomean over
    torch.compile at or above 1.0 and no kernel's range reaching below 0.9; the built-in library's
    targets (1.15x geomean, FlashInfer on the Astra kernels) are not printed for it."""
    summary = {"gpu": "G", "command": "c", "evaluator": "gpu", "n_gpus": 1, "wall_s": 1.0, "gpu_busy_fraction": 0.5}
    level = [kernel_entry(_kernel(n, 2.0, r[0], ranges={"torch_compile": r}))
             for n, r in (("rmsnorm", (1.15, 1.12, 1.2)), ("layernorm", (0.95, 0.92, 0.97)))]
    t = check_targets(level)
    assert t["external_verdict"] == "met" and t["below_floor_vs_torch_compile"] == []
    text = to_markdown(summary, {"library": "/x/unseen"}, level, t)
    assert "across a library without recipes: **1.045x [1.015-1.079]**" in text
    assert "(target 1.0x with no kernel's whole range below 0.9x: met;" in text
    assert "1.15x" not in text and "FlashInfer on" not in text
    # one kernel reaching below the floor fails the target even when the geomean clears 1.0
    floored = [kernel_entry(_kernel("rmsnorm", 2.0, 1.3, ranges={"torch_compile": (1.3, 1.25, 1.35)})),
               kernel_entry(_kernel("layernorm", 2.0, 0.88, ranges={"torch_compile": (0.88, 0.85, 0.95)}))]
    t = check_targets(floored)
    assert t["external_verdict"] != "met" and t["below_floor_vs_torch_compile"] == ["layernorm"]
    assert "1.15x" in to_markdown(summary, {}, floored, t)


def _sweep_dir(root: Path, name: str, kernels: list[dict], commit: str = "abc", library: str | None = None) -> Path:
    """A sweep directory as search.sweep leaves it (sweep.json beside the run's summary.json)."""
    run = root / name / "run"
    run.mkdir(parents=True)
    summary = {"gpu": "G", "command": f"python -m search.sweep --kernel {kernels[0]['kernel']}", "git_commit": commit,
               "date": f"2026-12-0{len(name)}", "evaluator": "gpu", "n_gpus": 1, "wall_s": 100.0 * len(kernels),
               "gpu_busy_fraction": 0.5 + 0.1 * len(kernels), "kernels": kernels}
    (run / "summary.json").write_text(json.dumps(summary))
    meta = {"sweep_id": name, "run_dir": "run", "skipped": {}, "attempts": [{"command": summary["command"]}],
            **({"library": library} if library else {})}
    (root / name / "sweep.json").write_text(json.dumps(meta))
    return root / name


def test_a_sweep_in_parts_is_reported_as_one(tmp_path: Path):
    """Two parts of one library (split by --kernel, same commit and GPU) make one file: kernels
    pooled and sorted, targets over all of them, wall summed, every part named."""
    rng = {"baseline": (2.0, 1.9, 2.1), "torch_compile": (1.2, 1.15, 1.25)}
    a = _sweep_dir(tmp_path, "p1", [_kernel("silu_and_mul", 2.0, 1.2, ranges=rng)])
    b = _sweep_dir(tmp_path, "p22", [_kernel("rmsnorm", 2.0, 0.8, ranges={"torch_compile": (0.8, 0.78, 0.82)}),
                                     _kernel("layernorm", 2.0, 1.3, ranges={"torch_compile": (1.3, 1.2, 1.4)})])
    out = tmp_path / "res" / "sweep-h200"
    assert main([str(a), str(b), "--out", str(out), "--no-plots"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert [k["kernel"] for k in data["kernels"]] == ["layernorm", "rmsnorm", "silu_and_mul"]
    assert data["summary"]["wall_s"] == 300.0 and abs(data["summary"]["gpu_busy_fraction"] - (60 + 140) / 300) < 1e-9
    assert data["targets"]["below_one_vs_torch_compile"] == ["rmsnorm"]
    assert [p["kernels"] for p in data["sweep"]["parts"]] == [["silu_and_mul"], ["layernorm", "rmsnorm"]]
    text = out.with_suffix(".md").read_text()
    assert "- parts: 2 sweeps of this commit" in text and "p22 (2026-12-03, 200 s: layernorm, rmsnorm)" in text
    assert "`python -m search.sweep --kernel silu_and_mul`; `python -m search.sweep --kernel rmsnorm`" in text


def test_parts_of_different_code_or_sharing_a_kernel_are_refused(tmp_path: Path, capsys):
    a = _sweep_dir(tmp_path, "p1", [_kernel("silu_and_mul", 2.0, 1.2)])
    other = _sweep_dir(tmp_path, "p2", [_kernel("rmsnorm", 2.0, 1.2)], commit="def")
    twice = _sweep_dir(tmp_path, "p3", [_kernel("silu_and_mul", 2.1, 1.3)])
    elsewhere = _sweep_dir(tmp_path, "p4", [_kernel("layernorm", 2.0, 1.2)], library="/x/unseen")
    out = tmp_path / "res" / "x"
    assert main([str(a), str(other), "--out", str(out), "--no-plots"]) == 2
    assert "differ in git_commit ('def' vs 'abc')" in capsys.readouterr().err
    assert main([str(a), str(twice), "--out", str(out), "--no-plots"]) == 2
    assert "silu_and_mul (float16) is in two parts" in capsys.readouterr().err
    assert main([str(a), str(elsewhere), "--out", str(out), "--no-plots"]) == 2
    assert "differ in library" in capsys.readouterr().err
    assert not out.with_suffix(".json").exists()


def test_parts_at_two_commits_of_the_same_code_are_one_sweep(tmp_path: Path, monkeypatch, capsys):
    """A library swept over two sittings, with only results and prose committed in between, is
    one sweep; the report names both commits. Any other change between them refuses it."""
    import experiments.sweep_results as sr

    changed: list[str] = []
    monkeypatch.setattr(sr, "code_changes", lambda a, b, repo=sr.REPO: list(changed))
    a = _sweep_dir(tmp_path, "p1", [_kernel("silu_and_mul", 2.0, 1.2)], commit="abc1234")
    b = _sweep_dir(tmp_path, "p2", [_kernel("rmsnorm", 2.0, 1.2)], commit="def5678")
    out = tmp_path / "res" / "x"
    assert main([str(a), str(b), "--out", str(out), "--no-plots"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["sweep"]["commits"] == ["abc1234", "def5678"]
    assert ("- parts: 2 sweeps of the same code at commits abc1234, def5678 (between them git finds changes to "
            "results and prose only)") in out.with_suffix(".md").read_text()
    # a later part at a third commit of the same code, pooled with that report: all three named
    c = _sweep_dir(tmp_path, "p3", [_kernel("layernorm", 2.0, 1.2)], commit="0123abc")
    whole = tmp_path / "res" / "whole"
    assert main([str(c), "--earlier", str(out.with_suffix(".json")), "--out", str(whole), "--no-plots"]) == 0
    assert json.loads(whole.with_suffix(".json").read_text())["sweep"]["commits"] == ["abc1234", "def5678", "0123abc"]
    changed.append("evaluators/timing.py")
    assert main([str(a), str(b), "--out", str(out), "--no-plots"]) == 2
    assert "differ in git_commit ('def5678' vs 'abc1234')" in capsys.readouterr().err


def test_code_changes_leave_out_results_and_prose(tmp_path: Path):
    import subprocess

    from experiments.sweep_results import code_changes

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "a.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "one")
    first = git("rev-parse", "HEAD")
    for name in ("README.md", "experiments/results/r.json", "docs/notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("y\n")
    git("add", "-A")
    git("commit", "-q", "-m", "two")
    second = git("rev-parse", "HEAD")
    assert code_changes(first, second, tmp_path) == []
    (tmp_path / "agents" / "a.py").write_text("x = 2\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("y\n")  # tests count as code: the rule stays simple
    git("add", "-A")
    git("commit", "-q", "-m", "three")
    assert code_changes(first, git("rev-parse", "HEAD"), tmp_path) == ["agents/a.py", "tests/test_a.py"]
    assert code_changes(first, "0" * 40, tmp_path) is None  # a commit git does not have


def test_a_commit_given_short_in_one_part_and_in_full_in_another_is_one_commit(tmp_path: Path, capsys):
    full = "750c6702e4f08171f9cea5f57203c01eea74bdfc"
    a = _sweep_dir(tmp_path, "p1", [_kernel("silu_and_mul", 2.0, 1.2)], commit="750c670")
    b = _sweep_dir(tmp_path, "p2", [_kernel("rmsnorm", 2.0, 1.2)], commit=full)
    out = tmp_path / "res" / "x"
    assert main([str(a), str(b), "--out", str(out), "--no-plots"]) == 0
    # a prefix shorter than 7 digits, or another commit's, is not enough
    c = _sweep_dir(tmp_path, "p3", [_kernel("layernorm", 2.0, 1.2)], commit="750c")
    d = _sweep_dir(tmp_path, "p4", [_kernel("layernorm", 2.0, 1.2)], commit="750c671")
    for other in (c, d):
        assert main([str(b), str(other), "--out", str(out), "--no-plots"]) == 2
        assert "differ in git_commit" in capsys.readouterr().err


def test_an_earlier_report_is_pooled_with_later_parts_as_it_was_reported(tmp_path: Path, capsys):
    """Parts whose directories are gone come back through the report written for them: their
    kernels as reported, their parts named, the commit checked like any part's."""
    rng = {"baseline": (2.0, 1.9, 2.1), "torch_compile": (1.2, 1.15, 1.25)}
    a = _sweep_dir(tmp_path, "p1", [_kernel("silu_and_mul", 2.0, 1.2, ranges=rng)])
    b = _sweep_dir(tmp_path, "p22", [_kernel("rmsnorm", 2.0, 0.8, ranges={"torch_compile": (0.8, 0.78, 0.82)})])
    earlier = tmp_path / "res" / "partial"
    assert main([str(a), str(b), "--out", str(earlier), "--no-plots"]) == 0
    shutil.rmtree(a)
    shutil.rmtree(b)
    later = _sweep_dir(tmp_path, "p333", [_kernel("layernorm", 2.0, 1.3, ranges={"torch_compile": (1.3, 1.2, 1.4)})])
    out = tmp_path / "res" / "whole"
    assert main([str(later), "--earlier", str(earlier.with_suffix(".json")), "--out", str(out), "--no-plots"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    before = {k["kernel"]: k for k in json.loads(earlier.with_suffix(".json").read_text())["kernels"]}
    assert [k["kernel"] for k in data["kernels"]] == ["layernorm", "rmsnorm", "silu_and_mul"]
    assert data["kernels"][1] == before["rmsnorm"] and data["kernels"][2] == before["silu_and_mul"]
    assert [p["kernels"] for p in data["sweep"]["parts"]] == [["silu_and_mul"], ["rmsnorm"], ["layernorm"]]
    assert data["summary"]["wall_s"] == 300.0
    assert data["targets"]["below_one_vs_torch_compile"] == ["rmsnorm"]
    assert "- parts: 3 sweeps of this commit" in out.with_suffix(".md").read_text()
    # an earlier report of other code, or one holding a kernel swept again, is refused
    other = _sweep_dir(tmp_path, "p4", [_kernel("gelu_and_mul", 2.0, 1.1)], commit="def")
    assert main([str(other), "--earlier", str(earlier.with_suffix(".json")), "--out", str(out), "--no-plots"]) == 2
    assert "differ in git_commit" in capsys.readouterr().err
    again = _sweep_dir(tmp_path, "p5", [_kernel("rmsnorm", 2.1, 1.0)])
    assert main([str(again), "--earlier", str(earlier.with_suffix(".json")), "--out", str(out), "--no-plots"]) == 2
    assert "rmsnorm (float16) is in two parts" in capsys.readouterr().err
    (tmp_path / "not-a-report.json").write_text("{}")
    assert main(["--earlier", str(tmp_path / "not-a-report.json"), "--out", str(out), "--no-plots"]) == 2


def test_a_peer_timed_on_some_shapes_only_says_over_how_many():
    k = _kernel("merge_attn_states_lse", 2.0, 1.2, ranges={"flashinfer": (1.1, 1.05, 1.15)})
    labels = [s["label"] for s in k["shapes"]]
    for s in k["shapes"][:2]:
        s["loop_ms"]["flashinfer"] = s["loop_ms"]["best"] * 1.1
    k["speedup_over_peers"]["flashinfer"] = 1.1
    k["peer_errors"] = {"flashinfer": f"{labels[2]}: RuntimeError: launch failed: invalid argument"}
    e = kernel_entry(k)
    assert e["shapes_timed"]["flashinfer"] == 2 and e["shapes"] == len(labels) > 2
    text = to_markdown({"gpu": "G", "command": "c", "evaluator": "gpu", "n_gpus": 1, "wall_s": 1.0,
                        "gpu_busy_fraction": 0.5}, {}, [e], check_targets([e]))
    assert f"flashinfer 1.100x [1.050-1.150] faster over 2 of {len(labels)} shapes" in text
    assert "over" not in text.split("| merge_attn_states_lse |")[1].split("|")[2]  # torch.compile: every shape


def test_where_the_loops_time_went_is_said_per_kernel():
    k = _kernel("silu_and_mul", 2.0, 1.2, ranges={"torch_compile": (1.2, 1.1, 1.3)})
    k["loop_phase_s"] = [{"prepare": 31.2, "loop": 1.8}, {"prepare": 4.0, "loop": 1.7}]
    k["compile_cache"] = [{"hit": 12, "miss": 0, "bypass": 0}, {"hit": 11, "miss": 1, "bypass": 0}]
    e = kernel_entry(k)
    text = to_markdown({"gpu": "G", "command": "c", "evaluator": "gpu", "n_gpus": 1, "wall_s": 1.0,
                        "gpu_busy_fraction": 0.5}, {}, [e], check_targets([e]))
    assert ("End-of-run loops: set-up 31, 4 s, timed 1.8, 1.7 s; torch.compile compiled ahead: "
            "23 compilations loaded, 1 made in the loops.") in text
    # where the set-up went, per peer: the torch.compile compilations as one, the first shape apart
    k["loop_prepare_s_by_peer"] = [
        {"total": {"flashinfer": 21.0, "torch_compile[default#1]": 1.5, "torch_compile[max#1]": 1.0, "torch_eager": 0.1},
         "first_shape": {"flashinfer": 20.0, "torch_compile[default#1]": 0.3, "torch_compile[max#1]": 0.2}},
        {"total": {"flashinfer": 19.0, "torch_compile[default#1]": 2.5, "torch_compile[max#1]": 1.0, "torch_eager": 0.1},
         "first_shape": {"flashinfer": 18.0, "torch_compile[default#1]": 0.5, "torch_compile[max#1]": 0.2}},
        {"total": {"flashinfer": 26.0, "torch_compile[default#1]": 1.0, "torch_compile[max#1]": 1.0, "torch_eager": 0.0},
         "first_shape": {"flashinfer": 25.0, "torch_compile[default#1]": 0.1, "torch_compile[max#1]": 0.1}}]
    text = to_markdown({"gpu": "G", "command": "c", "evaluator": "gpu", "n_gpus": 1, "wall_s": 1.0,
                        "gpu_busy_fraction": 0.5}, {}, [kernel_entry(k)], check_targets([e]))
    assert ("set-up per peer (median over the loops, the first shape's part in brackets): flashinfer 21.0 s (20.0 s), "
            "torch_compile 2.5 s (0.5 s).") in text
    # which loops built a library module, and whether its build file had changed since
    k["loop_jit_builds"] = [
        {"built": ["90/cached_ops/silu_and_mul/silu_and_mul.so"], "cpu_count": 16},
        {"rebuilt": ["90/cached_ops/silu_and_mul/silu_and_mul.so"],
         "rewritten": {"90/cached_ops/silu_and_mul/build.ninja": "-cuda_cflags = --threads=16\n+cuda_cflags = --threads=4"}},
        {"built": ["90/cached_ops/norm/norm.so"],
         "still_dirty": {"90/cached_ops/norm/norm.so": ["ninja explain: norm/norm.o is dirty"]}}]
    text = to_markdown({"gpu": "G", "command": "c", "evaluator": "gpu", "n_gpus": 1, "wall_s": 1.0,
                        "gpu_busy_fraction": 0.5}, {}, [kernel_entry(k)], check_targets([e]))
    assert ("library modules built in the loops: loop 1 built silu_and_mul.so (no build file rewritten); "
            "loop 2 rebuilt silu_and_mul.so (build files rewritten: silu_and_mul); loop 3 built norm.so (no build "
            "file rewritten), 1 still out of date for ninja (norm.so: ninja explain: norm/norm.o is dirty).") in text


def test_the_astra_target_is_taken_against_flashinfers_fastest_api():
    """Where FlashInfer offers an op through two APIs, the target is over the faster one: a
    lead over merge_state that merge_state_in_place erases is no lead."""
    merge = _kernel("merge_attn_states_lse", 2.0, 1.2, ranges={"flashinfer": (1.05, 1.0, 1.1),
                                                                "flashinfer_in_place": (0.93, 0.92, 0.94)})
    merge["speedup_over_peers"].update(flashinfer=1.05, flashinfer_in_place=0.93)
    others = [_kernel(n, 2.0, 1.2, ranges={"flashinfer": (1.2, 1.19, 1.21)}) for n in ("silu_and_mul", "fused_add_rmsnorm")]
    for k in others:
        k["speedup_over_peers"]["flashinfer"] = 1.2
    entries = [kernel_entry(k) for k in [merge, *others]]
    t = check_targets(entries)
    assert t["flashinfer_astra_peers"] == {"merge_attn_states_lse": "flashinfer_in_place", "silu_and_mul": "flashinfer",
                                           "fused_add_rmsnorm": "flashinfer"}
    assert abs(t["geomean_vs_flashinfer_astra"] - (0.93 * 1.2 * 1.2) ** (1 / 3)) < 1e-9
    # 1.103x [1.092-1.112] straddles 1.1x; over merge_state alone it would have been 1.147x [1.123-...]: met
    assert t["flashinfer_astra_verdict"] == spread.against(1.1, spread.Spread(1.1025, 1.0923, 1.1124, runs=3))
    assert t["flashinfer_astra_verdict"] != spread.MET
    text = to_markdown({"gpu": "G", "command": "c", "evaluator": "gpu", "n_gpus": 1, "wall_s": 1.0,
                        "gpu_busy_fraction": 0.5}, {}, entries, t)
    assert "each against its fastest FlashInfer API (fused_add_rmsnorm: flashinfer, merge_attn_states_lse: " \
           "flashinfer_in_place, silu_and_mul: flashinfer)" in text


def test_a_standin_sweep_without_loop_times_gets_well_formed_tables_and_says_synthetic():
    k = _kernel("silu_and_mul", 2.0, None)
    for s in k["shapes"]:
        s["loop_ms"] = {}  # the stand-in runs no end-of-run loop
    entries = [kernel_entry(k)]
    summary = {"gpu": "cpu-standin", "command": "c", "evaluator": "standin", "n_gpus": 1, "wall_s": 1.0,
               "gpu_busy_fraction": 0.1, "warning": "STAND-IN EVALUATOR: synthetic numbers"}
    text = to_markdown(summary, {}, entries, check_targets(entries))
    assert "**STAND-IN EVALUATOR: synthetic numbers**" in text
    assert "No per-shape times: no implementation was timed in an end-of-run loop." in text
    lines = text.splitlines()
    for i, line in enumerate(lines):  # every table row has as many cells as its header
        if line.startswith("|---"):
            width = lines[i - 1].count("|")
            assert line.count("|") == width, (lines[i - 1], line)
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                assert lines[j].count("|") == width, lines[j]
                j += 1
