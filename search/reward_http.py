"""The reward service over plain HTTP (JSON in, JSON out), standard library only.

Endpoints:

``POST /score``
    ``{"kernel": "silu_and_mul", "source": "<.cu file>" | "response": "<model output>",
    "dtype": "float16", "client": "worker-3"}`` -> the service's answer
    (:meth:`search.reward.RewardService.score`). A ``response`` is searched for its kernel
    (:func:`search.reward_client.extract_kernel`).
``POST /openrlhf``
    OpenRLHF's remote reward model (``--remote_rm_url http://HOST:PORT/openrlhf``):
    ``{"query": [prompt + response, ...], "prompts": [...], "labels": [...]}``, each label a
    kernel name, ``kernel:dtype`` or a JSON object ``{"kernel": ..., "dtype": ...}`` ->
    ``{"rewards": [...], "scores": [...], "extra_logs": {"correct": [...], "speedup": [...]}}``.
``POST /trajectory``
    One trajectory row (:mod:`search.trajectory`) appended to the service's records.
``GET /health``
    The service's counters.

Bad requests answer 400 with ``{"error": ...}``; a stopped service 503.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from search.reward import RewardRequestError, RewardService, ServiceError
from search.reward_client import extract_kernel

MAX_BODY_BYTES = 16 << 20  # a batch of responses; far above any kernel file


def parse_label(label: Any, default_dtype: str = "") -> tuple[str, str]:
    """(kernel, dtype) from a label: ``name``, ``name:dtype`` or ``{"kernel", "dtype"}``
    (also as a JSON string).

    Raises:
        RewardRequestError: a label that names no kernel.
    """
    if isinstance(label, str) and label.strip().startswith("{"):
        label = json.loads(label)
    if isinstance(label, dict):
        kernel, dtype = str(label.get("kernel", "")), str(label.get("dtype", "") or default_dtype)
    else:
        kernel, _, dtype = str(label).strip().partition(":")
        dtype = dtype or default_dtype
    if not kernel:
        raise RewardRequestError(f"label {label!r} names no kernel")
    return kernel, dtype


def score_batch(service: RewardService, items: Sequence[tuple[str, str, str, str]], client: str) -> list[dict[str, Any]]:
    """Scores (kernel, source, dtype, response) items at once (queued together, answered in order)."""
    futures = [service.submit(kernel, source, dtype, client, {"response": response})
               for kernel, source, dtype, response in items]
    return [f.result() for f in futures]


class RewardHandler(BaseHTTPRequestHandler):
    """One HTTP request; the server carries the service (``self.server.service``)."""

    server: RewardHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request on stderr would drown the trainer's log

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, default=str).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.rstrip("/") == "/health":
            self._send(200, {"ok": True, **self.server.service.stats()})
        else:
            self._send(404, {"error": f"no GET {self.path}; try /health"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(413, {"error": f"body of {length} bytes; at most {MAX_BODY_BYTES}"})
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise RewardRequestError("the body must be a JSON object")
            route = {"/score": self._score, "/openrlhf": self._openrlhf, "/trajectory": self._trajectory}
            handler = route.get(self.path.rstrip("/"))
            if handler is None:
                self._send(404, {"error": f"no POST {self.path}; try {', '.join(route)}"})
                return
            self._send(200, handler(body))
        except (RewardRequestError, json.JSONDecodeError, KeyError, TypeError) as exc:
            self._send(400, {"error": f"{type(exc).__name__}: {exc}"})
        except ServiceError as exc:
            self._send(503, {"error": str(exc)})

    def _score(self, body: dict[str, Any]) -> dict[str, Any]:
        source = body["source"] if "source" in body else extract_kernel(str(body["response"]))
        return self.server.service.score(str(body["kernel"]), str(source), str(body.get("dtype") or ""),
                                         str(body.get("client") or self.client_address[0]), context=body)

    def _openrlhf(self, body: dict[str, Any]) -> dict[str, Any]:
        queries, labels = list(body["query"]), list(body["labels"])
        if len(queries) != len(labels):
            raise RewardRequestError(f"{len(queries)} queries but {len(labels)} labels")
        items = [(*parse_label(label), str(q)) for q, label in zip(queries, labels, strict=True)]
        answers = score_batch(self.server.service, [(k, extract_kernel(q), d, q) for k, d, q in items],
                              str(body.get("client") or self.client_address[0]))
        scores = [a["score"] for a in answers]
        return {"rewards": scores, "scores": scores, "extra_logs": {
            "correct": [float(a["correct"]) for a in answers],
            "speedup": [float(a["speedup"] or 0.0) for a in answers],
            "status": [a["status"] for a in answers]}}

    def _trajectory(self, body: dict[str, Any]) -> dict[str, Any]:
        from search.trajectory import Trajectory

        row = Trajectory.from_dict(body).to_dict()  # checked against the schema before it is kept
        self.server.service.record("trajectories", row)
        return {"ok": True, "trajectory_id": row["trajectory_id"]}


class RewardHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server over one :class:`RewardService` (one thread per connection;
    the service queues the requests fairly)."""

    daemon_threads = True
    # Rollout workers connect in bursts (a whole batch at once): the standard library's backlog
    # of 5 resets connections beyond it.
    request_queue_size = 1024

    def __init__(self, service: RewardService, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), RewardHandler)
        self.service = service

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def serve(service: RewardService, host: str = "127.0.0.1", port: int = 0) -> RewardHTTPServer:
    """Starts serving in a daemon thread; ``port`` 0 picks a free one (``server.port``)."""
    server = RewardHTTPServer(service, host, port)
    threading.Thread(target=server.serve_forever, name="reward-http", daemon=True).start()
    return server
