"""Cluster runs: staging the code and kernel folders, and a real two-node Ray cluster.

The cluster test starts a head node and a worker node as separate ``ray start --block``
processes (their own CPUs, resources and temp dirs) and runs the driver from a copy of the
project in a folder of its own, with kernel folders from a library outside ``kernels/``. Where
this machine allows mount namespaces, both nodes run in one in which that folder is hidden
under an empty tmpfs, so their workers can reach neither the driver's code nor its kernel
folders except through Ray's runtime environment; the run's ``cluster.json`` (what each
actor reported) must then show the project imported from Ray's unpacked runtime resources and
every kernel folder resolved from the staged root.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernels.folders import KERNEL_ROOT_VAR, KernelRef, folder_digest
from kernels.spec import LIBRARY_DIR
from search.cluster import PROJECT_PACKAGES, STAGED_KERNELS_DIR, StagingError, runtime_env, stage
from search.run import REPO_ROOT

RAY = str(Path(sys.executable).with_name("ray"))
# Kernel folders with names the library does not have, and files of their own (digests differ
# from the library's copies).
EXTERNAL = {"act_a": "silu_and_mul", "norm_b": "rmsnorm"}
SMALL = ["--evaluator", "standin", "--population", "2", "--variants", "2", "--trials", "2", "--gpus", "2"]


def _external_library(parent: Path) -> Path:
    lib = parent / "ext_lib"
    for name, source in EXTERNAL.items():
        shutil.copytree(LIBRARY_DIR / source, lib / name, ignore=shutil.ignore_patterns("__pycache__"))
        with (lib / name / "spec.py").open("a") as f:
            f.write("\n# a copy outside the library\n")
    return lib


# -- staging, without Ray -------------------------------------------------------------------

def test_stage_ships_the_packages_and_each_kernel_folder_under_its_digest(tmp_path):
    lib = _external_library(tmp_path)
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
    lib = _external_library(tmp_path)
    ref = KernelRef.of(lib / "act_a")
    (lib / "act_a" / "notes.txt").write_text("edited after the run found it")
    with pytest.raises(StagingError, match="changed since the run found it"):
        stage([ref], tmp_path / "job1")
    ref = KernelRef.of(lib / "act_a")
    (lib / "act_a" / "weights.bin").write_bytes(os.urandom(1 << 20))
    ref = KernelRef.of(lib / "act_a")
    with pytest.raises(StagingError, match=r"largest kernel folder is .*act_a"):
        stage([ref], tmp_path / "job2", max_bytes=1 << 20)


# -- a real two-node cluster ----------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _can_hide_folders() -> bool:
    """Whether this process may start programs in a private mount namespace."""
    probe = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /mnt"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class Cluster:
    address: str
    driver_dir: Path       # the driver's project copy and the external library live here
    project: Path
    library: Path
    env: dict[str, str]    # the driver's environment
    hidden: bool           # the nodes cannot see driver_dir


def _node_env(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", KERNEL_ROOT_VAR)}
    # Every node and the driver share one token; nothing is read from or written to ~/.ray.
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_USAGE_STATS_ENABLED="0")
    return env


def _start_node(args: list[str], env: dict[str, str], log: Path, hide: Path | None) -> subprocess.Popen[bytes]:
    cmd = [RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
           "--object-store-memory", str(150 * 2**20), "--dashboard-agent-listen-port", str(_free_port()), *args]
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
    """SIGTERM to each ``ray start --block`` (it stops the processes it started), then SIGKILL to
    whatever of its own session is left; never ``ray stop``, which ends every Ray on the machine."""
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


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    driver_dir = Path(tempfile.mkdtemp(prefix="ksearch-driver-"))
    ray_dir = Path(tempfile.mkdtemp(prefix="kc-"))  # short: Ray's socket paths must fit 107 bytes
    procs: list[subprocess.Popen[bytes]] = []
    try:
        project = driver_dir / "project"
        for package in (*PROJECT_PACKAGES, "experiments"):
            shutil.copytree(REPO_ROOT / package, project / package,
                            ignore=shutil.ignore_patterns("__pycache__", "results"))
        library = _external_library(driver_dir)
        token = secrets.token_hex(16)
        env = _node_env(token)
        hide = driver_dir if _can_hide_folders() else None
        port = _free_port()
        address = f"127.0.0.1:{port}"
        for name in ("head", "worker"):
            (ray_dir / name).mkdir()
        procs.append(_start_node(["--head", "--port", str(port), "--num-cpus", "1", "--num-gpus", "0",
                                  "--include-dashboard", "false", "--dashboard-port", str(_free_port()),
                                  "--temp-dir", str(ray_dir / "head" / "t")], env, ray_dir / "head" / "log", hide))
        _wait_for_nodes(address, env, 1, procs)
        procs.append(_start_node(["--address", address, "--num-cpus", "1", "--num-gpus", "0",
                                  "--resources", json.dumps({"worker_node": 1}),
                                  "--temp-dir", str(ray_dir / "worker" / "t")], env, ray_dir / "worker" / "log", hide))
        _wait_for_nodes(address, env, 2, procs)
        yield Cluster(address, driver_dir, project, library, dict(env, PYTHONPATH=str(project)), hide is not None)
    finally:
        _stop(procs)
        shutil.rmtree(ray_dir, ignore_errors=True)
        shutil.rmtree(driver_dir, ignore_errors=True)


def _drive(c: Cluster, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", module, "--address", c.address, *args], cwd=c.project, env=c.env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def _check_placement(c: Cluster, run_dir: Path) -> None:
    """What every actor of the run reported: the project from Ray's runtime resources, the
    kernel folders from the staged root."""
    record = json.loads((run_dir / "cluster.json").read_text())
    assert len(record["nodes"]) == 2
    staged = {str((c.library / name).resolve()) for name in EXTERNAL}
    assert set(record["kernels"]) == staged
    actors = record["evaluators"] + record["agents"]
    assert len(record["evaluators"]) == 2 and len(record["agents"]) == 2
    for where in actors:
        assert "error" not in where, where
        code = Path(where["code_root"])
        assert "runtime_resources" in code.parts, where
        assert not code.is_relative_to(REPO_ROOT) and not code.is_relative_to(c.driver_dir), where
        assert Path(where["kernel_root"]).parent == code and Path(where["cwd"]) == code, where
        if c.hidden:  # the driver's folders do not exist for them: only the staged copies can serve
            assert {Path(p).parent for p in where["kernels"].values()} == {Path(where["kernel_root"])}, where
            assert {Path(p).name for p in where["kernels"].values()} == set(record["kernels"].values())


@pytest.mark.slow
def test_standin_run_on_a_two_node_cluster(cluster):
    _drive(cluster, "search.run", "--kernel-dir", str(cluster.library), "--rounds", "1", *SMALL,
           "--out", str(cluster.driver_dir / "runs"))
    (run_dir,) = (cluster.driver_dir / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(k["kernel"] for k in summary["kernels"]) == ["rmsnorm", "silu_and_mul"]
    _check_placement(cluster, run_dir)


@pytest.mark.slow
def test_sweep_over_an_external_library_on_a_two_node_cluster(cluster):
    _drive(cluster, "search.sweep", "--library", str(cluster.library), "--budget-rounds", "1", *SMALL,
           "--out", str(cluster.driver_dir / "sweeps"))
    (sweep_dir,) = (cluster.driver_dir / "sweeps").iterdir()
    assert (sweep_dir / "sweep.md").is_file()
    meta = json.loads((sweep_dir / "sweep.json").read_text())
    _check_placement(cluster, sweep_dir / meta["run_dir"])
