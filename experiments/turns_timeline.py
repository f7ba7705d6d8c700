"""Who held the GPU shared while a process waited to time alone: a run's lock timeline laid out.

Every process of a run started with ``KERNEL_SEARCH_TURNS_LOG`` set (the end-of-run bench sets
it per run) appends each change of its GPU lock's mode to ``turns-<pid>.jsonl`` in that folder
(:mod:`evaluators.gpu_turns`). A process holds a mode from the moment it got it until it next
asked for another (flock drops a lock before converting it, so a process waiting holds nothing).
This lays those holds on one axis and reports, for the GPU's lock:

- ``alone_s``: seconds during which some process had the GPU alone (timing, benchmarks);
- ``blocked_s``: seconds during which some process waited to have it alone and none had it,
  that is, the GPU was held shared only (set-ups, sanitizer runs, start-ups) or the waiter had
  not yet been woken;
- ``blockers``: for each process that held a share during those seconds, how many of them, with
  its command line (largest first).

    python -m experiments.turns_timeline runs/eor/runs-logs/<start>-cold.turns [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from kernels.records import read_jsonl


def holds(records: list[list[dict[str, Any]]], lock: str) -> tuple[list[tuple[float, float, int, str]], dict[int, str]]:
    """From each process's records, each (start, end, pid, mode) during which it held ``lock``
    in a mode or waited for one (``wait-alone``, ``wait-shared``), and each process's command line."""
    spans: list[tuple[float, float, int, str]] = []
    argv = {int(row["pid"]): str(row["argv"]) for every in records for row in every[:1] if "argv" in row}
    # A process killed without its last record holds until the last record of any.
    last = max((r["got"] for every in records for r in every), default=0.0)
    for every in records:
        rows = [r for r in every if r.get("lock") == lock]
        for i, row in enumerate(rows):
            pid = int(row["pid"])
            if row["mode"] != "none" and row["got"] > row["asked"]:
                spans.append((row["asked"], row["got"], pid, f"wait-{row['mode']}"))
            end = rows[i + 1]["asked"] if i + 1 < len(rows) else last
            if row["mode"] != "none" and end > row["got"]:
                spans.append((row["got"], end, pid, row["mode"]))
    return spans, argv


def lay_out(folder: Path, lock: str = "") -> dict[str, Any]:
    """The report above for ``lock`` (default: the GPU's, the one not named ``*.benchmarks*``
    with most records)."""
    records = [list(read_jsonl(file)) for file in sorted(folder.glob("turns-*.jsonl"))]
    if not lock:
        names: dict[str, int] = defaultdict(int)
        for every in records:
            for row in every:
                names[str(row.get("lock"))] += 1
        plain = {n: c for n, c in names.items() if ".benchmarks" not in n}
        if not plain:
            return {"folder": str(folder), "lock": None, "processes": 0}
        lock = max(plain, key=lambda n: plain[n])
    spans, argv = holds(records, lock)
    if not spans:
        return {"folder": str(folder), "lock": lock, "processes": 0}
    edges = sorted({t for s in spans for t in s[:2]})
    alone = blocked = 0.0
    blockers: dict[int, float] = defaultdict(float)
    for a, b in zip(edges, edges[1:], strict=False):
        here = [s for s in spans if s[0] <= a and s[1] >= b]
        if any(s[3] == "alone" for s in here):
            alone += b - a
        elif any(s[3] == "wait-alone" for s in here):
            blocked += b - a
            for s in here:
                if s[3] == "shared":
                    blockers[s[2]] += b - a
    top = sorted(blockers.items(), key=lambda kv: -kv[1])
    return {"folder": str(folder), "lock": lock, "processes": len({s[2] for s in spans}),
            "span_s": round(edges[-1] - edges[0], 2), "alone_s": round(alone, 2), "blocked_s": round(blocked, 2),
            "blockers": [{"pid": pid, "shared_s": round(sec, 2), "argv": argv.get(pid, "?")} for pid, sec in top]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--lock", default="", help="the lock file's name (default: the GPU's)")
    parser.add_argument("--json", type=Path, help="write the reports here as well")
    args = parser.parse_args(argv)
    reports = [lay_out(folder, args.lock) for folder in args.folders]
    for r in reports:
        print(f"{r['folder']}: {r['processes']} processes on {r['lock']}", end="")
        if r["processes"]:
            print(f", {r['span_s']} s: alone {r['alone_s']} s, blocked {r['blocked_s']} s")
            for b in r["blockers"][:8]:
                print(f"  {b['shared_s']:7.2f} s shared by {b['pid']}: {b['argv'][:120]}")
        else:
            print()
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
