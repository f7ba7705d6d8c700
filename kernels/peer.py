"""A production peer as it is timed: the call a serving engine makes, and what it needs
staged before that call, outside the timed window.

A spec's ``peers`` maps names to plain functions ``(inputs, shape, constants)`` that write
their results into the output tensors, or to :class:`Peer` objects for libraries whose API
does not fit that mould without extra work inside the timed window:

- a library that returns new tensors (FlashInfer's ``merge_state``, Liger's functions)
  ``run`` returns them as ``{output name: tensor}``: the harness checks the returned tensors
  instead of the outputs, so no copy into the outputs is timed;
- an in-place API (FlashInfer's ``merge_state_in_place``) or one that wants its operands laid
  out as the library's callers keep them (Liger's separate gate and up tensors) ``stage``s
  them from the inputs after every restore, before the L2 flush, into ``scratch`` (tensors
  the peer allocates on its first stage and reuses, so a CUDA graph captured on them stays
  valid).

``note`` says in the results what exactly is timed when it is not the plain library call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Scratch = dict[str, Any]


@dataclass(frozen=True)
class Peer:
    """One peer: ``run(inputs, shape, constants, scratch)`` is timed and returns None (results
    written into the outputs) or ``{output name: tensor}``; ``stage(inputs, shape, constants,
    scratch)``, if given, runs before every timed call, outside the window."""

    run: Callable[[Mapping[str, Any], Mapping[str, int], Any, Scratch], Mapping[str, Any] | None]
    stage: Callable[[Mapping[str, Any], Mapping[str, int], Any, Scratch], None] | None = None
    note: str = ""


def as_peer(peer: Peer | Callable[..., Any]) -> Peer:
    """A spec's peer entry as a :class:`Peer` (plain functions write into the outputs)."""
    if isinstance(peer, Peer):
        return peer
    return Peer(run=lambda t, shape, constants, scratch: peer(t, shape, constants))


def call_once(peer: Peer, t: Mapping[str, Any], shape: Mapping[str, int], constants: Any,
              scratch: Scratch | None = None) -> Mapping[str, Any]:
    """Stages and runs ``peer`` on ``t``; returns its results by output name (those it
    returned, else the tensors of ``t`` it wrote)."""
    scratch = {} if scratch is None else scratch
    if peer.stage is not None:
        peer.stage(t, shape, constants, scratch)
    returned = peer.run(t, shape, constants, scratch)
    return dict(returned) if returned else {}
