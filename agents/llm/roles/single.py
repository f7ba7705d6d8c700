"""Single-agent mode: one prompt plans and codes (the paper's single-agent baseline)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agents.llm.parse import strip_reasoning
from agents.llm.prompts import render

_PLAN_RE = re.compile(r"^\s*\**plan\**\s*:\s*\**\s*(.+)$", re.IGNORECASE | re.MULTILINE)


def single_messages(values: Mapping[str, Any], index: int, n: int) -> list[dict[str, str]]:
    """Messages for proposal ``index`` of ``n``: the planner's context plus the coding task."""
    return [
        {"role": "system", "content": render("single_system", **values)},
        {"role": "user", "content": render("single_user", n=n, index=index, **values)},
    ]


def plan_line(reply: str) -> str:
    """The reply's "Plan:" sentence (for the variant's note), or ''."""
    m = _PLAN_RE.search(strip_reasoning(reply).split("```", 1)[0])
    return m.group(1).strip()[:200] if m else ""
