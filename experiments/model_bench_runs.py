"""Independent runs of the model benchmark and how they combine into one table.

:mod:`experiments.model_bench` with ``--runs N`` runs the whole benchmark N times, each in a
fresh Python process (its own CUDA context, its own ``torch.compile`` caches and allocator
state), so run-to-run noise shows up as a range instead of hiding inside one process.

Combining (per phase and token count, matched across runs): a configuration's time is the
median over runs of each run's median; a speedup is the median of the runs' ratios with their
min-max and the verdict of :mod:`search.spread` (faster or slower only when the whole range
lies on one side of 1.0, a tie otherwise); outputs agree only when they agree in every run
(the worst error is shown); the swapped kernels' share is the median over runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from search import spread

RATIOS = ("shipped_over_torch", "shipped_compile_over_compile")
RUN_JSON = "model-bench.json"


class RunFailed(RuntimeError):
    """A benchmark run (child process) ended without writing its results."""


def run_children(command_for: Callable[[Path], list[str]], runs: int, cwd: Path | None = None,
                 echo: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Runs ``command_for(out)`` ``runs`` times, one fresh process after the other, and returns
    each run's ``out/model-bench.json``.

    Runs go one at a time: they share the GPU, and overlapping them would time contention.
    A run that exits 1 (outputs disagree) still wrote its results and counts; any other
    failure stops the whole benchmark with :class:`RunFailed`.
    """
    env = dict(os.environ)
    repo_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
    results = []
    with tempfile.TemporaryDirectory(prefix="model-bench-runs-") as tmp:
        for i in range(runs):
            out = Path(tmp) / f"run-{i + 1}"
            echo(f"run {i + 1}/{runs} (fresh process)")
            code = subprocess.run(command_for(out), cwd=cwd, env=env, check=False).returncode
            written = out / RUN_JSON
            if code not in (0, 1) or not written.exists():
                raise RunFailed(f"run {i + 1} of {runs} exited with code {code} without writing {RUN_JSON}")
            results.append(json.loads(written.read_text()))
    return results


def _median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _combine_agreement(per_run: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per configuration, the worst agreement over the runs (ok only when every run agrees)."""
    combined = {}
    for name in per_run[0]:
        checks = [a[name] for a in per_run]
        combined[name] = {"rel_l2": max(c["rel_l2"] for c in checks), "max_abs": max(c["max_abs"] for c in checks),
                          "ok": all(c["ok"] for c in checks)}
    return combined


def _combine_profile(per_run: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per profiled configuration, the median over runs of the share and kernel times."""
    combined = {}
    for name in per_run[0]:
        profiles = [p[name] for p in per_run]
        kernels = sorted({k for p in profiles for k in p.get("swapped_us_per_step", {})})
        combined[name] = {
            "share": _median_or_none([p.get("share") for p in profiles]),
            "share_min_max": _min_max([p.get("share") for p in profiles]),
            "kernel_us_per_step": _median_or_none([p.get("kernel_us_per_step") for p in profiles]),
            "swapped_us_per_step": {k: _median_or_none([p.get("swapped_us_per_step", {}).get(k) for p in profiles])
                                    for k in kernels},
        }
    return combined


def _min_max(values: Sequence[float | None]) -> list[float] | None:
    present = [v for v in values if v is not None]
    return [min(present), max(present)] if present else None


def combine_row(per_run: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One phase/token row from the same row of every run (see the module docstring)."""
    first = per_run[0]
    configs = list(first["ms"])
    ms = {c: statistics.median(r["ms"][c] for r in per_run) for c in configs}
    ratio_spreads = {k: spread.of([r[k] for r in per_run]) for k in RATIOS}
    return {
        "phase": first["phase"], "tokens": first["tokens"], "ms": ms,
        "ms_per_run": {c: [r["ms"][c] for r in per_run] for c in configs},
        **{k: s.median for k, s in ratio_spreads.items() if s is not None},
        "spreads": {k: s.to_dict() for k, s in ratio_spreads.items() if s is not None},
        "agreement": _combine_agreement([r["agreement"] for r in per_run]),
        "profile": _combine_profile([r["profile"] for r in per_run]),
    }


def combine(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The combined rows of several runs' JSONs, in the first run's order.

    Raises:
        ValueError: when the runs did not all measure the same phases and token counts
            (a run cut short would otherwise silently shrink some rows' spreads).
    """
    if not runs:
        raise ValueError("no runs to combine")
    keyed = [{(r["phase"], r["tokens"]): r for r in run["rows"]} for run in runs]
    cases = [(r["phase"], r["tokens"]) for r in runs[0]["rows"]]
    for i, rows in enumerate(keyed[1:], start=2):
        if set(rows) != set(cases):
            raise ValueError(f"run {i} measured {sorted(rows)}, run 1 measured {sorted(cases)}")
    return [combine_row([rows[case] for rows in keyed]) for case in cases]


def ratio_text(row: Mapping[str, Any], key: str) -> str:
    """A row's ratio: ``1.123x [1.050-1.180] faster`` over runs, else the one figure marked as such."""
    ranged = row.get("spreads", {}).get(key)
    if ranged and ranged.get("runs", 1) > 1:
        return spread.text(ranged)
    return f"{row[key]:.3f}x (one run, no spread)"
