"""Which end-of-run compilations start beside the search (search.compile_ahead): every kernel and
shape set whose loops will time peers, none that the peer cache answers in full, none without
compile-ahead or peers; and how many run at once."""

from __future__ import annotations

from pathlib import Path

from kernels.records import ShapeSet
from kernels.spec import kernel_ref, load_kernel, shape_label
from search.compile_ahead import folder_name, needed, room
from search.config import EvaluatorConfig
from search.finalize import loop_keys
from search.peer_cache import PeerCache
from search.state import KernelState

ENV = {"gpu": "NVIDIA H200", "arch": "sm_90", "driver": 13000, "runtime": 13000, "torch": "2.11.0"}


def _states() -> list[KernelState]:
    return [KernelState(load_kernel(n), kernel_ref(n), "float16", 1, 1, 1) for n in ("silu_and_mul", "fused_add_rmsnorm")]


def _reply(st: KernelState, shape_set: str) -> dict:
    labels = [shape_label(s) for s in st.spec.shapes(shape_set)]
    return {"peers": {"best": {lb: 1.0 for lb in labels}, "baseline": {lb: 3.0 for lb in labels},
                      "torch_compile": {lb: 2.0 for lb in labels}},
            "iqr": {}, "errors": {}, "failed": {}, "compiled": {}, "notes": {}}


def test_every_kernel_and_shape_set_compiles_beside_the_search_on_a_gpu() -> None:
    states = _states()
    pairs = needed(EvaluatorConfig(kind="gpu"), states, None)
    assert [(st.name, s) for st, s in pairs] == [("silu_and_mul", "search"), ("silu_and_mul", "heldout"),
                                                ("fused_add_rmsnorm", "search"), ("fused_add_rmsnorm", "heldout")]
    assert needed(EvaluatorConfig(kind="standin"), states, None) == pairs  # it answers that it compiles nothing
    for off in (EvaluatorConfig(kind="gpu", peers=False),
                EvaluatorConfig(kind="gpu", compile_ahead=False, compile_trials=2),
                EvaluatorConfig(kind="gpu", compile_beside_search=False)):
        assert needed(off, states, None) == []


def test_a_shape_set_whose_loops_the_peer_cache_answers_compiles_nothing(tmp_path: Path) -> None:
    states, cfg = _states(), EvaluatorConfig(kind="gpu")
    cache = PeerCache(tmp_path, ENV)
    silu = states[0]
    for key in loop_keys(cache, cfg, silu, ShapeSet.SEARCH):
        assert cache.put(key, _reply(silu, "search"), ["best", "baseline"], "run-1")
    assert [(st.name, s) for st, s in needed(cfg, states, cache)] == [
        ("silu_and_mul", "heldout"), ("fused_add_rmsnorm", "search"), ("fused_add_rmsnorm", "heldout")]
    # --fresh-peers re-measures every peer: everything compiles again.
    fresh = EvaluatorConfig(kind="gpu", fresh_peers=True)
    assert len(needed(fresh, states, cache)) == 4


def test_compilations_at_once_leave_the_search_its_cores() -> None:
    assert room(0, cpus=16) == 0
    assert room(6, cpus=16) == 6 and room(12, cpus=16) == 7
    assert room(6, cpus=2) == 1 and room(6, cpus=8) == 3


def test_each_kernel_and_shape_set_has_a_folder_of_its_own() -> None:
    a, b = _states()
    names = {folder_name("run-1", st, s) for st in (a, b) for s in ("search", "heldout")}
    assert len(names) == 4 and all(n.startswith("run-1/") for n in names)
