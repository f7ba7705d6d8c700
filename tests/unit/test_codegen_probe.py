"""The code generator probe's CPU side: the points it times, the variants it builds, its
refusals (no GPU, a folder without a spec), and its table."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments import codegen_probe

UNSEEN = Path(codegen_probe.UNSEEN)


def test_the_default_point_or_the_whole_grid():
    source = "// launch: grid=(n,) block=(B,) smem=0\n// tune: B=128,256\n// tune: U=1,2,4\n"
    assert codegen_probe.tune_points(source, grid=False) == [{"B": 128, "U": 1}]
    points = codegen_probe.tune_points(source, grid=True)
    assert len(points) == 6 and {"B": 256, "U": 4} in points and len({tuple(p.items()) for p in points}) == 6


def test_every_generated_schedule_and_the_baseline_are_timed():
    variants = codegen_probe.variants_of(UNSEEN / "transpose_2d", grid=False)
    assert set(variants) == {"transpose/tiled VW=2,TY=8", "transpose/wide TILE=64,NT=256", "baseline"}
    grid = codegen_probe.variants_of(UNSEEN / "transpose_2d", grid=True)
    assert len(grid) == 1 + 2 * 3 + 2 * 3  # two widths x three TY, two tiles x three NT, the baseline


def test_a_folder_without_a_spec_is_refused(tmp_path, capsys):
    assert codegen_probe.main([str(tmp_path)]) == 2
    assert "no spec.py" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so(capsys):
    assert codegen_probe.main([str(UNSEEN / "bias_gelu")]) == 2
    assert "error:" in capsys.readouterr().err


def test_the_table_ranks_by_ratio_and_names_failures():
    meta = {"gpu": "G", "command": "c", "commit": "abc", "date": "d", "repetitions": 5}
    result = {"kernel": "k", "dtype": "float16", "vs_torch_compile": {"a": 0.9, "b": 1.2, "c": None},
              "failed": {"c": "INCORRECT: ..."}}
    text = codegen_probe.to_markdown(meta, [result])
    rows = [line for line in text.splitlines() if line.startswith("| ") and "x |" in line or "n/a" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| b", "| a", "| c"]
    assert "failed in the loop: c: INCORRECT" in text and "abc" in text
