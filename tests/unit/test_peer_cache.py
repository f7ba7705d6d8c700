"""The peer-timing cache: what its key depends on, what it stores, and how the end-of-run loops use it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kernels.spec import load_kernel, shape_label
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status
from search import peer_cache
from search.dispatch import single
from search.peer_cache import PeerCache, library_versions, peer_part, with_cached
from search.selection import Scored
from search.stages import by_kind, union_s

ENV = {"gpu": "NVIDIA H200", "arch": "sm_90", "driver": 13000, "runtime": 13000, "torch": "2.11.0"}
SHAPES = [{"rows": 1, "cols": 4096}, {"rows": 64, "cols": 4096}]
LABELS = [shape_label(s) for s in SHAPES]


def _key(cache: PeerCache, **change: Any) -> str:
    args = {"kernel_digest": "abc", "dtype": "float16", "shape_set": "search", "shapes": SHAPES, "loop": 0,
            "compile_trials": 1, **change}
    return cache.key(**args)


def _reply(peers: bool = True, ours_ms: float = 1.0) -> dict[str, Any]:
    times: dict[str, dict[str, float]] = {"best": {lb: ours_ms for lb in LABELS},
                                          "baseline": {lb: 3.0 for lb in LABELS},
                                          "best@graph": {lb: 0.9 for lb in LABELS}}
    if peers:
        times["torch_compile"] = {lb: 2.0 for lb in LABELS}
        times["flashinfer"] = {lb: 2.5 for lb in LABELS}
    return {"peers": times, "iqr": {n: {lb: 0.01 for lb in LABELS} for n in times}, "errors": {},
            "failed": {}, "compiled": {LABELS[0]: "default#1"} if peers else {},
            "notes": {"flashinfer": "returns its tensors"} if peers else {}}


def test_the_key_changes_with_everything_that_changes_a_peers_figure(tmp_path: Path) -> None:
    cache = PeerCache(tmp_path, ENV)
    base = _key(cache)
    assert _key(cache) == base  # stable
    changed = [_key(cache, kernel_digest="abd"), _key(cache, dtype="bfloat16"), _key(cache, shape_set="heldout"),
               _key(cache, shapes=SHAPES[:1]), _key(cache, loop=1), _key(cache, compile_trials=2),
               _key(PeerCache(tmp_path, {**ENV, "driver": 13010})), _key(PeerCache(tmp_path, {**ENV, "gpu": "H100"})),
               _key(PeerCache(tmp_path, {**ENV, "torch": "2.12.0"}))]
    assert len({base, *changed}) == len(changed) + 1


def test_the_key_changes_with_the_timing_protocols_source(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for rel in peer_cache.PROTOCOL_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("# v1\n")
    before = peer_cache.protocol_digest(root)
    (root / "evaluators/timing.py").write_text("# v2\n")
    assert peer_cache.protocol_digest(root) != before


def test_a_loops_peer_figures_are_stored_without_ours_and_read_back(tmp_path: Path) -> None:
    cache = PeerCache(tmp_path, ENV)
    key = _key(cache)
    assert cache.get(key) is None
    assert cache.put(key, _reply(), ["best", "baseline"], "run-1")
    entry = cache.get(key)
    assert entry is not None
    assert sorted(entry["peers"]) == ["flashinfer", "torch_compile"]  # best, baseline, best@graph left out
    assert entry["run_id"] == "run-1" and entry["measured_at"] and entry["environment"] == ENV
    assert entry["compiled"] == {LABELS[0]: "default#1"}


@pytest.mark.parametrize("spoil", ["failed", "separate_loops", "no peers"])
def test_a_loop_that_is_not_a_plain_measurement_stores_nothing(tmp_path: Path, spoil: str) -> None:
    cache = PeerCache(tmp_path, ENV)
    reply = _reply(peers=spoil != "no peers")
    if spoil == "failed":
        reply["failed"] = {"best": "REJECTED (replay): ..."}
    elif spoil == "separate_loops":
        reply["separate_loops"] = True
    assert not cache.put(_key(cache), reply, ["best", "baseline"], "run-1")
    assert cache.get(_key(cache)) is None


def test_an_unreadable_or_foreign_entry_is_a_miss(tmp_path: Path) -> None:
    cache = PeerCache(tmp_path, ENV)
    key = _key(cache)
    cache.put(key, _reply(), ["best", "baseline"], "run-1")
    path = next(tmp_path.rglob(f"{key}.json"))
    path.write_text("{not json")
    assert cache.get(key) is None
    path.write_text(json.dumps({"key": "another", "peers": {}}))
    assert cache.get(key) is None


def test_cached_peers_join_a_loop_of_ours_alone_and_say_where_they_come_from(tmp_path: Path) -> None:
    cache = PeerCache(tmp_path, ENV)
    key = _key(cache)
    cache.put(key, _reply(ours_ms=5.0), ["best", "baseline"], "run-1")
    entry = cache.get(key)
    assert entry is not None
    merged = with_cached(_reply(peers=False, ours_ms=1.0), entry)
    assert merged["peers"]["best"] == {lb: 1.0 for lb in LABELS}  # ours from this loop, never the cache's
    assert merged["peers"]["torch_compile"] == {lb: 2.0 for lb in LABELS}
    assert merged["compiled"] == {LABELS[0]: "default#1"} and merged["notes"]["flashinfer"]
    assert merged["cached_peers"]["run_id"] == "run-1" and merged["cached_peers"]["measured_at"]
    assert peer_part(merged, ["best", "baseline"])["peers"] == entry["peers"]


def test_a_reused_peer_figure_is_scaled_by_the_baselines_drift_on_each_shape(tmp_path: Path) -> None:
    # measured beside a baseline of 3.0 ms; this loop's baseline runs 10% faster on the first
    # shape and has no time on the second: the peer keeps its time relative to the baseline
    # where it can, and says where it cannot.
    cache = PeerCache(tmp_path, ENV)
    key = _key(cache)
    cache.put(key, _reply(), ["best", "baseline"], "run-1")
    entry = cache.get(key)
    assert entry is not None and entry["anchor"] == {"impl": "baseline", "times": {lb: 3.0 for lb in LABELS}}
    now = _reply(peers=False)
    now["peers"]["baseline"] = {LABELS[0]: 2.7}
    merged = with_cached(now, entry)
    assert merged["peers"]["torch_compile"][LABELS[0]] == pytest.approx(1.8)
    assert merged["peers"]["torch_compile"][LABELS[1]] == 2.0
    assert merged["iqr"]["torch_compile"][LABELS[0]] == pytest.approx(0.009)
    assert merged["peers"]["baseline"] == {LABELS[0]: 2.7}  # ours and the baseline as this loop timed them
    assert merged["cached_peers"]["scale"] == {LABELS[0]: pytest.approx(0.9)}
    assert merged["cached_peers"]["unanchored"] == [LABELS[1]] and merged["cached_peers"]["anchor"] == "baseline"


def test_a_loop_without_the_baselines_times_stores_nothing(tmp_path: Path) -> None:
    cache = PeerCache(tmp_path, ENV)
    reply = _reply()
    del reply["peers"]["baseline"]
    assert not cache.put(_key(cache), reply, ["best", "baseline"], "run-1")


def test_library_versions_name_a_missing_library_none() -> None:
    found = library_versions()
    assert set(found) == set(peer_cache.LIBRARIES)
    assert found["torch"]  # installed wherever the tests run
    assert all(v is None or isinstance(v, str) for v in found.values())


def test_wall_time_of_overlapping_calls_is_counted_once() -> None:
    assert union_s([(0, 10), (5, 12), (20, 21)]) == 13
    assert union_s([]) == 0
    spans = [("sanitize", 0.0, 10.0), ("sanitize", 2.0, 9.0), ("time_peers", 10.0, 15.0), ("evaluate", -5.0, -1.0)]
    assert by_kind(spans, since=0.0) == {"sanitize": 10.0, "time_peers": 5.0}


# -- the end-of-run loops over the cache ------------------------------------------------------


def _loops(tmp_path: Path, fresh: bool = False, cache: PeerCache | None = None,
           sets: tuple[str, ...] = ("search",), hold: list[Any] | None = None,
           compiling: int = 0, overlap: bool = True) -> tuple[list[Any], list[Any], Any]:
    """Runs EndOfRun._loops for silu_and_mul's shape sets ``sets`` against a scripted evaluator;
    returns the calls made (one per loop), the replies handed on (the first set's, or every
    set's when several) and the EndOfRun. ``hold``: the rounds' answers wait there (callables
    that give them) instead of coming at once; ``compiling``: compile-ahead processes in
    flight when the loops are asked for."""
    from search.finalize import EndOfRun, _Progress

    spec = load_kernel("silu_and_mul")
    calls: list[Any] = []
    asked: list[Any] = []  # every loop of every round asked for

    def recorded_call(key: str, done: Any, method: str, ref: Any, dtype: str, loops: Any, beside: bool,
                      exclusive: bool = True, what: str = "") -> None:
        assert method == "time_round" and beside is overlap and exclusive is not overlap
        asked.extend(loops)
        replies = []
        for loop in loops:
            calls.append((key, loop["peers"], what) if len(sets) == 1 else (loop["shape_set"], key, what))
            labels = [shape_label(s) for s in spec.shapes(loop["shape_set"])]
            times = {"best": {lb: 1.0 for lb in labels}, "baseline": {lb: 3.0 for lb in labels}}
            if loop["peers"]:
                times["torch_compile"] = {lb: 1.0 + len(calls) for lb in labels}
            replies.append({"peers": times, "failed": {}, "errors": {}})
        if hold is None:
            done({"loops": replies}, "")
        else:
            hold.append(lambda: done({"loops": replies}, ""))

    evaluator = SimpleNamespace(peer_runs=3, compile_trials=1, fresh_peers=fresh, compile_ahead=False, peers=True,
                                overlap_rounds=overlap)
    ctl = SimpleNamespace(config=SimpleNamespace(evaluator=evaluator), recorded_call=recorded_call, answers={},
                          records=SimpleNamespace(run_id="run-x"))
    end = EndOfRun.__new__(EndOfRun)
    end.ctl, end.cache, end.ahead = ctl, cache, None  # type: ignore[assignment]
    end.loops_expected, end.loops_done, end.loops_started = 3, 0, 0.0
    end.compiling, end.waiting = compiling, []
    base = Scored(Variant("silu_and_mul", "// baseline\n"),
                  Evaluation(Status.OK, shapes=tuple(ShapeResult(dict(s), 1.0, 1.0) for s in spec.search_shapes)))
    st = SimpleNamespace(name="silu_and_mul", dtype="float16", ref=SimpleNamespace(digest="d1"), spec=spec,
                         baseline=base.variant)
    k = _Progress(st, [])  # type: ignore[arg-type]
    k.winner, k.dispatch = base, single(base, spec.search_shapes)
    got: list[Any] = []
    from kernels.records import ShapeSet

    ours = {"best": ("// b\n", {}), "baseline": ("// baseline\n", {})}
    plans = [end._plan(k, ShapeSet(name), ours) for name in sets]
    end.asked, end.progress = asked, k  # type: ignore[attr-defined]
    end._loops(k, plans, lambda runs: got.extend(runs[0] if len(sets) == 1 else runs))
    return calls, got, end


def test_each_round_holds_its_search_and_held_out_loops_in_order(tmp_path: Path) -> None:
    """Round i is one call with the search loop of round i and then its held-out loop (one
    fresh process sets both up, then times both), so the rounds, not the shape sets, are the
    outer order."""
    calls, (search, heldout), _ = _loops(tmp_path, sets=("search", "heldout"))
    assert [c[0] for c in calls] == ["search", "heldout"] * 3
    assert [c[2] for c in calls][:2] == ["silu_and_mul peers' loops, round 1 of 3"] * 2
    assert len({c[1] for c in calls}) == 3  # every round recorded under a key of its own
    spec = load_kernel("silu_and_mul")
    assert len(search) == len(heldout) == 3
    assert set(search[0]["peers"]["best"]) == {shape_label(s) for s in spec.search_shapes}
    assert set(heldout[0]["peers"]["best"]) == {shape_label(s) for s in spec.heldout_shapes}


def test_the_rounds_are_asked_for_all_at_once_and_reported_in_their_order(tmp_path: Path) -> None:
    """Every round is in flight before any answers (their set-ups overlap on the GPU machine),
    and the replies reach the report in round order whatever order the answers came in."""
    held: list[Any] = []
    calls, got, _ = _loops(tmp_path, hold=held)
    assert len(calls) == 3 and len(held) == 3 and got == []
    for give in reversed(held):
        give()
    assert [r["peers"]["torch_compile"] for r in got] == [{lb: 1.0 + i for lb in r["peers"]["best"]} for i, r in
                                                          enumerate(got, start=1)]


def test_without_overlap_each_round_takes_the_evaluator_alone(tmp_path: Path) -> None:
    calls, got, _ = _loops(tmp_path, overlap=False)  # the scripted evaluator checks the call's kind
    assert len(calls) == 3 and len(got) == 3


def test_no_round_starts_while_a_compile_ahead_process_runs(tmp_path: Path) -> None:
    calls, got, end = _loops(tmp_path, compiling=2)
    assert calls == [] and len(end.waiting) == 1
    # The compilations end after the loops were asked for: the rounds load what they made.
    end.progress.folders = {("search", i): f"/tmp/compiled/search-{i + 1}" for i in range(3)}
    end.compiling = 0
    end.waiting.pop()()
    assert len(calls) == 3 and len(got) == 3
    assert [loop["compile_cache"] for loop in end.asked] == [f"/tmp/compiled/search-{i + 1}" for i in range(3)]


def test_the_first_run_times_the_peers_and_a_later_one_times_ours_alone(tmp_path: Path) -> None:
    cache = PeerCache(tmp_path, ENV)
    calls, first, _ = _loops(tmp_path, cache=cache)
    assert [peers for _, peers, _ in calls] == [True, True, True]
    assert all(r["peers_stored"] for r in first)
    calls, later, _ = _loops(tmp_path, cache=cache)
    assert [peers for _, peers, _ in calls] == [False, False, False]  # our kernels alone, three fresh loops
    assert all("peers from the cache" in what for _, _, what in calls)
    # loop i takes loop i's figures: the spread over loops stays one over independent loops
    assert [r["peers"]["torch_compile"] for r in later] == [r["peers"]["torch_compile"] for r in first]
    assert all(r["cached_peers"]["run_id"] == "run-x" for r in later)
    # recorded under keys of their own: a resumed run never mistakes one kind of loop for the other
    first_keys = {key for key, _, _ in _loops(tmp_path)[0]}
    assert not first_keys & {key for key, _, _ in calls}


def test_fresh_peers_measures_again_and_replaces_the_figures(tmp_path: Path) -> None:
    cache = PeerCache(tmp_path, ENV)
    _loops(tmp_path, cache=cache)
    calls, again, _ = _loops(tmp_path, fresh=True, cache=cache)
    assert [peers for _, peers, _ in calls] == [True, True, True]
    assert all(r.get("cached_peers") is None and r["peers_stored"] for r in again)


def test_without_a_cache_every_loop_times_the_peers(tmp_path: Path) -> None:
    calls, replies, _ = _loops(tmp_path, cache=None)
    assert [peers for _, peers, _ in calls] == [True, True, True]
    assert all("peers_stored" not in r for r in replies)
