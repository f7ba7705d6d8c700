"""A chat client for any OpenAI-compatible endpoint, with retries, limits and records.

Retries are done here rather than inside the openai client so that every attempt is
counted in the call record: 429 (honouring ``Retry-After``), 5xx, timeouts and dropped
connections back off exponentially with jitter; other 4xx errors (bad key, unknown model,
bad request) are not retried. A semaphore per base URL bounds the requests in flight from
one process, whatever number of agents share it. Every call returns a record (messages,
reply, usage, latency, cost, attempts, error); a call that fails for good is a record with
``error`` set, never an exception, so one bad reply cannot stop a search.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import Any

import openai

from agents.llm.config import DEFAULT_BASE_URL, LLMConfig, RoleConfig
from agents.llm.cost import PriceTable

_SEMAPHORES: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()
# Reasoning models take max_completion_tokens; older servers only know max_tokens.
_COMPLETION_TOKENS_MODELS = ("o1", "o3", "o4", "gpt-5")


class PreflightError(RuntimeError):
    """The endpoint cannot be used (unreachable, key refused, model missing)."""


def endpoint_semaphore(base_url: str, limit: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore that bounds requests in flight to one endpoint."""
    key = (base_url.rstrip("/"), int(limit))
    with _SEMAPHORES_LOCK:
        if key not in _SEMAPHORES:
            _SEMAPHORES[key] = threading.BoundedSemaphore(limit)
        return _SEMAPHORES[key]


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a server asked us to wait (``retry-after-ms`` or ``Retry-After``), if any."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _token_limit_param(model: str) -> str:
    bare = model.rsplit("/", 1)[-1]
    return "max_completion_tokens" if bare.startswith(_COMPLETION_TOKENS_MODELS) else "max_tokens"


class ChatClient:
    """Sends chat requests for the agents of one process.

    Args:
        config: endpoint, limits and retry settings.
        seed: seeds the backoff jitter (and per-call seeds when ``send_seed``).
    """

    def __init__(self, config: LLMConfig, seed: int = 0) -> None:
        self.config = config
        self.prices = PriceTable(config.prices)
        self._rng = random.Random(seed)
        self._seed = seed
        self._calls = 0
        self._client = openai.OpenAI(
            base_url=config.base_url,
            api_key=config.resolved_api_key(),
            timeout=config.timeout_s,
            max_retries=0,  # retried here, so attempts are counted and Retry-After honoured
        )
        self._semaphore = endpoint_semaphore(config.base_url, config.concurrency)

    def close(self) -> None:
        self._client.close()

    def _request_kwargs(self, role: RoleConfig, messages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": role.model, "messages": [dict(m) for m in messages]}
        if role.temperature is not None:
            kw["temperature"] = role.temperature
        if role.max_tokens is not None:
            kw[_token_limit_param(role.model)] = role.max_tokens
        if role.reasoning_effort is not None:
            kw["reasoning_effort"] = role.reasoning_effort
        if self.config.send_seed:
            self._calls += 1
            kw["seed"] = self._seed * 100003 + self._calls
        return kw

    def _backoff_s(self, attempt: int, server_hint: float | None) -> float:
        if server_hint is not None:
            return min(server_hint, self.config.max_backoff_s)
        base = self.config.backoff_s * (2 ** (attempt - 1))
        return min(base * (0.5 + self._rng.random()), self.config.max_backoff_s)

    def chat(self, role_name: str, role: RoleConfig, messages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
        """One chat completion with retries.

        Returns:
            The call record: role, model, messages, reply, usage (prompt/completion tokens),
            latency_s (all attempts and waits), cost_usd, priced, attempts, finish_reason,
            error ('' on success).
        """
        kw = self._request_kwargs(role, messages)
        start = time.perf_counter()
        attempts, error, reply, finish, usage = 0, "", "", "", _usage(None)
        while True:
            attempts += 1
            hint: float | None = None
            try:
                with self._semaphore:
                    resp = self._client.chat.completions.create(**kw)
                choice = resp.choices[0] if resp.choices else None
                reply = (choice.message.content or "") if choice else ""
                finish = (choice.finish_reason or "") if choice else ""
                usage, error = _usage(resp.usage), ""
                break
            except openai.RateLimitError as exc:
                error, hint = _describe(exc), retry_after_s(exc.response.headers)
            except openai.APIStatusError as exc:
                error = _describe(exc)
                if exc.status_code < 500:
                    break  # a bad key, model or request does not get better by retrying
            except openai.APIConnectionError as exc:  # includes APITimeoutError
                error = _describe(exc)
            if attempts > self.config.max_retries:
                break
            time.sleep(self._backoff_s(attempts, hint))
        prompt_t, completion_t = usage["prompt_tokens"], usage["completion_tokens"]
        return {
            "role": role_name,
            "model": role.model,
            "messages": [dict(m) for m in messages],
            "reply": reply,
            "usage": usage,
            "latency_s": round(time.perf_counter() - start, 4),
            "cost_usd": self.prices.cost_usd(role.model, prompt_t, completion_t),
            "priced": self.prices.price(role.model) is not None,
            "attempts": attempts,
            "finish_reason": finish,
            "error": error,
        }


def _usage(u: Any) -> dict[str, int]:
    if u is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    prompt = int(getattr(u, "prompt_tokens", 0) or 0)
    completion = int(getattr(u, "completion_tokens", 0) or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _describe(exc: openai.APIError) -> str:
    status = getattr(exc, "status_code", None)
    kind = type(exc).__name__
    return f"{kind} ({status}): {exc.message}" if status else f"{kind}: {exc.message}"


def preflight(config: LLMConfig, models: Sequence[str] = ()) -> list[str]:
    """Checks in seconds that the endpoint answers, accepts the key and serves the models.

    Args:
        config: the endpoint settings.
        models: model names that must be served (default: every role's model).

    Returns:
        The model names the endpoint lists.

    Raises:
        PreflightError: with what failed and which setting to fix.
    """
    wanted = list(models) or sorted({config.role(r).model for r in ("planner", "coder", "tester", "single")})
    url = config.base_url
    keyless = not config.has_api_key()
    if keyless and url.rstrip("/") == DEFAULT_BASE_URL:
        # OpenAI's own endpoint always needs a key: say so before any network error can hide it.
        raise PreflightError(f"no API key: OPENAI_API_KEY is not set (nor llm.api_key), and {url} needs one; "
                             "export OPENAI_API_KEY=sk-..., or set OPENAI_BASE_URL to a local server")
    client = openai.OpenAI(
        base_url=url, api_key=config.resolved_api_key(), timeout=config.preflight_timeout_s, max_retries=0
    )
    try:
        listed = [m.id for m in client.models.list()]
    except openai.AuthenticationError as exc:
        what = "wants an API key and none is set" if keyless else "refused the API key"
        raise PreflightError(f"{url} {what} ({exc.status_code}); set OPENAI_API_KEY or llm.api_key") from None
    except openai.APIStatusError as exc:
        raise PreflightError(f"{url}/models answered {exc.status_code}: {exc.message}; is this an "
                             "OpenAI-compatible base URL (usually ending in /v1)?") from None
    except openai.APIConnectionError as exc:
        raise PreflightError(
            f"cannot reach {url} ({type(exc).__name__}: {exc.message}); check OPENAI_BASE_URL or "
            "llm.base_url and that the server is running"
        ) from None
    finally:
        client.close()
    missing = [m for m in wanted if listed and m not in listed]
    if missing:
        shown = ", ".join(listed[:20]) + (" ..." if len(listed) > 20 else "")
        raise PreflightError(f"{url} does not serve model(s) {missing}; it lists: {shown}")
    return listed
