"""Per-shape dispatch: a kernel's result may be a few of its correct variants, each launched
on the shapes where it was fastest.

No single schedule is best on every shape of a kernel: a row split over a cluster wins on one
row of 128K elements and loses on thousands of short rows, a large cache per thread wins on
long rows and costs occupancy on short ones. torch.compile specialises per shape (one
compilation per shape), and production libraries pick a configuration by shape; a result of
ours that is one kernel for every shape competes with one hand tied. So the end of a run may
keep, beside the winner (the ``primary``), up to ``max_members - 1`` other correct variants.

How members are chosen (:func:`choose`), from the search's own evidence (each variant's
per-shape speedup over the baseline, measured in one evaluation):

- greedily: the candidate that raises the geometric mean of the per-shape best speedups the
  most joins, while it raises it by at least ``min_gain`` (a member must pay for itself on
  the mean, not on one noisy shape);
- each search shape goes to the member with the highest speedup there (the primary on ties).

Which member runs on a shape outside the search set (held-out shapes, a model's shapes) is
decided by :meth:`Dispatch.member_for` (:mod:`kernels.dispatch_rule`, which shipped packages
copy): the member of the nearest search shape, distance measured on the log2 of each
dimension. Every member must pass the held-out shapes (all of
them, not only those it would get), the sanitizer and the loop's verification on its own,
so the rule can never send a shape to a kernel that was not checked on shapes like it.

The members are picked from the search's evaluations (each a single evaluation, a screening
one with 20 repetitions for most variants, so noisy per shape); which one runs where is then
settled by one loop of their own (all of them interleaved on every search shape, 100
repetitions, no peers), before and apart from the end-of-run loops that report the result:
no member is picked on the times it is reported with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernels import dispatch_rule
from kernels.spec import shape_label
from kernels.verdict import geomean
from search.selection import Scored

MAX_MEMBERS = 3
MIN_GAIN = 1.01  # a member joins when it raises the geomean of per-shape bests by 1% or more


def _speedups(item: Scored, labels: Sequence[str]) -> dict[str, float] | None:
    """Per search-shape label, the item's speedup; None when it lacks one of the shapes."""
    got = {shape_label(s.shape): s.speedup for s in item.evaluation.shapes}
    if not all(label in got and got[label] > 0 for label in labels):
        return None
    return {label: got[label] for label in labels}


@dataclass(frozen=True)
class Dispatch:
    """A kernel's result: its members and which of them runs on each search shape.

    Attributes:
        members: the primary first, then the others in the order they joined.
        table: search shape label -> index into ``members``.
        shapes: the search shapes, in the spec's order.
        speedups: per member, its speedup on each search shape label (the search's evidence).
    """

    members: tuple[Scored, ...]
    table: dict[str, int]
    shapes: tuple[dict[str, int], ...]
    speedups: tuple[dict[str, float], ...]

    @property
    def expected(self) -> float:
        """The geometric mean over the search shapes of each shape's member's speedup."""
        return geomean([self.speedups[i][label] for label, i in self.table.items()])

    @property
    def primary_alone(self) -> float:
        """The primary's own geometric mean on the same evidence."""
        return geomean([self.speedups[0][label] for label in self.table])

    @property
    def primary(self) -> Scored:
        return self.members[0]

    def member_for(self, shape: Mapping[str, int]) -> int:
        """The member that runs on ``shape``: the one of its search shape, else the one of the
        nearest search shape (log2 distance over the dimensions; the earlier search shape on
        ties)."""
        return dispatch_rule.member_for(shape, self.shapes, [self.table[shape_label(s)] for s in self.shapes])

    def without(self, index: int) -> Dispatch:
        """The dispatch with member ``index`` (not the primary) dropped; its shapes go to the
        primary."""
        if index == 0:
            raise ValueError("the primary cannot be dropped from its dispatch")
        return self._kept({label: 0 if i == index else i for label, i in self.table.items()})

    def retimed(self, times: Sequence[Mapping[str, float] | None]) -> Dispatch:
        """The dispatch with each search shape given to the member fastest there in one
        interleaved loop (``times[i]``: member i's median per label, None if it failed); a
        member left without a shape is dropped. Shapes no member has a time for keep theirs,
        unless it failed (then the primary's)."""
        table = {}
        for label, current in self.table.items():
            timed = [(t[label], i) for i, t in enumerate(times) if t is not None and label in t]
            table[label] = min(timed)[1] if timed else (current if times[current] is not None else 0)
        return self._kept(table)

    def _kept(self, table: Mapping[str, int]) -> Dispatch:
        """The dispatch with ``table`` (indices into these members), the members it gives no
        shape dropped (never the primary) and the rest renumbered in order."""
        used = sorted(set(table.values()) | {0})
        renumber = {old: new for new, old in enumerate(used)}
        return Dispatch(tuple(self.members[i] for i in used), {label: renumber[i] for label, i in table.items()},
                        self.shapes, tuple(self.speedups[i] for i in used))

    def to_dict(self) -> dict[str, Any]:
        return {
            "members": [{"variant_id": m.variant.id, "params": m.params} for m in self.members],
            "table": dict(self.table),
            "rule": "the member of the search shape; else of the nearest search shape (log2 distance over dims)",
            "expected_speedup": self.expected,
            "primary_alone": self.primary_alone,
        }


def single(primary: Scored, shapes: Sequence[Mapping[str, int]]) -> Dispatch:
    """The primary alone on every shape (its overall score on shapes it lacks a time for)."""
    labels = [shape_label(dict(s)) for s in shapes]
    own = _speedups(primary, labels) or {label: primary.score for label in labels}
    return Dispatch((primary,), {label: 0 for label in labels}, tuple(dict(s) for s in shapes), (own,))


def choose(primary: Scored, candidates: Sequence[Scored], shapes: Sequence[Mapping[str, int]],
           max_members: int = MAX_MEMBERS, min_gain: float = MIN_GAIN) -> Dispatch:
    """The primary and the members that pay for themselves (see the module docstring).

    Args:
        primary: the run's winner (it passed the held-out shapes).
        candidates: other correct variants at their best parameters (the archive, ranked);
            those without a speedup on every search shape are passed over.
        shapes: the search shapes.
        max_members: the most variants in the result, the primary included.
        min_gain: the least factor by which a joining member must raise the expected
            geometric mean.
    """
    labels = [shape_label(dict(s)) for s in shapes]
    base = single(primary, shapes)
    own = _speedups(primary, labels)
    if own is None or max_members <= 1:
        return base
    members: list[Scored] = [primary]
    rows: list[dict[str, float]] = [own]
    pool = [(c, sp) for c in candidates if c.variant.id != primary.variant.id
            for sp in [_speedups(c, labels)] if sp is not None]
    current = geomean(list(own.values()))
    while len(members) < max_members and pool:
        def gain(entry: tuple[Scored, dict[str, float]]) -> float:
            return geomean([max(max(r[label] for r in rows), entry[1][label]) for label in labels])

        # Highest gain first; the archive's order (best alone first, then variant id) on ties.
        best_i = max(range(len(pool)), key=lambda i: (gain(pool[i]), -i))
        value = gain(pool[best_i])
        if value < current * min_gain:
            break
        item, sp = pool.pop(best_i)
        members.append(item)
        rows.append(sp)
        current = value
    table = {label: max(range(len(rows)), key=lambda i: (rows[i][label], -i)) for label in labels}
    # A member that ended up with no shape (a later one beat it everywhere it led) is dropped.
    return Dispatch(tuple(members), {}, base.shapes, tuple(rows))._kept(table)


def describe(recorded: Mapping[str, Any] | None) -> str:
    """One line for a report: which kernel runs on which search shapes (``recorded`` as
    :meth:`Dispatch.to_dict` wrote it); empty for a single kernel."""
    if not recorded or len(recorded.get("members", [])) < 2:
        return ""
    parts = []
    for i, m in enumerate(recorded["members"]):
        labels = [label for label, j in recorded["table"].items() if j == i]
        parts.append(f"{m['variant_id'][:8]} {m['params']} on {', '.join(labels) or '-'}")
    return (f"{len(parts)} kernels dispatched by shape (other shapes: the kernel of the nearest search shape): "
            + "; ".join(parts))
