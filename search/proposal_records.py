"""Typed lines of ``proposals.jsonl`` and ``llm_calls.jsonl``, for every reader of a run.

The writer is :class:`search.records.RunRecords`; evaluations have their own record type
(:class:`kernels.records.EvalRecord`). Readers go through these records instead of indexing
raw dicts, so a renamed or missing field fails in one place. ``from_dict`` ignores unknown
fields (newer versions) and fills absent optional ones, so old runs still load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.records import read_jsonl
from kernels.variant import Variant

TESTER_ROLE = "tester"


@dataclass(frozen=True)
class ProposalRecord:
    """One line of ``proposals.jsonl``: what an agent proposed in a round.

    Attributes:
        run_id / kernel / dtype / round / agent: where it belongs.
        variant: the proposed variant (the parent itself when the proposal failed).
        variant_id: the variant's id as recorded.
        transformation: the planner's suggestion or the embedded transformation's name.
        failure: why the proposal has no usable variant ('' when it has one).
        n_calls: LLM calls the proposal made.
        time: wall-clock timestamp (seconds since the epoch).
    """

    run_id: str
    kernel: str
    dtype: str
    round: int
    agent: str
    variant: Variant
    transformation: str = ""
    failure: str = ""
    n_calls: int = 0
    time: float = 0.0
    variant_id: str = ""

    def __post_init__(self) -> None:
        # The id as written is what other lines (parents, calls) refer to; a line without one
        # gets the variant's own.
        if not self.variant_id:
            object.__setattr__(self, "variant_id", self.variant.id)

    @property
    def proposal_id(self) -> str:
        """The agent's id for the proposal (LLM agents set ``meta.proposal_id``), else ''."""
        return str((self.variant.meta or {}).get("proposal_id") or "")

    @property
    def failed(self) -> bool:
        return bool(self.failure)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProposalRecord:
        variant = Variant.from_dict(d["variant"])
        return cls(
            run_id=str(d.get("run_id", "")),
            kernel=str(d.get("kernel") or variant.kernel),
            dtype=str(d.get("dtype", "")),
            round=int(d.get("round", variant.round)),
            agent=str(d.get("agent") or variant.author),
            variant=variant,
            transformation=str(d.get("transformation") or ""),
            failure=str(d.get("failure") or ""),
            n_calls=int(d.get("n_calls", 0)),
            time=float(d.get("time", 0.0)),
            variant_id=str(d.get("variant_id") or d["variant"].get("id") or ""),
        )


@dataclass(frozen=True)
class CallRecord:
    """One line of ``llm_calls.jsonl``: one chat completion asked by an agent role.

    Attributes:
        role: tester, planner, coder or single.
        model: the model asked.
        messages: the prompt, ``{role, content}`` dicts.
        reply: the reply text ('' when the call failed).
        prompt_tokens / completion_tokens: usage as the server reported it.
        latency_s: wall time of the call, retries included.
        cost_usd: from the price table (0 for unpriced models).
        attempts: requests sent.
        error: '' or the last error after the retries.
        call_id: unique id of the call.
        proposal_id: the proposal it belongs to ('' for tester and shared planner calls).
        plan_call_id: coder calls: the planner call they implement.
        variant_id: the variant of the proposal it belongs to ('' for tester calls).
        kernel / run_id / round: where it belongs.
        accepted_shapes / rejected_shapes: tester calls: the shapes kept, and why others were not.
    """

    role: str
    model: str = ""
    messages: tuple[dict[str, str], ...] = ()
    reply: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0
    attempts: int = 0
    error: str = ""
    call_id: str = ""
    proposal_id: str = ""
    plan_call_id: str = ""
    variant_id: str = ""
    kernel: str = ""
    run_id: str = ""
    round: int = 0
    accepted_shapes: tuple[dict[str, int], ...] = ()
    rejected_shapes: tuple[str, ...] = field(default=())

    @property
    def is_tester(self) -> bool:
        return self.role == TESTER_ROLE

    def chat(self) -> list[dict[str, str]]:
        """The conversation of the call: its prompt, then the reply as the assistant's turn."""
        return [*(dict(m) for m in self.messages), {"role": "assistant", "content": self.reply}]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CallRecord:
        usage = d.get("usage") or {}
        return cls(
            role=str(d["role"]),
            model=str(d.get("model") or ""),
            messages=tuple({"role": str(m["role"]), "content": str(m.get("content") or "")}
                           for m in d.get("messages") or ()),
            reply=str(d.get("reply") or ""),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_s=float(d.get("latency_s") or 0.0),
            cost_usd=float(d.get("cost_usd") or 0.0),
            attempts=int(d.get("attempts") or 0),
            error=str(d.get("error") or ""),
            call_id=str(d.get("call_id") or ""),
            proposal_id=str(d.get("proposal_id") or ""),
            plan_call_id=str(d.get("plan_call_id") or ""),
            variant_id=str(d.get("variant_id") or ""),
            kernel=str(d.get("kernel") or ""),
            run_id=str(d.get("run_id") or ""),
            round=int(d.get("round") or 0),
            accepted_shapes=tuple({str(k): int(v) for k, v in s.items()} for s in d.get("accepted_shapes") or ()),
            rejected_shapes=tuple(str(r) for r in d.get("rejected_shapes") or ()),
        )


def read_proposals(path: Path) -> list[ProposalRecord]:
    """Every complete line of a ``proposals.jsonl`` as a typed record."""
    return [ProposalRecord.from_dict(d) for d in read_jsonl(path)]


def read_calls(path: Path) -> list[CallRecord]:
    """Every complete line of an ``llm_calls.jsonl`` as a typed record."""
    return [CallRecord.from_dict(d) for d in read_jsonl(path)]
