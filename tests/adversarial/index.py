"""Reads ``fixtures.yaml``: the adversarial variants and the verdict each must get."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FIXTURE_DIR = Path(__file__).resolve().parent
INDEX = FIXTURE_DIR / "fixtures.yaml"
# Guards that make a verdict REJECTED, and front-end checks that make it COMPILE_ERROR.
REJECT_GUARDS = frozenset({"input_mutation", "partial_output", "replay", "roofline", "nondeterminism"})
FRONT_END_GUARDS = frozenset({"signature", "launch"})
SANITIZER_TOOLS = frozenset({"memcheck", "racecheck"})


@dataclass(frozen=True)
class Fixture:
    """One adversarial or honest variant and the verdict the evaluator must give it.

    Attributes:
        file: the variant's file name in this folder.
        kernel: library kernel it claims to implement.
        status: expected :class:`kernels.verdict.Status` value.
        trick: one line on what it does.
        guard: for REJECTED the guard that must fire; for COMPILE_ERROR the front-end check.
        covers: items of REFERENCE.md section 5 it exercises.
        message_contains: substrings the verdict's message must contain (case-insensitive).
        sanitizer: compute-sanitizer tool that must report it, if any.
        known_gap: set when the evaluator is not expected to catch it yet (and why).
        dtype: the run dtype its verdict is judged at.
        shape_set: the shapes its verdict is judged on (``search`` or ``heldout``).
        twin: for correct code whose trick must gain nothing, the honest fixture that is the
            same code without the trick (file name); its speedup bounds the trick's.
    """

    file: str
    kernel: str
    status: str
    trick: str
    guard: str = ""
    covers: tuple[int, ...] = ()
    message_contains: tuple[str, ...] = ()
    sanitizer: str = ""
    known_gap: str = ""
    dtype: str = "float16"
    shape_set: str = "search"
    twin: str = ""

    @property
    def honest(self) -> bool:
        """An honest kernel (its trick reads 'none; ...'); every other fixture is hostile,
        even one that the evaluator alone judges OK (it must fail later: in the peers' loop or
        under the sanitizer)."""
        return self.trick.strip().lower().startswith("none")

    @property
    def path(self) -> Path:
        return FIXTURE_DIR / self.file

    @property
    def name(self) -> str:
        return Path(self.file).stem

    def source(self) -> str:
        return self.path.read_text()


def _fixture(entry: dict[str, Any]) -> Fixture:
    return Fixture(
        file=entry["file"],
        kernel=entry["kernel"],
        status=entry["status"],
        trick=entry["trick"],
        guard=entry.get("guard", ""),
        covers=tuple(entry.get("covers", ())),
        message_contains=tuple(str(s) for s in entry.get("message_contains", ())),
        sanitizer=entry.get("sanitizer", ""),
        known_gap=entry.get("known_gap", ""),
        dtype=entry.get("dtype", "float16"),
        shape_set=entry.get("shape_set", "search"),
        twin=entry.get("twin", ""),
    )


def load_index(path: Path = INDEX) -> tuple[list[Fixture], list[dict[str, Any]]]:
    """Returns the fixtures and the ``not_applicable`` entries of the index."""
    data = yaml.safe_load(path.read_text())
    return [_fixture(e) for e in data["fixtures"]], list(data.get("not_applicable", []))


def fixtures() -> list[Fixture]:
    return load_index()[0]
