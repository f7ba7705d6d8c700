"""Small text helpers for variant sources: the entry signature, bodies, headers, code lines.

The transformations work on source text, not on a C++ AST: variant files are short,
written in a plain style, and every result is compiled before it is proposed, so a
transformation that misreads an unusual source costs one dropped proposal, not a wrong one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kernels.spec import ENTRY_ATTRS

_ENTRY_RE = (
    r'extern\s+"C"\s+__global__\s+(?P<lb1>' + ENTRY_ATTRS + r')void\s+'
    r"(?P<lb2>" + ENTRY_ATTRS + r"){name}\s*\((?P<params>[^)]*)\)"
)
_LAUNCH_LINE_RE = re.compile(r"^\s*//\s*launch\s*:.*$", re.MULTILINE)


@dataclass(frozen=True)
class Entry:
    """Where the entry point sits in a source: signature, parameter text and body span."""

    start: int  # index of `extern`
    params_start: int
    params_end: int
    body_open: int  # index of the `{` that opens the body
    body_close: int  # index of the matching `}`
    has_launch_bounds: bool

    def params(self, source: str) -> list[str]:
        return [p.strip() for p in source[self.params_start : self.params_end].split(",") if p.strip()]


def find_entry(source: str, name: str) -> Entry | None:
    """Locates ``extern "C" __global__ void name(...) { ... }``; None when absent or odd."""
    # The definition: a forward declaration (the signature and ``;``) may come first.
    m = next((d for d in re.finditer(_ENTRY_RE.format(name=re.escape(name)), source)
              if not source[d.end():].lstrip().startswith(";")), None)
    if m is None:
        return None
    brace = source.find("{", m.end())
    if brace < 0 or source[m.end() : brace].strip():
        return None
    close = match_brace(source, brace)
    if close is None:
        return None
    return Entry(
        start=m.start(),
        params_start=m.start("params"),
        params_end=m.end("params"),
        body_open=brace,
        body_close=close,
        has_launch_bounds="__launch_bounds__" in m.group("lb1") + m.group("lb2"),
    )


def match_brace(text: str, open_idx: int) -> int | None:
    """Index of the bracket closing ``text[open_idx]`` (one of ``{([``), skipping comments."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    opener = text[open_idx]
    closer = pairs[opener]
    depth, i = 0, open_idx
    while i < len(text):
        if text.startswith("//", i):
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 2
            continue
        c = text[i]
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def map_code(source: str, fn: Callable[[str], str]) -> str:
    """Applies ``fn`` to the code part of every line, leaving ``//`` comments untouched.

    Header comments (launch, tune, flags) therefore never change by accident.
    """
    out = []
    for line in source.split("\n"):
        cut = line.find("//")
        if cut < 0:
            out.append(fn(line))
        else:
            out.append(fn(line[:cut]) + line[cut:])
    return "\n".join(out)


def code_only(source: str) -> str:
    """The source with ``//`` comments blanked (same length per line is not kept)."""
    return "\n".join(line.split("//", 1)[0] for line in source.split("\n"))


def launch_line(source: str) -> re.Match[str] | None:
    return _LAUNCH_LINE_RE.search(source)


def insert_header(source: str, line: str) -> str:
    """Adds a header comment line right after the ``// launch:`` line (or at the top)."""
    m = launch_line(source)
    if m is None:
        return line + "\n" + source
    return source[: m.end()] + "\n" + line + source[m.end() :]


def replace_launch(source: str, new_line: str) -> str:
    m = launch_line(source)
    if m is None:
        raise ValueError("source has no launch line")
    return source[: m.start()] + new_line + source[m.end() :]


def format_launch(grid: tuple[str, ...], block: tuple[str, ...], smem: str) -> str:
    def tup(xs: tuple[str, ...]) -> str:
        return "(" + ", ".join(xs) + ("," if len(xs) == 1 else "") + ")"

    return f"// launch: grid={tup(grid)} block={tup(block)} smem={smem}"


def guard_macro(name: str, default: int) -> str:
    """A default for a tunable macro so the file also compiles without ``-D``."""
    return f"#ifndef {name}\n#define {name} {default}\n#endif\n"


def insert_before_code(source: str, text: str) -> str:
    """Inserts ``text`` after the leading comment block (before the first code line)."""
    lines = source.split("\n")
    i = 0
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("//")):
        i += 1
    return "\n".join(lines[:i] + [text.rstrip("\n")] + lines[i:])
