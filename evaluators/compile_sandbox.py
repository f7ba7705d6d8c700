"""NVRTC in a bounded child process: no secrets, an empty working directory, limits on wall
clock, memory and binary size.

One persistent child per process serves compiles over a pipe (starting a Python process
with NVRTC costs ~0.3 s, a library kernel's compile ~0.1 s). The child is started with an
environment built from an allow-list (nothing of the parent's secrets, so no route through
``/proc/self/environ`` or a diagnostic can quote them), in an empty temporary directory,
under an address-space limit set in the child before NVRTC loads. The parent enforces the
wall clock: a compile that runs past it kills the child, which is started again for the
next compile. The disk cache stays in the parent (:mod:`evaluators.compile`), so cache hits
never touch the child.

Run as ``python -m evaluators.compile_sandbox --memory-bytes N``, it is the child.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from evaluators.child_env import compile_environment
from kernels.nvrtc import compile_program

# Measured: compiling every library baseline and embedded recipe (fp16 and bf16, several
# tunings each) in one Python process peaked at 220 MB of address space (VmPeak, 135 MB
# resident) with NVRTC 12; 2 GiB leaves ~9x margin. An initialised 256 MiB __device__ table
# needed ~4 GB and a template-recursion bomb grows by ~400 MB/s: both stop here.
DEFAULT_MEMORY_BYTES = 2 << 30
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CUBIN_BYTES = 16 << 20  # the library's cubins are 4-60 KB
DEFAULT_STACK_BYTES = 64 << 10  # per thread; the library's kernels use 0-1 KB
_START_TIMEOUT_S = 120.0
_LEN = struct.Struct("<Q")
_WORKDIR_PREFIX = "nvrtc-sandbox-"  # the child's empty working directory, one per child


@dataclass(frozen=True)
class CompileLimits:
    """What one compile may use.

    Attributes:
        timeout_s: wall clock of one compile (COMPILE_ERROR beyond it).
        memory_bytes: address space of the compiling process (COMPILE_ERROR beyond it).
        cubin_bytes: size of the binary (RESOURCE_ERROR beyond it).
        stack_bytes: per-thread stack of the entry (RESOURCE_ERROR beyond it).
    """

    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    cubin_bytes: int = DEFAULT_CUBIN_BYTES
    stack_bytes: int = DEFAULT_STACK_BYTES

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or min(self.memory_bytes, self.cubin_bytes, self.stack_bytes) <= 0:
            raise ValueError(f"compile limits must be positive: {self}")


@dataclass(frozen=True)
class SandboxOutcome:
    """What the child made of one compile.

    Attributes:
        ok: NVRTC produced a binary within the size limit.
        cubin: the binary (empty when not ok).
        log: NVRTC's log, or the one-line reason a limit stopped the compile.
        seconds: wall clock of the compile as the parent saw it.
        limit: the limit that stopped it ("timeout", "memory", "cubin_bytes"), else "".
        cacheable: the outcome depends only on the source, options and limits (not on a
            process killed from outside).
    """

    ok: bool
    cubin: bytes
    log: str
    seconds: float
    limit: str = ""
    cacheable: bool = True


def child_environment(workdir: str) -> dict[str, str]:
    """The child's whole environment: the allow-listed variables of
    :data:`evaluators.child_env.COMPILE_NAMES`, the project on PYTHONPATH, and the empty
    working directory as HOME and TMPDIR."""
    return compile_environment(workdir)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


class _Child:
    """One started child: its process, working directory and stderr file."""

    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        _remove_orphans()
        # The parent's pid in the name: a directory whose parent is gone can be told apart.
        self.workdir = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-")
        self.stderr: IO[bytes] = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evaluators.compile_sandbox", "--memory-bytes", str(memory_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            cwd=self.workdir, env=child_environment(self.workdir), close_fds=True,
        )
        ready = self.read(time.monotonic() + _START_TIMEOUT_S)
        if ready is None or json.loads(ready) != {"ready": True}:
            tail = self.stderr_tail()
            self.close()
            raise RuntimeError(f"the NVRTC sandbox process did not start: {tail or 'no output'}")

    def send(self, payload: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(_LEN.pack(len(payload)) + payload)
        self.proc.stdin.flush()

    def read(self, deadline: float) -> bytes | None:
        """One frame, or None when the child died or the deadline passed first."""
        head = self._read_exactly(_LEN.size, deadline)
        return None if head is None else self._read_exactly(_LEN.unpack(head)[0], deadline)

    def _read_exactly(self, n: int, deadline: float) -> bytes | None:
        assert self.proc.stdout is not None
        fd, chunks, got = self.proc.stdout.fileno(), [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def stderr_tail(self, chars: int = 300) -> str:
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - chars))
        return " ".join(self.stderr.read().decode(errors="replace").split())

    def close(self) -> int | None:
        """Kills the child (our own process, by its id) and removes its directory."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.stderr.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
        return code


class CompileSandbox:
    """A client of one persistent NVRTC child; compiles one at a time (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._owner_pid = os.getpid()

    def compile(self, source: str, options: list[str], limits: CompileLimits) -> SandboxOutcome:
        """Compiles ``source`` (the full translation unit) with ``options`` under ``limits``.

        Raises:
            RuntimeError: the child cannot be started (a broken NVRTC installation).
        """
        with self._lock:
            child = self._ready_child(limits.memory_bytes)
            request = {"source": source, "options": options, "max_cubin_bytes": limits.cubin_bytes,
                       "cpu_s": 2 * limits.timeout_s + 10}
            start = time.monotonic()
            child.send(json.dumps(request).encode())
            header = child.read(start + limits.timeout_s)
            reply = json.loads(header) if header is not None else None
            cubin = b""
            if reply is not None and reply["cubin_bytes"]:
                cubin = child.read(start + limits.timeout_s) or b""
            seconds = time.monotonic() - start
            if reply is None or len(cubin) != reply["cubin_bytes"]:
                return self._lost(child, seconds, limits)
            log = reply["log"]
            if reply["limit"] == "memory":  # NVRTC's own out-of-memory error: say which limit
                log = f"compile limit: NVRTC ran out of memory (address space limit {_gib(limits.memory_bytes)})\n{log}"
            return SandboxOutcome(reply["ok"], cubin, log, seconds, reply["limit"])

    def _ready_child(self, memory_bytes: int) -> _Child:
        if self._owner_pid != os.getpid():  # a forked copy must not share the parent's pipe
            self._child, self._owner_pid = None, os.getpid()
        child = self._child
        if child is not None and (child.proc.poll() is not None or child.memory_bytes != memory_bytes):
            child.close()
            child = None
        if child is None:
            child = self._child = _Child(memory_bytes)
        return child

    def _lost(self, child: _Child, seconds: float, limits: CompileLimits) -> SandboxOutcome:
        """The child did not answer: it ran past the wall clock (we kill it) or died."""
        running = child.proc.poll() is None
        tail = child.stderr_tail()
        code = child.close()
        self._child = None
        if running:
            return SandboxOutcome(False, b"", f"compile limit: NVRTC ran past the {limits.timeout_s:g} s time "
                                  "limit and was stopped", seconds, "timeout")
        if code == -signal.SIGKILL:
            # Not our kill: the machine's OOM killer or an operator. Transient, so not cached.
            return SandboxOutcome(False, b"", "compile stopped: the compiler process was killed from outside "
                                  "(SIGKILL); try again", seconds, "killed", cacheable=False)
        return SandboxOutcome(False, b"", f"compile limit: NVRTC ran out of memory (address space limit "
                              f"{_gib(limits.memory_bytes)}) or crashed (exit {code}; {tail[-160:]})",
                              seconds, "memory")

    def close(self) -> None:
        """Stops the child, if one runs."""
        with self._lock:
            if self._child is not None and self._owner_pid == os.getpid():
                self._child.close()
            self._child = None


_SANDBOX = CompileSandbox()
atexit.register(_SANDBOX.close)


def sandbox_compile(source: str, options: list[str], limits: CompileLimits) -> SandboxOutcome:
    """Compiles in this process's shared sandbox child (see :class:`CompileSandbox`)."""
    return _SANDBOX.compile(source, options, limits)


# --- the child -----------------------------------------------------------------------------------


def _limit_self(memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))


def _compile_in_child(request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    # A CPU-time backstop for a child whose parent died mid-compile (the parent's wall clock
    # normally fires first); the soft limit is raised again before every compile.
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_soft = int(usage.ru_utime + usage.ru_stime + request["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_soft, resource.RLIM_INFINITY))
    # A binary over the size limit is refused inside NVRTC's process, so it never crosses the
    # pipe, the cache or Ray.
    out = compile_program(request["source"], request["options"], request["max_cubin_bytes"])
    return {"ok": out.ok, "log": out.log, "limit": out.limit}, out.cubin


def _remove_orphans() -> None:
    """Removes the working directories of children whose parent process is gone (both killed
    at once, as a process group is, leave theirs behind: neither can remove it)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*-*"):
        pid = path.name[len(_WORKDIR_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # alive, another user's
            continue


def _remove_own_directory() -> None:
    """The child's working directory, removed by the child when its parent goes: a parent that
    ends without closing its sandbox (a killed Ray worker, ``os._exit``) would otherwise leave
    one empty directory in the temporary folder per process. Only a directory this module made."""
    here = os.getcwd()
    if os.path.basename(here).startswith(_WORKDIR_PREFIX):
        os.chdir("/")
        shutil.rmtree(here, ignore_errors=True)


def _serve(memory_bytes: int) -> None:
    _limit_self(memory_bytes)
    from cuda.bindings import nvrtc  # noqa: F401  (loaded under the limit, before the first request)

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def write(payload: bytes) -> None:
        stdout.write(_LEN.pack(len(payload)) + payload)

    # However the child ends but by SIGKILL (the parent's pipe closed, a write into a pipe whose
    # reader died, SIGTERM), it removes its working directory on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        write(json.dumps({"ready": True}).encode())
        stdout.flush()
        while True:
            head = stdin.read(_LEN.size)
            if len(head) < _LEN.size:  # the parent closed the pipe or died
                return
            request = json.loads(stdin.read(_LEN.unpack(head)[0]))
            reply, cubin = _compile_in_child(request)
            reply["cubin_bytes"] = len(cubin)
            write(json.dumps(reply).encode())
            if cubin:
                write(cubin)
            stdout.flush()
    finally:
        _remove_own_directory()


if __name__ == "__main__":
    _serve(int(sys.argv[sys.argv.index("--memory-bytes") + 1]))
