"""One ninja at a time in each build folder of this machine.

FlashInfer builds every op with ``ninja -C <its JIT folder>``, one folder for all ops, under a
lock per op: two processes building two different ops run two ninjas in one folder at once.
Ninja's dependency log (``.ninja_deps`` in that folder) is written by each of them with record
ids of its own, so the entries clash and some are lost; ninja then finds the lost modules'
dependencies missing and builds them again, in every later process, and the rebuilds again
clash with each other. At 8fb6475 on an H100 every end-of-run round rebuilt FlashInfer's norm
and cascade modules (``jit_builds``: "deps for 'norm/norm.cuda.o' are missing", still so right
after the rebuild), one at a time behind FlashInfer's per-op lock: 52 s of one round's set-up,
each round's timed pass waiting on the slowest set-up.

The processes that may call a library that builds with ninja (sandbox workers, compile-ahead
and warm-up processes) find a shim first on their PATH (:func:`environment`): it takes a file
lock in the build folder (``-C``, else the working directory; so every process finds the same
lock whatever its TMPDIR), holds it through an exec of the real ninja, and so lets the builds of one folder run one after the other. Builds of
other folders still run at once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

REAL = "KERNEL_SEARCH_REAL_NINJA"  # the real ninja the shim runs, in the children's environment

_SHIM = """#!{python} -I
# ninja, one at a time per build folder (evaluators/ninja_turns.py).
import fcntl, hashlib, os, sys
args = sys.argv[1:]
folder = os.path.realpath(args[args.index("-C") + 1] if "-C" in args[:-1] else os.getcwd())
try:  # in the folder itself, so that every process finds it whatever its TMPDIR
    fd = os.open(os.path.join(folder, ".kernel-search-ninja.lock"), os.O_RDWR | os.O_CREAT, 0o666)
except OSError:  # a folder this process cannot write to (ninja will fail there anyway)
    name = hashlib.sha1(folder.encode()).hexdigest()[:16] + ".lock"
    fd = os.open(os.path.join({locks!r}, name), os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
os.set_inheritable(fd, True)  # held by the real ninja until it exits
real = os.environ[{real!r}]
os.execv(real, [real, *args])
"""


def shim_folder(python: str) -> Path:
    """The folder of the shim (made if missing): one per Python and shim text, on this node."""
    root = Path(tempfile.gettempdir()) / "kernel-search-ninja"
    locks = root / "locks"
    text = _SHIM.format(python=python, locks=str(locks), real=REAL)
    folder = root / hashlib.sha1(text.encode()).hexdigest()[:12]
    shim = folder / "ninja"
    if not shim.is_file():
        locks.mkdir(parents=True, exist_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / f".ninja.{os.getpid()}"
        part.write_text(text)
        part.chmod(0o755)
        os.replace(part, shim)  # whole or absent for a process starting beside this one
    return folder


def environment(env: Mapping[str, str], python: str | None = None) -> dict[str, str]:
    """``env`` with the shim first on its PATH and the real ninja named in it; unchanged where
    that PATH holds no ninja (nothing to take turns for) or the shim is there already."""
    import sys

    out = dict(env)
    folder = shim_folder(python or sys.executable)
    parts = [p for p in out.get("PATH", "").split(os.pathsep) if p]
    if str(folder) in parts and out.get(REAL):
        return out
    real = out.get(REAL) or shutil.which("ninja", path=os.pathsep.join(p for p in parts if p != str(folder)))
    if not real:
        return out
    out[REAL] = real
    out["PATH"] = os.pathsep.join([str(folder), *(p for p in parts if p != str(folder))])
    return out
