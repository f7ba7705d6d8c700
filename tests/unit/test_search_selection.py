"""Selection: top-k elites, island migration schedule, dedupe by source and by binary."""

from __future__ import annotations

from kernels import load_kernel
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status
from search.pool import compile_outcome
from search.selection import Dedupe, EliteArchive, Islands, Scored, pick_contenders, scored


def _item(tag: str, speedup: float, stage: str = "screen") -> Scored:
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
    archive.add(_item("a", 1.2, stage="full"))
    assert len(archive) == 1
    assert archive.best().stage == "full" and round(archive.best().score, 2) == 1.2


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
    islands = Islands(population=3, migrate_every=2)
    islands.update(0, _item("own0", 1.2))
    for tag, s in [("e1", 2.0), ("e2", 1.8)]:
        archive.add(_item(tag, s))
    # Round 1 is not a migration round: everyone continues its own lineage.
    assert islands.parent(0, 1, archive, base) == (islands.own_best[0], False)
    assert islands.parent(1, 1, archive, base) == (base, False)
    # Round 2 is: agent i takes elite i mod k when it beats its own best.
    p0, m0 = islands.parent(0, 2, archive, base)
    p1, m1 = islands.parent(1, 2, archive, base)
    assert m0 and p0.variant.source == "// e1\n"
    assert m1 and p1.variant.source == "// e2\n"
    islands.update(2, _item("own2", 3.0))
    assert islands.parent(2, 2, archive, base)[1] is False


def test_contenders_are_best_screened_not_yet_fully_timed():
    items = [_item("a", 1.1), _item("b", 1.4), _item("c", 1.3)]
    picked = pick_contenders(items, 2, already_full={items[1].variant.id})
    assert [x.variant.source for x in picked] == ["// c\n", "// a\n"]


def test_dedupe_by_source_and_by_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_SEARCH_CACHE", str(tmp_path))
    spec = load_kernel("silu_and_mul")
    base = Variant(spec.name, spec.baseline_source())
    comment = Variant(spec.name, "// only a comment differs\n" + spec.baseline_source())
    wider = Variant(spec.name, spec.baseline_source().replace("block=(256,)", "block=(512,)"))
    keys = {v.id: compile_outcome("silu_and_mul", v, "float16", {}).binary_key for v in (base, comment, wider)}
    assert len(set(keys.values())) == 2  # the comment changes the source, not what runs
    dedupe = Dedupe()
    dedupe.add_source(base.id)
    assert dedupe.known_source(base.id) and not dedupe.known_source(comment.id)
    assert dedupe.same_binary(keys[base.id], base.id) is None
    assert dedupe.same_binary(keys[comment.id], comment.id) == base.id
    assert dedupe.same_binary(keys[wider.id], wider.id) is None  # same cubin, other launch


def test_compile_outcome_reports_errors_without_gpu():
    spec = load_kernel("silu_and_mul")
    broken = Variant(spec.name, spec.baseline_source().replace("{", "{ nonsense;", 1))
    out = compile_outcome("silu_and_mul", broken, "float16", {})
    assert not out.ok and "error" in out.log
    wrong_sig = Variant(spec.name, spec.baseline_source().replace("int num_tokens", "long num_tokens"))
    assert "num_tokens" in compile_outcome("silu_and_mul", wrong_sig, "float16", {}).log
