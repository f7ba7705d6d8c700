"""merge_attn_states_multi: merge P partial attention states (values + base-2 LSE) into one."""

from __future__ import annotations

from kernels import draws
from kernels.peer import Peer
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    p, t, h, d = shape["num_states"], shape["num_tokens"], shape["num_heads"], shape["head_dim"]
    v = torch.randn(p, t, h, d, generator=generator, device=device)
    lse = torch.randn(p, t, h, generator=generator, device=device) * 4.0
    if case == "neg_inf_state":
        # One state per (token, head) saw no keys (lse = -inf): it must get weight 0.
        drop = torch.randint(0, p, (1, t, h), generator=generator, device=device)
        states = torch.arange(p, device=device)[:, None, None]
        lse = torch.where(states == drop, torch.full_like(lse, float("-inf")), lse)
    elif case == "all_neg_inf":
        lse[:, ::2] = float("-inf")  # by definition: out = 0, lse_out = -inf
    elif case == "lse_gap":
        lse = lse * 10.0  # weights 2^-100 and below: underflow must not produce NaN
    elif case == "marked_empty":
        # Some engines mark an empty state with a finite -1e30 instead of -inf: an ordinary
        # value whose gap to the others is far beyond 126. Every other (token, head) has all
        # its states marked (the formula then gives the mean of the values).
        marked = torch.rand(p, t, h, generator=generator, device=device) < 0.5
        marked[:, ::2] = True
        lse = torch.where(marked, torch.full_like(lse, -1e30), lse)
    return {
        "v_out": torch.empty(t, h, d, device=device, dtype=dtype),
        "lse_out": torch.empty(t, h, device=device, dtype=torch.float32),
        "v": v.to(dtype),
        "lse": lse.contiguous(),
    }


def _merge(v, lse):
    import torch

    m = lse.amax(dim=0)
    any_state = torch.isfinite(m)
    m = torch.where(any_state, m, torch.zeros_like(m))
    w = torch.exp2(lse - m)  # exactly 0 for lse = -inf
    s = w.sum(dim=0)
    out = (v.float() * w[..., None]).sum(dim=0) / torch.where(any_state, s, torch.ones_like(s))[..., None]
    lse_out = torch.where(any_state, torch.log2(s) + m, torch.full_like(m, float("-inf")))
    return out, lse_out


def reference(inputs, shape, constants):
    out, lse_out = _merge(inputs["v"], inputs["lse"])
    return {"v_out": out, "lse_out": lse_out}


def torch_eager(t, shape, constants):
    out, lse_out = _merge(t["v"], t["lse"])
    t["v_out"].copy_(out)
    t["lse_out"].copy_(lse_out)


def _states_token_major(t, shape, constants, scratch):
    """FlashInfer's merge_states wants [num_tokens, num_states, ...]: an engine calling it keeps
    its partial states that way; transposed here outside the timed window."""
    if not scratch:
        scratch["v"] = t["v"].transpose(0, 1).contiguous()
        scratch["lse"] = t["lse"].transpose(0, 1).contiguous()
    scratch["v"].copy_(t["v"].transpose(0, 1))
    scratch["lse"].copy_(t["lse"].transpose(0, 1))


def _merge_states(t, shape, constants, scratch):
    import flashinfer as fi

    v, lse = fi.merge_states(scratch["v"], scratch["lse"])
    return {"v_out": v, "lse_out": lse}


flashinfer = Peer(_merge_states, stage=_states_token_major,
                  note="merge_states on states laid out token-major (transposed outside the window); returns new tensors")


def _draw_one(rng, index):
    return {"num_states": draws.at_alignment(rng, 3, 15), "num_tokens": draws.tokens(rng, index),
            "num_heads": draws.at_alignment(rng, 1, 64), "head_dim": draws.at_alignment(rng, 32, 512, 8)}


def _draw(rng):
    """Three shapes per run: odd state, token and head counts, head_dim = 8 * odd."""
    return draws.draw_shapes(
        rng, _draw_one, lambda s: s["num_states"] * s["num_tokens"] * s["num_heads"] * s["head_dim"]
    )


SPEC = KernelSpec(
    name="merge_attn_states_multi",
    description=(
        "Multi-way merge of partial attention states (split-KV decode, cascade attention). "
        "v is [num_states, num_tokens, num_heads, head_dim] (contiguous, scalar_t), lse is fp32 "
        "[num_states, num_tokens, num_heads] in base 2 (finite or -inf); v_out is "
        "[num_tokens, num_heads, head_dim] and lse_out fp32 [num_tokens, num_heads]. Per token and "
        "head, in fp32: m = max_p lse[p]; w_p = 2^(lse[p] - m); S = sum_p w_p; "
        "v_out = sum_p v[p] * w_p / S rounded once; lse_out = log2(S) + m. If every state has "
        "lse = -inf: v_out = 0 and lse_out = -inf (-1e30 is an ordinary value). head_dim is a multiple of 8 "
        "(16-byte rows), nothing larger is promised; v can pass 2^31 elements (index in 64 bits). Memory-bound: reads num_states values per output."
    ),
    args=(
        Arg("v_out", "tensor", role="out"),
        Arg("lse_out", "tensor", dtype="float32", role="out"),
        Arg("v", "tensor"),
        Arg("lse", "tensor", dtype="float32"),
        Arg("num_states", "int"),
        Arg("num_tokens", "int"),
        Arg("num_heads", "int"),
        Arg("head_dim", "int", multiple_of=8),
    ),
    # Llama-style 32/40/8 heads of 128; DeepSeek MLA decode with 16 or 128 heads of 512.
    search_shapes=(
        {"num_states": 4, "num_tokens": 1, "num_heads": 32, "head_dim": 128},
        {"num_states": 8, "num_tokens": 16, "num_heads": 32, "head_dim": 128},
        {"num_states": 16, "num_tokens": 128, "num_heads": 128, "head_dim": 512},
        {"num_states": 4, "num_tokens": 333, "num_heads": 16, "head_dim": 512},
        {"num_states": 4, "num_tokens": 512, "num_heads": 32, "head_dim": 128},
        {"num_states": 8, "num_tokens": 1024, "num_heads": 8, "head_dim": 128},
        {"num_states": 2, "num_tokens": 4096, "num_heads": 32, "head_dim": 128},
    ),
    heldout_shapes=(
        {"num_states": 3, "num_tokens": 7, "num_heads": 28, "head_dim": 128},
        {"num_states": 8, "num_tokens": 77, "num_heads": 64, "head_dim": 128},
        {"num_states": 4, "num_tokens": 2048, "num_heads": 8, "head_dim": 128},
        {"num_states": 2, "num_tokens": 8191, "num_heads": 32, "head_dim": 128},
        {"num_states": 5, "num_tokens": 64, "num_heads": 16, "head_dim": 512},
        {"num_states": 3, "num_tokens": 1, "num_heads": 7, "head_dim": 40},
        {"num_states": 6, "num_tokens": 129, "num_heads": 8, "head_dim": 200},
        # v just past 2^31 elements: a signed 32-bit offset into v wraps on the last state.
        # ~4.9 GB of fp16 inputs, about 33 GB at the peak of a validation case.
        {"num_states": 8, "num_tokens": 65537, "num_heads": 32, "head_dim": 128},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: (s["num_states"] + 1) * s["num_tokens"] * s["num_heads"] * (
        s["head_dim"] * (4 if dt == "float32" else 2) + 4
    ),
    flops=lambda s: s["num_tokens"] * s["num_heads"] * (
        s["head_dim"] * (2 * s["num_states"] + 1) + 3 * s["num_states"]
    ),
    dtypes=("float16", "bfloat16"),
    edge_cases=("neg_inf_state", "all_neg_inf", "lse_gap", "marked_empty"),
    heldout_draw=_draw,
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer},
    compiled=torch_eager,
)
