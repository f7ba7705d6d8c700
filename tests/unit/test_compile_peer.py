"""Several torch.compile compilations of one program over many shapes (the peers' loop):
each keeps compiling its own code for every shape, none falls back to eager code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from evaluators.peers import _compiling, _own_code


def _program(t: dict[str, torch.Tensor], shape: dict[str, int], constants: Any) -> None:
    t["out"].copy_(t["x"] * 2)


def _counting(counts: dict[str, int], name: str) -> Callable[..., Any]:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        counts[name] += 1
        return gm.forward
    return compile_graph


def _run(fns: dict[str, Any], shapes: range) -> None:
    for n in shapes:
        for fn in fns.values():
            t = {"x": torch.ones(n), "out": torch.zeros(n)}
            fn(t, {"n": n}, None)
            assert torch.equal(t["out"], torch.full((n,), 2.0))


def test_compilations_of_one_program_keep_caches_of_their_own() -> None:
    # Under dynamo's default limit (8 per code object), two compilations of one code object
    # over six shapes would make twelve entries and fall back to eager code; each has its own.
    torch._dynamo.reset()
    counts = {"a": 0, "b": 0}
    fns = {n: torch.compile(_own_code(_program), dynamic=False, backend=_counting(counts, n)) for n in counts}
    _run(fns, range(1, 7))
    assert counts == {"a": 6, "b": 6}


def test_a_compilation_compiles_every_shape_of_a_long_list() -> None:
    torch._dynamo.reset()
    counts = {"a": 0}
    fn = torch.compile(_own_code(_program), dynamic=False, backend=_counting(counts, "a"))
    with _compiling():
        _run({"a": fn}, range(1, 13))  # more shapes than dynamo's default limit
    assert counts == {"a": 12}


def test_own_code_gives_each_wrapper_a_code_object_of_its_own() -> None:
    a, b = _own_code(_program), _own_code(_program)
    assert a.__code__ is not b.__code__
    t = {"x": torch.ones(3), "out": torch.zeros(3)}
    a(t, {}, None)
    assert torch.equal(t["out"], torch.full((3,), 2.0))
