"""What a peer library built on first use during an end-of-run loop.

FlashInfer JIT-compiles each op the first time a process calls it (ninja and nvcc, about 20 s)
into an on-disk folder, and later processes load what is there. The sweeps' loops nevertheless
recorded FlashInfer's set-up at 15-27 s in every fresh loop for some ops and under 1 s for
others. A loop therefore notes which modules its calls built or rebuilt, which build files
they rewrote, with the lines that changed, and whether ninja would build those modules again
right away (a dry run's reasons): a build file rewritten between two loops names the setting
that differs between them (a path, a flag); a module out of date straight after its own build
names what ninja finds newer or missing.

Nothing here imports the library: the folder is found from the variables it reads.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# FlashInfer 0.2: $FLASHINFER_WORKSPACE_BASE (default: home)/.cache/flashinfer/<arch>/cached_ops/<op>/
_BUILD_FILE = "build.ninja"
_MAX_DIFF = 1500  # characters of changed lines kept per build file
_MAX_EXPLAIN = 8  # lines of ninja's explanation kept per module


def jit_root() -> Path:
    """FlashInfer's cache folder in this process's environment."""
    return Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home()) / ".cache" / "flashinfer"


def snapshot(root: Path | None = None) -> dict[str, Any]:
    """Every built module (path -> modification time) and build file (path -> text) under ``root``."""
    root = root or jit_root()
    modules: dict[str, float] = {}
    builds: dict[str, str] = {}
    if root.is_dir():
        for path in root.rglob("*.so"):
            modules[str(path.relative_to(root))] = path.stat().st_mtime
        for path in root.rglob(_BUILD_FILE):
            try:
                builds[str(path.relative_to(root))] = path.read_text(errors="replace")
            except OSError:
                continue
    return {"root": str(root), "modules": modules, "builds": builds}


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two snapshots: modules ``built`` (new) and ``rebuilt`` (newer), and
    build files ``rewritten`` ({path: the changed lines, ``-`` before and ``+`` after}); empty
    when nothing changed."""
    built = sorted(k for k in after["modules"] if k not in before["modules"])
    rebuilt = sorted(k for k, t in after["modules"].items() if k in before["modules"] and t != before["modules"][k])
    rewritten: dict[str, str] = {}
    for path, text in after["builds"].items():
        old = before["builds"].get(path)
        if old is not None and old != text:
            lines = [d for d in difflib.unified_diff(old.splitlines(), text.splitlines(), lineterm="", n=0)
                     if d[:1] in "+-" and not d.startswith(("+++", "---"))]
            rewritten[path] = "\n".join(lines)[:_MAX_DIFF]
    out: dict[str, Any] = {}
    if built:
        out["built"] = built
    if rebuilt:
        out["rebuilt"] = rebuilt
    if rewritten:
        out["rewritten"] = rewritten
    return out


def still_dirty(root: Path, modules: list[str], ninja: str | None = None) -> dict[str, list[str]]:
    """For modules just built: would ninja build them again now? A dry run (``ninja -n -d
    explain``, which builds nothing) of each module's build file in the folder FlashInfer runs
    ninja in; per module, ninja's reasons (its first lines), empty when it is up to date. A
    module still dirty right after its build is one every later process rebuilds."""
    ninja = ninja or shutil.which("ninja")
    out: dict[str, list[str]] = {}
    if ninja is None:
        return out
    for module in modules:
        build = root / Path(module).parent / _BUILD_FILE
        if not build.is_file():
            continue
        try:
            run = subprocess.run([ninja, "-n", "-d", "explain", "-C", str(build.parent.parent), "-f", str(build)],
                                 capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            out[module] = [f"{type(exc).__name__}: {exc}"[:200]]
            continue
        lines = (run.stdout + run.stderr).splitlines()
        out[module] = [line[:300] for line in lines if line.startswith("ninja explain:")][:_MAX_EXPLAIN]
    return out


def environment() -> dict[str, Any]:
    """The settings that enter FlashInfer's build files or its folder's name, as this process sees
    them, and the folder FlashInfer chose (``workspace``) where a peer has imported it."""
    keys = ("HOME", "FLASHINFER_WORKSPACE_BASE", "TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST", "CUDA_HOME",
            "CC", "CXX", "PYTORCH_NVCC", "MAX_JOBS", "CUDA_VISIBLE_DEVICES")
    out: dict[str, Any] = {"env": {k: os.environ[k] for k in keys if k in os.environ}, "cpu_count": os.cpu_count(),
                           "cwd": os.getcwd()}
    loaded = sys.modules.get("flashinfer.jit.env")  # imported by a peer's first call, if any
    if loaded is not None:
        out["workspace"] = str(getattr(loaded, "FLASHINFER_WORKSPACE_DIR", ""))
    return out


def report(before: dict[str, Any]) -> dict[str, Any]:
    """What a loop records (its reply's ``jit_builds``): the changes since ``before``, whether the
    modules it built would be built again (``still_dirty``, only where some are), and the
    environment."""
    after = snapshot(Path(before["root"]))
    out = changes(before, after)
    made = out.get("built", []) + out.get("rebuilt", [])
    if made:
        dirty = {m: why for m, why in still_dirty(Path(before["root"]), made).items() if why}
        if dirty:
            out["still_dirty"] = dirty
    return {**out, **environment()}
