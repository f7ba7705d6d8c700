"""The agent interface: one method, ``propose``, shared by the embedded and LLM backends."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernels.folders import KernelRef
from kernels.variant import Variant
from kernels.verdict import Evaluation


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from its parts, the same in every process and on every machine.

    Python's ``hash()`` of a string is salted per process, so a seed made with it differs
    between a run and its resume; a digest of the parts' text does not.
    """
    text = "\x1f".join(repr(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@dataclass(frozen=True)
class Attempt:
    """One past attempt of a lineage: the variant and the verdict it got (None: not yet run)."""

    variant: Variant
    evaluation: Evaluation | None


@dataclass(frozen=True)
class AgentContext:
    """What an agent sees when it proposes.

    Attributes:
        kernel: the kernel's name in the run (records, lineages); the spec's name unless two
            kernels of the run share it.
        description: the kernel spec's plain-words description.
        signature: the C argument list every variant must keep (for prompts).
        shapes: the search shapes (dicts over the int arguments).
        dtype: the run dtype.
        parent: the variant to improve (its own best, or a migrated elite).
        parent_eval: that variant's evaluation.
        history: this lineage's attempts so far, oldest first (not only the last round).
        elites: the population's current top variants with their evaluations.
        round: the search round (0-based).
        n_variants: how many proposals are wanted.
        seed: the seed of this request, derived from the run's seed, the kernel, the round
            and the agent's slot (:func:`derive_seed`): an agent draws its randomness from it
            (and its own constructor seed), never from how often it was called.
        ref: the kernel's folder reference: load the spec with ``load_kernel(ref)`` (None
            only in contexts made by hand for a library kernel named ``kernel``).
    """

    kernel: str
    description: str
    signature: str
    shapes: tuple[dict[str, int], ...]
    dtype: str
    parent: Variant
    parent_eval: Evaluation | None
    history: tuple[Attempt, ...] = ()
    elites: tuple[Attempt, ...] = ()
    round: int = 0
    n_variants: int = 4
    seed: int = 0
    gpu: str = "NVIDIA H200 (sm_90, 132 SMs, 4.8 TB/s HBM3e, 60 MB L2)"
    ref: KernelRef | None = None

    @property
    def kernel_source(self) -> KernelRef | str:
        """What to load the spec from: the reference, or the library name without one."""
        return self.ref if self.ref is not None else self.kernel


@dataclass(frozen=True)
class Proposal:
    """One proposed variant, with the record of how it was made.

    Attributes:
        variant: the proposed source (parent, author, note filled in).
        transformation: the name of the change (embedded) or the planner's summary (LLM).
        calls: records of LLM calls that produced it (messages, reply, usage, latency);
            empty for embedded agents.
        failure: when the agent could not produce usable code, why (the variant is then the
            parent and must not be evaluated).
    """

    variant: Variant
    transformation: str = ""
    calls: tuple[dict[str, Any], ...] = ()
    failure: str = ""


class Agent(ABC):
    """A planner/coder pair. Implementations must be picklable (they live in Ray actors)."""

    name: str = "agent"

    @abstractmethod
    def propose(self, ctx: AgentContext) -> Sequence[Proposal]:
        """Returns up to ``ctx.n_variants`` proposals derived from ``ctx.parent``.

        The same context (after the same observed attempts) must give the same proposals: a
        resumed run asks only for the rounds it has no record of, and must get what the
        uninterrupted run would have got.
        """

    def observe(self, attempts: Sequence[Attempt]) -> None:  # noqa: B027 - optional hook
        """Receives the verdicts of this agent's latest proposals (for stateful agents)."""
