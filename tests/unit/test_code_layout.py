"""experiments.code_layout: reads nvdisasm's text right, and stops with exit code 2 when no
nvdisasm is found."""

from __future__ import annotations

import pytest

from experiments import code_layout

SASS = """
        .section	.text.k,"ax",@progbits
k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA `(.L_x_0) ;
        /*0020*/                   CALL.REL.NOINC `($k$_Z13cg_run_scalarPf) ;
        /*0030*/                   EXIT ;
.L_x_0:
        /*0040*/                   LDG.E.64.CONSTANT R14, desc[UR12][R14.64] ;
        /*0050*/              @!P1 LDG.E.128.CONSTANT R4, desc[UR12][R12.64] ;
        /*0060*/                   STG.E.128 desc[UR4][R22.64], R4 ;
        /*0070*/                   EXIT ;
"""


def test_layout_reads_the_first_16_byte_load_the_instructions_and_the_calls() -> None:
    assert code_layout.layout(SASS) == {"instructions": 8, "first_16B_load": 0x50, "calls": 1}
    assert code_layout.layout(SASS.replace("LDG.E.128", "LDG.E.64"))["first_16B_load"] is None


def test_without_nvdisasm_it_stops_with_exit_code_2(monkeypatch) -> None:
    monkeypatch.setattr(code_layout, "nvdisasm", lambda: None)
    assert code_layout.main([]) == 2


def test_it_lays_out_one_recipe_when_nvdisasm_is_here(tmp_path) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    disassembler = code_layout.nvdisasm()
    if disassembler is None:
        pytest.skip("no nvdisasm here")
    from pathlib import Path

    rows = code_layout.run(Path(code_layout.__file__).resolve().parents[1], disassembler)
    row = next(r for r in rows if r["kernel"] == "silu_and_mul" and r["variant"] == "recipe:gated_act/tiles")
    assert row["first_16B_load"] is not None and row["instructions"] > 0
