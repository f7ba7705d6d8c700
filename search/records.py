"""The run directory: append-only JSONL records, best kernels, and resume.

Layout of ``runs/<id>/``::

    config.yaml         the resolved configuration
    kernels.json        each kernel's name in the run -> its folder reference (folder, digest)
    evaluations.jsonl   one line per evaluation (flushed and fsynced per line)
    proposals.jsonl     one line per proposal, failures included
    replies.jsonl       one line per agent reply (how many proposals; empty replies too)
    llm_calls.jsonl     one line per LLM call of a proposal
    rounds.jsonl        one line per finished (kernel, round)
    answers.jsonl       one line per answered end-of-run call (sanitizer, each round of peers' loops),
                        under a key naming the call: a resumed run replays them
    extra_shapes.json   the tester's extra search shapes (LLM runs)
    heldout_shapes.json the held-out shapes drawn for this run
    attempts.json       wall and busy seconds of each attempt at the run (first run, resumes)
    best/<kernel>.cu    the winner, and best/<kernel>.json its evidence (<kernel>: the kernel's
                        name in the run, ``name@digest-prefix`` when two kernels share a name)
    evaluations.parquet, best.parquet   written at the end (and on demand)
    summary.json        written last: its presence means the run finished

A killed process can leave a half-written last line; readers skip it and the writer cuts it
off before appending, so a resumed run never writes after garbage.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
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

    FILES: tuple[str, ...] = ("evaluations", "proposals", "replies", "llm_calls", "rounds", "answers")

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

    def reply(self, kernel: str, round_: int, agent: str, n_proposals: int) -> None:
        """An agent's whole reply is on record (after its proposals): a resumed run never asks
        that agent again for that round, even when the reply was empty."""
        self.append("replies", {"run_id": self.run_id, "kernel": kernel, "round": round_, "agent": agent,
                                "proposals": n_proposals, "time": time.time()})

    def answer(self, key: str, method: str, value: Any) -> None:
        """An evaluator call's answer (see :meth:`search.jobs.Evaluations.recorded_call`)."""
        self.append("answers", {"run_id": self.run_id, "key": key, "method": method, "value": value,
                                "time": time.time()})

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
    replies: list[dict[str, Any]]
    answers: dict[str, Any] = field(default_factory=dict)  # call key -> answer

    def by_key(self) -> dict[str, EvalRecord]:
        return {r.key: r for r in self.evaluations}


def load_history(run_dir: Path) -> RunHistory:
    run_dir = Path(run_dir)
    evals = read_evaluations(run_dir / "evaluations.jsonl")
    proposals = list(read_jsonl(run_dir / "proposals.jsonl"))
    done: dict[str, int] = {}
    for d in read_jsonl(run_dir / "rounds.jsonl"):
        done[d["kernel"]] = max(done.get(d["kernel"], 0), int(d["round"]) + 1)
    answers = {d["key"]: d["value"] for d in read_jsonl(run_dir / "answers.jsonl")}
    return RunHistory(evals, proposals, done, list(read_jsonl(run_dir / "replies.jsonl")), answers)


class AttemptClock:
    """Wall and busy seconds of every attempt at one run, in ``attempts.json``.

    A run that is killed and resumed took the time of all its attempts: the file keeps one
    entry per attempt, rewritten (atomically, at most every ``interval_s``) while it runs, so
    a killed attempt leaves its time up to its last tick.

    Args:
        run_dir: the run directory.
        interval_s: least time between two writes that are not forced.
    """

    FILE = "attempts.json"

    def __init__(self, run_dir: Path, interval_s: float = 5.0) -> None:
        self.path = Path(run_dir) / self.FILE
        self.interval_s = interval_s
        self.earlier: list[dict[str, Any]] = json.loads(self.path.read_text()) if self.path.is_file() else []
        self.started = time.time()
        self.ended: float | None = None
        self._last = 0.0
        self.busy_s = 0.0

    def wall_s(self) -> float:
        """This attempt's seconds so far (up to :meth:`stop`)."""
        return (self.ended or time.time()) - self.started

    def stop(self, busy_s: float) -> None:
        """Ends this attempt's clock and records it."""
        self.ended = time.time()
        self.tick(busy_s, force=True)

    def total_wall_s(self) -> float:
        return sum(float(a["wall_s"]) for a in self.earlier) + self.wall_s()

    def total_busy_s(self) -> float:
        return sum(float(a.get("busy_s", 0.0)) for a in self.earlier) + self.busy_s

    def tick(self, busy_s: float, force: bool = False) -> None:
        """Records this attempt's wall time and the evaluators' busy seconds so far."""
        self.busy_s = busy_s
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        mine = {"started": self.started, "wall_s": self.wall_s(), "busy_s": busy_s}
        atomic_write(self.path, json.dumps([*self.earlier, mine], indent=1))
