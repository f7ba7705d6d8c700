"""Per-shape dispatch: which variants join a kernel's result, which shape each runs on."""

from __future__ import annotations

import pytest

from kernels.spec import shape_label
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status
from search.dispatch import choose, single
from search.selection import Scored

SHAPES = ({"rows": 1, "cols": 131072}, {"rows": 128, "cols": 4096}, {"rows": 4096, "cols": 8192},
          {"rows": 16384, "cols": 128})


def _item(tag: str, speedups: list[float], shapes: tuple[dict[str, int], ...] = SHAPES) -> Scored:
    results = tuple(ShapeResult(dict(s), candidate_ms=1.0 / x, baseline_ms=1.0) for s, x in zip(shapes, speedups, strict=True))
    return Scored(Variant("k", f"// {tag}\n"), Evaluation(Status.OK, shapes=results))


def test_a_variant_that_wins_one_shape_by_far_joins_and_runs_there():
    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    split = _item("split", [4.0, 2.5, 1.5, 1.0])  # twice as fast on the one long row
    d = choose(primary, [split], SHAPES)
    assert [m.variant.source for m in d.members] == ["// primary\n", "// split\n"]
    assert d.table == {shape_label(SHAPES[0]): 1, shape_label(SHAPES[1]): 0, shape_label(SHAPES[2]): 0,
                       shape_label(SHAPES[3]): 0}
    assert d.expected == pytest.approx((4.0 * 3.0 * 2.0 * 2.0) ** 0.25)
    assert d.primary_alone == pytest.approx((2.0 * 3.0 * 2.0 * 2.0) ** 0.25)


def test_small_per_shape_differences_do_not_add_members():
    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    near = _item("near", [2.05, 2.9, 2.02, 1.9])  # a few percent on two shapes: noise-sized
    d = choose(primary, [near], SHAPES)
    assert len(d.members) == 1 and set(d.table.values()) == {0}
    assert d.expected == d.primary_alone


def test_members_are_capped_and_the_best_gain_joins_first():
    primary = _item("primary", [1.0, 1.0, 1.0, 1.0])
    a = _item("a", [2.0, 1.0, 1.0, 1.0])
    b = _item("b", [1.0, 3.0, 1.0, 1.0])
    c = _item("c", [1.0, 1.0, 1.5, 1.0])
    d = choose(primary, [a, b, c], SHAPES, max_members=3)
    assert [m.variant.source for m in d.members] == ["// primary\n", "// b\n", "// a\n"]


def test_a_member_that_a_later_one_beats_everywhere_is_dropped():
    primary = _item("primary", [1.0, 1.0, 1.0, 1.0])
    first = _item("first", [2.0, 1.0, 1.0, 1.0])
    both = _item("both", [2.5, 1.6, 1.0, 1.0])  # joins second, then leads both shapes
    # Greedy: "both" gains most alone (2.5 * 1.6), joins first; "first" then adds nothing.
    d = choose(primary, [first, both], SHAPES)
    assert [m.variant.source for m in d.members] == ["// primary\n", "// both\n"]
    # Order of joining can also leave a member without shapes: it is then not kept.
    d2 = choose(primary, [first, both], SHAPES, min_gain=1.0)
    assert all(i in d2.table.values() for i in range(1, len(d2.members)))


def test_candidates_missing_a_search_shape_are_passed_over():
    primary = _item("primary", [1.0, 1.0, 1.0, 1.0])
    partial = _item("partial", [9.0, 9.0], SHAPES[:2])  # screened on two shapes only, cut early
    assert len(choose(primary, [partial], SHAPES).members) == 1


def test_other_shapes_go_to_the_member_of_the_nearest_search_shape():
    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    split = _item("split", [4.0, 2.5, 1.5, 1.0])
    d = choose(primary, [split], SHAPES)
    assert d.member_for({"rows": 3, "cols": 100000}) == 1  # few long rows: like [1, 131072]
    assert d.member_for({"rows": 8191, "cols": 3584}) == 0
    assert d.member_for({"rows": 32767, "cols": 144}) == 0
    assert d.member_for(SHAPES[0]) == 1


def test_dropping_a_member_gives_its_shapes_to_the_primary():
    primary = _item("primary", [1.0, 1.0, 1.0, 1.0])
    a = _item("a", [2.0, 1.0, 1.0, 1.0])
    b = _item("b", [1.0, 3.0, 1.0, 1.0])
    d = choose(primary, [a, b], SHAPES)
    dropped = d.without(1)  # b joined first
    assert [m.variant.source for m in dropped.members] == ["// primary\n", "// a\n"]
    assert dropped.table[shape_label(SHAPES[1])] == 0 and dropped.table[shape_label(SHAPES[0])] == 1
    assert dropped.expected == pytest.approx(2.0 ** 0.25) and dropped.primary_alone == pytest.approx(1.0)
    with pytest.raises(ValueError):
        d.without(0)


def test_single_is_the_primary_everywhere():
    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    d = single(primary, SHAPES)
    assert len(d.members) == 1 and set(d.table.values()) == {0}
    assert d.member_for({"rows": 5, "cols": 5}) == 0
    assert d.to_dict()["members"] == [{"variant_id": primary.variant.id, "params": {}}]


def test_a_loop_reply_takes_each_shapes_member_time_as_best():
    from search.finalize import compose_reply, member_name

    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    split = _item("split", [4.0, 2.5, 1.5, 1.0])
    d = choose(primary, [split], SHAPES)
    labels = [shape_label(s) for s in SHAPES]
    reply = {"peers": {"best": {lab: 1.0 for lab in labels}, member_name(split): {lab: 0.5 for lab in labels},
                       "torch_compile": {lab: 0.8 for lab in labels}}, "compiled": {}}
    out = compose_reply(reply, d)
    assert out["peers"]["best"] == {labels[0]: 0.5, labels[1]: 1.0, labels[2]: 1.0, labels[3]: 1.0}
    assert set(out["peers"]) == {"best", "torch_compile"}  # members are not peers
    assert out["members_ms"] == {member_name(split): {lab: 0.5 for lab in labels}}


def test_a_member_failing_in_a_loop_leaves_the_ratios_standing():
    from search.finalize import KernelResult, combine_runs, member_name

    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    split = _item("split", [4.0, 2.5, 1.5, 1.0])
    labels = [shape_label(s) for s in SHAPES]
    runs = [{"peers": {"best": {lab: 1.0 for lab in labels}, "baseline": {lab: 2.0 for lab in labels}},
             "failed": {member_name(split): "REJECTED: wrong output"}}]
    result = KernelResult(None, primary, primary.evaluation, primary.evaluation)  # type: ignore[arg-type]
    combine_runs(result, runs)
    assert result.peers["best"] == {lab: 1.0 for lab in labels} and not result.peer_failures
    assert member_name(split) in result.peer_extra["member_failures"]
    # Our winner failing is different: no ratios at all.
    runs[0]["failed"] = {"best": "REJECTED: wrong output"}
    combine_runs(result, runs)
    assert result.peers == {} and "best" in result.peer_failures


def test_a_composed_evaluation_takes_each_shape_from_its_member():
    from search.finalize import compose_evaluation

    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    split = _item("split", [4.0, 2.5, 1.5, 1.0])
    d = choose(primary, [split], SHAPES)
    got = compose_evaluation(d, {primary.variant.id: primary.evaluation, split.variant.id: split.evaluation},
                             SHAPES)
    assert [round(s.speedup, 3) for s in got.shapes] == [4.0, 3.0, 2.0, 2.0]
    assert got.variant_id == primary.evaluation.variant_id and got.status is Status.OK
    # One member, or a primary that is not OK: the primary's own evaluation.
    assert compose_evaluation(single(primary, SHAPES), {primary.variant.id: primary.evaluation}, SHAPES) \
        is primary.evaluation


def test_reports_name_each_kernel_and_its_shapes():
    from search.dispatch import describe

    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    split = _item("split", [4.0, 2.5, 1.5, 1.0])
    line = describe(choose(primary, [split], SHAPES).to_dict())
    assert line.startswith("2 kernels dispatched by shape")
    assert f"{split.variant.id[:8]} {{}} on {shape_label(SHAPES[0])}" in line
    assert describe(single(primary, SHAPES).to_dict()) == "" and describe(None) == ""


def test_the_choice_loop_settles_which_member_runs_where():
    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    split = _item("split", [4.0, 2.5, 1.5, 1.0])
    other = _item("other", [1.0, 1.0, 3.0, 1.0])
    d = choose(primary, [split, other], SHAPES)
    assert len(d.members) == 3
    labels = [shape_label(s) for s in SHAPES]
    # The loop finds the primary fastest on the split's shape, "other" fastest on two.
    times = [{labels[0]: 1.0, labels[1]: 1.0, labels[2]: 1.0, labels[3]: 1.0},
             {labels[0]: 1.1, labels[1]: 1.2, labels[2]: 1.3, labels[3]: 1.4},
             {labels[0]: 2.0, labels[1]: 2.0, labels[2]: 0.5, labels[3]: 0.9}]
    order = [m.variant.source for m in d.members]
    by_source = {"// primary\n": times[0], "// split\n": times[1], "// other\n": times[2]}
    r = d.retimed([by_source[s] for s in order])
    assert [m.variant.source for m in r.members] == ["// primary\n", "// other\n"]  # split won nothing
    assert r.table == {labels[0]: 0, labels[1]: 0, labels[2]: 1, labels[3]: 1}
    # A member that failed in the loop (None) gets nothing; shapes nobody timed keep theirs.
    r2 = d.retimed([None if s == "// split\n" else {} for s in order])
    assert r2.table == {k: v for k, v in d.without(order.index("// split\n")).table.items()}


def test_the_end_of_run_choice_loop_retables_and_drops_a_member_that_wins_nothing():
    """EndOfRun._choose: one loop of the members alone (no peers, recorded for resume), its
    medians settle the table, a member left without a shape is dropped with a reason before
    the final timing (and the sanitizer after it), and the final evaluation is composed with
    the new table."""
    from types import SimpleNamespace

    from search.finalize import EndOfRun, _Progress, compose_evaluation, member_name

    primary = _item("primary", [2.0, 3.0, 2.0, 2.0])
    split = _item("split", [4.0, 2.5, 1.5, 1.0])
    other = _item("other", [1.0, 1.0, 3.0, 1.0])
    labels = [shape_label(s) for s in SHAPES]
    calls: list[tuple] = []
    handed: list = []

    def recorded_call(key, owner, method, *args, what=""):
        calls.append((key, method, args))
        loop = {"best": {lab: 1.0 for lab in labels}, member_name(split): {lab: 1.2 for lab in labels},
                member_name(other): {labels[0]: 2.0, labels[1]: 2.0, labels[2]: 0.5, labels[3]: 0.9}}
        owner({"peers": loop, "failed": {}}, "")

    ctl = SimpleNamespace(config=SimpleNamespace(evaluator=SimpleNamespace(peers=True)), recorded_call=recorded_call)
    end = EndOfRun.__new__(EndOfRun)
    end.ctl = ctl  # type: ignore[assignment]
    end._final = lambda k: handed.append(k)  # type: ignore[method-assign]
    st = SimpleNamespace(name="k", dtype="float16", ref="k", search_shapes=lambda: SHAPES)
    k = _Progress(st, [])  # type: ignore[arg-type]
    k.winner, k.dispatch = primary, choose(primary, [split, other], SHAPES)
    k.member_final = {m.variant.id: m.evaluation for m in k.dispatch.members}
    end._choose(k)
    (key, method, args), = calls
    assert method == "time_peers" and args[-1] is False  # peers=False: our kernels alone
    assert [m.variant.source for m in k.dispatch.members] == ["// primary\n", "// other\n"]
    assert k.dispatch.table == {labels[0]: 0, labels[1]: 0, labels[2]: 1, labels[3]: 1}
    assert "choice loop" in k.rejected_why[split.variant.id]
    assert handed == [k]  # then the final timing, of the members kept
    final = compose_evaluation(k.dispatch, k.member_final, SHAPES)
    assert [round(s.speedup, 3) for s in final.shapes] == [2.0, 3.0, 3.0, 1.0]
