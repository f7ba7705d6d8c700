"""A tiny deterministic agent for the search tests (stands in for the embedded backend).

Each proposal applies one textual change to the parent: restrict-qualified pointers,
fast intrinsics, a tunable block size, or a deliberately broken or crashing variant, so a
short run exercises improvement, tuning, compile errors and failures fed back to the agent.
"""

from __future__ import annotations

import re
from dataclasses import replace

from agents.base import Agent, AgentContext, Attempt, Proposal


def _restrict(src: str) -> str:
    return src.replace("scalar_t* out", "scalar_t* __restrict__ out", 1)


def _fast_exp(src: str) -> str:
    return src.replace("expf(", "__expf(")


def _tunable_block(src: str) -> str:
    if "// tune:" in src:
        return src
    src = re.sub(r"block=\(\d+,\)", "block=(BLOCK,)", src, count=1)
    return src.replace("// launch:", "// tune: BLOCK=256,128,512\n// launch:", 1)


def _broken(src: str) -> str:
    return src.replace("{", "{ this does not compile;", 1)


def _crashing(src: str) -> str:
    # The marker alone would leave the binary unchanged (and be deduplicated): change code too.
    return "// standin: crash\n" + src.replace("1.0f +", "1.0000001f +")


def _comment_only(src: str) -> str:
    return "// a comment changes the source, not the binary\n" + src


EDITS = (
    ("restrict", _restrict), ("fast_exp", _fast_exp), ("tunable_block", _tunable_block),
    ("broken", _broken), ("crash", _crashing), ("comment", _comment_only),
)


class ToyAgent(Agent):
    """Applies the edits in a seed-dependent order; remembers the verdicts it observed."""

    name = "toy"

    def __init__(self, config: object = None, seed: int = 0) -> None:
        self.seed = seed
        self.observed: list[Attempt] = []

    def propose(self, ctx: AgentContext) -> list[Proposal]:
        out = []
        start = (self.seed + ctx.round * ctx.n_variants) % len(EDITS)
        for k in range(ctx.n_variants):
            name, edit = EDITS[(start + k) % len(EDITS)]
            source = edit(ctx.parent.source)
            if source == ctx.parent.source:
                out.append(Proposal(ctx.parent, name, failure=f"{name}: nothing to change"))
                continue
            variant = replace(ctx.parent, source=source, parent=ctx.parent.id, author=f"toy-{self.seed}", note=name,
                              round=ctx.round)
            out.append(Proposal(variant, transformation=name))
        return out

    def observe(self, attempts: list[Attempt]) -> None:
        self.observed.extend(attempts)


class HeldoutCheater(ToyAgent):
    """Agent 0 also proposes a variant that the stand-in scores fastest on the search shapes
    (two real edits plus a comment naming float4) but that fails on the held-out shapes."""

    def propose(self, ctx: AgentContext) -> list[Proposal]:
        out = list(super().propose(ctx))
        if self.seed != 0:
            return out
        src = _fast_exp(_restrict(ctx.parent.source))
        src = "// standin: incorrect-heldout\n// float4 loads (the stand-in rewards the word)\n" + src
        variant = replace(ctx.parent, source=src, parent=ctx.parent.id, author=f"toy-{self.seed}", note="cheat")
        return [*out[: ctx.n_variants - 1], Proposal(variant, "cheat")]
