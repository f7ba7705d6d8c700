"""The run directory: append-only JSONL records, best kernels, and resume.

Layout of ``runs/<id>/``::

    config.yaml         the resolved configuration
    evaluations.jsonl   one line per evaluation (flushed and fsynced per line)
    proposals.jsonl     one line per proposal, failures included
    llm_calls.jsonl     one line per LLM call of a proposal
    rounds.jsonl        one line per finished (kernel, round)
    optuna.journal      the tuning studies
    best/<kernel>.cu    the winner, and best/<kernel>.json its evidence
    evaluations.parquet, best.parquet, summary.json   written at the end (and on demand)

A killed process can leave a half-written last line; readers skip it and the writer cuts it
off before appending, so a resumed run never writes after garbage.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluators.compile import atomic_write
from evaluators.variant import Variant
from evaluators.verdict import Evaluation

STAGES = ("screen", "full", "heldout", "final")


def params_key(params: Mapping[str, int]) -> str:
    return json.dumps({k: int(v) for k, v in sorted(params.items())}, separators=(",", ":"))


def eval_key(variant_id: str, params: Mapping[str, int], dtype: str, stage: str, shape_set: str) -> str:
    """Identity of one evaluation: evaluated at most once per run, across resumes."""
    return "|".join((variant_id, params_key(params), dtype, stage, shape_set))


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
    stage: str
    trial: int | None
    variant: Variant
    evaluation: Evaluation
    compile_key: str = ""
    params: dict[str, int] = field(default_factory=dict)
    shape_set: str = "search"
    time: float = 0.0
    busy_s: float = 0.0

    @property
    def key(self) -> str:
        return eval_key(self.variant.id, self.params, self.dtype, self.stage, self.shape_set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "kernel": self.kernel,
            "dtype": self.dtype,
            "round": self.round,
            "agent": self.agent,
            "stage": self.stage,
            "trial": self.trial,
            "variant": self.variant.to_dict(),
            "evaluation": self.evaluation.to_dict(),
            "compile_key": self.compile_key,
            "params": self.params,
            "shape_set": self.shape_set,
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
            stage=d["stage"],
            trial=d.get("trial"),
            variant=Variant.from_dict(d["variant"]),
            evaluation=Evaluation.from_dict(d["evaluation"]),
            compile_key=d.get("compile_key", ""),
            params={k: int(v) for k, v in d.get("params", {}).items()},
            shape_set=d.get("shape_set", "search"),
            time=float(d.get("time", 0.0)),
            busy_s=float(d.get("busy_s", 0.0)),
        )


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


def _cut_torn_tail(path: Path) -> None:
    if not path.is_file() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    with path.open("r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)


class RunRecords:
    """Appends records of one run; each line is flushed and fsynced before returning.

    Args:
        run_dir: the run directory (created if missing).
        run_id: the run's id, stamped on evaluation records.
    """

    FILES = ("evaluations", "proposals", "llm_calls", "rounds")

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.dir = Path(run_dir)
        self.run_id = run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self._files = {}
        for name in self.FILES:
            path = self.dir / f"{name}.jsonl"
            _cut_torn_tail(path)
            self._files[name] = path.open("a", encoding="utf-8")

    def append(self, name: str, obj: Mapping[str, Any]) -> None:
        f = self._files[name]
        f.write(json.dumps(obj, separators=(",", ":"), default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())

    def evaluation(self, record: EvalRecord) -> None:
        self.append("evaluations", record.to_dict())

    def proposal(
        self, kernel: str, dtype: str, round_: int, agent: str, proposal: Any, index: int, batch: int
    ) -> None:
        """One proposal (an :class:`agents.base.Proposal`), and one line per LLM call it made.

        ``index`` / ``batch`` place it in the agent's reply, so that a resumed run can tell a
        complete reply (reused) from one cut short by a kill (asked again).
        """
        variant = proposal.variant
        self.append(
            "proposals",
            {
                "run_id": self.run_id,
                "kernel": kernel,
                "dtype": dtype,
                "round": round_,
                "agent": agent,
                "variant_id": variant.id,
                "variant": variant.to_dict(),
                "transformation": proposal.transformation,
                "failure": proposal.failure,
                "n_calls": len(proposal.calls),
                "index": index,
                "batch": batch,
                "time": time.time(),
            },
        )
        for call in proposal.calls:
            self.append("llm_calls", {**call, "variant_id": variant.id, "kernel": kernel, "run_id": self.run_id})

    def round_done(self, kernel: str, round_: int) -> None:
        self.append("rounds", {"kernel": kernel, "round": round_, "time": time.time()})

    def write_best(self, kernel: str, source: str, evidence: Mapping[str, Any]) -> None:
        atomic_write(self.dir / "best" / f"{kernel}.cu", source)
        atomic_write(self.dir / "best" / f"{kernel}.json", json.dumps(evidence, indent=2, default=str))

    def close(self) -> None:
        for f in self._files.values():
            f.close()


@dataclass
class RunHistory:
    """What a run directory already holds (for ``--resume``)."""

    evaluations: list[EvalRecord]
    proposals: list[dict[str, Any]]
    rounds_done: dict[str, int]  # kernel -> number of finished rounds

    def by_key(self) -> dict[str, EvalRecord]:
        return {r.key: r for r in self.evaluations}


def load_history(run_dir: Path) -> RunHistory:
    run_dir = Path(run_dir)
    evals = [EvalRecord.from_dict(d) for d in read_jsonl(run_dir / "evaluations.jsonl")]
    proposals = list(read_jsonl(run_dir / "proposals.jsonl"))
    done: dict[str, int] = {}
    for d in read_jsonl(run_dir / "rounds.jsonl"):
        done[d["kernel"]] = max(done.get(d["kernel"], 0), int(d["round"]) + 1)
    return RunHistory(evals, proposals, done)
