"""experiments.code_fetch: its probe kernels compile to the sizes the experiment relies on,
and without a GPU it stops with exit code 2."""

from __future__ import annotations

import pytest

from experiments import code_fetch


def test_the_probes_grow_with_the_instructions_they_are_given() -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from kernels.nvrtc import compile_program

    sizes = {}
    for name, (p, d) in code_fetch._kernels().items():
        out = compile_program(code_fetch.SOURCE, [f"-DEXEC={p}", f"-DDEAD={d}", "-arch=sm_90"])
        assert out.ok, out.log
        sizes[name] = len(out.cubin)
    # Every 4 FMAs asked for add 64 bytes of code at least (16 bytes an instruction).
    assert sizes["exec 4096"] - sizes["exec 0"] >= 4096 * 16
    assert sizes["dead 4096"] - sizes["exec 0"] >= 4096 * 16


def test_without_a_gpu_it_says_so(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert code_fetch.main([]) == 2
