"""compute-sanitizer's reports: the status of a tool's run and of a whole report, and the
parser that turns a tool's output into findings (what, and where: kernel, shape, launch).

Pure text processing, tested without a GPU; :mod:`evaluators.sanitize` runs the tools.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

# The launcher's lines on its stdout: where each launch starts (so a finding names its shape
# and launch), and that it got through every launch.
LAUNCH_MARK = "sanitize-launcher: launch"
LAUNCHER_DONE = "sanitize-launcher: done"
PREFIX = "========="
SUMMARY_RE = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?")
RACE_RE = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
# Banner and summary lines of compute-sanitizer that are not findings.
NOT_FINDINGS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application")
MAX_FINDINGS = 20
TAIL_CHARS = 4000


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
    """What one compute-sanitizer tool said about the launches of one run.

    Attributes:
        tool: ``memcheck``, ``racecheck`` or ``synccheck``.
        status: the outcome.
        errors: the tool's error count (from its summary line).
        warnings: racecheck's warning count (potential hazards), 0 for the others.
        findings: one line per reported problem: what, and where (kernel + offset), led by
            the shape and launch it happened in (``[shape [1, 11008] launch 2/3]``).
        message: why the run failed or timed out, else empty.
        output_tail: the end of the combined output, for a human.
        shapes: labels of the shapes the tool launched.
        launches_per_shape: launches of each shape.
    """

    tool: str
    status: SanitizerStatus
    errors: int = 0
    warnings: int = 0
    findings: tuple[str, ...] = ()
    message: str = ""
    output_tail: str = ""
    shapes: tuple[str, ...] = ()
    launches_per_shape: int = 0


@dataclass(frozen=True)
class SanitizerReport:
    """compute-sanitizer's verdicts on one variant (one run per tool).

    Attributes:
        kernel: library kernel name.
        dtype: run dtype.
        tools: one report per tool, in the order run.
        message: a note for the whole report (e.g. why the tools are unavailable).
        skipped_shapes: labels of shapes left out as too large to instrument (2^31 elements).
    """

    kernel: str
    dtype: str
    tools: tuple[ToolReport, ...] = ()
    message: str = ""
    skipped_shapes: tuple[str, ...] = ()

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
    """Each problem's first line, joined with the next line when that says where, and led by
    the launch it followed (the launcher's last ``launch`` line) when there is one."""
    out: list[str] = []
    where = ""
    for i, line in enumerate(lines):
        if line.startswith(LAUNCH_MARK):
            where = "[" + line[len(LAUNCH_MARK):].strip() + "] "
            continue
        if not line.startswith(PREFIX):
            continue
        body = line[len(PREFIX):]
        head = body.strip()
        if not head or body[:2].isspace() or head.startswith(NOT_FINDINGS):
            continue  # blank separator, an indented detail line, or a banner/summary
        if i + 1 < len(lines) and lines[i + 1].startswith(PREFIX):
            detail = lines[i + 1][len(PREFIX):].strip()
            if detail.startswith(("at ", "and ")):
                head = f"{head} {detail}"
        out.append(where + head)
    return out


def parse_output(tool: str, text: str) -> ToolReport:
    """Turns compute-sanitizer's combined output for one run into a :class:`ToolReport`.

    A run counts as CLEAN only if the tool printed its summary with no errors and the
    launcher printed that it finished; a missing summary means the run broke off.
    """
    lines = text.splitlines()
    findings = _findings(lines)
    summaries = SUMMARY_RE.findall(text)
    races = RACE_RE.findall(text)
    errors = int(summaries[-1]) if summaries else 0
    warnings = 0
    if races:
        errors = max(errors, int(races[-1][1]))
        warnings = int(races[-1][2])
    tail = text[-TAIL_CHARS:]
    kept = tuple(findings[:MAX_FINDINGS])
    if errors > 0:
        return ToolReport(tool, SanitizerStatus.FINDINGS, errors, warnings, kept, "", tail)
    if not summaries and not races:
        return ToolReport(tool, SanitizerStatus.FAILED, 0, warnings, kept,
                          f"{tool} printed no summary: the run broke off (see output_tail)", tail)
    if LAUNCHER_DONE not in text:
        return ToolReport(tool, SanitizerStatus.FAILED, 0, warnings, kept,
                          "the launcher did not finish its launch (see output_tail)", tail)
    return ToolReport(tool, SanitizerStatus.CLEAN, 0, warnings, kept, "", tail)
