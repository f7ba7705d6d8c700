"""``python -m search.reward_data``: prompts of the kernel library as an RL dataset (parquet).

    python -m search.reward_data --out data/kernels.parquet [--kernel silu_and_mul ...] [--dtype float16 ...]

One row per (kernel, dtype), in the columns verl's RL datasets use: ``data_source``,
``prompt`` (the chat messages of :func:`search.reward_env.task_messages`), ``ability``,
``reward_model`` (``{"style": "rule", "ground_truth": "kernel:dtype"}``, what
:func:`search.reward_verl.compute_score` reads) and ``extra_info`` (kernel, dtype, index).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from kernels.spec import KernelSpecError, list_kernels, load_kernel
from search.reward_env import task_messages

DATA_SOURCE = "kernel-search"


def dataset_rows(kernels: Sequence[str], dtypes: Sequence[str]) -> list[dict[str, Any]]:
    """A row per kernel and dtype it supports (of ``dtypes``).

    Raises:
        KernelSpecError: an unknown kernel.
    """
    rows: list[dict[str, Any]] = []
    for kernel in kernels:
        spec = load_kernel(kernel)
        for dtype in (d for d in dtypes if d in spec.dtypes):
            rows.append({"data_source": DATA_SOURCE, "prompt": task_messages(spec.name, dtype), "ability": "cuda",
                         "reward_model": {"style": "rule", "ground_truth": f"{spec.name}:{dtype}"},
                         "extra_info": {"kernel": spec.name, "dtype": dtype, "index": len(rows)}})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m search.reward_data", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="parquet file to write")
    p.add_argument("--kernel", action="append", dest="kernels", help="repeatable; default: the whole library")
    p.add_argument("--dtype", action="append", dest="dtypes", help="repeatable; default float16 and bfloat16")
    args = p.parse_args(argv)
    try:
        rows = dataset_rows(args.kernels or list_kernels(), args.dtypes or ["float16", "bfloat16"])
    except KernelSpecError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(args.out)
    print(f"{len(rows)} prompts: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
