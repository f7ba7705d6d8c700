"""An agent that slips faulty and cheating kernels into another agent's proposals.

Used to show that a search survives hostile proposals with every one accounted for: with
probability ``fault_fraction`` each proposal of the wrapped agent is replaced by an
adversarial fixture (crash, hang, cheat, compile error, ...) for the same kernel. Choose it
with ``agent.kind: agents.faulty:FaultInjectingAgent`` and ``agent.options``:
``fault_fraction`` (default 0.2), ``fixtures`` (default ``tests/adversarial/fixtures.yaml``)
and ``inner`` (the wrapped agent kind, default ``embedded``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from agents.base import Agent, AgentContext, Proposal
from kernels.variant import Variant

DEFAULT_FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "adversarial" / "fixtures.yaml"


def load_hostile_fixtures(index: Path) -> dict[str, list[dict[str, Any]]]:
    """Fixtures whose expected verdict is not OK, grouped by kernel (source text included)."""
    data = yaml.safe_load(index.read_text())
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for fx in data.get("fixtures", []):
        if fx.get("status") == "OK":
            continue
        entry = dict(fx, source=(index.parent / fx["file"]).read_text())
        by_kernel.setdefault(fx["kernel"], []).append(entry)
    return by_kernel


class FaultInjectingAgent(Agent):
    """Wraps an agent and replaces a fraction of its proposals with hostile kernels."""

    name = "faulty"

    def __init__(self, config: Any, seed: int) -> None:
        from agents.factory import make_agent

        options = dict(getattr(config, "options", {}) or {})
        self.fraction = float(options.get("fault_fraction", 0.2))
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fault_fraction must be within [0, 1], got {self.fraction}")
        self.fixtures = load_hostile_fixtures(Path(options.get("fixtures", DEFAULT_FIXTURES)))
        self.inner = make_agent(options.get("inner", "embedded"), config, seed)
        self.rng = random.Random(seed)
        self.seed = seed

    def propose(self, ctx: AgentContext) -> Sequence[Proposal]:
        proposals = list(self.inner.propose(ctx))
        hostile = self.fixtures.get(ctx.kernel, [])
        out = []
        for i, proposal in enumerate(proposals):
            if hostile and self.rng.random() < self.fraction:
                fx = self.rng.choice(hostile)
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
