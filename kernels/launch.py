"""Launch specs: the header comments of a variant file and the tiny arithmetic they use.

A variant file carries its launch configuration in comments, before or among the code::

    // launch: grid=(cdiv(num_tokens, ROWS),) block=(BLOCK,) smem=0
    // tune: BLOCK=128,256,512,1024
    // tune: ROWS=1,2,4

Grid, block and shared-memory sizes are expressions over the kernel's integer arguments
(the shape symbols) and the tunable parameters. They are evaluated by walking a restricted
Python AST: integers, names, + - * // %, unary minus, parentheses, and the functions
min, max, cdiv. Anything else (attribute access, calls to other names, floats, '/', '**',
comparisons, subscripts) is refused with a :class:`LaunchSpecError` naming what was found.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

_FUNCS = {
    "min": lambda *a: min(a),
    "max": lambda *a: max(a),
    "cdiv": lambda a, b: -(-a // b),
}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_EXPR_CHARS = 300


class LaunchSpecError(ValueError):
    """A launch header that cannot be parsed or evaluated; the message says what to fix."""


def _check_node(node: ast.AST, expr: str) -> None:
    """Refuses every AST node that is not plain integer arithmetic."""
    if isinstance(node, ast.Expression):
        _check_node(node.body, expr)
    elif isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise LaunchSpecError(f"only integer constants are allowed, got {node.value!r} in {expr!r}")
    elif isinstance(node, ast.Name):
        pass
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise LaunchSpecError(
                f"operator {type(node.op).__name__} is not allowed in {expr!r} (use + - * // %)"
            )
        _check_node(node.left, expr)
        _check_node(node.right, expr)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _check_node(node.operand, expr)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
            raise LaunchSpecError(f"only min, max and cdiv may be called in {expr!r}")
        if node.keywords:
            raise LaunchSpecError(f"keyword arguments are not allowed in {expr!r}")
        for arg in node.args:
            _check_node(arg, expr)
    else:
        raise LaunchSpecError(f"{type(node).__name__} is not allowed in launch expression {expr!r}")


def _eval_node(node: ast.AST, env: Mapping[str, int], expr: str) -> int:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body, env, expr)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise LaunchSpecError(f"unknown name {node.id!r} in {expr!r}; known: {sorted(env)}")
        return int(env[node.id])
    if isinstance(node, ast.BinOp):
        left = _eval_node(node.left, env, expr)
        right = _eval_node(node.right, env, expr)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
            raise LaunchSpecError(f"division by zero in {expr!r} with {dict(env)}")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        value = _eval_node(node.operand, env, expr)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        args = [_eval_node(a, env, expr) for a in node.args]
        if node.func.id == "cdiv":
            if len(args) != 2:
                raise LaunchSpecError(f"cdiv takes two arguments in {expr!r}")
            if args[1] == 0:
                raise LaunchSpecError(f"cdiv by zero in {expr!r} with {dict(env)}")
        elif not args:
            raise LaunchSpecError(f"{node.func.id} needs at least one argument in {expr!r}")
        return int(_FUNCS[node.func.id](*args))
    raise LaunchSpecError(f"cannot evaluate {expr!r}")  # unreachable after _check_node


@dataclass(frozen=True)
class Expr:
    """One checked arithmetic expression, e.g. ``cdiv(num_tokens * d, BLOCK)``."""

    text: str

    def __post_init__(self) -> None:
        if len(self.text) > _MAX_EXPR_CHARS:
            raise LaunchSpecError(f"launch expression longer than {_MAX_EXPR_CHARS} characters")
        try:
            tree = ast.parse(self.text.strip(), mode="eval")
        except SyntaxError as exc:
            raise LaunchSpecError(f"cannot parse launch expression {self.text!r}: {exc.msg}") from None
        _check_node(tree, self.text)

    def names(self) -> set[str]:
        """The variables the expression reads (called functions excluded, by position: in
        ``max(max, 1)`` the argument ``max`` is a variable)."""
        tree = ast.parse(self.text.strip(), mode="eval")
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}

    def evaluate(self, env: Mapping[str, int]) -> int:
        return _eval_node(ast.parse(self.text.strip(), mode="eval"), env, self.text)


def evaluate(expr: str, env: Mapping[str, int]) -> int:
    """Evaluates one launch expression over integer names.

    Raises:
        LaunchSpecError: the expression uses anything but integer arithmetic, or a name
            that ``env`` lacks.
    """
    return Expr(expr).evaluate(env)


def _pad3(sizes: list[int]) -> tuple[int, int, int]:
    """A 1- to 3-dimensional size padded with ones to CUDA's three dimensions."""
    x, y, z = (*sizes, 1, 1, 1)[:3]
    return (x, y, z)


def _as_int(name: str, value: object) -> int:
    """An integer parameter value; refuses 128.5 or 'abc' rather than truncating or crashing."""
    try:
        as_int = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise LaunchSpecError(f"{name}={value!r} is not an integer") from None
    if isinstance(value, bool) or (isinstance(value, float) and value != as_int):
        raise LaunchSpecError(f"{name}={value!r} is not an integer")
    return as_int


@dataclass(frozen=True)
class LaunchConfig:
    """A launch with every size resolved to integers."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int


@dataclass(frozen=True)
class LaunchSpec:
    """Grid, block and shared memory as expressions, plus the tunable parameters.

    ``tune`` maps each parameter to its candidate values in the order written; the first
    value is the default.
    """

    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    smem: Expr = field(default_factory=lambda: Expr("0"))
    tune: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def default_params(self) -> dict[str, int]:
        return {k: v[0] for k, v in self.tune.items()}

    def param_grid(self) -> Iterator[dict[str, int]]:
        """Every combination of the tunable values (small grids only)."""
        keys = list(self.tune)
        for combo in itertools.product(*(self.tune[k] for k in keys)):
            yield dict(zip(keys, combo, strict=True))

    def grid_size(self) -> int:
        size = 1
        for values in self.tune.values():
            size *= len(values)
        return size

    def validate_params(self, params: Mapping[str, int]) -> dict[str, int]:
        """Fills defaults and refuses unknown names or values outside the declared lists."""
        unknown = set(params) - set(self.tune)
        if unknown:
            raise LaunchSpecError(f"unknown tunable parameter(s) {sorted(unknown)}; declared: {sorted(self.tune)}")
        full = self.default_params()
        for k, v in params.items():
            value = _as_int(k, v)
            if value not in self.tune[k]:
                raise LaunchSpecError(f"{k}={v} is not among the declared values {list(self.tune[k])}")
            full[k] = value
        return full

    def resolve(self, shape: Mapping[str, int], params: Mapping[str, int]) -> LaunchConfig:
        """Evaluates grid/block/smem for one shape and parameter assignment.

        Raises:
            LaunchSpecError: a name is unknown or a size is not positive.
        """
        env = {**shape, **params}
        grid = [e.evaluate(env) for e in self.grid]
        block = [e.evaluate(env) for e in self.block]
        smem = self.smem.evaluate(env)
        if any(g <= 0 for g in grid) or any(b <= 0 for b in block):
            raise LaunchSpecError(f"grid {grid} and block {block} must be positive for {dict(env)}")
        if smem < 0:
            raise LaunchSpecError(f"shared memory {smem} is negative for {dict(env)}")
        return LaunchConfig(grid=_pad3(grid), block=_pad3(block), smem_bytes=smem)


_LAUNCH_RE = re.compile(r"^\s*//\s*launch\s*:(.*)$", re.MULTILINE)
_TUNE_RE = re.compile(r"^\s*//\s*tune\s*:(.*)$", re.MULTILINE)
_KEY_RE = re.compile(r"\b(grid|block|smem)\s*=")


def _split_tuple(text: str, what: str) -> tuple[Expr, ...]:
    text = text.strip()
    if not (text.startswith("(") and text.endswith(")")):
        raise LaunchSpecError(f"{what} must be a parenthesised tuple like ({what}_x,), got {text!r}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise LaunchSpecError(f"cannot parse {what}={text!r}: {exc.msg}") from None
    body = tree.body
    elts = body.elts if isinstance(body, ast.Tuple) else [body]
    if not 1 <= len(elts) <= 3:
        raise LaunchSpecError(f"{what} needs 1 to 3 dimensions, got {len(elts)}")
    return tuple(Expr(ast.get_source_segment(text, e) or "") for e in elts)


def parse_launch_header(source: str) -> LaunchSpec:
    """Reads the ``// launch:`` and ``// tune:`` comments of a variant file.

    Raises:
        LaunchSpecError: no launch line, more than one, a malformed field, or a tunable
            parameter declared twice or with non-integer values.
    """
    launches = _LAUNCH_RE.findall(source)
    if not launches:
        raise LaunchSpecError("no '// launch: grid=(...) block=(...) smem=...' line in the variant")
    if len(launches) > 1:
        raise LaunchSpecError("more than one '// launch:' line in the variant")
    line = launches[0]
    marks = list(_KEY_RE.finditer(line))
    if line[: marks[0].start()].strip() if marks else line.strip():
        raise LaunchSpecError(f"unexpected text in launch line: {line.strip()!r}")
    fields: dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        key = m.group(1)
        if key in fields:
            raise LaunchSpecError(f"{key} given twice in the launch line")
        fields[key] = line[m.end() : end].strip()
    if "grid" not in fields or "block" not in fields:
        raise LaunchSpecError("the launch line needs both grid=(...) and block=(...)")
    tune: dict[str, tuple[int, ...]] = {}
    for tline in _TUNE_RE.findall(source):
        for item in filter(None, (s.strip() for s in tline.split(";"))):
            name, sep, values = item.partition("=")
            name = name.strip()
            if not sep or not _NAME_RE.match(name):
                raise LaunchSpecError(f"tune entries look like NAME=1,2,4; got {item!r}")
            if name in tune:
                raise LaunchSpecError(f"tunable parameter {name} declared twice")
            try:
                vals = tuple(int(v) for v in values.split(",") if v.strip())
            except ValueError:
                raise LaunchSpecError(f"values of {name} must be integers, got {values.strip()!r}") from None
            if not vals or len(set(vals)) != len(vals):
                raise LaunchSpecError(f"{name} needs distinct integer values, got {values.strip()!r}")
            tune[name] = vals
    return LaunchSpec(
        grid=_split_tuple(fields["grid"], "grid"),
        block=_split_tuple(fields["block"], "block"),
        smem=Expr(fields.get("smem", "0") or "0"),
        tune=tune,
    )


def check_names(spec: LaunchSpec, allowed: set[str]) -> None:
    """Refuses expressions that use names that are neither shape symbols nor parameters."""
    shadowed = allowed & set(spec.tune)
    if shadowed:
        # A tunable named like an argument would replace the real size in every expression
        # (and redefine the argument's name as a macro in the source).
        raise LaunchSpecError(f"tunable parameter(s) {sorted(shadowed)} have the names of kernel arguments")
    known = allowed | set(spec.tune)
    for e in (*spec.grid, *spec.block, spec.smem):
        missing = e.names() - known
        if missing:
            raise LaunchSpecError(
                f"launch expression {e.text!r} uses {sorted(missing)}; "
                f"only the kernel's integer arguments {sorted(allowed)} and tunables {sorted(spec.tune)} may appear"
            )


@dataclass(frozen=True)
class DeviceLimits:
    """What one launch may ask of the device. The defaults are the H200's (sm_90); the GPU
    worker reports its own device's values, which replace them there.

    Attributes:
        max_threads_per_block: threads of one block, all dimensions multiplied.
        max_block: per-dimension block limits.
        max_grid: per-dimension grid limits (x < 2^31, y and z < 2^16).
        max_smem_bytes: dynamic shared memory per block, with the opt-in attribute set.
    """

    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_smem_bytes: int = 232448


class LaunchLimitError(LaunchSpecError):
    """A launch that resolves to sizes the device cannot run (a RESOURCE_ERROR verdict)."""


def check_limits(cfg: LaunchConfig, limits: DeviceLimits, where: str = "") -> None:
    """Refuses a resolved launch outside the device's limits, before anything is launched.

    Raises:
        LaunchLimitError: the block, the grid or the shared memory is too large.
    """
    at = f" {where}" if where else ""
    threads = cfg.block[0] * cfg.block[1] * cfg.block[2]
    if threads > limits.max_threads_per_block:
        raise LaunchLimitError(f"block {cfg.block} has {threads} threads, more than {limits.max_threads_per_block}{at}")
    for axis, (size, top) in enumerate(zip(cfg.block, limits.max_block, strict=True)):
        if size > top:
            raise LaunchLimitError(f"block dimension {'xyz'[axis]} = {size} exceeds {top}{at}")
    for axis, (size, top) in enumerate(zip(cfg.grid, limits.max_grid, strict=True)):
        if size > top:
            raise LaunchLimitError(f"grid dimension {'xyz'[axis]} = {size} exceeds {top}{at}")
    if cfg.smem_bytes > limits.max_smem_bytes:
        raise LaunchLimitError(
            f"{cfg.smem_bytes} bytes of dynamic shared memory exceed the device's {limits.max_smem_bytes}{at}"
        )
