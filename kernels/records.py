"""The run's record vocabulary, shared by every layer: stages, shape sets, evaluation
records and the two file primitives (atomic writes, torn-line-tolerant JSONL reads).

Writers live above (:mod:`search.records`); everything that reads a run directory reads its
lines through :class:`EvalRecord` here, never as raw dicts.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from kernels.variant import Variant
from kernels.verdict import Evaluation


class Stage(StrEnum):
    """Why an evaluation was made: tuning trials (``screen``), the round's contenders under
    the full protocol (``full``), the winner on held-out shapes (``heldout``), the winner's
    reported timing at the end of the run (``final``)."""

    SCREEN = "screen"
    FULL = "full"
    HELDOUT = "heldout"
    FINAL = "final"


class ShapeSet(StrEnum):
    """Which of a kernel's shape lists an evaluation ran on."""

    SEARCH = "search"
    HELDOUT = "heldout"


def atomic_write(path: Path, data: bytes | str) -> None:
    """Writes through a temporary file and ``os.replace``: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    # mkstemp makes the file private (0600); a record is as readable as any file the user writes.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of a JSONL file; a torn last line (killed writer) is skipped."""
    if not path.is_file():
        return
    with path.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                return
            line = raw.strip()
            if line:
                yield json.loads(line)


def read_evaluations(path: Path) -> list[EvalRecord]:
    """Every complete line of an ``evaluations.jsonl`` as a typed record."""
    return [EvalRecord.from_dict(d) for d in read_jsonl(path)]


def params_key(params: Mapping[str, int]) -> str:
    return json.dumps({k: int(v) for k, v in sorted(params.items())}, separators=(",", ":"))


def eval_key(kernel: str, variant_id: str, params: Mapping[str, int], dtype: str, stage: str, shape_set: str) -> str:
    """Identity of one evaluation: evaluated at most once per run, across resumes. The kernel
    (its name in the run) is part of it: two kernels of a run may start from the same source
    and still be judged against different specs."""
    return "|".join((kernel, variant_id, params_key(params), dtype, stage, shape_set))


@dataclass(frozen=True)
class EvalRecord:
    """One line of ``evaluations.jsonl``.

    Attributes:
        run_id / kernel / dtype / round / agent: where it belongs.
        stage: screen, full, heldout or final.
        trial: the Optuna trial number, or None outside a study.
        variant: the candidate.
        evaluation: its verdict.
        compile_key: the compile cache key ('' when compiling was refused).
        params: the full parameter assignment asked for (defaults filled in).
        shape_set: search or heldout.
        time: wall-clock timestamp (seconds since the epoch).
        busy_s: seconds the evaluator actor spent on it.
    """

    run_id: str
    kernel: str
    dtype: str
    round: int
    agent: str
    stage: Stage
    trial: int | None
    variant: Variant
    evaluation: Evaluation
    compile_key: str = ""
    params: dict[str, int] = field(default_factory=dict)
    shape_set: ShapeSet = ShapeSet.SEARCH
    time: float = 0.0
    busy_s: float = 0.0

    def __post_init__(self) -> None:
        # Plain strings are accepted and checked: a stage or shape set outside the enums fails
        # here, where the record is made, not in a reader much later.
        object.__setattr__(self, "stage", Stage(self.stage))
        object.__setattr__(self, "shape_set", ShapeSet(self.shape_set))

    @property
    def key(self) -> str:
        return eval_key(self.kernel, self.variant.id, self.params, self.dtype, self.stage, self.shape_set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "kernel": self.kernel,
            "dtype": self.dtype,
            "round": self.round,
            "agent": self.agent,
            "stage": self.stage.value,
            "trial": self.trial,
            "variant": self.variant.to_dict(),
            "evaluation": self.evaluation.to_dict(),
            "compile_key": self.compile_key,
            "params": self.params,
            "shape_set": self.shape_set.value,
            "key": self.key,
            "time": self.time,
            "busy_s": self.busy_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalRecord:
        """Reads a line back; unknown fields (newer versions) are ignored."""
        return cls(
            run_id=d.get("run_id", ""),
            kernel=d["kernel"],
            dtype=d["dtype"],
            round=int(d.get("round", 0)),
            agent=d.get("agent", ""),
            stage=Stage(d["stage"]),
            trial=d.get("trial"),
            variant=Variant.from_dict(d["variant"]),
            evaluation=Evaluation.from_dict(d["evaluation"]),
            compile_key=d.get("compile_key", ""),
            params={k: int(v) for k, v in d.get("params", {}).items()},
            shape_set=ShapeSet(d.get("shape_set", "search")),
            time=float(d.get("time", 0.0)),
            busy_s=float(d.get("busy_s", 0.0)),
        )
