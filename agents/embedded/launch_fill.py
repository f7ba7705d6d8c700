"""How many blocks a launch of ours aims for, shared by the code generator's schedules and the
recipes: enough that a small launch reaches most SMs instead of filling a few."""

from __future__ import annotations

# About two blocks per SM of a 132-SM GPU (H100, H200): short rows packed several to a block stop
# at this many blocks, and a few long rows take smaller blocks until they have this many.
FILL_BLOCKS = 264


def fill_threads(rows: str, cols: str) -> str:
    """A launch expression: the threads per block (a multiple of a warp, at least one) at which
    ``rows * cols`` elements, 8 * ITEMS to a thread, make about FILL_BLOCKS blocks. A block capped
    at this spreads a small launch over the SMs: on one row of 11008 elements the search's
    evaluations of its generated kernels ran 4.3-4.9 us with 11 blocks (median 4.66), 4.6-5.1
    with 6 (4.77) and 4.8-5.7 with 3 (5.27) (evaluations.jsonl of the unseen sweep at 2cbb244,
    H200; four variants, 21 evaluations)."""
    return f"max(32, 32 * cdiv({rows} * {cols}, 8 * ITEMS * 32 * {FILL_BLOCKS}))"


def capped_threads(rows: str, cols: str) -> str:
    """A launch expression: BLOCK threads to a block, fewer (a warp at least) when ``rows *
    cols`` elements would otherwise leave most SMs without a block. A kernel launched with it
    must index by blockDim.x, not BLOCK."""
    return f"min(BLOCK, {fill_threads(rows, cols)})"
