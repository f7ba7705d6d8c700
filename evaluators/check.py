"""Evaluate one variant file against its kernel's baseline.

    python -m evaluators.check --kernel silu_and_mul my_variant.cu [--json] [--shapes heldout]
    python -m evaluators.check --kernel silu_and_mul my_variant.cu --compile-only [--json]
    python -m evaluators.check --kernel silu_and_mul my_variant.cu --cpu [--json]

Prints a per-shape table (kernel times from CUDA events around single launches, L2 flushed,
median of the repetitions, baseline and candidate interleaved) or the verdict as JSON.
``--compile-only`` runs admission alone (every static check and the sandboxed compile, no GPU
needed) and prints its verdict. ``--cpu`` runs admission, then the variant on the CPU emulator
at the two smallest shapes of the shape set (every input case, outputs against the reference;
:mod:`kernels.cpu_check`): a correctness verdict without a GPU, no timing. With ``--json`` every outcome, argument errors included, is
one JSON object on stdout. Exit status: 0 for OK, 1 for any other verdict, 2 for bad
arguments or no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from evaluators.admit import Artifact, admit
from evaluators.api import EvalRequest, TimingConfig
from evaluators.compile import DEFAULT_ARCH, CompileLimits
from kernels.cpu_check import check_on_cpu, cpu_shapes
from kernels.launch import DeviceLimits
from kernels.spec import KernelSpec, KernelSpecError, load_kernel, shape_label
from kernels.variant import Variant
from kernels.verdict import Evaluation, Status


class _ArgumentError(Exception):
    """A bad command line (argparse would print usage and exit; we report it our way)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ArgumentError(message)


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


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m evaluators.check", description=(__doc__ or "").split("\n")[0])
    p.add_argument("variant", type=Path, help="variant .cu file")
    p.add_argument("--kernel", required=True, help="library kernel name or kernel folder")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--shapes", choices=("search", "heldout"), default="search")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--screen", action="store_true", help="cheap timing (5 warm-ups, 20 repetitions)")
    p.add_argument("--noise-floor", action="store_true", help="also time the baseline against itself")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.add_argument("--timeout", type=float, default=20.0, help="watchdog: seconds without progress")
    p.add_argument("--compile-only", action="store_true",
                   help="admission only: static checks and the sandboxed compile (no GPU needed)")
    p.add_argument("--compile-timeout", type=float, default=CompileLimits().timeout_s,
                   help="wall-clock limit of the compile, seconds")
    p.add_argument("--arch", default=DEFAULT_ARCH, help="compile target with --compile-only")
    p.add_argument("--cpu", action="store_true",
                   help="admission, then correctness on the CPU emulator at small shapes (no GPU, no timing)")
    return p


def _fail(message: str, as_json: bool) -> int:
    """Reports a bad argument or a missing GPU: exit status 2."""
    if as_json:
        print(json.dumps({"error": message, "exit_code": 2}))
    else:
        print(f"error: {message}", file=sys.stderr)
    return 2


def compile_only_verdict(spec: KernelSpec, source: str, dtype: str, params: dict[str, int],
                         arch: str, limits: CompileLimits) -> dict[str, Any]:
    """Admission's verdict as a JSON-ready dict (status, message, resources, variant id)."""
    outcome = admit(spec, source, dtype, params, arch=arch, limits=DeviceLimits(), compile_limits=limits)
    verdict: dict[str, Any] = {"kernel": spec.name, "dtype": dtype, "variant_id": Variant(spec.name, source).id,
                               "arch": arch, "compile_only": True}
    if isinstance(outcome, Artifact):
        return dict(verdict, status=Status.OK.value, message="admitted: static checks and compile passed",
                    params=outcome.params, registers=outcome.registers, spill_bytes=outcome.spill_bytes,
                    stack_bytes=outcome.stack_bytes, smem_bytes=outcome.smem_bytes, compile_s=outcome.compile_s,
                    cubin_bytes=len(outcome.cubin))
    return dict(verdict, status=outcome.status.value, message=outcome.message, params=outcome.params,
                registers=None, spill_bytes=None, stack_bytes=None, smem_bytes=None,
                compile_s=outcome.compile_s, cubin_bytes=0)


def cpu_verdict(spec: KernelSpec, source: str, dtype: str, admitted: dict[str, Any], shape_set: str) -> dict[str, Any]:
    """Admission's verdict (``admitted``, status OK) followed by the CPU emulator's."""
    shapes = cpu_shapes(spec, spec.shapes(shape_set))
    ran = check_on_cpu(spec, source, dtype, admitted["params"], shapes)
    return dict(admitted, compile_only=False, cpu=True, status=ran.status.value, message=ran.message,
                guard=ran.guard, cpu_shapes=list(ran.shapes), cpu_cases=list(ran.cases))


def _print_compile_only(verdict: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps(verdict, indent=2))
    else:
        what = "on the CPU emulator (correctness only, no timing)" if verdict.get("cpu") else "compile only"
        print(f"{verdict['kernel']} [{verdict['dtype']}] {what}: {verdict['status']}"
              + (f" (guard: {verdict['guard']})" if verdict.get("guard") else ""))
        print(f"  {verdict['message']}")
        for key in ("params", "registers", "spill_bytes", "stack_bytes", "smem_bytes", "compile_s", "variant_id"):
            if verdict.get(key) not in (None, {}):
                print(f"  {key}: {verdict[key]}")
    return 0 if verdict["status"] == Status.OK.value else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv
    try:
        args = _parser().parse_args(argv)
        spec = load_kernel(args.kernel)
        source = args.variant.read_text()
        params = _params(args.param)
        if args.dtype not in spec.dtypes:
            raise ValueError(f"{spec.name} supports dtypes {list(spec.dtypes)}, not {args.dtype!r}")
        limits = CompileLimits(timeout_s=args.compile_timeout)
    except (_ArgumentError, OSError, ValueError, KernelSpecError) as exc:
        return _fail(str(exc), as_json)
    if args.compile_only or args.cpu:
        verdict = compile_only_verdict(spec, source, args.dtype, params, args.arch, limits)
        if args.cpu and verdict["status"] == Status.OK.value:
            verdict = cpu_verdict(spec, source, args.dtype, verdict, args.shapes)
        return _print_compile_only(verdict, args.json)
    import torch

    if not torch.cuda.is_available():
        return _fail("no CUDA GPU visible; evaluators.check needs one (or use --compile-only)", as_json)
    return _evaluate_on_gpu(args, spec, source, params)


def _evaluate_on_gpu(args: argparse.Namespace, spec: KernelSpec, source: str, params: dict[str, int]) -> int:
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
