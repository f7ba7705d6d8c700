"""experiments.sweep_compare: ranges where a sweep kept them, single figures where not, and
the verdict by whole ranges."""

from __future__ import annotations

import json

from experiments import sweep_compare

RESULTS = sweep_compare.__file__.rsplit("/", 1)[0] + "/results"


def _kernel(name, base, compiled=None, spread=None):
    k = {"kernel": name, "speedup_vs_baseline": base, "speedup_vs_torch_compile": compiled}
    if spread:
        k["spreads"] = {"baseline": dict(zip(("low", "median", "high"), spread, strict=True))}
    return k


def test_verdicts_by_whole_ranges():
    before = {"kernels": [_kernel("a", 2.0, 1.0, spread=(1.9, 2.0, 2.05)), _kernel("b", 2.0, spread=(1.98, 2.0, 2.02)),
                          _kernel("c", 2.0, spread=(1.95, 2.0, 2.05)), _kernel("d", 2.0), _kernel("gone", 1.0)]}
    after = {"kernels": [_kernel("a", 2.2, 1.1, spread=(2.1, 2.2, 2.3)), _kernel("b", 1.9, spread=(1.8, 1.9, 1.95)),
                         _kernel("c", 2.0, spread=(1.9, 2.0, 2.1)), _kernel("d", 2.5, spread=(2.4, 2.5, 2.6)),
                         _kernel("new", 3.0)]}
    rows = {r["kernel"]: r for r in sweep_compare.compare(before, after)}
    assert set(rows) == {"a", "b", "c", "d"}
    assert [rows[k]["baseline"]["verdict"] for k in "abcd"] == ["better", "worse", "tie", "one run: no verdict"]
    assert rows["a"]["baseline"]["ratio"] == 2.2 / 2.0
    # the ratio carries its spread: lowest after over highest before, highest after over lowest before
    assert rows["a"]["baseline"]["ratio_range"] == (2.1 / 2.05, 2.2 / 2.0, 2.3 / 1.9)
    assert rows["a"]["torch_compile"]["verdict"] == "one run: no verdict"  # single figures both sides
    assert rows["b"]["torch_compile"] is None  # no figure in either: not compared
    text = sweep_compare.to_markdown(list(rows.values()), "old.json", "new.json")
    assert "1.100x [1.024-1.211]" in text  # a's after/before with its range
    assert "2.200x [2.100-2.300]" in text and "1 better, 1 tie, 1 worse, 1 without a verdict" in text


def test_the_committed_sweeps_compare(tmp_path, capsys):
    out = tmp_path / "cmp.md"
    assert sweep_compare.main([f"{RESULTS}/sweep-h200-c314568.json", f"{RESULTS}/sweep-h200.json", "--out", str(out)]) == 0
    assert "fused_add_rmsnorm" in out.read_text() and out.read_text() == capsys.readouterr().out


def test_a_file_that_is_not_a_sweep_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nothing": 1}))
    assert sweep_compare.main([str(bad), str(bad)]) == 2
    assert "cannot compare" in capsys.readouterr().err
