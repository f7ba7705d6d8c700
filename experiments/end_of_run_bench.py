"""Wall time of the default search command with a cold and a warm peer cache (GPU machine).

Each run is the README's command, ``python -m search.run --population 8 --rounds 5``, in a
process of its own, timed from its start to its exit. ``cold``: the peer cache is emptied
first, so every production peer is compiled and timed in the end-of-run loops (as every run
did before the cache); ``warm``: the cache holds the figures the runs before it measured, so
the loops time our kernels and the baseline alone. Every run's summary gives the seconds per
stage and the ratios, so the warm runs' ratios can be set beside the cold runs' (which
measured every peer afresh).

    python -m experiments.end_of_run_bench --runs cold,warm --json OUT/part1.json
    python -m experiments.end_of_run_bench --report OUT/part*.json --md experiments/results/end-of-run-h200.md

Other compilers' caches (Triton's binaries, FlashInfer's JIT folder) are not emptied between
runs: "cold" is about the peer cache alone, and the first run on a fresh machine is the only
one that also builds FlashInfer's ops and Triton's binaries from nothing (it is marked so).

Each run's processes record their GPU lock's changes of mode in ``<log>.turns/`` beside its
console log (``turns_log`` in the record): ``python -m experiments.turns_timeline <that folder>``
says who held the GPU shared while the rounds waited to time alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evaluators.gpu_turns import TIMELINE_ENV
from experiments.turns_timeline import lay_out
from search.report import git_commit
from search.spread import from_dict

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["--population", "8", "--rounds", "5"]
# Issue 43's wall-time targets for the default command on one H100 or H200.
TARGET_S = {"cold": 240, "warm": 150}
RATIOS = ("baseline", "torch_compile", "flashinfer", "flashinfer_in_place", "liger", "torch_eager")


def one_run(mode: str, cache: Path, out: Path, extra: Sequence[str], first: bool) -> dict[str, Any]:
    """Runs the command once; returns what its summary says and the wall time around it."""
    if mode == "cold":
        shutil.rmtree(cache, ignore_errors=True)
    before = set(out.glob("*")) if out.is_dir() else set()
    cmd = [sys.executable, "-m", "search.run", *COMMAND, "--out", str(out), "--peer-cache", str(cache), *extra]
    start = time.time()
    # The run's output goes to a file as it comes, beside (not inside) the runs' folder: a run
    # cut from outside still shows how far it got and where its time went.
    log = out.with_name(out.name + "-logs") / f"{int(start)}-{mode}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # Every process's changes of the GPU lock's mode, for laying the run's end out in time.
    timeline = log.with_suffix(".turns")
    timeline.mkdir(exist_ok=True)
    env = {**os.environ, TIMELINE_ENV: str(timeline.resolve())}
    with log.open("w") as sink:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env)
    wall = time.time() - start
    made = sorted(set(out.glob("*")) - before)
    turns = lay_out(timeline)
    record: dict[str, Any] = {"mode": mode, "first_on_machine": first, "command": "python -m search.run "
                              + " ".join(cmd[3:]), "wall_s": wall, "exit_code": proc.returncode,
                              "log": str(log), "turns_log": str(timeline), "gpu_turns": _turns_brief(turns),
                              "output_tail": log.read_text(errors="replace")[-3000:]}
    summary_path = made[-1] / "summary.json" if made else None
    if summary_path is None or not summary_path.is_file():
        return record
    summary = json.loads(summary_path.read_text())
    record.update(run_id=summary.get("run_id"), gpu=summary.get("gpu"), summary_wall_s=summary.get("wall_s"),
                  stage_s=summary.get("stage_s"), end_calls_s=summary.get("end_calls_s"),
                  compiled_beside_search=summary.get("compiled_beside_search"),
                  kernels={k["kernel"]: kernel_figures(k, summary.get("run_id")) for k in summary["kernels"]})
    return record


def _turns_brief(turns: dict[str, Any], top: int = 5) -> dict[str, Any]:
    """The lock timeline's totals and its largest blockers (command lines cut short)."""
    return {**{k: turns.get(k) for k in ("processes", "span_s", "alone_s", "blocked_s")},
            "blockers": [{**b, "argv": b["argv"][:100]} for b in turns.get("blockers", [])[:top]]}


def kernel_figures(k: dict[str, Any], run_id: str | None = None) -> dict[str, Any]:
    held = k.get("heldout_loops") or {}
    return {"winner": k["winner"], "search": {p: v for p, v in k.get("spreads", {}).items() if p in RATIOS},
            "heldout": {p: v for p, v in held.get("spreads", {}).items() if p in RATIOS},
            "cached_loops": sum(1 for c in k.get("peer_cache", []) + held.get("peer_cache", []) if c),
            # of those, the ones whose peers were timed beside this run's search (search.compile_ahead)
            "beside_loops": sum(1 for c in k.get("peer_cache", []) + held.get("peer_cache", [])
                                if isinstance(c, dict) and c.get("run_id") == run_id),
            "loops": len(k.get("peer_cache", [])) + len(held.get("peer_cache", [])),
            # where each loop's round spent its time (set-up, waiting for the GPU, timing) and
            # what it loaded of the compilations made ahead of it
            "phase_s": {"search": k.get("loop_phase_s", []), "heldout": held.get("loop_phase_s", [])},
            "compile_cache": {"search": k.get("compile_cache", []), "heldout": held.get("compile_cache", [])}}


def _beside(made: dict[str, Any] | None) -> str:
    """Per kernel and shape set: when its compilation answered and, with peers' rounds beside the
    search, how many gave figures and when the last answered (seconds from the run's set-up)."""
    if not made:
        return "-"
    cells = []
    for key, v in made.items():
        cell = (f"{key} {v['answered_s']:.0f} s" + ("" if v.get("status") == "OK" else f" ({v.get('status')})")
                if v.get("answered_s") is not None else f"{key} unanswered")
        if "peer_rounds" in v:
            times = v.get("peer_rounds_answered_s") or []
            cell += f", peers {v['peer_rounds']} rounds" + (f" by {max(times):.0f} s" if times else "")
        cells.append(cell)
    return ", ".join(cells)


def _text(d: dict[str, Any] | None) -> str:
    s = from_dict(d)
    return "-" if s is None else s.text()


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.0f} s [{min(values):.0f}-{max(values):.0f}] ({len(values)} runs)"


def report(runs: list[dict[str, Any]]) -> str:
    """The markdown: every run's wall and stages, the wall per mode, and each kernel's ratios in
    the warm runs beside those of the cold ones."""
    meta = runs[0].get("meta", {})
    lines = ["# End of run: wall time of the default command, cold and warm peer cache", "",
             f"- command: `python -m experiments.end_of_run_bench` (each run: `{runs[0]['command']}`)",
             f"- git commit: {meta.get('commit')}; GPU: {runs[0].get('gpu')}; date: {meta.get('date')}",
             "- wall: seconds from the command's start to its exit (Ray start-up and imports included); "
             "stages and calls from its summary.json (`stage_s`, `end_calls_s`: seconds during which at least "
             "one call of that kind ran)",
             "- cold: the peer cache emptied before the run (every peer compiled and timed in the end-of-run "
             "loops); warm: the cache as the runs before left it (peers' figures reused, our kernels and the "
             "baseline timed afresh in three fresh-process loops). Triton's and FlashInfer's own on-disk caches "
             "are not emptied; a run marked 'first' was the first on a fresh machine.",
             "- ratios: other implementation's time / our winner's, geometric mean over the shapes per loop, "
             "median over the 3 loops [min-max]; kernel times (CUDA events around our launches, CUDA-graph "
             "replays for the peers, L2 flushed before every repetition)", "",
             "- compiled beside the search: the end-of-run loops' torch.compile programs compiled while the "
             "search ran (search.compile_ahead), per kernel and shape set: seconds from the run's set-up to "
             "its answer; with the peers timed beside the search, how many of its rounds gave figures and "
             "when the last answered (they time once the search is over)", "",
             "| run | mode | exit | wall | stages | end-of-run calls | compiled beside the search |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        stages = ", ".join(f"{k} {v:.0f}" for k, v in (r.get("stage_s") or {}).items())
        calls = ", ".join(f"{k} {v:.0f}" for k, v in (r.get("end_calls_s") or {}).items())
        lines.append(f"| {i} | {r['mode']}{' (first)' if r.get('first_on_machine') else ''} | {r['exit_code']} | "
                     f"{r['wall_s']:.0f} s | {stages} | {calls} | {_beside(r.get('compiled_beside_search'))} |")
    # The search stage of a cold run has the peers' compilations beside it; a warm run's has
    # nothing to compile (every loop's peers cached), so the two set side by side say whether
    # compiling beside the search slows it.
    lines += ["", "| mode | wall, median [min-max] | target | search stage, median [min-max] |", "|---|---|---|---|"]
    for mode in ("cold", "warm"):
        done = [r for r in runs if r["mode"] == mode and r["exit_code"] == 0]
        searches = [seconds["search"] for r in done if "search" in (seconds := r.get("stage_s") or {})]
        lines.append(f"| {mode} | {_spread([r['wall_s'] for r in done])} | {TARGET_S[mode]} s | {_spread(searches)} |")
    # Who kept the rounds from timing: the GPU lock's timeline (evaluators.gpu_turns), where recorded.
    timed = [(i, r["gpu_turns"]) for i, r in enumerate(runs, 1) if (r.get("gpu_turns") or {}).get("processes")]
    if timed:
        lines += ["", "GPU lock over each run (experiments.turns_timeline): seconds some process had the GPU "
                  "alone; seconds some process waited to have it alone while it was only shared; the processes "
                  "that held it shared then, largest first", "",
                  "| run | processes | alone | blocked | held it shared while others waited |", "|---|---|---|---|---|"]
        for i, t in timed:
            who = "; ".join(f"{b['shared_s']:.0f} s `{b['argv'][:60]}`" for b in t["blockers"][:3]) or "-"
            lines.append(f"| {i} | {t['processes']} | {t['alone_s']:.0f} s | {t['blocked_s']:.0f} s | {who} |")
    lines += ["", "## Ratios per run (search shapes; held-out: the spec's fixed held-out shapes)", "",
              "| run | mode | kernel | loops with cached peers | search: vs " + ", ".join(RATIOS[:3])
              + " | held-out: vs " + ", ".join(RATIOS[:3]) + " |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        for name, k in (r.get("kernels") or {}).items():
            def cells(part: dict[str, Any]) -> str:
                return "; ".join(f"{p} {_text(part.get(p))}" for p in sorted(part))
            cached = f"{k['cached_loops']} of {k['loops']}" + (f" ({k['beside_loops']} beside the search)"
                                                                if k.get("beside_loops") else "")
            lines.append(f"| {i} | {r['mode']} | {name} | {cached} | "
                         f"{cells(k['search'])} | {cells(k['heldout'])} |")
    lines += ["", phases(runs), "", agreement(runs), "", baseline_agreement(runs)]
    return "\n".join(lines) + "\n"


def phases(runs: list[dict[str, Any]]) -> str:
    """Per run, kernel and shape set: each loop's set-up, wait for the GPU and timing seconds
    (one entry per round), and the compilations it loaded (hit) or made (miss)."""
    out = ["## Where the end-of-run loops spent their time", "",
           "Per loop (one per round): set-up / waiting for the GPU alone / timing, in seconds; compile cache: "
           "FX-graph lookups that loaded a compilation made ahead (hit) or compiled (miss).", "",
           "| run | mode | kernel | shapes | set-up, wait, timing per loop (s) | compile cache per loop |",
           "|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        for name, k in (r.get("kernels") or {}).items():
            for part in ("search", "heldout"):
                loops = (k.get("phase_s") or {}).get(part) or []
                if not loops:
                    continue
                cells = "; ".join(f"{p.get('prepare', 0):.0f}, {p.get('wait', 0):.0f}, {p.get('loop', 0):.1f}"
                                  for p in loops)
                cache = "; ".join(f"{c.get('hit', 0)} hit, {c.get('miss', 0)} miss" if c else "-"
                                  for c in (k.get("compile_cache") or {}).get(part) or []) or "-"
                out.append(f"| {i} | {r['mode']} | {name} | {part} | {cells} | {cache} |")
    return "\n".join(out)


def agreement(runs: list[dict[str, Any]]) -> str:
    """Whether each warm run's ratio ranges overlap the cold runs' (which measured the peers)."""
    out = ["## Warm ratios against cold ones", "",
           "Per kernel and peer: the cold runs' medians (each run's median over its loops), and whether each "
           "warm run's median lies within the cold runs' overall range [lowest min - highest max].", "",
           "| kernel | ratio | cold medians | cold range | warm medians | warm within cold range |", "|---|---|---|---|---|---|"]
    names = sorted({n for r in runs for n in (r.get("kernels") or {})})
    for name in names:
        for part in ("search", "heldout"):
            peers = sorted({p for r in runs for p in ((r.get("kernels") or {}).get(name, {}).get(part) or {})})
            for p in peers:
                cold = [from_dict(r["kernels"][name][part].get(p)) for r in runs
                        if r["mode"] == "cold" and name in (r.get("kernels") or {})]
                warm = [from_dict(r["kernels"][name][part].get(p)) for r in runs
                        if r["mode"] == "warm" and name in (r.get("kernels") or {})]
                cold_s = [c for c in cold if c is not None]
                warm_s = [w for w in warm if w is not None]
                if not cold_s or not warm_s:
                    continue
                low, high = min(c.low for c in cold_s), max(c.high for c in cold_s)
                inside = sum(1 for w in warm_s if low <= w.median <= high)
                out.append(f"| {name} | {part}: vs {p} | {', '.join(f'{c.median:.3f}' for c in cold_s)} | "
                           f"[{low:.3f}-{high:.3f}] | {', '.join(f'{w.median:.3f}' for w in warm_s)} | "
                           f"{inside} of {len(warm_s)} |")
    return "\n".join(out)


def _over_baseline(part: dict[str, Any], peer: str) -> tuple[float, float, float] | None:
    """A peer's time over the baseline's, (median, low, high), from one run's ratios against
    its winner: (peer / winner) / (baseline / winner). The low and high pair opposite ends of
    the two ranges, so the range holds every loop's own quotient."""
    p, b = from_dict(part.get(peer)), from_dict(part.get("baseline"))
    if p is None or b is None or min(b.median, b.low, b.high) <= 0:
        return None
    return p.median / b.median, p.low / b.high, p.high / b.low


def _quotients(runs: list[dict[str, Any]], mode: str, name: str, part: str, peer: str) -> list[tuple[float, float, float]]:
    """:func:`_over_baseline` of every run of ``mode`` that has the kernel and the figure."""
    found = [_over_baseline(r["kernels"][name][part], peer) for r in runs
             if r["mode"] == mode and name in (r.get("kernels") or {})]
    return [f for f in found if f is not None]


def baseline_agreement(runs: list[dict[str, Any]]) -> str:
    """The same check as :func:`agreement` on figures that do not depend on the run's winner:
    every run searches afresh and may pick another winner, which moves every ratio against it
    alike, while a peer's time over the baseline's (both from the run's own loops: a warm run's
    peers from the cache, its baseline timed afresh) should not move at all."""
    out = ["## Peers against the baseline, warm against cold (independent of each run's winner)", "",
           "Per kernel and peer: the peer's time over the baseline's, median [range], from each run's ratios "
           "against its own winner; whether each warm run's median lies within the cold runs' overall range, "
           "and its distance from the cold runs' median. Since the peer cache anchors reused figures on the "
           "baseline (search/peer_cache.py, f56f714), a warm loop's quotient repeats that of the cold loop that "
           "measured the peers, by construction; before it, the warm runs' baseline was timed in loops of ours "
           "alone and the quotients could differ.", "",
           "| kernel | peer / baseline | cold | warm | warm within cold range | warm / cold median |",
           "|---|---|---|---|---|---|"]
    names = sorted({n for r in runs for n in (r.get("kernels") or {})})
    for name in names:
        for part in ("search", "heldout"):
            peers = sorted({p for r in runs for p in ((r.get("kernels") or {}).get(name, {}).get(part) or {})}
                           - {"baseline"})
            for p in peers:
                cold, warm = (_quotients(runs, mode, name, part, p) for mode in ("cold", "warm"))
                if not cold or not warm:
                    continue
                low, high = min(c[1] for c in cold), max(c[2] for c in cold)
                centre = statistics.median(c[0] for c in cold)
                inside = sum(1 for w in warm if low <= w[0] <= high)
                text = "; ".join
                out.append(f"| {name} | {part}: {p} | {text(f'{c[0]:.3f} [{c[1]:.3f}-{c[2]:.3f}]' for c in cold)} | "
                           f"{text(f'{w[0]:.3f} [{w[1]:.3f}-{w[2]:.3f}]' for w in warm)} | {inside} of {len(warm)} | "
                           f"{', '.join(f'{w[0] / centre:.3f}' for w in warm)} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="cold,warm", help="comma-separated modes in order: cold, warm")
    p.add_argument("--json", type=Path, help="where this call's runs are written (JSON), after every run")
    p.add_argument("--cache", type=Path, default=ROOT / "runs" / "bench-peer-cache")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-end-of-run", help="parent of the run folders")
    p.add_argument("--first", action="store_true", help="the first run is the first on this machine")
    p.add_argument("--report", nargs="*", type=Path, help="JSON files of earlier calls: write the markdown only")
    p.add_argument("--md", type=Path, help="markdown report (with --report)")
    args, extra = p.parse_known_args(argv)
    if args.report:
        runs = [r for path in args.report for r in json.loads(path.read_text())["runs"]]
        text = report(runs)
        if args.md:
            args.md.write_text(text)
        print(text)
        return 0
    if args.json is None:
        p.error("--json is required unless --report")
    meta = {"commit": git_commit(ROOT), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    done: list[dict[str, Any]] = []
    for i, mode in enumerate(args.runs.split(",")):
        if mode not in ("cold", "warm"):
            p.error(f"--runs: unknown mode {mode!r}")
        record = one_run(mode, args.cache, args.out, extra, first=args.first and i == 0)
        record["meta"] = meta
        done.append(record)
        args.json.write_text(json.dumps({"runs": done}, indent=1, default=str))
        print(f"{mode}: exit {record['exit_code']}, wall {record['wall_s']:.0f} s, stages {record.get('stage_s')}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
