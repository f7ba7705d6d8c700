"""Kernel specs: consistency checks at construction, the signature check, the loader."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kernels.spec import (
    Arg,
    KernelSpec,
    KernelSpecError,
    check_signature,
    list_kernels,
    load_kernel,
)

ARGS = (Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("n", "int"), Arg("eps", "float"))


def _spec(**changes: Any) -> KernelSpec:
    fields: dict[str, Any] = {
        "name": "scale",
        "description": "out = x * 2",
        "args": ARGS,
        "search_shapes": ({"n": 1024},),
        "heldout_shapes": ({"n": 77},),
        "make_inputs": lambda *a: {},
        "reference": lambda *a: {},
        "bytes_moved": lambda s, dt: 4 * s["n"],
        "flops": lambda s: s["n"],
        "constants": {"eps": 1e-6},
    }
    fields.update(changes)
    return KernelSpec(**fields)


def test_a_consistent_spec_is_accepted() -> None:
    spec = _spec()
    assert spec.shape_symbols == ("n",)
    assert [a.name for a in spec.written_args] == ["out"]
    assert spec.shapes("heldout") == ({"n": 77},)
    assert spec.tolerance("float16") == (4e-3, 1e-4)
    assert _spec(tolerances={"float16": (1e-2, 1e-3)}).tolerance("float16") == (1e-2, 1e-3)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"args": (*ARGS, Arg("x", "tensor"))}, "argument names repeat"),
        ({"args": (Arg("x", "tensor"), Arg("n", "int"))}, "no argument is written"),
        ({"dtypes": ("float16", "float64")}, "unsupported run dtype"),
        ({"dtypes": ()}, "no run dtypes"),
        ({"constants": {}}, "float argument eps needs a value"),
        ({"search_shapes": ()}, "no search shapes"),
        ({"heldout_shapes": ()}, "no held-out shapes"),
        ({"search_shapes": ({"n": 1024, "d": 4},)}, "must give exactly"),
        ({"heldout_shapes": ({},)}, "must give exactly"),
        ({"search_shapes": ({"n": 0},)}, "non-positive size"),
        ({"heldout_shapes": ({"n": -3},)}, "non-positive size"),
        ({"heldout_shapes": ({"n": 1024},)}, "held-out shapes repeat search shapes"),
    ],
)
def test_inconsistent_specs_are_refused(changes: dict[str, Any], fragment: str) -> None:
    with pytest.raises(KernelSpecError, match=fragment):
        _spec(**changes)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"name": "2x", "kind": "tensor"}, "not a C identifier"),
        ({"name": "x-y", "kind": "int"}, "not a C identifier"),
        ({"name": "x", "kind": "pointer"}, "kind must be"),
        ({"name": "x", "kind": "tensor", "role": "both"}, "role must be"),
        ({"name": "x", "kind": "tensor", "dtype": "float64"}, "unknown dtype"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(KernelSpecError, match=fragment):
        Arg(**kwargs)


def test_spec_errors_name_the_problem_for_shape_sets_and_directories() -> None:
    spec = _spec()
    with pytest.raises(KernelSpecError, match="'search' or 'heldout'"):
        spec.shapes("test")
    with pytest.raises(KernelSpecError, match="load it with load_kernel"):
        spec.baseline_source()


GOOD = 'extern "C" __global__ void scale(scalar_t* out, const scalar_t* x, int n, float eps) {}'


@pytest.mark.parametrize(
    "source",
    [
        GOOD,
        'extern "C" __global__ void scale(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,\n'
        "                                 const int n, const float eps) {}",
        'extern "C" __global__ __launch_bounds__(256) void scale(scalar_t *out, scalar_t const *x, int n, float eps) {}',
        'extern "C" __global__ void __launch_bounds__(1024, 2) scale(scalar_t*, const scalar_t*, int, float) {}',
    ],
)
def test_signatures_with_qualifiers_and_launch_bounds_are_accepted(source: str) -> None:
    check_signature(_spec(), source)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("__global__ void scale(scalar_t* out, const scalar_t* x, int n, float eps) {}", "no entry point"),
        (GOOD.replace("scale(", "scale_v2("), "no entry point"),
        (GOOD + "\n" + GOOD, "more than once"),
        ('extern "C" __global__ void scale(scalar_t* out, const scalar_t* x, int n) {}', "must take 4 arguments"),
        (GOOD.replace("int n", "int n, int m"), "must take 4 arguments"),
        (GOOD.replace("const scalar_t* x", "const __half* x"), "argument x must be of type scalar_t*"),
        (GOOD.replace("const scalar_t* x", "const scalar_t x"), "argument x must be of type scalar_t*"),
        (GOOD.replace("scalar_t* out", "scalar_t** out"), "argument out must be of type scalar_t*"),
        (GOOD.replace("int n", "long long n"), "argument n must be of type int"),
        (GOOD.replace("int n", "int* n"), "argument n must be of type int"),
        (GOOD.replace("float eps", "double eps"), "argument eps must be of type float"),
    ],
)
def test_signature_mismatches_are_refused(source: str, fragment: str) -> None:
    with pytest.raises(KernelSpecError, match=fragment):
        check_signature(_spec(), source)


FORWARD = 'extern "C" __global__ void __cluster_dims__(2, 1, 1) scale(scalar_t* out, const scalar_t* x, int n, float eps);'


def test_a_forward_declaration_and_one_definition_are_accepted() -> None:
    """An honest kernel may declare its entry point before helpers that name it, then define it."""
    defined = GOOD.replace("void scale(", "void __cluster_dims__(2, 1, 1) scale(")
    check_signature(_spec(), FORWARD + "\n__device__ int helper();\n" + defined)
    check_signature(_spec(), FORWARD + "\n" + FORWARD + "\n" + defined)  # C++ allows repeating it


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (FORWARD + "\n" + GOOD + "\n" + GOOD, "defined more than once"),
        (FORWARD, r"no entry point .* \(only a declaration\)"),
        (FORWARD.replace("float eps", "double eps") + "\n" + GOOD, "argument eps must be of type float"),
    ],
)
def test_declarations_do_not_hide_a_second_definition_or_a_wrong_signature(source: str, fragment: str) -> None:
    with pytest.raises(KernelSpecError, match=fragment):
        check_signature(_spec(), source)


def test_fixed_dtype_arguments_keep_their_c_type() -> None:
    spec = _spec(args=(*ARGS[:2], Arg("idx", "tensor", dtype="int64"), *ARGS[2:]))
    source = GOOD.replace("int n", "const long long* idx, int n")
    check_signature(spec, source)
    with pytest.raises(KernelSpecError, match="argument idx must be of type long long\\*"):
        check_signature(spec, GOOD.replace("int n", "const scalar_t* idx, int n"))


def test_library_kernel_loads_with_its_baseline() -> None:
    assert "silu_and_mul" in list_kernels()
    spec = load_kernel("silu_and_mul")
    assert spec.directory is not None and spec.directory.name == "silu_and_mul"
    assert 'extern "C" __global__ void silu_and_mul' in spec.baseline_source()
    assert spec.shape_symbols == ("num_tokens", "d")


SPEC_PY = """
from kernels.spec import Arg, KernelSpec

SPEC = KernelSpec(
    name="scale",
    description="out = x * 2",
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("n", "int")),
    search_shapes=({"n": 1024},),
    heldout_shapes=({"n": 77},),
    make_inputs=lambda *a: {},
    reference=lambda *a: {},
    bytes_moved=lambda s, dt: 4 * s["n"],
    flops=lambda s: s["n"],
)
"""
BASELINE = """// launch: grid=(cdiv(n, 256),) block=(256,)
extern "C" __global__ void scale(scalar_t* out, const scalar_t* x, int n) {}
"""


def _kernel_dir(tmp_path: Path, spec_py: str = SPEC_PY, baseline: str | None = BASELINE) -> Path:
    folder = tmp_path / "scale"
    folder.mkdir()
    (folder / "spec.py").write_text(textwrap.dedent(spec_py))
    if baseline is not None:
        (folder / "baseline.cu").write_text(baseline)
    return folder


def test_a_kernel_folder_loads_by_path(tmp_path: Path) -> None:
    spec = load_kernel(_kernel_dir(tmp_path))
    assert spec.name == "scale"
    assert spec.baseline_path == (tmp_path / "scale" / "baseline.cu").resolve()
    assert list_kernels(tmp_path) == ["scale"]


@pytest.mark.parametrize(
    ("spec_py", "baseline", "fragment"),
    [
        (SPEC_PY, None, "missing .*baseline.cu"),
        ("SPEC = 3\n", BASELINE, "must define SPEC"),
        (SPEC_PY, BASELINE.replace("// launch:", "// lunch:"), "baseline launch header"),
        (SPEC_PY, BASELINE.replace("cdiv(n, 256)", "cdiv(rows, 256)"), "baseline launch header.*rows"),
        (SPEC_PY, BASELINE.replace(", int n)", ")"), "must take 3 arguments"),
    ],
)
def test_broken_kernel_folders_are_refused(tmp_path: Path, spec_py: str, baseline: str | None, fragment: str) -> None:
    with pytest.raises(KernelSpecError, match=fragment):
        load_kernel(_kernel_dir(tmp_path, spec_py, baseline))


def test_an_unknown_kernel_name_lists_the_library() -> None:
    with pytest.raises(KernelSpecError, match="no kernel 'no_such_kernel'.*silu_and_mul"):
        load_kernel("no_such_kernel")


def test_specs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        _spec().name = "other"  # type: ignore[misc]
