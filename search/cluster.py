"""Shipping a run to a Ray cluster (``--address``) through Ray's runtime environment.

Nothing is assumed installed on the worker nodes but Python and the project's dependencies:
the driver stages a folder holding the project's packages and a copy of every kernel folder the
run uses (``kernel_folders/<digest>/``, the digest of :func:`kernels.folders.folder_digest`),
and passes it as the job's ``working_dir``. Ray zips it once, uploads it to the cluster's GCS
and unpacks it on each node before the first task or actor of the job starts there; the
workers run in the unpacked folder (their current directory, first on ``sys.path``), so they
import the project from it, and ``KSEARCH_KERNEL_ROOT`` (relative, so it resolves against
that folder) tells :func:`kernels.folders.resolve_folder` where the staged kernel folders are.

Staging copies instead of pointing ``working_dir`` at the checkout: the run ships exactly the
packages and folders it needs, whatever else the checkout holds (a virtual environment, runs,
results, ``.git``), and kernel folders from anywhere on the driver's disk travel in the same
upload.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.folders import KERNEL_ROOT_VAR, KernelRef, folder_digest, resolve_folder

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# What a worker imports: the agents, compile tasks and evaluators need these and nothing else
# (experiments/ sits above search/ and is only ever run on the driver).
PROJECT_PACKAGES = ("kernels", "evaluators", "agents", "search")
STAGED_KERNELS_DIR = "kernel_folders"
# Ray refuses a package over its gRPC message limit (512 MiB zipped) and warns from half of it;
# a run's code and kernel folders are a few MB, so a folder that pushes past this is a mistake
# (data or build output left in a kernel folder), said before anything uploads.
MAX_STAGED_BYTES = 200 * 1024 * 1024
_NEVER_SHIPPED = ("__pycache__", "*.pyc", "*.pyo", ".git", ".venv", ".mypy_cache", ".ruff_cache",
                  ".pytest_cache")


class StagingError(ValueError):
    """The run's code or kernel folders cannot be shipped to the cluster (too large, unreadable)."""


@dataclass(frozen=True)
class Staged:
    """A staged working directory for a cluster run.

    Attributes:
        working_dir: the folder Ray uploads.
        kernels: driver path of each kernel folder -> its digest (its folder under the root).
        size_bytes: bytes of every staged file.
    """

    working_dir: Path
    kernels: dict[str, str] = field(default_factory=dict)
    size_bytes: int = 0


class UnreachableCluster(ConnectionError):
    """Nothing answers at a cluster address (``ray.init`` would wait minutes before saying so)."""


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fails fast when nothing listens at ``address`` (``host:port`` or ``ray://host:port``);
    ``auto`` and addresses without a port are left to Ray.

    Raises:
        UnreachableCluster: the connection was refused or timed out.
    """
    where = address.removeprefix("ray://")
    host, sep, port = where.rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UnreachableCluster(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with `ray start --head` "
            "there, or leave --address out to run on a local cluster"
        ) from None


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def stage(kernels: Iterable[KernelRef], dest: Path, max_bytes: int = MAX_STAGED_BYTES) -> Staged:
    """Copies the project's packages and each kernel folder (at ``kernel_folders/<digest>/``)
    into ``dest`` (an empty or missing folder).

    Raises:
        StagingError: a kernel folder no longer holds the files its reference names, its copy
            does not hash to its digest, or the whole exceeds ``max_bytes``.
    """
    ignore = shutil.ignore_patterns(*_NEVER_SHIPPED)
    dest.mkdir(parents=True, exist_ok=True)
    for package in PROJECT_PACKAGES:
        shutil.copytree(PROJECT_ROOT / package, dest / package, ignore=ignore)
    staged: dict[str, str] = {}
    for ref in kernels:
        folder = Path(ref.folder)
        if not folder.is_dir() or folder_digest(folder) != ref.digest:
            raise StagingError(f"kernel folder {folder} changed since the run found it (digest {ref.digest}); "
                               "start the run again")
        target = dest / STAGED_KERNELS_DIR / ref.digest
        if not target.exists():  # two references to one content share a copy
            shutil.copytree(folder, target, ignore=ignore)
            # The workers find the copy by this digest: a file the copy left out, or one that
            # changed while copying, would leave them with a folder no reference names.
            if folder_digest(target) != ref.digest:
                raise StagingError(f"kernel folder {folder} changed while it was staged, or holds files "
                                   "that are not shipped (.git, .venv, caches); remove them or stage it again")
        staged[ref.folder] = ref.digest
    size = _tree_bytes(dest)
    if size > max_bytes:
        raise StagingError(f"the run's code and kernel folders come to {size / 2**20:.0f} MiB, over the "
                           f"{max_bytes / 2**20:.0f} MiB shipped to a cluster: {_largest_folder(staged)}")
    return Staged(dest, staged, size)


def _largest_folder(kernels: Mapping[str, str]) -> str:
    if not kernels:
        return "the project's packages are that large"
    sizes = {path: _tree_bytes(Path(path)) for path in kernels}
    path = max(sizes, key=lambda p: sizes[p])
    return f"the largest kernel folder is {path} ({sizes[path] / 2**20:.0f} MiB)"


def runtime_env(staged: Staged) -> dict[str, Any]:
    """Ray's job runtime_env for a staged run: its folder as ``working_dir`` and the kernel
    root, relative to it, in the workers' environment."""
    return {
        "working_dir": str(staged.working_dir),
        "excludes": list(_NEVER_SHIPPED),
        "env_vars": {KERNEL_ROOT_VAR: STAGED_KERNELS_DIR},
    }


def whereabouts(kernels: Mapping[str, str]) -> dict[str, Any]:
    """Where the calling Ray worker runs and where it takes the project and the run's kernel
    folders from (the provenance a cluster run records in ``cluster.json``).

    Args:
        kernels: driver path of each kernel folder -> its digest (:attr:`Staged.kernels`).
    """
    import ray

    root = os.environ.get(KERNEL_ROOT_VAR)
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "hostname": os.uname().nodename,
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "code_root": str(PROJECT_ROOT),  # where this process imported the project from
        "kernel_root": str(Path(root).resolve()) if root else None,
        "kernels": {path: str(Path(resolve_folder(path, digest)).resolve()) for path, digest in kernels.items()},
    }


def compile_nodes(nodes: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The nodes a cluster run sends its compile (admission) tasks to: node id -> CPUs, for
    every alive node with at least one CPU and no GPU; empty when the cluster has none (then
    compiles run wherever Ray puts them).

    Args:
        nodes: entries shaped like ``ray.nodes()`` (``NodeID``, ``Alive``, ``Resources``:
            the node's total resources).
    """
    chosen: dict[str, float] = {}
    for node in nodes:
        resources = node.get("Resources") or {}
        # A compile task asks for one whole CPU: a node with less could never run one.
        if node.get("Alive") and resources.get("CPU", 0) >= 1 and not resources.get("GPU", 0):
            chosen[str(node["NodeID"])] = float(resources["CPU"])
    return chosen


def placement_record(staged: Staged, evaluators: Sequence[dict[str, Any]], agents: Sequence[dict[str, Any]],
                     compiles: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The content of ``cluster.json``: the cluster's nodes, the driver's node, what was
    shipped, where each evaluator and agent actor ran (its :func:`whereabouts`) and where the
    compile tasks were sent and ran (:meth:`search.pool.AdmissionTasks.record`)."""
    import ray

    nodes = [{"node_id": n["NodeID"], "address": n.get("NodeManagerAddress"),
              "resources": {k: v for k, v in n.get("Resources", {}).items() if k in ("CPU", "GPU")}}
             for n in ray.nodes() if n.get("Alive")]
    return {"nodes": nodes, "driver_node": ray.get_runtime_context().get_node_id(),
            "staged_bytes": staged.size_bytes, "kernels": staged.kernels,
            "evaluators": list(evaluators), "agents": list(agents), "compiles": dict(compiles or {})}
