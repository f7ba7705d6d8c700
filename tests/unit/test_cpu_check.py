"""Correctness without a GPU: kernels run on the CPU emulator against their reference.

A kernel that computes the wrong thing (``out = x``) is INCORRECT for ``check_on_cpu``, for
``python -m evaluators.check --cpu`` and for the stand-in evaluator, while the real baseline
is OK on each; a kernel the emulator cannot run is never OK; the gated kernels' ``outliers``
case catches gate * up formed in fp16, and their baselines and recipes still pass it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluators.api import EvalRequest
from evaluators.check import main as check_main
from evaluators.standin import StandinEvaluator
from kernels import cpu_run
from kernels.cpu_check import UNVERIFIED, check_on_cpu, cpu_shapes
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Status

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(bool(cpu_run.available()), reason=cpu_run.available() or "ok")

ADVERSARIAL = Path(__file__).resolve().parents[1] / "adversarial"
PRODUCT = "dst[i] = static_cast<scalar_t>(silu * u);"


@pytest.fixture(scope="module")
def silu():
    return load_kernel("silu_and_mul")


def _copy_of_gate(spec) -> str:
    """The baseline with ``out = gate``: compiles, passes admission, computes the wrong thing."""
    source = spec.baseline_source()
    assert PRODUCT in source
    return source.replace(PRODUCT, "dst[i] = gate[i];")


def test_small_shapes_are_the_smallest_search_shapes(silu):
    assert cpu_shapes(silu) == [{"num_tokens": 1, "d": 11008}, {"num_tokens": 16, "d": 14336}]
    assert cpu_shapes(silu, max_elements=10) == [{"num_tokens": 1, "d": 11008}]  # always one shape


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_wrong_kernel_is_incorrect_and_the_baseline_ok(silu, dtype, tmp_path):
    wrong = check_on_cpu(silu, _copy_of_gate(silu), dtype, cache_dir=tmp_path)
    assert wrong.status is Status.INCORRECT and not wrong.verified
    assert "out[0, 0]: expected" in wrong.message and f"CPU emulator: case random, {dtype}" in wrong.message
    right = check_on_cpu(silu, silu.baseline_source(), dtype, cache_dir=tmp_path)
    assert right.verified, right.message
    assert right.cases == ("random", "zeros", "wide", "range", "outliers")
    # The verdicts are cached: the same answer again, now from disk.
    assert check_on_cpu(silu, _copy_of_gate(silu), dtype, cache_dir=tmp_path) == wrong
    assert len(list((tmp_path / "cpu").rglob("*.json"))) == 2


def test_an_unwritten_tail_is_incorrect(silu, tmp_path):
    """Output buffers start as NaN: elements a kernel never writes cannot pass."""
    half = silu.baseline_source().replace("i < d;", "i < d / 2;")
    verdict = check_on_cpu(silu, half, "float16", cache_dir=tmp_path)
    assert verdict.status is Status.INCORRECT and "got nan" in verdict.message


def test_a_kernel_the_emulator_cannot_run_is_never_ok(silu, tmp_path):
    ptx = silu.baseline_source().replace(
        "const float u = static_cast<float>(up[i]);",
        'float u = static_cast<float>(up[i]);\n        asm volatile("mov.b32 %0, %0;" : "+f"(u));')
    verdict = check_on_cpu(silu, ptx, "float16", cache_dir=tmp_path)
    assert verdict.status is Status.REJECTED and verdict.guard == UNVERIFIED
    assert verdict.message.startswith("not checked on the CPU: the emulator cannot build this kernel")


def test_a_trap_is_a_crash(silu, tmp_path):
    trap = silu.baseline_source().replace("const float g =", "if (i == 5) __trap();\n        const float g =")
    verdict = check_on_cpu(silu, trap, "float16", cache_dir=tmp_path)
    assert verdict.status is Status.CRASH and "__trap" in verdict.message


def test_evaluators_check_cpu_says_incorrect_or_ok(silu, tmp_path, compile_cache, capsys):
    wrong = tmp_path / "wrong.cu"
    wrong.write_text(_copy_of_gate(silu))
    assert check_main(["--kernel", "silu_and_mul", str(wrong), "--cpu"]) == 1
    out = capsys.readouterr().out
    assert "silu_and_mul [float16] on the CPU emulator (correctness only, no timing): INCORRECT" in out
    assert check_main(["--kernel", "silu_and_mul", str(silu.baseline_path), "--cpu", "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["status"] == "OK" and verdict["cpu"] is True
    assert verdict["cpu_shapes"] == cpu_shapes(silu)


def test_the_standin_validates_every_proposal(silu, tmp_path):
    evaluator = StandinEvaluator(cache_dir=tmp_path)

    def evaluate(source: str, shape_set: str = "search"):
        return evaluator.evaluate(EvalRequest("silu_and_mul", Variant("silu_and_mul", source), shape_set=shape_set))

    for shape_set in ("search", "heldout"):
        wrong = evaluate(_copy_of_gate(silu), shape_set)
        assert wrong.status is Status.INCORRECT and wrong.speedup is None
        assert wrong.message.startswith("stand-in: out[0, 0]: expected")
    right = evaluate(silu.baseline_source())
    assert right.status is Status.OK
    assert "match the reference on the CPU emulator" in right.message and "synthetic" in right.message
    unchecked = StandinEvaluator(cache_dir=tmp_path, verify_on_cpu=False)
    plumbing = unchecked.evaluate(EvalRequest("silu_and_mul", Variant("silu_and_mul", _copy_of_gate(silu))))
    assert plumbing.status is Status.OK and "not checked" in plumbing.message


def test_gate_times_up_in_fp16_overflows_on_the_outlier_case(silu, tmp_path):
    """|gate| and |up| in the hundreds (outlier channels): the product overflows fp16 where the
    result is about 0. Only the ``outliers`` case reaches that; bf16 has the range for it."""
    source = (ADVERSARIAL / "gate_times_up_in_fp16.cu").read_text()
    fp16 = check_on_cpu(silu, source, "float16", cache_dir=tmp_path)
    assert fp16.status is Status.INCORRECT and "case outliers, float16" in fp16.message
    assert check_on_cpu(silu, source, "bfloat16", cache_dir=tmp_path).verified


@pytest.mark.parametrize("kernel", ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"])
def test_gated_baselines_and_recipes_pass_the_outlier_case(kernel, tmp_path):
    from agents.embedded.recipes import recipes_for

    spec = load_kernel(kernel)
    assert "outliers" in spec.edge_cases
    sources = [spec.baseline_source()] + [r.build(spec) for r in recipes_for(spec) if r.family == "gated_act"]
    assert len(sources) == 4
    for source in sources:
        for dtype in spec.dtypes:
            verdict = check_on_cpu(spec, source, dtype, shapes=[{"num_tokens": 3, "d": 1000}], cache_dir=tmp_path)
            assert verdict.verified, verdict.message


def test_a_forward_declared_entry_is_admitted_and_computes_the_reference(silu, tmp_path, compile_cache):
    """A declaration of the entry point before its one definition is no second definition:
    admission compiles it, the embedded agent finds the definition, and it is correct."""
    from agents.embedded.source import find_entry
    from evaluators.admit import Artifact, admit

    source = (ADVERSARIAL / "honest_forward_declared_entry.cu").read_text()
    assert isinstance(admit(silu, source, "float16", {}), Artifact)
    entry = find_entry(source, "silu_and_mul")
    assert entry is not None and source[entry.body_open] == "{" and entry.start > source.index("silu_of")
    assert check_on_cpu(silu, source, "float16", cache_dir=tmp_path).verified


def test_a_standin_search_stops_on_a_wrong_baseline_before_ray(silu, tmp_path, compile_cache, capsys):
    """The search checks its baselines on the CPU when it runs on the stand-in: a baseline
    changed to ``out = gate`` is named INCORRECT on one line, and nothing starts."""
    import shutil

    import ray

    from search.run import main as run_main

    folder = tmp_path / "lib" / "silu_and_mul"
    shutil.copytree(silu.directory, folder)
    (folder / "baseline.cu").write_text(_copy_of_gate(silu))
    code = run_main(["--kernel-dir", str(tmp_path / "lib"), "--evaluator", "standin", "--out", str(tmp_path / "runs")])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert "baseline INCORRECT: out[0, 0]: expected" in err and "CPU emulator: case random, float16" in err
    assert not ray.is_initialized() and not (tmp_path / "runs").exists()
