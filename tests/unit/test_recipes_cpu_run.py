"""The recipes run on the CPU (``tests/cuda_on_cpu.py``) against their references: the gated
activations in fp16 (the 16-byte vector paths) and fp32, on short rows, rows off the tile size
and a row count past a lowered grid.y cap; every recipe but topk_softmax's also on rows off
vector boundaries (past the specs' shape checks), which reach its out-of-line scalar path. The
GPU tests of the embedded agent remain the authority; this catches an indexing mistake without
a GPU."""

from __future__ import annotations

import re

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


def test_gated_recipes_off_vector_boundaries_take_their_out_of_line_scalar_paths(tmp_path):
    """d off a multiple of 8 reaches each recipe's out-of-line scalar path, in fp16 and fp32.
    The specs promise multiples of 8, so these shapes go to the CPU run without the spec's
    shape check."""
    from tests.unit.test_codegen_cpu_run import _compare, _run

    spec = load_kernel("silu_and_mul")
    shapes = [{"num_tokens": 3, "d": 1001}, {"num_tokens": 2, "d": 37}]
    for recipe in (r for r in recipes_for(spec) if r.family == "gated_act"):
        source = recipe.build(spec)
        assert "__noinline__ void gated_" in source
        for dtype in ("float16", "float32"):
            got = _run(spec, source, dtype, {}, shapes, tmp_path / f"{recipe.name.split('/')[-1]}-{dtype}")
            _compare(spec, shapes, got, dtype, {})


ROWS_WHOLE = [{"num_tokens": 3, "hidden": 1000}, {"num_tokens": 5, "hidden": 64}, {"num_tokens": 2, "hidden": 9000}]
ROWS_OFF = [{"num_tokens": 3, "hidden": 1001}, {"num_tokens": 4, "hidden": 37}]
ROTARY = {"num_tokens": 3, "num_heads": 2, "num_kv_heads": 1, "max_position": 16}


# kernel, recipe families, shapes of whole vectors, shapes off vector boundaries.
OTHER_RECIPES = [
    *[(k, ("row_norm", "layer_norm"), ROWS_WHOLE, ROWS_OFF)
      for k in ("fused_add_rmsnorm", "rmsnorm", "gemma_fused_add_rmsnorm", "layernorm")],
    ("merge_attn_states_lse", ("merge",),
     # 520: more vectors than a row of threads covers in one pass (merge/pairs' out-of-line rest)
     [{"num_tokens": 3, "num_heads": 5, "head_dim": 24}, {"num_tokens": 2, "num_heads": 4, "head_dim": 128},
      {"num_tokens": 2, "num_heads": 2, "head_dim": 520}],
     [{"num_tokens": 3, "num_heads": 5, "head_dim": 37}, {"num_tokens": 2, "num_heads": 3, "head_dim": 5}]),
    ("per_token_fp8_quant", ("row_quant",), [{"num_tokens": 3, "hidden": 1008}, {"num_tokens": 2, "hidden": 32}],
     [{"num_tokens": 3, "hidden": 1001}, {"num_tokens": 2, "hidden": 37}]),
    ("merge_attn_states_multi", ("merge_multi",), [{"num_states": 3, "num_tokens": 3, "num_heads": 2, "head_dim": 24}],
     [{"num_states": 3, "num_tokens": 3, "num_heads": 2, "head_dim": 37}]),
    *[(k, ("rotary",), [{**ROTARY, "head_size": 64, "rot_dim": 64}], [{**ROTARY, "head_size": 36, "rot_dim": 20}])
      for k in ("rotary_embedding_neox", "rotary_embedding_gptj")],
]


@pytest.mark.parametrize(("kernel", "families", "whole", "off"), OTHER_RECIPES, ids=[r[0] for r in OTHER_RECIPES])
def test_other_recipes_compute_the_reference_on_the_cpu(kernel, families, whole, off, tmp_path):
    """The norm, merge, quantisation and rotary recipes on whole vectors (rows longer than a
    register cache among them) and, past the spec's shape check (which promises multiples of
    8 or 16), rows off vector boundaries, which take each recipe's out-of-line scalar path;
    in the spec's first two dtypes."""
    from tests.unit.test_codegen_cpu_run import _compare, _run

    spec = load_kernel(kernel)
    recipes = [r for r in recipes_for(spec) if r.family in families]
    assert recipes
    for recipe in recipes:
        source = recipe.build(spec)
        # Each recipe's scalar path out of line, except rotary's (slower so on the H200).
        assert ("__noinline__ void" in source) != (recipe.family == "rotary")
        for dtype in [d for d in ("float16", "float32", "bfloat16") if d in spec.dtypes][:2]:
            workdir = tmp_path / f"{recipe.name.split('/')[-1]}-{dtype}"
            _check(spec, source, dtype, {}, workdir / "whole", whole)
            _compare(spec, off, _run(spec, source, dtype, {}, off, workdir / "off"), dtype, {})


@pytest.mark.parametrize("params", [{}, {"UNROLL": 2, "BLOCK": 128}, {"UNROLL": 8, "BLOCK": 512}])
def test_merge_multi_handles_its_edge_cases_with_the_first_states_loaded_early(params, tmp_path):
    """merge_multi loads its first UNROLL states' vectors with their lse, before the max over
    every state: on the spec's edge cases (an empty state, all empty, lse gaps, marked empty)
    and with the largest lse on the last state, with fewer and more states than UNROLL, it
    still computes the reference."""
    from tests.unit.test_codegen_cpu_run import _compare, _inputs, _run

    spec = load_kernel("merge_attn_states_multi")
    source = recipes_for(spec)[0].build(spec)
    shapes = [{"num_states": 3, "num_tokens": 3, "num_heads": 2, "head_dim": 24},
              {"num_states": 11, "num_tokens": 2, "num_heads": 3, "head_dim": 16}]
    assert spec.edge_cases
    for case in (*spec.edge_cases, "late_max"):
        made = _inputs(spec, shapes, "float16", case)
        if case == "late_max":  # the largest lse on the last state, 300 above the rest: a max
            for inputs in made:   # that missed it would overflow 2^(lse - max)
                inputs["lse"][-1] += 300.0
        _compare(spec, shapes, _run(spec, source, "float16", params, shapes, tmp_path / case, made), "float16", params)


STREAMED = [
    ("merge_attn_states_lse", ("recipe:merge/flat", "recipe:merge/pairs"),
     [{"num_tokens": 3, "num_heads": 5, "head_dim": 24}, {"num_tokens": 2, "num_heads": 4, "head_dim": 128}]),
    # Rows longer than the register cache (a tail the second pass re-reads) and shorter ones.
    *[(k, ("recipe:row_norm/prefetch", "recipe:row_norm/warp"),
       [{"num_tokens": 2, "hidden": 16400}, {"num_tokens": 5, "hidden": 64}, {"num_tokens": 2, "hidden": 264}])
      for k in ("fused_add_rmsnorm", "rmsnorm", "gemma_fused_add_rmsnorm")],
]


@pytest.mark.parametrize("hint", [0, 1, 2])
@pytest.mark.parametrize(("kernel", "names", "shapes"), STREAMED, ids=[s[0] for s in STREAMED])
def test_streaming_hints_leave_the_results_alone(kernel, names, shapes, hint, tmp_path):
    """HINT puts the 16-byte loads (1 and 2) and stores (1) of data touched once on the streaming
    cache path (``if constexpr`` on the vector width): every setting compiles and gives the
    reference, vector and scalar paths, in the row norms' tails too."""
    spec = load_kernel(kernel)
    recipes = [r for r in recipes_for(spec) if r.name in names]
    assert {r.name for r in recipes} == set(names)
    for recipe in recipes:
        source = recipe.build(spec)
        assert set(parse_launch_header(source).tune["HINT"]) == {0, 1, 2}
        _check(spec, source, "float16", {"HINT": hint}, tmp_path / recipe.name.split("/")[-1], shapes)


@pytest.mark.parametrize(("kernel", "name"), [("silu_and_mul", "recipe:gated_act/tiles"),
                                              ("merge_attn_states_lse", "recipe:merge/pairs"),
                                              ("fused_add_rmsnorm", "recipe:row_norm/prefetch")])
def test_hint_settings_choose_the_cache_path_of_loads_and_stores(kernel, name):
    """In the PTX NVRTC writes: HINT 0 plain 16-byte loads and stores, 1 streamed (``.cs``)
    loads and stores, 2 streamed loads and only plain stores."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from tests.unit.test_codegen_ptx import ptx_of

    spec = load_kernel(kernel)
    source = next(r for r in recipes_for(spec) if r.name == name).build(spec)
    tune = parse_launch_header(source).tune
    seen = {}
    for hint in (0, 1, 2):
        ptx = ptx_of(source, "float16", {**{k: v[0] for k, v in tune.items()}, "HINT": hint})
        loads = set(re.findall(r"\bld\.global(?:\.nc)?(\.cs)?\.v4\.(?:u32|b32)", ptx))
        stores = set(re.findall(r"\bst\.global(\.cs)?\.v4\.(?:u32|b32)", ptx))
        seen[hint] = (loads, stores)
    # (the row norm keeps its weight and the tail its second pass re-reads plain under every HINT)
    assert ".cs" not in seen[0][0] | seen[0][1]
    assert ".cs" in seen[1][0] and ".cs" in seen[1][1]
    assert ".cs" in seen[2][0] and ".cs" not in seen[2][1]
