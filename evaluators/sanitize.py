"""compute-sanitizer checks for winning variants: memcheck (out-of-bounds and misaligned
accesses) on every shape, racecheck (shared-memory hazards) and synccheck (barriers under
divergence) on the smallest and the largest.

Some bugs pass every output check: a read one vector past the end of a buffer lands inside
the caching allocator's block and its value goes unused. They show up only under
compute-sanitizer, which is too slow for every candidate but cheap enough for winners. An
access out of bounds may depend on the shape (a tail that only some sizes have) or on the
launch count (state kept in device memory between launches), so every shape is launched
:data:`LAUNCHES_PER_SHAPE` times, not once.

Two halves:

* a launcher, ``python -m evaluators.sanitize --kernel NAME VARIANT.cu --dtype float16
  --shapes-file S.json``, that admits the variant through :func:`evaluators.admit.admit`
  (the one door from source to binary), makes inputs for each shape, launches each several
  times and synchronises after every launch (it is the program compute-sanitizer watches);
* :func:`sanitize`, which runs that launcher under ``compute-sanitizer --tool T`` for each
  tool with a timeout that grows with the number of shapes, and parses the report into a
  :class:`SanitizerReport`. Without compute-sanitizer on the machine it returns an
  UNAVAILABLE report instead of failing.

Shapes with a tensor of 2^31 elements or more (``KernelSpec.is_huge``) are left out: one
instrumented launch over them takes minutes, and what they test (64-bit offsets) the
held-out validation already judges on the outputs. The report names the shapes it skipped.

The launcher runs with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so that every tensor is its own
device allocation (memcheck sees allocation bounds, not the allocator's blocks), and memcheck
adds padding after each allocation so that a neighbouring buffer cannot hide an overrun.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evaluators.child_env import run_environment
from evaluators.proc_group import run_group
from evaluators.sanitize_report import (
    LAUNCH_MARK,
    LAUNCHER_DONE,
    MAX_FINDINGS,
    TAIL_CHARS,
    SanitizerReport,
    SanitizerStatus,
    ToolReport,
    parse_output,
)
from kernels.folders import KernelRef

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("memcheck", "racecheck", "synccheck")
# Tools slow enough to run on the smallest and the largest shape only.
EXTREME_SHAPES_ONLY = frozenset({"racecheck", "synccheck"})
LAUNCHES_PER_SHAPE = 3
# A tool run's limit: start-up (Python, torch, CUDA context, admission through the compile
# cache) plus a share per shape; instrumented launches of ~10^8 elements take seconds each.
BASE_TIMEOUT_S = 120.0
PER_SHAPE_TIMEOUT_S = 30.0


def find_compute_sanitizer(search_dirs: Iterable[str | Path] | None = None) -> str | None:
    """Path of the compute-sanitizer executable, or None.

    Looks on PATH, then in ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin`` and ``/usr/local/cuda/bin``
    (or only in ``search_dirs`` when given).
    """
    if search_dirs is None:
        found = shutil.which("compute-sanitizer")
        if found:
            return found
        roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
        search_dirs = [Path(r) / "bin" for r in roots if r]
    for d in search_dirs:
        candidate = Path(d) / "compute-sanitizer"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _command(exe: str, tool: str, entry: str, folder: str, path: Path, dtype: str, shapes_file: Path,
             params: Mapping[str, int] | None, launches: int) -> list[str]:
    """The tool's command line: ``entry`` is the kernel's entry symbol (what is instrumented),
    ``folder`` the kernel folder the launcher loads (already found on this machine)."""
    cmd = [exe, "--tool", tool, "--report-api-errors", "no", "--print-limit", str(MAX_FINDINGS),
           # Only our kernel is instrumented: torch's own kernels stay fast and out of the report.
           "--kernel-name", f"kernel_substring={entry}"]
    if tool == "memcheck":
        cmd += ["--padding", "4096"]
    cmd += [sys.executable, "-m", "evaluators.sanitize", "--kernel", folder, str(path), "--dtype", dtype,
            "--shapes-file", str(shapes_file), "--launches", str(launches)]
    for k, v in (params or {}).items():
        cmd += ["--param", f"{k}={v}"]
    return cmd


def _run(cmd: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Runs a command in its own process group; returns (exit code or None on timeout, output).
    compute-sanitizer runs the launcher as its child: a timeout ends the whole group."""
    # The launcher runs the candidate: an allow-listed environment (no secrets), as the worker's.
    env = run_environment({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "PYTHONUNBUFFERED": "1"})
    rc, out, _ = run_group(cmd, env=env, cwd=ROOT, timeout_s=timeout_s, merge_stderr=True)
    return rc, out


@dataclass(frozen=True)
class ShapePlan:
    """Which shapes each tool launches.

    Attributes:
        every: all shapes to check (memcheck), smallest first, without repeats.
        extremes: the smallest and the largest of them (racecheck, synccheck).
        skipped: shapes left out as too large to instrument (``KernelSpec.is_huge``).
    """

    every: tuple[dict[str, int], ...]
    extremes: tuple[dict[str, int], ...]
    skipped: tuple[dict[str, int], ...]

    def for_tool(self, tool: str) -> tuple[dict[str, int], ...]:
        return self.extremes if tool in EXTREME_SHAPES_ONLY else self.every


def plan_shapes(spec: Any, extra: Iterable[Mapping[str, int]] = (), include_huge: bool = False) -> ShapePlan:
    """The spec's search and held-out shapes plus ``extra`` (the run's drawn held-out shapes),
    ordered by the size of their largest tensor; huge shapes are skipped unless asked for."""
    seen: dict[tuple[tuple[str, int], ...], dict[str, int]] = {}
    for shape in (*spec.search_shapes, *spec.heldout_shapes, *extra):
        seen.setdefault(tuple(sorted((k, int(v)) for k, v in shape.items())), dict(shape))
    sized = sorted(seen.values(), key=lambda s: (spec.largest_tensor_elements(s), sorted(s.items())))
    skipped = tuple(s for s in sized if not include_huge and spec.is_huge(s))
    every = tuple(s for s in sized if s not in skipped)
    extremes = every if len(every) <= 2 else (every[0], every[-1])
    return ShapePlan(every, extremes, skipped)


def tool_timeout_s(shape_count: int, launches: int = LAUNCHES_PER_SHAPE) -> float:
    """The limit of one tool run over ``shape_count`` shapes of ``launches`` launches each."""
    return BASE_TIMEOUT_S + PER_SHAPE_TIMEOUT_S * shape_count * max(1, launches) / LAUNCHES_PER_SHAPE


def _unavailable(kernel: str, dtype: str, tools: Sequence[str], exe: str | None) -> SanitizerReport:
    why = f"compute-sanitizer not found ({exe or 'not on PATH, CUDA_HOME or /usr/local/cuda'})"
    return SanitizerReport(kernel, dtype, tuple(ToolReport(t, SanitizerStatus.UNAVAILABLE, message=why)
                                                for t in tools), why)


def sanitize(
    kernel: KernelRef | str,
    source: str,
    dtype: str = "float16",
    tools: Sequence[str] = TOOLS,
    timeout_s: float | None = None,
    shape: Mapping[str, int] | None = None,
    params: Mapping[str, int] | None = None,
    executable: str | None = None,
    shapes: Iterable[Mapping[str, int]] = (),
    launches: int = LAUNCHES_PER_SHAPE,
) -> SanitizerReport:
    """Runs a variant under each compute-sanitizer tool, every shape launched several times.

    Args:
        kernel: the kernel's reference (folder and digest), or a library kernel name or folder.
        source: the variant file's text.
        dtype: run dtype.
        tools: compute-sanitizer tools to run, each in its own process, all at once.
        timeout_s: limit per tool run; default :func:`tool_timeout_s` of its shape count.
        shape: launch this one shape only (every tool); default: see ``shapes``.
        params: tunable parameters; missing ones take their defaults.
        executable: the compute-sanitizer to use; default: :func:`find_compute_sanitizer`.
        shapes: shapes added to the spec's search and held-out shapes (the held-out shapes
            drawn for the run). memcheck launches all of them, racecheck and synccheck the
            smallest and the largest; shapes of 2^31 elements or more are skipped.
        launches: launches of each shape, each followed by a synchronisation.

    Returns:
        One :class:`ToolReport` per tool; every tool UNAVAILABLE if there is no sanitizer.

    Raises:
        ValueError: an unknown tool name.
    """
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise ValueError(f"unknown sanitizer tool(s) {unknown}; known: {list(TOOLS)}")
    exe = executable or find_compute_sanitizer()
    if not exe or not Path(exe).is_file():
        return _unavailable(kernel.name if isinstance(kernel, KernelRef) else kernel, dtype, tools, exe)
    from kernels.spec import load_kernel, shape_label

    spec = load_kernel(kernel)  # the launcher gets the folder found here, not the name
    plan = ShapePlan((dict(shape),), (dict(shape),), ()) if shape else plan_shapes(spec, shapes)
    with tempfile.TemporaryDirectory(prefix="sanitize-") as tmp:
        path = Path(tmp) / "variant.cu"
        path.write_text(source)

        def run_tool(tool: str) -> ToolReport:
            chosen = plan.for_tool(tool)
            shapes_file = Path(tmp) / f"{tool}-shapes.json"
            shapes_file.write_text(json.dumps(list(chosen)))
            limit_s = timeout_s if timeout_s is not None else tool_timeout_s(len(chosen), launches)
            command = _command(exe, tool, spec.name, str(spec.directory), path, dtype, shapes_file, params, launches)
            code, out = _run(command, limit_s)
            if code is None:
                report = ToolReport(tool, SanitizerStatus.TIMEOUT, message=f"no result within {limit_s:.0f} s",
                                    output_tail=out[-TAIL_CHARS:])
            else:
                report = parse_output(tool, out)
            return replace(report, shapes=tuple(shape_label(s) for s in chosen), launches_per_shape=launches)

        # The tools at once, each in its own process: most of a tool run is its process's
        # start-up (Python, torch, a CUDA context under instrumentation, admission), not GPU
        # work, so the report comes in the time of the slowest tool rather than their sum.
        with ThreadPoolExecutor(max_workers=max(1, len(tools)), thread_name_prefix="sanitize") as tpe:
            reports = list(tpe.map(run_tool, tools))
    skipped = tuple(shape_label(s) for s in plan.skipped)
    note = f"skipped (2^31 elements or more): {', '.join(skipped)}" if skipped else ""
    return SanitizerReport(spec.name, dtype, tuple(reports), note, skipped)


# -- the launcher (runs under compute-sanitizer) -------------------------------------------
def smallest_shape(spec: Any) -> dict[str, int]:
    """The kernel's shape with the fewest elements in its largest tensor (search and
    held-out shapes)."""
    return plan_shapes(spec).every[0]


def _pairs(text: str | None, what: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise SystemExit(f"{what} entries look like NAME=INT, got {item!r}")
        out[name.strip()] = int(value)
    return out


@dataclass
class _Plan:
    spec: Any
    shapes: list[dict[str, int]]
    artifact: Any = field(repr=False, default=None)
    launches: dict[str, Any] = field(default_factory=dict)


def _shapes(args: argparse.Namespace, spec: Any) -> list[dict[str, int]]:
    """The shapes asked for, each checked against the spec (symbols, sizes, alignment)."""
    if args.shapes_file:
        shapes = [{k: int(v) for k, v in s.items()} for s in json.loads(Path(args.shapes_file).read_text())]
    else:
        shapes = [_pairs(args.shape, "--shape")] if args.shape else [smallest_shape(spec)]
    for shape in shapes:
        spec.check_shape(shape)
    return shapes


def _prepare(args: argparse.Namespace) -> _Plan | str:
    """Everything that needs no GPU: admission (header, signature, limits, compile)."""
    from evaluators.admit import Refusal, admit
    from evaluators.compile import target_arch
    from kernels.launch import DeviceLimits, LaunchSpecError
    from kernels.spec import KernelSpecError, load_kernel

    source = Path(args.variant).read_text()
    try:
        spec = load_kernel(args.kernel)
        shapes = _shapes(args, spec)
    except KernelSpecError as exc:
        return f"refused: {exc}"
    params = _pairs(",".join(args.param), "--param")
    artifact = admit(spec, source, args.dtype, params, arch=target_arch(), shapes=shapes)
    if isinstance(artifact, Refusal):
        kind = "compile error" if artifact.compile_key else "refused"
        return f"{kind}: {artifact.message}"
    try:
        launches = artifact.launches(shapes, DeviceLimits())
    except LaunchSpecError as exc:
        return f"refused: {exc}"
    return _Plan(spec, shapes, artifact, launches)


def _launch_all(plan: _Plan, dtype: str, launches: int) -> None:
    """Every shape: fresh inputs, outputs poisoned, ``launches`` launches each followed by a
    synchronisation (so a fault is reported against the launch that made it)."""
    import torch

    from evaluators.launcher import Kernel
    from kernels.spec import shape_label

    device = torch.device("cuda", torch.cuda.current_device())
    kernel = Kernel(plan.artifact.cubin, plan.spec, plan.launches)
    for shape in plan.shapes:
        label = shape_label(shape)
        cfg = plan.launches[label]
        print(f"sanitize-launcher: {plan.spec.name} shape {shape} params {plan.artifact.params} "
              f"grid {cfg.grid} block {cfg.block} smem {cfg.smem_bytes}", flush=True)
        gen = torch.Generator(device=device).manual_seed(0)
        tensors = plan.spec.make_inputs(shape, getattr(torch, dtype), gen, "random", device)
        for a in plan.spec.written_args:
            if a.role == "out" and tensors[a.name].dtype.is_floating_point:
                tensors[a.name].fill_(float("nan"))  # unwritten outputs stay visible, as in validation
        torch.cuda.synchronize()
        args = kernel.args(tensors, shape)
        for k in range(1, launches + 1):
            print(f"{LAUNCH_MARK} shape {label} launch {k}/{launches}", flush=True)
            kernel.launch(label, args)
            torch.cuda.synchronize()
        del tensors, args  # freed at once (no caching allocator): the next shape gets fresh memory


def main(argv: Sequence[str] | None = None) -> int:
    """Launcher entry point. Exit codes: 0 launched, 1 a launch failed, 2 refused or
    compile error, 3 no CUDA GPU."""
    parser = argparse.ArgumentParser(prog="python -m evaluators.sanitize", description=main.__doc__)
    parser.add_argument("--kernel", required=True, help="library kernel name or kernel folder")
    parser.add_argument("variant", help="the variant .cu file")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--shape", help="e.g. num_tokens=4,d=1024 (default: the smallest shape)")
    parser.add_argument("--shapes-file", help="a JSON list of shapes to launch, in order")
    parser.add_argument("--launches", type=int, default=LAUNCHES_PER_SHAPE, help="launches per shape")
    parser.add_argument("--param", action="append", default=[], help="tunable NAME=INT (repeatable)")
    args = parser.parse_args(argv)
    plan = _prepare(args)
    if isinstance(plan, str):
        print(f"sanitize-launcher: {plan}", flush=True)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("sanitize-launcher: compiled; launching needs a CUDA GPU", flush=True)
        return 3
    try:
        _launch_all(plan, args.dtype, max(1, args.launches))
    except Exception as exc:  # the fault itself is what the sanitizer report describes
        print(f"sanitize-launcher: launch failed: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(LAUNCHER_DONE, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
