"""Exports a run's records as training data: chat samples and multi-turn trajectories.

``python -m search.export runs/<id> --format jsonl|parquet [--out PATH] [--zero-penalty]``

Reads ``evaluations.jsonl``, ``proposals.jsonl`` and ``llm_calls.jsonl`` and writes
``samples.<fmt>`` (one row per LLM call, and one per embedded proposal, each a chat in
``messages`` ending with the model's reply, with the reward of the variant it led to) and
``trajectories.<fmt>`` (one row per lineage path from the baseline to a leaf proposal, its
turns concatenated in one chat, with per-step rewards). docs/llm.md documents the schema.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from kernels.records import read_jsonl

# Reward of a variant that did not pass: worse for what cannot run or cheats than for a
# kernel that ran and was only wrong. NO_VARIANT: the agent produced no code.
PENALTIES: dict[str, float] = {
    "COMPILE_ERROR": -1.0,
    "RESOURCE_ERROR": -0.5,
    "INCORRECT": -0.5,
    "CRASH": -1.0,
    "TIMEOUT": -1.0,
    "REJECTED": -1.0,
    "NO_VARIANT": -1.0,
    "NOT_EVALUATED": 0.0,
}
_AUTHORITATIVE_STAGES = ("final", "full")

MESSAGE = pl.Struct({"role": pl.String, "content": pl.String})
SAMPLE_SCHEMA: dict[str, Any] = {
    "run_id": pl.String, "kernel": pl.String, "dtype": pl.String, "round": pl.Int64,
    "agent": pl.String, "origin": pl.String, "proposal_id": pl.String, "call_id": pl.String,
    "role": pl.String, "model": pl.String, "variant_id": pl.String, "parent_id": pl.String,
    "transformation": pl.String, "messages": pl.List(MESSAGE), "completion": pl.String,
    "status": pl.String, "speedup": pl.Float64, "reward": pl.Float64,
    "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64, "latency_s": pl.Float64,
    "cost_usd": pl.Float64, "error": pl.String, "failure": pl.String,
}
STEP = pl.Struct({
    "proposal_id": pl.String, "variant_id": pl.String, "parent_id": pl.String, "round": pl.Int64,
    "status": pl.String, "speedup": pl.Float64, "reward": pl.Float64, "transformation": pl.String,
})
STEP_KEYS = tuple(f.name for f in STEP.fields)
TRAJECTORY_SCHEMA: dict[str, Any] = {
    "run_id": pl.String, "kernel": pl.String, "dtype": pl.String, "agent": pl.String,
    "trajectory_id": pl.String, "root_id": pl.String, "leaf_variant_id": pl.String,
    "n_steps": pl.Int64, "messages": pl.List(MESSAGE), "steps": pl.List(STEP),
    "step_rewards": pl.List(pl.Float64), "reward": pl.Float64, "best_reward": pl.Float64,
    "status": pl.String,
}


def variant_outcomes(evaluations: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, float | None, str]]:
    """Per variant id: (status, speedup, dtype) from its search-shape evaluations.

    An OK verdict wins over failures (a variant can fail at one parameter assignment and
    pass at another); among OK ones the full-protocol stages win over screening, then the
    highest speedup. Without any OK verdict the latest status stands.
    """
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for rec in evaluations:
        groups[rec["variant"]["id"]].append(rec)
    out: dict[str, tuple[str, float | None, str]] = {}
    for vid, recs in groups.items():
        search = [r for r in recs if r.get("shape_set", "search") == "search"] or recs
        ok = [r for r in search if r["evaluation"]["status"] == "OK" and r["evaluation"].get("speedup")]
        if ok:
            full = [r for r in ok if r.get("stage") in _AUTHORITATIVE_STAGES] or ok
            best = max(full, key=lambda r: float(r["evaluation"]["speedup"]))
            out[vid] = ("OK", float(best["evaluation"]["speedup"]), best.get("dtype", ""))
        else:
            last = search[-1]
            out[vid] = (last["evaluation"]["status"], None, last.get("dtype", ""))
    return out


def reward(status: str, speedup: float | None, zero_penalty: bool = False) -> float:
    if status == "OK" and speedup is not None:
        return float(speedup)
    return 0.0 if zero_penalty else PENALTIES.get(status, -1.0)


def _proposal_nodes(
    proposals: Sequence[Mapping[str, Any]], outcomes: Mapping[str, tuple[str, float | None, str]], zero_penalty: bool
) -> list[dict[str, Any]]:
    nodes = []
    for i, p in enumerate(proposals):
        v = p["variant"]
        vid = p.get("variant_id") or v["id"]
        failed = bool(p.get("failure"))
        if failed:
            status, speedup, dtype = "NO_VARIANT", None, ""
        else:
            status, speedup, dtype = outcomes.get(vid, ("NOT_EVALUATED", None, ""))
        nodes.append({
            "proposal_id": (v.get("meta") or {}).get("proposal_id") or f"{vid}:{i}",
            "variant_id": vid, "parent_id": vid if failed else v.get("parent", ""),
            "source": v["source"], "failed": failed, "failure": p.get("failure", ""),
            "run_id": p.get("run_id", ""), "kernel": p.get("kernel") or v.get("kernel", ""),
            "dtype": p.get("dtype") or dtype, "round": int(p.get("round", v.get("round", 0))),
            "agent": p.get("agent") or v.get("author", ""), "transformation": p.get("transformation", ""),
            "status": status, "speedup": speedup, "reward": reward(status, speedup, zero_penalty),
        })
    return nodes


def _embedded_messages(node: Mapping[str, Any], parent_source: str) -> list[dict[str, str]]:
    """An embedded proposal as a chat: parent source and transformation in, child out."""
    prompt = (f"Kernel `{node['kernel']}`. Apply the transformation: {node['transformation'] or 'unnamed'}\n"
              f"```cuda\n{parent_source.strip()}\n```")
    reply = "" if node["failed"] else f"```cuda\n{node['source'].strip()}\n```"
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]


def _sample(node: Mapping[str, Any], call: Mapping[str, Any] | None, messages: list[dict[str, str]],
            reward_value: float) -> dict[str, Any]:
    call = call or {}
    usage = call.get("usage") or {}
    return {
        "run_id": node["run_id"], "kernel": node["kernel"], "dtype": node["dtype"], "round": node["round"],
        "agent": node["agent"], "origin": "llm" if call else "embedded", "proposal_id": node["proposal_id"],
        "call_id": call.get("call_id", ""), "role": call.get("role", "transformation"),
        "model": call.get("model", ""), "variant_id": node["variant_id"], "parent_id": node["parent_id"],
        "transformation": node["transformation"], "messages": messages,
        "completion": messages[-1]["content"] if messages else "", "status": node["status"],
        "speedup": node["speedup"], "reward": reward_value,
        "prompt_tokens": int(usage.get("prompt_tokens") or 0), "completion_tokens": int(usage.get("completion_tokens") or 0),
        "latency_s": float(call.get("latency_s") or 0.0), "cost_usd": float(call.get("cost_usd") or 0.0),
        "error": call.get("error", ""), "failure": node["failure"],
    }


def _chat(call: Mapping[str, Any]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in call.get("messages", [])] + [
        {"role": "assistant", "content": call.get("reply", "")}
    ]


class _Run:
    """The joined records of one run: proposals as nodes, calls by proposal and by id."""

    def __init__(self, run_dir: Path, zero_penalty: bool) -> None:
        evaluations = list(read_jsonl(run_dir / "evaluations.jsonl"))
        self.nodes = _proposal_nodes(list(read_jsonl(run_dir / "proposals.jsonl")),
                                     variant_outcomes(evaluations), zero_penalty)
        self.sources = {r["variant"]["id"]: r["variant"]["source"] for r in evaluations}
        self.sources.update({n["variant_id"]: n["source"] for n in self.nodes})
        by_variant = {n["variant_id"]: n["proposal_id"] for n in self.nodes if not n["failed"]}
        self.calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.call_by_id: dict[str, dict[str, Any]] = {}
        for c in read_jsonl(run_dir / "llm_calls.jsonl"):
            pid = c.get("proposal_id") or by_variant.get(c.get("variant_id", ""), "")
            self.calls[pid].append(c)
            if c.get("call_id"):
                self.call_by_id[c["call_id"]] = c
        node_of = {n["proposal_id"]: n for n in self.nodes}
        # A shared planner call is credited with the best of the proposals it led to.
        self.plan_reward: dict[str, float] = {}
        for pid, calls in self.calls.items():
            for c in calls:
                for cid in {str(c.get("call_id") or ""), str(c.get("plan_call_id") or "")} - {""}:
                    if pid in node_of:
                        r = node_of[pid]["reward"]
                        self.plan_reward[cid] = max(self.plan_reward.get(cid, r), r)
        self.producer: dict[str, dict[str, Any]] = {}
        for n in sorted(self.nodes, key=lambda n: n["round"]):
            if not n["failed"]:
                self.producer.setdefault(n["variant_id"], n)

    def step_calls(self, node: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The calls of a proposal, the shared planner call it used first."""
        own = self.calls.get(node["proposal_id"], [])
        plan_ids = {c.get("plan_call_id") for c in own} - {None, ""}
        own_ids = {c.get("call_id") for c in own}
        shared = [self.call_by_id[i] for i in plan_ids if i in self.call_by_id and i not in own_ids]
        return shared + own

    def samples(self) -> list[dict[str, Any]]:
        rows = []
        for n in self.nodes:
            calls = self.calls.get(n["proposal_id"], [])
            if not calls:
                parent_source = self.sources.get(n["parent_id"], "")
                rows.append(_sample(n, None, _embedded_messages(n, parent_source), n["reward"]))
            for c in calls:
                rows.append(_sample(n, c, _chat(c), self.plan_reward.get(c.get("call_id", ""), n["reward"])))
        return rows

    def chain(self, leaf: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        steps, seen = [leaf], {leaf["proposal_id"]}
        while (prev := self.producer.get(steps[-1]["parent_id"])) is not None and prev["proposal_id"] not in seen:
            steps.append(prev)
            seen.add(prev["proposal_id"])
        return steps[::-1]

    def trajectory_messages(self, steps: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
        messages: list[dict[str, str]] = []
        for n in steps:
            calls = self.step_calls(n)
            if not calls:
                messages += _embedded_messages(n, self.sources.get(n["parent_id"], ""))
            prev: list[dict[str, str]] = []
            for c in calls:
                chat = _chat(c)
                prompt = chat[:-1]
                # A repair turn repeats its conversation so far: add only what is new.
                messages += chat[len(prev):] if prev and prompt[: len(prev)] == prev else chat
                prev = chat
        return messages

    def trajectories(self) -> list[dict[str, Any]]:
        parents = {n["parent_id"] for n in self.nodes if not n["failed"]}
        rows = []
        for leaf in self.nodes:
            if not leaf["failed"] and leaf["variant_id"] in parents:
                continue
            steps = self.chain(leaf)
            rewards = [float(s["reward"]) for s in steps]
            rows.append({
                "run_id": leaf["run_id"], "kernel": leaf["kernel"], "dtype": leaf["dtype"], "agent": leaf["agent"],
                "trajectory_id": leaf["proposal_id"], "root_id": steps[0]["parent_id"],
                "leaf_variant_id": leaf["variant_id"], "n_steps": len(steps),
                "messages": self.trajectory_messages(steps),
                "steps": [{k: s[k] for k in STEP_KEYS} for s in steps],
                "step_rewards": rewards, "reward": rewards[-1], "best_reward": max(rewards),
                "status": leaf["status"],
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
    parser = argparse.ArgumentParser(prog="python -m search.export", description=__doc__.split("\n\n")[0])
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
