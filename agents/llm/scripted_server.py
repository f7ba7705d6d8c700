"""A local OpenAI-compatible HTTP server with scripted replies, for demonstrations and tests.

It speaks enough of the API for the real ``openai`` client: ``GET /v1/models`` and
``POST /v1/chat/completions``, bearer-key checks, error statuses with headers, and stalls.
Each chat request is answered by ``responder(request_body)`` when one is set, otherwise by
the next scripted step. A step is a dict:

- ``{"reply": text, "usage": (prompt_tokens, completion_tokens)}``: a completion;
- ``{"status": 429, "headers": {"Retry-After": "1"}}``: an error response;
- ``{"sleep_s": 2.0, ...}``: wait first (to outlast the client's timeout), then answer.

Every request is kept in ``requests`` (path, headers, body, monotonic arrival time).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Step = dict[str, Any]


class ScriptedLLMServer:
    """Serves scripted chat completions on 127.0.0.1 (a free port) from a daemon thread.

    Args:
        steps: answers to chat requests, in order.
        api_key: the bearer key to require ('' accepts any).
        models: model ids listed by ``/v1/models``.
        responder: optional ``body -> step`` used instead of the script.
    """

    def __init__(
        self,
        steps: Iterable[Step] = (),
        api_key: str = "test-key",
        models: Iterable[str] = ("test-model",),
        responder: Callable[[dict[str, Any]], Step] | None = None,
    ) -> None:
        self.steps = list(steps)
        self.api_key = api_key
        self.models = list(models)
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # a handler still sleeping must not hold up close
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        port = self._httpd.server_address[1]
        return f"http://127.0.0.1:{port}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r["path"].endswith("/chat/completions")]

    def __enter__(self) -> ScriptedLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def next_step(self, body: dict[str, Any]) -> Step:
        if self.responder is not None:
            return self.responder(body)
        with self._lock:
            if not self.steps:
                return {"status": 500, "error": "the script has no more replies"}
            return self.steps.pop(0)


def completion(body: dict[str, Any], reply: str, usage: tuple[int, int]) -> dict[str, Any]:
    """A chat.completion object as the API returns it."""
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": reply}}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                  "total_tokens": usage[0] + usage[1]},
    }


def _make_handler(server: ScriptedLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
            pass

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout): nothing to answer

        def _authorised(self) -> bool:
            if not server.api_key or self.headers.get("Authorization") == f"Bearer {server.api_key}":
                return True
            self._send(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                       "code": "invalid_api_key"}})
            return False

        def _record(self, body: dict[str, Any] | None) -> None:
            with server._lock:
                server.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body, "received": time.monotonic()}
                )

        def do_GET(self) -> None:
            self._record(None)
            if not self._authorised():
                return
            if self.path.rstrip("/").endswith("/models"):
                data = [{"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in server.models]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            self._record(body)
            if not self._authorised():
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            step = server.next_step(body)
            if step.get("sleep_s"):
                time.sleep(float(step["sleep_s"]))
            if "status" in step:
                msg = step.get("error", f"scripted status {step['status']}")
                self._send(int(step["status"]), {"error": {"message": msg}}, step.get("headers"))
                return
            self._send(200, completion(body, step.get("reply", ""), tuple(step.get("usage", (10, 5)))))

    return Handler
