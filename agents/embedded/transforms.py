"""Generic source transformations that apply to any variant of any kernel.

Each transformation takes the variant text and a :class:`Target` (entry name, shape
symbols) and returns the complete new variant file, or None when it does not apply (already
done, or the source has a shape it does not recognise). They never change the entry's
name or argument types, and they keep the launch header consistent with the code.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from agents.embedded.source import (
    code_only,
    find_entry,
    format_launch,
    guard_macro,
    insert_before_code,
    insert_header,
    map_code,
    match_brace,
    replace_launch,
)
from kernels.launch import LaunchSpecError, parse_launch_header

BLOCK_CHOICES = (128, 256, 512, 1024)
# Grid caps for grid-stride loops: 2, 4, 8 and 16 blocks per SM of a 132-SM H200.
GRID_CHOICES = (528, 264, 1056, 2112)


@dataclass(frozen=True)
class Target:
    """What a transformation needs to know about the kernel besides its source.

    Attributes:
        entry: the ``extern "C"`` entry name (the kernel name).
        symbols: the kernel's integer arguments (shape symbols usable in launch expressions).
    """

    entry: str
    symbols: tuple[str, ...]


Transform = Callable[[str, Target], "str | None"]


def add_restrict(source: str, t: Target) -> str | None:
    """Marks every pointer parameter of the entry ``__restrict__`` (no aliasing, so the
    compiler may use the read-only path and reorder loads)."""
    e = find_entry(source, t.entry)
    if e is None:
        return None
    params = e.params(source)
    new = []
    for p in params:
        if "*" in p and "__restrict__" not in p and "restrict" not in p.split():
            star = p.rfind("*")
            p = p[: star + 1] + " __restrict__ " + p[star + 1 :].lstrip()
        new.append(p)
    if new == params:
        return None
    return source[: e.params_start] + ", ".join(new) + source[e.params_end :]


def _block_bound(source: str) -> str | None:
    """The block's thread count as a compile-time expression, if it is one."""
    try:
        spec = parse_launch_header(source)
    except LaunchSpecError:
        return None
    parts = [x.text.strip() for x in spec.block]
    for p in parts:
        if not (p.isdigit() or p in spec.tune):
            return None
    worst = 1
    for p in parts:
        worst *= int(p) if p.isdigit() else max(spec.tune[p])
    if worst > 1024:
        return None
    return " * ".join(parts)


def add_launch_bounds(source: str, t: Target) -> str | None:
    """Adds ``__launch_bounds__(threads)`` when the block size is known at compile time, so
    ptxas budgets registers for exactly that many threads."""
    e = find_entry(source, t.entry)
    bound = _block_bound(source)
    if e is None or e.has_launch_bounds or bound is None:
        return None
    head = source[e.start : e.params_start]
    i = head.rfind("void")
    pos = e.start + i
    return source[:pos] + f"__launch_bounds__({bound}) " + source[pos:]


def tunable_block(source: str, t: Target) -> str | None:
    """Turns a literal 1-D block size into the tunable macro ``BLOCK``, in the launch line,
    in the grid (``cdiv(n, 256)`` style) and in the code."""
    try:
        spec = parse_launch_header(source)
    except LaunchSpecError:
        return None
    if "BLOCK" in spec.tune or len(spec.block) != 1 or not spec.block[0].text.strip().isdigit():
        return None
    lit = spec.block[0].text.strip()
    word = re.compile(rf"\b{lit}\b")
    grid = tuple(word.sub("BLOCK", g.text.strip()) for g in spec.grid)
    new = replace_launch(source, format_launch(grid, ("BLOCK",), spec.smem.text.strip()))
    values = [int(lit)] + [v for v in BLOCK_CHOICES if v != int(lit)]
    new = insert_header(new, "// tune: BLOCK=" + ",".join(str(v) for v in values))
    new = map_code(new, lambda line: word.sub("BLOCK", line))
    return insert_before_code(new, guard_macro("BLOCK", int(lit)))


def _for_loops(code: str) -> list[tuple[int, int]]:
    """(start, end) of every ``for`` statement in ``code``."""
    spans = []
    for m in re.finditer(r"\bfor\s*\(", code):
        close = match_brace(code, m.end() - 1)
        if close is None:
            continue
        j = close + 1
        while j < len(code) and code[j].isspace():
            j += 1
        if j < len(code) and code[j] == "{":
            end = match_brace(code, j)
        else:
            end = code.find(";", j)
        if end is not None and end >= 0:
            spans.append((m.start(), end))
    return spans


def add_unroll(source: str, t: Target) -> str | None:
    """Puts ``#pragma unroll 4`` before each innermost loop that has no pragma yet, so
    several iterations' loads are in flight at once."""
    spans = _for_loops(source)
    inner = [s for s in spans if not any(o != s and s[0] < o[0] <= s[1] for o in spans)]
    inserts = []
    for start, _ in inner:
        line_start = source.rfind("\n", 0, start) + 1
        if source[line_start:start].strip():  # `for` not at the start of its line
            continue
        prev_end = line_start - 1
        prev = source[source.rfind("\n", 0, max(prev_end, 0)) + 1 : max(prev_end, 0)]
        if "#pragma" in prev or "//" in source[line_start:start]:
            continue
        inserts.append((line_start, source[line_start:start]))
    if not inserts:
        return None
    for pos, indent in reversed(inserts):
        source = source[:pos] + f"{indent}#pragma unroll 4\n" + source[pos:]
    return source


_FAST_FUNCS = {"expf": "__expf", "logf": "__logf", "sinf": "__sinf", "cosf": "__cosf", "powf": "__powf",
               "exp10f": "__exp10f"}


def _fast_division(line: str) -> str:
    """``a / (1.0f + e)`` -> ``a * __fdividef(1.0f, 1.0f + e)``: the float literal marks the
    division as float. The approximate reciprocal is one MUFU.RCP; ``__frcp_rn`` (correctly
    rounded) compiled to a Newton step and a slow-path call per element, --use_fast_math or
    not (56-83 SASS instructions against 16-19 for a sigmoid, nvdisasm for sm_90), and an
    elementwise kernel at a few microseconds pays that latency once per vector."""
    pat = re.compile(r"/\s*\(\s*1\.0f\s*\+")
    m = pat.search(line)
    while m is not None:
        open_idx = line.index("(", m.start())
        close = match_brace(line, open_idx)
        if close is None:
            break
        denom = line[open_idx + 1 : close]
        line = line[: m.start()] + f"* __fdividef(1.0f, {denom})" + line[close + 1 :]
        m = pat.search(line)
    return line


def fast_math_intrinsics(source: str, t: Target) -> str | None:
    """Replaces accurate math calls by the hardware intrinsics (``expf`` -> ``__expf``, ...),
    ``1.0f / sqrtf(v)`` by ``rsqrtf(v)`` and ``a / (1.0f + e)`` by an approximate reciprocal
    multiply."""

    def edit(line: str) -> str:
        for slow, fast in _FAST_FUNCS.items():
            line = re.sub(rf"(?<![\w.]){slow}\s*\(", f"{fast}(", line)
        line = re.sub(r"1\.0f\s*/\s*sqrtf\s*\(", "rsqrtf(", line)
        return _fast_division(line)

    new = map_code(source, edit)
    return None if new == source else new


def fast_math_flag(source: str, t: Target) -> str | None:
    """Adds ``// flags: --use_fast_math`` (approximate division, sqrt, exp; flush to zero)."""
    if re.search(r"^\s*//\s*flags\s*:.*--use_fast_math", source, re.MULTILINE):
        return None
    return insert_header(source, "// flags: --use_fast_math")


_CONST_PTR_RE = re.compile(
    r"\bconst\s+(?:scalar_t|float|int|__half|__nv_bfloat16|float2|float4|uint4|int4|half2|"
    r"__half2|__nv_bfloat162|unsigned int|long long)\s*\*\s*(?:__restrict__\s+)?([A-Za-z_]\w*)"
)


def _wrap_ldg(line: str, names: set[str]) -> str:
    pat = re.compile(r"(?<![\w.&])(" + "|".join(sorted(names)) + r")\s*\[")
    pos = 0
    while True:
        m = pat.search(line, pos)
        if m is None:
            return line
        close = match_brace(line, m.end() - 1)
        if close is None:
            return line
        if line[:m.start()].rstrip().endswith("__ldg(&"):
            pos = close + 1
            continue
        expr = line[m.start() : close + 1]
        line = line[: m.start()] + f"__ldg(&{expr})" + line[close + 1 :]
        pos = m.start() + len(expr) + 8


def read_only_cache(source: str, t: Target) -> str | None:
    """Reads ``const`` pointers through ``__ldg`` (the non-coherent read-only data path)."""
    e = find_entry(source, t.entry)
    if e is None:
        return None
    names = set(_CONST_PTR_RE.findall(code_only(source)))
    if not names:
        return None
    head, body = source[: e.body_open], source[e.body_open :]
    new = head + map_code(body, lambda line: _wrap_ldg(line, names))
    return None if new == source else new


def grid_stride(source: str, t: Target) -> str | None:
    """One block per row -> a capped grid whose blocks loop over rows (``GRID`` tunable):
    fewer, longer-lived blocks amortise setup and keep every SM busy to the end."""
    e = find_entry(source, t.entry)
    try:
        spec = parse_launch_header(source)
    except LaunchSpecError:
        return None
    if e is None or len(spec.grid) != 1 or "GRID" in spec.tune:
        return None
    rows = spec.grid[0].text.strip()
    body = source[e.body_open + 1 : e.body_close]
    code = code_only(body)
    if rows not in t.symbols or re.search(r"\breturn\b|gridDim\.x", code):
        return None
    if "blockIdx.x" not in code or code_only(source).count("blockIdx.x") != code.count("blockIdx.x"):
        return None
    inner = map_code(body, lambda line: line.replace("blockIdx.x", "row_"))
    inner = "\n".join(("    " + ln) if ln.strip() else ln for ln in inner.split("\n"))
    new_body = (
        f"\n    for (int row_ = blockIdx.x; row_ < {rows}; row_ += gridDim.x) {{{inner}    }}\n"
    )
    new = source[: e.body_open + 1] + new_body + source[e.body_close :]
    grid = (f"min({rows}, GRID)",)
    new = replace_launch(new, format_launch(grid, tuple(b.text.strip() for b in spec.block), spec.smem.text.strip()))
    return insert_header(new, "// tune: GRID=" + ",".join(str(g) for g in GRID_CHOICES))


GENERIC: dict[str, Transform] = {
    "restrict": add_restrict,
    "launch_bounds": add_launch_bounds,
    "tunable_block": tunable_block,
    "unroll": add_unroll,
    "fast_math_intrinsics": fast_math_intrinsics,
    "fast_math_flag": fast_math_flag,
    "read_only_cache": read_only_cache,
    "grid_stride": grid_stride,
}
