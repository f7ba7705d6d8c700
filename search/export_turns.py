"""Chat turns of exported trajectories: one conversation per agent role, one system message.

Chat templates of common models accept a system message only as the first message (several
raise an error otherwise), so a trajectory never concatenates the planner's and the coder's
conversations: each role on a lineage path gets its own conversation. Within one, the first
call's system prompt leads; a later call's system prompt is dropped when it repeats it and
otherwise goes into that call's first user message, so no system message follows a turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from search.proposal_records import ProposalRecord

EMBEDDED_ROLE = "transformation"  # the role of an embedded agent's proposals (no LLM call)
SYSTEM = "system"

Message = dict[str, str]


def embedded_messages(proposal: ProposalRecord, parent_source: str) -> list[Message]:
    """An embedded proposal as a chat: parent source and transformation in, child out."""
    prompt = (f"Kernel `{proposal.kernel}`. Apply the transformation: {proposal.transformation or 'unnamed'}\n"
              f"```cuda\n{parent_source.strip()}\n```")
    reply = "" if proposal.failed else f"```cuda\n{proposal.variant.source.strip()}\n```"
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]


def new_turns(chats: Sequence[Sequence[Message]]) -> list[Message]:
    """The calls of one role in one step, in order, as one run of messages.

    A repair turn repeats its conversation so far (prompt, earlier reply, compiler log): only
    what is new is added.
    """
    messages: list[Message] = []
    prev: list[Message] = []
    for chat in chats:
        current = [dict(m) for m in chat]
        messages += current[len(prev):] if prev and current[: len(prev)] == prev else current
        prev = current
    return messages


@dataclass
class Conversation:
    """One role's turns along a lineage path, and the steps (nodes) that took them."""

    messages: list[Message] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)
    _system: str | None = None
    _pending: list[str] = field(default_factory=list)

    def add(self, step: Any, messages: Sequence[Message]) -> None:
        """Appends a step's messages, keeping at most one system message, first."""
        self.steps.append(step)
        for m in messages:
            if m["role"] == SYSTEM:
                self._system_message(m["content"])
                continue
            if m["role"] == "user" and self._pending:
                m = {"role": "user", "content": "\n\n".join([*self._pending, m["content"]])}
                self._pending = []
            self.messages.append(dict(m))

    def _system_message(self, content: str) -> None:
        if self._system is None and not self.messages:
            self._system = content
            self.messages.append({"role": SYSTEM, "content": content})
        elif content != self._system:
            self._pending.append(content)
