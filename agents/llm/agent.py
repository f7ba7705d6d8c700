"""The LLM agent: planner + coder (or one single-agent prompt) over an OpenAI-compatible API.

One planner call per round proposes ``n_variants`` distinct changes; one coder conversation
per change writes the variant (in parallel, bounded by the endpoint's semaphore). Every call
becomes a record in ``Proposal.calls`` with a ``call_id`` and the ``proposal_id`` that the
variant also carries in ``meta``, so the exported trajectories can join calls, proposals and
verdicts. The shared planner call is recorded once, on the first proposal; the coder calls
of the others point at it through ``plan_call_id``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from agents.base import Agent, AgentContext, Proposal
from agents.llm.client import ChatClient, preflight
from agents.llm.config import LLMConfig
from agents.llm.cost import UsageLedger
from agents.llm.prompts import context_values
from agents.llm.roles import coder, planner, single, tester
from kernels.folders import KernelRef
from kernels.spec import KernelSpec, cached_kernel
from kernels.variant import Variant

_load_spec = cached_kernel  # one cache per process, keyed by reference


def coerce_config(config: Any) -> LLMConfig:
    """An :class:`LLMConfig` from one, a mapping, None (defaults), or a run config's agent
    section (an object with ``model`` and ``options``, the options holding the ``llm`` keys)."""
    if isinstance(config, LLMConfig):
        return config
    if config is None:
        return LLMConfig()
    if isinstance(config, Mapping):
        return LLMConfig.from_dict(config)
    options = dict(getattr(config, "options", None) or {})
    options = dict(options.get("llm", options))
    if getattr(config, "model", "") and "model" not in options:
        options["model"] = config.model
    return LLMConfig.from_dict(options)


class LLMAgent(Agent):
    """Proposes variants by asking a language model.

    Args:
        config: the ``llm`` settings (see :func:`coerce_config` for accepted forms).
        seed: per-agent seed (backoff jitter, optional server seeds, author name).

    Attributes:
        ledger: tokens, latency and cost of every call this agent made, per kernel.
        tester_calls: call records of :meth:`propose_shapes` (they belong to no proposal).
    """

    name = "llm"

    def __init__(self, config: Any = None, seed: int = 0) -> None:
        self.config = coerce_config(config)
        self.seed = int(seed)
        self.ledger = UsageLedger()
        self.tester_calls: list[dict[str, Any]] = []
        self._client: ChatClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The HTTP client holds sockets and locks; a copy in another process makes its own.
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    @property
    def client(self) -> ChatClient:
        if self._client is None:
            self._client = ChatClient(self.config, self.seed)
        return self._client

    @property
    def author(self) -> str:
        return f"llm-{self.config.mode}-{self.seed}"

    def preflight(self) -> list[str]:
        """Fails in seconds with a clear :class:`PreflightError` when the endpoint is unusable."""
        return preflight(self.config)

    def usage(self) -> dict[str, Any]:
        """Tokens, latency and cost summed per kernel and over everything this agent did."""
        return self.ledger.totals()

    def propose_shapes(self, spec: KernelSpec | KernelRef | str, kernel: str = "") -> list[dict[str, int]]:
        """Extra search shapes from the tester role (validated; never held-out shapes).

        Args:
            spec: the kernel's spec, or what to load it from (reference, library name).
            kernel: the kernel's name in the run, for the call record (default: the spec's).
        """
        spec = spec if isinstance(spec, KernelSpec) else _load_spec(spec)
        kernel = kernel or spec.name
        shapes, record, rejected = tester.propose_shapes(self.client, self.config.role("tester"), spec)
        record = {**record, "call_id": uuid.uuid4().hex, "kernel": kernel,
                  "accepted_shapes": shapes, "rejected_shapes": rejected}
        self.tester_calls.append(record)
        self.ledger.add(record, kernel)
        return shapes

    def propose(self, ctx: AgentContext) -> Sequence[Proposal]:
        spec = _load_spec(ctx.kernel_source)
        # Prompts name the entry point, which is the spec's name (the run's name for the
        # kernel may carry a digest suffix).
        values = {**context_values(ctx, self.config.history_chars), "kernel": spec.name}
        if self.config.mode == "single":
            proposals = self._run_parallel(
                [lambda i=i: self._single(ctx, spec, values, i) for i in range(ctx.n_variants)]
            )
        else:
            proposals = self._multi(ctx, spec, values)
        for p in proposals:
            for call in p.calls:
                self.ledger.add(call, ctx.kernel)
        return proposals

    def _run_parallel(self, jobs: list[Any]) -> list[Proposal]:
        if not jobs:
            return []
        with ThreadPoolExecutor(max_workers=min(len(jobs), self.config.concurrency)) as pool:
            return list(pool.map(lambda job: job(), jobs))

    def _multi(self, ctx: AgentContext, spec: KernelSpec, values: dict[str, Any]) -> list[Proposal]:
        suggestions, plan_call, analysis = planner.plan(self.client, self.config.role("planner"), values, ctx.n_variants)
        plan_call = {**plan_call, "call_id": uuid.uuid4().hex, "round": ctx.round}
        if not suggestions:
            why = plan_call["error"] or "the planner's reply held no suggestions"
            pid = uuid.uuid4().hex
            return [self._failed(ctx, pid, [plan_call], f"planner: {why}", "")]
        jobs = [
            lambda i=i, s=s: self._code(ctx, spec, values, s, plan_call if i == 0 else None, plan_call["call_id"])
            for i, s in enumerate(suggestions)
        ]
        return self._run_parallel(jobs)

    def _code(
        self,
        ctx: AgentContext,
        spec: KernelSpec,
        values: dict[str, Any],
        suggestion: dict[str, str],
        plan_call: dict[str, Any] | None,
        plan_call_id: str,
    ) -> Proposal:
        cfg = self.config
        result = coder.converse(
            self.client, "coder", cfg.role("coder"), coder.coder_messages(values, suggestion),
            spec, ctx.dtype, cfg.repair_turns, cfg.compile_check,
        )
        pid = uuid.uuid4().hex
        calls = [{**c, "call_id": uuid.uuid4().hex, "plan_call_id": plan_call_id, "round": ctx.round}
                 for c in result.calls]
        if plan_call is not None:
            calls.insert(0, plan_call)
        transformation = suggestion["title"] + (f": {suggestion['change']}" if suggestion["change"] != suggestion["title"] else "")
        return self._finish(ctx, pid, calls, result, suggestion["title"], transformation)

    def _single(self, ctx: AgentContext, spec: KernelSpec, values: dict[str, Any], index: int) -> Proposal:
        cfg = self.config
        result = coder.converse(
            self.client, "single", cfg.role("single"), single.single_messages(values, index, ctx.n_variants),
            spec, ctx.dtype, cfg.repair_turns, cfg.compile_check,
        )
        pid = uuid.uuid4().hex
        calls = [{**c, "call_id": uuid.uuid4().hex, "round": ctx.round} for c in result.calls]
        note = single.plan_line(result.calls[0]["reply"]) if result.calls else ""
        return self._finish(ctx, pid, calls, result, note or "single-agent proposal", note)

    def _finish(
        self, ctx: AgentContext, pid: str, calls: list[dict[str, Any]], result: coder.CodeResult,
        note: str, transformation: str,
    ) -> Proposal:
        if result.source is None:
            return self._failed(ctx, pid, calls, result.failure, transformation)
        for c in calls:
            c.setdefault("proposal_id", pid)
        meta = {"proposal_id": pid, "model": calls[-1]["model"], "repairs": len(result.calls) - 1}
        if result.check_log:
            meta["precheck"] = result.check_log[:500]
        variant = Variant(kernel=ctx.kernel, source=result.source, parent=ctx.parent.id,
                          author=self.author, note=note[:200], round=ctx.round, meta=meta)
        return Proposal(variant=variant, transformation=transformation, calls=tuple(calls))

    def _failed(
        self, ctx: AgentContext, pid: str, calls: list[dict[str, Any]], failure: str, transformation: str
    ) -> Proposal:
        for c in calls:
            c.setdefault("proposal_id", pid)
        # The variant stays the parent (same source, same id); meta only carries the join key.
        parent = replace(ctx.parent, meta={**ctx.parent.meta, "proposal_id": pid})
        return Proposal(variant=parent, transformation=transformation, calls=tuple(calls), failure=failure)
