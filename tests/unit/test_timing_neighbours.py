"""The neighbour probe's reading of profiler activities (no GPU)."""

from __future__ import annotations

import pytest

from experiments.timing_neighbours import kernel_stats


def test_only_launches_right_after_a_flush_count_and_split_by_shape() -> None:
    acts = [
        ("base", 0.0, 5.0),          # a warm-up: nothing flushed before it
        ("zero_", 10.0, 96.0), ("base", 98.0, 108.0), ("base", 110.0, 118.0),  # timed, then the checker's run
        ("zero_", 120.0, 206.0), ("other", 207.0, 210.0),                       # a neighbour's window
        ("zero_", 220.0, 306.0), ("base", 310.0, 322.0),
        ("zero_", 330.0, 416.0), ("base", 417.0, 421.0),
        ("zero_", 430.0, 516.0), ("base", 517.0, 523.0),
    ]
    stats = kernel_stats(acts, "base", ["[1]", "[2]"])
    assert stats["launches"] == 4
    assert stats["duration_by_shape_us"] == {"[1]": pytest.approx(11.0), "[2]": pytest.approx(5.0)}
    assert stats["gap_by_shape_us"] == {"[1]": pytest.approx(3.0), "[2]": pytest.approx(1.0)}
    assert stats["duration_us"] == pytest.approx(8.0)
    assert kernel_stats(acts, "base", ["[1]", "[2]", "[3]"]).get("duration_by_shape_us") is None
    assert kernel_stats(acts, "absent", []) == {"launches": 0}


def test_line_ranges_cover_each_tensors_storage_span() -> None:
    import torch

    from evaluators.timing import LINE_BYTES, line_ranges

    base = torch.zeros(4096, dtype=torch.uint8)
    (first, lines), = line_ranges([base[5:300]])
    start = base.data_ptr() + 5
    assert first == start - start % LINE_BYTES and first + lines * LINE_BYTES >= start + 295
    assert first + (lines - 1) * LINE_BYTES < start + 295
    strided = torch.zeros(64, 64, dtype=torch.float32)[:, :2]  # 64 rows of 8 bytes, 256 bytes apart
    (first, lines), = line_ranges([strided])
    assert first + lines * LINE_BYTES >= strided.data_ptr() + 63 * 256 + 8
    assert line_ranges([torch.zeros(0)]) == []
