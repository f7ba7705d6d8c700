"""Builds an agent by name; backends are imported only when chosen (the LLM one needs openai)."""

from __future__ import annotations

import importlib
from typing import Any

from agents.base import Agent


class AgentConfigError(ValueError):
    """An agent kind that does not exist or cannot be built."""


def make_agent(kind: str, config: Any, seed: int) -> Agent:
    """Creates one agent.

    Args:
        kind: ``embedded``, ``llm``, or ``module:Class`` for any other
            :class:`~agents.base.Agent` whose constructor takes ``(config, seed)``.
        config: the run's agent section (:class:`search.config.AgentConfig`) or None.
        seed: per-agent seed, so agents of one population explore differently.

    Raises:
        AgentConfigError: unknown kind, or the class is not an Agent.
    """
    if kind == "embedded":
        try:
            from agents.embedded import EmbeddedAgent
        except ImportError as exc:
            raise AgentConfigError(f"the embedded agent backend cannot be imported: {exc}") from None
        return EmbeddedAgent(seed=seed, strategy=getattr(config, "strategy", None))
    if kind == "llm":
        try:
            from agents.llm import LLMAgent
        except ImportError as exc:
            raise AgentConfigError(f"the LLM agent backend cannot be imported: {exc}") from None
        return LLMAgent(config, seed)
    module_name, sep, class_name = kind.partition(":")
    if not sep or not module_name or not class_name:
        raise AgentConfigError(f"unknown agent kind {kind!r}; use embedded, llm or module:Class")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise AgentConfigError(f"cannot import agent {kind!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise AgentConfigError(f"{kind} is not a subclass of agents.base.Agent")
    return cls(config, seed)  # type: ignore[call-arg]  # plug-ins take (config, seed)
