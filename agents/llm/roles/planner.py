"""The planner role: the lineage's state in, a list of structured suggestions out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents.llm.client import ChatClient
from agents.llm.config import RoleConfig
from agents.llm.parse import extract_json, parse_suggestions
from agents.llm.prompts import render


def plan(
    client: ChatClient, role: RoleConfig, values: Mapping[str, Any], n: int
) -> tuple[list[dict[str, str]], dict[str, Any], str]:
    """Asks for ``n`` suggestions.

    Returns:
        (suggestions, the call record, the planner's analysis); suggestions is empty when the
        call failed or the reply held none.
    """
    messages = [
        {"role": "system", "content": render("planner_system", **values)},
        {"role": "user", "content": render("planner_user", n=n, **values)},
    ]
    record = client.chat("planner", role, messages)
    if record["error"]:
        return [], record, ""
    data = extract_json(record["reply"])
    analysis = str(data.get("analysis", "")) if isinstance(data, dict) else ""
    return parse_suggestions(record["reply"], limit=n), record, analysis
