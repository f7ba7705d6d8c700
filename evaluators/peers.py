"""Timing production peers beside our kernels, inside the sandbox worker (GPU only).

Every peer (the spec's ``peers``: torch eager, FlashInfer, Liger; plus ``torch_compile`` of
the spec's ``compiled`` program, or of the fp32 reference) is captured in a CUDA graph and
timed by graph replay with the same protocol as our kernels (:mod:`evaluators.timing`):
inputs restored and L2 flushed before every repetition, all implementations interleaved and
working on the same tensors. So every figure is kernel time, not the time of a Python call
(REFERENCE.md section 1). A peer that returns its results, or stages its operands
(:class:`kernels.peer.Peer`), has nothing but the library call in its graph.

torch.compile is timed at its best: each of :data:`COMPILE_MODES` compiled ``compile_trials``
times afresh (a code object of its own per compilation, Inductor's graph and autotuning
caches off, so every compilation autotunes again and may pick other kernels), every
compilation timed in the loop, and per shape the fastest is reported as ``torch_compile``
with the compilation that won. Past dynamo's recompile limit a compilation fails (the peer
is reported in ``errors``) instead of falling back to eager code.

Our kernels are set up exactly as in the evaluator (:class:`evaluators.ours.OursOnShape`):
inputs that change every launch, outputs filled (NaN, sentinel or stale values) before every
launch, every timed launch's outputs checked against our baseline run on the same inputs, and
the roofline guard. A kernel that fails one is reported in ``failed`` with the reason and none
of its times are reported. The peers (trusted library code) get the same restored inputs and
filled outputs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from evaluators import gpu_turns, jit_watch
from evaluators import validate as V
from evaluators.context import Context, Verdict, tolerances, torch_dtype
from evaluators.launcher import Kernel, LaunchResourceError
from evaluators.ours import GRAPH_SUFFIX, OursOnShape
from evaluators.peer_steps import EVERY_SHAPE, peer_step
from evaluators.timing import (
    Samples,
    Timed,
    capture_graph,
    l2_finding,
    l2_persistence,
    time_interleaved,
)
from evaluators.verify import Buffers, RepInputs
from kernels.launch import LaunchLimitError
from kernels.peer import Peer, Scratch, as_peer, call_once
from kernels.spec import KernelSpec, Shape, shape_label
from kernels.verdict import Status

__all__ = ["GRAPH_SUFFIX", "COMPILE_MODES", "peer_fns", "check_peers", "peer_impls", "run_peers", "run_round",
           "best_compiled"]

COMPILED = "torch_compile"
# Without CUDA graphs: the loop captures every peer in a graph of its own.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
COMPILE_TRIALS = 2
# Inductor's caches that would hand a later compilation the kernels (or the autotuning
# choice) of an earlier one; Triton's binary cache stays (same source, same binary).
_FRESH = {"fx_graph_cache": False, "fx_graph_remote_cache": False, "autotune_local_cache": False,
          "autotune_remote_cache": False, "bundled_autotune_remote_cache": False}


def memory_format(name: str) -> Any:
    """The memory format ``torch.<name>`` (what :func:`stable_memory_formats` pickles)."""
    return getattr(torch, name)


@contextlib.contextmanager
def stable_memory_formats() -> Iterator[None]:
    """A tensor's memory format (in every example input of an FX-graph cache key) has no
    ``__module__``, so pickle names it after the first module in ``sys.modules`` through which
    ``torch.contiguous_format`` resolves: any module that imported torch, which one depending
    on the process's import order. Two processes (a compile-ahead process and a loop's worker)
    then hash the same graph to different keys and the loop loads nothing (a CPU test saw
    ``__mp_main__`` in one and ``torch._utils`` in the other). Inside, it is pickled by name
    through :func:`memory_format` instead (Inductor's pickler starts from copyreg's table),
    a function of this module, which no process runs as ``__main__`` (a compile-ahead process
    runs evaluators.peer_compile so)."""
    import copyreg

    kind = type(torch.contiguous_format)
    before = copyreg.dispatch_table.get(kind)
    copyreg.pickle(kind, lambda f: (memory_format, (str(f).removeprefix("torch."),)))
    try:
        yield
    finally:
        if before is None:
            copyreg.dispatch_table.pop(kind, None)
        else:
            copyreg.dispatch_table[kind] = before


def compile_name(mode: str, trial: int) -> str:
    """The loop's name of one compilation: ``torch_compile[<mode>#<trial>]``."""
    return f"{COMPILED}[{mode}#{trial}]"


# Compiled ahead (evaluators.peer_compile): the local caches on, in the loop's own folder.
# Triton's kernels are not bundled into the FX-graph entry: a loop then loads each kernel from
# its source file, whose autotuning choice (a ``.best_config`` beside it, coordinate descent's
# included) it finds. Loaded from the bundle instead, torch 2.11 ran coordinate descent again
# on some kernels although their choice was found (experiments/results/coordesc-h100-b282de5.json:
# 2 of 8 fused_add_rmsnorm kernels, none without the bundle; 4.4-21.1 s per loop at 9a09729,
# its benchmarks taking the set-up benchmark lock one at a time across rounds).
_CACHED = {**_FRESH, "fx_graph_cache": True, "autotune_local_cache": True, "bundle_triton_into_fx_graph_cache": False}


@contextlib.contextmanager
def _fresh_inductor(cached: bool = False) -> Iterator[None]:
    import torch._inductor.config as inductor_config

    settings = _CACHED if cached else _FRESH
    with inductor_config.patch({k: v for k, v in settings.items() if hasattr(inductor_config, k)}):
        yield


def _program(spec: KernelSpec) -> Callable[..., None]:
    """The program torch.compile is given: the spec's ``compiled`` (what a serving engine
    would write), else the fp32 reference with its results rounded into the outputs."""
    if spec.compiled is not None:
        return spec.compiled

    def body(t: dict[str, torch.Tensor], shape: dict[str, int], constants: Any) -> None:
        expected = spec.reference(t, shape, constants)
        for name, value in expected.items():
            t[name].copy_(value)

    return body


# Room for one compilation per shape of a spec, and a hard error instead of dynamo's silent
# eager fallback past the limit: timed as "torch.compile", that fallback ran the fp32
# reference eagerly (2-3x slower than torch eager on the largest unseen shapes).
_DYNAMO_LIMITS = {"recompile_limit": 64, "accumulated_recompile_limit": 4096, "fail_on_recompile_limit_hit": True}


@contextlib.contextmanager
def _compiling(cached: bool = False) -> Iterator[None]:
    """Around every call of a compiled program (each may compile for a new shape): Inductor's
    caches off (``cached``: its local caches on, for a compilation made ahead into the loop's
    own cache folder) and dynamo's limits as :data:`_DYNAMO_LIMITS` (where this torch has them)."""
    import torch._dynamo.config as dynamo_config

    limits = {k: v for k, v in _DYNAMO_LIMITS.items() if hasattr(dynamo_config, k)}
    with dynamo_config.patch(limits), _fresh_inductor(cached):
        yield


def _own_code(program: Callable[..., None]) -> Callable[..., None]:
    """``program`` behind a function with a code object of its own. Dynamo keeps compiled
    code, and counts recompilations, per code object: compilations of one program would
    otherwise share one cache, each taking the others' entries or pushing them out."""

    def call(t: Any, shape: Any, constants: Any) -> None:
        program(t, shape, constants)

    code = call.__code__.replace()  # a copy: a distinct object with the same bytecode
    return types.FunctionType(code, call.__globals__, call.__name__, None, call.__closure__)


class _FreshCompile:
    """One compilation of the program in one mode, independent of every other: a code object
    of its own (:func:`_own_code`), Inductor's caches off whenever it compiles and autotunes,
    static shapes (kernels specialised to the shape, as a serving engine's compiled graph
    would get, never a dynamic-shape kernel)."""

    def __init__(self, spec: KernelSpec, mode: str, cached: bool = False) -> None:
        self.fn = torch.compile(_own_code(_program(spec)), dynamic=False,
                                mode=None if mode == "default" else mode)
        self.cached = cached

    def __call__(self, t: Mapping[str, Any], shape: Mapping[str, int], constants: Any) -> None:
        with _compiling(self.cached):
            self.fn(t, shape, constants)


def peer_fns(spec: KernelSpec, modes: tuple[str, ...] = COMPILE_MODES, trials: int = COMPILE_TRIALS,
             cached: bool = False, only_compiled: bool = False) -> dict[str, Peer]:
    """Every peer of the spec by name (``only_compiled``: none), and one
    ``torch_compile[<mode>#<trial>]`` per mode and trial (each compiled afresh at its first
    call; ``cached``: with Inductor's local caches on, to load a compilation made ahead)."""
    fns: dict[str, Peer] = {} if only_compiled else {name: as_peer(p) for name, p in spec.peers.items()}
    for mode in modes:
        for trial in range(1, trials + 1):
            fns[compile_name(mode, trial)] = as_peer(_FreshCompile(spec, mode, cached))
    return fns


def only_peers(peers: Mapping[str, Peer], names: Iterable[str]) -> dict[str, Peer]:
    """The peers named, :data:`COMPILED` standing for every ``torch_compile[...]`` compilation."""
    keep = set(names)
    return {n: p for n, p in peers.items() if n in keep or (COMPILED in keep and n.startswith(COMPILED + "["))}


def best_compiled(times: Mapping[str, Mapping[str, float]]) -> tuple[dict[str, float], dict[str, str]]:
    """Per shape label, the fastest compilation's median and its name, from the loop's times
    of every ``torch_compile[...]`` implementation."""
    best: dict[str, float] = {}
    which: dict[str, str] = {}
    for impl, per_shape in times.items():
        if not impl.startswith(COMPILED + "["):
            continue
        for label, ms in per_shape.items():
            if label not in best or ms < best[label]:
                best[label], which[label] = ms, impl[len(COMPILED) + 1:-1]
    return best, which


def _check_peer(spec: KernelSpec, peer: Peer, shape: Shape, dtype: str, ctx: Context) -> str | None:
    """Runs a peer once on fresh inputs and checks it against the reference: a peer whose
    semantics differ from ours is not a fair comparison."""
    gen = torch.Generator(device=ctx.device).manual_seed(7)
    t = spec.make_inputs(shape, torch_dtype(dtype), gen, "random", ctx.device)
    expected = spec.reference({k: v.clone() for k, v in t.items()}, shape, spec.constants)
    got = {a.name: t[a.name] for a in spec.written_args}
    got.update(call_once(peer, t, shape, spec.constants))
    torch.cuda.synchronize()
    finding = V.check_outputs(got, expected, tolerances(spec, dtype, 2.0), spec.compare)
    return finding.message if finding else None


def _load_ours(ctx: Context, spec: KernelSpec, job: dict[str, Any], shapes: list[Shape],
               failed: dict[str, str]) -> dict[str, Kernel]:
    """Our binaries of the job; one the device refuses goes to ``failed``."""
    ours = {}
    for name, part in job.get("kernels", {}).items():
        try:
            ours[name] = ctx.kernel(spec, part, shapes)
        except (LaunchResourceError, LaunchLimitError) as exc:
            failed[name] = f"RESOURCE_ERROR: {exc}"
    return ours


def _compile_seconds() -> dict[str, float]:
    """Seconds torch.compile has spent so far in this process, per timed phase (dynamo's
    ``compilation_time_metrics``: nested phases, each counted inclusively), where this torch
    keeps them."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return {}
    return {name: float(sum(times)) for name, times in compilation_time_metrics.items()}


@contextlib.contextmanager
def _set_up_seconds(name: str, seconds: dict[str, float] | None,
                    phases: dict[str, dict[str, float]] | None) -> Iterator[None]:
    """Adds what the block took to ``seconds[name]`` and torch.compile's phases inside it
    (10 ms or more, see :func:`_compile_seconds`) to ``phases[name]``."""
    start = time.perf_counter()
    before = _compile_seconds() if phases is not None else {}
    try:
        yield
    finally:
        if seconds is not None:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        if phases is not None:
            mine = phases.setdefault(name, {})
            for phase, total in _compile_seconds().items():
                spent = total - before.get(phase, 0.0)
                if spent >= 0.01:
                    mine[phase] = mine.get(phase, 0.0) + spent


def _tried_before(name: str, errors: Mapping[str, str]) -> bool:
    """A peer unavailable on every shape (see :func:`_peer_error`): not tried again."""
    return name in errors and not errors[name].startswith("[")


def _left_out(name: str, label: str, excluded: Mapping[str, Mapping[str, str]] | None,
              errors: dict[str, str]) -> bool:
    """Whether the job leaves this peer out on this shape (it ended a process there, or on more
    shapes than a job's re-runs cover: :data:`EVERY_SHAPE`); if so, why is in ``errors``."""
    mine = (excluded or {}).get(name, {})
    if EVERY_SHAPE in mine:
        errors[name] = mine[EVERY_SHAPE][:1500]
        return True
    if label in mine:
        _peer_error(errors, name, label, mine[label])
        return True
    return False


def check_peers(ctx: Context, spec: KernelSpec, shape: Shape, dtype: str, peers: Mapping[str, Peer],
                errors: dict[str, str], seconds: dict[str, float] | None = None,
                phases: dict[str, dict[str, float]] | None = None, beat: Callable[[str], None] | None = None,
                excluded: Mapping[str, Mapping[str, str]] | None = None) -> set[str]:
    """Runs each peer once on this shape and checks it against the reference (a torch.compile
    program compiles for the shape here); returns the names of those that agree. Why each
    other one is not timed goes to ``errors``; ``seconds`` and ``phases`` as for
    :func:`peer_impls`; ``beat`` hears :func:`peer_step` before each call; ``excluded``
    ({peer: {shape label or :data:`EVERY_SHAPE`: why}}) names peers not to call."""
    label = shape_label(shape)
    agreed: set[str] = set()
    for name, peer in peers.items():
        if _tried_before(name, errors) or _left_out(name, label, excluded, errors):
            continue
        if beat is not None:
            beat(peer_step(name, label))
        with _set_up_seconds(name, seconds, phases):
            try:
                wrong = _check_peer(spec, peer, shape, dtype, ctx)
                if wrong:
                    _peer_error(errors, name, label, f"disagrees with the reference: {wrong}")
                else:
                    agreed.add(name)
            except ImportError as exc:  # the library is not installed: no shape can time it
                errors[name] = f"{type(exc).__name__}: {exc}"[:500]
            except Exception as exc:  # a peer that cannot run this shape (a launch limit, an unsupported size)
                _peer_error(errors, name, label, f"{type(exc).__name__}: {exc}")
    return agreed


def peer_impls(ctx: Context, spec: KernelSpec, shape: Shape, dtype: str, inputs: RepInputs,
               work: Buffers, peers: Mapping[str, Peer], errors: dict[str, str],
               seconds: dict[str, float] | None = None,
               phases: dict[str, dict[str, float]] | None = None,
               staged: list[torch.Tensor] | None = None, checked: set[str] | None = None,
               beat: Callable[[str], None] | None = None) -> list[Timed]:
    """The peers that agree with the reference on this shape, each captured in a graph that
    holds its call alone (staging runs before the flush, outside the window). ``seconds``
    gathers each peer's set-up time (its compilation included), ``phases`` the torch.compile
    phases inside it (see :func:`_compile_seconds`; 10 ms or more), ``staged`` the tensors
    the peers' staging made (which their timed calls read). ``checked``: the peers that
    :func:`check_peers` found in agreement on this shape before; only those are set up, and
    not checked again. ``beat`` hears :func:`peer_step` before each capture."""
    impls = []
    label = shape_label(shape)
    agreed = check_peers(ctx, spec, shape, dtype, peers, errors, seconds, phases) if checked is None else checked
    for name, peer in peers.items():
        if name not in agreed or _tried_before(name, errors):
            continue
        if beat is not None:
            beat(peer_step(name, label))
        with _set_up_seconds(name, seconds, phases):
            try:
                scratch: Scratch = {}
                if peer.stage is not None:
                    inputs.restore(work, 0)
                    peer.stage(work, shape, spec.constants, scratch)
                graph = capture_graph(functools.partial(peer.run, work, shape, spec.constants, scratch))
                if staged is not None:
                    staged.extend(t for t in scratch.values() if isinstance(t, torch.Tensor) and t.is_cuda)
                impls.append(Timed(name, functools.partial(_prepare_peer, inputs, work, peer, shape, spec.constants,
                                                           scratch), graph.replay))
            except ImportError as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"[:500]
            except Exception as exc:
                _peer_error(errors, name, label, f"{type(exc).__name__}: {exc}")
    return impls


def _peer_error(errors: dict[str, str], name: str, label: str, why: str) -> None:
    """Notes that a peer could not be timed on one shape (``<shape label>: why``, after those of
    earlier shapes). It is still tried on the next shapes: FlashInfer's merge_state failing on
    one merge_attn_states_multi shape, or one torch.compile compilation on one shape, must not
    leave the other shapes without that peer. A note that does not start with a shape label
    ("[") holds for every shape and the peer is not tried again."""
    line = f"{label}: {why}"[:300]
    errors[name] = f"{errors[name]}; {line}"[:1500] if name in errors else line


def _prepare_peer(inputs: RepInputs, work: Buffers, peer: Peer, shape: Shape, constants: Any, scratch: Scratch,
                  i: int) -> None:
    inputs.restore(work, i)
    if peer.stage is not None:
        peer.stage(work, shape, constants, scratch)


def _input_sets(ctx: Context, spec: KernelSpec, shape: Shape, dtype: str) -> list[Buffers]:
    return [spec.make_inputs(shape, torch_dtype(dtype), torch.Generator(device=ctx.device).manual_seed(20_000 + k),
                             "random", ctx.device) for k in (0, 1)]


def _cache_counts() -> dict[str, int]:
    """Inductor's FX-graph cache hits and misses in this process so far."""
    from torch._dynamo.utils import counters

    return {k: int(counters["inductor"].get(f"fxgraph_cache_{k}", 0)) for k in ("hit", "miss", "bypass")}


def run_peers(ctx: Context, job: dict[str, Any], beat: Callable[[str], None]) -> dict[str, Any]:
    """Times peers and our kernels on each shape; returns medians in ms: one loop, a round of
    one (:func:`run_round`; the reply is the loop's own).

    With ``compile_cache`` (a folder that :mod:`evaluators.peer_compile` compiled this
    kernel's torch.compile programs into, for this loop alone), the compilations are loaded
    from there (Inductor's local caches on, in that folder) instead of compiled here; the
    reply's ``compile_cache`` says how many loaded (``hit``) and how many were compiled here
    after all (``miss``, ``bypass``). See :func:`_set_up` and :func:`_timed` for the rest.
    """
    return run_round(ctx, {"loops": [job]}, beat)["loops"][0]


def run_round(ctx: Context, job: dict[str, Any], beat: Callable[[str], None]) -> dict[str, Any]:
    """The loops of a round (job key ``loops``: the jobs of :func:`run_peers`, e.g. the search
    shapes' and the held-out shapes'), each set up first and then all timed, one after the
    other, while this process has the GPU alone (:func:`evaluators.gpu_turns.alone`, where the
    process takes part in its GPU's turns): set-up, where the time goes (compilations loaded,
    each peer run and checked on every shape), may overlap other processes' set-ups; timing
    overlaps nothing. Returns ``{"loops": [each loop's reply]}``."""
    ready = []
    for loop in job["loops"]:
        with _loop_folder(loop) as counts:
            ready.append(_set_up(ctx, loop, beat))
        ready[-1].cache_counts = counts
    # What the set-up pass allocated for its checks goes back before anything is timed.
    torch.cuda.empty_cache()
    replies: list[dict[str, Any]] = []
    gated_loop = next((loop for loop in job["loops"] if loop.get("time_after")), None)
    gate = str(gated_loop["time_after"]) if gated_loop else None
    gated = time.perf_counter()
    if gated_loop:
        until = gated_loop.get("time_after_until")
        _wait_for_gate(Path(gated_loop["time_after"]), beat, float(until) if until is not None else None)
        _full_priority()
    asked = time.perf_counter()
    with (gpu_turns.alone(lambda: beat("waiting for the GPU to time alone")),
          gpu_turns.benchmarks_alone(lambda: beat("waiting for the evaluator's job to end"))
          if gate else contextlib.nullcontext()):
        waited = time.perf_counter() - asked
        began = time.time()
        for loop, state in zip(job["loops"], ready, strict=True):
            with _loop_folder(loop) as counts:
                reply = _timed(ctx, loop, beat, state)
            if loop.get("compile_cache"):
                assert state.cache_counts is not None
                reply["compile_cache"] = {"folder": str(loop["compile_cache"]),
                                          **{k: state.cache_counts[k] + counts[k] for k in counts}}
            reply["phase_s"]["wait"] = waited if not replies else 0.0
            if gate:  # set up beside the search: the wait for its end, and the niceness it timed at
                reply["phase_s"]["search_end_wait"] = asked - gated if not replies else 0.0
                reply["nice_timed"] = os.nice(0)
            replies.append(reply)
        # The round's hold of the GPU alone, on the wall clock: rounds beside each other can be
        # seen never to overlap.
        held = [began, time.time()]
    for loop, reply in zip(job["loops"], replies, strict=True):
        reply["timed_at"] = held
        if reply.get("compile_cache", {}).get("miss"):  # read after the GPU is given back
            from evaluators.peer_compile import why_missed

            reply["compile_cache"]["why_missed"] = why_missed(loop["compile_cache"])
    return {"loops": replies}


def _full_priority() -> None:
    """Back to CPU niceness 0 where this process may (a round set up at a lower priority beside
    the search times at full priority; without the privilege it stays where it was, and its
    reply's ``nice_timed`` says so)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass


def _wait_for_gate(gate: Path, beat: Callable[[str], None], until: float | None = None,
                   every_s: float = 0.2) -> None:
    """Waits until the file ``gate`` exists: a round set up beside the search times once the
    search is over (:mod:`search.compile_ahead`), so that its timed pass never holds the GPU
    from the search's evaluations. ``until``: the wall-clock time (epoch seconds) past which
    the round stops waiting and ends with a TIMEOUT verdict instead (a gate that nobody opened
    on this node must not hold the end of the run for ever; the end's loops then time the
    peers themselves)."""
    said = time.monotonic()
    while not gate.exists():
        if until is not None and time.time() >= until:
            raise Verdict(Status.TIMEOUT, f"the gate {gate.name} was not opened by "
                                          f"{time.strftime('%H:%M:%S', time.localtime(until))}: not timed")
        if time.monotonic() - said >= 10.0:
            beat("set up; waiting for the search to end to time")
            said = time.monotonic()
        time.sleep(every_s)


@contextlib.contextmanager
def _loop_folder(loop: dict[str, Any]) -> Iterator[dict[str, int]]:
    """Inside the loop's compile-ahead folder, where it has one (see :func:`run_peers`);
    yields, filled on the way out, Inductor's FX-graph cache hits and misses inside."""
    counts = {"hit": 0, "miss": 0, "bypass": 0}
    folder = loop.get("compile_cache")
    if not folder:
        yield counts
        return
    from evaluators.peer_compile import cache_folder, recording_keys

    before = _cache_counts()
    try:
        with cache_folder(folder), recording_keys(folder, "loop"):
            yield counts
    finally:
        after = _cache_counts()
        counts.update({k: after[k] - before[k] for k in after})


class _LoopSetUp:
    """What a loop's set-up pass made for its timed pass: our binaries, the peers (compiled,
    checked per shape) and the seconds it took."""

    def __init__(self, spec: KernelSpec, ours: dict[str, Kernel], baseline: Kernel | None,
                 peers: dict[str, Peer], failed: dict[str, str]) -> None:
        self.spec, self.ours, self.baseline, self.peers, self.failed = spec, ours, baseline, peers, failed
        self.errors: dict[str, str] = {}
        self.checked: dict[str, set[str]] = {}  # shape label -> the peers that agree on it
        self.prepare_by_peer: dict[str, float] = {}
        # The first shape's share apart: what a peer pays once per process (an import, a library's
        # JIT build or load) shows there, what it pays per shape (a compilation) on every shape.
        self.prepare_first: dict[str, float] = {}
        self.phases_by_peer: dict[str, dict[str, float]] = {}
        self.set_up_s = 0.0
        self.jit_before: Any = None
        self.cache_counts: dict[str, int] | None = None


def _set_up(ctx: Context, job: dict[str, Any], beat: Callable[[str], None]) -> _LoopSetUp:
    """A loop's set-up pass: our binaries loaded, and each peer run and checked against the
    reference on every shape (a torch.compile program compiles, or loads its compilation,
    for each shape here), so that the timed pass only captures and times."""
    start = time.perf_counter()
    spec: KernelSpec = ctx.spec(job["kernel_dir"])
    dtype, shapes = job["dtype"], job["shapes"]
    failed: dict[str, str] = {}
    ours = _load_ours(ctx, spec, job, shapes, failed)
    baseline = ctx.kernel(spec, job["baseline"], shapes) if job.get("kernels") else None
    peers = (peer_fns(spec, trials=int(job.get("compile_trials", COMPILE_TRIALS)), cached=bool(job.get("compile_cache")))
             if job.get("peers", True) else {})
    if job.get("only_peers") is not None:  # a diagnosis: some peers alone
        peers = only_peers(peers, job["only_peers"])
    state = _LoopSetUp(spec, ours, baseline, peers, failed)
    # What the peers' first calls built on disk in this loop (FlashInfer's JIT): a build in a
    # loop whose process found the module built already is set-up it should not have paid.
    state.jit_before = jit_watch.snapshot() if peers else None
    for shape in shapes:
        state.checked[shape_label(shape)] = check_peers(ctx, spec, shape, dtype, peers, state.errors,
                                                        state.prepare_by_peer, state.phases_by_peer, beat,
                                                        job.get("exclude_peers"))
        if not state.prepare_first:
            state.prepare_first = dict(state.prepare_by_peer)
        # What this shape's checks cached goes back to the device before the next shape's: the
        # rounds set up beside each other and beside the search, and a held-out shape's inputs
        # take gigabytes that the others would find missing.
        torch.cuda.empty_cache()
        beat(f"peers set up on {shape_label(shape)}")
    state.set_up_s = time.perf_counter() - start
    return state


def _timed(ctx: Context, job: dict[str, Any], beat: Callable[[str], None], state: _LoopSetUp) -> dict[str, Any]:
    """Times peers and our kernels on each shape; returns medians in ms.

    Job keys: kernel_dir, dtype, shapes, warmup, repetitions; ``kernels`` ({name: {cubin,
    launches}}) our binaries, timed in the same interleaved loop and verified against
    ``baseline`` ({cubin, launches}, our baseline's binary); ``graph_ours`` to time each of
    them a second time, as ``<name>@graph``, through a CUDA graph like the peers (what the
    launch mechanism alone changes); ``peers`` False to time our kernels alone;
    ``compile_trials`` (default :data:`COMPILE_TRIALS`) compilations per torch.compile mode;
    ``only_peers`` (peer names, :data:`COMPILED` for every compilation) to time those peers alone;
    ``exclude_peers`` ({peer: {shape label or :data:`EVERY_SHAPE`: why}}) peers not to call
    where named (each ended a process of this loop before; why goes to ``errors``).

    Returns:
        ``peers`` ({implementation: {shape label: median ms}}, ``torch_compile`` being the
        fastest compilation), ``iqr`` (the same for the spreads), ``compiled`` ({shape label:
        the compilation that won, ``<mode>#<trial>``}), ``compile_candidates`` (every
        compilation's medians), ``errors`` ({peer: why it was not timed, per shape as
        ``<label>: why; ...`` where it failed on some shapes only}), ``failed`` ({our
        kernel: the guard that fired}; none of its times are reported), ``notes`` ({peer:
        what exactly is timed}), ``l2_persistence`` (carve-out and access-policy window, bytes;
        ``l2_finding`` when not both zero), ``copy_bw_bytes_per_s`` and ``phase_s`` (seconds
        spent setting up the peers, compilations included (``prepare``: the set-up pass and
        each shape's captures), in the timed loops and, for a round's first loop, ``wait``:
        waiting for the GPU alone, see :func:`run_round`), and
        ``prepare_s_by_peer`` (the set-up seconds per peer, every shape's summed; the first
        shape's alone in ``prepare_s_first_shape_by_peer``) with
        ``compile_phases_s`` (per compiled peer, torch.compile's phases in those seconds: where
        a loop's set-up goes); with peers, ``jit_builds`` (:mod:`evaluators.jit_watch`: the
        library modules this loop built or rebuilt, the build files it rewrote, and the settings
        those depend on).
    """
    spec, peers, failed, errors = state.spec, state.peers, state.failed, state.errors
    dtype, shapes = job["dtype"], job["shapes"]
    times: dict[str, dict[str, float]] = {}
    spreads: dict[str, dict[str, float]] = {}
    l2 = l2_persistence(torch.cuda.current_stream().cuda_stream)
    # Where a loop's time goes: the peers' set-up (torch.compile compiles and autotunes there)
    # against the timed loop itself.
    phase_s = {"prepare": state.set_up_s, "loop": 0.0}
    for shape in shapes:
        label = shape_label(shape)
        inputs = RepInputs(spec, _input_sets(ctx, spec, shape, dtype), job["warmup"] + job["repetitions"],
                           torch.Generator(device=ctx.device).manual_seed(random.randint(0, 2**31)))
        # One working set for every implementation (see evaluators.ours).
        work = inputs.buffer()
        mine = OursOnShape(ctx, spec, shape, dtype, job["warmup"], job["repetitions"], inputs, work, state.baseline,
                           "in the peers' loop")
        live = {n: k for n, k in state.ours.items() if n not in failed}
        impls = [mine.timed(n, k) for n, k in live.items()]
        if job.get("graph_ours"):
            impls += [mine.timed(n, k, graph=True) for n, k in live.items()]
        start = time.perf_counter()
        staged: list[torch.Tensor] = []
        impls += peer_impls(ctx, spec, shape, dtype, inputs, work, peers, errors, state.prepare_by_peer,
                            state.phases_by_peer, staged, checked=state.checked.get(label), beat=beat)
        phase_s["prepare"] += time.perf_counter() - start
        # Every flush takes what the timed implementations read out of the L2, whatever
        # eviction priority an earlier one left on it (see evaluators.timing.Flusher).
        ctx.flush.cover([*work.values(), *staged])
        # Our kernels launch on the stream they were loaded on and the events go to the current
        # one: if they differ, the events would time nothing (see timing.capture_graph).
        current = torch.cuda.current_stream().cuda_stream
        stray = [n for n, k in live.items() if k.stream.ptr != current]
        if stray:
            raise RuntimeError(f"{', '.join(stray)} would launch on another stream than the timing events")
        start = time.perf_counter()
        samples: dict[str, Samples] = time_interleaved(impls, ctx.flush, job["warmup"], job["repetitions"])
        phase_s["loop"] += time.perf_counter() - start
        for name, (kind, finding) in mine.failures(samples).items():
            failed.setdefault(name, f"REJECTED ({kind}): {finding.message}")
        for name, smp in samples.items():
            times.setdefault(name, {})[label] = smp.median_ms
            spreads.setdefault(name, {})[label] = smp.iqr_ms
        beat(f"peers {label}")
    for name in failed:  # a failed kernel's times are never reported, not even those of shapes it passed
        for impl in (name, f"{name}{GRAPH_SUFFIX}"):
            times.pop(impl, None)
            spreads.pop(impl, None)
    candidates = {n: times.pop(n) for n in list(times) if n.startswith(COMPILED + "[")}
    candidate_iqr = {n: spreads.pop(n) for n in list(spreads) if n.startswith(COMPILED + "[")}
    best, which = best_compiled(candidates)
    if best:
        times[COMPILED] = best
        spreads[COMPILED] = {label: candidate_iqr[f"{COMPILED}[{w}]"][label] for label, w in which.items()}
    reply: dict[str, Any] = {
        "peers": times, "iqr": spreads, "errors": errors, "failed": failed, "copy_bw_bytes_per_s": ctx.copy_bw,
        "compiled": which, "compile_candidates": candidates, "l2_persistence": l2,
        "notes": {n: p.note for n, p in peers.items() if p.note}, "phase_s": phase_s,
        "prepare_s_by_peer": state.prepare_by_peer, "prepare_s_first_shape_by_peer": state.prepare_first,
        "compile_phases_s": {n: dict(sorted(ph.items(), key=lambda kv: -kv[1]))
                             for n, ph in state.phases_by_peer.items() if ph},
    }
    if state.jit_before is not None:
        reply["jit_builds"] = jit_watch.report(state.jit_before)
    if l2_finding(l2):
        reply["l2_finding"] = l2_finding(l2)
    return reply
