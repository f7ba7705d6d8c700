"""Held-out shapes drawn per run: the helpers every spec's ``heldout_draw`` is built from.

A fixed held-out list can be learnt; shapes drawn from ranges with the run's seed cannot. The
sizes drawn sit at exactly the alignment the spec promises (``multiple`` times an odd number),
never at a larger power of two, so a kernel that relies on more alignment than the spec
promises meets its tail. Draws stay moderate (at most :data:`DRAW_MAX_ELEMENTS` elements in
any tensor) so that an evaluation on them stays fast.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

DRAW_MAX_ELEMENTS = 64 * 2**20  # per tensor: ~128 MB in fp16, fast to validate and time
DRAW_COUNT = 3
# Token-count tiers, one draw from each in turn: a handful of tokens (decode), a batch, a
# prefill chunk. Every count drawn is odd.
TOKEN_TIERS: tuple[tuple[int, int], ...] = ((1, 15), (17, 999), (1001, 8191))


def at_alignment(rng: random.Random, low: int, high: int, multiple: int = 1) -> int:
    """A value in ``[low, high]`` equal to ``multiple`` times an odd number.

    Raises:
        ValueError: no such value lies in the range.
    """
    first = -(-low // multiple)
    first += 1 - first % 2  # the first odd factor
    last = high // multiple
    if first > last:
        raise ValueError(f"no odd multiple of {multiple} in [{low}, {high}]")
    return multiple * (first + 2 * rng.randrange((last - first) // 2 + 1))


def tokens(rng: random.Random, tier: int) -> int:
    """An odd token count from tier ``tier`` (taken modulo the number of tiers)."""
    low, high = TOKEN_TIERS[tier % len(TOKEN_TIERS)]
    return at_alignment(rng, low, high)


def draw_shapes(
    rng: random.Random,
    make: Callable[[random.Random, int], dict[str, int]],
    largest: Callable[[Mapping[str, int]], int],
    count: int = DRAW_COUNT,
    max_elements: int = DRAW_MAX_ELEMENTS,
    attempts: int = 200,
) -> tuple[dict[str, int], ...]:
    """``count`` distinct shapes from ``make(rng, index)``, each with at most
    ``max_elements`` elements in its largest tensor (``largest(shape)``); a draw beyond the
    cap or equal to an earlier one is drawn again.

    Raises:
        ValueError: ``attempts`` draws did not give ``count`` acceptable shapes (the ranges
            are too large for the cap).
    """
    out: list[dict[str, int]] = []
    for _ in range(attempts):
        if len(out) == count:
            break
        shape = make(rng, len(out))
        if largest(shape) <= max_elements and shape not in out:
            out.append(shape)
    if len(out) < count:
        raise ValueError(f"only {len(out)} of {count} shapes within {max_elements} elements in {attempts} draws")
    return tuple(out)


def row_draw(multiple: int, low: int = 128, high: int = 16384, rows: str = "num_tokens",
             cols: str = "hidden") -> Callable[[random.Random], tuple[dict[str, int], ...]]:
    """A ``heldout_draw`` for kernels over ``[rows, cols]`` (``num_tokens`` and ``hidden`` by
    default): an odd row count from each token tier, cols = ``multiple`` * odd in
    ``[low, high]``."""

    def make(rng: random.Random, index: int) -> dict[str, int]:
        return {rows: tokens(rng, index), cols: at_alignment(rng, low, high, multiple)}

    def draw(rng: random.Random) -> tuple[dict[str, int], ...]:
        return draw_shapes(rng, make, lambda s: s[rows] * s[cols])

    return draw
