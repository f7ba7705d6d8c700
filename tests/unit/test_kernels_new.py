"""``python -m kernels.new``: the skeleton fails ``kernels.check`` with one clear line per TODO
kind until it is filled, and passes once its TODOs are filled with a simple kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels import check, new

pytest.importorskip("cuda.bindings.nvrtc")
pytest.importorskip("torch")

# The TODO lines of the skeleton and what fills them: out = 2 * x, elementwise.
FILLS = {
    "spec.py": {
        '    raise NotImplementedError("TODO: make_inputs: return {arg name: tensor} for every tensor argument")':
            '    n = shape["n"]\n'
            '    x = torch.zeros(n, device=device) if case == "zeros" else torch.randn(n, generator=generator, device=device)\n'
            '    return {"out": torch.empty(n, device=device, dtype=dtype), "x": x.to(dtype)}',
        '    raise NotImplementedError("TODO: reference: return {written arg name: fp32 tensor}")':
            '    return {"out": 2.0 * inputs["x"].float()}',
        '    raise NotImplementedError("TODO: bytes_moved: bytes read + bytes written at this shape")':
            '    return 2 * shape["n"] * (4 if dtype == "float32" else 2)',
        '    raise NotImplementedError("TODO: flops: operations per launch at this shape")':
            '    return shape["n"]',
        "    edge_cases=(),": '    edge_cases=("zeros",),',
        '        "TODO: describe the kernel for the agents."':
            '        "x [n] -> out [n], out = 2 * x, computed in fp32 and rounded once; contiguous."',
    },
    "baseline.cu": {
        '#error "TODO: write the kernel below for the spec\'s arguments, then delete this line"\n': "",
        "        out[i] = x[i];": "        out[i] = static_cast<scalar_t>(2.0f * static_cast<float>(x[i]));",
    },
}


def fill(folder: Path, skip: str = "") -> None:
    """Fills every TODO of the skeleton except those whose text contains ``skip``."""
    for file, fills in FILLS.items():
        path = folder / file
        text = path.read_text()
        for old, replacement in fills.items():
            assert text.count(old) == 1, f"{file} no longer holds {old!r}"
            if not skip or skip not in old:
                text = text.replace(old, replacement)
        path.write_text(text)


def test_the_new_command_writes_the_two_files(tmp_path, capsys):
    assert new.main(["scale2", "--dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in (tmp_path / "scale2").iterdir()) == ["baseline.cu", "spec.py"]
    assert f"python -m kernels.check {tmp_path / 'scale2'}" in capsys.readouterr().out
    assert 'name="scale2"' in (tmp_path / "scale2" / "spec.py").read_text()
    assert 'void scale2(scalar_t* out' in (tmp_path / "scale2" / "baseline.cu").read_text()


@pytest.mark.parametrize("argv, says", [
    (["9lives"], "is not a C identifier"),
    (["scale2"], "already exists"),
])
def test_the_new_command_refuses_with_one_line(argv, says, tmp_path, capsys):
    (tmp_path / "scale2").mkdir()
    assert new.main([*argv, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and len(err.splitlines()) == 1


def test_the_unfilled_skeleton_fails_with_a_line_per_todo(tmp_path, compile_cache, capsys):
    folder = new.write_skeleton("scale2", tmp_path)
    assert check.main([str(folder)]) == 1
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert "Traceback" not in out.out + out.err
    assert all(line.startswith(f"{folder}: ") and "TODO" in line for line in lines), lines
    for todo in ("make_inputs", "bytes_moved", "flops", "baseline does not compile"):
        assert any(todo in line for line in lines), (todo, lines)


def test_the_filled_skeleton_passes(tmp_path, compile_cache, capsys):
    folder = new.write_skeleton("scale2", tmp_path)
    fill(folder)
    assert check.main([str(folder)]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.splitlines() == [
        f"{folder}: OK (scale2: baseline compiles for float16, bfloat16; reference checked on 2 input case(s); "
        "baseline matches it on the CPU emulator at small shapes)"]


@pytest.mark.parametrize("left, says", [
    ("TODO: reference", "reference fails (case random, zeros, float16, bfloat16, shape [4096]): NotImplementedError: TODO"),
    ("TODO: bytes_moved", "bytes_moved fails at search shape [4096] (float16): NotImplementedError: TODO"),
    ("#error", "baseline does not compile for float16, bfloat16"),
    ("TODO: describe", "description still says TODO ('TODO: describe the kernel for the agents.')"),
])
def test_each_todo_left_is_named(left, says, tmp_path, compile_cache, capsys):
    folder = new.write_skeleton("scale2", tmp_path)
    fill(folder, skip=left)
    assert check.main([str(folder)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and says in lines[0], lines
