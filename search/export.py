"""Exports a run's records as training data: chat samples and multi-turn trajectories.

``python -m search.export runs/<id> --format jsonl|parquet [--out PATH] [--zero-penalty]``

Reads ``evaluations.jsonl``, ``proposals.jsonl`` and ``llm_calls.jsonl`` through their record
types and writes ``samples.<fmt>`` (one row per LLM call, tester calls included, and one per
embedded proposal, each a chat in ``messages`` ending with the model's reply, with the reward
of the variant it led to) and ``trajectories.<fmt>`` (one row per lineage path from the
baseline to a leaf proposal and per agent role on it, the role's turns in one chat with a
single leading system message, with per-step rewards). docs/llm.md documents the schema.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from kernels.records import read_evaluations
from search.config import ConfigError, load_config
from search.export_rewards import (
    STANDIN_EVALUATOR,
    Outcome,
    ProposalOutcome,
    VariantOutcome,
    reward,
    tester_reward,
    variant_outcomes,
)
from search.export_turns import EMBEDDED_ROLE, Conversation, embedded_messages, new_turns
from search.proposal_records import CallRecord, ProposalRecord, read_calls, read_proposals

MESSAGE = pl.Struct({"role": pl.String, "content": pl.String})
SAMPLE_SCHEMA: dict[str, Any] = {
    "run_id": pl.String, "kernel": pl.String, "dtype": pl.String, "round": pl.Int64,
    "agent": pl.String, "origin": pl.String, "proposal_id": pl.String, "call_id": pl.String,
    "role": pl.String, "model": pl.String, "variant_id": pl.String, "parent_id": pl.String,
    "transformation": pl.String, "messages": pl.List(MESSAGE), "completion": pl.String,
    "status": pl.String, "speedup": pl.Float64, "reward": pl.Float64, "synthetic": pl.Boolean,
    "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64, "latency_s": pl.Float64,
    "cost_usd": pl.Float64, "error": pl.String, "failure": pl.String,
    "shapes_accepted": pl.Int64, "shapes_rejected": pl.Int64,
}
STEP = pl.Struct({
    "proposal_id": pl.String, "variant_id": pl.String, "parent_id": pl.String, "round": pl.Int64,
    "status": pl.String, "speedup": pl.Float64, "reward": pl.Float64, "transformation": pl.String,
})
STEP_KEYS = tuple(f.name for f in STEP.fields)
TRAJECTORY_SCHEMA: dict[str, Any] = {
    "run_id": pl.String, "kernel": pl.String, "dtype": pl.String, "agent": pl.String,
    "trajectory_id": pl.String, "leaf_proposal_id": pl.String, "role": pl.String, "root_id": pl.String,
    "leaf_variant_id": pl.String, "n_steps": pl.Int64, "messages": pl.List(MESSAGE), "steps": pl.List(STEP),
    "step_rewards": pl.List(pl.Float64), "reward": pl.Float64, "best_reward": pl.Float64,
    "status": pl.String, "synthetic": pl.Boolean,
}


@dataclass(frozen=True)
class Node:
    """A proposal joined with the outcome of its variant."""

    proposal: ProposalRecord
    proposal_id: str
    parent_id: str
    dtype: str
    outcome: VariantOutcome
    reward: float

    @property
    def status(self) -> Outcome:
        return self.outcome.status

    def step(self) -> dict[str, Any]:
        p = self.proposal
        return {"proposal_id": self.proposal_id, "variant_id": p.variant_id, "parent_id": self.parent_id,
                "round": p.round, "status": self.status.value, "speedup": self.outcome.speedup,
                "reward": self.reward, "transformation": p.transformation}


def _nodes(proposals: Sequence[ProposalRecord], outcomes: Mapping[str, VariantOutcome],
           run_synthetic: bool, zero_penalty: bool) -> list[Node]:
    nodes = []
    for i, p in enumerate(proposals):
        vid = p.variant_id
        if p.failed:
            outcome = VariantOutcome(ProposalOutcome.NO_VARIANT)
        else:
            outcome = outcomes.get(vid, VariantOutcome(ProposalOutcome.NOT_EVALUATED))
        if run_synthetic and not outcome.synthetic:
            outcome = VariantOutcome(outcome.status, outcome.speedup, outcome.dtype, True)
        nodes.append(Node(
            proposal=p, proposal_id=p.proposal_id or f"{vid}:{i}",
            # A failed proposal carries its parent as the variant: its step starts from there.
            parent_id=vid if p.failed else p.variant.parent, dtype=p.dtype or outcome.dtype,
            outcome=outcome, reward=reward(outcome.status, outcome.speedup, zero_penalty),
        ))
    return nodes


def _sample(node: Node, call: CallRecord | None, messages: list[dict[str, str]], reward_value: float) -> dict[str, Any]:
    p = node.proposal
    return {
        "run_id": p.run_id, "kernel": p.kernel, "dtype": node.dtype, "round": p.round, "agent": p.agent,
        "origin": "llm" if call else "embedded", "proposal_id": node.proposal_id,
        "call_id": call.call_id if call else "", "role": call.role if call else EMBEDDED_ROLE,
        "model": call.model if call else "", "variant_id": p.variant_id, "parent_id": node.parent_id,
        "transformation": p.transformation, "messages": messages,
        "completion": messages[-1]["content"] if messages else "", "status": node.status.value,
        "speedup": node.outcome.speedup, "reward": reward_value, "synthetic": node.outcome.synthetic,
        "prompt_tokens": call.prompt_tokens if call else 0, "completion_tokens": call.completion_tokens if call else 0,
        "latency_s": call.latency_s if call else 0.0, "cost_usd": call.cost_usd if call else 0.0,
        "error": call.error if call else "", "failure": p.failure, "shapes_accepted": None, "shapes_rejected": None,
    }


def _tester_sample(call: CallRecord, dtype: str, synthetic: bool) -> dict[str, Any]:
    accepted, rejected = len(call.accepted_shapes), len(call.rejected_shapes)
    messages = call.chat()
    return {
        "run_id": call.run_id, "kernel": call.kernel, "dtype": dtype, "round": call.round, "agent": "tester",
        "origin": "llm", "proposal_id": "", "call_id": call.call_id, "role": call.role, "model": call.model,
        "variant_id": "", "parent_id": "", "transformation": "", "messages": messages,
        "completion": messages[-1]["content"], "status": "", "speedup": None,
        "reward": tester_reward(accepted, rejected), "synthetic": synthetic,
        "prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
        "latency_s": call.latency_s, "cost_usd": call.cost_usd, "error": call.error, "failure": "",
        "shapes_accepted": accepted, "shapes_rejected": rejected,
    }


def _run_uses_standin(run_dir: Path) -> bool:
    """Whether the run's resolved config chose the stand-in evaluator (synthetic numbers)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return False
    try:
        return load_config(path).evaluator.kind == STANDIN_EVALUATOR
    except ConfigError:
        return False  # an unreadable config: the evaluation records still say who judged


class _Run:
    """The joined records of one run: proposals as nodes, calls by proposal and by id."""

    def __init__(self, run_dir: Path, zero_penalty: bool) -> None:
        evaluations = read_evaluations(run_dir / "evaluations.jsonl")
        self.synthetic = _run_uses_standin(run_dir)
        self.nodes = _nodes(read_proposals(run_dir / "proposals.jsonl"), variant_outcomes(evaluations),
                            self.synthetic, zero_penalty)
        self.sources = {r.variant.id: r.variant.source for r in evaluations}
        self.sources.update({n.proposal.variant_id: n.proposal.variant.source for n in self.nodes})
        self.dtypes = {n.proposal.kernel: n.dtype for n in self.nodes if n.dtype}
        by_variant = {n.proposal.variant_id: n.proposal_id for n in self.nodes if not n.proposal.failed}
        calls = read_calls(run_dir / "llm_calls.jsonl")
        self.tester_calls = [c for c in calls if c.is_tester]
        self.calls: dict[str, list[CallRecord]] = defaultdict(list)
        self.call_by_id: dict[str, CallRecord] = {}
        for c in calls:
            if c.is_tester:
                continue
            self.calls[c.proposal_id or by_variant.get(c.variant_id, "")].append(c)
            if c.call_id:
                self.call_by_id[c.call_id] = c
        node_of = {n.proposal_id: n for n in self.nodes}
        # A shared planner call is credited with the best of the proposals it led to.
        self.plan_reward: dict[str, float] = {}
        for pid, pcalls in self.calls.items():
            if pid not in node_of:
                continue
            for c in pcalls:
                for cid in {c.call_id, c.plan_call_id} - {""}:
                    r = node_of[pid].reward
                    self.plan_reward[cid] = max(self.plan_reward.get(cid, r), r)
        self.producer: dict[str, Node] = {}
        for n in sorted(self.nodes, key=lambda n: n.proposal.round):
            if not n.proposal.failed:
                self.producer.setdefault(n.proposal.variant_id, n)

    def step_calls(self, node: Node) -> list[CallRecord]:
        """The calls of a proposal, the shared planner call it used first."""
        own = self.calls.get(node.proposal_id, [])
        own_ids = {c.call_id for c in own}
        plan_ids = sorted({c.plan_call_id for c in own} - {""} - own_ids)
        return [self.call_by_id[i] for i in plan_ids if i in self.call_by_id] + own

    def samples(self) -> list[dict[str, Any]]:
        rows = [_tester_sample(c, self.dtypes.get(c.kernel, ""), self.synthetic) for c in self.tester_calls]
        for n in self.nodes:
            calls = self.calls.get(n.proposal_id, [])
            if not calls:
                rows.append(_sample(n, None, embedded_messages(n.proposal, self._parent_source(n)), n.reward))
            for c in calls:
                rows.append(_sample(n, c, c.chat(), self.plan_reward.get(c.call_id, n.reward)))
        return rows

    def _parent_source(self, node: Node) -> str:
        return self.sources.get(node.parent_id, "")

    def chain(self, leaf: Node) -> list[Node]:
        steps, seen = [leaf], {leaf.proposal_id}
        while (prev := self.producer.get(steps[-1].parent_id)) is not None and prev.proposal_id not in seen:
            steps.append(prev)
            seen.add(prev.proposal_id)
        return steps[::-1]

    def conversations(self, steps: Sequence[Node]) -> dict[str, Conversation]:
        """The path's turns split by the role that took them, each role one conversation."""
        convs: dict[str, Conversation] = {}
        for n in steps:
            calls = self.step_calls(n)
            if not calls:
                convs.setdefault(EMBEDDED_ROLE, Conversation()).add(n, embedded_messages(n.proposal, self._parent_source(n)))
                continue
            by_role: dict[str, list[CallRecord]] = defaultdict(list)
            for c in calls:
                by_role[c.role].append(c)
            for role, role_calls in by_role.items():
                convs.setdefault(role, Conversation()).add(n, new_turns([c.chat() for c in role_calls]))
        return convs

    def trajectories(self) -> list[dict[str, Any]]:
        parents = {n.parent_id for n in self.nodes if not n.proposal.failed}
        rows = []
        for leaf in self.nodes:
            if not leaf.proposal.failed and leaf.proposal.variant_id in parents:
                continue
            path = self.chain(leaf)
            for role, conv in self.conversations(path).items():
                rewards = [float(s.reward) for s in conv.steps]
                rows.append({
                    "run_id": leaf.proposal.run_id, "kernel": leaf.proposal.kernel, "dtype": leaf.dtype,
                    "agent": leaf.proposal.agent, "trajectory_id": f"{leaf.proposal_id}:{role}",
                    "leaf_proposal_id": leaf.proposal_id, "role": role, "root_id": path[0].parent_id,
                    "leaf_variant_id": leaf.proposal.variant_id, "n_steps": len(conv.steps),
                    "messages": conv.messages, "steps": [s.step() for s in conv.steps],
                    "step_rewards": rewards, "reward": leaf.reward, "best_reward": max(rewards),
                    "status": leaf.status.value, "synthetic": any(s.outcome.synthetic for s in path),
                })
        return rows


def export_run(run_dir: Path, fmt: str = "jsonl", out: Path | None = None, zero_penalty: bool = False) -> dict[str, Path]:
    """Writes ``samples.<fmt>`` and ``trajectories.<fmt>``; returns their paths.

    Raises:
        FileNotFoundError: the run directory has no proposals.jsonl.
        ValueError: an unknown format.
    """
    run_dir = Path(run_dir)
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"format must be jsonl or parquet, got {fmt!r}")
    if not (run_dir / "proposals.jsonl").is_file():
        raise FileNotFoundError(f"{run_dir} has no proposals.jsonl: is it a run directory?")
    run = _Run(run_dir, zero_penalty)
    out = Path(out) if out else run_dir / "export"
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows, schema in (("samples", run.samples(), SAMPLE_SCHEMA),
                               ("trajectories", run.trajectories(), TRAJECTORY_SCHEMA)):
        path = out / f"{name}.{fmt}"
        if fmt == "parquet":
            pl.DataFrame(rows, schema=schema).write_parquet(path)
        else:
            path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
        paths[name] = path
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m search.export", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (runs/<id>)")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/export)")
    parser.add_argument("--zero-penalty", action="store_true", help="reward 0 instead of a penalty for failures")
    args = parser.parse_args(argv)
    try:
        paths = export_run(args.run_dir, args.format, args.out, args.zero_penalty)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
