"""Which kernel of a dispatch runs on a shape: the rule shared by the search's results
(:mod:`search.dispatch`) and the shipped packages, which copy this file (standard library
only) so that an op launches, on any shape, the kernel the run chose for it.

A dispatch holds the search shapes and, for each, the index of the kernel that runs there. A
shape that is one of them takes its kernel; any other takes the kernel of the nearest search
shape, distance measured on the log2 of each dimension (ten times as many rows is as far as
ten times as many columns); ties go to the earlier search shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Squared distance of two shapes over the log2 of their dimensions (a missing
    dimension counts as 1)."""
    return sum((math.log2(max(1, int(a.get(k, 1)))) - math.log2(max(1, int(b.get(k, 1))))) ** 2
               for k in sorted(set(a) | set(b)))


def member_for(shape: Mapping[str, int], shapes: Sequence[Mapping[str, int]], table: Sequence[int]) -> int:
    """The index of the kernel that runs on ``shape``, given the search ``shapes`` and the
    kernel ``table[i]`` of each; only the dimensions the search shapes name are compared."""
    if not shapes:
        return 0
    keys = set().union(*(s.keys() for s in shapes))
    mine = {k: v for k, v in shape.items() if k in keys}
    # A search shape itself is at distance 0: its own kernel.
    nearest = min(range(len(shapes)), key=lambda i: (distance(mine, shapes[i]), i))
    return int(table[nearest])
