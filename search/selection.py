"""Selection: elites, islands with migration, and deduplication. Plain code, no Ray.

Scores are geometric-mean speedups over the baseline on the search shapes
(:attr:`Evaluation.speedup`). An evaluation with the full timing protocol outranks a
screening one of the same variant, because it is the better measurement.

Every choice here is independent of the order in which verdicts arrive (Ray returns them in
any order): ties between variants are broken by variant id, and the archive and the islands
keep each variant's best evidence rather than trimming as they go, so that what they hold
after a batch of offers does not depend on the order of the offers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kernels.records import Stage
from kernels.variant import Variant
from kernels.verdict import Evaluation

STAGE_RANK = {Stage.SCREEN: 0, Stage.FULL: 1}


@dataclass(frozen=True)
class Scored:
    """A correct variant at its best known parameters, with the evaluation that scored it.

    Attributes:
        variant: the kernel variant.
        evaluation: an OK evaluation on the search shapes.
        stage: screen or full (which timing protocol produced ``evaluation``).
    """

    variant: Variant
    evaluation: Evaluation
    stage: Stage = Stage.SCREEN

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage", Stage(self.stage))

    @property
    def score(self) -> float:
        s = self.evaluation.speedup
        if s is None:
            raise ValueError(f"variant {self.variant.id} has no speedup ({self.evaluation.status.value})")
        return s

    @property
    def params(self) -> dict[str, int]:
        return dict(self.evaluation.params)

    def rank_key(self) -> tuple[float, str]:
        """Sort key, best first: higher score, then the smaller variant id (a total order,
        so ties never depend on arrival order)."""
        return -self.score, self.variant.id

    def better_than(self, other: Scored | None) -> bool:
        """Full-protocol evidence replaces screening evidence of the same variant."""
        if other is None:
            return True
        if other.variant.id == self.variant.id and self.stage != other.stage:
            return STAGE_RANK[self.stage] > STAGE_RANK[other.stage]
        return self.rank_key() < other.rank_key()


def scored(variant: Variant, evaluation: Evaluation, stage: Stage = Stage.SCREEN) -> Scored | None:
    """A :class:`Scored` for a correct, timed evaluation; None otherwise."""
    if evaluation.speedup is None:
        return None
    return Scored(variant, evaluation, stage)


class EliteArchive:
    """The top-k correct variants of one kernel, one slot per variant (its best evidence).

    Every offered variant is kept (with its best evidence) and the top k are taken when
    asked: trimming on each offer would make the result depend on the offers' order.

    Args:
        top_k: how many variants rank as elites.
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
        return any(s.variant.id == item.variant.id for s in self.ranked())

    def remove(self, variant_id: str) -> None:
        """Drops a variant for good (e.g. it failed on the held-out shapes)."""
        self._by_id.pop(variant_id, None)
        self._removed.add(variant_id)

    def ranked(self, limit: bool = True) -> list[Scored]:
        items = sorted(self._by_id.values(), key=Scored.rank_key)
        return items[: self.top_k] if limit else items

    def best(self) -> Scored | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def get(self, variant_id: str) -> Scored | None:
        return self._by_id.get(variant_id)

    def __len__(self) -> int:
        return len(self.ranked())


class Islands:
    """One lineage per agent: each continues from its own best, and on migration rounds
    (every ``migrate_every`` rounds) from a global elite when that elite beats its own best.

    Agent ``i`` takes elite ``i mod k``, so migrants spread over the elites instead of every
    island collapsing onto the single best variant. Each agent's variants are kept with their
    best evidence (full replaces screen), so its own best does not depend on arrival order.

    Args:
        migrate_every: rounds between migrations.
    """

    def __init__(self, migrate_every: int) -> None:
        self.migrate_every = migrate_every
        self._own: dict[int, dict[str, Scored]] = {}

    def update(self, agent: int, item: Scored) -> None:
        mine = self._own.setdefault(agent, {})
        if item.better_than(mine.get(item.variant.id)):
            mine[item.variant.id] = item

    def remove(self, variant_id: str) -> None:
        """Drops a variant from every lineage (it failed the full protocol)."""
        for mine in self._own.values():
            mine.pop(variant_id, None)

    def own_best(self, agent: int) -> Scored | None:
        mine = self._own.get(agent, {})
        return min(mine.values(), key=Scored.rank_key) if mine else None

    def is_migration_round(self, round_: int) -> bool:
        return round_ > 0 and round_ % self.migrate_every == 0

    def parent(self, agent: int, round_: int, archive: EliteArchive, baseline: Scored) -> tuple[Scored, bool]:
        """The variant agent ``agent`` improves in round ``round_``, and whether it migrated."""
        own = self.own_best(agent) or baseline
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
    depends on (grid/block/smem expressions, parameters, dtype), see
    :func:`evaluators.admit.binary_key`. "First" is the order of the calls: the controller
    makes them in proposal order (round, agent, slot), never in the order compiles finish.
    """

    def __init__(self) -> None:
        self.sources: set[str] = set()  # variant ids seen
        self.binaries: dict[str, str] = {}  # binary key -> first variant id with that binary

    def known_source(self, variant_id: str) -> bool:
        return variant_id in self.sources

    def add_source(self, variant_id: str) -> None:
        self.sources.add(variant_id)

    def same_binary(self, key: str, variant_id: str) -> str | None:
        """The earlier variant with this binary, or None (and remembers this one)."""
        if not key:
            return None
        first = self.binaries.setdefault(key, variant_id)
        return None if first == variant_id else first


def pick_contenders(items: Iterable[Scored], n: int, already_full: set[str]) -> list[Scored]:
    """The ``n`` best screened variants that have not had the full protocol yet."""
    fresh = [s for s in items if s.stage is Stage.SCREEN and s.variant.id not in already_full]
    fresh.sort(key=Scored.rank_key)
    return fresh[:n]
