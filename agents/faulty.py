"""An agent that slips faulty and cheating kernels into another agent's proposals.

Used to show that a search survives hostile proposals with every one accounted for: with
probability ``fault_fraction`` each proposal of the wrapped agent is replaced by an
adversarial fixture (crash, hang, cheat, compile error, ...) for the same kernel. Choose it
with ``agent.kind: agents.faulty:FaultInjectingAgent`` and ``agent.options``:
``fixtures`` (required: the path of a fixtures index, a YAML file whose ``fixtures`` list
names each kernel file with its ``kernel`` and expected ``status``; relative paths are taken
from the working directory), ``select`` (optional: the file names to draw from, to aim a run
at one class of cheats), ``fault_fraction`` (default 0.2) and ``inner`` (the wrapped agent
kind, default ``embedded``). The hostile corpus is the caller's to choose, so the
agent carries no default that would tie product code to a test suite's files.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from agents.base import Agent, AgentContext, Proposal, derive_seed
from agents.factory import AgentConfigError, make_agent
from kernels.variant import Variant
from kernels.verdict import Status


def load_hostile_fixtures(index: Path, select: Sequence[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """Every fixture but the honest ones (whose ``trick`` reads 'none; ...'), grouped by
    kernel, source text included. Cheats the evaluator alone judges OK are kept: the end of a
    run (peers' loop, sanitizer) must still keep them from being reported.

    Raises:
        AgentConfigError: the index is missing, not YAML, or lists no fixtures.
    """
    if not index.is_file():
        raise AgentConfigError(f"agent.options.fixtures: {index} is not a file (give the path of a fixtures index)")
    try:
        data = yaml.safe_load(index.read_text()) or {}
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"agent.options.fixtures: {index} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not data.get("fixtures"):
        raise AgentConfigError(f"agent.options.fixtures: {index} has no 'fixtures' list")
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for fx in data["fixtures"]:
        try:
            Status(fx["status"])
        except (KeyError, ValueError):
            raise AgentConfigError(f"agent.options.fixtures: {index}: fixture {fx.get('file')} has no valid "
                                   f"status (one of {', '.join(Status)})") from None
        if str(fx.get("trick", "")).strip().lower().startswith("none"):
            continue  # an honest kernel; OK-verdict cheats (peers' loop, sanitizer) stay hostile
        if select and fx.get("file") not in select:
            continue
        entry = dict(fx, source=(index.parent / fx["file"]).read_text())
        by_kernel.setdefault(fx["kernel"], []).append(entry)
    return by_kernel


class FaultInjectingAgent(Agent):
    """Wraps an agent and replaces a fraction of its proposals with hostile kernels."""

    name = "faulty"

    def __init__(self, config: Any, seed: int) -> None:
        options = dict(getattr(config, "options", {}) or {})
        self.fraction = float(options.get("fault_fraction", 0.2))
        if not 0.0 <= self.fraction <= 1.0:
            raise AgentConfigError(f"fault_fraction must be within [0, 1], got {self.fraction}")
        if not options.get("fixtures"):
            raise AgentConfigError("agent.options.fixtures is required: the path of the fixtures index whose "
                             "hostile kernels the agent injects (e.g. tests/adversarial/fixtures.yaml)")
        select = tuple(options.get("select") or ())
        self.fixtures = load_hostile_fixtures(Path(options["fixtures"]), select)
        unknown = set(select) - {fx["file"] for group in self.fixtures.values() for fx in group}
        if unknown:
            raise AgentConfigError(f"agent.options.select names no hostile fixture of the index: {sorted(unknown)}")
        self.inner = make_agent(options.get("inner", "embedded"), config, seed)
        self.seed = seed

    def propose(self, ctx: AgentContext) -> Sequence[Proposal]:
        proposals = list(self.inner.propose(ctx))
        hostile = self.fixtures.get(ctx.kernel, [])
        out = []
        # Drawn from the request alone (its seed already names run, kernel, round and slot), so
        # the same request gets the same injections in a run and in its resume.
        rng = random.Random(derive_seed(self.seed, ctx.seed, ctx.kernel, ctx.round))
        for i, proposal in enumerate(proposals):
            if hostile and rng.random() < self.fraction:
                fx = rng.choice(hostile)
                # A unique trailing comment: each injected proposal is its own variant, so
                # deduplication cannot hide how many hostile proposals the run received.
                source = fx["source"] + f"\n// injected by agent {self.seed}, round {ctx.round}, slot {i}\n"
                variant = Variant(ctx.kernel, source, parent=ctx.parent.id, author=f"faulty-{self.seed}",
                                  note=f"injected fixture {fx['file']}", round=ctx.round,
                                  meta={"injected": fx["file"], "expected_status": fx["status"],
                                        "expected_guard": fx.get("guard", "")})
                out.append(Proposal(variant, transformation=f"injected:{fx['file']}"))
            else:
                out.append(replace(proposal))
        return out

    def observe(self, attempts: Sequence[Any]) -> None:
        self.inner.observe([a for a in attempts if not a.variant.meta.get("injected")])
