"""The generated schedules run on the CPU (``tests/cuda_on_cpu.py``): outputs against the
spec's reference on small shapes, with short rows, rows off vector boundaries, partial tiles
and tails, in two dtypes (fp16 and fp32, or bf16 where a kernel has no fp32), at the default
tuning and at the last value of every parameter; for the unseen kernels, the library kernels
the generator reads, and a kernel written in the tests.

This checks what each thread reads and writes before a GPU is at hand; the GPU tests
(``tests/gpu/test_codegen_gpu.py``) remain the authority. Cluster schedules need the
hardware's distributed shared memory and are left to those."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agents.embedded.codegen import generate
from evaluators import validate as V
from evaluators.context import tolerances
from kernels.launch import parse_launch_header
from kernels.spec import KernelSpec, load_kernel
from tests import cuda_on_cpu
from tests.unit.test_codegen import _NEW_BASELINE, _NEW_SPEC, _kernel_here

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(bool(cuda_on_cpu.available()), reason=cuda_on_cpu.available() or "ok")

ROOT = Path(__file__).resolve().parents[2]
UNSEEN = ROOT / "experiments" / "unseen"
LIBRARY = ROOT / "kernels"

# Small shapes: short and long rows, row counts that are not multiples of a block's rows, tiles
# cut by the matrix's edge, rows off 16-byte boundaries where the spec allows them.
SHAPES = {
    "bias_gelu": [{"num_tokens": 3, "hidden": 1000}, {"num_tokens": 2, "hidden": 40}],
    "embedding_gather": [{"num_tokens": 5, "hidden": 264, "vocab": 50}],
    "kv_cache_write": [{"num_tokens": 7, "hidden": 136, "num_slots": 40}],
    "logits_mask_fill": [{"num_tokens": 3, "vocab": 1000}, {"num_tokens": 2, "vocab": 24}],
    "transpose_2d": [{"rows": 13, "cols": 200}, {"rows": 40, "cols": 72}, {"rows": 3, "cols": 8}],
    # Rows of 9000: longer than a block's registers hold at ITEMS=1 (the re-read part of a pass).
    "cross_entropy_rows": [{"num_tokens": 5, "vocab": 200}, {"num_tokens": 3, "vocab": 1000},
                           {"num_tokens": 9, "vocab": 24}, {"num_tokens": 2, "vocab": 9000}],
    "log_softmax_rows": [{"num_tokens": 5, "vocab": 200}, {"num_tokens": 3, "vocab": 1000},
                         {"num_tokens": 9, "vocab": 24}, {"num_tokens": 2, "vocab": 9000}],
    "l2norm_rows": [{"num_tokens": 5, "hidden": 200}, {"num_tokens": 3, "hidden": 1000},
                    {"num_tokens": 9, "hidden": 24}, {"num_tokens": 2, "hidden": 9000}],
    "minmax_quant_u8": [{"num_tokens": 5, "hidden": 208}, {"num_tokens": 3, "hidden": 1008},
                        {"num_tokens": 9, "hidden": 32}],
    # Library kernels the generator also reads (their recipes are not involved here).
    "rmsnorm": [{"num_tokens": 5, "hidden": 200}, {"num_tokens": 3, "hidden": 1000}, {"num_tokens": 9, "hidden": 24}],
    "fused_add_rmsnorm": [{"num_tokens": 5, "hidden": 200}, {"num_tokens": 9, "hidden": 24}],
    "gemma_fused_add_rmsnorm": [{"num_tokens": 5, "hidden": 200}, {"num_tokens": 9, "hidden": 24}],
    "layernorm": [{"num_tokens": 5, "hidden": 200}, {"num_tokens": 3, "hidden": 1000}],
    "per_token_fp8_quant": [{"num_tokens": 5, "hidden": 208}, {"num_tokens": 9, "hidden": 32}],
    "silu_and_mul": [{"num_tokens": 3, "d": 1000}, {"num_tokens": 2, "d": 40}],
    "gelu_and_mul": [{"num_tokens": 3, "d": 1000}],
    "gelu_tanh_and_mul": [{"num_tokens": 3, "d": 1000}],
    "merge_attn_states_lse": [{"num_tokens": 3, "num_heads": 5, "head_dim": 24},
                              {"num_tokens": 2, "num_heads": 4, "head_dim": 128}],
    # The kernel written in test_codegen: rows of 36 and 1028 elements (4-element multiples
    # only), so fp16's 8-element vectors leave a scalar tail.
    "centred_tanh": [{"n": 7, "width": 36}, {"n": 3, "width": 1028}],
}


def _cases() -> list[tuple[str, str]]:
    out = []
    for name in SHAPES:
        folder = next((d for d in (UNSEEN / name, LIBRARY / name) if d.is_dir()), None)
        out.append((str(folder) if folder else "", name))
    return out


def _spec(folder: str, tmp_path: Path) -> KernelSpec:
    if folder:
        return load_kernel(folder)
    return _kernel_here(tmp_path, "centred_tanh", _NEW_SPEC, _NEW_BASELINE)


def _poisoned(spec: KernelSpec, inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Every tensor's bytes, outputs filled with NaN (or 0x55 bytes) so that an element left
    unwritten cannot pass for a result."""
    out = {}
    for a in spec.args:
        if a.kind != "tensor":
            continue
        t = inputs[a.name].clone()
        if a.role == "out":
            if t.dtype.is_floating_point:
                t.fill_(float("nan"))
            else:
                t.view(torch.uint8).fill_(0x55)
        out[a.name] = t.contiguous().view(torch.uint8).numpy()
    return out


def _inputs(spec: KernelSpec, shapes: list[dict[str, int]], dtype: str, case: str = "random") -> list[dict[str, torch.Tensor]]:
    """The spec's inputs of ``case`` for each shape, on the CPU (seeded by the shape's position)."""
    return [spec.make_inputs(shape, getattr(torch, dtype), torch.Generator().manual_seed(n), case, "cpu")
            for n, shape in enumerate(shapes)]


def _run(spec: KernelSpec, source: str, dtype: str, params: dict[str, int], shapes: list[dict[str, int]],
         workdir: Path, made: list[dict[str, torch.Tensor]] | None = None,
         ) -> list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """Per shape: (the inputs it ran on, by default :func:`_inputs`' random ones, the written
    tensors after the kernel ran on them)."""
    made = _inputs(spec, shapes, dtype) if made is None else made
    results = cuda_on_cpu.run(spec, source, dtype, params,
                              [(shape, _poisoned(spec, inputs)) for shape, inputs in zip(shapes, made, strict=True)],
                              workdir)
    return [(inputs, {k: torch.from_numpy(b.copy()).view(inputs[k].dtype).reshape(inputs[k].shape)
                      for k, b in got.items()}) for inputs, got in zip(made, results, strict=True)]


def _compare(spec: KernelSpec, shapes: list[dict[str, int]],
             results: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]], dtype: str,
             params: dict[str, int]) -> None:
    """Each shape's written tensors (from :func:`_run`) against the spec's reference."""
    for shape, (inputs, got) in zip(shapes, results, strict=True):
        want = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
        finding = V.check_outputs(got, want, tolerances(spec, dtype), spec.compare, f"(shape {shape}, {dtype}, {params})")
        assert finding is None, finding.message


def _check(spec: KernelSpec, source: str, dtype: str, params: dict[str, int], workdir: Path,
           shapes: list[dict[str, int]] | None = None) -> None:
    """Runs ``source`` on ``shapes`` (default: the kernel's in SHAPES) and compares."""
    shapes = SHAPES[spec.name] if shapes is None else shapes
    for shape in shapes:
        spec.check_shape(shape)
    _compare(spec, shapes, _run(spec, source, dtype, params, shapes, workdir), dtype, params)


@pytest.mark.parametrize(("folder", "name"), _cases(), ids=[n for _, n in _cases()])
def test_generated_schedules_compute_the_reference_on_the_cpu(folder, name, tmp_path):
    spec = _spec(folder, tmp_path)
    dtypes = [d for d in ("float16", "float32", "bfloat16") if d in spec.dtypes][:2]
    ran = 0
    for schedule in generate(spec):
        if "cluster" in schedule.name:
            continue
        tune = parse_launch_header(schedule.source).tune
        for params in ({}, {k: v[-1] for k, v in tune.items()}):
            for dtype in dtypes:
                workdir = tmp_path / f"{schedule.name.replace('/', '_')}-{dtype}-{len(params)}"
                _check(spec, schedule.source, dtype, params, workdir)
                ran += 1
    assert ran, f"{spec.name}: no schedule to run"


def test_a_wrong_index_is_caught(tmp_path):
    """The tool fails a schedule with a planted indexing mistake (a transpose that stores each
    output row reversed, in bounds), so a pass above means something."""
    spec = load_kernel(UNSEEN / "transpose_2d")
    source = next(s.source for s in generate(spec) if s.name == "codegen:transpose/wide")
    planted = "out[j * cg_rows + (cg_rows - 1 - i)] = "
    assert "out[j * cg_rows + i] = " in source
    with pytest.raises(AssertionError, match="mismatch|expected"):
        _check(spec, source.replace("out[j * cg_rows + i] = ", planted), "float16", {}, tmp_path)


def test_rows_reread_in_groups_give_the_same_bits(tmp_path):
    """rows/block's RU (vectors re-read at a time past the registers) changes when loads are
    issued, not the order in which a thread folds its vectors: the outputs are bit-identical."""
    spec = load_kernel(UNSEEN / "log_softmax_rows")
    source = next(s.source for s in generate(spec) if s.name == "codegen:rows/block")
    shapes = [{"num_tokens": 2, "vocab": 9000}]
    got = [_run(spec, source, "float16", {"ITEMS": 1, "RU": ru}, shapes, tmp_path / f"ru{ru}")[0][1] for ru in (1, 4)]
    assert got[0].keys() == got[1].keys()
    assert all(torch.equal(got[0][k].view(torch.uint8), got[1][k].view(torch.uint8)) for k in got[0])

def test_rows_past_the_grids_y_limit_are_taken_in_turn(tmp_path):
    """elementwise/rows puts row groups on grid.y, which stops at 65535: the blocks then take
    the groups past it in turn. The same loop is run here with the cap lowered to 2 groups, on
    more groups than that, scalar tails and vectors both."""
    spec = load_kernel(UNSEEN / "bias_gelu")
    source = next(s.source for s in generate(spec) if s.name == "codegen:elementwise/rows")
    assert "65535))" in source.splitlines()[1]
    capped = source.replace("65535))", "2))", 1)
    shapes = [{"num_tokens": 37, "hidden": 40}, {"num_tokens": 9, "hidden": 1000}]
    assert parse_launch_header(capped).resolve(shapes[0], {"BLOCK": 128, "ITEMS": 1}).grid[1] == 2
    _check(spec, capped, "float16", {"BLOCK": 128, "ITEMS": 1}, tmp_path, shapes)


@pytest.mark.parametrize("folder", ["bias_gelu", "logits_mask_fill", "embedding_gather"])
def test_the_32_bit_and_64_bit_copies_write_the_same_bits(folder, tmp_path):
    """elementwise/rows runs a 32-bit copy when every index fits (every shape here) and the
    64-bit one past that (held-out shapes of 2^31 elements, GPU only); with the bound set to 0
    the 64-bit copy runs here too. A gather reads its row from memory: no 32-bit copy."""
    from agents.embedded.codegen.elementwise import INT32_LIMIT

    spec = load_kernel(UNSEEN / folder)
    source = next(s.source for s in generate(spec) if s.name == "codegen:elementwise/rows")
    limit = f"< {INT32_LIMIT}LL"
    if folder == "embedding_gather":
        assert limit not in source and "cg_run<VEC, int>" not in source
        return
    assert limit in source and "cg_run<VEC, int>" in source and "cg_run<1, long long>" in source
    shapes = SHAPES[folder]
    narrow = _run(spec, source, "float16", {}, shapes, tmp_path / "narrow")
    wide = _run(spec, source.replace(limit, "< 0LL"), "float16", {}, shapes, tmp_path / "wide")
    for (_, a), (_, b) in zip(narrow, wide, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)
    _compare(spec, shapes, wide, "float16", {})


def test_transposes_of_rows_off_vector_boundaries_on_both_sides(tmp_path):
    """A transpose whose spec allows any row length (the unseen one asks for multiples of 8):
    both sides of the generated transposes take their single-element paths, and the result
    is bit-exact."""
    text = (UNSEEN / "transpose_2d" / "spec.py").read_text()
    assert 'Arg("cols", "int", multiple_of=8)' in text
    spec = _kernel_here(tmp_path, "transpose_2d", text.replace('Arg("cols", "int", multiple_of=8)', 'Arg("cols", "int")'),
                        (UNSEEN / "transpose_2d" / "baseline.cu").read_text())
    shapes = [{"rows": 13, "cols": 37}, {"rows": 40, "cols": 75}, {"rows": 7, "cols": 3}]
    for schedule in generate(spec):
        for shape, (inputs, got) in zip(shapes, _run(spec, schedule.source, "float16", {}, shapes,
                                                      tmp_path / schedule.name.replace("/", "_")), strict=True):
            assert torch.equal(got["out"], inputs["x"].t()), f"{schedule.name} {shape}"


OFF_VECTORS = {
    "l2norm_rows": [{"num_tokens": 3, "hidden": 203}, {"num_tokens": 5, "hidden": 37}, {"num_tokens": 2, "hidden": 9001}],
    "log_softmax_rows": [{"num_tokens": 3, "vocab": 203}, {"num_tokens": 5, "vocab": 37}, {"num_tokens": 2, "vocab": 9001}],
    "transpose_2d": [{"rows": 13, "cols": 203}, {"rows": 40, "cols": 75}, {"rows": 3, "cols": 9}],
}


@pytest.mark.parametrize("folder", sorted(OFF_VECTORS))
def test_rows_off_vector_boundaries_take_the_out_of_line_scalar_paths(folder, tmp_path):
    """Rows whose length is no multiple of the vector width run the scalar paths, which the
    schedules call out of line (``__noinline__``: rows' ``cg_run_scalar``, transpose/wide's
    ``cg_load_scalar`` and ``cg_store_scalar``). The benchmark's specs promise multiples of 8,
    so a copy of the kernel folder without that promise reaches them here."""
    import shutil

    here = tmp_path / folder
    shutil.copytree(UNSEEN / folder, here)
    text = (here / "spec.py").read_text()
    assert "multiple_of=8" in text
    (here / "spec.py").write_text(text.replace("multiple_of=8", "multiple_of=1"))
    spec = load_kernel(here)
    ran = 0
    for schedule in generate(spec):
        if "cluster" in schedule.name:
            continue
        if schedule.name.startswith("codegen:rows"):
            assert "__noinline__ void cg_run_scalar(" in schedule.source
        if schedule.name == "codegen:transpose/wide":
            assert "__noinline__ void cg_load_scalar(" in schedule.source
            assert "__noinline__ void cg_store_scalar(" in schedule.source
        for dtype in ("float16", "float32"):
            workdir = tmp_path / f"{schedule.name.replace('/', '_')}-{dtype}"
            _check(spec, schedule.source, dtype, {}, workdir, OFF_VECTORS[folder])
            ran += 1
    assert ran >= 4


def test_row_outputs_read_their_gathers_early_and_still_compute_the_reference(tmp_path):
    """cross_entropy_rows' loss reads the target and the logit at it before the row's
    reductions (Emitter.preload_row_values and preload_gathers), no longer after them: on
    every edge case of the spec (ignored targets among them, whose gather is clamped to
    column 0), each non-cluster rows schedule still computes the reference, in fp16 and fp32."""
    spec = load_kernel(UNSEEN / "cross_entropy_rows")
    shapes = [{"num_tokens": 5, "vocab": 200}, {"num_tokens": 2, "vocab": 9000}]
    assert spec.edge_cases
    ran = 0
    for schedule in generate(spec):
        if "cluster" in schedule.name:
            continue
        body = schedule.source[schedule.source.index("void cg_run("):]
        # The gathered logit is read before the first reduction, not in the row writer's block.
        first_reduction = min(i for i in (body.find("_reduce<"), body.find("cg_online_group(")) if i >= 0)
        assert 0 <= body.find("logits[cg_base0 + ") < first_reduction, schedule.name
        for dtype in ("float16", "float32"):
            for case in spec.edge_cases:
                workdir = tmp_path / f"{schedule.name.replace('/', '_')}-{dtype}-{case}"
                got = _run(spec, schedule.source, dtype, {}, shapes, workdir, _inputs(spec, shapes, dtype, case))
                _compare(spec, shapes, got, dtype, {})
                ran += 1
    assert ran


def test_more_math_ops_and_tensor_clamp_bounds_compute_the_reference(tmp_path):
    """fmod and remainder of floats and of integers (remainder with the divisor's sign, as Python's %), inverse and hyperbolic
    trigonometry, erfc, and a clamp whose bounds are tensors (a row value below, a column
    above): every non-cluster schedule, fp16 and fp32, against the reference on the CPU."""
    old = "torch.clamp(a, min=0.0)"
    new = ("torch.clamp(torch.fmod(a, 1.5) + torch.remainder(a, -1.25) + torch.atan(a) + torch.sinh(a * 0.1)"
           " + torch.erfc(a * 0.3) + torch.asinh(a) + torch.cosh(a * 0.05) + torch.tan(a * 0.1)"
           " + torch.remainder((a * 4).to(torch.int64), -3) + torch.fmod((a * 4).to(torch.int64), 3),"
           " min=mu - 1.0, max=inputs[\"gain\"].float() + 2.0)")
    assert old in _NEW_SPEC
    spec = _kernel_here(tmp_path, "more_math", _NEW_SPEC.replace(old, new).replace('"centred_tanh"', '"more_math"'),
                        _NEW_BASELINE.replace("centred_tanh", "more_math"))
    shapes = SHAPES["centred_tanh"]
    ran = 0
    for schedule in generate(spec):
        if "cluster" in schedule.name:
            continue
        for dtype in ("float16", "float32"):
            _check(spec, schedule.source, dtype, {}, tmp_path / f"{schedule.name.replace('/', '_')}-{dtype}", shapes)
            ran += 1
    assert ran
