"""Static checks of a variant: its source before NVRTC sees it, its binary after.

Source: every preprocessor route to the file system is refused before compiling. The checks
read the source the way the preprocessor does (trigraphs, line splices, comments, every
whitespace class it accepts between ``#`` and a directive name) and refuse by class: only the
directives a kernel needs, ``#include`` only of a literal name from the allowed list, no
``__has_include``, ``_Pragma`` or token pasting (which could assemble either), no stray
backslashes or control characters. Where the compiler and this reading could disagree,
the checks take the reading that shows more text, so a disagreement refuses an honest
source rather than admitting a hostile one.

Binary: the cubin's symbol table shows every call the kernel makes into the device runtime
(``vprintf`` for ``printf``, ``malloc``/``free`` for the device heap, ``__assertfail``), and
its ``.nv.info`` attributes the per-thread stack frames, whatever macros spelt them.
"""

from __future__ import annotations

import re
import struct

# Headers a variant may include; anything else could read files of the harness at compile time.
# Only headers NVRTC itself can find: it ships no C library headers (stdint.h, float.h, ...).
ALLOWED_INCLUDES = frozenset({"cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "math_constants.h"})
# The C library's floating-point and integer limits that nvcc's kernels get through the host
# <math.h>, <float.h> and <limits.h> (which NVRTC has not): kernels.nvrtc's prelude defines
# each where the kernel has not, so a kernel written for nvcc that uses INFINITY or FLT_MAX
# compiles here unchanged, and a refused include of those headers names them.
C_LIMITS = {
    "INFINITY": "__int_as_float(0x7f800000)",
    "NAN": "__int_as_float(0x7fffffff)",
    "HUGE_VALF": "__int_as_float(0x7f800000)",
    "FLT_MAX": "3.40282347e+38F",
    "FLT_MIN": "1.17549435e-38F",
    "FLT_EPSILON": "1.19209290e-07F",
    "DBL_MAX": "1.7976931348623157e+308",
    "INT_MAX": "2147483647",
    "INT_MIN": "(-2147483647 - 1)",
}
# Directives a kernel needs; any other (#include_next, #import, #embed, #line, #ident, GCC's
# '# 1 "file"' line markers, ...) is refused.
ALLOWED_DIRECTIVES = frozenset({
    "define", "undef", "if", "ifdef", "ifndef", "elif", "elifdef", "elifndef", "else", "endif",
    "include", "pragma", "error", "warning",
})
# Pragmas that only steer code generation or diagnostics; others (GCC dependency, include_alias,
# push_macro tricks, ...) could name files or change what the checks saw.
ALLOWED_PRAGMAS = frozenset({
    "unroll", "nounroll", "nv_diag_suppress", "nv_diag_warning", "nv_diag_error", "nv_diag_default",
    "nv_diag_once", "diag_suppress", "diag_warning", "diag_error", "diag_default",
})
# Directive names that read files; checked even inside comments (see check_source_routes).
_FILE_DIRECTIVES = re.compile(r"include\w*|import|embed")
# Identifiers that probe or reach files, or run a pragma from inside a macro expansion.
_FORBIDDEN_IDENT = re.compile(r"__has_include\w*|__has_embed|_Pragma|__pragma")
MAX_SOURCE_BYTES = 1 << 20  # the library's largest variant is ~20 KB

_TRIGRAPHS = {"=": "#", "/": "\\", "'": "^", "(": "[", ")": "]", "!": "|", "<": "{", ">": "}", "-": "~"}
_TRIGRAPH_RE = re.compile(r"\?\?([=/'()!<>-])")
# Bytes the preprocessor may skip as whitespace (GCC ignores NUL) or treat as line ends.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]|\r(?!\n)")
_HSPACE = r"[ \t\f\v]"
_DIRECTIVE_RE = re.compile(rf"^{_HSPACE}*(?:#|%:){_HSPACE}*([A-Za-z_]\w*)?(.*)$", re.MULTILINE)
_INCLUDE_OPERAND_RE = re.compile(rf'^{_HSPACE}*(?:<([^<>"\n]+)>|"([^<>"\n]+)")')
_IDENT_RE = re.compile(r"[A-Za-z_$][\w$]*")
_PASTE_RE = re.compile(r"##|%:%:|#%:|%:#")
# The tokens that decide where a comment starts: raw strings (which span lines), identifiers,
# numbers (with ' digit separators), string and character literals, then the two comments.
# Tokenising in the compiler's order keeps a '/*' inside a literal from hiding a directive; a
# literal left open runs to the end of its line, so a '/*' after it hides nothing either.
_TOKEN_RE = re.compile(
    r"""(?P<raw>(?:u8|[uUL])?R"(?P<delim>[^()\\\s"]{0,16})\(.*?\)(?P=delim)")"""
    r"|[A-Za-z_$][\w$]*"
    r"|\.?\d(?:[eEpP][+-]|'\w|[\w.])*"
    r'|(?P<str>"(?:\\.|[^"\\\n])*(?:"|$))'
    r"|(?P<chr>'(?:\\.|[^'\\\n])*(?:'|$))"
    r"|(?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))",
    re.DOTALL | re.MULTILINE,
)


class CompileRefused(ValueError):
    """The source asks for something the compiler is not allowed to do (include, flag)."""


def _translated(source: str) -> str:
    """Translation phases 1-2: trigraphs replaced (C++17 dropped them; replacing is the
    reading that shows more directives), then line splices joined."""
    if len(source.encode()) > MAX_SOURCE_BYTES:
        raise CompileRefused(f"source of {len(source.encode())} bytes exceeds {MAX_SOURCE_BYTES}")
    bad = _CONTROL_RE.search(source)
    if bad:
        raise CompileRefused(
            f"control character {bad.group(0)!r} at offset {bad.start()} is not allowed "
            "(only tab, newline, CRLF, form feed and vertical tab)"
        )
    text = _TRIGRAPH_RE.sub(lambda m: _TRIGRAPHS[m.group(1)], source).replace("\r\n", "\n")
    if re.search(rf"\\{_HSPACE}+\n", text):
        # GCC joins such lines, other front ends do not: either reading could hide a directive.
        raise CompileRefused("a backslash followed by spaces before the line end is not allowed")
    return text.replace("\\\n", "")


def _views(text: str) -> tuple[str, str]:
    """(directive view, code view): comments blanked (keeping their line breaks), and in the
    code view string and character literals emptied too."""

    def directive(m: re.Match[str]) -> str:
        return " " + "\n" * m.group(0).count("\n") if m.group("comment") else m.group(0)

    def code(m: re.Match[str]) -> str:
        if m.group("comment") or m.group("raw") or m.group("str") or m.group("chr"):
            return " " + "\n" * m.group(0).count("\n")
        return m.group(0)

    return _TOKEN_RE.sub(directive, text), _TOKEN_RE.sub(code, text)


def _refuse_directive(name: str, rest: str) -> None:
    shown = f"#{name}{rest}".strip()
    if name == "include":
        m = _INCLUDE_OPERAND_RE.match(rest)
        header = (m.group(1) or m.group(2)).strip() if m else ""
        if header not in ALLOWED_INCLUDES:
            raise CompileRefused(
                f"{shown} is not allowed; only #include of {', '.join(sorted(ALLOWED_INCLUDES))} "
                "written as a literal name (device code only, no other files); the C limits "
                f"{', '.join(list(C_LIMITS)[:-1])} and {list(C_LIMITS)[-1]} are predefined"
            )
    elif name == "pragma":
        first = _IDENT_RE.match(rest.strip())
        if not first or first.group(0) not in ALLOWED_PRAGMAS:
            raise CompileRefused(f"{shown} is not allowed; allowed pragmas: {', '.join(sorted(ALLOWED_PRAGMAS))}")
    elif name not in ALLOWED_DIRECTIVES and (name or rest.strip()):
        raise CompileRefused(f"{shown} is not allowed; allowed directives: {', '.join(sorted(ALLOWED_DIRECTIVES))}")


def check_source_routes(source: str) -> None:
    """Refuses every preprocessor route from the source to the file system.

    Raises:
        CompileRefused: a forbidden directive, header, pragma or identifier, token pasting, a
            stray backslash or control character, or a source beyond the size limit.
    """
    text = _translated(source)
    directive_view, code_view = _views(text)
    for name, rest in _DIRECTIVE_RE.findall(directive_view):
        _refuse_directive(name, rest)
    # The same lines with comments kept: a directive our comment reading hid is still seen.
    # Only file-reading directives count here, so prose in comments is not refused.
    for name, rest in _DIRECTIVE_RE.findall(text):
        if _FILE_DIRECTIVES.fullmatch(name):
            _refuse_directive(name, rest)
    for ident in _IDENT_RE.findall(directive_view):
        if _FORBIDDEN_IDENT.fullmatch(ident):
            raise CompileRefused(f"{ident} is not allowed: it probes or reads files, or hides a pragma")
    if _PASTE_RE.search(directive_view):
        raise CompileRefused("token pasting (##) is not allowed: it can assemble names the checks refuse")
    if "\\" in code_view:
        raise CompileRefused("a backslash outside a string or character literal is not allowed "
                             "(universal character names in code, stray backslashes)")


# --- the binary --------------------------------------------------------------------------------

# Device-runtime services a kernel may not call: each call site prints or allocates per thread,
# which can flood the harness (printf) or hold memory outside the measured buffers (heap).
_SERVICE_HINTS = {
    "vprintf": "device printf",
    "malloc": "device heap",
    "free": "device heap",
    "__assertfail": "device assert",
}
_EIATTR_FRAME_SIZE, _EIATTR_MIN_STACK_SIZE, _EIATTR_MAX_STACK_SIZE = 0x11, 0x12, 0x23
_SHT_SYMTAB = 2
_STT_FUNC = 2


def _sections(cubin: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, type, offset, size, link) of each section of a 64-bit little-endian ELF."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise CompileRefused("the compiler's output is not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQII", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    out = []
    for name_off, kind, _flags, _addr, offset, size, link, _info in headers:
        start = names_at + name_off
        out.append((cubin[start : cubin.index(b"\0", start)].decode(errors="replace"), kind, offset, size, link))
    return out


def text_bytes(cubin: bytes, entry: str) -> int | None:
    """Size of ``entry``'s code (its ``.text.<entry>`` section, out-of-line callees included)
    in a cubin; None when it is not a 64-bit ELF or has no such section."""
    try:
        sections = _sections(cubin)
    except CompileRefused:
        return None
    return next((size for name, _kind, _offset, size, _link in sections if name == f".text.{entry}"), None)


def undefined_functions(cubin: bytes) -> set[str]:
    """Names of the functions the binary calls but does not define (device-runtime services)."""
    sections = _sections(cubin)
    names: set[str] = set()
    for _name, kind, offset, size, link in sections:
        if kind != _SHT_SYMTAB:
            continue
        strtab = sections[link][2]
        for at in range(offset, offset + size, 24):
            name_off, info, _other, shndx = struct.unpack_from("<IBBH", cubin, at)
            if shndx == 0 and info & 0xF == _STT_FUNC:
                start = strtab + name_off
                names.add(cubin[start : cubin.index(b"\0", start)].decode(errors="replace"))
    return names


def binary_stack_bytes(cubin: bytes) -> int:
    """The largest per-thread stack frame or stack size any function of the binary declares
    (``.nv.info`` attributes): the conservative fallback when the ptxas report is missing."""
    largest = 0
    for name, _kind, offset, size, _link in _sections(cubin):
        if not name.startswith(".nv.info"):
            continue
        at, end = offset, offset + size
        while at + 4 <= end:
            fmt, attr, value = struct.unpack_from("<BBH", cubin, at)
            at += 4
            if fmt != 0x04:  # only the sized format carries (symbol index, bytes) payloads
                continue
            if attr in (_EIATTR_FRAME_SIZE, _EIATTR_MIN_STACK_SIZE, _EIATTR_MAX_STACK_SIZE) and value >= 8:
                largest = max(largest, struct.unpack_from("<I", cubin, at + 4)[0])
            at += value
    return largest


def check_services(cubin: bytes) -> None:
    """Refuses a binary that calls device-runtime services (printf, heap, assert).

    Raises:
        CompileRefused: naming the calls found.
    """
    called = sorted(undefined_functions(cubin))
    if called:
        what = ", ".join(f"{name} ({_SERVICE_HINTS.get(name, 'device runtime')})" for name in called)
        raise CompileRefused(
            f"the binary calls {what}; device printf, heap (malloc/free), assert and other "
            "device-runtime calls are not allowed"
        )
