"""Where a cluster run's compile (admission) tasks go: the choice of nodes from ``ray.nodes()``
and the tasks' placement and records on a local Ray (its one node has CPUs and no GPU)."""

from __future__ import annotations

import pytest

from kernels.spec import load_kernel
from search.cluster import compile_nodes
from search.pool import ANYWHERE, AdmissionTasks


def _node(node_id: str, alive: bool = True, **resources: float) -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "10.0.0.1", "Resources": resources}


def test_compile_nodes_are_the_alive_nodes_with_cpus_and_no_gpu():
    nodes = [
        _node("gpu", CPU=64.0, GPU=8.0, memory=1e12),
        _node("cpu_big", CPU=32.0, memory=1e11),
        _node("cpu_small", CPU=2.0, object_store_memory=1e9),
        _node("dead_cpu", alive=False, CPU=16.0),
        _node("no_cpu", CPU=0.0),  # e.g. a head started with --num-cpus 0
        _node("half_cpu", CPU=0.5),  # could never run a one-CPU task
        _node("gpu_zero", CPU=4.0, GPU=0.0),
        {"NodeID": "bare", "Alive": True},  # no resources reported
    ]
    assert compile_nodes(nodes) == {"cpu_big": 32.0, "cpu_small": 2.0, "gpu_zero": 4.0}


def test_compile_nodes_is_empty_on_a_cluster_of_gpu_nodes():
    assert compile_nodes([_node("a", CPU=8.0, GPU=1.0), _node("b", CPU=8.0, GPU=2.0)]) == {}
    assert compile_nodes([]) == {}


def test_cpu_nodes_take_turns_in_proportion_to_their_cpus():
    tasks = AdmissionTasks(refresh_s=float("inf"))
    tasks.on_cpu_nodes([_node("big", CPU=3.0), _node("small", CPU=1.0), _node("gpu", CPU=8.0, GPU=1.0)])
    picks = [tasks._next_node() for _ in range(8)]
    assert picks.count("big") == 6 and picks.count("small") == 2
    tasks.on_cpu_nodes([_node("gpu", CPU=8.0, GPU=1.0)])
    assert tasks._next_node() is None


def _submit(tasks: AdmissionTasks, n: int) -> list:
    spec = load_kernel("silu_and_mul")
    summaries = []
    for block in (64, 128, 256, 512)[:n]:
        source = spec.baseline_source().replace("block=(256,)", f"block=({block},)")
        summary, _artifact = tasks.remote("silu_and_mul", source, "float16", {}, spec.search_shapes[:1])
        summaries.append(summary)
    return summaries


def test_compiles_go_to_the_cpu_node_and_record_where_they_ran(local_ray, compile_cache):
    import ray

    from evaluators.admit import Admitted

    node = ray.get_runtime_context().get_node_id()
    tasks = AdmissionTasks()
    tasks.on_cpu_nodes()  # the local node: CPUs, no GPU on this machine or none given to Ray
    if node not in tasks.nodes:
        pytest.skip("the local Ray node has a GPU")
    assert all(isinstance(s, Admitted) for s in ray.get(_submit(tasks, 3), timeout=120))
    record = tasks.record()
    assert record["placement"] == "cpu nodes" and node in record["cpu_nodes"]
    assert record["sent"] == {node: 3} and record["ran"] == {node: 3}


def test_a_chosen_node_that_is_gone_does_not_stall_compiles(local_ray, compile_cache):
    """Soft affinity: a task sent to a node that no longer exists runs on another one."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    gone = "ab" * 28  # a well-formed node id no node of this cluster has
    tasks = AdmissionTasks(refresh_s=float("inf"))
    tasks.on_cpu_nodes([_node(gone, CPU=4.0)])
    ray.get(_submit(tasks, 2), timeout=120)
    record = tasks.record()
    assert record["sent"] == {gone: 2} and record["ran"] == {node: 2}


def test_local_runs_place_compiles_anywhere_and_record_nothing(local_ray, compile_cache):
    import ray

    tasks = AdmissionTasks()
    tasks.anywhere()
    ray.get(_submit(tasks, 1), timeout=120)
    assert tasks.record() == {"placement": ANYWHERE, "cpu_nodes": {}, "sent": {}, "ran": {}}


def _node_of_task(kernel: str, source: str, dtype: str, params: dict, shapes: list) -> tuple:
    """Stands in for the admission task: no compile, only where it ran (fails on ``fail``)."""
    import ray

    if source == "fail":
        raise RuntimeError("a compile task that fails")
    return None, None, ray.get_runtime_context().get_node_id()


def test_many_compiles_are_counted_once_each_failed_ones_as_unanswered(local_ray, monkeypatch):
    import ray

    import search.pool

    monkeypatch.setattr(search.pool, "_admission_task_on_node", ray.remote(num_cpus=1, num_returns=3)(_node_of_task))
    node = ray.get_runtime_context().get_node_id()
    tasks = AdmissionTasks(refresh_s=float("inf"))
    tasks.on_cpu_nodes([_node(node, CPU=2.0)])
    sources = ["fail" if i % 50 == 0 else f"v{i}" for i in range(150)]  # past two counts along the way
    refs = [tasks.remote("k", source, "float16", {}, []) for source in sources]
    ray.wait([summary for summary, _ in refs], num_returns=len(refs), timeout=120)
    record = tasks.record()
    assert record["sent"] == {node: 150}
    assert record["ran"] == {node: 147, "unanswered": 3}
