"""``python -m kernels.check``: the library passes; each single mistake in a kernel folder gives
its own one line and exit 1; the search stops on a broken folder with one line before Ray."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

from kernels.check import kernel_folders, main
from kernels.spec import LIBRARY_DIR, list_kernels

pytest.importorskip("cuda.bindings.nvrtc")
pytest.importorskip("torch")

SPEC = '''"""mul2: out = x * y, elementwise."""

from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    n = shape["n"]
    x = torch.randn(n, generator=generator, device=device)
    if case == "zeros":
        x = torch.zeros(n, device=device)
    y = torch.randn(n, generator=generator, device=device)
    return {"out": torch.empty(n, device=device, dtype=dtype), "x": x.to(dtype), "y": y.to(dtype)}


def reference(inputs, shape, constants):
    return {"out": inputs["x"].float() * inputs["y"].float()}


SPEC = KernelSpec(
    name="mul2",
    description="out[i] = x[i] * y[i] in fp32, rounded once.",
    args=(
        Arg("out", "tensor", role="out"),
        Arg("x", "tensor"),
        Arg("y", "tensor"),
        Arg("n", "int", multiple_of=8),
    ),
    search_shapes=({"n": 1024}, {"n": 4096}),
    heldout_shapes=({"n": 8200}, {"n": 24}),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 3 * s["n"] * (4 if dt == "float32" else 2),
    flops=lambda s: s["n"],
    edge_cases=("zeros",),
)
'''

BASELINE = '''// launch: grid=(cdiv(n, 256),) block=(256,) smem=0
extern "C" __global__ void mul2(scalar_t* out, const scalar_t* x, const scalar_t* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = static_cast<scalar_t>(static_cast<float>(x[i]) * static_cast<float>(y[i]));
}
'''

# One mistake each: (id, file, text replaced, replacement, what the one line says).
BROKEN = [
    ("wrong_role", "spec.py", 'Arg("x", "tensor")', 'Arg("x", "tensor", role="inout")',
     "reference returns no value for x (role inout)"),
    ("returns_a_read_arg", "spec.py", 'return {"out": inputs["x"].float() * inputs["y"].float()}',
     'return {"out": inputs["x"].float() * inputs["y"].float(), "y": inputs["y"].float()}',
     "reference returns y, whose role is 'in'"),
    ("missing_shape_symbol", "spec.py", 'search_shapes=({"n": 1024}, {"n": 4096})',
     'search_shapes=({"n": 1024}, {"m": 4096})', "must give exactly ['n']"),
    ("unknown_shape_key", "spec.py", '{"n": 8200}', '{"n": 8200, "batch": 2}', "must give exactly ['n']"),
    ("below_min_value", "spec.py", '{"n": 24}', '{"n": 0}', "below its min_value 1"),
    ("breaks_multiple_of", "spec.py", '{"n": 24}', '{"n": 20}', "n=20 is not a multiple of 8"),
    ("heldout_overlaps_search", "spec.py", '{"n": 8200}', '{"n": 4096}', "held-out shapes repeat search shapes"),
    ("bad_signature", "baseline.cu", "const scalar_t* y, int n", "const scalar_t* y, float n",
     "argument n must be of type int"),
    ("launch_names_unknown", "baseline.cu", "cdiv(n, 256)", "cdiv(size, 256)", "uses ['size']"),
    ("launch_too_large", "baseline.cu", "block=(256,)", "block=(2048,)", "2048 threads, more than 1024"),
    ("baseline_syntax_error", "baseline.cu", "if (i < n) out[i]", "if (i < n) out[i] +", "baseline does not compile"),
    ("baseline_prints", "baseline.cu", "if (i < n) out[i]", 'if (i == 0) printf("%d", n);\n    if (i < n) out[i]',
     "baseline refused for float16, bfloat16: the binary calls vprintf (device printf)"),
    ("baseline_includes_a_file", "baseline.cu", "// launch:", '#include "../spec.py"\n// launch:',
     'baseline refused before compiling: #include "../spec.py" is not allowed'),
    ("bytes_moved_too_small", "spec.py", 'lambda s, dt: 3 * s["n"]', 'lambda s, dt: 2 * s["n"]',
     "bytes_moved gives 4096 bytes at shape [1024] (float16, bfloat16), less than the 6144"),
    ("reads_its_out_buffer", "spec.py", 'return {"out": inputs["x"].float() * inputs["y"].float()}',
     'return {"out": inputs["x"].float() * inputs["y"].float() + 0 * inputs["out"].float()}',
     "reference reads out, whose role is 'out'"),
    ("changes_its_input", "spec.py", 'return {"out": inputs["x"].float() * inputs["y"].float()}',
     'r = inputs["x"].float() * inputs["y"].float()\n    inputs["x"].zero_()\n    return {"out": r}',
     "reference changes its argument x in place"),
    ("returns_wrong_shape", "spec.py", 'return {"out": inputs["x"].float() * inputs["y"].float()}',
     'return {"out": (inputs["x"].float() * inputs["y"].float())[1:]}',
     "reference returns out of shape [1023], its tensor has shape [1024]"),
    ("input_of_wrong_dtype", "spec.py", '"y": y.to(dtype)}', '"y": y}',
     "make_inputs makes y as float32; its argument says scalar"),
    ("input_missing", "spec.py", ', "y": y.to(dtype)}', "}", "make_inputs returns no tensor for y"),
    ("edge_case_fails", "spec.py", 'x = torch.zeros(n, device=device)', 'raise ValueError("no zeros yet")',
     "make_inputs fails (case zeros, float16, bfloat16, shape [1024]): ValueError: no zeros yet"),
    ("spec_syntax_error", "spec.py", "def reference(inputs, shape, constants):", "def reference(inputs, shape, constants)",
     "spec.py cannot be loaded: SyntaxError"),
    ("no_baseline", "baseline.cu", None, None, "missing"),
    ("description_todo", "spec.py", 'description="out[i] = x[i] * y[i] in fp32, rounded once."',
     'description="TODO: describe the kernel for the agents."', "description still says TODO"),
    # Compiles and passes admission, but computes out = x: only running it shows that.
    ("baseline_computes_the_wrong_thing", "baseline.cu", "static_cast<float>(x[i]) * static_cast<float>(y[i])",
     "static_cast<float>(x[i])", "baseline INCORRECT: out[0]: expected"),
]


def named(name: str) -> tuple[str, str, str | None, str | None, str]:
    (case,) = [c for c in BROKEN if c[0] == name]
    return case


def write_kernel(folder: Path, spec: str = SPEC, baseline: str | None = BASELINE) -> Path:
    folder.mkdir(parents=True)
    (folder / "spec.py").write_text(spec)
    if baseline is not None:
        (folder / "baseline.cu").write_text(baseline)
    return folder


def broken_kernel(root: Path, case: tuple[str, str, str | None, str | None, str]) -> Path:
    name, file, old, new, _ = case
    files = {"spec.py": SPEC, "baseline.cu": BASELINE}
    if old is None:
        del files[file]
    else:
        assert old in files[file], f"{name}: the template no longer holds {old!r}"
        files[file] = files[file].replace(old, new or "", 1)
    return write_kernel(root / name / "mul2", files["spec.py"], files.get("baseline.cu"))


def test_every_library_kernel_passes(capsys):
    assert main([str(LIBRARY_DIR)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(list_kernels()) >= 14
    assert all(": OK (" in line for line in lines), lines


def test_the_template_kernel_passes(tmp_path, compile_cache, capsys):
    folder = write_kernel(tmp_path / "mul2")
    assert main([str(folder)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{folder}: OK (mul2: baseline compiles for float16, bfloat16; reference checked on 2 input case(s); "
        "baseline matches it on the CPU emulator at small shapes)"]


@pytest.mark.parametrize("case", BROKEN, ids=[c[0] for c in BROKEN])
def test_one_mistake_gives_its_one_line(case, tmp_path, compile_cache, capsys):
    folder = broken_kernel(tmp_path, case)
    assert main([str(folder)]) == 1
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{folder}: ")
    assert case[4] in lines[0], lines[0]
    assert "Traceback" not in out.out + out.err


def test_a_folder_of_folders_reports_each_kernel(tmp_path, compile_cache, capsys):
    write_kernel(tmp_path / "lib" / "good")
    broken_kernel(tmp_path / "lib", named("wrong_role"))  # lib/wrong_role/mul2: not directly under lib
    shutil.move(str(tmp_path / "lib" / "wrong_role" / "mul2"), str(tmp_path / "lib" / "bad"))
    assert sorted(p.name for p in kernel_folders(tmp_path / "lib")) == ["bad", "good"]
    assert main([str(tmp_path / "lib")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [str(tmp_path / "lib" / "bad"), str(tmp_path / "lib" / "good")]
    assert ": OK (" in lines[1]


def test_a_folder_without_kernels_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert capsys.readouterr().out == f"{tmp_path}: not a kernel folder (no spec.py) and holds no kernel folders (NAME/spec.py)\n"


def test_bytes_moved_floor_leaves_out_what_a_scatter_does_not_touch():
    """reshape_and_cache writes a few slots of large caches: only those count, so its honest
    bytes_moved (far below the caches' size) passes, and one that forgets the reads does not."""
    import torch

    from kernels.check_run import smallest_shape, traffic_floor
    from kernels.spec import load_kernel

    spec = load_kernel("reshape_and_cache")
    shape = smallest_shape(spec)
    inputs = spec.make_inputs(shape, torch.float16, torch.Generator().manual_seed(0), "random", torch.device("cpu"))
    expected = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
    floor = traffic_floor(spec, shape, inputs, expected)
    row = shape["num_tokens"] * shape["num_kv_heads"] * shape["head_size"] * 2
    assert floor == {"key_cache written": row, "value_cache written": row, "key read": row, "value read": row,
                     "key_cache read": 0, "value_cache read": 0}
    assert sum(floor.values()) <= spec.bytes_moved(shape, "float16") < inputs["key_cache"].numel()


def test_bytes_moved_floor_ignores_what_an_out_buffer_held(tmp_path):
    """An ``out`` buffer comes from torch.empty: memory that may already hold the result (a
    freed tensor of the same values). The read floor must not drop the elements where it does,
    as it does for an ``inout`` tensor the reference leaves unchanged."""
    import torch

    from kernels.check_run import traffic_floor
    from kernels.spec import load_kernel

    spec = load_kernel(write_kernel(tmp_path / "mul2"))
    shape = {"n": 1024}
    inputs = spec.make_inputs(shape, torch.bfloat16, torch.Generator().manual_seed(0), "random", torch.device("cpu"))
    expected = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
    clean = traffic_floor(spec, shape, inputs, expected)
    inputs["out"].copy_(expected["out"])  # what the allocator may hand back
    assert traffic_floor(spec, shape, inputs, expected) == clean == {
        "out written": 2048, "x read": 2048, "y read": 2048}


def test_the_search_stops_on_a_broken_folder_with_one_line_before_ray(tmp_path, compile_cache, capsys):
    import ray

    from search.run import main as run_main

    library = tmp_path / "lib"
    write_kernel(library / "good")
    broken = broken_kernel(tmp_path, named("baseline_syntax_error"))
    shutil.move(str(broken), str(library / "broken"))
    code = run_main(["--kernel-dir", str(library), "--evaluator", "standin", "--out", str(tmp_path / "runs")])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {(library / 'broken').resolve()}: baseline does not compile for float16")
    assert not ray.is_initialized()
    assert not (tmp_path / "runs").exists()


def test_the_sweep_stops_on_a_broken_folder_with_one_line(tmp_path, compile_cache, capsys):
    from search.sweep import main as sweep_main

    library = tmp_path / "lib"
    library.mkdir()
    broken = broken_kernel(tmp_path, named("bytes_moved_too_small"))
    shutil.move(str(broken), str(library / "mul2"))
    code = sweep_main(["--library", str(library), "--evaluator", "standin", "--out", str(tmp_path / "runs")])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert "mul2: bytes_moved gives 4096 bytes at shape [1024] (float16)" in err


@pytest.mark.parametrize("entry", ["search.run", "search.sweep"])
@pytest.mark.parametrize("case", ["spec_syntax_error", "edge_case_fails"])
def test_a_broken_spec_stops_a_run_or_sweep_with_one_line(entry, case, tmp_path, capsys):
    """spec.py's own error (a syntax error, an exception at import) is one line, before Ray."""
    folder = broken_kernel(tmp_path / "lib", named(case)).parent
    if case == "edge_case_fails":  # make spec.py itself raise at import, not only make_inputs
        (folder / "mul2" / "spec.py").write_text("raise ValueError('no zeros yet')\n")
    run_main = importlib.import_module(entry).main
    flag = "--kernel-dir" if entry == "search.run" else "--library"
    assert run_main([flag, str(folder), "--evaluator", "standin", "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {folder / 'mul2' / 'spec.py'} cannot be loaded: "), err
    assert ("SyntaxError" if case == "spec_syntax_error" else "ValueError: no zeros yet") in err
