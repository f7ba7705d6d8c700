"""Turns on one GPU among the processes of a node: shared to set up, alone to time.

Several processes launch work on one GPU at the end of a run: sanitizer runs, the compile-ahead
processes (:mod:`evaluators.peer_compile`) and the rounds of end-of-run loops, each a sandbox
process of its own that sets up its peers (loads their compilations, calls each library once,
checks each against the reference) and then times. Set-up may overlap other set-ups; timing
may overlap nothing that launches on the GPU, or its times would include the contention. One
file lock per GPU (:func:`lock_path`) keeps that order: work that launches without timing
holds it shared, timing (a loop's timed passes, the compile-ahead processes' autotuning
benchmarks) holds it alone. The autotuning benchmarks inside a round's set-up take a second
lock alone (:func:`benchmark_lock_path`), which sanitizer runs share: one benchmark at a time,
never beside an instrumented kernel, and no set-up waiting for all the others.

A process holds the lock through one open file, converted between the two modes: a process
that holds it shared and needs it alone (a benchmark inside a compilation, a loop's timed pass
after its set-up) gives up its share and waits for the others' (``flock`` converts a lock by
dropping it and taking the new mode; it never waits for itself). A process started with
:func:`take_part` holds its share from then on, so everything it does before and after its
timed passes (its start-up and CUDA context, its set-up) counts as sharing the GPU.

A process that must not wait behind a stream of others (the pool's evaluator, which holds the
benchmark lock alone through every job while the compilations beside the search benchmark under
it) asks for the lock ``first``: it closes a gate beside the lock (:func:`gate_path`) while it
waits, and every other process passes that gate before it asks for the lock. Those already
blocked on the lock when it asked would still go before it (flock wakes its blocked waiters at
once; the evaluator asks without blocking, every 5 ms, so that it can beat its heartbeat), so a
process that gets the lock past an open gate and then finds the gate closed gives the lock back
and waits at the gate. On one H100 at 9a09729, without the gate, the search's evaluations took
0.46-0.52 s (median, the wait for the lock included) instead of 0.20-0.22 s while six compile
processes benchmarked; at ca9b1e1, with the gate but without giving back, the evaluator still
waited a median 0.08-0.18 s a job (27 s over the search's 239 jobs) and held the lock 0.25-0.28 s
a job. The compile processes run at a lower CPU priority (``peer_compile --nice``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["GpuTurns", "lock_path", "benchmark_lock_path", "gate_path", "take_part", "turns", "alone",
           "benchmarks_alone", "TIMELINE_ENV"]

# Where every process appends its lock's changes of mode, when set: a folder, one file per process
# (``turns-<pid>.jsonl``: the lock's name, the mode taken, when it was asked for and when got), so
# that a run's end can be laid out on one time axis: who held the GPU shared while others waited to
# time alone. A diagnosis only: no verdict reads it, and a candidate's process could write there.
TIMELINE_ENV = "KERNEL_SEARCH_TURNS_LOG"
_MODES = {fcntl.LOCK_SH: "shared", fcntl.LOCK_EX: "alone", fcntl.LOCK_UN: "none"}


_recorded: set[Path] = set()  # the locks this process has put on the timeline


def _record_exit() -> None:
    """At the process's end its locks go (a process killed says nothing: its holds last, on
    the timeline, until the last record of any process)."""
    for path in sorted(_recorded):
        _record(path, fcntl.LOCK_UN, time.time())


def _record(path: Path, mode: int, asked: float) -> None:
    folder = os.environ.get(TIMELINE_ENV)
    if not folder:
        return
    row: dict[str, object] = {"lock": path.name, "mode": _MODES.get(mode & ~fcntl.LOCK_NB, str(mode)),
                              "asked": round(asked, 4), "got": round(time.time(), 4), "pid": os.getpid()}
    file = Path(folder) / f"turns-{os.getpid()}.jsonl"
    if not file.exists():  # the first line says which process this is
        row["argv"] = " ".join(sys.argv)[:200]
    if not _recorded:  # the last ones, when it ended
        atexit.register(_record_exit)
    _recorded.add(path)
    line = json.dumps(row)
    try:
        with open(file, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass  # a diagnosis never costs a run


def lock_path(gpu: str | None = None) -> Path:
    """The lock of one GPU on this node (``gpu``: its CUDA_VISIBLE_DEVICES entry; by default
    this process's)."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0") if gpu is None else gpu
    return Path(tempfile.gettempdir()) / f"kernel-search-benchmark-gpu{gpu}.lock"


def benchmark_lock_path(path: str | Path) -> Path:
    """The lock that the autotuning benchmarks of processes setting up beside each other take
    alone (and sanitizer runs shared), apart from the GPU's lock at ``path``: were a
    benchmark to take the GPU's lock alone, it would wait for every other set-up (each holds
    that lock shared throughout) and the set-ups would run one at a time."""
    path = Path(path)
    return path.with_name(path.stem + ".benchmarks" + path.suffix)


def gate_path(path: str | Path) -> Path:
    """The gate beside the lock at ``path`` that a process asking for it first closes while it
    waits (see the module's docstring)."""
    path = Path(path)
    return path.with_name(path.stem + ".gate" + path.suffix)


class GpuTurns:
    """One process's hold on one GPU's lock: :meth:`shared` and :meth:`alone` nest, in any
    order and in several threads (a thread waits while another has the GPU alone)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._gate_fd: int | None = None
        self._shared = 0  # holds of the shared mode (a life-long one counts as one)
        self._alone = 0
        self._guard = threading.RLock()

    def _set(self, mode: int, asked: float | None = None) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        asked = time.time() if asked is None else asked
        fcntl.flock(self._fd, mode)
        _record(self.path, mode, asked)

    def _gate(self) -> int:
        if self._gate_fd is None:
            self._gate_fd = os.open(gate_path(self.path), os.O_RDWR | os.O_CREAT, 0o600)
        return self._gate_fd

    def _pass_gate(self) -> None:
        """Waits while a process that asked for the lock first is waiting for it."""
        fcntl.flock(self._gate(), fcntl.LOCK_SH)
        fcntl.flock(self._gate(), fcntl.LOCK_UN)

    def _add_share(self) -> None:
        """One more hold of the shared mode; the first takes the file shared, past the gate."""
        if not self._shared and not self._alone:
            self._pass_gate()
            self._set(fcntl.LOCK_SH)
        self._shared += 1

    def _settle(self) -> None:
        """The file's mode for the holds left: alone, shared or none."""
        if self._alone:
            return
        self._set(fcntl.LOCK_SH if self._shared else fcntl.LOCK_UN)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._guard:
            self._add_share()
        try:
            yield
        finally:
            with self._guard:
                self._shared -= 1
                self._settle()

    @contextlib.contextmanager
    def alone(self, waiting: Callable[[], None] | None = None, every_s: float = 10.0,
              first: bool = False) -> Iterator[None]:
        """The GPU to this process alone while inside: waits until no other process holds it
        in either mode. The guard is held throughout, so another thread of this process waits.
        ``waiting``: called every ``every_s`` seconds while it waits (a worker's heartbeat,
        so that a long wait for the GPU is not taken for a hang); the lock is then asked for
        without blocking, and a conversion that fails holds nothing meanwhile (flock drops the
        share first), which lets the others time while this process waits. ``first``: the
        gate is closed while it waits (see the module's docstring). A process that holds a
        share already converts it without passing the gate: were the gate closed by one
        waiting for that share to go, it would wait for ever."""
        with self._guard:
            if not self._alone:
                if first:
                    self._take_first(waiting, every_s)
                elif self._shared:
                    self._take_alone(waiting, every_s)  # a conversion: never past the gate
                else:
                    self._take_after_first(waiting, every_s)
            self._alone += 1
            try:
                yield
            finally:
                self._alone -= 1
                self._settle()

    def _take_after_first(self, waiting: Callable[[], None] | None, every_s: float) -> None:
        """The lock alone, past the gate, and given back at once if the gate closed meanwhile: a
        process that was already waiting for the lock when one asked first (flock wakes its
        blocked waiters before a polling one looks again) lets that one go first. On one H100
        at ca9b1e1 the search's evaluator waited 0.08-0.18 s (median) per job for benchmarks
        that had asked before it: 27 s over the search's 239 jobs."""
        while True:
            self._pass_gate()
            self._take_alone(waiting, every_s)
            if self._gate_open():
                return
            self._set(fcntl.LOCK_UN)

    def _gate_open(self) -> bool:
        try:
            fcntl.flock(self._gate(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(self._gate(), fcntl.LOCK_UN)
        return True

    def _take_first(self, waiting: Callable[[], None] | None, every_s: float) -> None:
        fcntl.flock(self._gate(), fcntl.LOCK_EX)  # one such process per lock: no wait in practice
        try:
            self._take_alone(waiting, every_s)
        finally:
            fcntl.flock(self._gate(), fcntl.LOCK_UN)

    def _take_alone(self, waiting: Callable[[], None] | None, every_s: float) -> None:
        if waiting is None:
            self._set(fcntl.LOCK_EX)
            return
        said, asked = time.monotonic(), time.time()
        while True:
            try:
                self._set(fcntl.LOCK_EX | fcntl.LOCK_NB, asked)
                return
            except BlockingIOError:
                if time.monotonic() - said >= every_s:
                    waiting()
                    said = time.monotonic()
                time.sleep(0.005)

    def hold_shared(self) -> None:
        """Takes a share held until the process ends."""
        with self._guard:
            self._add_share()

    @property
    def mode(self) -> str:
        """``alone``, ``shared`` or ``none``: what this process holds now."""
        return "alone" if self._alone else "shared" if self._shared else "none"


_turns: dict[Path, GpuTurns] = {}
_mine: GpuTurns | None = None  # the lock this process takes part in (take_part), if any
_registry_guard = threading.Lock()


def turns(path: str | Path | None = None) -> GpuTurns:
    """This process's hold on the lock at ``path`` (default: :func:`lock_path`): one per file,
    so that every user in the process nests with the others."""
    key = Path(path if path is not None else lock_path()).resolve()
    with _registry_guard:
        if key not in _turns:
            _turns[key] = GpuTurns(key)
        return _turns[key]


def take_part(path: str | Path) -> GpuTurns:
    """Makes this process share the GPU of ``path`` from now until it ends, and makes
    :func:`alone` take that lock."""
    global _mine
    _mine = turns(path)
    _mine.hold_shared()
    return _mine


def alone(waiting: Callable[[], None] | None = None) -> contextlib.AbstractContextManager[None]:
    """The GPU alone, where this process takes part in a lock (:func:`take_part`); else
    nothing to wait for (a process the pool already gives the GPU to alone). ``waiting``: see
    :meth:`GpuTurns.alone`."""
    return _mine.alone(waiting) if _mine is not None else contextlib.nullcontext()


def benchmarks_alone(waiting: Callable[[], None] | None = None) -> contextlib.AbstractContextManager[None]:
    """The benchmark lock of this process's GPU (:func:`benchmark_lock_path` of the lock it takes
    part in) alone, after every process asking for it first: what a timed pass takes besides
    :func:`alone` while the pool's evaluator may still run jobs (a peers' round set up beside
    the search, timing once it is over, beside the end's held-out checks). Nothing where this
    process takes part in no lock. Take it inside :func:`alone`: every process that holds the
    GPU's lock and waits for this one does so in that order, so none waits for the other."""
    if _mine is None:
        return contextlib.nullcontext()
    return turns(benchmark_lock_path(_mine.path)).alone(waiting)
