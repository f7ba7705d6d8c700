"""Kernel folders by content: a digest of a folder, and a reference that finds it again.

A run names each kernel by a :class:`KernelRef`: the folder where the run found it and the
digest of that folder's files. Every process that needs the spec (agents, compile tasks,
evaluators, sanitizer runs, reports) resolves the reference with :func:`resolve_folder`,
which accepts the folder only while it still holds the same files. On a machine where that
path does not exist, a copy of the folder staged under ``$KSEARCH_KERNEL_ROOT/<digest>/``
stands in for it. Two kernels that share a name but not their files never share a
reference, a cache entry or an imported module.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KERNEL_ROOT_VAR = "KSEARCH_KERNEL_ROOT"
DIGEST_CHARS = 16


class KernelSpecError(ValueError):
    """A kernel spec that is inconsistent or cannot be loaded, or a kernel folder that cannot
    be found or no longer holds the files it was found with; the message names the fix.
    (Defined here, the lowest module that raises it; :mod:`kernels.spec` exports it.)"""


def _hashed_files(root: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every file under ``root`` that the digest covers,
    sorted by relative path: bytecode caches are left out (Python writes them on import)."""
    out = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts or path.suffix == ".pyc" or not path.is_file():
            continue
        out.append((rel.as_posix(), path))
    return sorted(out)


def folder_digest(path: str | Path) -> str:
    """The first 16 hex digits of a SHA-256 over the folder's files: each file's relative
    path and bytes, in sorted order (``__pycache__`` and ``*.pyc`` skipped). The same files
    give the same digest on every machine, wherever the folder lies.

    Raises:
        KernelSpecError: ``path`` is not a folder.
    """
    root = Path(path)
    if not root.is_dir():
        raise KernelSpecError(f"kernel folder {root} does not exist")
    h = hashlib.sha256()
    for rel, file in _hashed_files(root):
        data = file.read_bytes()
        # Lengths delimit the fields, so no two different folders feed the same byte stream.
        name = rel.encode("utf-8", "surrogateescape")
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:DIGEST_CHARS]


def _matches(folder: Path, digest: str) -> bool:
    return folder.is_dir() and folder_digest(folder) == digest


def resolve_folder(path: str, digest: str) -> Path:
    """The folder a reference names, on this machine.

    ``path`` itself when it holds files of this digest; else, when ``KSEARCH_KERNEL_ROOT`` is
    set, ``$KSEARCH_KERNEL_ROOT/<digest>`` (a relative root is taken from the current working
    directory) when that holds them.

    Raises:
        KernelSpecError: neither holds the kernel's files (one line naming folder and digest).
    """
    folder = Path(path)
    if _matches(folder, digest):
        return folder
    root = os.environ.get(KERNEL_ROOT_VAR)
    staged = (Path.cwd() / root / digest) if root else None
    if staged is not None and _matches(staged, digest):
        return staged
    where = f" nor in {staged}" if staged is not None else f" ({KERNEL_ROOT_VAR} is not set)"
    found = "has other files" if folder.is_dir() else "does not exist here"
    raise KernelSpecError(f"kernel folder {path} with digest {digest}: the folder {found}{where}")


@dataclass(frozen=True)
class KernelRef:
    """How every process of a run finds one kernel.

    Attributes:
        folder: the kernel folder's absolute path where the run found it.
        digest: :func:`folder_digest` of that folder then.
        name: the name the run knows the kernel by (records, run files, agents' lineages):
            the spec's name, or ``name@digest-prefix`` where two kernels of one run share a
            name. Not part of finding the folder.
    """

    folder: str
    digest: str
    name: str = ""

    @classmethod
    def of(cls, folder: str | Path, name: str = "") -> KernelRef:
        """A reference to the folder as it is now (absolute path, current digest).

        Raises:
            KernelSpecError: ``folder`` is not a folder.
        """
        path = Path(folder).resolve()
        return cls(str(path), folder_digest(path), name or path.name)

    def resolve(self) -> Path:
        """The folder on this machine (see :func:`resolve_folder`)."""
        return resolve_folder(self.folder, self.digest)

    def renamed(self, name: str) -> KernelRef:
        return KernelRef(self.folder, self.digest, name)

    def to_dict(self) -> dict[str, str]:
        return {"folder": self.folder, "digest": self.digest, "name": self.name}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KernelRef:
        return cls(str(d["folder"]), str(d["digest"]), str(d.get("name", "")))

    def __str__(self) -> str:
        return f"{self.name or Path(self.folder).name} ({self.folder}, {self.digest})"
