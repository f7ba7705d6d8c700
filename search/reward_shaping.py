"""Reward shaping for RL trainers (from an evaluator's verdict to one number), and the
reward service's configuration (:class:`RewardConfig`).

The default shaping (docs/rl.md gives the reasons):

==========================  =====================================================
verdict                     score
==========================  =====================================================
OK, speedup <= 1            ``correct`` (0.1): correct but not faster
OK, speedup > 1             ``correct + speedup_weight * ln(speedup)``, at most ``max_score``
COMPILE_ERROR               0.0
RESOURCE_ERROR              0.0
INCORRECT                   0.0
CRASH, TIMEOUT              0.0
REJECTED                    -1.0 (an integrity guard or the sanitizer caught a cheat)
NO_VARIANT                  0.0 (no kernel found in the response)
==========================  =====================================================

Every failing outcome must score at most 0 (checked when a shaping is made), so no verdict
but OK can ever pay; the table is keyed by the enums, so a status added later has no score
until someone gives it one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernels.verdict import Status
from search.config import EvaluatorConfig, RunConfig
from search.export_rewards import Outcome, ProposalOutcome

DEFAULT_PENALTIES: dict[str, float] = {
    Status.COMPILE_ERROR: 0.0,
    Status.RESOURCE_ERROR: 0.0,
    Status.INCORRECT: 0.0,
    Status.CRASH: 0.0,
    Status.TIMEOUT: 0.0,
    Status.REJECTED: -1.0,
    ProposalOutcome.NO_VARIANT: 0.0,
}


class ShapingError(ValueError):
    """A reward shaping that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class Shaping:
    """How a verdict becomes a reward.

    Attributes:
        correct: score of a correct kernel that is not faster than the baseline.
        speedup_weight: weight of ``ln(speedup)`` added for a faster one.
        max_score: cap on any score (a timing glitch cannot pay unboundedly).
        penalties: score per failing outcome name (every :class:`~kernels.verdict.Status`
            but OK, and ``NO_VARIANT``); each must be <= 0.
    """

    correct: float = 0.1
    speedup_weight: float = 1.0
    max_score: float = 3.0
    penalties: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_PENALTIES))

    def __post_init__(self) -> None:
        wanted = {str(s) for s in Status if s is not Status.OK} | {str(ProposalOutcome.NO_VARIANT)}
        given = {str(k) for k in self.penalties}
        if wanted - given:
            raise ShapingError(f"reward penalties miss {sorted(wanted - given)}; give each a score <= 0")
        if given - wanted:
            raise ShapingError(f"reward penalties name unknown outcomes {sorted(given - wanted)}")
        positive = sorted(k for k, v in self.penalties.items() if not float(v) <= 0.0)
        if positive:
            raise ShapingError(f"reward penalties of {positive} are positive; a failure must never pay")
        if not 0.0 <= self.correct <= self.max_score or self.speedup_weight < 0:
            raise ShapingError("reward shaping needs 0 <= correct <= max_score and speedup_weight >= 0")
        object.__setattr__(self, "penalties", {str(k): float(v) for k, v in self.penalties.items()})

    def score(self, outcome: Outcome, speedup: float | None) -> float:
        """The reward of one verdict.

        Raises:
            ValueError: an OK verdict without a speedup.
        """
        if outcome is Status.OK:
            if speedup is None or not speedup > 0:
                raise ValueError("an OK verdict needs its positive speedup")
            gain = self.speedup_weight * math.log(speedup) if speedup > 1.0 else 0.0
            return min(self.max_score, self.correct + gain)
        return float(self.penalties[str(outcome)])

    def to_dict(self) -> dict[str, Any]:
        return {"correct": self.correct, "speedup_weight": self.speedup_weight, "max_score": self.max_score,
                "penalties": dict(self.penalties)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Shaping:
        """Reads a shaping; missing penalties keep their defaults."""
        penalties = {**DEFAULT_PENALTIES, **dict(d.get("penalties", {}))}
        return cls(float(d.get("correct", 0.1)), float(d.get("speedup_weight", 1.0)),
                   float(d.get("max_score", 3.0)), {str(k): float(v) for k, v in penalties.items()})


@dataclass(frozen=True)
class RewardConfig:
    """How the service judges.

    Attributes:
        evaluator: ``gpu`` or ``standin`` (CPU test double: synthetic numbers).
        gpus: evaluator actors.
        dtype: dtype of requests that name none.
        kernels: the kernel names requests may give (empty: any library kernel; never a path).
        heldout / sanitize / loop: the gates a correct verdict passes before it pays.
        shaping: verdict -> reward.
        retries: times an evaluation is retried after its evaluator actor died.
        standin_latency_s: stand-in only: seconds each evaluation sleeps.
        seed: seeds the held-out shapes drawn per kernel.
        max_inflight: requests being judged at once (default: 2 per evaluator).
        evaluation_timeout_s: an evaluator call that takes longer ends its actor (replaced)
            and answers TIMEOUT (:meth:`search.pool.EvalPool.expire`).
        compile_on_cpu_nodes: send compile tasks to the cluster's CPU-only nodes, as a
            search on a cluster does (:class:`search.pool.AdmissionTasks`).
    """

    evaluator: str = "gpu"
    gpus: int = 1
    dtype: str = "float16"
    kernels: tuple[str, ...] = ()
    heldout: bool = True
    sanitize: bool = True
    loop: bool = True
    shaping: Shaping = field(default_factory=Shaping)
    retries: int = 1
    standin_latency_s: float = 0.0
    seed: int = 0
    max_inflight: int = 0
    evaluation_timeout_s: float = 900.0
    compile_on_cpu_nodes: bool = False

    def run_config(self) -> RunConfig:
        evaluator = EvaluatorConfig(kind=self.evaluator, gpus=self.gpus, retries=self.retries,
                                    standin_latency_s=self.standin_latency_s, sanitize=self.sanitize)
        return RunConfig(kernels=self.kernels or ("silu_and_mul",), dtype=self.dtype, seed=self.seed,
                         evaluator=evaluator)
