"""Extracting code and structured data from model replies.

Replies come from many models and servers, so parsing is lenient: reasoning text in
``<think>`` blocks is dropped, fenced blocks are preferred but an unfenced kernel or a
truncated final fence is accepted, and JSON is found inside prose, with trailing commas
forgiven. Nothing here raises on a bad reply: it returns None or an empty list.
"""

from __future__ import annotations

import json
import re
from typing import Any

_THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-.]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_TRAILING_COMMA_RE = re.compile(r",\s*([}\]])")
_ITEM_RE = re.compile(r"^\s*(?:[-*]|\d+[.)])\s+(.+)$")
_CODE_LANGS = {"", "cuda", "cu", "cpp", "c++", "c", "cxx", "cuh", "hpp"}


def strip_reasoning(reply: str) -> str:
    """Drops ``<think>...</think>`` blocks that some servers leave in the content."""
    return _THINK_RE.sub("", reply or "")


def fenced_blocks(reply: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block; an unclosed last fence runs to the end."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(strip_reasoning(reply))]


def extract_code(reply: str, entry: str) -> str | None:
    """The variant file in a reply: the last code block that defines ``entry``.

    Falls back to any block with a ``__global__`` function, then to the whole reply when it
    is unfenced code. Returns None when no kernel is found.
    """
    text = strip_reasoning(reply)
    blocks = [body for lang, body in fenced_blocks(text) if lang in _CODE_LANGS]
    ranked = [b for b in blocks if re.search(rf"\b{re.escape(entry)}\s*\(", b) and "__global__" in b]
    ranked = ranked or [b for b in blocks if "__global__" in b]
    if ranked:
        return ranked[-1].strip() + "\n"
    if "```" not in text and "__global__" in text:
        start = min(i for i in (text.find("//"), text.find("#"), text.find("extern")) if i >= 0)
        return text[start:].strip() + "\n"
    return None


def extract_json(reply: str) -> Any | None:
    """The first JSON object or array in a reply (fenced ``json`` blocks first)."""
    text = strip_reasoning(reply)
    candidates = [body for lang, body in fenced_blocks(text) if lang in ("json", "")]
    candidates.append(text)
    for cand in candidates:
        found = _first_json(cand)
        if found is not None:
            return found
    return None


def _first_json(text: str) -> Any | None:
    decoder = json.JSONDecoder()
    for variant in (text, _TRAILING_COMMA_RE.sub(r"\1", text)):
        for i, ch in enumerate(variant):
            if ch not in "{[":
                continue
            try:
                value, _ = decoder.raw_decode(variant, i)
            except json.JSONDecodeError:
                continue
            if isinstance(value, (dict, list)) and value:
                return value
    return None


def parse_suggestions(reply: str, limit: int = 8) -> list[dict[str, str]]:
    """The planner's suggestions as ``{title, change, rationale}`` dicts.

    Accepts ``{"suggestions": [...]}``, a bare list, items that are strings or dicts with
    other key names; without JSON, numbered or bulleted lines become suggestions.
    """
    data = extract_json(reply)
    items: list[Any] = []
    if isinstance(data, dict):
        for key in ("suggestions", "plans", "plan", "optimizations", "changes", "items"):
            if isinstance(data.get(key), list):
                items = data[key]
                break
        else:
            items = [data] if ("title" in data or "change" in data) else []
    elif isinstance(data, list):
        items = data
    out = [s for s in (_suggestion(it) for it in items) if s]
    if not out:
        text = strip_reasoning(reply)
        out = [{"title": m.group(1).strip()[:120], "change": m.group(1).strip(), "rationale": ""}
               for m in map(_ITEM_RE.match, text.splitlines()) if m]
    return out[:limit]


def _suggestion(item: Any) -> dict[str, str] | None:
    if isinstance(item, str) and item.strip():
        return {"title": item.strip()[:120], "change": item.strip(), "rationale": ""}
    if not isinstance(item, dict):
        return None
    get = lambda *keys: next((str(item[k]).strip() for k in keys if item.get(k)), "")  # noqa: E731
    change = get("change", "description", "details", "suggestion", "how", "what")
    title = get("title", "name", "summary") or change[:120]
    if not (title or change):
        return None
    return {"title": title[:120], "change": change or title,
            "rationale": get("rationale", "why", "reason", "expected_gain", "impact")}


def parse_shapes(reply: str) -> list[dict[str, Any]]:
    """Shapes proposed by the tester: ``{"shapes": [{...}, ...]}`` or a bare list of dicts."""
    data = extract_json(reply)
    if isinstance(data, dict):
        data = data.get("shapes", [])
    if not isinstance(data, list):
        return []
    return [dict(s) for s in data if isinstance(s, dict)]
