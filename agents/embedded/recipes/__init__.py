"""Kernel-family recipes: complete fast variants written from templates in this folder.

A recipe recognises a family from the kernel's name and argument list (gated activations,
row norms, attention-state merges), maps the spec's arguments onto the template's roles
and writes a full variant file: launch header with tunables, device code, and an entry
point with exactly the spec's name and argument list that forwards to the template.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from string import Template

from agents.embedded.launch_fill import capped_threads
from kernels.spec import Arg, KernelSpec

_DIR = Path(__file__).resolve().parent

_ACTIVATIONS = {
    "silu": "g / (1.0f + expf(-g))",
    "gelu": "0.5f * g * (1.0f + erff(g * 0.70710678118654752f))",
    # 0.5 g (1 + tanh(u)) is g * sigmoid(2u): one expf where tanhf costs several times more, and
    # no cancellation in 1 + tanh(u) for negative g (max relative error against a float64
    # reference over [-20, 20]: 1.3e-6 for this form, 5.1e-5 for the tanhf one).
    "gelu_tanh": "g / (1.0f + expf(-1.5957691216057308f * (g + 0.044715f * g * g * g)))",
}


class RecipeError(ValueError):
    """The kernel's arguments do not fit the recipe's roles."""


@dataclass(frozen=True)
class Recipe:
    """One family recipe.

    Attributes:
        name: transformation label, ``recipe:<family>/<variant>``.
        family: the family it belongs to.
        build: ``spec -> variant source``.
    """

    name: str
    family: str
    build: Callable[[KernelSpec], str]


def _template(name: str) -> Template:
    return Template((_DIR / name).read_text())


def entry_point(spec: KernelSpec, bound: str, call: str) -> str:
    """The spec's entry with ``__restrict__`` pointers, forwarding to ``call``."""
    params = []
    for a, (ctype, is_ptr) in zip(spec.args, spec.c_signature(), strict=True):
        if is_ptr:
            const = "const " if a.role == "in" else ""
            params.append(f"{const}{ctype}* __restrict__ {a.name}")
        else:
            params.append(f"{ctype} {a.name}")
    sig = ",\n    ".join(params)
    # The explicit minimum of one block per SM: with the bare form ptxas sometimes caps
    # registers for an occupancy it cannot reach and spills.
    return (
        f'extern "C" __global__ void __launch_bounds__({bound}, 1) {spec.name}(\n    {sig}) {{\n'
        f"    {call};\n}}\n"
    )


def _guards(defaults: dict[str, int]) -> str:
    return "".join(f"#ifndef {k}\n#define {k} {v}\n#endif\n" for k, v in defaults.items())


def _header(grid: str, block: str, tune: Mapping[str, tuple[int, ...]]) -> str:
    lines = [f"// launch: grid={grid} block={block} smem=0"]
    lines += [f"// tune: {k}=" + ",".join(str(v) for v in vals) for k, vals in tune.items()]
    return "\n".join(lines)


def _common(name: str, **values: str) -> str:
    """A shared helper file's text for a template, without its two-line comment header."""
    return _template(name).substitute(**values).split("\n", 2)[2]


def _fill(template: str, spec: KernelSpec, grid: str, block: str, bound: str,
          tune: Mapping[str, tuple[int, ...]], call: str, **extra: str) -> str:
    return _template(template).substitute(
        kernel=spec.name,
        rowcommon=_common("row_common.cu"),
        mergecommon=_common("merge_common.cu"),
        mergedispatch=_common("merge_dispatch.cu"),
        streamcommon=_common("stream_common.cu"),
        header=_header(grid, block, tune),
        guards=_guards({k: v[0] for k, v in tune.items()}),
        entry=entry_point(spec, bound, call),
        **extra,
    )


def _tensor_args(spec: KernelSpec, role: str) -> list[Arg]:
    return [a for a in spec.args if a.kind == "tensor" and a.role == role]


def _tensors(spec: KernelSpec, role: str) -> list[str]:
    return [a.name for a in _tensor_args(spec, role)]


def _row_block(hidden: str) -> str:
    """One block per row: a multiple of 32 threads just large enough that CACHE 8-wide vectors
    per thread cover the row, capped at the templates' MAX_THREADS (1024 for CACHE 1, else 512)."""
    return f"(min(1024 // min(CACHE, 2), max(32, 32 * cdiv({hidden}, 256 * CACHE))),)"


def _ints(spec: KernelSpec, n: int) -> list[str]:
    ints = [a.name for a in spec.args if a.kind == "int"]
    if len(ints) != n:
        raise RecipeError(f"{spec.name}: expected {n} integer arguments, got {ints}")
    return ints


def activation_of(name: str) -> str | None:
    m = re.fullmatch(r"(silu|gelu_tanh|gelu)_and_mul", name)
    return m.group(1) if m else None


def _gated(spec: KernelSpec, layout: str) -> str:
    act = activation_of(spec.name)
    out, inp = _tensors(spec, "out"), _tensors(spec, "in")
    if act is None or len(out) != 1 or len(inp) != 1:
        raise RecipeError(f"{spec.name} is not a gated activation (out, x, tokens, d)")
    rows, d = _ints(spec, 2)
    call = f"gated_{layout}({out[0]}, {inp[0]}, {rows}, {d})"
    # The device helpers every layout shares.
    common = _common("stream_common.cu") + _common("gated_common.cu", act=_ACTIVATIONS[act])
    # Flat and tiles: fewer threads to a block on a small launch (one row of 11008: 3 blocks of 512).
    threads = capped_threads(rows, d)
    if layout == "flat":
        grid = f"(cdiv({rows} * {d}, {threads} * 8 * ITEMS),)"
        tune: dict[str, tuple[int, ...]] = {"BLOCK": (256, 128, 512), "ITEMS": (2, 1, 4), "HINT": (0, 1, 2)}
        return _fill("gated_flat.cu", spec, grid, f"({threads},)", "BLOCK", tune, call, common=common)
    if layout == "tiles":
        # 8 = the vector width of 2-byte types; wider types only change how many tiles a row has
        # in the vector path, which the kernel recomputes itself, and the scalar path strides.
        grid = f"(cdiv({d}, {threads} * 8 * ITEMS), min({rows}, 65535))"
        tune = {"BLOCK": (128, 256, 512), "ITEMS": (2, 1, 4), "HINT": (0, 1, 2)}
        return _fill("gated_tiles.cu", spec, grid, f"({threads},)", "BLOCK", tune, call, common=common)
    tune = {"BLOCK": (256, 128, 512, 1024), "ITEMS": (2, 1, 4), "HINT": (0, 1, 2)}
    return _fill("gated_rows.cu", spec, f"({rows},)", "(BLOCK,)", "BLOCK", tune, call, common=common)


@dataclass(frozen=True)
class _RowNormRoles:
    """How a row-norm kernel's arguments map onto the template's call."""

    call: str
    what: str
    fused: str
    gemma: str


def _row_norm_roles(spec: KernelSpec) -> _RowNormRoles:
    inout, inp, out = _tensors(spec, "inout"), _tensors(spec, "in"), _tensors(spec, "out")
    floats = [a.name for a in spec.args if a.kind == "float"]
    rows, hidden = _ints(spec, 2)
    if len(floats) != 1 or not inp:
        raise RecipeError(f"{spec.name}: a row norm takes tensors, a weight, two sizes and eps")
    weight = next((n for n in inp if "weight" in n or n in ("w", "gamma")), inp[-1])
    if len(inout) == 2 and len(inp) == 1 and not out:  # fused residual add, in place
        res = next((n for n in inout if "res" in n), inout[1])
        src = next(n for n in inout if n != res)
        call = f"row_norm({src}, {res}, {src}, {weight}, {rows}, {hidden}, {floats[0]})"
        what = "x = input + residual; residual <- x; input <- x * rsqrt(mean(x^2) + eps) * w, fp32 math."
        fused = "1"
    elif len(out) == 1 and len(inp) == 2 and not inout:
        src = next(n for n in inp if n != weight)
        call = f"row_norm({out[0]}, nullptr, {src}, {weight}, {rows}, {hidden}, {floats[0]})"
        what = "out = x * rsqrt(mean(x^2) + eps) * w per row, fp32 math."
        fused = "0"
    else:
        raise RecipeError(f"{spec.name}: argument roles do not match a row norm")
    gemma = "1" if "gemma" in spec.name else "0"
    if gemma == "1":
        what = what.replace("* w", "* (1 + w)")
    return _RowNormRoles(call, what, fused, gemma)


def _row_norm(spec: KernelSpec) -> str:
    roles = _row_norm_roles(spec)
    rows, hidden = _ints(spec, 2)
    # blockDim.x: a multiple of 32 just large enough that ITEMS 8-wide vectors per thread
    # cover the row, capped so that blockDim.x * ROWS <= MAX_THREADS (512 threads for
    # ITEMS=8, whose 64 kept floats need more than the 64 registers 1024 threads allow).
    block = f"(min(min(1024, 4096 // ITEMS) // ROWS, max(32, 32 * cdiv({hidden}, 256 * ITEMS))), ROWS)"
    tune = {"ITEMS": (4, 2, 8), "ROWS": (1, 2, 4, 8)}
    return _fill("row_norm.cu", spec, f"(cdiv({rows}, ROWS),)", block, "MAX_THREADS", tune, roles.call,
                 what=roles.what, fused=roles.fused, gemma=roles.gemma)


def _row_norm_warp(spec: KernelSpec) -> str:
    """One warp per row, ROWS rows per block: shuffle reductions only, no barrier."""
    roles = _row_norm_roles(spec)
    rows, _ = _ints(spec, 2)
    # CACHE=16 (a whole 4096-wide row per warp) needs more than 255 registers for bf16: the
    # rest of such rows goes through the chunked tail.
    tune = {"CACHE": (8, 4), "ROWS": (4, 1, 2, 8), "HINT": (0, 1, 2)}
    layout = "one warp per row, ROWS rows per block; warp shuffles reduce, no barrier, no shared memory."
    return _fill("row_norm_prefetch.cu", spec, f"(cdiv({rows}, ROWS),)", "(32, ROWS)", "MAX_THREADS", tune,
                 roles.call, what=roles.what, fused=roles.fused, gemma=roles.gemma, warp_row="1",
                 variant="warp", layout=layout)


def _row_norm_prefetch(spec: KernelSpec) -> str:
    """One block per row, sized to the row so that every thread holds CACHE vectors; rows too
    short for more than 64 threads share a block (128 threads), so the grid is not thousands
    of one-warp blocks."""
    roles = _row_norm_roles(spec)
    rows, hidden = _ints(spec, 2)
    # A multiple of 32 threads just large enough that CACHE 8-wide vectors per thread cover
    # the row, so no thread idles; capped at MAX_THREADS (the template's register budget).
    per_row = f"min(min(512, 4096 // CACHE), max(32, 32 * cdiv({hidden}, 256 * CACHE)))"
    rows_per_block = f"max(1, 128 // {per_row})"
    tune = {"CACHE": (2, 1, 4), "HINT": (0, 1, 2)}
    layout = ("one block per row, sized to the row (short rows: several per block); warp shuffles and one "
              "barrier reduce.")
    return _fill("row_norm_prefetch.cu", spec, f"(cdiv({rows}, {rows_per_block}),)", f"({per_row}, {rows_per_block})",
                 "MAX_THREADS", tune, roles.call, what=roles.what, fused=roles.fused, gemma=roles.gemma,
                 warp_row="0", variant="prefetch", layout=layout)


def _layer_norm(spec: KernelSpec) -> str:
    """One block per row; mean and variance around it from registers (layernorm with bias)."""
    out, inp = _tensors(spec, "out"), _tensors(spec, "in")
    floats = [a.name for a in spec.args if a.kind == "float"]
    if len(out) != 1 or len(inp) != 3 or len(floats) != 1:
        raise RecipeError(f"{spec.name}: a layer norm takes out, input, weight, bias, two sizes and eps")
    rows, hidden = _ints(spec, 2)
    weight = next((n for n in inp if "weight" in n or n in ("w", "gamma")), None)
    bias = next((n for n in inp if "bias" in n or n in ("b", "beta")), None)
    if weight is None or bias is None or weight == bias:
        raise RecipeError(f"{spec.name}: cannot tell the weight and the bias among {inp}")
    src = next(n for n in inp if n not in (weight, bias))
    call = f"layer_norm({out[0]}, {src}, {weight}, {bias}, {rows}, {hidden}, {floats[0]})"
    tune = {"CACHE": (2, 1, 4)}
    what = "out = (x - mean) * rsqrt(var + eps) * w + b per row, variance around the mean, fp32 math."
    return _fill("layer_norm.cu", spec, f"({rows},)", _row_block(hidden), "MAX_THREADS", tune, call, what=what)


def _row_quant(spec: KernelSpec) -> str:
    """Per-token fp8 quantisation: one block per row, max |x| and the quantised row from registers."""
    outs = _tensor_args(spec, "out")
    q = next((a.name for a in outs if a.dtype == "float8_e4m3fn"), None)
    scales = next((a.name for a in outs if a.dtype == "float32"), None)
    inp = _tensors(spec, "in")
    if q is None or scales is None or len(outs) != 2 or len(inp) != 1:
        raise RecipeError(f"{spec.name}: a per-token quantisation takes an fp8 out, fp32 scales, an input and two sizes")
    rows, hidden = _ints(spec, 2)
    call = f"row_quant({q}, {scales}, {inp[0]}, {rows}, {hidden})"
    tune = {"CACHE": (2, 1, 4)}
    what = "scale = max|x| / 448 per row (1 for an all-zero row); out = e4m3(clamp(x / scale)), fp32 math."
    return _fill("row_quant.cu", spec, f"({rows},)", _row_block(hidden), "MAX_THREADS", tune, call, what=what)


def _merge_call(spec: KernelSpec) -> tuple[str, str, str, str]:
    """(tokens, heads, head_dim, the call of ``merge_states``) for a two-state merge."""
    out, inp = _tensors(spec, "out"), _tensors(spec, "in")
    if len(out) != 2 or len(inp) != 4:
        raise RecipeError(f"{spec.name}: expected v_out, s_out, v_a, s_a, v_b, s_b")
    tokens, heads, head_dim = _ints(spec, 3)
    return tokens, heads, head_dim, f"merge_states({', '.join(out + inp)}, {tokens}, {heads}, {head_dim})"


def _merge(spec: KernelSpec) -> str:
    tokens, heads, head_dim, call = _merge_call(spec)
    threads = capped_threads(f"{tokens} * {heads}", head_dim)  # small launches: smaller blocks
    grid = f"(cdiv({tokens} * {heads} * {head_dim}, {threads} * 8 * ITEMS),)"
    tune = {"BLOCK": (256, 128, 512), "ITEMS": (1, 2, 4), "HINT": (0, 1, 2)}
    return _fill("merge_flat.cu", spec, grid, f"({threads},)", "BLOCK", tune, call)


def _merge_pairs(spec: KernelSpec) -> str:
    """Two states, a row of threads per (token, head) pair: the weights once per thread."""
    tokens, heads, head_dim, call = _merge_call(spec)
    # A row of threads: one 16-byte vector of 16-bit elements per ITEMS, at most a warp.
    block = f"(min(32, cdiv({head_dim}, 8 * ITEMS)), PAIRS)"
    grid = f"(cdiv({tokens} * {heads}, PAIRS),)"
    # Streamed vectors first: faster than plain ones on every shape of the H200 recipe map (one
    # loop, experiments/results/explore-merge-h200.md: the hand variant pairs_stream.cu).
    tune = {"PAIRS": (8, 16, 4), "ITEMS": (1, 2), "HINT": (1, 0, 2)}
    return _fill("merge_pairs.cu", spec, grid, block, "32 * PAIRS", tune, call)


def _merge_multi(spec: KernelSpec) -> str:
    """Any number of states: one 16-byte vector per thread, UNROLL states' loads in flight."""
    outs, ins = _tensor_args(spec, "out"), _tensor_args(spec, "in")
    values = [a.name for a in (*outs, *ins) if a.dtype == "scalar"]
    lses = [a.name for a in (*outs, *ins) if a.dtype == "float32"]
    if len(outs) != 2 or len(ins) != 2 or len(values) != 2 or len(lses) != 2:
        raise RecipeError(f"{spec.name}: expected v_out, lse_out (fp32), v, lse (fp32) and four sizes")
    states, tokens, heads, head_dim = _ints(spec, 4)
    call = f"merge_multi({values[0]}, {lses[0]}, {values[1]}, {lses[1]}, {states}, {tokens}, {heads}, {head_dim})"
    grid = f"(cdiv({tokens} * {heads} * cdiv({head_dim}, 8), BLOCK),)"
    tune = {"BLOCK": (256, 128, 512), "UNROLL": (4, 2, 8)}
    return _fill("merge_multi.cu", spec, grid, "(BLOCK,)", "BLOCK", tune, call)


def _rotary(spec: KernelSpec) -> str:
    """Rotary embedding (NeoX or GPT-J pairs) over a flat range, one 16-byte unit per thread."""
    m = re.fullmatch(r"rotary_embedding_(neox|gptj)", spec.name)
    inout, inp = _tensors(spec, "inout"), _tensors(spec, "in")
    ints = _ints_or_empty(spec)
    if m is None or len(inout) != 2 or len(inp) != 2 or len(ints) != 6:
        raise RecipeError(f"{spec.name}: expected positions, query, key, cos_sin_cache and six sizes")
    positions = next(a.name for a in spec.args if a.dtype == "int64")
    cache = next(a.name for a in spec.args if a.dtype == "float32")
    query, key = inout
    tokens, heads, kv_heads, head_size, rot_dim, _ = ints
    neox = m.group(1) == "neox"
    unit = 16 if neox else 8
    call = (f"rotary({positions}, {query}, {key}, {cache}, {tokens}, {heads}, {kv_heads}, {head_size}, {rot_dim})")
    grid = f"(cdiv({tokens} * ({heads} + {kv_heads}) * cdiv({rot_dim}, {unit}), BLOCK),)"
    tune = {"BLOCK": (256, 128, 512)}
    pairs = "pairs (i, i + rot_dim/2)" if neox else "pairs (2i, 2i + 1)"
    return _fill("rotary_flat.cu", spec, grid, "(BLOCK,)", "BLOCK", tune, call, neox="1" if neox else "0",
                 pairs=pairs)


def _topk_softmax(spec: KernelSpec) -> str:
    """MoE routing: one warp per token, the row in registers, shuffle reductions for every round."""
    outs = _tensor_args(spec, "out")
    weights = next((a.name for a in outs if a.dtype == "float32"), None)
    ids = next((a.name for a in outs if a.dtype == "int32"), None)
    inp = _tensors(spec, "in")
    if weights is None or ids is None or len(outs) != 2 or len(inp) != 1:
        raise RecipeError(f"{spec.name}: expected fp32 weights, int32 ids, the gating logits and four sizes")
    tokens, experts, topk, renormalize = _ints(spec, 4)
    call = f"topk_route({weights}, {ids}, {inp[0]}, {tokens}, {experts}, {topk}, {renormalize})"
    tune = {"WARPS": (4, 2, 8, 1)}
    what = ("p = softmax(x) per row in fp32; the topk largest p (ties to the lower index) and their ids; "
            "optionally divided by their sum.")
    return _fill("topk_warp.cu", spec, f"(cdiv({tokens}, WARPS),)", "(32, WARPS)", "32 * WARPS", tune, call,
                 what=what)


def family_of(spec: KernelSpec) -> str | None:
    """The recipe family of a kernel, from its name and argument list."""
    if activation_of(spec.name):
        return "gated_act"
    if re.search(r"(^|_)rms_?norm$", spec.name):
        return "row_norm"
    if re.search(r"(^|_)layer_?norm$", spec.name):
        return "layer_norm"
    if re.search(r"fp8_quant$", spec.name):
        return "row_quant"
    if re.fullmatch(r"rotary_embedding_(neox|gptj)", spec.name):
        return "rotary"
    if spec.name == "topk_softmax":
        return "topk_softmax"
    if spec.name.startswith("merge_attn_states") or spec.name == "merge_state":
        return {3: "merge", 4: "merge_multi"}.get(len(_ints_or_empty(spec)))
    return None


def _ints_or_empty(spec: KernelSpec) -> list[str]:
    return [a.name for a in spec.args if a.kind == "int"]


RECIPES: tuple[Recipe, ...] = (
    Recipe("recipe:gated_act/flat", "gated_act", lambda s: _gated(s, "flat")),
    Recipe("recipe:gated_act/rows", "gated_act", lambda s: _gated(s, "rows")),
    Recipe("recipe:gated_act/tiles", "gated_act", lambda s: _gated(s, "tiles")),
    Recipe("recipe:row_norm/regs", "row_norm", _row_norm),
    Recipe("recipe:row_norm/warp", "row_norm", _row_norm_warp),
    Recipe("recipe:row_norm/prefetch", "row_norm", _row_norm_prefetch),
    Recipe("recipe:merge/flat", "merge", _merge),
    Recipe("recipe:merge/pairs", "merge", _merge_pairs),
    Recipe("recipe:layer_norm/rows", "layer_norm", _layer_norm),
    Recipe("recipe:row_quant/rows", "row_quant", _row_quant),
    Recipe("recipe:merge_multi/flat", "merge_multi", _merge_multi),
    Recipe("recipe:rotary/flat", "rotary", _rotary),
    Recipe("recipe:topk_softmax/warp", "topk_softmax", _topk_softmax),
)


def recipes_for(spec: KernelSpec) -> tuple[Recipe, ...]:
    """The recipes that apply to a kernel (empty for kernels of no known family)."""
    fam = family_of(spec)
    return tuple(r for r in RECIPES if r.family == fam)
