"""Compiling the production peers ahead of their timing, beside the search (GPU machine).

torch.compile of a reference costs seconds per shape (dynamo, Inductor, Triton) and
FlashInfer builds each op the first time it is called (about 20 s). Done at the end of a run
inside the evaluator, that is time the GPU sits idle. :class:`PeerWarmup` does it in a few
background processes from the start of the run, exactly as :func:`evaluators.peers.run_peers`
will later (same compiled function, same inputs, a fresh dynamo per shape), so the evaluator
then finds what it can reuse in the on-disk caches: Triton's kernel binaries and FlashInfer's
JIT folder (the loop's own torch.compile compilations are fresh: they lower and autotune
again, see :mod:`evaluators.peers`). Nothing is timed here.

The processes launch one call per peer and shape on the GPU, beside the search's timing.
When the search is over, whatever still runs is stopped (:meth:`PeerWarmup.stop`) before the
winners' final timing starts.

    python -m evaluators.peer_warmup --dtype float16 silu_and_mul fused_add_rmsnorm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from evaluators.ninja_turns import environment as ninja_environment
from evaluators.proc_group import kill_group, start_group
from kernels.folders import KernelRef

WORKER_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}  # as in the sandbox worker (evaluators.worker.serve)


def warm_libraries(kernel: str, dtype: str, shape_set: str = "search") -> dict[str, Any]:
    """Calls each peer that is not a torch.compile program once per shape, so that a library
    building its kernels on first use builds them now (see
    :func:`evaluators.peer_compile.first_calls`); returns what happened."""
    from evaluators.peer_compile import first_calls
    from kernels.spec import load_kernel

    spec = load_kernel(kernel)
    if dtype not in spec.dtypes:
        return {"kernel": spec.name, "skipped": f"no {dtype}", "seconds": 0.0}
    start = time.perf_counter()
    outcome = first_calls(spec, dtype, shape_set, "cuda", None)
    return {"kernel": spec.name, "libraries": outcome, "seconds": time.perf_counter() - start}


def warm_kernel(kernel: str, dtype: str, shape_set: str = "search") -> dict[str, Any]:
    """Calls every peer once per shape, compiling what needs compiling; returns what happened."""
    import torch

    from evaluators.peers import peer_fns
    from kernels.peer import call_once
    from kernels.spec import load_kernel, shape_label

    spec = load_kernel(kernel)
    start = time.perf_counter()
    if dtype not in spec.dtypes:
        return {"kernel": spec.name, "skipped": f"no {dtype}", "seconds": 0.0}
    device = torch.device("cuda", 0)
    errors: dict[str, str] = {}
    for shape in spec.shapes(shape_set):
        gen = torch.Generator(device=device).manual_seed(7)
        inputs = spec.make_inputs(shape, getattr(torch, dtype), gen, "random", device)
        # One compilation per torch.compile mode: the loop's compilations are fresh (no graph or
        # autotuning cache), but they still find Triton's binaries and FlashInfer's JIT here.
        for name, peer in peer_fns(spec, trials=1).items():
            if name in errors:
                continue
            try:
                call_once(peer, {k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
            except Exception as exc:  # the evaluator will meet and report the same failure
                errors[name] = f"{shape_label(shape)}: {type(exc).__name__}: {exc}"[:300]
        torch.cuda.synchronize()
    return {"kernel": spec.name, "seconds": time.perf_counter() - start, "errors": errors}


class PeerWarmup:
    """Background processes that warm the peers' compile caches for a run's kernels.

    Args:
        kernels: the run's kernel references (or library names, or folders); each process
            gets the folder as found on this machine.
        dtype: the run's dtype.
        log_dir: where each process writes ``peer_warmup-<i>.log``.
        processes: how many processes share the kernels (round-robin).
    """

    def __init__(self, kernels: Sequence[KernelRef | str], dtype: str, log_dir: Path, processes: int = 2) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.started = time.time()
        self._lock = threading.Lock()
        n = max(1, min(processes, len(kernels)))
        env = ninja_environment({**os.environ, **WORKER_ENV})  # ninja takes turns (evaluators.ninja_turns)
        log_dir.mkdir(parents=True, exist_ok=True)
        folders = [str(k.resolve()) if isinstance(k, KernelRef) else k for k in kernels]
        for i in range(n):
            mine = folders[i::n]
            log = (log_dir / f"peer_warmup-{i}.log").open("wb")
            cmd = [sys.executable, "-m", "evaluators.peer_warmup", "--dtype", dtype, *mine]
            # A group of its own: stopping it also ends the builds it started (ninja, nvcc).
            self.procs.append(start_group(cmd, env=env, cwd=Path(__file__).resolve().parent.parent,
                                          stdout=log, stderr=subprocess.STDOUT))
            self.logs.append(log)

    def wait(self, timeout_s: float = 600.0) -> float:
        """Blocks until every process has ended (killing those past the timeout, counted from
        the start); returns the seconds this call waited. Safe to call from several threads."""
        with self._lock:
            start = time.time()
            for proc in self.procs:
                left = max(0.0, self.started + timeout_s - time.time())
                try:
                    proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    kill_group(proc)
                    proc.wait()
            for log in self.logs:
                log.close()
            return time.time() - start

    def running(self) -> bool:
        """Some process has not ended yet."""
        return any(proc.poll() is None for proc in self.procs)

    def stop(self) -> None:
        """Kills whatever still runs (a run that ends early or fails)."""
        for proc in self.procs:
            kill_group(proc)  # also what it started: a build left running went on beside the loops
        self.wait(timeout_s=0.0)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Compile the peers of kernels once, to warm the on-disk caches.")
    p.add_argument("kernels", nargs="+", help="library kernel names or kernel folders")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--shapes", default="search", choices=("search", "heldout"))
    args = p.parse_args(argv)
    # Every kernel's library builds first (FlashInfer's JIT, about 20 s an op), the torch.compile
    # programs after: a search too short for all of it is then stopped with the builds done. In
    # the sweeps whose warm-up was stopped early the loops set FlashInfer up in 15-27 s each,
    # every loop, where a build made beforehand took them under 1 s.
    for kernel in args.kernels:
        print(json.dumps(warm_libraries(kernel, args.dtype, args.shapes)), flush=True)
    for kernel in args.kernels:
        print(json.dumps(warm_kernel(kernel, args.dtype, args.shapes)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
