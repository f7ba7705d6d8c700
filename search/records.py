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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernels.records import EvalRecord, atomic_write, read_evaluations, read_jsonl


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
    evals = read_evaluations(run_dir / "evaluations.jsonl")
    proposals = list(read_jsonl(run_dir / "proposals.jsonl"))
    done: dict[str, int] = {}
    for d in read_jsonl(run_dir / "rounds.jsonl"):
        done[d["kernel"]] = max(done.get(d["kernel"], 0), int(d["round"]) + 1)
    return RunHistory(evals, proposals, done)
