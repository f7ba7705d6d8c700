"""Why a loop that loads its torch.compile programs from the compile-ahead folder still runs
Inductor's coordinate descent (GPU machine).

The end-of-run loops of 9a09729 loaded every FX graph from the folder a compile-ahead process
had filled (hits 12/12), yet ``CachingAutotuner.coordinate_descent_tuning`` took 4.4-21.1 s per
fused_add_rmsnorm loop: the tuning the ahead process had done was not handed on. This probe
replays that in two fresh processes per variant, one after the other, in one new folder:
``ahead`` compiles the kernel's programs (as :func:`evaluators.peer_compile.compile_kernel`
does), then ``load`` does the same again, as a loop does.
Each process records every autotune-cache lookup (the kernel file, how many configs, their
hash, the ``.best_config`` file and whether it exists, hit or miss), every coordinate-descent
call (seconds, the lookup's outcome, whether the kernel came from a static bundle) and every
static autotuner's re-check. A variant is a set of Inductor settings applied in both processes:

    python -m experiments.coordesc_probe --out runs/diag/coordesc.json fused_add_rmsnorm

Nothing here is timed against anything: the seconds are a diagnosis.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.bench_baselines import git_commit

# Inductor settings tried in both processes, by name. "as-is" is what the loops run.
VARIANTS: dict[str, dict[str, Any]] = {
    "as-is": {},
    "no-bundle": {"bundle_triton_into_fx_graph_cache": False},
    "no-static": {"use_static_cuda_launcher": False},
}


def _instrument(events: list[dict[str, Any]]) -> None:
    """Wraps the autotune-cache lookup, coordinate descent and the static re-check of this
    torch so that each call appends what it saw to ``events``."""
    from torch._inductor.runtime import triton_heuristics as th

    check = th.check_autotune_cache

    def checked(configs: Any, filename: Any, inductor_meta: Any, *args: Any, **kwargs: Any) -> Any:
        out = check(configs, filename, inductor_meta, *args, **kwargs)
        cache, info = out[1], out[2]
        local = getattr(cache, "local_cache", None) if cache is not None else None
        path = local[1] if local else None
        events.append({"event": "lookup", "file": os.path.basename(filename or ""), "configs": len(configs),
                       "configs_hash": getattr(cache, "configs_hash", None), "state": info.get("autotune_cache_state"),
                       "best_config": path and os.path.basename(path), "exists": bool(path and os.path.exists(path)),
                       "coordesc": bool(inductor_meta.get("coordinate_descent_tuning"))})
        return out

    th.check_autotune_cache = checked
    cls = th.CachingAutotuner
    descend = cls.coordinate_descent_tuning

    def descended(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        found = getattr(launcher.config, "found_by_coordesc", None)
        out = descend(self, launcher, *args, **kwargs)
        static = getattr(self, "is_statically_launchable", None)
        events.append({"event": "coordesc", "file": os.path.basename(getattr(self, "filename", "") or ""),
                       "s": round(time.perf_counter() - start, 3), "start_found_by_coordesc": found,
                       "start_config": str(launcher.config), "end_config": str(out.config),
                       "cache_info": {k: str(v) for k, v in (getattr(self, "autotune_cache_info", None) or {}).items()},
                       "static": bool(static()) if callable(static) else None,
                       "compile_results": len(getattr(self, "compile_results", None) or [])})
        return out

    setattr(cls, "coordinate_descent_tuning", descended)  # noqa: B010 - a method replaced on its class
    recheck = getattr(cls, "recheck_autotune_cache", None)
    if recheck is not None:
        def rechecked(self: Any, *args: Any, **kwargs: Any) -> Any:
            before = [str(r.config) for r in getattr(self, "compile_results", None) or []]
            out = recheck(self, *args, **kwargs)
            events.append({"event": "recheck", "file": os.path.basename(getattr(self, "filename", "") or ""),
                           "configs_before": before,
                           "configs_after": [str(r.config) for r in getattr(self, "compile_results", None) or []],
                           "cache_info": {k: str(v) for k, v in (getattr(self, "autotune_cache_info", None) or {}).items()}})
            return out

        setattr(cls, "recheck_autotune_cache", rechecked)  # noqa: B010


def child(kernel: str, dtype: str, folder: str, settings: dict[str, Any], modes: list[str]) -> dict[str, Any]:
    """One process's compilations of ``kernel`` into ``folder`` under ``settings``, with what
    the autotune cache and coordinate descent did."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    from evaluators import peer_compile

    events: list[dict[str, Any]] = []
    _instrument(events)
    known = {k: v for k, v in settings.items() if hasattr(inductor_config, k)}
    start = time.perf_counter()
    with inductor_config.patch(known):
        report = peer_compile.compile_kernel(kernel, dtype, "search", folder, modes)
    best = {}
    for path in sorted(Path(folder).rglob("*.best_config")):
        try:
            best[str(path.relative_to(folder))] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            best[str(path.relative_to(folder))] = f"unreadable: {exc}"
    return {"seconds": round(time.perf_counter() - start, 2), "settings_applied": known,
            "settings_unknown": sorted(set(settings) - set(known)), "modes": report.get("modes"),
            "inductor_counters": {k: v for k, v in counters["inductor"].items() if "coordesc" in k or "cache" in k},
            "coordesc_s": round(sum(e["s"] for e in events if e["event"] == "coordesc"), 3),
            "events": events, "best_config_files": best}


def _run_child(kernel: str, dtype: str, folder: Path, variant: str, modes: list[str], timeout: float) -> dict[str, Any]:
    out_file = folder / "probe-result.json"
    cmd = [sys.executable, "-m", "experiments.coordesc_probe", "--child", "--variant", variant, "--dtype", dtype,
           "--folder", str(folder), "--modes", ",".join(modes), "--out", str(out_file), kernel]
    # One compile thread, as in the loops and the compile-ahead processes: every lookup in this process.
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = round(time.perf_counter() - start, 2)
    if done.returncode != 0 or not out_file.exists():
        return {"error": f"rc {done.returncode}", "stderr": done.stderr[-3000:], "wall_s": wall}
    result = json.loads(out_file.read_text())
    out_file.unlink()
    result["wall_s"] = wall
    return result


def _brief(result: dict[str, Any]) -> str:
    if "error" in result:
        return str(result["error"])
    return f"{result['wall_s']} s, coordesc {result['coordesc_s']} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernels", nargs="*", default=["fused_add_rmsnorm"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    parser.add_argument("--modes", default="max-autotune-no-cudagraphs")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per process")
    parser.add_argument("--out", default="runs/diag/coordesc.json", help="the report (a child process: its result)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if args.child:
        result = child(args.kernels[0], args.dtype, args.folder, VARIANTS[args.variant], modes)
        Path(args.out).write_text(json.dumps(result))
        return 0
    import torch

    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    results: dict[str, Any] = {}
    for kernel in args.kernels:
        for variant in args.variants.split(","):
            with tempfile.TemporaryDirectory(prefix=f"coordesc-{variant}-") as tmp:
                folder = Path(tmp)
                row = {role: _run_child(kernel, args.dtype, folder, variant, modes, args.timeout)
                       for role in ("ahead", "load")}
            results[f"{kernel}/{variant}"] = row
            print(f"[coordesc] {kernel} {variant}: " + ", ".join(f"{role} {_brief(r)}" for role, r in row.items()),
                flush=True)
    meta = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "commit": git_commit(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "modes": modes}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
