"""The end-of-run loops' torch.compile programs, compiled from the run's start beside the search.

The peers' programs of a kernel's end-of-run loops depend on its spec, shapes and dtype, not on
the winner the search will find, so they can be compiled while the search runs instead of after
it: at eb7ef88 on one H100 the compilations ahead took 65 s after a search of 84 s, on the
critical path of a run with a cold peer cache. Here each one is a background call of the pool
(:attr:`search.pool.Call.background`) on an evaluator actor, a process of its own
(:mod:`evaluators.peer_compile`) that takes turns with the search's evaluations: its autotuning
benchmarks hold the GPU's benchmark lock alone, which the evaluators' workers hold through every
job, so no benchmark times beside an evaluation and no evaluation beside a benchmark. Its other
launches (one call of each compiled program and of each other peer per shape, as the peers'
warm-up made before) run beside the search untimed.

:class:`search.finalize.EndOfRun` takes each folder made here instead of compiling it again;
the pool is renewed for the end of the run only once every one of these calls has answered.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from kernels.records import ShapeSet
from search.config import EvaluatorConfig
from search.peer_cache import PeerCache
from search.pool import EvalPool
from search.state import KernelState


def folder_name(run_id: str, st: KernelState, shape_set: str) -> str:
    """The folder (under the evaluator node's temporary directory) of one kernel's compilations
    on one shape set in one run."""
    return f"{run_id}/{st.name}-{st.ref.digest[:8]}/{shape_set}"


def needed(cfg: EvaluatorConfig, states: list[KernelState], cache: PeerCache | None) -> list[tuple[KernelState, str]]:
    """The (kernel, shape set) pairs whose end-of-run loops will time peers: those with a loop
    whose peers' figures are not in the peer cache (or all of them with ``fresh_peers``)."""
    from search.finalize import loop_sets, set_cached

    if not cfg.peers or not cfg.compile_ahead or not cfg.compile_beside_search:
        return []  # (the stand-in goes through the same calls: it answers that it compiles nothing)
    return [(st, s.value) for st in states for s in loop_sets(st) if not set_cached(cache, cfg, st, s)]


def room(pairs: int, cpus: int | None = None) -> int:
    """How many compilations may run at once beside the search: each is a process busy on one
    core, and the search keeps two and half of the rest for itself."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 2)
    return max(1, min(pairs, (cpus - 2) // 2)) if pairs else 0


class CompiledAhead:
    """The compilations started with the run, and their reports as they come in.

    Args:
        run_id: the run's id (it names the folders).
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.started: set[tuple[str, str]] = set()
        self.replies: dict[tuple[str, str], dict[str, Any]] = {}
        self.since = time.time()
        self.answered_s: dict[tuple[str, str], float] = {}  # seconds from the start to each answer

    def start(self, pool: EvalPool, pairs: list[tuple[KernelState, str]]) -> None:
        """One background call per pair (``pool`` made with background room for them)."""
        for st, shape_set in pairs:
            key = (st.name, shape_set)
            self.started.add(key)
            pool.call(lambda reply, error, key=key: self._answered(key, reply, error), "precompile", st.ref,
                      st.dtype, shape_set, folder_name(self.run_id, st, shape_set), True, background=True,
                      what=f"{st.name} compile ahead beside the search ({shape_set} shapes)")
        if pairs:
            print(f"peers: compiling the end-of-run loops' programs beside the search ({len(pairs)} kernel and "
                  f"shape sets)", file=sys.stderr, flush=True)

    def _answered(self, key: tuple[str, str], reply: dict[str, Any] | None, error: str) -> None:
        self.replies[key] = reply if reply is not None else {"status": "ERROR", "summary": error}
        self.answered_s[key] = time.time() - self.since
        made = self.replies[key]
        how = {"OK": f"compiled beside the search in {self.answered_s[key]:.0f} s",
               "SKIPPED": "nothing to compile beside the search"}.get(made.get("status", ""), "not compiled beside the search")
        print(f"peers: {key[0]} ({key[1]} shapes) {how}" + ("" if made.get("status") == "OK" else
                                                            f": {made.get('summary', '')[:200]}"),
              file=sys.stderr, flush=True)

    def pending(self) -> int:
        """Calls started and not yet answered."""
        return len(self.started - set(self.replies))

    def summary(self) -> dict[str, Any]:
        """For the run's summary: per kernel and shape set, its status and the seconds from the
        start to its answer (None: never answered)."""
        return {f"{name}/{shape_set}": {"status": self.replies.get((name, shape_set), {}).get("status"),
                                        "answered_s": self.answered_s.get((name, shape_set))}
                for name, shape_set in sorted(self.started)}

    def take(self, kernel: str, shape_set: ShapeSet | str) -> dict[str, Any] | None:
        """The report of the kernel's compilation on the shape set, once answered; None where
        none was started here (or it has not answered)."""
        return self.replies.get((kernel, ShapeSet(shape_set).value))
