"""experiments.code_fetch: its probe kernels compile to the sizes the experiment relies on,
it finds a run's winners, and without a GPU it stops with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import code_fetch

UNSEEN = Path(__file__).resolve().parents[2] / "experiments" / "unseen"


def test_the_probes_grow_with_the_instructions_they_are_given() -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from kernels.nvrtc import compile_program

    sizes = {}
    for name, opts in code_fetch._kernels().items():
        out = compile_program(code_fetch.SOURCE, [*code_fetch._options(*opts), "-arch=sm_90"])
        assert out.ok, out.log
        sizes[name] = code_fetch.text_bytes(out.cubin, "probe")
    # 16 bytes an instruction: every instruction asked for is in the probe's code.
    assert sizes["exec 4096"] - sizes["exec 0"] >= 4096 * 16
    assert sizes["dead 4096"] - sizes["exec 0"] >= 4096 * 16
    assert sizes["jumps 16"] - sizes["exec 0"] >= 16 * code_fetch.GAP * 16
    # The skipped code of one jump and of sixteen is about the same size: what differs is
    # the number of jumps.
    assert abs(sizes["jumps 16"] - sizes["dead 4096"]) < 0.05 * sizes["dead 4096"]


def test_text_bytes_is_none_for_what_is_not_a_cubin_of_that_entry() -> None:
    assert code_fetch.text_bytes(b"not an ELF file at all", "probe") is None
    pytest.importorskip("cuda.bindings.nvrtc")
    from kernels.nvrtc import compile_program

    out = compile_program(code_fetch.SOURCE, [*code_fetch._options(0, 0, 0), "-arch=sm_90"])
    assert code_fetch.text_bytes(out.cubin, "other") is None
    assert 0 < code_fetch.text_bytes(out.cubin, "probe") < len(out.cubin)


def test_winners_are_read_from_a_run_for_the_library_kernels_only(tmp_path: Path) -> None:
    best = tmp_path / "sweep-x" / "sweep-x" / "best"
    best.mkdir(parents=True)
    record = {"variant": {"source": "// src", "id": "abc"}, "params": {"BLOCK": 128}}
    (best / "bias_gelu.json").write_text(json.dumps(record))
    (best / "not_in_the_library.json").write_text(json.dumps(record))
    (best / "transpose_2d.json").write_text(json.dumps({"status": "no winner"}))
    found = code_fetch.winners(tmp_path, UNSEEN)
    assert found == {UNSEEN / "bias_gelu": {"source": "// src", "params": {"BLOCK": 128}, "variant_id": "abc"}}


def test_without_a_gpu_it_says_so(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert code_fetch.main([]) == 2
