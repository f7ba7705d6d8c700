"""Selection: elites, islands with migration, and deduplication. Plain code, no Ray.

Scores are geometric-mean speedups over the baseline on the search shapes
(:attr:`Evaluation.speedup`). An evaluation with the full timing protocol outranks a
screening one of the same variant, because it is the better measurement.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kernels.variant import Variant
from kernels.verdict import Evaluation

STAGE_RANK = {"screen": 0, "full": 1}


@dataclass(frozen=True)
class Scored:
    """A correct variant at its best known parameters, with the evaluation that scored it.

    Attributes:
        variant: the kernel variant.
        evaluation: an OK evaluation on the search shapes.
        stage: ``screen`` or ``full`` (which timing protocol produced ``evaluation``).
    """

    variant: Variant
    evaluation: Evaluation
    stage: str = "screen"

    @property
    def score(self) -> float:
        s = self.evaluation.speedup
        if s is None:
            raise ValueError(f"variant {self.variant.id} has no speedup ({self.evaluation.status.value})")
        return s

    @property
    def params(self) -> dict[str, int]:
        return dict(self.evaluation.params)

    def better_than(self, other: Scored | None) -> bool:
        """Full-protocol evidence replaces screening evidence of the same variant."""
        if other is None:
            return True
        if other.variant.id == self.variant.id and self.stage != other.stage:
            return STAGE_RANK[self.stage] > STAGE_RANK[other.stage]
        return self.score > other.score


def scored(variant: Variant, evaluation: Evaluation, stage: str = "screen") -> Scored | None:
    """A :class:`Scored` for a correct, timed evaluation; None otherwise."""
    if evaluation.speedup is None:
        return None
    return Scored(variant, evaluation, stage)


class EliteArchive:
    """The top-k correct variants of one kernel, one slot per variant (its best evidence).

    Args:
        top_k: how many variants to keep.
    """

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self._by_id: dict[str, Scored] = {}
        self._removed: set[str] = set()

    def add(self, item: Scored) -> bool:
        """Offers a variant; returns True when it is (now) among the elites."""
        if item.variant.id in self._removed:
            return False
        current = self._by_id.get(item.variant.id)
        if item.better_than(current):
            self._by_id[item.variant.id] = item
        ranked = self.ranked(limit=False)
        self._by_id = {s.variant.id: s for s in ranked[: self.top_k]}
        return item.variant.id in self._by_id

    def remove(self, variant_id: str) -> None:
        """Drops a variant for good (e.g. it failed on the held-out shapes)."""
        self._by_id.pop(variant_id, None)
        self._removed.add(variant_id)

    def ranked(self, limit: bool = True) -> list[Scored]:
        items = sorted(self._by_id.values(), key=lambda s: (-s.score, s.variant.id))
        return items[: self.top_k] if limit else items

    def best(self) -> Scored | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def get(self, variant_id: str) -> Scored | None:
        return self._by_id.get(variant_id)

    def __len__(self) -> int:
        return len(self._by_id)


@dataclass
class Islands:
    """One lineage per agent: each continues from its own best, and on migration rounds
    (every ``migrate_every`` rounds) from a global elite when that elite beats its own best.

    Agent ``i`` takes elite ``i mod k``, so migrants spread over the elites instead of every
    island collapsing onto the single best variant.
    """

    population: int
    migrate_every: int
    own_best: dict[int, Scored] = field(default_factory=dict)

    def update(self, agent: int, item: Scored) -> None:
        if item.better_than(self.own_best.get(agent)):
            self.own_best[agent] = item

    def is_migration_round(self, round_: int) -> bool:
        return round_ > 0 and round_ % self.migrate_every == 0

    def parent(self, agent: int, round_: int, archive: EliteArchive, baseline: Scored) -> tuple[Scored, bool]:
        """The variant agent ``agent`` improves in round ``round_``, and whether it migrated."""
        own = self.own_best.get(agent, baseline)
        if not self.is_migration_round(round_):
            return own, False
        elites = archive.ranked()
        if not elites:
            return own, False
        elite = elites[agent % len(elites)]
        if elite.variant.id != own.variant.id and elite.score > own.score:
            return elite, True
        return own, False


class Dedupe:
    """Identical sources (``Variant.id``) and identical binaries are evaluated once.

    A binary key covers the cubin bytes plus what the cubin does not contain but the launch
    depends on (grid/block/smem expressions, parameters, dtype), see :func:`binary_key`.
    """

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}  # variant id -> variant id it was first seen as
        self.binaries: dict[str, str] = {}  # binary key -> first variant id with that binary

    def known_source(self, variant_id: str) -> bool:
        return variant_id in self.sources

    def add_source(self, variant_id: str) -> None:
        self.sources.setdefault(variant_id, variant_id)

    def same_binary(self, key: str, variant_id: str) -> str | None:
        """The earlier variant with this binary, or None (and remembers this one)."""
        if not key:
            return None
        first = self.binaries.setdefault(key, variant_id)
        return None if first == variant_id else first


def pick_contenders(items: Iterable[Scored], n: int, already_full: set[str]) -> list[Scored]:
    """The ``n`` best screened variants that have not had the full protocol yet."""
    fresh = [s for s in items if s.stage == "screen" and s.variant.id not in already_full]
    fresh.sort(key=lambda s: (-s.score, s.variant.id))
    return fresh[:n]
