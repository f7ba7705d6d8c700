"""experiments.end_of_run_bench's reading of run summaries and its report (no run is made)."""

from __future__ import annotations

from typing import Any

from experiments.end_of_run_bench import _turns_brief, kernel_figures, report


def _spread(median: float, low: float, high: float) -> dict[str, Any]:
    return {"median": median, "low": low, "high": high, "runs": 3}


def _summary_kernel(cached: bool) -> dict[str, Any]:
    """One kernel of a summary.json as search.report writes it: three loops per shape set."""
    phase = [{"prepare": 20.0 + i, "wait": 3.0 * i, "loop": 1.5} for i in range(3)]
    return {
        "kernel": "silu_and_mul", "winner": "abc",
        "spreads": {"baseline": _spread(3.0, 2.9, 3.1), "torch_compile": _spread(1.05, 1.0, 1.1),
                    "not_a_ratio_we_report": _spread(9.0, 9.0, 9.0)},
        "peer_cache": [cached] * 3, "loop_phase_s": phase,
        "compile_cache": [] if cached else [{"hit": 12, "miss": 0}] * 3,
        "heldout_loops": {"spreads": {"baseline": _spread(2.5, 2.4, 2.6)}, "peer_cache": [cached] * 3,
                          "loop_phase_s": phase[:1], "compile_cache": []},
    }


def test_kernel_figures_keep_the_reported_ratios_the_cache_use_and_the_loops_phases() -> None:
    k = kernel_figures(_summary_kernel(cached=False))
    assert set(k["search"]) == {"baseline", "torch_compile"} and set(k["heldout"]) == {"baseline"}
    assert (k["cached_loops"], k["loops"]) == (0, 6)
    assert len(k["phase_s"]["search"]) == 3 and len(k["phase_s"]["heldout"]) == 1
    assert k["compile_cache"]["search"][0] == {"hit": 12, "miss": 0}


def test_the_report_shows_wall_per_mode_where_the_loops_spent_their_time_and_warm_against_cold() -> None:
    def run(mode: str, wall: float, search: float = 100.0) -> dict[str, Any]:
        return {"mode": mode, "command": "python -m search.run --population 8 --rounds 5", "wall_s": wall,
                "exit_code": 0, "gpu": "GPU X", "stage_s": {"search": search}, "end_calls_s": {"time_round": 30.0},
                "meta": {"commit": "c0ffee", "date": "2026-12-06"},
                "kernels": {"silu_and_mul": kernel_figures(_summary_kernel(cached=mode == "warm"))}}

    text = report([run("cold", 230.0), run("warm", 150.0, 90.0), run("warm", 160.0, 80.0)])
    # wall per mode beside its target, and the search stage (cold: compilations beside it; warm: none)
    assert "| cold | 230 s [230-230] (1 runs) | 240 s | 100 s [100-100] (1 runs) |" in text
    assert "| warm | 155 s [150-160] (2 runs) | 150 s | 85 s [80-90] (2 runs) |" in text
    # one row per run, kernel and shape set: set-up, wait, timing per loop, and the cache lookups
    assert "| 1 | cold | silu_and_mul | search | 20, 0, 1.5; 21, 3, 1.5; 22, 6, 1.5 | " \
           "12 hit, 0 miss; 12 hit, 0 miss; 12 hit, 0 miss |" in text
    assert "| 2 | warm | silu_and_mul | heldout | 20, 0, 1.5 | - |" in text
    assert "| silu_and_mul | search: vs torch_compile | 1.050 | [1.000-1.100] | 1.050, 1.050 | 2 of 2 |" in text


def test_peers_over_the_baseline_agree_whatever_winner_each_run_found() -> None:
    # The warm run found a winner 10% faster: every ratio against it is 10% higher, while the
    # peer's time over the baseline's is the same (1.05 / 3.0 = 0.35 in both).
    def run(mode: str, scale: float) -> dict[str, Any]:
        k = _summary_kernel(cached=mode == "warm")
        k["spreads"] = {n: _spread(*(v * scale for v in (s["median"], s["low"], s["high"])))
                        for n, s in k["spreads"].items()}
        return {"mode": mode, "command": "c", "wall_s": 1.0, "exit_code": 0, "meta": {},
                "kernels": {"silu_and_mul": kernel_figures(k)}}

    text = report([run("cold", 1.0), run("warm", 1.1)])
    assert "| silu_and_mul | search: vs torch_compile | 1.050 | [1.000-1.100] | 1.155 | 0 of 1 |" in text
    assert ("| silu_and_mul | search: torch_compile | 0.350 [0.323-0.379] | 0.350 [0.323-0.379] | 1 of 1 | "
            "1.000 |") in text


def test_a_run_with_a_lock_timeline_says_who_kept_the_rounds_from_timing() -> None:
    base = {"mode": "cold", "command": "python -m search.run --population 8 --rounds 5", "wall_s": 250.0,
            "exit_code": 0, "gpu": "GPU X", "stage_s": {"search": 100.0}, "end_calls_s": {},
            "meta": {"commit": "c0ffee", "date": "2026-12-07"}, "kernels": {}}
    turns = _turns_brief({"processes": 12, "span_s": 200.0, "alone_s": 41.2, "blocked_s": 55.7,
                          "blockers": [{"pid": 7, "shared_s": 30.4, "argv": "-m evaluators.sanitize " + "x" * 200},
                                       {"pid": 8, "shared_s": 12.0, "argv": "-m evaluators.worker"}]})
    assert len(turns["blockers"][0]["argv"]) == 100
    text = report([{**base, "gpu_turns": turns}, {**base, "mode": "warm"}])
    assert "| 1 | 12 | 41 s | 56 s | 30 s `-m evaluators.sanitize xxx" in text
    assert "| 2 |" not in text.split("GPU lock over each run")[1].split("## Ratios")[0]  # no timeline: no row
