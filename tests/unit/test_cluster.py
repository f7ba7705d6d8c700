"""Cluster runs: staging the code and kernel folders, and a real multi-node Ray cluster.

The cluster tests start a head node and two worker nodes (one with GPUs, one with CPUs only)
as separate ``ray start`` processes and drive a stand-in run and a sweep over an external
library from a folder the nodes cannot see (:mod:`tests.ray_nodes`); each run's
``cluster.json`` (what each actor and compile task reported) must show the project imported
from Ray's unpacked runtime resources, the kernel folders resolved from the staged root, and
every compile task run on the CPU-only node.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from kernels.folders import KERNEL_ROOT_VAR, KernelRef, folder_digest
from search.cluster import (
    PROJECT_PACKAGES,
    STAGED_KERNELS_DIR,
    StagingError,
    UnreachableCluster,
    check_reachable,
    runtime_env,
    stage,
)
from search.run import REPO_ROOT
from tests.ray_nodes import (
    EXTERNAL,
    Cluster,
    check_placement,
    cpu_only_nodes,
    external_library,
    ray_cluster,
)

SMALL = ["--evaluator", "standin", "--population", "2", "--variants", "2", "--trials", "2", "--gpus", "2"]

# -- an address where nothing answers, without Ray ------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the with-block ends: nothing listens there


def test_an_address_where_nothing_listens_fails_at_once():
    port = _closed_port()
    start = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(UnreachableCluster, match=f"no Ray cluster answers at {address}"):
            check_reachable(address)
    assert time.monotonic() - start < 10
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_reachable(f"127.0.0.1:{listening.getsockname()[1]}")
    check_reachable("auto")  # Ray finds it


def test_search_run_says_so_instead_of_waiting(tmp_path):
    port = _closed_port()
    cmd = [sys.executable, "-m", "search.run", "--address", f"127.0.0.1:{port}", "--kernel", "silu_and_mul",
           *SMALL, "--rounds", "1", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stderr
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in done.stderr


# -- staging, without Ray -------------------------------------------------------------------

def test_stage_ships_the_packages_and_each_kernel_folder_under_its_digest(tmp_path):
    lib = external_library(tmp_path)
    refs = [KernelRef.of(lib / name) for name in EXTERNAL]
    (lib / "act_a" / "__pycache__").mkdir()
    (lib / "act_a" / "__pycache__" / "spec.cpython-311.pyc").write_bytes(b"\0" * 64)
    staged = stage([*refs, refs[0]], tmp_path / "job")
    for package in PROJECT_PACKAGES:
        assert (staged.working_dir / package / "__init__.py").is_file()
    assert not (staged.working_dir / "tests").exists() and not (staged.working_dir / "experiments").exists()
    assert not list(staged.working_dir.rglob("__pycache__"))
    assert staged.kernels == {ref.folder: ref.digest for ref in refs}
    for ref in refs:
        copy = staged.working_dir / STAGED_KERNELS_DIR / ref.digest
        assert folder_digest(copy) == ref.digest and (copy / "baseline.cu").is_file()
    env = runtime_env(staged)
    assert env["working_dir"] == str(staged.working_dir)
    assert env["env_vars"] == {KERNEL_ROOT_VAR: STAGED_KERNELS_DIR}


def test_stage_refuses_a_changed_folder_and_an_oversized_one(tmp_path):
    lib = external_library(tmp_path)
    ref = KernelRef.of(lib / "act_a")
    (lib / "act_a" / "notes.txt").write_text("edited after the run found it")
    with pytest.raises(StagingError, match="changed since the run found it"):
        stage([ref], tmp_path / "job1")
    (lib / "act_a" / "weights.bin").write_bytes(os.urandom(1 << 20))
    ref = KernelRef.of(lib / "act_a")
    with pytest.raises(StagingError, match=r"largest kernel folder is .*act_a"):
        stage([ref], tmp_path / "job2", max_bytes=1 << 20)


# -- a real two-node cluster ----------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # Logical GPUs (nothing uses CUDA here): one on the head (the driver's node), two on a
    # worker node; a second worker node has CPUs and no GPU, for the compile tasks.
    with ray_cluster(["--num-cpus", "1", "--num-gpus", "1"],
                     [["--num-cpus", "1", "--num-gpus", "2", "--resources", json.dumps({"worker_node": 1})],
                      ["--num-cpus", "2", "--num-gpus", "0"]]) as c:
        yield c


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.slow
def test_standin_run_on_a_multi_node_cluster(cluster):
    _ok(cluster.drive("search.run", "--kernel-dir", str(cluster.library), "--rounds", "1", *SMALL,
                      "--out", str(cluster.driver_dir / "runs")))
    (run_dir,) = (cluster.driver_dir / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(k["kernel"] for k in summary["kernels"]) == ["rmsnorm", "silu_and_mul"]
    record = check_placement(cluster, run_dir, n_evaluators=2, n_agents=2)
    # Every compile ran on the one CPU-only node, a node other than the driver's (where Ray
    # would put them first): each task reported the node it ran on.
    (cpu_node,) = cpu_only_nodes(record)
    assert cpu_node != record["driver_node"]
    assert set(record["compiles"]["ran"]) == {cpu_node}


@pytest.mark.slow
def test_sweep_over_an_external_library_on_a_multi_node_cluster(cluster):
    _ok(cluster.drive("search.sweep", "--library", str(cluster.library), "--budget-rounds", "1", *SMALL,
                      "--out", str(cluster.driver_dir / "sweeps")))
    (sweep_dir,) = (cluster.driver_dir / "sweeps").iterdir()
    assert (sweep_dir / "sweep.md").is_file()
    meta = json.loads((sweep_dir / "sweep.json").read_text())
    check_placement(cluster, sweep_dir / meta["run_dir"], n_evaluators=2, n_agents=2)


PLACEMENT_PROBE = """
import json, os, sys
import ray
from search.config import load_config, override
from search.pool import evaluator_options
from search.run import start_ray

start_ray(override(load_config(None), {"address": sys.argv[1]}))

class Probe:
    def where(self):
        return [ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES")]

actors = [ray.remote(Probe).options(**evaluator_options("gpu")).remote() for _ in range(3)]
print(json.dumps(ray.get([a.where.remote() for a in actors], timeout=120)))
"""


@pytest.mark.slow
def test_gpu_evaluators_take_one_gpu_each_across_the_nodes(cluster):
    """Three GPU evaluators' placement on the cluster's three logical GPUs (one on the head,
    two on a worker node): one per GPU, so one on the head and two on that worker node, each
    with a device of its own."""
    proc = subprocess.run([sys.executable, "-c", PLACEMENT_PROBE, cluster.address], cwd=cluster.project,
                          env=cluster.env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    placed = json.loads(proc.stdout.strip().splitlines()[-1])
    by_node: dict[str, list[str]] = {}
    for node, devices in placed:
        by_node.setdefault(node, []).append(devices)
    assert sorted(len(d) for d in by_node.values()) == [1, 2]
    for devices in by_node.values():
        assert all(d and "," not in d for d in devices) and len(set(devices)) == len(devices)
