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


# row_norm/prefetch: ptxas lays the call of the idle rows' function (three instructions) before
# the vector path whatever the source says, so an active row jumps over that one call site.
@pytest.mark.parametrize(("kernel", "recipe", "calls"), [("silu_and_mul", "recipe:gated_act/tiles", 0),
                                                         ("gelu_and_mul", "recipe:gated_act/tiles", 0),
                                                         ("merge_attn_states_lse", "recipe:merge/pairs", 0),
                                                         ("fused_add_rmsnorm", "recipe:row_norm/prefetch", 1)])
def test_the_common_path_comes_straight_after_the_entry(kernel, recipe, calls, tmp_path) -> None:
    """These recipes lay their vector path right after the entry: the out-of-line paths (scalar,
    rows past the grid, idle rows) come after the first 16-byte load, but for ``calls`` call
    sites, and no unconditional jump precedes it, at their default tuning with fast math (sm_90)."""
    import re
    import subprocess

    pytest.importorskip("cuda.bindings.nvrtc")
    disassembler = code_layout.nvdisasm()
    if disassembler is None:
        pytest.skip("no nvdisasm here")
    from agents.embedded.recipes import recipes_for
    from evaluators.admit import Artifact, admit
    from kernels.launch import parse_launch_header
    from kernels.spec import load_kernel

    spec = load_kernel(kernel)
    source = "// flags: --use_fast_math\n" + next(r.build(spec) for r in recipes_for(spec) if r.name == recipe)
    params = {k: v[0] for k, v in parse_launch_header(source).tune.items()}
    art = admit(spec, source, spec.dtypes[0], params, arch="sm_90")
    assert isinstance(art, Artifact), art
    (tmp_path / "k.cubin").write_bytes(art.cubin)
    sass = subprocess.run([disassembler, "-c", str(tmp_path / "k.cubin")], capture_output=True, text=True,
                          check=True).stdout
    entry = sass.split(f".text.{spec.name}:", 1)[1]  # the kernel's own function, first in its section
    texts = [m.group(2) for m in (code_layout._INSTRUCTION.match(line) for line in entry.splitlines()) if m]
    first_load = next(i for i, t in enumerate(texts) if code_layout._WIDE_LOAD.search(t))
    before = texts[:first_load]
    assert sum("CALL" in t for t in before) <= calls, before
    assert not any(re.match(r"BRA\b", t) for t in before), before  # unpredicated: every block would take it
