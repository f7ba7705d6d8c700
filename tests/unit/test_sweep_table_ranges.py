"""search.sweep's sweep.md prints each ratio's range over the end-of-run loops (no GPU)."""

from __future__ import annotations

import polars as pl

from search import spread
from search.sweep import TABLE_SCHEMA, to_markdown


def _row(kernel: str) -> dict[str, object]:
    return {"kernel": kernel, "dtype": "float16", "note": "", "winner": "w", "params": "{}", "shapes": [],
            "speedup_vs_baseline": 2.0, "speedup_vs_torch_compile": 1.1, "speedup_vs_peers": "{}",
            "heldout_status": "OK", "speedup_heldout": 1.9, "largest_shape": None, "copy_bw_fraction_largest": None,
            "variants_evaluated": 2, "evaluations": 3, "wall_s": 1.0, "evaluator_busy_s": 1.0, "llm_calls": 0,
            "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}


def test_sweep_markdown_prints_ranges_and_marks_single_figures():
    table = pl.DataFrame([_row("rmsnorm"), _row("layernorm")], schema=TABLE_SCHEMA)
    summary = {"kernels": [{"kernel": "rmsnorm", "spreads": {
        "baseline": spread.Spread(2.0, 1.9, 2.1, 3).to_dict(), "torch_compile": spread.Spread(1.1, 1.0, 1.2, 3).to_dict()}},
        {"kernel": "layernorm"}]}
    md = to_markdown(table, summary, {"attempts": [{"command": "c"}], "sweep_id": "x", "dtype": "float16"})
    assert "| rmsnorm | 2.000x [1.900-2.100] faster | 1.100x [1.000-1.200] tie |" in md
    assert "| layernorm | 2.000x (one run) | 1.100x (one run) |" in md
    assert "median over the loops [min-max]" in md and "CUDA-graph replay" in md
