"""Peers at their best and spreads in every headline (CPU): the ratio spreads and verdicts,
the repeated loop's combination, the choice of the fastest torch.compile compilation, peers
that return or stage, and the library's compiled programs."""

from __future__ import annotations

import pytest
import torch

from evaluators.peers import (
    COMPILE_MODES,
    COMPILED,
    best_compiled,
    compile_name,
    only_peers,
    peer_fns,
)
from evaluators.timing import l2_finding
from kernels.peer import Peer, as_peer, call_once
from kernels.spec import list_kernels, load_kernel
from search import spread
from search.finalize import KernelResult, combine_runs
from search.spread import median_times


def test_verdict_needs_the_whole_range_above_one() -> None:
    assert spread.of([1.05, 1.10, 1.20]).verdict == "faster"
    assert spread.of([0.98, 1.10, 1.20]).verdict == "tie"
    assert spread.of([0.80, 0.90, 0.99]).verdict == "slower"
    s = spread.of([1.2, 1.0001, 1.5])
    assert (s.median, s.low, s.high, s.runs) == (1.2, 1.0001, 1.5, 3)
    assert spread.of([]) is None


def test_text_prints_the_range_and_says_when_there_is_one_run() -> None:
    assert spread.of([1.1, 1.2, 1.3]).text() == "1.200x [1.100-1.300] faster"
    assert "one run" in spread.of([1.1]).text()
    assert spread.text(spread.of([0.9, 1.1]).to_dict()) == "1.000x [0.900-1.100] tie"
    assert spread.text(None) == "-"


def test_spreads_take_one_geomean_per_loop_over_the_shapes_shown() -> None:
    runs = [
        {"best": {"a": 1.0, "b": 2.0}, "baseline": {"a": 4.0, "b": 2.0}, "peer": {"a": 1.0, "b": 2.0}},
        {"best": {"a": 1.0, "b": 2.0}, "baseline": {"a": 2.0, "b": 2.0}, "peer": {"a": 1.1, "b": 2.2}},
        {"best": {"a": 1.0, "b": 1.0}, "baseline": {"a": 1.0, "b": 1.0}, "peer": {"a": 0.9, "b": 0.9}},
    ]
    out = spread.spreads(runs)
    assert out["baseline"].low == pytest.approx(1.0) and out["baseline"].high == pytest.approx(2.0)
    assert out["baseline"].median == pytest.approx(2.0**0.5)
    assert out["peer"].verdict == "tie"  # 1.0, 1.1, 0.9
    only_a = spread.spreads(runs, labels=["a"])
    assert only_a["baseline"].high == pytest.approx(4.0)
    assert "peer" not in spread.spreads(runs, exclude=["peer"])


def test_a_target_is_met_only_by_the_whole_range() -> None:
    assert spread.against(1.1, spread.of([1.1, 1.2, 1.3])) == spread.MET  # the low end at the target is enough
    assert spread.against(1.1, spread.of([1.05, 1.2, 1.3])) == spread.WITHIN
    assert spread.against(1.1, spread.of([0.9, 1.0, 1.09])) == spread.NOT_MET
    assert spread.against(1.1, spread.of([1.0, 1.2]).to_dict()) == spread.WITHIN  # a written spread
    assert spread.against(1.1, 1.2) == spread.MET and spread.against(1.1, 1.0) == spread.NOT_MET  # one figure
    assert spread.against(1.1, None) == spread.NOT_MEASURED
    assert spread.all_of([spread.MET, spread.WITHIN]) == spread.WITHIN
    assert spread.all_of([spread.WITHIN, spread.NOT_MET, spread.MET]) == spread.NOT_MET
    assert spread.all_of([spread.MET, spread.MET]) == spread.MET and spread.all_of([]) == spread.NOT_MEASURED


def test_a_figure_over_kernels_ranges_from_its_lows_to_its_highs() -> None:
    import statistics

    parts = [spread.Spread(1.2, 1.0, 1.4, 3), spread.Spread(1.0, 0.9, 1.1, 3), spread.single(2.0)]
    med = spread.aggregate(parts, statistics.median)
    assert med is not None and (med.median, med.low, med.high, med.runs) == (1.2, 1.0, 1.4, 1)
    assert spread.aggregate([], statistics.median) is None


def _result() -> KernelResult:
    return KernelResult(None, None, None, None)  # type: ignore[arg-type]


def test_combined_runs_keep_every_loop_and_median_times() -> None:
    runs = [{"peers": {"best": {"a": v}, "baseline": {"a": 2 * v}}, "compiled": {"a": f"default#{i}"},
             "notes": {"flashinfer": "returns"}, "l2_persistence": {"persisting_l2_bytes": 0}}
            for i, v in enumerate((1.0, 3.0, 2.0), 1)]
    result = _result()
    combine_runs(result, runs)
    assert len(result.peer_runs) == 3
    assert result.peers == {"best": {"a": 2.0}, "baseline": {"a": 4.0}}
    assert result.peer_extra["compiled"] == [{"a": "default#1"}, {"a": "default#2"}, {"a": "default#3"}]
    assert result.peer_extra["notes"] == {"flashinfer": "returns"}
    assert result.peer_extra["l2_findings"] == []


def test_each_loops_setup_per_peer_is_kept() -> None:
    runs = [{"peers": {"best": {"a": 1.0}}, "prepare_s_by_peer": {"flashinfer": 20.0 + i},
             "prepare_s_first_shape_by_peer": {"flashinfer": 19.0 + i}} for i in range(3)]
    result = _result()
    combine_runs(result, runs)
    assert result.peer_extra["prepare_s_by_peer"] == [
        {"total": {"flashinfer": 20.0 + i}, "first_shape": {"flashinfer": 19.0 + i}} for i in range(3)]


def test_each_loops_library_builds_are_kept_in_loop_order() -> None:
    built = {"built": ["90/cached_ops/norm/norm.so"], "cpu_count": 16}
    runs = [{"peers": {"best": {"a": 1.0}}, "jit_builds": built}, {"peers": {"best": {"a": 1.0}}},
            {"peers": {"best": {"a": 1.0}}, "jit_builds": {"cpu_count": 16}}]
    result = _result()
    combine_runs(result, runs)
    assert result.peer_extra["jit_builds"] == [built, {}, {"cpu_count": 16}]


def test_a_failure_in_any_loop_removes_every_ratio_and_loop_errors_are_kept() -> None:
    runs = [{"peers": {"best": {"a": 1.0}, "baseline": {"a": 2.0}}},
            {"peers": {"best": {"a": 1.0}}, "failed": {"baseline": "REJECTED (replay): wrong"}},
            {"loop_error": "TIMEOUT"}]
    result = _result()
    combine_runs(result, runs)
    assert result.peer_runs == [] and result.peers == {}
    assert result.peer_failures == {"baseline": "run 2: REJECTED (replay): wrong"}
    assert any("run 3" in k for k in result.peer_errors)


def test_median_times_over_the_loops_that_timed_it() -> None:
    assert median_times([{"x": {"a": 1.0}}, {"x": {"a": 5.0, "b": 2.0}}]) == {"x": {"a": 3.0, "b": 2.0}}


def test_the_fastest_compilation_is_kept_per_shape_with_its_name() -> None:
    times = {compile_name("default", 1): {"a": 3.0, "b": 1.0}, compile_name("default", 2): {"a": 2.5, "b": 1.2},
             compile_name("max-autotune-no-cudagraphs", 1): {"a": 2.0, "b": 1.5}, "torch_eager": {"a": 0.1}}
    best, which = best_compiled(times)
    assert best == {"a": 2.0, "b": 1.0}
    assert which == {"a": "max-autotune-no-cudagraphs#1", "b": "default#1"}


def test_every_mode_is_compiled_at_least_twice_as_separate_peers() -> None:
    fns = peer_fns(load_kernel("silu_and_mul"))
    compiled = [n for n in fns if n.startswith("torch_compile[")]
    assert len(compiled) == 2 * len(COMPILE_MODES) and len(set(compiled)) == len(compiled)
    assert "max-autotune-no-cudagraphs" in COMPILE_MODES and "default" in COMPILE_MODES
    assert len(set(map(id, (fns[n] for n in compiled)))) == len(compiled)  # separate compilations


def test_a_peer_stages_outside_its_call_and_returns_its_results() -> None:
    calls: list[str] = []

    def stage(t, shape, constants, scratch):  # type: ignore[no-untyped-def]
        calls.append("stage")
        scratch.setdefault("half", torch.empty_like(t["x"])).copy_(t["x"] / 2)

    def run(t, shape, constants, scratch):  # type: ignore[no-untyped-def]
        calls.append("run")
        return {"out": scratch["half"] + 1}

    t = {"x": torch.ones(4), "out": torch.zeros(4)}
    got = call_once(Peer(run, stage=stage), t, {}, None)
    assert calls == ["stage", "run"]
    assert torch.equal(got["out"], torch.full((4,), 1.5)) and torch.equal(t["out"], torch.zeros(4))

    def writes(t, shape, constants):  # type: ignore[no-untyped-def]
        t["out"].fill_(7)

    assert call_once(as_peer(writes), t, {}, None) == {} and bool((t["out"] == 7).all())


def test_every_library_kernel_has_a_compiled_program() -> None:
    missing = [n for n in list_kernels() if load_kernel(n).compiled is None]
    assert not missing, f"torch.compile would compile the fp32 reference of {missing}"


def test_the_merge_peers_time_no_copy_into_the_outputs() -> None:
    peers = load_kernel("merge_attn_states_lse").peers
    assert isinstance(peers["flashinfer"], Peer) and isinstance(peers["flashinfer_in_place"], Peer)
    assert peers["flashinfer_in_place"].stage is not None
    assert isinstance(load_kernel("merge_attn_states_multi").peers["flashinfer"], Peer)


@pytest.mark.parametrize("case", ["random", "ties", "masked", "large_logits"])
def test_topk_program_is_a_topk_that_breaks_ties_like_the_reference(case: str) -> None:
    spec = load_kernel("topk_softmax")
    assert "sort" not in spec.compiled.__code__.co_names  # type: ignore[union-attr]
    for shape in spec.search_shapes:
        t = spec.make_inputs(shape, torch.float16, torch.Generator().manual_seed(3), case, "cpu")
        expected = spec.reference({k: v.clone() for k, v in t.items()}, shape, spec.constants)
        spec.compiled(t, shape, spec.constants)  # type: ignore[misc]
        assert torch.equal(t["topk_ids"].long(), expected["topk_ids"].long()), (shape, case)
        assert torch.allclose(t["topk_weights"], expected["topk_weights"]), (shape, case)


def test_liger_geglu_gets_its_split_outside_the_window() -> None:
    peer = load_kernel("gelu_tanh_and_mul").peers["liger_kernel"]
    assert isinstance(peer, Peer) and peer.stage is not None
    x = torch.arange(12.0).reshape(2, 6)
    scratch: dict = {}
    peer.stage({"x": x}, {"d": 3}, None, scratch)
    first = scratch["gate"]
    peer.stage({"x": x + 1}, {"d": 3}, None, scratch)
    assert scratch["gate"] is first  # same tensors: a graph captured on them stays valid
    assert torch.equal(scratch["up"], (x + 1)[:, 3:])


def test_l2_persistence_is_flagged_unless_both_are_zero() -> None:
    assert l2_finding({"persisting_l2_bytes": 0, "access_policy_window_bytes": 0}) is None
    assert "persisting_l2_bytes = 4096" in l2_finding({"persisting_l2_bytes": 4096, "access_policy_window_bytes": 0})
    assert "could not be checked" in l2_finding({"error": "no driver"})
    # A carve-out the process found and cleared before timing is on record, not a finding.
    assert l2_finding({"persisting_l2_bytes": 0, "access_policy_window_bytes": 0,
                       "persisting_l2_bytes_found": 11796480}) is None


def test_only_peers_keeps_the_named_peers_and_every_compilation_by_one_name() -> None:
    spec = load_kernel("merge_attn_states_lse")
    peers = peer_fns(spec)
    eager = only_peers(peers, ["torch_eager"])
    assert list(eager) == ["torch_eager"]
    compiled = only_peers(peers, [COMPILED])
    assert compiled and all(n.startswith(COMPILED + "[") for n in compiled)
    assert set(compiled) == {n for n in peers if n.startswith(COMPILED + "[")}
    assert only_peers(peers, ["no_such_peer"]) == {}


def test_a_peer_failing_on_one_shape_is_still_tried_on_the_others_and_a_missing_library_is_not():
    """Set up on the CPU: every peer that gets past its reference check then fails its graph
    capture, which is enough to see which peers are tried on which shapes."""
    import types

    from evaluators.peers import peer_impls

    spec = load_kernel("silu_and_mul")
    shapes = [dict(s) for s in spec.search_shapes[:2]]
    calls = {"fails_on_first": 0, "missing": 0}

    def fails_on_first(t, shape, constants):
        calls["fails_on_first"] += 1
        if shape == shapes[0]:
            raise RuntimeError("kernel launch failed: invalid argument")
        raise RuntimeError("second shape reached")

    def missing(t, shape, constants):
        calls["missing"] += 1
        raise ModuleNotFoundError("No module named 'somelib'")

    ctx = types.SimpleNamespace(device=torch.device("cpu"))
    peers = {"fails_on_first": as_peer(fails_on_first), "missing": as_peer(missing)}
    errors: dict[str, str] = {}
    for shape in shapes:
        assert peer_impls(ctx, spec, shape, "float32", None, {}, peers, errors) == []
    assert calls == {"fails_on_first": 2, "missing": 1}
    first, second = (f"[{', '.join(str(v) for v in s.values())}]" for s in shapes)
    assert errors["fails_on_first"].startswith(f"{first}: RuntimeError: kernel launch failed")
    assert f"; {second}: RuntimeError: second shape reached" in errors["fails_on_first"]
    assert errors["missing"] == "ModuleNotFoundError: No module named 'somelib'"
