"""The coder role: a planned change in, a complete variant file out, repaired on refusal.

Before a variant leaves the agent it is checked on the CPU by the evaluator's own admission
(launch header, entry signature, static checks, sandboxed NVRTC compile at the default
tunables). A refusal goes
back to the model with the log for at most ``repair_turns`` more turns; a variant that still
fails is returned anyway so that the evaluator records its verdict. A reply without code, or
a call that failed for good, makes a failed proposal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.llm.client import ChatClient
from agents.llm.config import RoleConfig
from agents.llm.parse import extract_code
from agents.llm.prompts import render
from evaluators.admit import Refusal, admit, check_front
from kernels.spec import KernelSpec


@dataclass
class CodeResult:
    """Outcome of one coding conversation.

    Attributes:
        source: the last variant file extracted (None: no usable code).
        calls: the call records, first turn first.
        failure: why no variant could be produced ('' when ``source`` is set).
        check_log: the refusal of the last source ('' when it passed the CPU checks).
    """

    source: str | None
    calls: list[dict[str, Any]] = field(default_factory=list)
    failure: str = ""
    check_log: str = ""


def check_source(spec: KernelSpec, source: str, dtype: str, compile_check: bool = True) -> str:
    """The reason the evaluator would refuse ``source`` before running it, or ''.

    The check is admission itself (:func:`evaluators.admit.admit`) at the default tunables;
    without ``compile_check`` only its front end (header, names, signature, launch limits).
    """
    if not compile_check:
        front = check_front(spec, source)
        return front.message if isinstance(front, Refusal) else ""
    outcome = admit(spec, source, dtype)
    return outcome.message if isinstance(outcome, Refusal) else ""


def converse(
    client: ChatClient,
    role_name: str,
    role: RoleConfig,
    messages: Sequence[Mapping[str, str]],
    spec: KernelSpec,
    dtype: str,
    repair_turns: int,
    compile_check: bool = True,
) -> CodeResult:
    """Asks for a variant file, then repairs it while the CPU checks refuse it."""
    msgs = [dict(m) for m in messages]
    result = CodeResult(source=None)
    for _turn in range(repair_turns + 1):
        record = client.chat(role_name, role, msgs)
        result.calls.append(record)
        if record["error"]:
            result.failure = f"LLM call failed: {record['error']}"
            return result
        source = extract_code(record["reply"], spec.name)
        if source is None:
            cut = " (the reply stopped at the token limit)" if record["finish_reason"] == "length" else ""
            result.failure = f"the reply has no code block with a __global__ kernel{cut}"
            return result
        result.source, result.failure = source, ""
        result.check_log = check_source(spec, source, dtype, compile_check)
        if not result.check_log:
            return result
        msgs = msgs + [
            {"role": "assistant", "content": record["reply"]},
            {"role": "user", "content": render("coder_repair", log=result.check_log)},
        ]
    return result


def coder_messages(values: Mapping[str, Any], suggestion: Mapping[str, str]) -> list[dict[str, str]]:
    """The coder's first-turn messages for one planned change."""
    return [
        {"role": "system", "content": render("coder_system", **values)},
        {"role": "user", "content": render("coder_user", suggestion=suggestion, **values)},
    ]
