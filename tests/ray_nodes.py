"""A real multi-node Ray cluster on one machine, for the cluster tests (CPU and GPU).

A head node and one or more worker nodes are separate ``ray start --block`` processes, each with
its own resources and temp dir, and the driver runs from a copy of the project in a folder of its own,
with an external kernel library beside it (Ray attaches it to the head node). Where this
machine allows mount namespaces, every node runs in one in which that folder is hidden under an empty tmpfs: their workers can then
reach neither the driver's code nor its kernel folders except through Ray's runtime
environment. The nodes are ended through their own processes, never ``ray stop`` (which ends
every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kernels.folders import KERNEL_ROOT_VAR
from kernels.spec import LIBRARY_DIR
from search.cluster import PROJECT_PACKAGES
from search.run import REPO_ROOT

RAY = str(Path(sys.executable).with_name("ray"))
# Kernel folders with names the library does not have, and files of their own (digests differ
# from the library's copies).
EXTERNAL = {"act_a": "silu_and_mul", "norm_b": "rmsnorm"}


def external_library(parent: Path) -> Path:
    lib = parent / "ext_lib"
    for name, source in EXTERNAL.items():
        shutil.copytree(LIBRARY_DIR / source, lib / name, ignore=shutil.ignore_patterns("__pycache__"))
        with (lib / name / "spec.py").open("a") as f:
            f.write("\n# a copy outside the library\n")
    return lib


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def can_hide_folders() -> bool:
    """Whether this process may start programs in a private mount namespace."""
    probe = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /mnt"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class Cluster:
    """A running multi-node cluster and the driver's side of it.

    Attributes:
        address: the head's GCS address.
        driver_dir: holds the driver's project copy and the external library.
        project: the driver's copy of the project (its working directory).
        library: the external kernel library.
        env: the driver's environment.
        hidden: whether the nodes cannot see ``driver_dir``.
        n_nodes: the head and the worker nodes.
    """

    address: str
    driver_dir: Path
    project: Path
    library: Path
    env: dict[str, str]
    hidden: bool
    n_nodes: int = 2

    def drive(self, module: str, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
        """``python -m module --address ... args`` from the driver's folder."""
        return subprocess.run([sys.executable, "-m", module, "--address", self.address, *args], cwd=self.project,
                              env=self.env, capture_output=True, text=True, timeout=timeout_s)


def _start_node(args: Sequence[str], env: dict[str, str], log: Path, hide: Path | None) -> subprocess.Popen[bytes]:
    cmd = [RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
           "--object-store-memory", str(150 * 2**20), "--dashboard-agent-listen-port", str(free_port()), *args]
    if hide is not None:  # the node and every process it starts see an empty folder at `hide`
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs tmpfs "$0" && exec "$@"', str(hide), *cmd]
    with log.open("wb") as out:  # its own session: teardown ends the whole group and nothing else
        return subprocess.Popen(cmd, env=env, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_for_nodes(address: str, env: dict[str, str], n: int, procs: list[subprocess.Popen[bytes]],
                    timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a Ray node exited while starting")
        out = subprocess.run([RAY, "status", "--address", address], env=env, capture_output=True, text=True,
                             timeout=60).stdout
        active = out.split("Active:")[-1].split("Pending:")[0] if "Active:" in out else ""
        if active.count("node_") >= n:
            return
        time.sleep(1)
    raise RuntimeError(f"{n} Ray nodes did not come up within {timeout_s:.0f} s")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each ``ray start --block`` (it stops the processes it started), then SIGKILL
    to whatever of its own session is left."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def two_node_cluster(head: Sequence[str], worker: Sequence[str],
                     head_env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A head node started with ``head`` options and a worker node with ``worker`` options
    (see :func:`ray_cluster`)."""
    with ray_cluster(head, [worker], head_env) as c:
        yield c


@contextmanager
def ray_cluster(head: Sequence[str], workers: Sequence[Sequence[str]],
                head_env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A head node started with ``head`` options and a worker node for each of ``workers``
    (``--num-cpus``, ``--num-gpus``, ``--resources``), the driver's folder hidden from them
    where the machine allows; everything is ended and removed on exit.

    ``head_env`` adds to the head node's environment (e.g. ``CUDA_VISIBLE_DEVICES``).
    """
    driver_dir = Path(tempfile.mkdtemp(prefix="ksearch-driver-"))
    ray_dir = Path(tempfile.mkdtemp(prefix="kc-"))  # short: Ray's socket paths must fit 107 bytes
    procs: list[subprocess.Popen[bytes]] = []
    try:
        project = driver_dir / "project"
        for package in (*PROJECT_PACKAGES, "experiments"):
            shutil.copytree(REPO_ROOT / package, project / package,
                            ignore=shutil.ignore_patterns("__pycache__", "results"))
        library = external_library(driver_dir)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", KERNEL_ROOT_VAR)}
        # Every node and the driver share one token; nothing is read from or written to ~/.ray.
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16), RAY_USAGE_STATS_ENABLED="0")
        hide = driver_dir if can_hide_folders() else None
        port = free_port()
        address = f"127.0.0.1:{port}"
        names = ["head", *(f"worker{i}" for i in range(len(workers)))]
        for name in names:
            (ray_dir / name).mkdir()
        procs.append(_start_node(["--head", "--port", str(port), "--include-dashboard", "false",
                                  "--dashboard-port", str(free_port()), "--temp-dir", str(ray_dir / "head" / "t"),
                                  *head], dict(env, **(head_env or {})), ray_dir / "head" / "log", hide))
        _wait_for_nodes(address, env, 1, procs)
        for name, worker in zip(names[1:], workers, strict=True):  # all at once: they start side by side
            procs.append(_start_node(["--address", address, "--temp-dir", str(ray_dir / name / "t"), *worker],
                                     env, ray_dir / name / "log", hide))
        _wait_for_nodes(address, env, len(names), procs)
        yield Cluster(address, driver_dir, project, library, dict(env, PYTHONPATH=str(project)), hide is not None,
                      len(names))
    finally:
        _stop(procs)
        shutil.rmtree(ray_dir, ignore_errors=True)
        shutil.rmtree(driver_dir, ignore_errors=True)


def check_placement(c: Cluster, run_dir: Path, n_evaluators: int, n_agents: int) -> dict:
    """Asserts what every actor of the run reported in ``cluster.json``: the project imported
    from Ray's runtime resources (not the checkout, not the driver's copy), its current folder
    there, and, where the driver's folder was hidden, every kernel folder resolved from the
    staged root; and where the compile tasks ran (:func:`check_compiles`). Returns the record."""
    record = json.loads((run_dir / "cluster.json").read_text())
    assert len(record["nodes"]) == c.n_nodes
    check_compiles(record)
    assert set(record["kernels"]) == {str((c.library / name).resolve()) for name in EXTERNAL}
    assert len(record["evaluators"]) == n_evaluators and len(record["agents"]) == n_agents
    for where in record["evaluators"] + record["agents"]:
        assert "error" not in where, where
        code = Path(where["code_root"])
        assert "runtime_resources" in code.parts, where
        assert not code.is_relative_to(REPO_ROOT) and not code.is_relative_to(c.driver_dir), where
        assert Path(where["kernel_root"]).parent == code and Path(where["cwd"]) == code, where
        if c.hidden:  # the driver's folders do not exist for them: only the staged copies can serve
            assert {Path(p).parent for p in where["kernels"].values()} == {Path(where["kernel_root"])}, where
            assert {Path(p).name for p in where["kernels"].values()} == set(record["kernels"].values())
    return dict(record)


def cpu_only_nodes(record: dict) -> set[str]:
    """The nodes of a ``cluster.json`` with CPUs and no GPU."""
    return {n["node_id"] for n in record["nodes"]
            if n["resources"].get("CPU", 0) >= 1 and not n["resources"].get("GPU", 0)}


def check_compiles(record: dict) -> None:
    """Asserts where a run's compile tasks went, from what each task reported (its node):
    every one ran on a CPU-only node where the cluster has some, and anywhere otherwise."""
    compiles = record["compiles"]
    sent, ran = compiles["sent"], compiles["ran"]
    assert sum(sent.values()) > 0 and sum(ran.values()) == sum(sent.values()), compiles
    cpu_nodes = cpu_only_nodes(record)
    if cpu_nodes:
        assert compiles["placement"] == "cpu nodes" and set(compiles["cpu_nodes"]) == cpu_nodes, compiles
        assert set(sent) <= cpu_nodes and set(ran) <= cpu_nodes, compiles
    else:
        assert compiles["placement"] == "anywhere" and set(sent) == {"anywhere"}, compiles
