"""The launch header of a variant file and the safe arithmetic its sizes use."""

from __future__ import annotations

import pytest

from kernels.launch import (
    Expr,
    LaunchConfig,
    LaunchSpecError,
    check_names,
    evaluate,
    parse_launch_header,
)

ENV = {"num_tokens": 4096, "d": 14336, "BLOCK": 256, "VEC": 8}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("d // BLOCK", 56),
        ("d % 1000", 336),
        ("-BLOCK + 300", 44),
        ("+VEC", 8),
        ("num_tokens * d - 1", 4096 * 14336 - 1),
        ("cdiv(10, 3)", 4),
        ("cdiv(9, 3)", 3),
        ("cdiv(1, 1024)", 1),
        ("cdiv(num_tokens * d, BLOCK * VEC)", -(-(4096 * 14336) // (256 * 8))),
        ("min(BLOCK, 128)", 128),
        ("max(BLOCK, 1024, VEC)", 1024),
        ("min(7)", 7),
        ("max(1, min(d // VEC, 1024))", 1024),
        ("  BLOCK  ", 256),
    ],
)
def test_arithmetic_evaluates_to_python_integer_semantics(expr: str, expected: int) -> None:
    value = evaluate(expr, ENV)
    assert value == expected
    assert type(value) is int


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("BLOCK.real", "Attribute"),
        ("BLOCK.bit_length()", "only min, max and cdiv"),
        ("__import__('os').system('true')", "only min, max and cdiv"),
        ("open('/etc/passwd')", "only min, max and cdiv"),
        ("(lambda: 1)()", "only min, max and cdiv"),
        ("lambda: 1", "Lambda"),
        ("1.5", "integer constants"),
        ("BLOCK * 2.0", "integer constants"),
        ("'256'", "integer constants"),
        ("True", "integer constants"),
        ("d / 2", "Div"),
        ("BLOCK ** 2", "Pow"),
        ("d << 1", "LShift"),
        ("d & 7", "BitAnd"),
        ("BLOCK < 512", "Compare"),
        ("BLOCK == 256", "Compare"),
        ("BLOCK and d", "BoolOp"),
        ("not BLOCK", "UnaryOp"),
        ("~BLOCK", "UnaryOp"),
        ("d if BLOCK else 1", "IfExp"),
        ("ENV[0]", "Subscript"),
        ("[1, 2]", "List"),
        ("(1, 2)", "Tuple"),
        ("min(*ENV)", "Starred"),
        ("min(BLOCK, key=d)", "keyword arguments"),
        ("", "cannot parse"),
        ("BLOCK +", "cannot parse"),
        ("x = 1", "cannot parse"),
    ],
)
def test_everything_but_integer_arithmetic_is_refused(expr: str, fragment: str) -> None:
    with pytest.raises(LaunchSpecError, match=fragment):
        Expr(expr)


def test_refusal_happens_before_any_name_is_looked_up() -> None:
    # The env holds a callable: a refused expression must never reach it.
    calls: list[str] = []
    env = {"f": lambda: calls.append("called")}
    with pytest.raises(LaunchSpecError):
        evaluate("f()", env)  # type: ignore[dict-item]
    assert calls == []


def test_unknown_name_is_named_with_the_known_ones() -> None:
    with pytest.raises(LaunchSpecError, match=r"unknown name 'ROWS'.*BLOCK"):
        evaluate("cdiv(num_tokens, ROWS)", ENV)


@pytest.mark.parametrize("expr", ["d // (BLOCK - 256)", "d % (VEC - 8)", "cdiv(d, BLOCK - 256)"])
def test_division_by_zero_is_a_launch_error(expr: str) -> None:
    with pytest.raises(LaunchSpecError, match="by zero"):
        evaluate(expr, ENV)


@pytest.mark.parametrize(("expr", "fragment"), [("min()", "at least one"), ("cdiv(d)", "two arguments")])
def test_wrong_argument_counts_are_launch_errors(expr: str, fragment: str) -> None:
    with pytest.raises(LaunchSpecError, match=fragment):
        evaluate(expr, ENV)


def test_overlong_expressions_are_refused() -> None:
    long_expr = " + ".join(["1"] * 200)
    with pytest.raises(LaunchSpecError, match="longer than"):
        Expr(long_expr)
    assert evaluate(" + ".join(["1"] * 50), {}) == 50


def test_names_lists_variables_not_functions() -> None:
    assert Expr("cdiv(num_tokens * d, max(BLOCK, 32))").names() == {"num_tokens", "d", "BLOCK"}
    # A name that is also called elsewhere is still a variable where it is read.
    assert Expr("max(max, 1)").names() == {"max"}


HEADER = """// silu_and_mul, vectorised
// launch: grid=(cdiv(num_tokens, ROWS), d // (BLOCK * VEC)) block=(BLOCK,) smem=ROWS * BLOCK * 4
// tune: BLOCK=128,256,512
// tune: ROWS=1,2 ; VEC=8,4
// flags: --use_fast_math
extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {}
"""


def test_header_fields_and_tunables_are_read() -> None:
    spec = parse_launch_header(HEADER)
    assert [e.text for e in spec.grid] == ["cdiv(num_tokens, ROWS)", "d // (BLOCK * VEC)"]
    assert [e.text for e in spec.block] == ["BLOCK"]
    assert spec.smem.text == "ROWS * BLOCK * 4"
    assert dict(spec.tune) == {"BLOCK": (128, 256, 512), "ROWS": (1, 2), "VEC": (8, 4)}
    assert spec.default_params() == {"BLOCK": 128, "ROWS": 1, "VEC": 8}
    assert spec.grid_size() == 12
    combos = list(spec.param_grid())
    assert len(combos) == 12
    assert len({tuple(sorted(c.items())) for c in combos}) == 12


def test_smem_defaults_to_zero_and_tune_is_optional() -> None:
    spec = parse_launch_header("// launch: grid=(num_tokens,) block=(256,)\n")
    assert spec.smem.evaluate({}) == 0
    assert dict(spec.tune) == {}
    assert list(spec.param_grid()) == [{}]


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("int x;\n", "no '// launch:"),
        ("// launch: grid=(1,) block=(32,)\n// launch: grid=(2,) block=(32,)\n", "more than one"),
        ("// launch: grid=(1,)\n", "both grid"),
        ("// launch: block=(32,)\n", "both grid"),
        ("// launch:\n", "both grid"),
        ("// launch: grid=(1,) grid=(2,) block=(32,)\n", "grid given twice"),
        ("// launch: fast grid=(1,) block=(32,)\n", "unexpected text"),
        ("// launch: grid=1 block=(32,)\n", "parenthesised tuple"),
        ("// launch: grid=(1,) block=(32,) extra\n", "parenthesised tuple"),
        ("// launch: grid=(1, 1, 1, 1) block=(32,)\n", "1 to 3 dimensions"),
        ("// launch: grid=() block=(32,)\n", "1 to 3 dimensions"),
        ("// launch: grid=(1,) block=(32.0,)\n", "integer constants"),
        ("// launch: grid=(1,) block=(32,) smem=2 ** 10\n", "Pow"),
    ],
)
def test_malformed_launch_lines_are_refused(source: str, fragment: str) -> None:
    with pytest.raises(LaunchSpecError, match=fragment):
        parse_launch_header(source)


@pytest.mark.parametrize(
    ("tune", "fragment"),
    [
        ("BLOCK", "NAME=1,2,4"),
        ("1BLOCK=1,2", "NAME=1,2,4"),
        ("BLOCK=", "distinct integer values"),
        ("BLOCK=128,128", "distinct integer values"),
        ("BLOCK=128,fast", "must be integers"),
        ("BLOCK=1.5,2", "must be integers"),
        ("BLOCK=1,2; BLOCK=4", "declared twice"),
    ],
)
def test_bad_tune_lines_are_refused(tune: str, fragment: str) -> None:
    source = f"// launch: grid=(1,) block=(BLOCK,)\n// tune: {tune}\n"
    with pytest.raises(LaunchSpecError, match=fragment):
        parse_launch_header(source)


def test_a_parameter_declared_on_two_tune_lines_is_refused() -> None:
    source = "// launch: grid=(1,) block=(BLOCK,)\n// tune: BLOCK=1,2\n// tune: BLOCK=4\n"
    with pytest.raises(LaunchSpecError, match="declared twice"):
        parse_launch_header(source)


def test_resolve_pads_to_three_dimensions() -> None:
    spec = parse_launch_header(HEADER)
    config = spec.resolve({"num_tokens": 7, "d": 4096}, {"BLOCK": 128, "ROWS": 2, "VEC": 8})
    assert config == LaunchConfig(grid=(4, 4, 1), block=(128, 1, 1), smem_bytes=2 * 128 * 4)


@pytest.mark.parametrize(
    ("launch", "fragment"),
    [
        ("grid=(num_tokens - 7,) block=(32,)", "must be positive"),
        ("grid=(1,) block=(32, 0)", "must be positive"),
        ("grid=(1,) block=(-32,)", "must be positive"),
        ("grid=(1,) block=(32,) smem=-4", "negative"),
        ("grid=(rows,) block=(32,)", "unknown name 'rows'"),
    ],
)
def test_resolve_refuses_non_positive_sizes(launch: str, fragment: str) -> None:
    spec = parse_launch_header(f"// launch: {launch}\n")
    with pytest.raises(LaunchSpecError, match=fragment):
        spec.resolve({"num_tokens": 7}, {})


def test_validate_params_fills_defaults_and_keeps_given_values() -> None:
    spec = parse_launch_header(HEADER)
    assert spec.validate_params({}) == {"BLOCK": 128, "ROWS": 1, "VEC": 8}
    assert spec.validate_params({"VEC": 4, "BLOCK": 512}) == {"BLOCK": 512, "ROWS": 1, "VEC": 4}
    assert spec.validate_params({"ROWS": 2}) == {"BLOCK": 128, "ROWS": 2, "VEC": 8}


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"WARPS": 4}, "unknown tunable parameter"),
        ({"BLOCK": 64}, "not among the declared values"),
        ({"BLOCK": 128.5}, "not an integer"),
        ({"BLOCK": "many"}, "not an integer"),
        ({"BLOCK": None}, "not an integer"),
    ],
)
def test_validate_params_refuses_undeclared_names_and_values(params: dict[str, object], fragment: str) -> None:
    spec = parse_launch_header(HEADER)
    with pytest.raises(LaunchSpecError, match=fragment):
        spec.validate_params(params)  # type: ignore[arg-type]


def test_check_names_refuses_names_that_are_neither_arguments_nor_tunables() -> None:
    spec = parse_launch_header("// launch: grid=(cdiv(n, BLOCK),) block=(BLOCK,) smem=extra\n// tune: BLOCK=1\n")
    check_names(parse_launch_header("// launch: grid=(cdiv(n, BLOCK),) block=(BLOCK,)\n// tune: BLOCK=1\n"), {"n"})
    with pytest.raises(LaunchSpecError, match="extra"):
        check_names(spec, {"n"})


def test_check_names_refuses_a_tunable_that_shadows_an_argument() -> None:
    spec = parse_launch_header("// launch: grid=(cdiv(d, 256),) block=(256,)\n// tune: d=1024,2048\n")
    with pytest.raises(LaunchSpecError, match="names of kernel arguments"):
        check_names(spec, {"num_tokens", "d"})
