"""cross_entropy_rows: per-token cross-entropy loss of logits against int64 targets, ignore_index -100."""

from __future__ import annotations

from kernels import draws
from kernels.spec import Arg, KernelSpec

IGNORE_INDEX = -100


def make_inputs(shape, dtype, generator, case, device):
    import torch

    t, v = shape["num_tokens"], shape["vocab"]
    x = torch.randn(t, v, generator=generator, device=device) * 3.0
    target = torch.randint(0, v, (t,), generator=generator, device=device)
    if case == "large":
        x = 200.0 + x * 15.0  # exp overflows fp32 unless the row maximum is subtracted first
    elif case == "ignored":
        # Every third token is padding (loss 0); the others point at the row's first or last logit.
        target = torch.where(torch.arange(t, device=device) % 2 == 0, 0, v - 1)
        target[::3] = IGNORE_INDEX
    return {
        "loss": torch.empty(t, device=device, dtype=torch.float32),
        "logits": x.to(dtype),
        "target": target.to(torch.int64),
    }


def reference(inputs, shape, constants):
    import torch

    logits = inputs["logits"].float()
    loss = torch.nn.functional.cross_entropy(logits, inputs["target"], reduction="none", ignore_index=IGNORE_INDEX)
    return {"loss": loss}


def torch_eager(t, shape, constants):
    import torch

    loss = torch.nn.functional.cross_entropy(t["logits"].float(), t["target"], reduction="none",
                                             ignore_index=IGNORE_INDEX)
    t["loss"].copy_(loss)


SPEC = KernelSpec(
    name="cross_entropy_rows",
    description=(
        "Per-token cross-entropy of logits (training or scoring). logits has shape [num_tokens, vocab] "
        "(row-major, contiguous); target is int64 [num_tokens]; loss is fp32 [num_tokens]. Per row, in "
        "fp32: loss[t] = log(sum_j exp(x[t, j])) - x[t, target[t]] (subtract the row max before exp), "
        "and loss[t] = 0 where target[t] == -100 (ignored). Targets are otherwise in [0, vocab). vocab is "
        "a multiple of 8 and nothing larger is promised. Memory-bound: reads vocab elements per token."
    ),
    args=(
        Arg("loss", "tensor", dtype="float32", role="out"),
        Arg("logits", "tensor"),
        Arg("target", "tensor", dtype="int64"),
        Arg("num_tokens", "int"),
        Arg("vocab", "int", multiple_of=8),
    ),
    search_shapes=(
        {"num_tokens": 1, "vocab": 128256},
        {"num_tokens": 16, "vocab": 32000},
        {"num_tokens": 128, "vocab": 151936},
        {"num_tokens": 333, "vocab": 32064},
        {"num_tokens": 512, "vocab": 128256},
        {"num_tokens": 1024, "vocab": 32000},
        {"num_tokens": 4096, "vocab": 32000},
    ),
    heldout_shapes=(
        {"num_tokens": 7, "vocab": 152064},
        {"num_tokens": 77, "vocab": 49152},
        {"num_tokens": 2048, "vocab": 102400},
        {"num_tokens": 8191, "vocab": 32000},
        {"num_tokens": 1, "vocab": 32008},
        {"num_tokens": 129, "vocab": 50280},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: s["num_tokens"] * (s["vocab"] * (4 if dt == "float32" else 2) + 12),
    flops=lambda s: 3 * s["num_tokens"] * s["vocab"],
    dtypes=("float16", "bfloat16", "float32"),
    edge_cases=("large", "ignored"),
    tolerances={"float32": (1e-5, 2e-4)},
    heldout_draw=draws.row_draw(8, 1024, 131072, cols="vocab"),
    peers={"torch_eager": torch_eager},
)
