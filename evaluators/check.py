"""Evaluate one variant file against its kernel's baseline.

    python -m evaluators.check --kernel silu_and_mul my_variant.cu [--json] [--shapes heldout]

Prints a per-shape table (kernel times from CUDA events around single launches, L2 flushed,
median of the repetitions, baseline and candidate interleaved) or the verdict as JSON.
Exit status: 0 for OK, 1 for any other verdict, 2 for bad arguments or no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluators.api import EvalRequest, TimingConfig
from kernels.spec import KernelSpecError, load_kernel, shape_label
from kernels.variant import Variant
from kernels.verdict import Evaluation


def _params(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"--param takes NAME=INTEGER, got {item!r}")
        out[name.strip()] = int(value)
    return out


def format_table(ev: Evaluation) -> str:
    """Per-shape table of an evaluation, with the geometric mean."""
    lines = [f"{ev.kernel} [{ev.dtype}] {ev.shape_set} shapes: {ev.status.value}"
             + (f" (guard: {ev.guard})" if ev.guard else "")]
    if ev.message:
        lines.append(f"  {ev.message}")
    if ev.params:
        lines.append("  params: " + ", ".join(f"{k}={v}" for k, v in ev.params.items()))
    if ev.shapes:
        lines.append(f"  {'shape':<22}{'baseline us':>13}{'candidate us':>14}{'speedup':>9}{'copy bw':>9}")
        for s in ev.shapes:
            lines.append(f"  {shape_label(s.shape):<22}{s.baseline_ms * 1e3:>13.2f}{s.candidate_ms * 1e3:>14.2f}"
                         f"{s.speedup:>8.3f}x{s.copy_bw_fraction:>8.0%}")
        lines.append(f"  geometric-mean speedup: {ev.speedup:.3f}x over {len(ev.shapes)} shapes"
                     + (f"; A/A noise floor {ev.noise_floor:.3f}" if ev.noise_floor else ""))
        lines.append("  times: median kernel time per launch (CUDA events, L2 flushed, interleaved A/B)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluators.check", description=__doc__.split("\n")[0])
    p.add_argument("variant", type=Path, help="variant .cu file")
    p.add_argument("--kernel", required=True, help="library kernel name or kernel folder")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--shapes", choices=("search", "heldout"), default="search")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--screen", action="store_true", help="cheap timing (5 warm-ups, 20 repetitions)")
    p.add_argument("--noise-floor", action="store_true", help="also time the baseline against itself")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.add_argument("--timeout", type=float, default=20.0, help="watchdog: seconds without progress")
    args = p.parse_args(argv)
    try:
        spec = load_kernel(args.kernel)
        source = args.variant.read_text()
        params = _params(args.param)
        if args.dtype not in spec.dtypes:
            raise ValueError(f"{spec.name} supports dtypes {list(spec.dtypes)}, not {args.dtype!r}")
    except (OSError, ValueError, KernelSpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible; evaluators.check needs one", file=sys.stderr)
        return 2
    from evaluators.gpu import GpuEvaluator

    evaluator = GpuEvaluator(step_timeout_s=args.timeout)
    try:
        request = EvalRequest(
            kernel=str(spec.directory), variant=Variant(spec.name, source, author="user"), params=params,
            dtype=args.dtype, shape_set=args.shapes,
            timing=TimingConfig.screen() if args.screen else TimingConfig.full(), noise_floor=args.noise_floor,
        )
        ev = evaluator.evaluate(request)
        if args.json:
            print(json.dumps(dict(ev.to_dict(), gpu=evaluator.info()["gpu"]), indent=2))
        else:
            print(format_table(ev))
    finally:
        evaluator.close()
    return 0 if ev.status.is_ok else 1


if __name__ == "__main__":
    sys.exit(main())
