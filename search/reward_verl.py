"""verl's custom reward function: ``compute_score(data_source, solution_str, ground_truth, extra_info)``.

In a verl config (docs/rl.md)::

    custom_reward_function:
      path: /path/to/kernel-search/search/reward_verl.py
      name: compute_score

``ground_truth`` names the kernel: ``silu_and_mul``, ``silu_and_mul:bfloat16`` or a JSON
object ``{"kernel": ..., "dtype": ...}``; ``extra_info`` may give ``dtype`` and ``client``.
The kernel is the last ```cuda block of the response (:func:`search.reward_client.extract_kernel`).
The service is the one :func:`search.reward_client.connect` finds (HTTP when
``KERNEL_SEARCH_REWARD_URL`` is set, else the named actor on the trainer's Ray cluster).

The answer is a dict: ``score`` and numeric extra keys that verl averages into its metrics
(``correct``, ``speedup``, ``compiled``, ``rejected``, ``cached``); the status, feedback and
evidence of every reward are in the service's ``rewards.jsonl``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# verl imports this file by its path; the project's packages sit one folder up.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from search.reward_client import RewardClient, connect  # noqa: E402 - after the path fix above
from search.reward_http import parse_label  # noqa: E402

_clients: dict[str, RewardClient] = {}  # one per process and URL: connections are reused


def _client() -> RewardClient:
    url = os.environ.get("KERNEL_SEARCH_REWARD_URL", "")
    if url not in _clients:
        _clients[url] = connect(url or None)
    return _clients[url]


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    """The reward of one response (see the module docstring).

    Raises:
        search.reward_client.RewardClientError: no service, or it refused the request.
    """
    from search.reward_client import extract_kernel

    extra = dict(extra_info or {})
    kernel, dtype = parse_label(ground_truth, str(extra.get("dtype") or ""))
    client = str(extra.get("client") or data_source or "verl")
    context: dict[str, Any] = {"response": solution_str}
    if isinstance(extra.get("prompt"), list):  # the chat messages, where the dataset keeps them
        context["messages"] = [{"role": str(m["role"]), "content": str(m["content"])} for m in extra["prompt"]]
    answer = _client().score(kernel, extract_kernel(solution_str), dtype, client, context)
    status = answer["status"]
    return {"score": float(answer["score"]), "correct": float(bool(answer["correct"])),
            "speedup": float(answer.get("speedup") or 0.0),
            "compiled": float(status not in ("COMPILE_ERROR", "NO_VARIANT")),
            "rejected": float(status == "REJECTED"), "cached": float(bool(answer.get("cached")))}
