"""The step a sandbox process announces before each call of a peer on a shape (its first call,
its capture), so that a process that dies or hangs inside one (a library's segfault) names the
peer and the shape in its last step: the parent then runs the loop again without that peer
there (:meth:`evaluators.gpu.GpuEvaluator._peers_job`, the loop's ``exclude_peers``). Apart
from :mod:`evaluators.peers` because the parent side reads it without importing torch."""

from __future__ import annotations

import re

PEER_CALL = "call of peer"
# ``exclude_peers`` key for a peer left out on every shape (it ended processes on more shapes
# than a job's re-runs cover)
EVERY_SHAPE = "*"
# Re-runs of one job that leave out a peer on a shape where it ended its process (see
# GpuEvaluator._peers_job, evaluators.peer_compile.compile_ahead) before every such peer is left
# out everywhere: two peers of one library on four unsupported shapes.
PEER_EXCLUSIONS = 8
_STEP = re.compile(rf"{PEER_CALL} (.+) on (\[[^\]]*\])")


def peer_step(name: str, label: str) -> str:
    """The step announced before peer ``name``'s call on the shape labelled ``label``."""
    return f"{PEER_CALL} {name} on {label}"


def parse_peer_step(step: str) -> tuple[str, str] | None:
    """``(peer, shape label)`` of a :func:`peer_step` line, else None."""
    m = _STEP.fullmatch(step.strip())
    return (m.group(1), m.group(2)) if m else None
