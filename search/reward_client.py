"""Ways to reach a reward service: in this process, as a named Ray actor, or over HTTP.

Every client has ``score(kernel, source, dtype, client)`` (the service's answer as a dict)
and ``record_trajectory(row)`` (one line of the trajectory file, :mod:`search.trajectory`).
:func:`connect` picks one: ``KERNEL_SEARCH_REWARD_URL`` set means HTTP; otherwise the named
actor :data:`ACTOR_NAME` of the Ray cluster this process is connected to (a trainer's worker).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from typing import Any, Protocol

ACTOR_NAME = "kernel-search-reward"
NAMESPACE = "kernel-search"
URL_ENV = "KERNEL_SEARCH_REWARD_URL"
# Fenced blocks tagged with these languages hold a kernel; the last one of a response is the
# answer (reasoning models show drafts first). Untagged blocks count only when no block is tagged.
KERNEL_TAGS = frozenset({"cuda", "cu", "cpp", "c++", "c"})
_OPEN_RE = re.compile(r"^\s*```\s*([\w+#.-]*)\s*$")
_CLOSE_RE = re.compile(r"^\s*```\s*$")
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)


class RewardClientError(RuntimeError):
    """The service could not be reached or refused the request (no verdict on the kernel)."""


def extract_kernel(response: str) -> str:
    """The kernel file in a model's response: the last fenced block tagged cuda/cu/cpp/c++
    (or untagged), outside any ``<think>`` section; '' when there is none."""
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for line in _THINK_RE.sub("", response).splitlines():
        if current is None:
            opened = _OPEN_RE.match(line)
            if opened:
                current = []
                blocks.append((opened.group(1).lower(), current))
        elif _CLOSE_RE.match(line):
            current = None
        else:
            current.append(line)
    tagged = [body for tag, body in blocks if tag in KERNEL_TAGS]
    chosen = tagged or [body for tag, body in blocks if not tag]
    return "\n".join(chosen[-1]).strip() + "\n" if chosen and "".join(chosen[-1]).strip() else ""


class RewardClient(Protocol):
    def score(self, kernel: str, source: str, dtype: str = "", client: str = "",
              context: dict[str, Any] | None = None) -> dict[str, Any]: ...

    def record_trajectory(self, row: dict[str, Any]) -> None: ...


class LocalClient:
    """A :class:`search.reward.RewardService` in this process."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def score(self, kernel: str, source: str, dtype: str = "", client: str = "",
              context: dict[str, Any] | None = None) -> dict[str, Any]:
        return dict(self.service.score(kernel, source, dtype, client, context=context))

    def record_trajectory(self, row: dict[str, Any]) -> None:
        self.service.record("trajectories", row)


class ActorClient:
    """The service's named Ray actor (see :mod:`search.reward_serve`)."""

    def __init__(self, handle: Any = None) -> None:
        import ray

        self.handle = handle if handle is not None else ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)

    def score(self, kernel: str, source: str, dtype: str = "", client: str = "",
              context: dict[str, Any] | None = None) -> dict[str, Any]:
        import ray
        from ray.exceptions import RayTaskError

        try:
            return dict(ray.get(self.handle.score.remote(kernel, source, dtype, client, context)))
        except RayTaskError as exc:
            raise RewardClientError(" ".join(str(exc.cause if hasattr(exc, "cause") else exc).split())) from None

    def record_trajectory(self, row: dict[str, Any]) -> None:
        import ray

        ray.get(self.handle.record.remote("trajectories", row))


class HttpClient:
    """The service's HTTP endpoint (:mod:`search.reward_http`).

    Args:
        url: base URL, e.g. ``http://10.0.0.5:8477``.
        timeout_s: per request (a first evaluation of a kernel compiles and times it).
    """

    def __init__(self, url: str, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POSTs JSON, returns the JSON answer.

        Raises:
            RewardClientError: unreachable, or the service answered an error.
        """
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            raise RewardClientError(f"{self.url}{path}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise RewardClientError(f"{self.url}{path}: {exc}") from None

    def score(self, kernel: str, source: str, dtype: str = "", client: str = "",
              context: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.post("/score", {**(context or {}), "kernel": kernel, "source": source, "dtype": dtype,
                                    "client": client})

    def record_trajectory(self, row: dict[str, Any]) -> None:
        self.post("/trajectory", row)


def connect(url: str | None = None) -> RewardClient:
    """HTTP when ``url`` (or ``KERNEL_SEARCH_REWARD_URL``) is given, else the named actor."""
    url = url or os.environ.get(URL_ENV)
    if url:
        return HttpClient(url)
    import ray

    if not ray.is_initialized():
        raise RewardClientError(f"no reward service: set {URL_ENV} or connect to the Ray cluster that runs it")
    try:
        return ActorClient()
    except ValueError:
        raise RewardClientError(f"no actor {ACTOR_NAME!r} in namespace {NAMESPACE!r}: start "
                                f"python -m search.reward_serve on this cluster, or set {URL_ENV}") from None
