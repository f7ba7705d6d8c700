"""Settings of the LLM agent backend (the ``llm`` section of a run config).

The endpoint and the key come from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` unless the config
names them. The key is read when the client is built and is never written back: ``to_dict``
(what goes into the run directory) leaves it out.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("planner", "coder", "tester", "single")
MODES = ("multi", "single")
REASONING_EFFORTS = ("minimal", "low", "medium", "high")
DEFAULT_BASE_URL = "https://api.openai.com/v1"


class LLMConfigError(ValueError):
    """An ``llm`` setting that cannot be used; the message names the field and the fix."""


@dataclass
class RoleConfig:
    """Per-role overrides; unset fields fall back to :class:`LLMConfig`'s.

    Attributes:
        model: model name ('' = ``LLMConfig.model``).
        temperature: sampling temperature (None = the server's default; reasoning models
            reject anything else).
        max_tokens: completion token limit (None = the server's default).
        reasoning_effort: ``minimal|low|medium|high`` for reasoning models (None = not sent).
    """

    model: str = ""
    temperature: float | None = None
    max_tokens: int | None = None
    reasoning_effort: str | None = None

    def __post_init__(self) -> None:
        if self.temperature is not None and not 0.0 <= float(self.temperature) <= 2.0:
            raise LLMConfigError(f"temperature must be in [0, 2], got {self.temperature!r}")
        if self.max_tokens is not None and int(self.max_tokens) < 1:
            raise LLMConfigError(f"max_tokens must be positive, got {self.max_tokens!r}")
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise LLMConfigError(
                f"reasoning_effort must be one of {REASONING_EFFORTS}, got {self.reasoning_effort!r}"
            )


@dataclass
class LLMConfig:
    """How the LLM agents reach their endpoint and how hard they try.

    Attributes:
        base_url: OpenAI-compatible endpoint (``OPENAI_BASE_URL`` or api.openai.com).
        api_key: explicit key; '' reads ``OPENAI_API_KEY`` when the client is built.
        model: default model of every role.
        roles: per-role overrides (planner, coder, tester, single).
        concurrency: requests in flight per endpoint (per process).
        timeout_s: per-request timeout.
        max_retries: retries after the first attempt on 429, 5xx, timeouts, connection drops.
        backoff_s: first backoff delay; doubles per retry, with jitter.
        max_backoff_s: cap of one backoff delay (a longer Retry-After is capped too).
        repair_turns: coder turns that get the compiler log back after a failed compile.
        mode: ``multi`` (planner + coder) or ``single`` (one prompt plans and codes).
        prices: USD per million tokens ``{model: [input, output]}``, over the built-in table.
        history_chars: budget for the lineage history in planner prompts before summarising.
        compile_check: compile proposals with NVRTC on the CPU before returning them.
        send_seed: pass a per-call ``seed`` to the server (not every server accepts it).
        preflight_timeout_s: timeout of the start-up check.
    """

    base_url: str = field(default_factory=lambda: os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL)
    api_key: str = field(default="", repr=False)
    model: str = "o4-mini"
    roles: dict[str, RoleConfig] = field(default_factory=dict)
    concurrency: int = 4
    timeout_s: float = 300.0
    max_retries: int = 5
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    repair_turns: int = 2
    mode: str = "multi"
    prices: dict[str, list[float]] = field(default_factory=dict)
    history_chars: int = 12000
    compile_check: bool = True
    send_seed: bool = False
    preflight_timeout_s: float = 15.0

    def __post_init__(self) -> None:
        self.roles = {k: _role(k, v) for k, v in dict(self.roles).items()}
        unknown = set(self.roles) - set(ROLES)
        if unknown:
            raise LLMConfigError(f"llm.roles: unknown role(s) {sorted(unknown)}; known: {ROLES}")
        if self.mode not in MODES:
            raise LLMConfigError(f"llm.mode must be one of {MODES}, got {self.mode!r}")
        if not self.base_url.startswith(("http://", "https://")):
            raise LLMConfigError(f"llm.base_url must start with http:// or https://, got {self.base_url!r}")
        for name in ("concurrency",):
            if int(getattr(self, name)) < 1:
                raise LLMConfigError(f"llm.{name} must be at least 1")
        for name in ("max_retries", "repair_turns"):
            if int(getattr(self, name)) < 0:
                raise LLMConfigError(f"llm.{name} must be non-negative")
        for name in ("timeout_s", "preflight_timeout_s"):
            if float(getattr(self, name)) <= 0:
                raise LLMConfigError(f"llm.{name} must be positive")
        for model, price in self.prices.items():
            if len(price) != 2 or any(float(p) < 0 for p in price):
                raise LLMConfigError(f"llm.prices.{model} must be [input, output] USD per 1M tokens")

    def role(self, name: str) -> RoleConfig:
        """The effective settings of one role (its overrides over the defaults)."""
        if name not in ROLES:
            raise LLMConfigError(f"unknown role {name!r}; known: {ROLES}")
        own = self.roles.get(name, RoleConfig())
        return dataclasses.replace(own, model=own.model or self.model)

    def resolved_api_key(self) -> str:
        """The key to send: the configured one, else ``OPENAI_API_KEY``, else a placeholder
        (local servers such as vLLM, SGLang and Ollama accept any key)."""
        return self.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"

    def has_api_key(self) -> bool:
        """Whether a key is configured or in ``OPENAI_API_KEY`` (else a placeholder is sent)."""
        return bool(self.api_key or os.environ.get("OPENAI_API_KEY"))

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain data, without the API key (safe to write into a run)."""
        d = dataclasses.asdict(self)
        d.pop("api_key")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> LLMConfig:
        """Builds a config from a mapping (e.g. the YAML ``llm`` section).

        Raises:
            LLMConfigError: an unknown key or an invalid value.
        """
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise LLMConfigError(f"llm: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)


def _role(name: str, value: RoleConfig | Mapping[str, Any]) -> RoleConfig:
    if isinstance(value, RoleConfig):
        return value
    known = {f.name for f in dataclasses.fields(RoleConfig)}
    unknown = set(value) - known
    if unknown:
        raise LLMConfigError(f"llm.roles.{name}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    return RoleConfig(**value)
