"""The package layout: product code never depends on tests/, imports run down the layers only,
and generated kernel sources live with the results, not among the modules."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from setuptools import find_namespace_packages

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("kernels", "evaluators", "agents", "search", "experiments")
# Which top-level packages each layer may import (itself included).
ALLOWED = {
    "kernels": {"kernels"},
    "evaluators": {"kernels", "evaluators"},
    "agents": {"kernels", "evaluators", "agents"},
    "search": {"kernels", "evaluators", "agents", "search"},
    "experiments": set(PRODUCT),
}


def product_files() -> list[Path]:
    return sorted(p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py"))


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def paths_into_tests(source: str) -> list[str]:
    """String constants of code (not docstrings) that point into tests/: a ``"tests"`` path
    part or a ``"tests/..."`` path. Help texts that give an example path contain spaces."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    strings = [n.value for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]
    return [s for s in strings if s == "tests" or (s.startswith("tests/") and " " not in s)]


def test_the_scans_see_the_product_and_would_catch_a_reach_into_tests(tmp_path: Path):
    assert len(product_files()) > 50
    bad = tmp_path / "bad.py"
    bad.write_text("from tests.adversarial import index\nimport search.run\n")
    assert imported_packages(bad) == {"tests", "search"}
    assert paths_into_tests('INDEX = ROOT / "tests" / "adversarial"') == ["tests"]
    assert paths_into_tests("P = Path('tests/adversarial/fixtures.yaml')") == ["tests/adversarial/fixtures.yaml"]
    assert not paths_into_tests('"""Reads tests/adversarial."""\nX = ("latests", "help: e.g. tests/a.yaml")')


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_product_code_imports_no_higher_layer_and_never_tests(path: Path):
    layer = path.relative_to(ROOT).parts[0]
    project = imported_packages(path) & {*PRODUCT, "tests"}
    assert project <= ALLOWED[layer], f"{layer} may not import {sorted(project - ALLOWED[layer])}"


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_product_code_names_no_path_into_tests(path: Path):
    # Docstrings and help texts may mention the test suite; code may not point there.
    offending = paths_into_tests(path.read_text())
    assert not offending, f"{path.name} points into tests/: {offending}"


def test_generated_kernel_sources_are_data_not_modules():
    experiments = ROOT / "experiments"
    # Kernel folders (a spec.py beside its baseline.cu, as in kernels/) are benchmarks, not variants.
    stray = [p for p in experiments.rglob("*.cu")
             if (experiments / "results") not in p.parents and not (p.parent / "spec.py").is_file()]
    assert not stray, f"kernel sources outside experiments/results/: {stray}"
    assert (experiments / "results" / "variants" / "silu_and_mul" / "vec_flat.cu").is_file()
    assert not list((experiments / "results").rglob("*.py"))
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_namespace_packages(str(ROOT), **find)
    assert "experiments" in packages and "experiments.configs" in packages
    assert not [p for p in packages if p.startswith(("experiments.results", "experiments.variants"))]


def test_no_file_names_the_old_variants_folder():
    old = re.compile(r"""experiments/variants|["']experiments["']\s*/\s*["']variants["']""")
    files = [*product_files(), *(ROOT / "tests").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    naming = [str(p.relative_to(ROOT)) for p in files
              if p.is_file() and p != Path(__file__).resolve() and old.search(p.read_text())]
    assert not naming, f"these still name experiments/variants (now experiments/results/variants): {naming}"
