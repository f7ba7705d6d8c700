"""The README starts with the two commands a newcomer runs (search, test), its test command
is what .ci/run runs, the quick check it names selects real tests, and the log of measured
results lives beside the results."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import SMOKE_FILES

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _first_block(text: str) -> list[str]:
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_the_readme_starts_with_a_search_command_and_the_ci_test_command():
    assert README.startswith("# kernel-search\n\n```bash\n")  # the commands come first
    search, test = _first_block(README)
    assert "python3 -m venv .venv" in search and search.endswith("python -m search.run --population 8 --rounds 5")
    assert "python3 -m venv .venv" in test
    ci = (ROOT / ".ci" / "run").read_text().replace(" --progress-bar off", "")
    # the same install and the same checks, in the same order, as CI
    steps = ["pip install -e '.[dev]'", "ruff check .", "mypy", "pytest -q"]
    assert [s for s in steps if s in test] == steps and test.endswith("pytest -q")
    found = [re.search(rf"^{re.escape(s)}$", ci, re.M) for s in steps]
    assert all(found), (steps, found)
    starts = [m.start() for m in found if m]
    assert starts == sorted(starts)


def test_the_readme_names_the_cpu_search_and_the_quick_tests():
    top = README[: README.index("## What it does")]
    assert "python -m search.run --kernel silu_and_mul --evaluator standin" in top
    assert "pytest -q -m smoke" in top and "~40-45 minutes on 2 cores" in top  # the whole suite, named with its time
    missing = [name for name in SMOKE_FILES if not (ROOT / "tests" / "unit" / name).is_file()]
    assert not missing, f"the smoke selection names files that are gone: {missing}"


def test_the_results_log_moved_beside_the_results():
    assert "experiments/results/README.md" in README and len(README.splitlines()) < 450
    log = (ROOT / "experiments" / "results" / "README.md").read_text()
    assert "unseen-h200.md" in log and "unseen-h200.md" not in README


def test_every_module_a_kernels_doc_snippet_calls_is_imported_in_it():
    """A snippet copied into spec.py must not fail with a NameError on a module it uses."""
    text = (ROOT / "docs" / "kernels.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        used = set(re.findall(r"(?<![\w.])([a-z_]+)\.[a-z_]+\(", block))
        imported = {name.strip() for line in re.findall(r"^\s*(?:from \S+ )?import (.+?)(?:\s+#.*)?$", block, re.M)
                    for name in line.split(",")}
        local = set(re.findall(r"^\s*([a-z_]+)\s*=", block, re.M))  # variables, not modules
        local |= {p.strip().split("=")[0] for params in re.findall(r"def \w+\((.*?)\)", block) for p in params.split(",")}
        assert used - local <= imported, (used - local - imported, block[:80])
