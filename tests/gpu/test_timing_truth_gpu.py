"""GPU tests of one timing truth and peers at their best (H200): ``python -m pytest -m gpu
tests/gpu/test_timing_truth_gpu.py``. Skipped cleanly without a GPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from evaluators.api import EvalRequest, TimingConfig
from kernels.spec import load_kernel, shape_label
from kernels.variant import Variant
from kernels.verdict import Status

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Any]:
    from evaluators.gpu import GpuEvaluator

    ev = GpuEvaluator(step_timeout_s=30.0)
    yield ev
    ev.close()


def _baseline(kernel: str) -> Variant:
    spec = load_kernel(kernel)
    return Variant(spec.name, spec.baseline_source(), author="baseline")


def test_the_loop_records_l2_persistence_off_and_the_winning_compilation(evaluator: Any) -> None:
    spec = load_kernel("silu_and_mul")
    reply = evaluator.time_peers_full("silu_and_mul", "float16", "search", {"baseline": (spec.baseline_source(), {})},
                                      repetitions=20, compile_trials=1)
    # Whatever carve-out the context started with, the timing process cleared it before timing.
    l2 = reply["l2_persistence"]
    assert (l2["persisting_l2_bytes"], l2["access_policy_window_bytes"]) == (0, 0), reply
    assert "l2_finding" not in reply
    labels = {shape_label(s) for s in spec.search_shapes}
    assert set(reply["peers"]["torch_compile"]) == labels, reply["errors"]
    assert set(reply["compiled"]) == labels
    assert {w.split("#")[0] for w in reply["compiled"].values()} <= {"default", "max-autotune-no-cudagraphs"}
    assert not any(n.startswith("torch_compile[") for n in reply["peers"])


def test_the_evaluator_records_l2_persistence(evaluator: Any) -> None:
    ev = evaluator.evaluate(EvalRequest("silu_and_mul", _baseline("silu_and_mul"), timing=TimingConfig.full()))
    assert ev.status is Status.OK, ev.message
    l2 = ev.extra["l2_persistence"]
    assert (l2["persisting_l2_bytes"], l2["access_policy_window_bytes"]) == (0, 0), l2


def test_a_fresh_process_per_repetition_of_a_kernels_loop(evaluator: Any) -> None:
    spec = load_kernel("rmsnorm")
    ours: dict[str, tuple[str, dict[str, int]]] = {"baseline": (spec.baseline_source(), {})}
    evaluator.time_peers_full("rmsnorm", "float16", "search", ours, repetitions=5, fresh_process=True, compile_trials=1)
    first = evaluator.info()["pid"]
    evaluator.time_peers_full("rmsnorm", "float16", "search", ours, repetitions=5, fresh_process=True, compile_trials=1)
    assert evaluator.info()["pid"] != first


def test_returning_and_staging_peers_are_timed_and_agree_with_the_reference(evaluator: Any) -> None:
    for kernel in ("merge_attn_states_lse", "merge_attn_states_multi", "gelu_tanh_and_mul", "rmsnorm"):
        spec = load_kernel(kernel)
        reply = evaluator.time_peers_full(kernel, "float16", "search", {"baseline": (spec.baseline_source(), {})},
                                          repetitions=10, compile_trials=1)
        wanted = {"merge_attn_states_lse": {"flashinfer", "flashinfer_in_place"},
                  "merge_attn_states_multi": {"flashinfer"}, "gelu_tanh_and_mul": {"liger_kernel"},
                  "rmsnorm": {"liger_kernel"}}[kernel]
        assert wanted <= set(reply["peers"]), (kernel, reply["errors"])
        assert not reply["failed"], reply["failed"]


def test_the_dispatch_choice_loop_times_our_kernels_alone_and_settles_the_table(evaluator: Any) -> None:
    """The choice loop of search.dispatch: our kernels alone (no peer set up or compiled),
    each on every search shape, and the table given to the fastest per shape."""
    from agents.embedded.codegen import generate
    from search.dispatch import choose
    from search.selection import Scored

    spec = load_kernel("rmsnorm")
    rows = {s.name: s.source for s in generate(spec)}
    ours = {"best": (rows["codegen:rows/block"], {}), "best:warp": (rows["codegen:rows/warp"], {})}
    reply = evaluator.time_peers_full("rmsnorm", "float16", "search", ours, repetitions=20, peers=False)
    labels = {shape_label(s) for s in spec.search_shapes}
    assert set(reply["peers"]) == {"best", "best:warp"} and not reply["failed"], reply
    assert all(set(t) == labels for t in reply["peers"].values())
    # Fed to a dispatch of the two, each shape goes to the faster of the loop's two medians.
    fake = [Scored(Variant("rmsnorm", src), reply_eval) for src, reply_eval in (
        (rows["codegen:rows/block"], _even_evaluation(spec, 1.0)), (rows["codegen:rows/warp"], _even_evaluation(spec, 1.5)))]
    d = choose(fake[0], [fake[1]], spec.search_shapes, min_gain=1.0)
    assert len(d.members) == 2
    r = d.retimed([reply["peers"]["best"], reply["peers"]["best:warp"]])
    for label in labels:
        faster = 0 if reply["peers"]["best"][label] <= reply["peers"]["best:warp"][label] else 1
        assert r.members[r.table[label]].variant.source == fake[faster].variant.source


def _even_evaluation(spec: Any, speedup: float) -> Any:
    from kernels.verdict import Evaluation, ShapeResult

    return Evaluation(Status.OK, shapes=tuple(ShapeResult(dict(s), candidate_ms=1.0 / speedup, baseline_ms=1.0)
                                             for s in spec.search_shapes))


def test_the_flush_resets_eviction_priorities_of_the_working_set_and_keeps_its_data() -> None:
    """The flush's priority reset (applypriority over every line of the covered tensors) runs
    on the current stream, leaves every byte as it was, and covers views that start off a line."""
    from evaluators.timing import Flusher

    flush = Flusher(torch.device("cuda"), nbytes=1 << 20)
    a = torch.randn(3, 1000, device="cuda", dtype=torch.float16)
    b = torch.arange(1 << 20, device="cuda", dtype=torch.int32)[7:]  # starts 28 bytes into a line
    before = (a.clone(), b.clone())
    flush.cover([a, b])
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        flush()
        b.add_(1)  # queued after the flush on the same stream
    stream.synchronize()
    assert torch.equal(a, before[0]) and torch.equal(b, before[1] + 1)
    assert len(flush._streams) == 1


def test_loads_that_ask_the_l2_to_keep_their_lines_buy_no_time(evaluator: Any) -> None:
    """A fused_add_rmsnorm whose loads carry an evict_last policy, beside the same code without
    it in one loop: before the flush reset eviction priorities its lines outlived the flush and
    its one-row launches ran ~1.3-1.5x faster (experiments/results/timing-neighbours-h200.md);
    now it is no faster than its twin on the latency-bound shapes, where the effect was."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "adversarial"
    ours = {"kept": ((folder / "evict_last_inputs.cu").read_text(), {}),
            "plain": ((folder / "honest_rmsnorm_warp_shuffle.cu").read_text(), {})}
    reply = evaluator.time_peers_full("fused_add_rmsnorm", "float16", "search", ours, repetitions=50, peers=False)
    assert not reply["failed"], reply["failed"]
    for shape in load_kernel("fused_add_rmsnorm").search_shapes[:3]:
        label = shape_label(shape)
        assert reply["peers"]["kept"][label] >= 0.9 * reply["peers"]["plain"][label], (label, reply["peers"])
