"""Verification of every timed launch, and of results across time.

A timing loop (:func:`evaluators.timing.time_interleaved`) launches each implementation many
times; a kernel that counts its launches could be exact whenever it expects to be checked and
skip work in between. So no timed launch goes unchecked, and no launch looks different from
another:

- **Inputs** (:class:`RepInputs`): before every launch the inputs are restored from one of
  two input sets and a few elements, different ones every launch, are overwritten with
  values taken from elsewhere in the same tensor; outputs are filled, launch by launch at
  random, with NaN, a finite sentinel or stale values of the output's own kind (what a real
  buffer holds between two calls), so a kernel that writes only where it sees a poison, or
  behaves differently when it sees none, is wrong or faults on some timed launch. The plan of
  perturbations and fills is drawn once per shape, so every implementation of one repetition, and the
  oracle below, get bit-identical inputs, and no cache keyed on pointers or sampled content
  ever sees a repeated input.
- **Expected outputs** (:class:`TimedOutputCheck`): every timed launch's outputs must lie
  within twice the dtype tolerance of our baseline's outputs on the same inputs, as in
  validation's comparison with the baseline. The baseline is trusted (validated against the
  fp32 reference) and reads and writes the same bytes as the candidate: in the evaluator it
  is timed in the same loop on the same inputs, so its output of the repetition is compared
  at the end of the repetition (:meth:`TimedOutputCheck.compare`) at no extra launch; in the
  peers' loop, where every implementation shares one working set, the checker restores the
  launch's inputs into a buffer of its own and runs the baseline there right after the
  candidate's end event (:meth:`TimedOutputCheck.check`). The fp32 torch reference would
  cost several fp32 passes over the data per launch. The comparison runs on the device into
  a row of statistics per repetition, outside the measured windows, so nothing synchronises
  inside the loop; specs with a host-side ``compare`` hook (sets, permutations) synchronise
  once per repetition instead, still outside the windows. Why not a handful of pre-computed
  input variants compared bit for bit: a kernel could hold that many results and replay
  them by content.
- **Time** (:class:`DriftProbe`): candidates must be deterministic. Two launches back to back
  agree even for a kernel whose summation order follows the clock; so the candidate is
  re-run on its first validation inputs at moments spread over the whole evaluation (inside
  the timing loops, outside their windows, and after them) and its outputs must keep the
  validated bits.

Not covered: a candidate that writes outside its own arguments into the checker's buffers in
the same CUDA context (the baseline's kept outputs, the statistics rows read once at the end)
could hide a wrong launch. compute-sanitizer's memcheck, run on every winner, flags accesses
outside any allocation, not writes into another live one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from evaluators import validate as V
from kernels.spec import KernelSpec

Buffers = dict[str, torch.Tensor]
# The guard of a timed launch whose output is wrong: the name it has had since only the last
# timed launch was checked (for replayed results); every timed launch is checked now.
TIMED_OUTPUT_GUARD = "replay"
PERTURBED_ELEMENTS = 8  # per perturbed tensor and launch
STALE = 2  # the output fill that holds stale values (0 and 1 are validate.poison_'s poisons)


def _stale_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """Values such as a buffer holds from an earlier call: finite, of the output's kind, and
    (with overwhelming probability) nowhere equal to what a launch must write. None for
    booleans, whose two poisons already cover every value."""
    if t.dtype == torch.bool:
        return None
    if t.dtype.is_floating_point:
        return torch.randn(t.shape, generator=gen, device=t.device).mul_(4.0).to(t.dtype)
    low, high = max(torch.iinfo(t.dtype).min, -(2**31)), min(torch.iinfo(t.dtype).max, 2**31 - 1)
    return torch.randint(low, high, t.shape, generator=gen, device=t.device, dtype=torch.int64).to(t.dtype)


def _perturbation_plan(numel: int, launches: int, count: int, gen: torch.Generator,
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per launch, ``count`` distinct destinations (one in each ``numel / count`` stretch, so
    the copy is deterministic) and ``count`` random sources."""
    count = min(count, numel)
    step = numel // count
    offsets = torch.randint(0, step, (launches, count), generator=gen, device=device)
    dst = offsets + torch.arange(count, device=device) * step
    src = torch.randint(0, numel, (launches, count), generator=gen, device=device)
    return dst, src


class RepInputs:
    """What every launch i of a timing loop reads: input set ``i % 2`` with launch i's own
    perturbation, and outputs filled with launch i's fill (NaN, sentinel or stale values).

    Args:
        spec: the kernel.
        sets: two input sets of one shape (as ``spec.make_inputs`` makes them).
        launches: how many launch indices the plan covers (warm-ups and repetitions).
        gen: generator for the perturbation plan (seeded at random by the caller).
    """

    def __init__(self, spec: KernelSpec, sets: Sequence[Buffers], launches: int, gen: torch.Generator) -> None:
        self.sets = list(sets)
        self.launches = launches
        self.readable = [a.name for a in spec.read_args]
        self.outputs = [a.name for a in spec.args if a.kind == "tensor" and a.role == "out"]
        self.written = [a.name for a in spec.written_args]
        first = self.sets[0]
        # Floats only: integer tensors are indices (slot maps, expert ids) whose values carry a
        # contract; fp8 has too few values for a copied element to change much. A float input
        # whose values carry a contract too is marked so in the spec (Arg.perturb).
        kept = {a.name for a in spec.args if not a.perturb}
        perturbed = [n for n in self.readable if n not in kept and first[n].dtype.is_floating_point
                     and first[n].dtype.itemsize > 1 and first[n].numel() >= 2]
        self.plan = {n: _perturbation_plan(first[n].numel(), launches, PERTURBED_ELEMENTS, gen, first[n].device)
                     for n in perturbed}
        self.stale = {n: _stale_like(first[n], gen) for n in self.outputs}
        device = first[self.written[0]].device
        self.fills = torch.randint(0, STALE + 1, (launches,), generator=gen, device=device).tolist()

    def buffer(self) -> Buffers:
        """A fresh working set (a copy of input set 0, at addresses of its own)."""
        return {n: t.clone() for n, t in self.sets[0].items()}

    def restore(self, buf: Buffers, i: int) -> None:
        """Makes ``buf`` hold launch i's inputs and filled outputs (queued, no synchronisation)."""
        source = self.sets[i % 2]
        for n in self.readable:
            buf[n].copy_(source[n])
        for n, (dst, src) in self.plan.items():
            flat = buf[n].view(-1)
            flat.index_copy_(0, dst[i], flat.index_select(0, src[i]))
        fill = self.fills[i]
        for n in self.outputs:
            stale = self.stale[n]
            if fill == STALE and stale is not None:
                buf[n].copy_(stale)
            else:
                V.poison_(buf[n], fill % STALE)


@dataclass(frozen=True)
class _HostFinding:
    rep: int
    finding: V.Finding


class TimedOutputCheck:
    """Checks the outputs of every timed launch of one implementation against expected
    outputs computed on the same launch's inputs: by an oracle run in a buffer of the
    checker's own (:meth:`check`), or by a trusted implementation timed in the same loop
    (:meth:`compare`).

    Args:
        inputs: the loop's input plan.
        oracle: computes the expected outputs in place in the buffer it is given (for
            :meth:`check`; None when only :meth:`compare` is used).
        tolerance: (rtol, atol) per written argument.
        compare_hook: the spec's host-side ``compare``, if any.
        warmup: launches before the first timed one (launch index = warmup + repetition).
        repetitions: timed launches.
        context: appended to the message (shape, dtype).
    """

    def __init__(self, inputs: RepInputs, oracle: Callable[[Buffers], None] | None,
                 tolerance: Mapping[str, tuple[float, float]], compare_hook: Callable[..., str | None] | None,
                 warmup: int, repetitions: int, context: str = "") -> None:
        self.inputs, self.oracle, self.tolerance = inputs, oracle, dict(tolerance)
        self.compare_hook, self.warmup, self.repetitions, self.context = compare_hook, warmup, repetitions, context
        first = inputs.sets[0][inputs.written[0]]
        self.expected = inputs.buffer() if oracle is not None else {}
        self.stats = torch.zeros((repetitions, len(inputs.written), 4), dtype=torch.float64, device=first.device)
        self.checked = 0
        self.host: _HostFinding | None = None

    def check(self, i: int, got: Buffers) -> None:
        """Verifies timed launch i, whose outputs are in ``got``, against the oracle run on the
        same inputs; call right after its end event is recorded."""
        assert self.oracle is not None, "check() needs an oracle; compare() takes expected outputs"
        self.inputs.restore(self.expected, i)
        self.oracle(self.expected)
        self.compare(i, got, self.expected)

    def compare(self, i: int, got: Buffers, expected: Buffers) -> None:
        """Verifies timed launch i against ``expected``, outputs of the same launch index's
        inputs (queued on the device; with a host ``compare`` hook, checked at once)."""
        rep = i - self.warmup
        self.checked += 1
        if self.compare_hook is not None:
            if self.host is None:
                written = {n: got[n] for n in self.inputs.written}
                finding = V.check_outputs(written, expected, self.tolerance, self.compare_hook, self._where(rep))
                if finding:
                    self.host = _HostFinding(rep, finding)
            return
        for j, name in enumerate(self.inputs.written):
            rtol, atol = self.tolerance[name]
            V.mismatch_stats_into(self.stats[rep, j], got[name], expected[name], rtol, atol)

    def _where(self, rep: int) -> str:
        return f"on timed launch {rep + 1} of {self.repetitions} {self.context}".rstrip()

    def finding(self) -> V.Finding | None:
        """The first repetition whose outputs were wrong (synchronises once), or None."""
        if self.host is not None:
            return self.host.finding
        if self.compare_hook is not None or self.checked == 0:
            return None
        stats = self.stats.cpu()
        bad = (stats[:, :, 0] > 0).nonzero()
        if bad.numel() == 0:
            return None
        rep, j = int(bad[0, 0]), int(bad[0, 1])
        n_bad, flat, got, expected = (float(v) for v in stats[rep, j])
        name = self.inputs.written[j]
        rtol, atol = self.tolerance[name]
        shape = tuple(self.inputs.sets[0][name].shape)
        return V.mismatch_finding(name, shape, int(flat), got, expected, int(n_bad), rtol, atol, self._where(rep))


@dataclass
class _Case:
    shape: Mapping[str, int]
    inputs: Buffers  # pristine inputs (outputs poisoned as in validation)
    outputs: Buffers  # the validated bits of every written argument
    recorded_s: float
    work: Buffers


@dataclass
class _Probe:
    label: str
    when: str
    gap_s: float
    differing: list[tuple[str, torch.Tensor]]  # bytes that differ, per written argument (on the device)


class DriftProbe:
    """Re-runs the candidate on fixed inputs at moments spread over an evaluation and keeps
    the number of output bytes that differ from the validated bits (compared on the device).

    Args:
        launch: runs the candidate on buffers of a shape (label, shape, buffers).
        written: the written arguments.
        outputs: the out-only arguments (poisoned before every run, as in validation).
        clock: seconds (for the message).
    """

    def __init__(self, launch: Callable[[str, Mapping[str, int], Buffers], None], written: Sequence[str], outputs: Sequence[str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.launch, self.written, self.outputs, self.clock = launch, list(written), list(outputs), clock
        self.cases: dict[str, _Case] = {}
        self.probes: list[_Probe] = []

    def add(self, label: str, shape: Mapping[str, int], inputs: Buffers, outputs: Buffers) -> None:
        """Keeps validated inputs (before the launch) and the outputs the candidate gave on them."""
        kept = {n: t.clone() for n, t in inputs.items()}
        for n in self.outputs:
            V.poison_(kept[n], 0)
        self.cases[label] = _Case(dict(shape), kept, {n: outputs[n].clone() for n in self.written}, self.clock(),
                                  {n: t.clone() for n, t in kept.items()})

    def probe(self, label: str, when: str) -> None:
        """Re-runs the candidate on ``label``'s validated inputs (queued, no synchronisation)."""
        case = self.cases.get(label)
        if case is None:
            return
        for n, t in case.inputs.items():
            case.work[n].copy_(t)
        self.launch(label, case.shape, case.work)
        differing = [(n, _differing_bytes(case.work[n], case.outputs[n])) for n in self.written]
        self.probes.append(_Probe(label, when, self.clock() - case.recorded_s, differing))

    def probe_all(self, when: str) -> None:
        for label in list(self.cases):
            self.probe(label, when)

    def finding(self) -> V.Finding | None:
        """The first probe whose bits differ from the validated ones (synchronises once)."""
        for p in self.probes:
            for name, count in p.differing:
                n = int(count)
                if n:
                    return V.Finding(
                        "nondeterminism",
                        f"{name}: the same inputs gave other bits about {p.gap_s * 1e3:.0f} ms after validation "
                        f"({n} bytes differ; shape {p.label}, re-run {p.when}): results must not depend on the "
                        "time or on earlier launches",
                    )
        return None


def _differing_bytes(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.reshape(-1).view(torch.uint8) != b.reshape(-1).view(torch.uint8)).sum()
