"""On a GPU: the baselines stay correct on the new held-out shapes (tails, per-run draws, the
2^31-element shapes) and edge cases, the edge fixtures get their verdicts with the shape set
and dtype their index entry names, and compute-sanitizer sees the shape- and launch-dependent
bugs. Run: ``python -m pytest -m gpu tests/unit/test_edges_gpu.py``."""

from __future__ import annotations

import pytest
import torch
import yaml

from evaluators.api import EvalRequest, TimingConfig
from evaluators.sanitize import SanitizerStatus, sanitize
from kernels.spec import list_kernels, load_kernel
from kernels.variant import Variant
from kernels.verdict import Status
from tests.adversarial.index import FIXTURE_DIR, INDEX

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TIMING = TimingConfig(5, 20, 0.0)
RUN_SEED = 20261201
EDGE_FIXTURES = [e for e in yaml.safe_load(INDEX.read_text())["fixtures"] if e.get("shape_set") or e.get("dtype")]
SANITIZED_EDGE = ["out_of_bounds_write_on_tails.cu", "out_of_bounds_read_after_first_launch.cu"]


@pytest.fixture(scope="module")
def evaluator():
    from evaluators.gpu import GpuEvaluator

    ev = GpuEvaluator(device=0)
    yield ev
    ev.close()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list_kernels())
def test_baseline_is_correct_on_heldout_and_drawn_shapes(evaluator, name, dtype):
    spec = load_kernel(name)
    drawn = spec.draw_heldout(RUN_SEED)
    ev = evaluator.evaluate(EvalRequest(name, Variant(name, spec.baseline_source()), dtype=dtype, timing=TIMING,
                                        shape_set="heldout", extra_shapes=drawn, time=False))
    assert ev.status is Status.OK, ev.message


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list_kernels())
def test_baseline_is_correct_on_search_shapes_with_every_edge_case(evaluator, name, dtype):
    # A search starts by evaluating its baseline on the search shapes: a baseline that fails an
    # edge case there would stop every search of the kernel.
    spec = load_kernel(name)
    ev = evaluator.evaluate(EvalRequest(name, Variant(name, spec.baseline_source()), dtype=dtype, timing=TIMING,
                                        time=False))
    assert ev.status is Status.OK, ev.message


@pytest.mark.parametrize("entry", EDGE_FIXTURES, ids=[e["file"] for e in EDGE_FIXTURES])
def test_edge_fixture_gets_its_verdict(evaluator, entry):
    source = (FIXTURE_DIR / entry["file"]).read_text()
    kernel = entry["kernel"]
    ev = evaluator.evaluate(EvalRequest(kernel, Variant(kernel, source), dtype=entry.get("dtype", "float16"),
                                        timing=TIMING, shape_set=entry.get("shape_set", "search")))
    assert ev.status is Status(entry["status"]), f"{entry['file']}: {ev.status.value}: {ev.message}"


@pytest.mark.parametrize("file", SANITIZED_EDGE)
def test_sanitizer_sees_bugs_beyond_the_first_launch_of_the_smallest_shape(file):
    entry = next(e for e in yaml.safe_load(INDEX.read_text())["fixtures"] if e["file"] == file)
    source = (FIXTURE_DIR / file).read_text()
    once = sanitize(entry["kernel"], source, "float16", tools=("memcheck",), launches=1,
                    shape=_smallest(entry["kernel"]))
    if once.status is SanitizerStatus.UNAVAILABLE:
        pytest.skip(once.message)
    assert once.clean, "the bug must not show on one launch of the smallest shape: " + once.summary()
    report = sanitize(entry["kernel"], source, "float16", tools=("memcheck",))
    tool = report.tool("memcheck")
    assert tool.status is SanitizerStatus.FINDINGS, tool.message + "\n" + tool.output_tail
    assert any("launch" in f for f in tool.findings), tool.findings


def _smallest(kernel):
    from evaluators.sanitize import smallest_shape

    return smallest_shape(load_kernel(kernel))


@pytest.mark.parametrize("name", ["silu_and_mul", "merge_attn_states_lse", "fused_add_rmsnorm"])
def test_sanitizer_is_clean_on_the_baseline_over_every_shape(name):
    spec = load_kernel(name)
    report = sanitize(name, spec.baseline_source(), "float16", shapes=spec.draw_heldout(RUN_SEED))
    if report.status is SanitizerStatus.UNAVAILABLE:
        pytest.skip(report.message)
    assert report.clean, report.summary() + "\n" + "\n".join(t.output_tail for t in report.tools)


@pytest.mark.parametrize("name", [n for n in list_kernels() if any(load_kernel(n).is_huge(s) for s in load_kernel(n).heldout_shapes)])
def test_huge_shape_inputs_and_reference_fit_the_budget(name):
    spec = load_kernel(name)
    shape = next(s for s in spec.heldout_shapes if spec.is_huge(s))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = spec.make_inputs(shape, torch.float16, gen, "random", torch.device("cuda"))
    pristine = {k: v.clone() for k, v in inputs.items()}
    expected = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9
    del inputs, pristine, expected
    torch.cuda.empty_cache()
    total_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    print(f"{name} {shape}: peak {peak_gb:.1f} GB for inputs, a copy and the fp32 reference")
    # Validation holds about this much at once (plus the outputs of two launches): it must
    # leave room on the device, which the baselines' held-out runs show it does.
    assert peak_gb < total_gb / 2, f"{name} {shape}: peak {peak_gb:.1f} GB of {total_gb:.0f} GB"
