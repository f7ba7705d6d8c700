"""topk_softmax: MoE routing. gating [T, E] -> fp32 softmax top-k weights [T, k] and int32 ids."""

from __future__ import annotations

from kernels import draws
from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, e, k = shape["num_tokens"], shape["num_experts"], shape["topk"]
    z = torch.randn(t, e, generator=generator, device=device)
    if case == "ties":
        logits = torch.zeros(t, e, device=device)  # every expert ties: ids 0..k-1
    elif case == "masked":
        # Experts masked out with -inf (probability exactly 0) among tied logits: the picks
        # past the finite ones tie at 0 and go to the lower ids. Expert 0 stays finite, so
        # every row has a maximum.
        logits = (z * 4.0).round() / 4.0
        logits = torch.where(torch.rand(t, e, generator=generator, device=device) < 0.4, float("-inf"), logits)
        logits[:, 0] = 0.0
    elif case == "large_logits":
        # Logits around 100: exp overflows fp32 unless the row maximum is subtracted first.
        logits = 100.0 + (z * 10.0).round().clamp(-30.0, 30.0)
    else:
        # Logits on a 1/32 grid (exact in fp16 and bf16): two distinct logits are far apart
        # compared with fp32 exp error, so the selection is unambiguous, and exact ties occur
        # often enough to exercise the lower-index rule.
        logits = (z * 64.0).round().clamp(-256.0, 256.0) / 32.0
    return {
        "topk_weights": torch.empty(t, k, device=device, dtype=torch.float32),
        "topk_ids": torch.empty(t, k, device=device, dtype=torch.int32),
        "gating_output": logits.to(dtype),
    }


def _route(gating, k, renormalize):
    import torch

    probs = torch.softmax(gating.float(), dim=-1)
    # A stable descending sort keeps equal probabilities in index order: ties go to the lower id.
    ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = probs.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def reference(inputs, shape, constants):
    import torch

    weights, ids = _route(inputs["gating_output"], shape["topk"], shape["renormalize"])
    return {"topk_weights": weights, "topk_ids": ids.to(torch.int32)}


def torch_eager(t, shape, constants):
    # A stable sort rather than torch.topk: topk may order (or pick) tied experts differently.
    weights, ids = _route(t["gating_output"], shape["topk"], shape["renormalize"])
    t["topk_weights"].copy_(weights)
    t["topk_ids"].copy_(ids)


def topk_program(t, shape, constants):
    """The program a serving engine compiles: torch.topk on the fp32 softmax, not a sort.
    Equal probabilities must go to the lower expert index, which torch.topk does not promise,
    so it ranks one int64 key per expert: the probability's bits (ordered like the values for
    p >= 0) above the reversed index."""
    import torch

    probs = torch.softmax(t["gating_output"].float(), dim=-1)
    experts = probs.shape[-1]
    assert experts <= INDEX_SPAN, f"{experts} experts: the key keeps {INDEX_SPAN}"
    index = torch.arange(experts, device=probs.device)
    key = probs.view(torch.int32).to(torch.int64) * INDEX_SPAN + (INDEX_SPAN - 1 - index)
    ids = torch.topk(key, shape["topk"], dim=-1).indices
    weights = probs.gather(1, ids)
    if shape["renormalize"]:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    t["topk_weights"].copy_(weights)
    t["topk_ids"].copy_(ids)


INDEX_SPAN = 1024  # experts a topk_program key can tell apart


def _draw_one(rng, index):
    experts = draws.at_alignment(rng, 8, 256)
    return {"num_tokens": draws.tokens(rng, index), "num_experts": experts,
            "topk": draws.at_alignment(rng, 1, min(9, experts)), "renormalize": rng.randrange(2)}


def _draw(rng):
    """Three shapes per run: odd token, expert and top-k counts (8 to 256 experts)."""
    return draws.draw_shapes(rng, _draw_one, lambda s: s["num_tokens"] * s["num_experts"])


SPEC = KernelSpec(
    name="topk_softmax",
    description=(
        "MoE router: softmax over experts, then top-k. gating_output has shape "
        "[num_tokens, num_experts] (row-major, contiguous, element type scalar_t); topk_weights is "
        "fp32 [num_tokens, topk] and topk_ids is int32 [num_tokens, topk]. Per row, in fp32: "
        "p = softmax(gating) (subtract the row max first: logits can be ~130); pick the topk "
        "experts with the largest p in descending order of p, equal p going to the lower expert "
        "index (an expert whose logit is -inf has p = 0 and ties with the others at 0); topk_ids holds their indices and topk_weights their p. If renormalize is nonzero, "
        "topk_weights is divided by its row sum. Ids are compared exactly. Small rows: "
        "num_experts is 8 to 256 and need not be a power of two."
    ),
    args=(
        Arg("topk_weights", "tensor", dtype="float32", role="out"),
        Arg("topk_ids", "tensor", dtype="int32", role="out"),
        Arg("gating_output", "tensor"),
        Arg("num_tokens", "int"),
        Arg("num_experts", "int"),
        Arg("topk", "int"),
        Arg("renormalize", "int", min_value=0),
    ),
    # Mixtral 8 experts top-2 (renormalised), Qwen3-30B-A3B 128 top-8 (renormalised),
    # DeepSeek-V3-sized 256 top-8, OLMoE 64 top-8, Qwen1.5-MoE 60 top-4, DBRX 16 top-4.
    search_shapes=(
        {"num_tokens": 1, "num_experts": 8, "topk": 2, "renormalize": 1},
        {"num_tokens": 16, "num_experts": 128, "topk": 8, "renormalize": 1},
        {"num_tokens": 128, "num_experts": 256, "topk": 8, "renormalize": 0},
        {"num_tokens": 333, "num_experts": 64, "topk": 8, "renormalize": 0},
        {"num_tokens": 512, "num_experts": 8, "topk": 2, "renormalize": 1},
        {"num_tokens": 1024, "num_experts": 128, "topk": 8, "renormalize": 1},
        {"num_tokens": 4096, "num_experts": 256, "topk": 8, "renormalize": 0},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "num_experts": 60, "topk": 4, "renormalize": 0},
        {"num_tokens": 77, "num_experts": 16, "topk": 4, "renormalize": 1},
        {"num_tokens": 2048, "num_experts": 128, "topk": 8, "renormalize": 0},
        {"num_tokens": 8191, "num_experts": 8, "topk": 2, "renormalize": 1},
        {"num_tokens": 1, "num_experts": 9, "topk": 1, "renormalize": 0},
        {"num_tokens": 129, "num_experts": 33, "topk": 3, "renormalize": 1},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["num_experts"] * (4 if dt == "float32" else 2) + 8 * s["topk"]),
    flops=lambda s: 4 * s["num_tokens"] * s["num_experts"],
    dtypes=("float16", "bfloat16"),
    edge_cases=("ties", "large_logits", "masked"),
    heldout_draw=_draw,
    peers={"torch_eager": torch_eager},
    compiled=topk_program,
)
