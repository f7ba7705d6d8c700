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

With ``peers_beside_search``, the peers are timed beside the search as well. Once a kernel's
compilations on a shape set are in, its ``peer_runs`` rounds of the peers and the baseline (the
winner is not known yet) start as background calls, each a fresh sandbox process that loads the
compilations and checks every peer on every shape while the search runs (at a lower CPU priority,
sharing the GPU like the compilations), then waits at a gate that :meth:`CompiledAhead.open_gate`
opens when the search is over, and times holding the GPU alone and the pool evaluator's benchmark
lock, so that no timed pass runs beside an evaluation. Each round's figures become an entry like
the peer cache's (stored there too): the end-of-run loops then time our kernels and the baseline
alone and take the peers' figures anchored on the baseline, as from the cache. At 9a09729 on one
H100 a cold run's end-of-run loops took 139-141 s against 36-39 s with every peer cached, their
set-ups (loading the compilations, checking every peer) waiting for one another.

:class:`search.finalize.EndOfRun` takes each folder made here instead of compiling it again;
the pool is renewed for the end of the run only once every one of these calls has answered.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from functools import partial
from typing import Any

from kernels.records import ShapeSet
from search.config import EvaluatorConfig
from search.peer_cache import ANCHOR, PeerCache, peer_entry
from search.pool import EvalPool, gate_file
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


# How long a round set up beside the search waits for the search to end before it gives up (its
# loops then time the peers themselves at the end): the gate opens on this node even when an
# actor does not answer (EvalPool.open_gates), so only a round on another node whose actor
# did not answer ever waits this long, and the end's wait for it with it.
GATE_WAIT_S = 4 * 3600.0


def rounds_beside(cfg: EvaluatorConfig) -> bool:
    """Whether the peers' rounds run beside the search: asked for, and rounds may run beside
    each other (one at a time, they could not wait at the gate together)."""
    return cfg.peers_beside_search and cfg.overlap_rounds


class CompiledAhead:
    """The compilations started with the run, and their reports as they come in; with
    ``peers_beside_search``, the peers' rounds started after them and their figures.

    Args:
        run_id: the run's id (it names the folders).
        cfg: the evaluator's settings (None: compilations only).
        cache: the peer cache the rounds' figures are stored in, if any.
    """

    def __init__(self, run_id: str, cfg: EvaluatorConfig | None = None, cache: PeerCache | None = None) -> None:
        self.run_id = run_id
        self.cfg, self.cache = cfg, cache
        self.started: set[tuple[str, str]] = set()
        self.replies: dict[tuple[str, str], dict[str, Any]] = {}
        self.since = time.time()
        self.answered_s: dict[tuple[str, str], float] = {}  # seconds from the start to each answer
        self.pool: EvalPool | None = None
        self.states: dict[str, KernelState] = {}
        # The peers' rounds beside the search: per pair and round, the entry its figures make
        # (None where the round failed or gave none), why not, and when each answered.
        self.gate = f"{run_id}-{int(self.since * 1000)}"  # one per attempt: never found open early
        self.gate_opened_s: float | None = None
        self.rounds: dict[tuple[str, str], dict[int, dict[str, Any] | None]] = {}
        self.round_errors: dict[tuple[str, str], dict[int, str]] = {}
        self.rounds_answered_s: dict[tuple[str, str], list[float]] = {}
        # Per pair and round: where its time went (set-up, the wait for the search's end and for
        # the GPU alone, timing) and the CPU niceness it timed at, as its process reported them.
        self.round_phases: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
        self.rounds_started = 0

    def start(self, pool: EvalPool, pairs: list[tuple[KernelState, str]]) -> None:
        """One background call per pair (``pool`` made with background room for them)."""
        self.pool = pool
        for st, shape_set in pairs:
            key = (st.name, shape_set)
            self.started.add(key)
            self.states[st.name] = st
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
        if all((key[0], other) in self.replies for name, other in self.started if name == key[0]):
            self._start_rounds(key[0])

    def _start_rounds(self, kernel: str) -> None:
        """The peers' rounds of one kernel beside the search, once its compilations on every
        shape set are in (see the module's docstring): round i times loop i of each shape set
        that compiled and whose loop i the peer cache lacks (every loop with ``fresh_peers``),
        in one process, as the end-of-run rounds do."""
        cfg, pool, st = self.cfg, self.pool, self.states.get(kernel)
        if cfg is None or pool is None or st is None or not rounds_beside(cfg):
            return
        from search.finalize import loop_keys, loop_sets  # (finalize imports this module)

        plans: list[tuple[str, list[str], dict[str, Any]]] = []
        for shape_set in (s.value for s in loop_sets(st)):  # in the end-of-run rounds' order
            made = self.replies.get((kernel, shape_set), {})
            if made.get("status") != "OK" or not made.get("folder"):
                continue
            keys = (loop_keys(self.cache, cfg, st, ShapeSet(shape_set)) if self.cache is not None
                    else [""] * cfg.peer_runs)
            loop = {"shape_set": shape_set, "ours": {ANCHOR: (st.baseline.source, {})},
                    "compile_trials": cfg.compile_trials, "peers": True, "compile_cache": made["folder"],
                    "exclude_peers": made.get("peer_crashes") or {}}
            plans.append((shape_set, keys, loop))
            self.rounds[(kernel, shape_set)] = {}
        for i in range(cfg.peer_runs):
            mine = [(shape_set, keys[i], loop) for shape_set, keys, loop in plans
                    if cfg.fresh_peers or self.cache is None or self.cache.get(keys[i]) is None]
            if not mine:
                continue
            self.rounds_started += 1
            pool.call(partial(self._round_answered, kernel, i, mine), "time_round", st.ref, st.dtype,
                      [loop for _, _, loop in mine], True, self.gate, self.since + GATE_WAIT_S, background=True,
                      what=f"{kernel} peers' round {i + 1} of {cfg.peer_runs} beside the search")

    def _round_answered(self, kernel: str, i: int, mine: list[tuple[str, str, dict[str, Any]]],
                        value: dict[str, Any] | None, error: str) -> None:
        loops = value.get("loops", []) if value is not None else []
        for j, (shape_set, cache_key, _) in enumerate(mine):
            key = (kernel, shape_set)
            self.rounds_answered_s.setdefault(key, []).append(time.time() - self.since)
            reply = loops[j] if j < len(loops) and "loop_error" not in loops[j] else None
            if reply is not None:
                self.round_phases.setdefault(key, {})[i] = {
                    **{k: round(float(v), 2) for k, v in reply.get("phase_s", {}).items()},
                    "nice_timed": reply.get("nice_timed")}
            entry = (peer_entry(reply, [ANCHOR], self.run_id, cache_key,
                                self.cache.environment if self.cache is not None else None)
                     if reply is not None else None)
            self.rounds[key][i] = entry
            if entry is None:
                why = (error or (loops[j].get("loop_error") if j < len(loops) else "")
                       or "no peer figures (or a failed baseline)")
                self.round_errors.setdefault(key, {})[i] = str(why)[:300]
            elif self.cache is not None and cache_key:
                self.cache.write(entry)
        got = [shape_set for shape_set, _, _ in mine if self.rounds[(kernel, shape_set)].get(i) is not None]
        print(f"peers: {kernel} round {i + 1} beside the search timed the peers on "
              + (", ".join(f"the {s} shapes" for s in got) or "no shape set")
              + ("" if len(got) == len(mine) else f" ({error or 'see the run summary'})"[:300]),
              file=sys.stderr, flush=True)

    def open_gate(self) -> None:
        """The search is over: the rounds set up beside it may time now, and those that start
        from now on (their compilations answered after the search) find the gate open."""
        # Rounds begin only after compilations started here: with none, nothing can wait.
        if (self.started and self.cfg is not None and rounds_beside(self.cfg) and self.pool is not None
                and self.gate_opened_s is None):
            self.gate_opened_s = time.time() - self.since
            print(f"peers: the search is over; the peers' rounds beside it time now ({self.rounds_started} begun, "
                  "the others as they begin)", file=sys.stderr, flush=True)
            self.pool.open_gates(self.gate)

    def remove_folders(self) -> None:
        """Removes the compilations' folders, and the gate's file, where this machine holds them
        (the run is over)."""
        for made in self.replies.values():
            if made.get("folder"):
                shutil.rmtree(made["folder"], ignore_errors=True)
        gate_file(self.gate).unlink(missing_ok=True)

    def measured(self, kernel: str, shape_set: ShapeSet | str, i: int) -> dict[str, Any] | None:
        """The entry of round ``i``'s peers' figures measured beside the search, if any."""
        return self.rounds.get((kernel, ShapeSet(shape_set).value), {}).get(i)

    def pending(self) -> int:
        """Calls started and not yet answered."""
        return len(self.started - set(self.replies))

    def summary(self) -> dict[str, Any]:
        """For the run's summary: per kernel and shape set, its status and the seconds from the
        start to its answer (None: never answered); with peers' rounds beside the search, how
        many gave figures, when each answered and why the others gave none."""
        out: dict[str, Any] = {}
        for name, shape_set in sorted(self.started):
            key = (name, shape_set)
            row: dict[str, Any] = {"status": self.replies.get(key, {}).get("status"), "answered_s": self.answered_s.get(key)}
            if key in self.rounds:
                row.update(peer_rounds=sum(1 for e in self.rounds[key].values() if e is not None),
                           peer_rounds_answered_s=sorted(self.rounds_answered_s.get(key, [])),
                           peer_round_errors={str(i): why for i, why in self.round_errors.get(key, {}).items()},
                           peer_round_phase_s={str(i): ph for i, ph in sorted(self.round_phases.get(key, {}).items())})
            out[f"{name}/{shape_set}"] = row
        return out

    def take(self, kernel: str, shape_set: ShapeSet | str) -> dict[str, Any] | None:
        """The report of the kernel's compilation on the shape set, once answered; None where
        none was started here (or it has not answered)."""
        return self.replies.get((kernel, ShapeSet(shape_set).value))
