"""``python -m search.sweep``: search a whole kernel library, many kernels at once, resumably.

Examples::

    python -m search.sweep --budget-rounds 5 --population 8            # the built-in library
    python -m search.sweep --library ~/my_kernels --kernel rmsnorm --kernel layernorm
    python -m search.sweep --evaluator standin --budget-rounds 1        # CPU dry run, numbers not real
    python -m search.sweep --resume runs/sweep-20261129-101500-ab12     # continue a killed sweep

One search over all kernels at once: the controller already moves every kernel through its
rounds on its own and keeps every GPU actor of the Ray cluster fed from whichever kernels
have work, so a slow kernel never idles the GPUs. The budget is per kernel (rounds, agents,
variants, trials). The sweep directory holds ``sweep.json`` (what was asked and every attempt),
``<sweep id>/`` (an ordinary ``search.run`` run directory, so a killed sweep resumes through the run
engine's replay: nothing is evaluated twice) and the table ``sweep.parquet`` / ``sweep.md``
with one row per kernel. Kernels that do not support the dtype are skipped and get a row
saying so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import secrets
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from agents.factory import AgentConfigError
from kernels.records import EvalRecord, atomic_write, read_evaluations
from kernels.spec import LIBRARY_DIR, KernelSpecError, list_kernels, load_kernel
from search import spread
from search.config import ConfigError, RunConfig, dump_config, load_config, override
from search.progress import Progress, busy_fraction, waiting_text
from search.proposal_records import read_calls
from search.report import STANDIN_WARNING, git_commit
from search.run import (
    OneLineErrorParser,
    Prepared,
    UsageError,
    add_search_options,
    checked_kernels,
    peer_overrides,
)

SWEEP_FILE = "sweep.json"
TABLE_SCHEMA: dict[str, Any] = {
    "kernel": pl.String, "dtype": pl.String, "note": pl.String, "winner": pl.String, "params": pl.String,
    "shapes": pl.List(pl.Struct({"label": pl.String, "bytes_moved": pl.Int64, "baseline_ms": pl.Float64,
                                 "best_ms": pl.Float64, "speedup": pl.Float64, "copy_bw_fraction": pl.Float64})),
    "speedup_vs_baseline": pl.Float64, "speedup_vs_torch_compile": pl.Float64, "speedup_vs_peers": pl.String,
    "heldout_status": pl.String, "speedup_heldout": pl.Float64, "largest_shape": pl.String,
    "copy_bw_fraction_largest": pl.Float64, "variants_evaluated": pl.Int64, "evaluations": pl.Int64,
    "wall_s": pl.Float64, "evaluator_busy_s": pl.Float64, "llm_calls": pl.Int64, "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64, "cost_usd": pl.Float64,
}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python -m search.sweep", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--library", type=Path, help="folder of kernel folders (default: the built-in library)")
    p.add_argument("--kernel", action="append", dest="kernels", help="only these kernels of the library (repeatable)")
    p.add_argument("--budget-rounds", type=int, help="search rounds per kernel")
    add_search_options(p)
    p.add_argument("--out", help="parent folder of sweep directories (default runs/)")
    p.add_argument("--resume", type=Path, metavar="SWEEP_DIR", help="continue a killed sweep")
    return p


# -- planning -------------------------------------------------------------------------------

def choose_kernels(library: Path | None, names: Sequence[str] | None, dtype: str) -> tuple[list[str], dict[str, str]]:
    """The kernel references to search and the skipped kernels with the reason.

    Kernels named with ``--kernel`` must exist and support the dtype; of a whole library,
    those without the dtype are skipped rather than failing the sweep.

    Raises:
        UsageError: the library is not a folder, holds no kernels, or lacks a named kernel.
        ConfigError: a named kernel does not support the dtype.
    """
    folder = Path(library) if library is not None else LIBRARY_DIR
    if not folder.is_dir():
        raise UsageError(f"--library {folder} is not a folder")
    available = list_kernels(folder)
    if not available:
        raise UsageError(f"--library {folder} holds no kernel folders (NAME/spec.py)")
    missing = [n for n in names or () if n not in available]
    if missing:
        raise UsageError(f"no kernel {', '.join(missing)} in {folder} (it has: {', '.join(available)})")
    refs, skipped = [], {}
    for name in names or available:
        # Built-in kernels go by name (the run's config stays portable); others by folder.
        ref = name if library is None else str((folder / name).resolve())
        spec = load_kernel(ref)
        if dtype in spec.dtypes:
            refs.append(ref)
        elif names:
            raise ConfigError(f"kernel {name} supports {', '.join(spec.dtypes)}, not {dtype}")
        else:
            skipped[spec.name] = f"skipped: supports {', '.join(spec.dtypes)}, not {dtype}"
    if not refs:
        raise UsageError(f"no kernel of {folder} supports {dtype}")
    return refs, skipped


_RESUME_FIXED = ("library", "kernels", "config", "budget_rounds", "population", "variants", "trials", "dtype",
                 "agent", "model", "evaluator", "out", "seed")


def _new_sweep(args: argparse.Namespace) -> tuple[RunConfig, Path, dict[str, Any]]:
    config = load_config(args.config)
    dtype = args.dtype or config.dtype
    refs, skipped = choose_kernels(args.library, args.kernels, dtype)
    config = override(config, {
        "kernels": tuple(refs), "kernel_dir": "", "dtype": dtype, "seed": args.seed, "address": args.address,
        "search.rounds": args.budget_rounds, "search.population": args.population, "search.variants": args.variants,
        "search.trials": args.trials, "agent.kind": args.agent, "agent.model": args.model,
        "evaluator.kind": args.evaluator, "evaluator.gpus": args.gpus, "evaluator.compile_ahead": args.compile_ahead,
        **peer_overrides(args),
    })
    config.kernel_dir = None
    sweep_id = "sweep-" + time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    sweep_dir = Path(args.out or config.out) / sweep_id
    # The run directory carries the sweep's id: records of different sweeps stay distinguishable.
    meta = {"sweep_id": sweep_id, "run_dir": sweep_id, "library": str(args.library.resolve()) if args.library else "",
            "kernels": refs, "skipped": skipped, "dtype": dtype, "attempts": []}
    return config, sweep_dir, meta


def _resumed_sweep(args: argparse.Namespace) -> tuple[RunConfig, Path, dict[str, Any]]:
    sweep_dir: Path = args.resume
    changed = [f"--{'kernel' if n == 'kernels' else n.replace('_', '-')}" for n in _RESUME_FIXED
               if getattr(args, n) is not None]
    if changed:
        raise UsageError(f"a resumed sweep keeps what it was started with; drop {', '.join(changed)} "
                         "(only --gpus and --address may change)")
    meta_path = sweep_dir / SWEEP_FILE
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if not (sweep_dir / meta.get("run_dir", "?") / "config.yaml").is_file():
        raise UsageError(f"--resume {sweep_dir}: not a sweep directory (no {SWEEP_FILE} naming a run with a config.yaml)")
    config = load_config(sweep_dir / meta["run_dir"] / "config.yaml")
    config = override(config, {"address": args.address, "evaluator.gpus": args.gpus})
    return config, sweep_dir, meta


def plan(args: argparse.Namespace) -> tuple[Prepared, dict[str, Any]]:
    """Resolves a new or resumed sweep into a prepared run; nothing is started yet.

    Raises:
        UsageError, ConfigError, KernelSpecError, AgentConfigError: the sweep cannot start as asked.
    """
    config, sweep_dir, meta = _resumed_sweep(args) if args.resume is not None else _new_sweep(args)
    kernels = checked_kernels(config)
    if args.resume is None:
        # Written before anything runs, so a sweep killed at any point can be resumed.
        (sweep_dir / meta["run_dir"]).mkdir(parents=True, exist_ok=False)
        dump_config(config, sweep_dir / meta["run_dir"] / "config.yaml")
        _save_meta(sweep_dir, meta)
    return Prepared(config, kernels, sweep_dir / meta["run_dir"], args.resume is not None), meta


def finished(prep: Prepared) -> bool:
    """Whether the run wrote its summary for every kernel (a resume then only rewrites the table)."""
    path = prep.run_dir / "summary.json"
    if not path.is_file():
        return False
    done = {k["kernel"] for k in json.loads(path.read_text()).get("kernels", [])}
    return {ref.name for _, ref in prep.kernels} <= done


# -- progress -------------------------------------------------------------------------------

class SweepProgress(Progress):
    """The progress line of a sweep: kernels finished, rounds, evaluations, mean speedup."""

    def line(self, controller: Any) -> str:
        states, rounds = controller.states, controller.config.search.rounds
        done = sum(st.rounds_done >= rounds for st in states)
        scores = [st.best().score for st in states if st.baseline_scored is not None]
        best = f"{sum(scores) / len(scores):.3f}x" if scores else "-"
        wall = time.time() - controller.start
        busy = busy_fraction(controller.pool.busy_s, wall, self.n_gpus)
        return (f"sweep | kernels done {done}/{len(states)} | rounds done {sum(st.rounds_done for st in states)}/"
                f"{rounds * len(states)} | evaluations {len(controller.cache)} | mean best {best} | "
                f"{self.busy_label} {busy:.0%} | {wall:.0f}s{waiting_text(controller)}")


# -- the table ------------------------------------------------------------------------------

def kernel_wall_s(times: Sequence[float], attempts: Sequence[dict[str, Any]]) -> float:
    """Seconds the sweep spent until a kernel's last record, summed over attempts.

    A killed attempt has no end; the next attempt's start closes it, so the time the sweep was
    down is not counted. Replayed records are not written again, so each record belongs to the
    attempt that made it.
    """
    total = 0.0
    for i, attempt in enumerate(attempts):
        start = float(attempt["start"])
        limit = attempts[i + 1]["start"] if i + 1 < len(attempts) else float("inf")
        mine = [t for t in times if start <= t < limit]
        if mine:
            total += max(mine) - start
    return total


def _llm_usage(run_dir: Path) -> dict[str, dict[str, float]]:
    """Calls, tokens and cost per kernel, tester calls included."""
    usage: dict[str, dict[str, float]] = {}
    for call in read_calls(run_dir / "llm_calls.jsonl"):
        t = usage.setdefault(call.kernel, dict.fromkeys(
            ("llm_calls", "prompt_tokens", "completion_tokens", "cost_usd"), 0))
        t["llm_calls"] += 1
        t["prompt_tokens"] += call.prompt_tokens
        t["completion_tokens"] += call.completion_tokens
        t["cost_usd"] += call.cost_usd
    return usage


def _kernel_row(k: dict[str, Any], best: dict[str, Any], records: list[EvalRecord],
                attempts: list[dict[str, Any]], usage: dict[str, float]) -> dict[str, Any]:
    shapes = [{"label": s["label"], "bytes_moved": int(f.get("bytes_moved", 0)), "baseline_ms": s["baseline_ms"],
               "best_ms": s["best_ms"], "speedup": s["speedup"], "copy_bw_fraction": s["copy_bw_fraction"]}
              for s, f in zip(k["shapes"], best.get("final", {}).get("shapes", [{}] * len(k["shapes"])), strict=True)]
    largest = max(shapes, key=lambda s: s["bytes_moved"], default=None)
    mine = [r for r in records if r.kernel == k["kernel"]]
    return {
        "kernel": k["kernel"], "dtype": k["dtype"], "note": "", "winner": k["winner"],
        "params": json.dumps(k["params"], sort_keys=True), "shapes": shapes,
        "speedup_vs_baseline": k["speedup_search"],
        "speedup_vs_torch_compile": k["speedup_over_peers"].get("torch_compile"),
        "speedup_vs_peers": json.dumps(k["speedup_over_peers"], sort_keys=True),
        "heldout_status": k["heldout_status"], "speedup_heldout": k["speedup_heldout"],
        "largest_shape": largest["label"] if largest else None,
        "copy_bw_fraction_largest": largest["copy_bw_fraction"] if largest else None,
        "variants_evaluated": k["variants_evaluated"], "evaluations": k["evaluations"],
        "wall_s": kernel_wall_s([r.time for r in mine], attempts),
        "evaluator_busy_s": sum(r.busy_s for r in mine),
        "llm_calls": int(usage.get("llm_calls", 0)), "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "completion_tokens": int(usage.get("completion_tokens", 0)), "cost_usd": float(usage.get("cost_usd", 0.0)),
    }


def build_table(sweep_dir: Path) -> pl.DataFrame:
    """One row per kernel of the sweep (searched or skipped), from the run's records."""
    meta = json.loads((sweep_dir / SWEEP_FILE).read_text())
    run_dir = sweep_dir / meta["run_dir"]
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_evaluations(run_dir / "evaluations.jsonl")
    usage = _llm_usage(run_dir)
    rows = []
    for k in summary["kernels"]:
        best_path = run_dir / "best" / f"{k['kernel']}.json"
        best = json.loads(best_path.read_text()) if best_path.is_file() else {}
        rows.append(_kernel_row(k, best, records, meta["attempts"], usage.get(k["kernel"], {})))
    for name, reason in meta.get("skipped", {}).items():
        rows.append({"kernel": name, "dtype": meta["dtype"], "note": reason})
    rows.sort(key=lambda r: r["kernel"])
    return pl.DataFrame(rows, schema=TABLE_SCHEMA)


def _f(x: float | None, spec: str = ".3f", suffix: str = "x") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def attempts_text(attempts: Sequence[dict[str, Any]]) -> str:
    """A sweep's attempts for a report: each command with its date and commit (attempts made
    before commits were recorded say so)."""

    def one(a: dict[str, Any]) -> str:
        if "date" not in a:
            return f"`{a['command']}`"
        commit = f"at {a['git_commit'][:7] or 'an unknown commit'}" if "git_commit" in a else "commit not recorded"
        return f"`{a['command']}` ({a['date']}, {commit})"

    return "; ".join(one(a) for a in attempts)


def to_markdown(table: pl.DataFrame, summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The sweep table as markdown: the header facts, one line per kernel, then per-shape times."""
    commands = attempts_text(meta["attempts"])
    lines = [f"# Sweep {meta['sweep_id']} on {summary.get('gpu', '?')}", "", f"- commands: {commands}",
             f"- git commit at the end of the run: {summary.get('git_commit', '')}", f"- date: {summary.get('date', '')}",
             f"- evaluator: {summary.get('evaluator')}, GPUs: {summary.get('n_gpus')}, dtype: {meta['dtype']}",
             "- times: kernel times (CUDA events around one launch; peers by CUDA-graph replay; L2 flushed "
             "before every repetition); 'vs' ratios: geometric mean over the search shapes within one end-of-run "
             "loop, median over the loops [min-max] (search.spread); held-out and the per-shape tables: the "
             "evaluator's one run", ""]
    ranges = {k["kernel"]: k.get("spreads", {}) for k in summary.get("kernels", [])}

    def ratio(kernel: str, peer: str, value: float | None) -> str:
        ranged = ranges.get(kernel, {}).get(peer)
        return spread.text(ranged) if ranged else _f(value) + ("" if value is None else " (one run)")

    if summary.get("evaluator") == "standin":
        lines += [f"**{STANDIN_WARNING}**", ""]
    lines += ["| kernel | vs baseline | vs torch.compile | held-out | copy bw (largest shape) | variants | "
              "wall s | evaluator busy s | tokens | cost USD | note |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.iter_rows(named=True):
        tokens = (r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0)
        bw = "-" if r["copy_bw_fraction_largest"] is None else f"{r['copy_bw_fraction_largest']:.0%} {r['largest_shape']}"
        lines.append(f"| {r['kernel']} | {ratio(r['kernel'], 'baseline', r['speedup_vs_baseline'])} | "
                     f"{ratio(r['kernel'], 'torch_compile', r['speedup_vs_torch_compile'])} | "
                     f"{r['heldout_status'] or '-'} {_f(r['speedup_heldout'])} | {bw} | {r['variants_evaluated'] or 0} | "
                     f"{_f(r['wall_s'], '.0f', '')} | {_f(r['evaluator_busy_s'], '.1f', '')} | {tokens} | "
                     f"{(r['cost_usd'] or 0):.2f} | {r['note']} |")
    for r in table.iter_rows(named=True):
        if not r["shapes"]:
            continue
        lines += ["", f"## {r['kernel']} ({r['dtype']}): winner {r['winner']} {r['params']}", "",
                  "| shape | baseline us (evaluator) | best us (evaluator) | speedup (evaluator) | copy bw |",
                  "|---|---|---|---|---|"]
        lines += [f"| {s['label']} | {s['baseline_ms'] * 1e3:.2f} | {s['best_ms'] * 1e3:.2f} | {s['speedup']:.3f}x | "
                  f"{s['copy_bw_fraction']:.0%} |" for s in r["shapes"]]
    return "\n".join(lines) + "\n"


def write_table(sweep_dir: Path) -> pl.DataFrame:
    """Writes ``sweep.parquet`` and ``sweep.md`` (atomically) and returns the table."""
    table = build_table(sweep_dir)
    tmp = sweep_dir / "sweep.parquet.tmp"
    table.write_parquet(tmp)
    tmp.replace(sweep_dir / "sweep.parquet")
    meta = json.loads((sweep_dir / SWEEP_FILE).read_text())
    summary = json.loads((sweep_dir / meta["run_dir"] / "summary.json").read_text())
    atomic_write(sweep_dir / "sweep.md", to_markdown(table, summary, meta))
    return table


# -- entry point ----------------------------------------------------------------------------

def _save_meta(sweep_dir: Path, meta: dict[str, Any]) -> None:
    atomic_write(sweep_dir / SWEEP_FILE, json.dumps(meta, indent=2))


def run_sweep(prep: Prepared, meta: dict[str, Any], command: str) -> pl.DataFrame:
    """Runs (or resumes) the sweep's search unless it already finished, then writes the table."""
    from search.run import run_search

    sweep_dir = prep.run_dir.parent
    if not (prep.resume and finished(prep)):
        # Each attempt's commit: a sweep resumed at a later commit says which part ran where.
        attempt = {"start": time.time(), "end": None, "command": command,
                   "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                   "git_commit": git_commit(Path(__file__).resolve().parent.parent)}
        meta["attempts"].append(attempt)
        _save_meta(sweep_dir, meta)
        print(f"sweep {meta['sweep_id']}: {len(prep.kernels)} kernel(s), {prep.config.search.rounds} round(s) each"
              f"{', resuming' if prep.resume else ''}; directory {sweep_dir}", file=sys.stderr)
        run_search(prep, command, progress_cls=SweepProgress)
        attempt["end"] = time.time()
        _save_meta(sweep_dir, meta)
    table = write_table(sweep_dir)
    print(f"\nsweep table: {sweep_dir / 'sweep.md'} and sweep.parquet ({table.height} kernels)")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        prep, meta = plan(args)
    except (ConfigError, KernelSpecError, AgentConfigError, UsageError, FileExistsError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    command = "python -m search.sweep " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    from search.run import INTERRUPTS

    INTERRUPTS.install()
    try:
        run_sweep(prep, meta, command)
    except UsageError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from search.run import stop_ray_quietly

        stop_ray_quietly()
        sweep_dir = shlex.quote(str(prep.run_dir.parent))
        print(f"\ninterrupted; continue with: python -m search.sweep --resume {sweep_dir}", file=sys.stderr, flush=True)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
