"""Token prices and usage accounting.

Prices are USD per million tokens (input, output), matched by the longest model-name
prefix so dated snapshots (``gpt-4o-2024-08-06``) find their family. Models without a price
(local servers) cost 0 and are flagged ``priced: False`` in the totals. The table is a
default; ``LLMConfig.prices`` overrides or extends it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

# USD per 1M tokens (input, output), list prices of the providers' public pages.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "o4-mini": (1.10, 4.40),
    "o3-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "o1": (15.00, 60.00),
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
}

_TOTAL_KEYS = ("calls", "failed_calls", "attempts", "prompt_tokens", "completion_tokens", "latency_s", "cost_usd")


class PriceTable:
    """Looks up a model's price; configured entries take precedence over the defaults."""

    def __init__(self, overrides: Mapping[str, Iterable[float]] | None = None) -> None:
        self._prices = dict(DEFAULT_PRICES)
        for model, price in (overrides or {}).items():
            inp, out = (float(p) for p in price)
            self._prices[model] = (inp, out)

    def price(self, model: str) -> tuple[float, float] | None:
        """(input, output) USD per 1M tokens, or None for an unknown model."""
        if model in self._prices:
            return self._prices[model]
        # Provider prefixes such as "openai/gpt-4o" (routers) are dropped before matching.
        bare = model.rsplit("/", 1)[-1]
        matches = [m for m in self._prices if bare == m or bare.startswith(m + "-")]
        return self._prices[max(matches, key=len)] if matches else None

    def cost_usd(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        price = self.price(model)
        if price is None:
            return 0.0
        return (prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6


class UsageLedger:
    """Sums calls' tokens, latency and cost per kernel and over the run (thread-safe).

    Feed it the call records of :mod:`agents.llm.client` (``add``) or the lines of a run's
    ``llm_calls.jsonl`` (``add_all``); ``totals()`` gives ``{"kernels": {...}, "run": {...}}``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kernels: dict[str, dict[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"kernels": {k: dict(v) for k, v in self._kernels.items()}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._kernels = state["kernels"]

    def add(self, record: Mapping[str, Any], kernel: str | None = None) -> None:
        name = kernel or str(record.get("kernel") or "")
        usage = record.get("usage") or {}
        with self._lock:
            t = self._kernels.setdefault(name, _empty())
            t["calls"] += 1
            t["failed_calls"] += int(bool(record.get("error")))
            t["attempts"] += int(record.get("attempts") or 0)
            t["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
            t["completion_tokens"] += int(usage.get("completion_tokens") or 0)
            t["latency_s"] += float(record.get("latency_s") or 0.0)
            t["cost_usd"] += float(record.get("cost_usd") or 0.0)
            t["priced"] = t["priced"] and bool(record.get("priced", True))

    def add_all(self, records: Iterable[Mapping[str, Any]]) -> None:
        for r in records:
            self.add(r)

    def totals(self) -> dict[str, Any]:
        with self._lock:
            kernels = {k: dict(v) for k, v in self._kernels.items()}
        run = _empty()
        for t in kernels.values():
            for key in _TOTAL_KEYS:
                run[key] += t[key]
            run["priced"] = run["priced"] and t["priced"]
        return {"kernels": kernels, "run": run}


def _empty() -> dict[str, Any]:
    t: dict[str, Any] = {k: 0 for k in _TOTAL_KEYS}
    t["latency_s"] = 0.0
    t["cost_usd"] = 0.0
    t["priced"] = True
    return t
