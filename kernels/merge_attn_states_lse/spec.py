"""merge_attn_states_lse: merge two partial attention outputs by their base-2 log-sum-exp."""

from __future__ import annotations

from kernels import draws
from kernels.peer import Peer
from kernels.spec import Arg, KernelSpec


def _lse_pair(t, h, generator, device, case):
    import torch

    def randn():
        return torch.randn(t, h, generator=generator, device=device)

    sa, sb = randn() * 4.0, randn() * 4.0
    if case == "neg_inf":
        # -inf marks an empty partial state (no keys on that side). Every pattern occurs:
        # a alone, b alone, both (merged output defined as 0 with lse -inf), neither.
        pick = torch.randint(0, 4, (t, h), generator=generator, device=device)
        pick.view(-1)[:4] = torch.arange(4, device=device)[: pick.numel()]  # each pattern at least once
        sa = torch.where((pick == 1) | (pick == 3), float("-inf"), sa)
        sb = torch.where((pick == 2) | (pick == 3), float("-inf"), sb)
    elif case == "extreme":
        # Differences of +-60 (one weight 2^-60) on offsets of a few hundred: a kernel that
        # exponentiates without subtracting the maximum overflows or underflows.
        sign = torch.randint(0, 2, (t, h), generator=generator, device=device) * 2 - 1
        base = randn() * 100.0
        sa, sb = base + 30.0 * sign, base - 30.0 * sign
    elif case == "gap":
        sa, sb = _gaps(t, h, generator, device)
    return sa.float(), sb.float()


EMPTY_MARK = -1e30  # how some engines mark an empty state instead of -inf (a finite lse)


def _gaps(t, h, generator, device):
    """lse pairs whose gap is beyond 126 (2^-gap underflows fp32: an exponent built from
    bits without a clamp wraps there), and states marked empty with -1e30 on one side, the
    other or both (both: the formula gives the mean of the values, lse -1e30 + 1)."""
    import torch

    base = torch.randn(t, h, generator=generator, device=device) * 100.0
    gap = 126.0 + torch.rand(t, h, generator=generator, device=device) * 300.0
    pick = torch.randint(0, 5, (t, h), generator=generator, device=device)
    pick.view(-1)[:5] = torch.arange(5, device=device)[: pick.numel()]  # every pattern occurs
    sa = torch.where(pick == 1, base - gap, base)
    sb = torch.where(pick == 0, base - gap, base)
    sb = torch.where(pick == 1, base, sb)
    sa = torch.where((pick == 2) | (pick == 4), torch.full_like(sa, EMPTY_MARK), sa)
    sb = torch.where((pick == 3) | (pick == 4), torch.full_like(sb, EMPTY_MARK), sb)
    return sa, sb


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, h, d = shape["num_tokens"], shape["num_heads"], shape["head_dim"]
    v_a = torch.randn(t, h, d, generator=generator, device=device)
    v_b = torch.randn(t, h, d, generator=generator, device=device)
    s_a, s_b = _lse_pair(t, h, generator, device, case)
    return {
        "v_out": torch.empty(t, h, d, device=device, dtype=dtype),
        "s_out": torch.empty(t, h, device=device, dtype=torch.float32),
        "v_a": v_a.to(dtype),
        "s_a": s_a,
        "v_b": v_b.to(dtype),
        "s_b": s_b,
    }


def merge(v_a, s_a, v_b, s_b):
    """fp32 merge; where both lse are -inf the result is v = 0, lse = -inf (by definition)."""
    import torch

    sa, sb = s_a.float(), s_b.float()
    m = torch.maximum(sa, sb)
    empty = torch.isneginf(m)
    m = torch.where(empty, torch.zeros_like(m), m)
    wa, wb = torch.exp2(sa - m), torch.exp2(sb - m)  # a -inf side gets weight exactly 0
    total = torch.where(empty, torch.ones_like(m), wa + wb)
    v = v_a.float() * (wa / total).unsqueeze(-1) + v_b.float() * (wb / total).unsqueeze(-1)
    lse = torch.where(empty, torch.full_like(m, float("-inf")), torch.log2(total) + m)
    return v, lse


def reference(inputs, shape, constants):
    v, lse = merge(inputs["v_a"], inputs["s_a"], inputs["v_b"], inputs["s_b"])
    return {"v_out": v, "s_out": lse}


def torch_eager(t, shape, constants):
    v, lse = merge(t["v_a"], t["s_a"], t["v_b"], t["s_b"])
    t["v_out"].copy_(v)
    t["s_out"].copy_(lse)


def _merge_state(t, shape, constants, scratch):
    import flashinfer as fi

    # SGLang's call: merge_state returns new tensors, returned here so that no copy is timed.
    v, lse = fi.merge_state(t["v_a"], t["s_a"], t["v_b"], t["s_b"])
    return {"v_out": v, "s_out": lse}


def _state_a_into_out(t, shape, constants, scratch):
    t["v_out"].copy_(t["v_a"])
    t["s_out"].copy_(t["s_a"])


def _merge_state_in_place(t, shape, constants, scratch):
    import flashinfer as fi

    fi.merge_state_in_place(t["v_out"], t["s_out"], t["v_b"], t["s_b"])


flashinfer = Peer(_merge_state, note="merge_state, its returned tensors (no copy timed)")
flashinfer_in_place = Peer(_merge_state_in_place, stage=_state_a_into_out,
                           note="merge_state_in_place on outputs that hold state a (copied outside the window)")


def _bytes_moved(shape, dtype):
    # Read two value tensors and two lse tensors; write one of each.
    t, h, d = shape["num_tokens"], shape["num_heads"], shape["head_dim"]
    return 3 * t * h * d * (4 if dtype == "float32" else 2) + 3 * t * h * 4


def _draw_one(rng, index):
    return {"num_tokens": draws.tokens(rng, index), "num_heads": draws.at_alignment(rng, 1, 64),
            "head_dim": draws.at_alignment(rng, 32, 512, 8)}


def _draw(rng):
    """Three shapes per run: odd token and head counts, head_dim = 8 * odd."""
    return draws.draw_shapes(rng, _draw_one, lambda s: s["num_tokens"] * s["num_heads"] * s["head_dim"])


SPEC = KernelSpec(
    name="merge_attn_states_lse",
    description=(
        "Merge two partial attention states (as in split-KV or cascade attention). v_a, v_b, v_out "
        "have shape [num_tokens, num_heads, head_dim] of scalar_t; s_a, s_b, s_out are base-2 "
        "log-sum-exp values, fp32, shape [num_tokens, num_heads]; all contiguous. Per token and "
        "head, in fp32: m = max(sa, sb); wa = 2^(sa - m); wb = 2^(sb - m); S = wa + wb; "
        "v_out = v_a * (wa / S) + v_b * (wb / S) rounded once; s_out = log2(S) + m. An lse of -inf "
        "means an empty state (weight 0); when both are -inf, v_out = 0 and s_out = -inf. "
        "An lse of -1e30 is an ordinary (finite) value; gaps between sa and sb can exceed 126. "
        "head_dim is a multiple of 8 (16-byte rows); nothing larger is promised. Memory-bound."
    ),
    args=(
        Arg("v_out", "tensor", role="out"),
        Arg("s_out", "tensor", dtype="float32", role="out"),
        Arg("v_a", "tensor"),
        Arg("s_a", "tensor", dtype="float32"),
        Arg("v_b", "tensor"),
        Arg("s_b", "tensor", dtype="float32"),
        Arg("num_tokens", "int"),
        Arg("num_heads", "int"),
        Arg("head_dim", "int", multiple_of=8),
    ),
    search_shapes=(
        {"num_tokens": 1, "num_heads": 32, "head_dim": 128},
        {"num_tokens": 16, "num_heads": 32, "head_dim": 128},
        {"num_tokens": 128, "num_heads": 32, "head_dim": 128},
        {"num_tokens": 512, "num_heads": 40, "head_dim": 128},
        {"num_tokens": 512, "num_heads": 32, "head_dim": 256},
        {"num_tokens": 512, "num_heads": 64, "head_dim": 128},
        {"num_tokens": 768, "num_heads": 32, "head_dim": 256},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "num_heads": 40, "head_dim": 128},
        {"num_tokens": 33, "num_heads": 32, "head_dim": 96},
        {"num_tokens": 77, "num_heads": 64, "head_dim": 64},
        {"num_tokens": 333, "num_heads": 28, "head_dim": 128},
        {"num_tokens": 1023, "num_heads": 16, "head_dim": 256},
        {"num_tokens": 2048, "num_heads": 8, "head_dim": 128},
        {"num_tokens": 1, "num_heads": 3, "head_dim": 40},
        {"num_tokens": 129, "num_heads": 7, "head_dim": 72},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=_bytes_moved,
    flops=lambda s: s["num_tokens"] * s["num_heads"] * (3 * s["head_dim"] + 10),
    dtypes=("float16", "bfloat16"),
    edge_cases=("neg_inf", "extreme", "gap"),
    heldout_draw=_draw,
    peers={"torch_eager": torch_eager, "flashinfer": flashinfer, "flashinfer_in_place": flashinfer_in_place},
    compiled=torch_eager,
)
