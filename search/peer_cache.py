"""Peer timings kept on disk and reused across runs and sweeps.

A peer's time (torch.compile in its modes, torch eager, FlashInfer, Liger) on one kernel,
shape set and dtype depends on the peer's program, the GPU model, the driver, the library
versions and the timing protocol, none of which changes between two runs of the search. The
end-of-run loops used to compile and time every peer afresh in each of their repetitions,
which cost about 30 s per loop on the H200 (nearly all of it set-up: dynamo, Inductor and
autotuning per shape), against 2 s of timed repetitions.

So each loop's peer figures are stored under a key made of everything that changes them:
the kernel folder's digest (its spec.py holds the peer programs, its inputs and reference),
the dtype, the shape set and its shapes, the loop's number (loop i of a later run reuses loop
i of the run that measured it, so the spread over loops stays a spread over independent
processes), the torch.compile trials, the evaluator's environment (GPU model, driver, CUDA
runtime, torch, Triton, FlashInfer, Liger, CuPy versions) and a digest of the source files of
the timing protocol. Any change to one of them is a miss, and the loop then times the peers
beside our kernels as before and stores what it measured.

Our kernels and the baseline are never cached: every run times them afresh in its own
fresh-process loops, and a reused peer figure is reported as such, with the date it was
measured (``cached_peers`` in the loop's reply).

A reused figure is anchored on the baseline: the entry keeps the baseline's times from the loop
that measured the peers, and a later loop scales each peer's time on a shape by the baseline's
time there now over its time then. What the cache carries over is thus the peer's time relative
to the baseline's in one loop, and every ratio against our kernels is the product of two
ratios each measured within one fresh process. Without the anchor the warm runs leaned our way:
on one H100 (``experiments/results/end-of-run-h100-9a09729.md``) the baseline timed in loops of
our kernels alone ran 1.0-4.9% faster than beside the peers, which moved every cached peer's
ratio against it by as much.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernels.records import atomic_write
from kernels.spec import shape_label

# Bump when what a cached entry means changes without any of the files below changing.
FORMAT = 2
# The implementation of ours whose times, measured beside the peers, anchor their reuse.
ANCHOR = "baseline"
# The code that sets up and times the peers: a change here may change their figures.
PROTOCOL_FILES = ("evaluators/peers.py", "evaluators/timing.py", "evaluators/verify.py", "evaluators/context.py",
                  "kernels/peer.py")
# The reply's keys that belong to the peers (everything else belongs to our kernels or the loop).
PEER_KEYS = ("errors", "compiled", "compile_candidates", "notes")
_ROOT = Path(__file__).resolve().parent.parent


def default_folder() -> Path:
    """Where peer timings are kept unless the config names a folder: the user's cache
    (``$XDG_CACHE_HOME``, else ``~/.cache``), shared by every run and sweep of this user."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernel-search" / "peer-times"


def protocol_digest(root: Path = _ROOT) -> str:
    """A digest of the timing protocol's source files (a missing file counts as empty)."""
    h = hashlib.sha256(f"format {FORMAT}".encode())
    for rel in PROTOCOL_FILES:
        path = root / rel
        h.update(rel.encode())
        h.update(path.read_bytes() if path.is_file() else b"")
    return h.hexdigest()[:16]


class PeerCache:
    """Peer figures of the end-of-run loops, one JSON file per loop key, written atomically.

    Args:
        folder: where the files live (created on the first write).
        environment: the evaluator's environment (:meth:`search.pool.EvaluatorActor.environment`):
            the peers' figures on another GPU model, driver or library version are not these.
    """

    def __init__(self, folder: str | Path, environment: Mapping[str, Any]) -> None:
        self.folder = Path(folder).expanduser()
        self.environment = dict(environment)
        self.protocol = protocol_digest()

    def key(self, kernel_digest: str, dtype: str, shape_set: str, shapes: Sequence[Mapping[str, int]], loop: int,
            compile_trials: int) -> str:
        """The key of loop ``loop`` (0-based) of a kernel's peers on one shape set."""
        fields = {"kernel": kernel_digest, "dtype": dtype, "shape_set": shape_set,
                  "shapes": [shape_label(dict(s)) for s in shapes], "loop": loop, "compile_trials": compile_trials,
                  "environment": self.environment, "protocol": self.protocol}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored entry, or None (absent, or unreadable: a miss, never an error)."""
        try:
            entry = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        ok = isinstance(entry, dict) and entry.get("key") == key and "peers" in entry and "anchor" in entry
        return entry if ok else None

    def put(self, key: str, reply: Mapping[str, Any], ours: Sequence[str], run_id: str) -> bool:
        """Stores the peers' part of a loop's reply (:func:`peer_entry`); returns whether it was
        stored."""
        entry = peer_entry(reply, ours, run_id, key, self.environment)
        if entry is None:
            return False
        self.write(entry)
        return True

    def write(self, entry: Mapping[str, Any]) -> None:
        """Stores an entry made by :func:`peer_entry` under its own key."""
        atomic_write(self._path(str(entry["key"])), json.dumps(entry, indent=1, default=str))


def peer_entry(reply: Mapping[str, Any], ours: Sequence[str], run_id: str, key: str = "",
               environment: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The peers' part of a loop's reply as an entry that :func:`with_cached` takes, or None: a
    loop in which one of our kernels failed, or that timed our kernels in separate loops, or
    that timed no peer, gives none (its peer figures are not a plain measurement); nor one
    without the baseline's times (:data:`ANCHOR`), which anchor their reuse."""
    if reply.get("failed") or reply.get("separate_loops"):
        return None
    part = peer_part(reply, ours)
    if not part["peers"]:
        return None
    anchor = reply.get("peers", {}).get(ANCHOR)
    if not anchor:
        return None  # nothing to scale the peers' figures by when they are reused
    return {"key": key, "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "run_id": run_id, "environment": dict(environment or {}), **part,
            "anchor": {"impl": ANCHOR, "times": dict(anchor)}}


def _is_ours(impl: str, ours: Sequence[str]) -> bool:
    return any(impl == name or impl.startswith(f"{name}@") for name in ours)


def peer_part(reply: Mapping[str, Any], ours: Sequence[str]) -> dict[str, Any]:
    """The figures of a loop's reply that belong to the peers (``ours``: our implementations'
    names in the loop, whose times stay out)."""
    return {"peers": {n: dict(t) for n, t in reply.get("peers", {}).items() if not _is_ours(n, ours)},
            "iqr": {n: dict(t) for n, t in reply.get("iqr", {}).items() if not _is_ours(n, ours)},
            **{k: reply.get(k, {}) for k in PEER_KEYS}}


def with_cached(reply: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """A loop's reply that timed our kernels alone, with a cached entry's peer figures added,
    each scaled on every shape by the baseline's time in this loop over its time in the loop
    that measured the peers (see the module's docstring), and ``cached_peers`` saying where
    they come from and by how much they were scaled. A shape without the baseline's time in
    either loop keeps the peers' figures as measured and is named in ``unanchored``."""
    now = reply.get("peers", {}).get(ANCHOR, {})
    then = entry["anchor"]["times"]
    scale = {label: now[label] / then[label] for label in then
             if label in now and now[label] > 0 and then[label] > 0}

    def scaled(table: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
        return {n: {label: t * scale.get(label, 1.0) for label, t in times.items()} for n, times in table.items()}

    merged = dict(reply)
    merged["peers"] = {**scaled(entry["peers"]), **reply.get("peers", {})}
    merged["iqr"] = {**scaled(entry.get("iqr", {})), **reply.get("iqr", {})}
    for k in PEER_KEYS:
        merged[k] = {**entry.get(k, {}), **reply.get(k, {})}
    labels = sorted({label for times in entry["peers"].values() for label in times})
    merged["cached_peers"] = {"measured_at": entry.get("measured_at"), "run_id": entry.get("run_id"),
                              "key": entry.get("key"), "peers": sorted(entry["peers"]),
                              "anchor": ANCHOR, "scale": scale,
                              "unanchored": [label for label in labels if label not in scale]}
    return merged


# The libraries whose kernels are timed as peers, or that make them (distribution names).
LIBRARIES = {"torch": ("torch",), "triton": ("triton",), "flashinfer": ("flashinfer-python", "flashinfer"),
             "liger_kernel": ("liger-kernel", "liger_kernel"), "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy")}


def library_versions() -> dict[str, str | None]:
    """The installed versions of :data:`LIBRARIES`, without importing them. A package found
    without its distribution's metadata (copied into a site folder) is known by a digest of
    its ``__init__.py``; one not installed is None."""
    import importlib.metadata
    import importlib.util

    out: dict[str, str | None] = {}
    for module, dists in LIBRARIES.items():
        version = None
        for dist in dists:
            try:
                version = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        if version is None:
            found = importlib.util.find_spec(module)
            if found is not None and found.origin and Path(found.origin).is_file():
                version = "files:" + hashlib.sha256(Path(found.origin).read_bytes()).hexdigest()[:12]
        out[module] = version
    return out
