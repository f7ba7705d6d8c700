"""One trajectory schema for RL data, from searches and from served requests alike.

``python -m search.trajectory DIR [--out PATH]`` writes the trajectories of a search run
(``runs/<id>``) or of a reward service's single requests (its directory, with
``rewards.jsonl``) in it; the service writes its multi-turn episodes (:mod:`search.reward_env`)
to ``trajectories.jsonl`` of its directory itself. One JSON object per line (docs/rl.md):

==================  ==============================================================
``schema``          :data:`SCHEMA` (the version of this layout)
``trajectory_id``   unique per trajectory
``origin``          ``search`` (a lineage path of a run) or ``service`` (an episode)
``run_id``          the run or the service directory it came from
``kernel / dtype``  what was optimised
``messages``        the conversation, ``{role, content}``: a search path's chat as its
                    agents saw it; an episode's prompt, then each response and the
                    evaluator's feedback as alternating assistant and user turns; a single
                    request's prompt (as sent, else the library's) and response
``turns``           one per proposal: ``response`` (the kernel as submitted),
                    ``feedback`` (the evaluator's message), ``status``, ``speedup``,
                    ``reward`` (:mod:`search.reward_shaping`), ``variant_id``,
                    ``evidence`` (JSON text: record keys, gate reports)
``reward``          the last turn's reward; ``best_reward`` the best turn's
``n_turns``         ``len(turns)``
``synthetic``       True when a CPU stand-in gave the verdicts (not measurements)
``time``            when it was written (seconds since the epoch)
==================  ==============================================================

``evidence`` is JSON text so that every row has the same columns (polars, ``datasets``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import polars as pl

from kernels.records import read_evaluations, read_jsonl
from kernels.verdict import Status
from search.reward_shaping import Shaping

SCHEMA = "kernel-search.trajectory/1"
MESSAGE = pl.Struct({"role": pl.String, "content": pl.String})
TURN = pl.Struct({"response": pl.String, "feedback": pl.String, "status": pl.String, "speedup": pl.Float64,
                  "reward": pl.Float64, "variant_id": pl.String, "evidence": pl.String})
POLARS_SCHEMA: dict[str, Any] = {
    "schema": pl.String, "trajectory_id": pl.String, "origin": pl.String, "run_id": pl.String,
    "kernel": pl.String, "dtype": pl.String, "messages": pl.List(MESSAGE), "turns": pl.List(TURN),
    "reward": pl.Float64, "best_reward": pl.Float64, "n_turns": pl.Int64, "synthetic": pl.Boolean,
    "time": pl.Float64,
}


class TrajectoryError(ValueError):
    """A row that does not follow the schema."""


@dataclass(frozen=True)
class Turn:
    """One proposal and its verdict (see the module docstring)."""

    response: str
    feedback: str
    status: str
    reward: float | None
    speedup: float | None = None
    variant_id: str = ""
    evidence: str = "{}"


@dataclass(frozen=True)
class Trajectory:
    """One row of a trajectory file (see the module docstring)."""

    trajectory_id: str
    origin: str
    run_id: str
    kernel: str
    dtype: str
    messages: tuple[dict[str, str], ...]
    turns: tuple[Turn, ...]
    synthetic: bool = False
    time: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.origin not in ("search", "service"):
            raise TrajectoryError(f"origin must be search or service, got {self.origin!r}")
        if any(set(m) != {"role", "content"} for m in self.messages):
            raise TrajectoryError("each message needs exactly role and content")

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.turns if t.reward is not None]

    def to_dict(self) -> dict[str, Any]:
        rewards = self.rewards
        return {"schema": SCHEMA, "trajectory_id": self.trajectory_id, "origin": self.origin,
                "run_id": self.run_id, "kernel": self.kernel, "dtype": self.dtype,
                "messages": [dict(m) for m in self.messages], "turns": [asdict(t) for t in self.turns],
                "reward": rewards[-1] if rewards else None, "best_reward": max(rewards) if rewards else None,
                "n_turns": len(self.turns), "synthetic": self.synthetic, "time": self.time}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trajectory:
        """Reads a row; unknown fields are ignored.

        Raises:
            TrajectoryError: a missing field or another schema version.
        """
        if d.get("schema", SCHEMA) != SCHEMA:
            raise TrajectoryError(f"schema {d.get('schema')!r}; this reader knows {SCHEMA}")
        known = {f.name for f in fields(Turn)}
        try:
            turns = tuple(Turn(**{k: v for k, v in t.items() if k in known}) for t in d["turns"])
            return cls(str(d["trajectory_id"]), str(d["origin"]), str(d.get("run_id", "")), str(d["kernel"]),
                       str(d["dtype"]), tuple({"role": str(m["role"]), "content": str(m["content"])}
                                              for m in d["messages"]),
                       turns, bool(d.get("synthetic", False)), float(d.get("time") or 0.0))
        except (KeyError, TypeError) as exc:
            raise TrajectoryError(f"not a trajectory row: {type(exc).__name__}: {exc}") from None


def write_trajectories(path: Path, rows: Iterable[Trajectory]) -> Path:
    """Writes rows as JSONL (replacing the file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r.to_dict(), separators=(",", ":")) + "\n" for r in rows))
    return path


def read_trajectories(path: Path) -> pl.DataFrame:
    """A trajectory file as a polars frame with :data:`POLARS_SCHEMA` (rows checked)."""
    rows = [Trajectory.from_dict(d).to_dict() for d in read_jsonl(Path(path))]
    return pl.DataFrame(rows, schema=POLARS_SCHEMA)


def _outcome_reward(shaping: Shaping, status: str, speedup: float | None) -> float | None:
    """A search step's reward under the service's shaping (None: never evaluated)."""
    if status in Status.__members__:
        return shaping.score(Status(status), speedup if status == "OK" else None)
    return shaping.penalties.get(status)


def from_search_run(run_dir: Path, shaping: Shaping | None = None) -> list[Trajectory]:
    """A search run's lineage paths (:func:`search.export.export_run`'s trajectories) in
    this schema, each step a turn with its variant's source and the evaluator's message,
    rewarded with ``shaping`` so that search and service rewards compare."""
    from search.export import export_run

    shaping = shaping or Shaping()
    run_dir = Path(run_dir)
    evaluations = read_evaluations(run_dir / "evaluations.jsonl")
    sources = {r.variant.id: r.variant.source for r in evaluations}
    feedback: dict[str, str] = {}
    keys: dict[str, list[str]] = {}
    for r in evaluations:
        feedback[r.variant.id] = r.evaluation.message
        keys.setdefault(r.variant.id, []).append(r.key)
    with tempfile.TemporaryDirectory(prefix="ksearch-traj-") as tmp:
        exported = export_run(run_dir, "jsonl", Path(tmp))["trajectories"]
        rows = list(read_jsonl(exported))
    out = []
    for row in rows:
        turns = tuple(Turn(
            response=f"```cuda\n{sources[s['variant_id']].strip()}\n```" if s["variant_id"] in sources else "",
            feedback=feedback.get(s["variant_id"], ""), status=s["status"],
            reward=_outcome_reward(shaping, s["status"], s["speedup"]), speedup=s["speedup"],
            variant_id=s["variant_id"],
            evidence=json.dumps({"run_id": row["run_id"], "proposal_id": s["proposal_id"],
                                 "eval_keys": keys.get(s["variant_id"], [])}),
        ) for s in row["steps"])
        out.append(Trajectory(f"{row['run_id']}:{row['trajectory_id']}", "search", row["run_id"], row["kernel"],
                              row["dtype"] or "", tuple(row["messages"]), turns, bool(row["synthetic"])))
    return out


def from_service(service_dir: Path) -> list[Trajectory]:
    """A reward service's single requests (``rewards.jsonl`` lines not part of an episode:
    episodes are in its ``trajectories.jsonl`` already), one single-turn trajectory each."""
    from search.reward_env import task_messages

    out, prompts = [], {}
    for row in read_jsonl(Path(service_dir) / "rewards.jsonl"):
        if row.get("episode_id"):
            continue
        key = (row["kernel"], row["dtype"])
        if not row.get("messages") and key not in prompts:
            prompts[key] = task_messages(*key)
        prompt = row.get("messages") or prompts[key]
        response = row.get("response") or f"```cuda\n{row['source'].strip()}\n```"
        evidence = {"request_id": row["request_id"], "cached": row.get("cached"), **(row.get("evidence") or {})}
        turn = Turn(row["source"], row.get("feedback") or "", row["status"], row["score"], row.get("speedup"),
                    row["variant_id"], json.dumps(evidence, default=str))
        out.append(Trajectory(f"request:{row['request_id']}", "service", Path(service_dir).name, row["kernel"],
                              row["dtype"], (*prompt, {"role": "assistant", "content": response}), (turn,),
                              bool(row.get("synthetic")), float(row.get("time") or 0.0)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m search.trajectory",
                                     description="Writes trajectories of a search run or a reward service's "
                                                 "requests in the RL trajectory schema.")
    parser.add_argument("run_dir", type=Path, help="a run directory (runs/<id>) or a reward service's directory")
    parser.add_argument("--out", type=Path, default=None, help="output file (default DIR/export/rl_trajectories.jsonl)")
    args = parser.parse_args(argv)
    try:
        if (args.run_dir / "rewards.jsonl").is_file():
            rows = from_service(args.run_dir)
        else:
            rows = from_search_run(args.run_dir)
    except (FileNotFoundError, TrajectoryError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    path = write_trajectories(args.out or args.run_dir / "export" / "rl_trajectories.jsonl", rows)
    print(f"{len(rows)} trajectories: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
