"""experiments/sweep_results.py and experiments/explore_recipes.py on recorded data (no GPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from experiments.explore_recipes import candidates, table
from experiments.sweep_results import check_targets, kernel_entry, main
from kernels.folders import KERNEL_ROOT_VAR, KernelRef
from kernels.spec import kernel_ref, load_kernel, shape_label
from tests.unit.kernel_folders import write_libraries


def _kernel(name: str, vs_baseline: float, vs_tc: float | None, heldout: str = "OK", loop_scale: float = 1.0,
            ref: KernelRef | None = None) -> dict:
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
            **({"kernel_ref": ref.to_dict()} if ref else {})}


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


def test_loop_times_faster_than_the_roofline_are_flagged():
    e = kernel_entry(_kernel("silu_and_mul", 2.0, 1.2, loop_scale=0.1))  # 10x faster than 50% of copy bw
    assert any(x.startswith("silu_and_mul best") for x in check_targets([e])["below_roofline"])


def test_main_writes_json_and_markdown_from_a_sweep_folder(tmp_path: Path):
    run = tmp_path / "sweep-x" / "run"
    run.mkdir(parents=True)
    summary = {"gpu": "G", "command": "python -m search.sweep", "git_commit": "abc", "date": "d", "evaluator": "gpu",
               "n_gpus": 2, "wall_s": 10.0, "gpu_busy_fraction": 0.8,
               "kernels": [_kernel("silu_and_mul", 2.0, 1.2), _kernel("topk_softmax", 1.2, None)]}
    (run / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "sweep-x" / "sweep.json").write_text(json.dumps({"sweep_id": "x", "run_dir": "run", "skipped": {},
                                                                 "attempts": [{"command": "python -m search.sweep"}]}))
    out = tmp_path / "res" / "sweep-h200"
    assert main([str(tmp_path / "sweep-x"), "--out", str(out), "--no-plots"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["targets"]["kernels_with_torch_compile"] == 1 and data["targets"]["median_met"]
    text = out.with_suffix(".md").read_text()
    assert "| silu_and_mul | 2.000x | OK 2.000x | 1.200x |" in text
    assert "Not timed: flashinfer: ImportError" in text


def test_recipe_map_candidates_and_ranking():
    found = candidates("silu_and_mul", max_per_recipe=2)
    assert "baseline" in found and "file:vec_flat.cu" in found
    assert sum(n.startswith("gated_act/tiles") for n in found) == 2
    reply = {"peers": {"a": {"s1": 1.0, "s2": 2.0}, "torch_compile": {"s1": 2.0, "s2": 2.0}, "b": {"s1": 4.0}}}
    rows = table(reply, ["s1", "s2"])
    assert [r["impl"] for r in rows][0] == "a" and abs(rows[0]["vs_torch_compile"] - 2 ** 0.5) < 1e-9
