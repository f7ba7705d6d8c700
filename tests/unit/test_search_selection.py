"""Selection: top-k elites, island migration schedule, dedupe by source and by binary."""

from __future__ import annotations

import itertools

from evaluators.admit import Admitted, Refusal
from kernels import load_kernel
from kernels.records import Stage
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status
from search.pool import admission
from search.selection import Dedupe, EliteArchive, Islands, Scored, pick_contenders, scored


def _item(tag: str, speedup: float, stage: Stage = Stage.SCREEN) -> Scored:
    variant = Variant("k", f"// {tag}\n")
    shapes = (ShapeResult({"n": 1}, candidate_ms=1.0 / speedup, baseline_ms=1.0),)
    return Scored(variant, Evaluation(Status.OK, shapes=shapes), stage)


def test_archive_keeps_top_k_by_speedup():
    archive = EliteArchive(top_k=2)
    for tag, s in [("a", 1.1), ("b", 1.5), ("c", 0.9), ("d", 1.3)]:
        archive.add(_item(tag, s))
    assert [round(x.score, 2) for x in archive.ranked()] == [1.5, 1.3]
    assert archive.best().variant.source == "// b\n"


def test_full_protocol_evidence_replaces_screening_of_same_variant():
    archive = EliteArchive(top_k=3)
    archive.add(_item("a", 1.5))
    archive.add(_item("a", 1.2, stage=Stage.FULL))
    assert len(archive) == 1
    assert archive.best().stage is Stage.FULL and round(archive.best().score, 2) == 1.2


def test_removed_variant_never_returns():
    archive = EliteArchive(top_k=3)
    archive.add(_item("a", 1.5))
    archive.remove(_item("a", 1.5).variant.id)
    assert not archive.add(_item("a", 1.6))
    assert archive.best() is None


def test_failed_evaluation_is_not_scored():
    assert scored(Variant("k", "x"), Evaluation(Status.INCORRECT, message="mismatch")) is None


def test_islands_keep_own_best_and_migrate_on_schedule():
    base = _item("base", 1.0)
    archive = EliteArchive(top_k=2)
    islands = Islands(migrate_every=2)
    islands.update(0, _item("own0", 1.2))
    for tag, s in [("e1", 2.0), ("e2", 1.8)]:
        archive.add(_item(tag, s))
    # Round 1 is not a migration round: everyone continues its own lineage.
    assert islands.parent(0, 1, archive, base) == (islands.own_best(0), False)
    assert islands.parent(1, 1, archive, base) == (base, False)
    # Round 2 is: agent i takes elite i mod k when it beats its own best.
    p0, m0 = islands.parent(0, 2, archive, base)
    p1, m1 = islands.parent(1, 2, archive, base)
    assert m0 and p0.variant.source == "// e1\n"
    assert m1 and p1.variant.source == "// e2\n"
    islands.update(2, _item("own2", 3.0))
    assert islands.parent(2, 2, archive, base)[1] is False


def test_selection_does_not_depend_on_the_order_of_offers():
    # A round offers screened a, b and c (c tied with b) in any order, then the full-protocol
    # timings of a and b in any order: every interleaving ends with the same elite and the
    # same own best (a's full timing drops below b's; the tie goes to the smaller id).
    a, b, c = _item("a", 2.0), _item("b", 1.9), _item("c", 1.9)
    fulls = [_item("a", 1.0, Stage.FULL), _item("b", 1.95, Stage.FULL)]
    outcomes = set()
    for screens in itertools.permutations([a, b, c]):
        for full in itertools.permutations(fulls):
            archive, islands = EliteArchive(top_k=1), Islands(migrate_every=1)
            for item in (*screens, *full):
                archive.add(item)
                islands.update(0, item)
            outcomes.add((archive.best().variant.id, islands.own_best(0).variant.id))
    assert outcomes == {(b.variant.id, b.variant.id)}
    for screens in itertools.permutations([b, c]):
        archive = EliteArchive(top_k=1)
        for item in screens:
            archive.add(item)
        outcomes.add(("tie", archive.best().variant.id))
    assert ("tie", min(b.variant.id, c.variant.id)) in outcomes and len(outcomes) == 2


def test_contenders_are_best_screened_not_yet_fully_timed():
    items = [_item("a", 1.1), _item("b", 1.4), _item("c", 1.3)]
    picked = pick_contenders(items, 2, already_full={items[1].variant.id})
    assert [x.variant.source for x in picked] == ["// c\n", "// a\n"]


def test_dedupe_by_source_and_by_binary(compile_cache):
    spec = load_kernel("silu_and_mul")
    base = Variant(spec.name, spec.baseline_source())
    comment = Variant(spec.name, "// only a comment differs\n" + spec.baseline_source())
    wider = Variant(spec.name, spec.baseline_source().replace("block=(256,)", "block=(512,)"))
    keys = {}
    for v in (base, comment, wider):
        summary, artifact = admission("silu_and_mul", v.source, "float16", {}, spec.search_shapes)
        assert isinstance(summary, Admitted) and artifact is not None and artifact.cubin
        assert summary == artifact.summary()  # the driver's part is the artifact's summary
        keys[v.id] = summary.binary_key
    assert len(set(keys.values())) == 2  # the comment changes the source, not what runs
    dedupe = Dedupe()
    dedupe.add_source(base.id)
    assert dedupe.known_source(base.id) and not dedupe.known_source(comment.id)
    assert dedupe.same_binary(keys[base.id], base.id) is None
    assert dedupe.same_binary(keys[comment.id], comment.id) == base.id
    assert dedupe.same_binary(keys[wider.id], wider.id) is None  # same cubin, other launch


def test_admission_refuses_without_gpu_and_ships_no_artifact(compile_cache):
    spec = load_kernel("silu_and_mul")
    shapes = spec.search_shapes
    broken = spec.baseline_source().replace("{", "{ nonsense;", 1)
    summary, artifact = admission("silu_and_mul", broken, "float16", {}, shapes)
    assert isinstance(summary, Refusal) and summary.status is Status.COMPILE_ERROR and artifact is None
    assert "error" in summary.message
    wrong_sig = spec.baseline_source().replace("int num_tokens", "long num_tokens")
    summary, _ = admission("silu_and_mul", wrong_sig, "float16", {}, shapes)
    assert isinstance(summary, Refusal) and "num_tokens" in summary.message
    too_wide = spec.baseline_source().replace("block=(256,)", "block=(2048,)")
    summary, artifact = admission("silu_and_mul", too_wide, "float16", {}, shapes)
    assert isinstance(summary, Refusal) and summary.status is Status.RESOURCE_ERROR and artifact is None


def test_a_baseline_off_its_reference_stops_the_search_and_says_what_to_do():
    import pytest

    from kernels.folders import KernelRef
    from kernels.spec import load_kernel
    from kernels.verdict import Evaluation, Status
    from search.state import KernelState, SearchError

    spec = load_kernel("silu_and_mul")
    st = KernelState(spec, KernelRef.of(spec.directory), "float32", 2, 2, 2)
    wrong = Evaluation(Status.INCORRECT, "out[3, 0]: expected 1.0, got 1.5 (shape [1, 8], float32, case offset, seed 0)")
    with pytest.raises(SearchError, match=r"baseline itself failed \(INCORRECT\).*float32 tolerance.*`tolerances`"):
        st.set_baseline(wrong)
    crashed = Evaluation(Status.CRASH, "illegal address")
    with pytest.raises(SearchError) as info:
        st.set_baseline(crashed)
    assert "tolerance" not in str(info.value)
