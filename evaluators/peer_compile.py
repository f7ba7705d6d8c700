"""torch.compile's programs for the end-of-run loops, compiled ahead of them (GPU machine).

A peers' loop spends most of its time setting up, not timing: on the library at 13ad156 a
loop took 22-51 s, of which 1.6-3.1 s were the timed repetitions; the rest is setting up the
peers, torch.compile compiling and autotuning each mode for each shape afresh among them.
Compiled ahead, each loop's compilations are made in a process of their own, into a cache
folder of their own (Inductor's FX-graph and autotuning caches on and pointed there), so they
are as independent of the other loops' as when each loop compiled for itself; the loop then
loads them from that folder (:func:`evaluators.peers.run_peers`, job key ``compile_cache``)
instead of compiling them. What the folder lacks the loop compiles itself, as before. Another
process meanwhile calls the kernel's other peers once per shape, so that a library building
its kernels on first use (FlashInfer's JIT) builds them there and not inside the loop, and a
library call that ends a process is found there, not in every loop.

The processes run beside each other and beside sanitizer runs, never beside a timed call
(:mod:`search.pool`: they are non-exclusive calls); their autotuning benchmarks take a file
lock of the GPU exclusively, and sanitizer runs take it shared, so no benchmark times candidate
kernels while another benchmark or a sanitizer run loads the GPU.

    python -m evaluators.peer_compile --cache-dir DIR --lock FILE --dtype float16 KERNEL
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from evaluators.gpu_turns import turns
from evaluators.ninja_turns import environment as ninja_environment
from evaluators.proc_group import run_group
from kernels.folders import KernelRef

REPORT = "compiled.json"  # what a compile-ahead process did, in its cache folder
# The peer call a first-calls pass is inside (:func:`evaluators.peer_steps.peer_step`), rewritten
# before each call: a library that ends the process there is then known by peer and shape.
STEP = "first-call.step"
# What the process that makes the first calls (:func:`first_calls_only`) did.
FIRST_CALLS = "first-calls.json"
# Every FX-graph cache key a process computed in a loop's folder, with the details it hashed:
# <folder>/fx-keys/<role>-<pid>.jsonl ("ahead" or "loop"). A loop that misses a compilation
# made ahead for it can then say which detail differed (:func:`why_missed`).
KEYS = "fx-keys"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


@contextlib.contextmanager
def cache_folder(path: str | Path) -> Iterator[None]:
    """Inductor's on-disk caches (FX graphs, autotuning choices) in ``path`` while inside, its
    in-memory caches cleared on the way in and out, so nothing compiled elsewhere is picked up
    (torch's own ``temporary_cache_dir``). Triton's binary cache stays where it is: a binary is
    found by its source's hash, so sharing it hands no compilation another's choices (as in
    :data:`evaluators.peers._FRESH`). Inside, memory formats hash the same in every process
    (:func:`evaluators.peers.stable_memory_formats`)."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    from evaluators.peers import stable_memory_formats

    with temporary_cache_dir(str(Path(path).resolve())), stable_memory_formats():
        yield


@contextlib.contextmanager
def recording_keys(folder: str | Path, role: str) -> Iterator[None]:
    """Inside, each FX-graph cache key this process computes is appended with the details it
    hashes (Inductor's own debug lines) to ``<folder>/fx-keys/<role>-<pid>.jsonl``. A no-op
    where this torch computes its keys elsewhere."""
    try:
        import torch
        from torch._inductor import codecache
    except ImportError:
        yield
        return
    original = getattr(codecache, "compiled_fx_graph_hash", None)
    if original is None:
        yield
        return
    path = Path(folder) / KEYS / f"{role}-{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        key, lines = original(*args, **kwargs)
        # What the details' text leaves out: a real tensor among the example inputs is hashed
        # with its values, a fake one by its metadata alone, and both print as their metadata.
        inputs = args[1] if len(args) > 1 else kwargs.get("example_inputs", ())
        seen = [*lines, f"[-] example input classes: {[type(x).__name__ for x in inputs]}",
                f"[-] grad enabled: {torch.is_grad_enabled()}, inference mode: {torch.is_inference_mode_enabled()}"]
        with path.open("a") as f:
            # Objects' addresses ("<function f at 0x...>") differ between processes and are
            # not what the key hashed: they would show as a difference in every miss.
            f.write(json.dumps({"key": key, "lines": [_ADDRESS.sub("", str(x)) for x in seen]}) + "\n")
        return key, lines

    codecache.compiled_fx_graph_hash = recorded
    try:
        yield
    finally:
        codecache.compiled_fx_graph_hash = original


def why_missed(folder: str | Path, limit: int = 8, width: int = 300) -> list[str]:
    """For each key the loop computed that no compile-ahead process did, the hashed details of
    the loop's that differ from those of the closest key made ahead (most details shared):
    why the loop compiled instead of loading. At most ``limit`` lines, each cut to ``width``."""
    from kernels.records import read_jsonl

    def entries(role: str) -> list[dict[str, Any]]:
        return [row for f in sorted((Path(folder) / KEYS).glob(f"{role}-*.jsonl")) for row in read_jsonl(f)]

    ahead = entries("ahead")
    made = {row["key"] for row in ahead}
    out: list[str] = []
    for row in entries("loop"):
        if row["key"] in made:
            continue
        if not ahead:
            return ["no key was computed ahead in this folder"]
        mine = set(row["lines"])
        closest = max(ahead, key=lambda other: len(mine & set(other["lines"])))
        theirs = set(closest["lines"])
        for side, lines, other in (("loop", row["lines"], theirs), ("ahead", closest["lines"], mine)):
            for line in lines:
                text = f"{side}: {line}"[:width]
                if line not in other and text not in out:
                    out.append(text)
        if len(out) >= limit:
            break
    return out[:limit]


def sharing_the_gpu(path: str | Path) -> contextlib.AbstractContextManager[None]:
    """Held by work that loads the GPU without timing anything (a sanitizer run, a library's
    first calls): shared with others like it, exclusive of timing and of autotuning
    benchmarks, which wait for it to end (and it for them). See :mod:`evaluators.gpu_turns`."""
    return turns(path).shared()


def install_benchmark_turns(path: str | Path) -> bool:
    """Wraps Inductor's benchmarker's ``benchmark_gpu`` so that every autotuning benchmark of
    this process has the GPU alone (:meth:`evaluators.gpu_turns.GpuTurns.alone`); False where
    this torch has none."""
    try:
        from torch._inductor.runtime import benchmarking
    except ImportError:
        return False
    cls = type(getattr(benchmarking, "benchmarker", None))
    original = getattr(cls, "benchmark_gpu", None)
    if original is None:
        return False
    hold = turns(path)

    def benchmark_gpu(self: Any, *args: Any, **kwargs: Any) -> Any:
        with hold.alone():
            return original(self, *args, **kwargs)

    setattr(cls, "benchmark_gpu", benchmark_gpu)  # noqa: B010 - a method replaced on its class
    return True


def compile_kernel(kernel: str, dtype: str, shape_set: str, cache_dir: str | Path,
                   modes: Sequence[str] | None = None, device: str = "cuda") -> dict[str, Any]:
    """Compiles the kernel's torch.compile program in each mode for each shape into
    ``cache_dir`` (one call per shape on the loop's inputs); returns and writes
    :data:`REPORT`: per mode, per shape label, "ok" or why not, and the seconds taken
    (``first_calls``, None here, is the other process's: see :func:`compile_ahead`)."""
    import torch

    from evaluators.peers import COMPILE_MODES, compile_name, peer_fns
    from kernels.peer import call_once
    from kernels.spec import load_kernel, shape_label

    spec = load_kernel(kernel)
    start = time.perf_counter()
    done: dict[str, dict[str, str]] = {}
    with cache_folder(cache_dir), recording_keys(cache_dir, "ahead"):
        fns = peer_fns(spec, modes=tuple(modes or COMPILE_MODES), trials=1, cached=True, only_compiled=True)
        for shape in spec.shapes(shape_set):
            inputs = _inputs_or_why(spec, shape, dtype, device)
            for mode in modes or COMPILE_MODES:
                name = compile_name(mode, 1)
                if isinstance(inputs, str):
                    done.setdefault(mode, {})[shape_label(shape)] = inputs
                    continue
                try:
                    call_once(fns[name], {k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
                    # Inside the try: a launch the GPU refuses (a grid past its limits) may surface
                    # only here, and it fails this mode on this shape, not the whole folder.
                    if device == "cuda":
                        torch.cuda.synchronize()
                    done.setdefault(mode, {})[shape_label(shape)] = "ok"
                except Exception as exc:  # the loop meets the same failure and reports it
                    done.setdefault(mode, {})[shape_label(shape)] = f"{type(exc).__name__}: {exc}"[:300]
            del inputs
            _give_back_memory(device)
    report: dict[str, Any] = {"kernel": spec.name, "dtype": dtype, "modes": done, "first_calls": None,
              "seconds": time.perf_counter() - start, "nice": os.nice(0)}
    (Path(cache_dir) / REPORT).write_text(json.dumps(report))
    return report


def first_calls_only(kernel: str, dtype: str, shape_set: str, cache_dir: str | Path, device: str = "cuda",
                     lock: str | Path | None = None, excluded: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """:func:`first_calls`, leaving out the peers ``excluded`` on their shapes, naming each call
    in :data:`STEP`; writes :data:`FIRST_CALLS`. What the first calls' process runs, beside the
    compilations' (see :func:`compile_ahead`)."""
    from kernels.spec import load_kernel

    start = time.perf_counter()
    outcome = first_calls(load_kernel(kernel), dtype, shape_set, device, lock, Path(cache_dir) / STEP, excluded)
    report = {"first_calls": outcome, "seconds": time.perf_counter() - start}
    (Path(cache_dir) / FIRST_CALLS).write_text(json.dumps(report))
    return report


def _inputs_or_why(spec: Any, shape: Any, dtype: str, device: str) -> Any:
    """The loop's inputs for one shape, or why they could not be made: an error a refused launch
    left behind may surface at the next launch, here, and it costs this shape, not the folder."""
    import torch

    try:
        gen = torch.Generator(device=device).manual_seed(7)
        return spec.make_inputs(shape, getattr(torch, dtype), gen, "random", torch.device(device))
    except Exception as exc:
        return f"inputs: {type(exc).__name__}: {exc}"[:300]


def first_calls(spec: Any, dtype: str, shape_set: str, device: str, lock: str | Path | None,
                step_file: Path | None = None, excluded: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
    """Calls each peer that is not a torch.compile program once per shape: a library that
    builds its kernels on first use (FlashInfer JIT-compiles each op, 20-40 s, into an on-disk
    folder) builds them here, beside the other loops' compilations, instead of inside the
    loop's exclusive hold of the GPU. Each call holds the GPU's lock shared, like a sanitizer
    run: no autotuning benchmark of another process runs beside its launches. Returns, per
    peer, "ok" or the first failure (the loop meets it again and reports it). ``step_file``
    gets :func:`evaluators.peer_steps.peer_step` before each call (see :func:`compile_ahead`);
    ``excluded`` ({peer: {shape label: why}}) names calls not to make."""
    import torch

    from evaluators.peer_steps import EVERY_SHAPE, peer_step
    from kernels.peer import as_peer, call_once
    from kernels.spec import shape_label

    outcome: dict[str, str] = {}
    if step_file is not None:
        step_file.write_text("")  # a step of an earlier process is not this one's
    for shape in spec.shapes(shape_set):
        inputs = _inputs_or_why(spec, shape, dtype, device)
        label = shape_label(shape)
        for name, fn in spec.peers.items():
            if outcome.get(name, "ok") != "ok" or isinstance(inputs, str):
                continue  # failed before, or no inputs for this shape (the loop reports it)
            left_out = (excluded or {}).get(name, {})
            if label in left_out or EVERY_SHAPE in left_out:
                continue
            if step_file is not None:
                # A plain write: it outlives this process's death in the call (the kernel has it).
                step_file.write_text(peer_step(name, label))
            try:
                with sharing_the_gpu(lock) if lock else contextlib.nullcontext():
                    call_once(as_peer(fn), {k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
                    if device == "cuda":
                        torch.cuda.synchronize()
                outcome[name] = "ok"
            except Exception as exc:
                outcome[name] = f"{type(exc).__name__}: {exc}"[:300]
        del inputs
        _give_back_memory(device)
    if step_file is not None:
        step_file.write_text("")  # past every call: an end after this one is no peer's
    return outcome


def _give_back_memory(device: str) -> None:
    """Hands the caching allocator's free blocks back to the device after each shape: these
    processes run beside the search's evaluator (a held-out shape's inputs take gigabytes), and
    what they keep cached it would find missing."""
    import torch

    if device == "cuda":
        torch.cuda.empty_cache()


def compile_ahead(kernel: KernelRef | str, dtype: str, shape_set: str, cache_dir: str | Path, lock: str | Path,
                  timeout_s: float = 900.0, modes: Sequence[str] | None = None, device: str = "cuda",
                  benchmark_lock: str | Path | None = None, nice: int = 0) -> dict[str, Any]:
    """Runs :func:`compile_kernel` in a process of its own (fresh torch, no compilation of this
    process's in it) and, at the same time, the kernel's other peers' first calls
    (:func:`first_calls`) in another; returns the compilations' report with the first calls'
    outcome, or ``{"status": "ERROR", "summary": why}``. The first calls hold ``lock``
    shared and the autotuning benchmarks hold ``benchmark_lock`` (default: ``lock``) alone.
    ``nice``: both processes (and what they start: Triton's and FlashInfer's compilers) run
    that much below this one's CPU priority; the report's ``nice`` says at which niceness.

    A library call that ends the first calls' process (a segfault on a size the library was
    not built for) costs neither the compilations, made apart, nor their time: the first calls
    run again without it (:func:`_first_calls`) while the compilations go on, and the report's
    ``peer_crashes`` ({peer: {shape label: why}}) names those calls (``first_calls_crashed``:
    how the first process ended)."""
    folder = str(kernel.resolve()) if isinstance(kernel, KernelRef) else str(kernel)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "evaluators.peer_compile", folder, "--cache-dir", str(cache_dir), "--lock", str(lock),
           "--dtype", dtype, "--shapes", shape_set, "--device", device, *(["--nice", str(nice)] if nice else [])]
    # TORCHINDUCTOR_COMPILE_THREADS as in the sandbox worker; faulthandler so that a process
    # killed by a signal (a segfault in a library) says in which Python frames.
    # Its ninja takes turns per build folder (evaluators.ninja_turns).
    env = ninja_environment({**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONFAULTHANDLER": "1"})
    deadline = time.monotonic() + timeout_s
    calls: dict[str, Any] = {}
    beside = threading.Thread(target=lambda: calls.update(_first_calls(cmd, env, Path(cache_dir), deadline)),
                              name="first-calls", daemon=True)
    beside.start()
    # A group of its own: a timeout also ends what it started (FlashInfer's ninja and nvcc).
    rc, out, err = run_group([*cmd, *(["--modes", *modes] if modes else []),
                              *(["--benchmark-lock", str(benchmark_lock)] if benchmark_lock else [])],
                             env=env, cwd=Path(__file__).resolve().parent.parent, timeout_s=timeout_s)
    beside.join(max(0.0, deadline - time.monotonic()) + 5.0)
    if rc is None:
        return {"status": "ERROR", "summary": f"compile-ahead of {folder} passed {timeout_s:.0f} s"}
    # The report file, not the last line of stdout: a library the process imported may print
    # after it (a log line at exit), and the compilations would then be thrown away for nothing.
    try:
        report = json.loads((Path(cache_dir) / REPORT).read_text())
    except (OSError, ValueError):
        report = None
    if report is None:
        why = f"rc {rc}: {crash_summary(err)}" if rc != 0 else f"no report in {cache_dir}: {out.strip()[-300:]}"
        return {"status": "ERROR", "summary": why}
    if rc != 0:  # the compilations were made and kept; what came after them killed the process
        report["crashed"] = f"rc {rc} after the compilations: {crash_summary(err)}"
    outcome = calls.get("outcome")
    report["first_calls"] = outcome if outcome is not None else {
        "error": calls.get("why") or calls.get("crashed") or "the first calls did not end in time"}
    if calls.get("crashed"):
        report["first_calls_crashed"] = calls["crashed"]
    if calls.get("excluded"):
        report["peer_crashes"] = calls["excluded"]
    return {"status": "OK", **report}


def _first_calls(cmd: list[str], env: dict[str, str], cache_dir: Path, deadline: float) -> dict[str, Any]:
    """The first calls in a process of their own (:func:`first_calls_only`). Where one ends
    its process inside a peer's call (its :data:`STEP` names the peer and the shape), they run
    again in a fresh process that leaves out every call that ended one before, until one gets
    through; past :data:`evaluators.peer_steps.PEER_EXCLUSIONS` re-runs, each such peer is
    left out on every shape for one last run. Returns ``outcome`` (the first calls' outcome
    of the process that got through, if one did), ``excluded`` (what the last run left out:
    {peer: {shape label or :data:`evaluators.peer_steps.EVERY_SHAPE`: why}}) and ``crashed``
    (how the first process that died ended). The end-of-run loops leave those peers out there
    from the start (their ``exclude_peers``): found here, beside the search, a library that
    ends its process on some sizes does not end each loop's process, one size at a time."""
    from evaluators.peer_steps import EVERY_SHAPE, PEER_EXCLUSIONS, parse_peer_step

    crashes: dict[str, dict[str, str]] = {}
    excluded: dict[str, dict[str, str]] = {}
    first_crash = ""
    for reruns in range(PEER_EXCLUSIONS + 2):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        rc, _out, err = run_group([*cmd, "--first-calls-only", "--exclude", json.dumps(excluded)], env=env,
                                  cwd=Path(__file__).resolve().parent.parent, timeout_s=left)
        if rc == 0:
            try:
                outcome = dict(json.loads((cache_dir / FIRST_CALLS).read_text())["first_calls"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                return {"outcome": None, "excluded": excluded, "crashed": first_crash,
                        "why": f"no report of the first calls: {type(exc).__name__}: {exc}"[:300]}
            return {"outcome": outcome, "excluded": excluded, "crashed": first_crash}
        if rc is None:
            return {"outcome": None, "excluded": excluded, "crashed": first_crash,
                    "why": "the first calls passed the compile-ahead's time"}
        ended = f"rc {rc}: {crash_summary(err)}"
        first_crash = first_crash or ended
        try:
            culprit = parse_peer_step((cache_dir / STEP).read_text())
        except OSError:
            culprit = None
        if culprit is None or culprit[1] in crashes.get(culprit[0], {}) or reruns > PEER_EXCLUSIONS:
            break  # it died outside a peer's call (or where it was told not to call): nothing to leave out
        name, label = culprit
        crashes.setdefault(name, {})[label] = f"its first call ended a compile-ahead process ({ended}); not timed here"
        excluded = crashes if reruns < PEER_EXCLUSIONS else {
            peer: {EVERY_SHAPE: f"its first calls ended compile-ahead processes on {', '.join(shapes)}; not timed "
                                f"on any shape (more than {PEER_EXCLUSIONS} re-runs)"}
            for peer, shapes in crashes.items()}
    return {"outcome": None, "excluded": excluded, "crashed": first_crash}


def crash_summary(err: str, width: int = 500) -> str:
    """What a child's stderr tells of its end: from faulthandler's dump (a fatal signal), the
    signal and the innermost frames of the thread it hit ("Current thread", most recent call
    first; the dump lists the other threads too); else the stderr's tail."""
    err = err.strip()
    at = err.find("Fatal Python error")
    if at < 0:
        return err[-width:]
    signal = err[at:].splitlines()[0]
    current = err.find("Current thread", at)
    return f"{signal}; {err[current:] if current >= 0 else err[at:]}"[:width]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Compile a kernel's torch.compile program ahead of a peers' loop.")
    p.add_argument("kernel", help="library kernel name or kernel folder")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--lock", required=True, help="file lock shared by every compile-ahead process of a GPU")
    p.add_argument("--benchmark-lock", help="file lock the autotuning benchmarks hold alone (default: --lock)")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--shapes", default="search", choices=("search", "heldout"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--modes", nargs="+", help="torch.compile modes (default: evaluators.peers.COMPILE_MODES)")
    p.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much first")
    p.add_argument("--first-calls-only", action="store_true",
                   help="the other peers' first calls instead of the compilations")
    p.add_argument("--exclude", default="{}", help='first calls not to make: {"peer": {"shape label": "why"}}')
    args = p.parse_args(argv)
    if args.nice:
        os.nice(args.nice)  # inherited by every process it starts (ninja, nvcc, Triton's ptxas)
    if args.first_calls_only:
        print(json.dumps(first_calls_only(args.kernel, args.dtype, args.shapes, args.cache_dir, args.device,
                                          args.lock, json.loads(args.exclude))), flush=True)
        return 0
    install_benchmark_turns(args.benchmark_lock or args.lock)
    report = compile_kernel(args.kernel, args.dtype, args.shapes, args.cache_dir, args.modes, device=args.device)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
