"""Compares two sweeps' results kernel by kernel (no GPU).

    python -m experiments.sweep_compare experiments/results/sweep-h200.json NEW/sweep-h200.json --out cmp.md

For each kernel in both files: the winner's speedup over our baseline and over torch.compile
in each sweep, and the new one over the old one. Where a sweep kept the spread of its repeated
end-of-run loops (``spreads``), its range is used, else its single figure; the new result is
called better only when its whole range lies above the old (the old range's top), worse only
when it lies below the old range's bottom, and a tie otherwise (:mod:`search.spread`'s rule);
a single figure on either side has no range to judge by: its row gives the ratio and no verdict.
Figures from different protocols stay different measurements: the baseline ratio is the one
both sweeps measure the same way (the same baseline kernels), which is why it comes first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

MEASURES = (("baseline", "speedup_vs_baseline"), ("torch_compile", "speedup_vs_torch_compile"))


def _range(kernel: dict[str, Any], name: str, key: str) -> tuple[float, float, float] | None:
    """(low, median, high) of one ratio: the loops' spread where kept (over more than one
    loop), else the single figure three times."""
    spread = (kernel.get("spreads") or {}).get(name)
    if spread and spread.get("runs", 2) > 1:
        return float(spread["low"]), float(spread["median"]), float(spread["high"])
    value = kernel.get(key)
    return None if value is None else (float(value), float(value), float(value))


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Per kernel present in both: each measure's old and new range and the verdict."""
    old = {k["kernel"]: k for k in before["kernels"]}
    rows = []
    for new in after["kernels"]:
        name = new["kernel"]
        if name not in old:
            continue
        row: dict[str, Any] = {"kernel": name}
        for label, key in MEASURES:
            a, b = _range(old[name], label, key), _range(new, label, key)
            if a is None or b is None:
                row[label] = None
                continue
            if a[0] == a[2] or b[0] == b[2]:
                verdict = "one run: no verdict"
            else:
                verdict = "better" if b[0] > a[2] else "worse" if b[2] < a[0] else "tie"
            # after/before over the two spreads: the lowest after over the highest before, up to
            # the highest after over the lowest before
            row[label] = {"before": a, "after": b, "ratio": b[1] / a[1],
                          "ratio_range": (b[0] / a[2], b[1] / a[1], b[2] / a[0]), "verdict": verdict}
        rows.append(row)
    return rows


def _cell(r: tuple[float, float, float]) -> str:
    low, mid, high = r
    return f"{mid:.3f}x" if low == high else f"{mid:.3f}x [{low:.3f}-{high:.3f}]"


def to_markdown(rows: list[dict[str, Any]], before: str, after: str) -> str:
    lines = [f"# {after} against {before}", "",
             "| kernel | vs baseline: before | after | after/before | verdict "
             "| vs torch.compile: before | after | after/before | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [row["kernel"]]
        for label, _ in MEASURES:
            m = row[label]
            cells += ["n/a"] * 4 if m is None else [_cell(m["before"]), _cell(m["after"]), _cell(m["ratio_range"]),
                                                    m["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    verdicts = ("better", "tie", "worse", "one run: no verdict")
    counts = {v: sum(1 for r in rows if r["baseline"] and r["baseline"]["verdict"] == v) for v in verdicts}
    lines += ["", "Each figure: median over the end-of-run loops [min-max]; after/before: the medians' ratio "
              "[lowest after / highest before - highest after / lowest before].",
              "", f"vs baseline: {counts['better']} better, {counts['tie']} tie, {counts['worse']} worse, "
              f"{counts['one run: no verdict']} without a verdict (a single figure) of {len(rows)} kernels in both"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="the earlier sweep's results JSON (experiments.sweep_results)")
    p.add_argument("after", type=Path, help="the later sweep's results JSON")
    p.add_argument("--out", type=Path, help="write the table here too")
    args = p.parse_args(argv)
    try:
        before, after = (json.loads(path.read_text()) for path in (args.before, args.after))
        rows = compare(before, after)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: cannot compare {args.before} and {args.after}: {exc!r}", file=sys.stderr)
        return 2
    text = to_markdown(rows, str(args.before), str(args.after))
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
