"""Where a FlashInfer peer's set-up seconds go in a fresh process (GPU machine).

The end-of-run loops of the sweeps record FlashInfer's set-up at 16-26 s per loop for
merge_state and the gated activations, in every fresh loop process, and 0.4-0.7 s for the norm
ops and merge_states. This probe separates the candidates: the import, the first call of each
op (a JIT build, or the load of a module built before), and each later shape's first call; and
it lists the JIT workspace's modules before and after, so that a rebuild (a newer .so) shows.

Each kernel runs in ``--rounds`` (2) fresh processes, one after the other, the way the loops do:

    python -m experiments.flashinfer_setup --out runs/fi/setup.json silu_and_mul merge_attn_states_lse

Nothing is timed against anything: these are wall-clock seconds of set-up, for a diagnosis.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from experiments.bench_baselines import git_commit

# One op of each kind the loops showed: slow every time (an activation, merge_state) and fast (a norm).
DEFAULT_KERNELS = ("silu_and_mul", "merge_attn_states_lse", "fused_add_rmsnorm")


def _modules(jit_dir: Path) -> dict[str, float]:
    """Every built module under the JIT folder: path -> modification time."""
    if not jit_dir.is_dir():
        return {}
    return {str(p.relative_to(jit_dir)): p.stat().st_mtime for p in jit_dir.rglob("*.so")}


def probe_once(kernel: str, dtype: str) -> dict[str, Any]:
    """In this process: import FlashInfer, then call each FlashInfer peer of ``kernel`` once per
    search shape, each call timed on its own (synchronised)."""
    start = time.perf_counter()
    import flashinfer  # noqa: F401
    from flashinfer.jit import env as jit_env

    import_s = time.perf_counter() - start
    import torch

    from evaluators.peers import peer_fns
    from kernels.peer import call_once
    from kernels.spec import load_kernel, shape_label

    jit_dir = Path(jit_env.FLASHINFER_JIT_DIR)
    before = _modules(jit_dir)
    spec = load_kernel(kernel)
    device = torch.device("cuda", 0)
    torch.zeros(1, device=device)
    calls: list[dict[str, Any]] = []
    for name, peer in peer_fns(spec, trials=1).items():
        if not name.startswith("flashinfer"):
            continue
        for shape in spec.shapes("search"):
            gen = torch.Generator(device=device).manual_seed(7)
            inputs = spec.make_inputs(shape, getattr(torch, dtype), gen, "random", device)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                call_once(peer, inputs, shape, spec.constants)
                torch.cuda.synchronize()
                error = ""
            except Exception as exc:  # reported, not raised: the other peers still tell something
                error = f"{type(exc).__name__}: {exc}"[:300]
            calls.append({"peer": name, "shape": shape_label(shape), "s": time.perf_counter() - t0, "error": error})
    after = _modules(jit_dir)
    return {
        "kernel": kernel, "gpu": torch.cuda.get_device_name(device), "pid": os.getpid(), "import_s": import_s, "workspace": str(jit_env.FLASHINFER_WORKSPACE_DIR),
        "home": os.environ.get("HOME", ""), "calls": calls,
        "modules_before": len(before), "modules_built": sorted(k for k in after if k not in before),
        "modules_rebuilt": sorted(k for k in after if k in before and after[k] != before[k]),
        "cuda_cache": {k: v for k, v in os.environ.items() if k.startswith("CUDA_CACHE")},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernels", nargs="*", default=list(DEFAULT_KERNELS))
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per kernel")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one kernel, JSON on stdout
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(probe_once(args.kernels[0], args.dtype)))
        return 0
    results: list[dict[str, Any]] = []
    for kernel in args.kernels:
        for r in range(args.rounds):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "experiments.flashinfer_setup", "--one", "--dtype", args.dtype,
                                   "--out", str(args.out), kernel], capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                results.append({"kernel": kernel, "round": r, "wall_s": wall, "error": proc.stderr[-2000:]})
            else:
                results.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "round": r, "wall_s": wall})
            row = results[-1]
            calls = ", ".join(f"{c['peer']} {c['shape']} {c['s']:.2f}s" for c in row.get("calls", []))
            print(f"{kernel} round {r}: process {wall:.1f} s, import {row.get('import_s', 0):.1f} s; {calls}; "
                  f"built {row.get('modules_built', '?')}, rebuilt {row.get('modules_rebuilt', '?')}"
                  + (f"; error {row['error'][-300:]}" if "error" in row else ""), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # What a results file carries: the command, the commit, the GPU (from the children) and the date.
    gpus = sorted({row["gpu"] for row in results if "gpu" in row})
    meta = {"command": " ".join(sys.argv), "git_commit": git_commit(), "gpu": ", ".join(gpus) or "unknown",
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    args.out.write_text(json.dumps({**meta, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
