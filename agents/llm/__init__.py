"""LLM agents over any OpenAI-compatible endpoint (OpenAI, vLLM, SGLang, Ollama)."""

from agents.llm.agent import LLMAgent, coerce_config
from agents.llm.client import ChatClient, PreflightError, preflight
from agents.llm.config import LLMConfig, LLMConfigError, RoleConfig
from agents.llm.cost import PriceTable, UsageLedger

__all__ = [
    "ChatClient",
    "LLMAgent",
    "LLMConfig",
    "LLMConfigError",
    "PreflightError",
    "PriceTable",
    "RoleConfig",
    "UsageLedger",
    "coerce_config",
    "preflight",
]
