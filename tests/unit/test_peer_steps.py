"""CPU tests of the peer steps a sandbox announces (evaluators.peer_steps) and of the set-up
leaving out a peer where an earlier process of the loop died in its call
(evaluators.peers.check_peers with ``excluded``)."""

from __future__ import annotations

import types

import torch

from evaluators.peer_steps import EVERY_SHAPE, parse_peer_step, peer_step
from evaluators.peers import check_peers
from kernels.peer import Peer
from kernels.spec import load_kernel

SHAPE = {"num_tokens": 4, "d": 64}


def test_a_step_names_the_peer_and_the_shape():
    assert parse_peer_step(peer_step("torch_compile[max-autotune#1]", "[33, 32, 96]")) == (
        "torch_compile[max-autotune#1]", "[33, 32, 96]")
    assert parse_peer_step("peers set up on [7, 40, 128]") is None
    assert parse_peer_step("") is None


def _calls() -> tuple[dict[str, Peer], list[str]]:
    called: list[str] = []

    def make(name: str) -> Peer:
        def run(t, shape, constants, scratch):
            called.append(name)
            x = t["x"].float()
            return {"out": (torch.nn.functional.silu(x[:, :64]) * x[:, 64:]).to(t["x"].dtype)}
        return Peer(run)

    return {"a": make("a"), "b": make("b"), "c": make("c")}, called


def test_left_out_peers_are_not_called_and_say_why():
    spec = load_kernel("silu_and_mul")
    peers, called = _calls()
    beats: list[str] = []
    errors: dict[str, str] = {}
    ctx = types.SimpleNamespace(device=torch.device("cpu"))
    excluded = {"a": {"[4, 64]": "its call ended the sandbox process (CRASH); not timed here"},
                "b": {EVERY_SHAPE: "its calls ended the sandbox process on [1, 64], [2, 64]; not timed on any shape"}}
    check_peers(ctx, spec, SHAPE, "float32", peers, errors, beat=beats.append, excluded=excluded)  # type: ignore[arg-type]
    assert called == ["c"] and beats == [peer_step("c", "[4, 64]")]  # announced before its call
    assert errors["a"].startswith("[4, 64]: its call ended the sandbox process")
    assert errors["b"].startswith("its calls ended") and not errors["b"].startswith("[")  # every shape
    # a peer left out on one shape only is called on the others
    called.clear()
    check_peers(ctx, spec, {"num_tokens": 8, "d": 64}, "float32", peers, errors, excluded=excluded)  # type: ignore[arg-type]
    assert called == ["a", "c"]
