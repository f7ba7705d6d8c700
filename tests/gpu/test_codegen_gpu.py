"""GPU tests of the generated kernels: for every kernel of ``experiments/unseen`` and the
library kernels the generator reads, each schedule the embedded agent's generator writes, at
its default tuning and at another point of its grid, is validated by the evaluator against the
reference on the search and held-out shapes in every dtype. Their speed is a benchmark's
business: ``python -m experiments.codegen_probe``.

Run on an H200: ``python -m pytest -m gpu tests/gpu/test_codegen_gpu.py -s``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agents.embedded.codegen import generate
from evaluators.api import EvalRequest
from kernels.launch import parse_launch_header
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Status

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parents[2]
UNSEEN = ROOT / "experiments" / "unseen"
# The unseen benchmark, and the library kernels whose graphs the generator reads (their
# recipes aside): gated activations, row norms, layer norm, the two-state merge, fp8 quant.
FOLDERS = sorted(p.parent for p in UNSEEN.glob("*/spec.py")) + [
    ROOT / "kernels" / k for k in ("silu_and_mul", "rmsnorm", "fused_add_rmsnorm", "layernorm",
                                   "merge_attn_states_lse", "per_token_fp8_quant")]


@pytest.fixture(scope="module")
def evaluator():
    from evaluators.gpu import GpuEvaluator

    ev = GpuEvaluator(step_timeout_s=60.0)
    yield ev
    ev.close()


def _settings(source: str) -> list[dict[str, int]]:
    """The default tuning and the grid point with every parameter at its last value."""
    launch = parse_launch_header(source)
    default = launch.default_params()
    last = {k: v[-1] for k, v in launch.tune.items()}
    return [default] if last == default else [default, last]


def _failures(evaluator, folder: Path, schedules, dtypes) -> list[str]:
    """Every schedule at its settings, in each dtype, on the search and held-out shapes: what
    the evaluator did not call OK."""
    spec = load_kernel(folder)
    failures = []
    for schedule in schedules:
        variant = Variant(spec.name, schedule.source, author="codegen")
        for params in _settings(schedule.source):
            for dtype in dtypes:
                for shape_set in ("search", "heldout"):
                    ev = evaluator.evaluate(EvalRequest(str(folder), variant, params=params, dtype=dtype,
                                                        shape_set=shape_set, time=False))
                    if ev.status is not Status.OK:
                        failures.append(f"{schedule.name} {params} {dtype} {shape_set}: {ev.status.value} {ev.message}")
    return failures


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_generated_schedules_are_correct_on_every_shape(evaluator, folder):
    spec = load_kernel(folder)
    schedules = generate(spec)
    assert schedules, f"{spec.name}: no schedule generated"
    failures = _failures(evaluator, folder, schedules, spec.dtypes)
    assert not failures, "\n".join(failures)


def test_short_rows_reduce_inside_their_lanes(evaluator, tmp_path):
    """Rows of 8-1000 elements: rows/block gives a row 4, 8 or 16 threads and several rows share
    a warp, so every reduction, the online max-and-sum included, must stay inside a row's lanes.
    log_softmax_rows copied with short-row shapes (its own shapes are all long)."""
    import re
    import shutil

    folder = tmp_path / "log_softmax_short"
    shutil.copytree(UNSEEN / "log_softmax_rows", folder)
    spec_py = folder / "spec.py"
    text = spec_py.read_text()
    text = re.sub(r"search_shapes=\(.*?\n    \),\n    heldout_shapes=\(.*?\n    \),",
                  "search_shapes=({'num_tokens': 1000, 'vocab': 128}, {'num_tokens': 333, 'vocab': 64}, "
                  "{'num_tokens': 77, 'vocab': 8}, {'num_tokens': 4097, 'vocab': 256}),\n"
                  "    heldout_shapes=({'num_tokens': 129, 'vocab': 24}, {'num_tokens': 50, 'vocab': 120}, "
                  "{'num_tokens': 31, 'vocab': 1000}, {'num_tokens': 3, 'vocab': 512}),",
                  text, flags=re.S)
    text = re.sub(r"\n    heldout_draw=.*?\n", "\n", text)
    assert "'vocab': 24" in text and "heldout_draw" not in text
    spec_py.write_text(text)
    spec = load_kernel(folder)
    schedules = {s.name: s for s in generate(spec)}
    assert {"codegen:rows/block", "codegen:rows/block+online"} <= set(schedules)
    failures = _failures(evaluator, folder, schedules.values(), ("float16", "float32"))
    assert not failures, "\n".join(failures)


def _reviewer_kernels() -> list[str]:
    from tests.unit.test_codegen_reviewer_kernels import FOLDERS as REVIEWER

    return sorted(REVIEWER)


@pytest.mark.parametrize("name", _reviewer_kernels())
def test_kernels_written_in_the_tests_get_correct_schedules(evaluator, name, tmp_path):
    """The kernels of tests/unit/test_codegen_reviewer_kernels.py (in no library the generator
    was written against) on the GPU: every schedule, cluster ones included, validated by the
    evaluator on the search and held-out shapes in every dtype."""
    from tests.unit.test_codegen import _kernel_here
    from tests.unit.test_codegen_reviewer_kernels import FOLDERS as REVIEWER

    spec = _kernel_here(tmp_path, name, *REVIEWER[name])
    # The folder's own baseline first: a baseline off its reference fails every schedule "vs
    # baseline", and that is the folder's fault, not the generator's.
    own = SimpleNamespace(name="baseline", source=spec.baseline_source())
    assert not (bad := _failures(evaluator, tmp_path / name, [own], spec.dtypes)), "\n".join(bad)
    schedules = generate(spec)
    assert schedules, f"{name}: no schedule generated"
    failures = _failures(evaluator, tmp_path / name, schedules, spec.dtypes)
    assert not failures, "\n".join(failures)
