"""The gated-activation recipes run on the CPU (``tests/cuda_on_cpu.py``) against their
references, in fp16 (the 16-byte vector paths) and fp32 (the scalar paths), on short rows,
rows off the tile size and a row count past a lowered grid.y cap. The GPU tests of the
embedded agent remain the authority; this catches an indexing mistake without a GPU."""

from __future__ import annotations

import pytest

from agents.embedded.recipes import recipes_for
from kernels.launch import parse_launch_header
from kernels.spec import load_kernel
from tests import cuda_on_cpu
from tests.unit.test_codegen_cpu_run import _check

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(bool(cuda_on_cpu.available()), reason=cuda_on_cpu.available() or "ok")

SHAPES = [{"num_tokens": 3, "d": 1000}, {"num_tokens": 2, "d": 40}, {"num_tokens": 5, "d": 4096}]


@pytest.mark.parametrize("kernel", ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"])
def test_gated_recipes_compute_the_reference_on_the_cpu(kernel, tmp_path):
    spec = load_kernel(kernel)
    recipes = [r for r in recipes_for(spec) if r.family == "gated_act"]
    assert {r.name for r in recipes} == {"recipe:gated_act/flat", "recipe:gated_act/rows", "recipe:gated_act/tiles"}
    for recipe in recipes:
        source = recipe.build(spec)
        tune = parse_launch_header(source).tune
        for params in ({}, {k: v[-1] for k, v in tune.items()}):
            for dtype in ("float16", "float32"):
                _check(spec, source, dtype, params, tmp_path / f"{recipe.name.split('/')[-1]}-{dtype}-{len(params)}",
                       SHAPES)


def test_gated_tiles_take_rows_past_the_grids_y_cap_in_turn(tmp_path):
    """gated_act/tiles puts rows on grid.y, which stops at 65535; with the cap lowered to 2,
    five rows need the blocks' row loop."""
    spec = load_kernel("silu_and_mul")
    source = next(r.build(spec) for r in recipes_for(spec) if r.name == "recipe:gated_act/tiles")
    assert "min(num_tokens, 65535))" in source
    capped = source.replace("min(num_tokens, 65535))", "min(num_tokens, 2))")
    launch = parse_launch_header(capped)
    assert launch.resolve(SHAPES[2], {k: v[0] for k, v in launch.tune.items()}).grid[1] == 2
    _check(spec, capped, "float16", {}, tmp_path, SHAPES)
