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


def test_compare_fill_times_each_capped_schedule_beside_its_uncapped_twin():
    from kernels.launch import parse_launch_header

    variants = codegen_probe.variants_of(UNSEEN / "bias_gelu", grid=False, compare_fill=True)
    capped = [n for n in variants if not n.endswith(codegen_probe.UNCAPPED)]
    assert capped and "baseline" not in variants
    for name in capped:
        source, params = variants[name]
        twin, twin_params = variants[name + codegen_probe.UNCAPPED]
        assert twin != source and twin_params == params
        # The twin is the source with the cap's term alone taken out of the block's threads.
        assert twin == codegen_probe.without_fill_cap(source)
        one_row = {"num_tokens": 1, "hidden": 11008}
        small = parse_launch_header(source).resolve(one_row, params)
        big = parse_launch_header(twin).resolve(one_row, params)
        assert small.block[0] < big.block[0] and small.grid[0] > big.grid[0]
        many = {"num_tokens": 4096, "hidden": 14336}
        assert parse_launch_header(source).resolve(many, params) == parse_launch_header(twin).resolve(many, params)
    # A schedule without the cap (transposes) has no twin and is left out.
    assert codegen_probe.variants_of(UNSEEN / "transpose_2d", grid=False, compare_fill=True) == {}


def test_loops_merge_into_medians_and_ranges_of_the_twins_ratio():
    def loop(capped_ms, uncapped_ms, tc_ratio):
        return {"kernel": "k", "dtype": "float16", "shapes": ["[1]", "[2]"], "failed": {}, "errors": {},
                "times_ms": {"s": {"[1]": capped_ms, "[2]": 1.0}, "s uncapped": {"[1]": uncapped_ms, "[2]": 1.0}},
                "vs_torch_compile": {"s": tc_ratio, "s uncapped": None}}

    merged = codegen_probe.merge_loops([loop(1.0, 1.2, 0.9), loop(1.0, 1.1, 1.0), loop(2.0, 2.6, 0.95)])
    ratio = merged["uncapped_over_capped"]["s"]
    assert ratio["[1]"] == pytest.approx([1.2, 1.1, 1.3]) and ratio["[2]"] == pytest.approx([1.0, 1.0, 1.0])
    assert merged["vs_torch_compile"]["s"] == pytest.approx(0.95)
    assert merged["vs_torch_compile_range"]["s"] == pytest.approx([0.95, 0.9, 1.0])
    assert len(merged["loops_times_ms"]) == 3
    text = codegen_probe.to_markdown({"gpu": "G", "command": "c", "commit": "abc", "date": "d", "repetitions": 5,
                                      "loops": 3}, [merged])
    assert "1.200 [1.100-1.300]" in text and "3 fresh loops" in text and "0.950x [0.900-1.000]" in text


def test_compare_fill_takes_the_capped_recipes_of_a_library_kernel():
    from kernels.launch import parse_launch_header

    variants = codegen_probe.variants_of(codegen_probe.ROOT / "kernels" / "silu_and_mul", grid=False,
                                         compare_fill=True)
    names = {n for n in variants if not n.endswith(codegen_probe.UNCAPPED)}
    assert {n.split(" ")[0] for n in names} == {"recipe:gated_act/flat", "recipe:gated_act/tiles",
                                                "elementwise/rows"}
    for name in names:
        source, params = variants[name]
        params = {**params, "BLOCK": 512, "ITEMS": 1}
        one_row = {"num_tokens": 1, "d": 11008}
        capped = parse_launch_header(source).resolve(one_row, params)
        uncapped = parse_launch_header(variants[name + codegen_probe.UNCAPPED][0]).resolve(one_row, params)
        assert capped.block[0] == 32 and uncapped.block[0] == 512, name
        # Both launches cover the row, one 16-byte vector per thread at ITEMS=1.
        assert capped.grid[0] * 32 * 8 >= 11008 and uncapped.grid[0] * 512 * 8 >= 11008, name
        assert capped.grid[0] > uncapped.grid[0], name


def test_compare_fill_takes_merge_flat_and_leaves_merge_pairs():
    variants = codegen_probe.variants_of(codegen_probe.ROOT / "kernels" / "merge_attn_states_lse", grid=False,
                                         compare_fill=True)
    # merge/flat and the generated elementwise/rows have the cap; merge/pairs (a row of threads per
    # pair) has none and no twin.
    assert {n.split(" ")[0] for n in variants} == {"recipe:merge/flat", "elementwise/rows"}
    source, params = variants["recipe:merge/flat BLOCK=256,ITEMS=1,HINT=0"]
    from kernels.launch import parse_launch_header

    one_token = {"num_tokens": 1, "num_heads": 32, "head_dim": 128}
    assert parse_launch_header(source).resolve(one_token, params).block[0] == 32
    twin = variants["recipe:merge/flat BLOCK=256,ITEMS=1,HINT=0" + codegen_probe.UNCAPPED][0]
    assert parse_launch_header(twin).resolve(one_token, params).block[0] == 256
