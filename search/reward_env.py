"""A multi-turn environment for agent-loop trainers: one episode optimises one kernel.

``reset(kernel, dtype)`` gives the prompt (system and user messages: what the kernel
computes, its baseline source, the rules of a variant file); ``step(response)`` scores the
kernel in the response through a reward service (:mod:`search.reward_client`) and answers
the evaluator's verdict as the next user message, the reward, and whether the episode is
over (after ``max_turns`` attempts, or at the first reward of ``stop_score`` or more). A
finished episode is written to the service's ``trajectories.jsonl`` (:mod:`search.trajectory`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from kernels.spec import shape_label
from kernels.variant import source_hash
from search.reward_client import RewardClient, extract_kernel
from search.trajectory import Trajectory, Turn

SCALAR_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"}


class EpisodeError(RuntimeError):
    """A step outside an episode (no reset, or after it ended)."""


@dataclass(frozen=True)
class StepResult:
    """What one step answers.

    Attributes:
        observation: ``messages`` (the whole conversation so far), ``feedback`` (the newest
            user message), ``kernel``, ``dtype``, ``turn``.
        reward: the service's score of this response.
        done: the episode is over.
        info: the service's whole answer (status, speedup, evidence, ...).
    """

    observation: dict[str, Any]
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


def task_messages(kernel: str, dtype: str, gpu: str = "an NVIDIA data-centre GPU") -> list[dict[str, str]]:
    """The episode's prompt: system and user messages for one kernel (the search agents' rules)."""
    from agents.llm.prompts import render
    from kernels.spec import load_kernel

    spec = load_kernel(kernel)
    values = {"kernel": spec.name, "description": spec.description, "dtype": dtype,
              "signature": ", ".join(f"{a.name}:{a.kind}" for a in spec.args),
              "scalar_type": SCALAR_TYPES.get(dtype, dtype), "symbols": list(spec.shape_symbols),
              "shapes": ", ".join(shape_label(s) for s in spec.shapes("search")), "gpu": gpu,
              "source": spec.baseline_source().strip()}
    return [{"role": "system", "content": render("rl_system", **values)},
            {"role": "user", "content": render("rl_user", **values)}]


class KernelEnv:
    """One kernel-optimisation episode at a time over a reward service.

    Args:
        client: the reward service (:func:`search.reward_client.connect`).
        max_turns: attempts per episode.
        stop_score: ends the episode early at a reward of at least this (None: never).
        client_id: the name requests are queued under (fair sharing between clients).
        record: write each finished episode to the service's trajectory file.
    """

    def __init__(self, client: RewardClient, max_turns: int = 4, stop_score: float | None = None,
                 client_id: str = "env", record: bool = True) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.client, self.max_turns, self.stop_score = client, max_turns, stop_score
        self.client_id, self.record = client_id, record
        self.kernel = self.dtype = ""
        self.messages: list[dict[str, str]] = []
        self.turns: list[Turn] = []
        self.prompt_len = 0
        self.done = True
        self.episode_id = ""

    def reset(self, kernel: str, dtype: str = "float16") -> dict[str, Any]:
        """Starts an episode; returns the first observation (``messages``: the prompt)."""
        self.kernel, self.dtype = kernel, dtype
        self.messages = task_messages(kernel, dtype)
        self.prompt_len = len(self.messages)
        self.turns, self.done = [], False
        self.episode_id = uuid.uuid4().hex[:12]
        return {"messages": list(self.messages), "feedback": "", "kernel": kernel, "dtype": dtype, "turn": 0}

    def step(self, response: str) -> StepResult:
        """Scores the kernel in ``response`` and answers the verdict.

        Raises:
            EpisodeError: no episode is running.
        """
        if self.done:
            raise EpisodeError("step() needs a running episode: call reset(kernel) first")
        from agents.llm.prompts import render

        source = extract_kernel(response)
        answer = self.client.score(self.kernel, source, self.dtype, self.client_id,
                                   {"response": response, "episode_id": self.episode_id})
        turns_left = self.max_turns - len(self.turns) - 1
        stop = self.stop_score is not None and answer["score"] >= self.stop_score
        self.done = turns_left <= 0 or stop
        feedback = render("rl_feedback", status=answer["status"], speedup=answer.get("speedup"),
                          score=answer["score"], feedback=str(answer.get("feedback") or "").strip()[:1500],
                          turns_left=0 if self.done else turns_left)
        self.messages += [{"role": "assistant", "content": response}, {"role": "user", "content": feedback}]
        self.turns.append(Turn(source, str(answer.get("feedback") or ""), answer["status"], float(answer["score"]),
                               answer.get("speedup"), answer.get("variant_id") or source_hash(source),
                               json.dumps({"request_id": answer.get("request_id"), "cached": answer.get("cached"),
                                           **dict(answer.get("evidence") or {})}, default=str)))
        if self.done and self.record:
            self.client.record_trajectory(self.trajectory(answer).to_dict())
        observation = {"messages": list(self.messages), "feedback": feedback, "kernel": self.kernel,
                       "dtype": self.dtype, "turn": len(self.turns)}
        return StepResult(observation, float(answer["score"]), self.done, answer)

    def trajectory(self, last: dict[str, Any] | None = None) -> Trajectory:
        """The episode so far as a trajectory row."""
        return Trajectory(f"episode:{self.episode_id}", "service", "", self.kernel, self.dtype,
                          tuple(self.messages), tuple(self.turns), bool((last or {}).get("synthetic")))
