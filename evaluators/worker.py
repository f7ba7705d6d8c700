"""The sandbox worker: a child process that owns a CUDA context and runs untrusted kernels.

It receives jobs over a pipe from :class:`evaluators.gpu.GpuEvaluator`, sends a heartbeat
after every step (so the parent's watchdog can tell a hang from slow work) and answers with
a plain dict. A CUDA fault poisons the context, so after reporting one the worker exits and
the parent starts a fresh one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import traceback
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

import torch

from evaluators import validate as V
from evaluators.context import (
    Beat,
    Context,
    Verdict,
    is_cuda_fault,
    is_out_of_memory,
    roofline_finding,
    tolerances,
    torch_dtype,
)
from evaluators.gpu_turns import turns
from evaluators.launcher import Kernel, LaunchResourceError
from evaluators.ours import OursOnShape
from evaluators.peers import run_peers, run_round
from evaluators.timing import l2_finding, l2_persistence, time_interleaved
from evaluators.verify import TIMED_OUTPUT_GUARD, Buffers, DriftProbe, RepInputs
from kernels.launch import LaunchLimitError
from kernels.spec import KernelSpec, Shape, shape_label
from kernels.verdict import ShapeResult, Status, geomean

# Candidate launches checked against the baseline's timed launch of the same repetition
# (OursOnShape.paired) rather than a baseline run of the checker's own after each of them
# (OursOnShape.timed): the same check; False only for experiments.eval_profile's comparison.
CHECK_AGAINST_TIMED_BASELINE = True
DRIFT_PROBES_PER_LOOP = 3  # re-runs of the validated inputs inside each timing loop, at random launches


def _launch(kernel: Kernel, label: str, tensors: Mapping[str, torch.Tensor], shape: Shape) -> None:
    kernel.launch(label, kernel.args(tensors, shape))


def _run_twice(
    spec: KernelSpec,
    kernel: Kernel,
    label: str,
    shape: Shape,
    inputs: dict[str, torch.Tensor],
    pristine: dict[str, torch.Tensor],
    in_names: list[str],
    ctx_msg: str,
) -> list[dict[str, torch.Tensor]]:
    """Two launches with different output poisons; returns the outputs of both."""
    outs = []
    for which in (0, 1):
        for a in spec.written_args:
            if a.role == "out":
                V.poison_(inputs[a.name], which)
            else:
                inputs[a.name].copy_(pristine[a.name])
        _launch(kernel, label, inputs, shape)
        torch.cuda.synchronize()
        finding = V.check_inputs_unchanged(inputs, pristine, in_names, ctx_msg)
        if finding:
            raise Verdict(Status.REJECTED, finding.message, finding.kind)
        outs.append({a.name: inputs[a.name].clone() for a in spec.written_args})
    return outs


def _validate_case(
    ctx: Context,
    spec: KernelSpec,
    job: dict[str, Any],
    shape: Shape,
    case: str,
    seed: int,
    cand: Kernel,
    base: Kernel,
) -> tuple[Buffers, Buffers]:
    """Validates the candidate on one input case; returns the inputs (before any launch) and
    the candidate's outputs on them."""
    dtype = job["dtype"]
    label = shape_label(shape)
    where = f"(shape {label}, {dtype}, case {case}, seed {seed})"
    gen = torch.Generator(device=ctx.device).manual_seed(seed)
    inputs = spec.make_inputs(shape, torch_dtype(dtype), gen, case, ctx.device)
    pristine = {k: v.clone() for k, v in inputs.items()}
    expected = spec.reference({k: v.clone() for k, v in inputs.items()}, shape, spec.constants)
    in_names = [a.name for a in spec.args if a.kind == "tensor" and a.role == "in"]
    outs = _run_twice(spec, cand, label, shape, inputs, pristine, in_names, where)
    for a in spec.written_args:
        if a.role == "out":
            finding = V.unwritten(a.name, outs[0][a.name], outs[1][a.name], where)
            if finding:
                raise Verdict.rejected(finding)
    finding = V.check_outputs(outs[0], expected, tolerances(spec, dtype), spec.compare, where)
    if finding:
        raise Verdict(Status.INCORRECT, finding.message)
    for name in outs[0]:
        if not V.bitwise_equal(outs[0][name], outs[1][name]):
            raise Verdict(
                Status.REJECTED,
                f"{name}: two launches on the same inputs gave different bits {where} (race?)",
                "nondeterminism",
            )
    if base is not cand:
        base_outs = _run_twice(spec, base, label, shape, inputs, pristine, in_names, where)
        finding = V.check_outputs(outs[0], base_outs[0], tolerances(spec, dtype, 2.0), spec.compare,
                                  where + " vs baseline")
        if finding:
            raise Verdict(Status.INCORRECT, "differs from the baseline: " + finding.message)
    return pristine, outs[0]


def _rep_inputs(ctx: Context, spec: KernelSpec, shape: Shape, dtype: str, launches: int) -> RepInputs:
    sets = []
    for k in (0, 1):
        gen = torch.Generator(device=ctx.device).manual_seed(10_000 + k)
        sets.append(spec.make_inputs(shape, torch_dtype(dtype), gen, "random", ctx.device))
    plan_gen = torch.Generator(device=ctx.device).manual_seed(random.randint(0, 2**31))
    return RepInputs(spec, sets, launches, plan_gen)


def _prober(probe: DriftProbe, label: str, warmup: int, probe_at: set[int]) -> Callable[[int, list[str]], None]:
    """After a few repetitions: the validated inputs re-run (outside every window)."""

    def after(i: int, launched: list[str]) -> None:
        if i - warmup in probe_at:
            probe.probe(label, f"inside its timing loop, after timed launch {i - warmup + 1}")

    return after


def _time_shape(
    ctx: Context, spec: KernelSpec, job: dict[str, Any], shape: Shape, cand: Kernel, base: Kernel,
    probe: DriftProbe | None,
) -> tuple[ShapeResult, float | None, bool]:
    """Interleaved timing on inputs that change every launch, set up exactly as in the peers'
    loop (:class:`evaluators.ours.OursOnShape`: one working set, every timed launch of the
    candidate verified against the baseline run on the same inputs)."""
    dtype, label, timing = job["dtype"], shape_label(shape), job["timing"]
    warmup, reps = timing["warmup"], timing["repetitions"]
    inputs = _rep_inputs(ctx, spec, shape, dtype, warmup + reps)
    work = inputs.buffer()
    ctx.flush.cover(work.values())  # every flush takes the working set out of the L2, whatever its priority
    ours = OursOnShape(ctx, spec, shape, dtype, warmup, reps, inputs, work, base)
    if probe is not None and CHECK_AGAINST_TIMED_BASELINE:
        # The candidate is not the baseline's binary: verify it against the baseline's timed
        # launch of the same repetition.
        baseline, candidate = ours.paired(("baseline", base), ("candidate", cand))
    else:  # the baseline itself as the candidate; or the oracle re-run after every launch
        baseline = ours.timed("baseline", base, verify=False)
        candidate = ours.timed("candidate", cand, verify=probe is not None)
    after = None
    if probe is not None:
        probe_at = set(random.sample(range(reps), min(DRIFT_PROBES_PER_LOOP, reps)))
        after = _prober(probe, label, warmup, probe_at)
    cutoff = None
    best = job.get("best_ms", {}).get(label)
    if timing.get("cutoff") and best:
        cutoff = {"candidate": timing["cutoff"] * best}
    samples = time_interleaved([baseline, candidate], ctx.flush, warmup, reps, cutoff, after_rep=after)
    failed = ours.failures(samples).get("candidate")
    if failed is not None:
        kind, finding = failed
        if kind == TIMED_OUTPUT_GUARD:
            raise Verdict(
                Status.REJECTED,
                "a timed launch gave a wrong result although validation passed (results cached, replayed, or "
                "computed differently when launched repeatedly): " + finding.message,
                TIMED_OUTPUT_GUARD,
            )
    c, b = samples["candidate"], samples["baseline"]
    roofline = roofline_finding(spec, shape, dtype, c.median_ms, ctx.copy_bw)
    if roofline:
        raise Verdict.rejected(roofline)
    nbytes = int(spec.bytes_moved(shape, dtype))
    result = ShapeResult(
        shape=dict(shape),
        candidate_ms=c.median_ms,
        baseline_ms=b.median_ms,
        candidate_iqr_ms=c.iqr_ms,
        baseline_iqr_ms=b.iqr_ms,
        bytes_moved=nbytes,
        repetitions=len(c.times_ms),
        copy_bw_fraction=nbytes / (c.median_ms * 1e-3) / ctx.copy_bw,
        roofline_ms=nbytes / ctx.copy_bw * 1e3,
    )
    aa = None
    if job.get("noise_floor"):
        pair = [ours.timed(name, base, verify=False) for name in ("A", "B")]
        ab = time_interleaved(pair, ctx.flush, warmup, reps)
        aa = ab["A"].median_ms / ab["B"].median_ms
    return result, aa, c.cut


def _drift_probe(spec: KernelSpec, cand: Kernel) -> DriftProbe:
    outputs = [a.name for a in spec.args if a.kind == "tensor" and a.role == "out"]
    return DriftProbe(lambda label, shape, buf: _launch(cand, label, buf, shape),
                      [a.name for a in spec.written_args], outputs)


def _raise_drift(probe: DriftProbe | None) -> None:
    finding = probe.finding() if probe is not None else None
    if finding:
        raise Verdict.rejected(finding)


def run_evaluate(ctx: Context, job: dict[str, Any], beat: Beat) -> dict[str, Any]:
    """Validates then times one candidate against the baseline on every shape."""
    spec = ctx.spec(job["kernel_dir"])
    shapes = job["shapes"]
    cand = ctx.kernel(spec, job["candidate"], shapes)
    base = cand if job.get("same_as_baseline") else ctx.kernel(spec, job["baseline"], shapes)
    # The baseline's binary needs no verification against itself.
    probe = None if base is cand else _drift_probe(spec, cand)
    result: dict[str, Any] = {"attributes": cand.attributes(), "shapes": [], "extra": {}}
    cases = [("random", s) for s in job["seeds"]] + [(c, job["seeds"][0]) for c in spec.edge_cases]
    for shape in shapes:
        for k, (case, seed) in enumerate(cases):
            inputs, outputs = _validate_case(ctx, spec, job, shape, case, seed, cand, base)
            # Huge shapes (2^31 elements) are left out: a kept copy would cost gigabytes.
            if k == 0 and probe is not None and not spec.is_huge(shape):
                probe.add(shape_label(shape), shape, inputs, outputs)
            # One beat per case: a 2^31-element shape's cases take seconds each.
            beat(f"validated {shape_label(shape)} case {case}")
    if probe is not None:
        probe.probe_all("after every shape was validated")
    if not job.get("time", True):
        _raise_drift(probe)
        return result
    ratios, cut = [], []
    l2 = l2_persistence(torch.cuda.current_stream().cuda_stream)
    result["extra"]["l2_persistence"] = l2
    if l2_finding(l2):
        result["extra"]["l2_finding"] = l2_finding(l2)
    for shape in shapes:
        shape_result, aa, was_cut = _time_shape(ctx, spec, job, shape, cand, base, probe)
        result["shapes"].append(shape_result.to_dict())
        if aa is not None:
            ratios.append(aa)
        if was_cut:
            cut.append(shape_label(shape))
        beat(f"timed {shape_label(shape)}")
    if probe is not None:
        probe.probe_all("after every shape was timed")
    _raise_drift(probe)
    if ratios:
        result["noise_floor"] = geomean(ratios)
    if cut:
        result["extra"]["cut_shapes"] = cut
    return result


def handle(ctx: Context, job: dict[str, Any], beat: Beat) -> tuple[dict[str, Any], bool]:
    """Runs one job; returns (reply, fatal). Fatal means the CUDA context is unusable.

    Every failure of a variant is a verdict: a guard's (REJECTED, INCORRECT), resources the
    device cannot give (RESOURCE_ERROR: launch limits, a binary the driver refuses, device
    memory running out) or a CUDA fault (CRASH, fatal). INTERNAL is left for our own bugs.
    """
    try:
        if job["type"] == "evaluate":
            reply = run_evaluate(ctx, job, beat)
        elif job["type"] == "peers":
            reply = run_peers(ctx, job, beat)
        elif job["type"] == "peers_round":
            reply = run_round(ctx, job, beat)
        else:
            raise ValueError(f"unknown job type {job['type']!r}")
        reply.setdefault("status", Status.OK.value)
        return reply, False
    except Verdict as v:
        return {"status": v.status.value, "message": v.message, "guard": v.guard}, False
    except (LaunchResourceError, LaunchLimitError) as exc:
        return {"status": Status.RESOURCE_ERROR.value, "message": str(exc)}, False
    except Exception as exc:  # classified below: CUDA faults are verdicts, our bugs are not
        text = f"{type(exc).__name__}: {exc}"
        if is_out_of_memory(exc):
            torch.cuda.empty_cache()
            return {"status": Status.RESOURCE_ERROR.value, "message": f"device memory ran out: {text}"[:2000]}, False
        if is_cuda_fault(exc):
            return {"status": Status.CRASH.value, "message": f"CUDA fault: {text}", "fatal": True}, True
        return {"status": "INTERNAL", "message": text, "traceback": traceback.format_exc()}, False


def serve(conn: Any, device: int, gpu_turns: str | None = None, job_lock: str | None = None) -> None:
    """Main loop of the worker process. ``gpu_turns``: the GPU's lock this process takes part
    in (:mod:`evaluators.gpu_turns`), shared from before its CUDA context exists to its end,
    alone while it times (a round of end-of-run loops beside other rounds' set-ups).
    ``job_lock``: a lock this process holds alone through every job (the pool's evaluator:
    the autotuning benchmarks of compilations made beside the search take the same lock
    alone, so neither times beside the other)."""
    if gpu_turns:
        from evaluators.gpu_turns import benchmark_lock_path, take_part
        from evaluators.peer_compile import install_benchmark_turns

        take_part(gpu_turns)
        # Autotuning in the set-up (a compilation its compile-ahead folder lacked, or Inductor's
        # coordinate-descent tuning on loading one) benchmarks one process at a time and never
        # beside a sanitizer run; it needs no timed pass to wait, none runs during a set-up.
        install_benchmark_turns(benchmark_lock_path(gpu_turns))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    ctx = Context(device)
    conn.send(("ready", ctx.info))

    def beat(msg: str) -> None:
        conn.send(("beat", msg))

    def waiting() -> None:
        beat("waiting for a benchmark beside the search to end")

    hold = turns(job_lock) if job_lock else None
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        # first: the compilations' benchmarks waiting for the lock let this job in ahead of them
        with hold.alone(waiting, every_s=5.0, first=True) if hold is not None else contextlib.nullcontext():
            reply, fatal = handle(ctx, job, beat)
        conn.send(("result", reply))
        if fatal:
            conn.close()
            os._exit(3)  # the context is poisoned: the parent starts a new worker
        release_cached_memory()


RELEASE_ABOVE_BYTES = 8 << 30


def release_cached_memory() -> None:
    """Gives the caching allocator's free blocks back to the device once they pass
    ``RELEASE_ABOVE_BYTES``: a 2^31-element shape leaves tens of GB cached in this process,
    which the sanitizer's processes, the peers' compiles or another evaluator on the same GPU
    would then find missing (seen on the H200 as out-of-memory verdicts of honest kernels)."""
    if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > RELEASE_ABOVE_BYTES:
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    """Entry of the worker process that :class:`evaluators.gpu.GpuEvaluator` starts: serves
    jobs over the socket inherited as ``--fd`` on CUDA device ``--device``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the inherited socket's file descriptor")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index as this process sees it")
    parser.add_argument("--gpu-turns", help="the GPU's lock file this process shares, and holds alone to time")
    parser.add_argument("--job-lock", help="a lock file this process holds alone through every job")
    parser.add_argument("--nice", type=int, default=0, help="CPU niceness added to this process's")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    serve(Connection(args.fd), args.device, args.gpu_turns, args.job_lock)


if __name__ == "__main__":
    main()
