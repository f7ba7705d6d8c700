"""compute-sanitizer checks for winning variants: memcheck (out-of-bounds and misaligned
accesses) and racecheck (shared-memory hazards).

Some bugs pass every output check: a read one vector past the end of a buffer lands inside
the caching allocator's block and its value goes unused. They show up only under
compute-sanitizer, which is too slow for every candidate but cheap enough for winners.

Two halves:

* a launcher, ``python -m evaluators.sanitize --kernel NAME VARIANT.cu --dtype float16``,
  that compiles the variant, makes inputs for one small shape, launches once and
  synchronises (it is the program compute-sanitizer watches);
* :func:`sanitize`, which runs that launcher under ``compute-sanitizer --tool T`` for each
  tool with a timeout, and parses the report into a :class:`SanitizerReport`. Without
  compute-sanitizer on the machine it returns an UNAVAILABLE report instead of failing.

The launcher runs with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so that every tensor is its own
device allocation (memcheck sees allocation bounds, not the allocator's blocks), and memcheck
adds padding after each allocation so that a neighbouring buffer cannot hide an overrun.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("memcheck", "racecheck")
LAUNCHER_DONE = "sanitize-launcher: done"
_PREFIX = "========="
_SUMMARY_RE = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?")
_RACE_RE = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
# Banner and summary lines of compute-sanitizer that are not findings.
_NOT_FINDINGS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application")
_MAX_FINDINGS = 20
_TAIL_CHARS = 4000


class SanitizerStatus(StrEnum):
    """Outcome of one tool's run (and, worst first, of the whole report)."""

    FINDINGS = "FINDINGS"  # the tool reported errors
    TIMEOUT = "TIMEOUT"  # the run did not finish in time
    FAILED = "FAILED"  # the launcher or the tool failed before a verdict (message says why)
    UNAVAILABLE = "UNAVAILABLE"  # no compute-sanitizer on this machine
    CLEAN = "CLEAN"  # the tool ran to completion and reported nothing


_SEVERITY = [SanitizerStatus.FINDINGS, SanitizerStatus.TIMEOUT, SanitizerStatus.FAILED,
             SanitizerStatus.UNAVAILABLE, SanitizerStatus.CLEAN]


@dataclass(frozen=True)
class ToolReport:
    """What one compute-sanitizer tool said about one launch.

    Attributes:
        tool: ``memcheck`` or ``racecheck``.
        status: the outcome.
        errors: the tool's error count (from its summary line).
        warnings: racecheck's warning count (potential hazards), 0 for memcheck.
        findings: one line per reported problem: what, and where (kernel + offset).
        message: why the run failed or timed out, else empty.
        output_tail: the end of the combined output, for a human.
    """

    tool: str
    status: SanitizerStatus
    errors: int = 0
    warnings: int = 0
    findings: tuple[str, ...] = ()
    message: str = ""
    output_tail: str = ""


@dataclass(frozen=True)
class SanitizerReport:
    """compute-sanitizer's verdicts on one variant (one launch per tool).

    Attributes:
        kernel: library kernel name.
        dtype: run dtype.
        tools: one report per tool, in the order run.
        message: a note for the whole report (e.g. why the tools are unavailable).
    """

    kernel: str
    dtype: str
    tools: tuple[ToolReport, ...] = ()
    message: str = ""

    @property
    def status(self) -> SanitizerStatus:
        """The worst status over the tools (FINDINGS first); CLEAN when every tool is."""
        present = {t.status for t in self.tools}
        return next((s for s in _SEVERITY if s in present), SanitizerStatus.CLEAN)

    @property
    def clean(self) -> bool:
        return bool(self.tools) and self.status is SanitizerStatus.CLEAN

    def tool(self, name: str) -> ToolReport:
        for t in self.tools:
            if t.tool == name:
                return t
        raise KeyError(f"no {name} report; ran: {[t.tool for t in self.tools]}")

    def summary(self) -> str:
        """One line per tool, for logs and for the planner."""
        lines = []
        for t in self.tools:
            first = f": {t.findings[0]}" if t.findings else (f": {t.message}" if t.message else "")
            lines.append(f"{t.tool} {t.status.value} ({t.errors} errors){first}")
        return "\n".join(lines) or self.message

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        for t in d["tools"]:
            t["status"] = t["status"].value
        return d


# -- parsing ------------------------------------------------------------------------------
def _findings(lines: Sequence[str]) -> list[str]:
    """Each problem's first line, joined with the next line when that says where."""
    out: list[str] = []
    for i, line in enumerate(lines):
        if not line.startswith(_PREFIX):
            continue
        body = line[len(_PREFIX):]
        head = body.strip()
        if not head or body[:2].isspace() or head.startswith(_NOT_FINDINGS):
            continue  # blank separator, an indented detail line, or a banner/summary
        if i + 1 < len(lines) and lines[i + 1].startswith(_PREFIX):
            detail = lines[i + 1][len(_PREFIX):].strip()
            if detail.startswith(("at ", "and ")):
                head = f"{head} {detail}"
        out.append(head)
    return out


def parse_output(tool: str, text: str) -> ToolReport:
    """Turns compute-sanitizer's combined output for one run into a :class:`ToolReport`.

    A run counts as CLEAN only if the tool printed its summary with no errors and the
    launcher printed that it finished; a missing summary means the run broke off.
    """
    lines = text.splitlines()
    findings = _findings(lines)
    summaries = _SUMMARY_RE.findall(text)
    races = _RACE_RE.findall(text)
    errors = int(summaries[-1]) if summaries else 0
    warnings = 0
    if races:
        errors = max(errors, int(races[-1][1]))
        warnings = int(races[-1][2])
    tail = text[-_TAIL_CHARS:]
    kept = tuple(findings[:_MAX_FINDINGS])
    if errors > 0:
        return ToolReport(tool, SanitizerStatus.FINDINGS, errors, warnings, kept, "", tail)
    if not summaries and not races:
        return ToolReport(tool, SanitizerStatus.FAILED, 0, warnings, kept,
                          f"{tool} printed no summary: the run broke off (see output_tail)", tail)
    if LAUNCHER_DONE not in text:
        return ToolReport(tool, SanitizerStatus.FAILED, 0, warnings, kept,
                          "the launcher did not finish its launch (see output_tail)", tail)
    return ToolReport(tool, SanitizerStatus.CLEAN, 0, warnings, kept, "", tail)


# -- running ------------------------------------------------------------------------------
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


def _command(exe: str, tool: str, kernel: str, path: Path, dtype: str,
             shape: Mapping[str, int] | None, params: Mapping[str, int] | None) -> list[str]:
    cmd = [exe, "--tool", tool, "--report-api-errors", "no", "--print-limit", str(_MAX_FINDINGS),
           # Only our kernel is instrumented: torch's own kernels stay fast and out of the report.
           "--kernel-name", f"kernel_substring={kernel}"]
    if tool == "memcheck":
        cmd += ["--padding", "4096"]
    cmd += [sys.executable, "-m", "evaluators.sanitize", "--kernel", kernel, str(path), "--dtype", dtype]
    if shape:
        cmd += ["--shape", ",".join(f"{k}={v}" for k, v in shape.items())]
    for k, v in (params or {}).items():
        cmd += ["--param", f"{k}={v}"]
    return cmd


def _run(cmd: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Runs a command in its own process group; returns (exit code or None on timeout, output)."""
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        # compute-sanitizer runs the launcher as its child: end the whole group, not one process.
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out or ""


def sanitize(
    kernel: str,
    source: str,
    dtype: str = "float16",
    tools: Sequence[str] = TOOLS,
    timeout_s: float = 600.0,
    shape: Mapping[str, int] | None = None,
    params: Mapping[str, int] | None = None,
    executable: str | None = None,
) -> SanitizerReport:
    """Runs one launch of a variant under each compute-sanitizer tool.

    Args:
        kernel: library kernel name (or kernel folder).
        source: the variant file's text.
        dtype: run dtype.
        tools: compute-sanitizer tools to run, each in its own process.
        timeout_s: limit per tool run (instrumented launches are slow).
        shape: the shape to launch; default: the kernel's smallest shape.
        params: tunable parameters; missing ones take their defaults.
        executable: the compute-sanitizer to use; default: :func:`find_compute_sanitizer`.

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
        why = f"compute-sanitizer not found ({exe or 'not on PATH, CUDA_HOME or /usr/local/cuda'})"
        return SanitizerReport(kernel, dtype, tuple(ToolReport(t, SanitizerStatus.UNAVAILABLE, message=why)
                                                    for t in tools), why)
    reports = []
    with tempfile.TemporaryDirectory(prefix="sanitize-") as tmp:
        path = Path(tmp) / "variant.cu"
        path.write_text(source)
        for tool in tools:
            code, out = _run(_command(exe, tool, kernel, path, dtype, shape, params), timeout_s)
            if code is None:
                reports.append(ToolReport(tool, SanitizerStatus.TIMEOUT, message=f"no result within {timeout_s:.0f} s",
                                          output_tail=out[-_TAIL_CHARS:]))
            else:
                reports.append(parse_output(tool, out))
    return SanitizerReport(kernel, dtype, tuple(reports))


# -- the launcher (runs under compute-sanitizer) -------------------------------------------
def smallest_shape(spec: Any) -> dict[str, int]:
    """The kernel's shape with the fewest elements (search and held-out shapes)."""
    def size(shape: dict[str, int]) -> int:
        n = 1
        for v in shape.values():
            n *= int(v)
        return n

    shapes = [dict(s) for s in (*spec.search_shapes, *spec.heldout_shapes)]
    return min(shapes, key=size)


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
    shape: dict[str, int]
    params: dict[str, int]
    config: Any
    cubin: bytes = field(repr=False, default=b"")


def _prepare(args: argparse.Namespace) -> _Plan | str:
    """Everything that needs no GPU: launch header, signature, shape, compile."""
    from evaluators.compile import compile_variant, target_arch
    from kernels.launch import LaunchSpecError, parse_launch_header
    from kernels.spec import KernelSpecError, check_signature, load_kernel

    source = Path(args.variant).read_text()
    try:
        spec = load_kernel(args.kernel)
        launch = parse_launch_header(source)
        spec.check_launch(launch)
        params = launch.validate_params(_pairs(",".join(args.param), "--param"))
        check_signature(spec, source)
        shape = _pairs(args.shape, "--shape") if args.shape else smallest_shape(spec)
        config = launch.resolve(shape, params)
    except (LaunchSpecError, KernelSpecError) as exc:
        return f"refused: {exc}"
    result = compile_variant(source, spec.name, args.dtype, params, target_arch())
    if not result.ok:
        return f"compile error:\n{result.log}"
    return _Plan(spec, shape, params, config, result.cubin)


def _launch_once(plan: _Plan, dtype: str) -> None:
    import torch

    from evaluators.launcher import Kernel
    from kernels.spec import shape_label

    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(0)
    tensors = plan.spec.make_inputs(plan.shape, getattr(torch, dtype), gen, "random", device)
    for a in plan.spec.written_args:
        if a.role == "out" and tensors[a.name].dtype.is_floating_point:
            tensors[a.name].fill_(float("nan"))  # unwritten outputs stay visible, as in validation
    torch.cuda.synchronize()
    label = shape_label(plan.shape)
    kernel = Kernel(plan.cubin, plan.spec, {label: plan.config})
    kernel.launch(label, kernel.args(tensors, plan.shape))
    torch.cuda.synchronize()


def main(argv: Sequence[str] | None = None) -> int:
    """Launcher entry point. Exit codes: 0 launched, 1 the launch failed, 2 refused or
    compile error, 3 no CUDA GPU."""
    parser = argparse.ArgumentParser(prog="python -m evaluators.sanitize", description=main.__doc__)
    parser.add_argument("--kernel", required=True, help="library kernel name or kernel folder")
    parser.add_argument("variant", help="the variant .cu file")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--shape", help="e.g. num_tokens=4,d=1024 (default: the smallest shape)")
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
    cfg = plan.config
    print(f"sanitize-launcher: {plan.spec.name} shape {plan.shape} params {plan.params} "
          f"grid {cfg.grid} block {cfg.block} smem {cfg.smem_bytes}", flush=True)
    try:
        _launch_once(plan, args.dtype)
    except Exception as exc:  # the fault itself is what the sanitizer report describes
        print(f"sanitize-launcher: launch failed: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(LAUNCHER_DONE, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
