"""CPU tests of the timed-launch verification (evaluators.verify): inputs per launch, the
oracle check of every timed launch, and the probe of results across time. The kernels are
torch functions on CPU tensors; the GPU tests run the same objects inside the worker."""

from __future__ import annotations

import pytest
import torch

from evaluators import validate as V
from evaluators.verify import PERTURBED_ELEMENTS, Buffers, DriftProbe, RepInputs, TimedOutputCheck
from kernels.spec import load_kernel

SHAPE = {"num_tokens": 8, "d": 64}
WARMUP, REPS = 3, 10


def _silu_into(buf: Buffers) -> None:
    """silu_and_mul in fp32, rounded once (the role of the baseline kernel)."""
    x = buf["x"].float()
    d = SHAPE["d"]
    buf["out"].copy_(torch.nn.functional.silu(x[:, :d]) * x[:, d:])


@pytest.fixture
def silu():
    return load_kernel("silu_and_mul")


def _inputs(spec, launches: int = WARMUP + REPS, seed: int = 0) -> RepInputs:
    sets = [spec.make_inputs(SHAPE, torch.float16, torch.Generator().manual_seed(10 + k), "random", "cpu")
            for k in (0, 1)]
    return RepInputs(spec, sets, launches, torch.Generator().manual_seed(seed))


def test_every_launch_gets_its_own_inputs_and_the_same_ones_in_every_buffer(silu):
    inputs = _inputs(silu)
    a, b = inputs.buffer(), inputs.buffer()
    seen, fills = [], set()
    for i in range(WARMUP + REPS):
        inputs.restore(a, i)
        inputs.restore(b, i)
        assert V.bitwise_equal(a["x"], b["x"])  # implementations and the oracle see the same bits
        assert V.bitwise_equal(a["out"], b["out"])  # and the same output fill
        out = a["out"].float()
        if torch.isnan(out).all():
            fills.add("nan")
        elif (out == V.FLOAT_SENTINEL).all():
            fills.add("sentinel")
        else:  # stale values: finite, varied, as a buffer holds between two calls
            assert torch.isfinite(out).all() and out.unique().numel() > out.numel() // 4
            fills.add("stale")
        changed = (a["x"] != inputs.sets[i % 2]["x"]).sum()
        assert 0 < int(changed) <= PERTURBED_ELEMENTS
        seen.append(a["x"].clone())
    # Every kind of fill occurs, so a kernel cannot count on finding a poison.
    assert fills == {"nan", "sentinel", "stale"}
    # No launch repeats an earlier launch's inputs, so nothing can be replayed by content.
    for i in range(len(seen)):
        for j in range(i):
            assert not V.bitwise_equal(seen[i], seen[j]), (i, j)


def test_perturbed_positions_are_distinct_so_the_copy_is_deterministic(silu):
    inputs = _inputs(silu, launches=50)
    dst, _ = inputs.plan["x"]
    for row in dst:
        assert len(set(row.tolist())) == len(row)
    assert int(dst.max()) < inputs.sets[0]["x"].numel()


def _check(spec, inputs: RepInputs, hook=None) -> TimedOutputCheck:
    tol = {"out": (2e-3, 2e-5)}
    return TimedOutputCheck(inputs, _silu_into, tol, hook, WARMUP, REPS, "(shape 8x64, float16)")


def _run(inputs: RepInputs, check: TimedOutputCheck, kernel) -> None:
    """What the timing loop does: restore, launch, and verify every timed launch."""
    buf = inputs.buffer()
    for i in range(WARMUP + REPS):
        inputs.restore(buf, i)
        kernel(buf, i)
        if i >= WARMUP:
            check.check(i, buf)


def test_an_honest_kernel_passes_every_launch(silu):
    inputs = _inputs(silu)
    check = _check(silu, inputs)
    _run(inputs, check, lambda buf, i: _silu_into(buf))
    assert check.checked == REPS
    assert check.finding() is None


def _skips_rows_on(bad_launch: int):
    def kernel(buf: Buffers, i: int) -> None:
        _silu_into(buf)
        if i == bad_launch:  # a launch-counting kernel, wrong on exactly one timed launch
            buf["out"][3:5] = float("nan")

    return kernel


@pytest.mark.parametrize("bad_launch", [WARMUP, WARMUP + 4, WARMUP + REPS - 1])
def test_a_kernel_wrong_on_a_single_timed_launch_is_caught_with_repetition_and_element(silu, bad_launch):
    inputs = _inputs(silu)
    check = _check(silu, inputs)
    _run(inputs, check, _skips_rows_on(bad_launch))
    finding = check.finding()
    assert finding is not None and finding.kind == "mismatch"
    rep = bad_launch - WARMUP + 1
    assert f"on timed launch {rep} of {REPS}" in finding.message
    assert "out[3, 0]" in finding.message and "got nan" in finding.message
    assert f"128 of {8 * 64}" in finding.message


def test_a_wrong_warm_up_launch_is_not_reported(silu):
    inputs = _inputs(silu)
    check = _check(silu, inputs)
    _run(inputs, check, _skips_rows_on(WARMUP - 1))
    assert check.finding() is None


def test_replaying_the_previous_result_is_caught(silu):
    # A cache that serves launch i-2's output (same input set, other perturbation).
    inputs = _inputs(silu)
    check = _check(silu, inputs)
    kept: dict[int, torch.Tensor] = {}

    def replay(buf: Buffers, i: int) -> None:
        if i - 2 in kept:
            buf["out"].copy_(kept[i - 2])
        else:
            _silu_into(buf)
        kept[i] = buf["out"].clone()

    _run(inputs, check, replay)
    finding = check.finding()
    assert finding is not None and "on timed launch 1 of" in finding.message


def test_small_differences_within_tolerance_pass(silu):
    inputs = _inputs(silu)
    check = _check(silu, inputs)

    def close(buf: Buffers, i: int) -> None:
        _silu_into(buf)
        buf["out"].mul_(1.0005)  # within 2e-3 relative

    _run(inputs, check, close)
    assert check.finding() is None


def test_a_host_compare_hook_is_called_for_every_timed_launch(silu):
    calls = []

    def hook(name, got, expected):
        calls.append(name)
        return None if V.bitwise_equal(got, expected) else f"{name}: not the same set"

    inputs = _inputs(silu)
    check = _check(silu, inputs, hook)
    _run(inputs, check, lambda buf, i: _silu_into(buf))
    assert len(calls) == REPS and check.finding() is None
    check = _check(silu, inputs, hook)
    _run(inputs, check, _skips_rows_on(WARMUP + 2))
    finding = check.finding()
    assert finding is not None and "not the same set" in finding.message and "on timed launch 3 of" in finding.message


def test_drift_probe_passes_a_deterministic_kernel_and_catches_a_clock_dependent_one(silu):
    now = [0.0]
    state = {"backwards": False}

    def launch(label, shape, buf):
        _silu_into(buf)
        if state["backwards"]:  # another summation order: the last bit of a few outputs moves
            buf["out"].view(torch.int16)[2, :3] += 1

    written, outputs = ["out"], ["out"]
    probe = DriftProbe(launch, written, outputs, clock=lambda: now[0])
    inputs = silu.make_inputs(SHAPE, torch.float16, torch.Generator().manual_seed(0), "random", "cpu")
    validated = {k: v.clone() for k, v in inputs.items()}
    launch("8x64", SHAPE, validated)
    probe.add("8x64", SHAPE, inputs, validated)
    now[0] = 0.2
    probe.probe_all("after validation")
    assert probe.finding() is None
    state["backwards"] = True  # the clock's bit flipped
    now[0] = 0.5
    probe.probe("8x64", "inside its timing loop, after timed launch 4")
    finding = probe.finding()
    assert finding is not None and finding.kind == "nondeterminism"
    assert "about 500 ms after validation" in finding.message and "timed launch 4" in finding.message
    probe.probe("unknown", "nowhere")  # a shape without a validated case is skipped


def test_drift_probe_reruns_on_poisoned_outputs_not_on_the_last_result(silu):
    seen = []

    def launch(label, shape, buf):
        seen.append(bool(torch.isnan(buf["out"].float()).all()))
        _silu_into(buf)

    probe = DriftProbe(launch, ["out"], ["out"])
    inputs = silu.make_inputs(SHAPE, torch.float16, torch.Generator().manual_seed(0), "random", "cpu")
    out = {k: v.clone() for k, v in inputs.items()}
    _silu_into(out)
    probe.add("s", SHAPE, inputs, out)
    probe.probe("s", "a")
    probe.probe("s", "b")
    assert seen == [True, True]
    assert probe.finding() is None


def test_compared_with_a_baseline_timed_on_the_same_inputs(silu):
    # The evaluator's way: baseline and candidate each restore launch i into their own buffer,
    # and the candidate's outputs are compared with the baseline's after the repetition.
    inputs = _inputs(silu)
    check = TimedOutputCheck(inputs, None, {"out": (2e-3, 2e-5)}, None, WARMUP, REPS, "(shape 8x64)")
    cand, base = inputs.buffer(), inputs.buffer()
    wrong = _skips_rows_on(WARMUP + 6)
    for i in range(WARMUP + REPS):
        inputs.restore(base, i)
        _silu_into(base)
        inputs.restore(cand, i)
        wrong(cand, i)
        if i >= WARMUP:
            check.compare(i, cand, base)
    finding = check.finding()
    assert finding is not None and "on timed launch 7 of 10 (shape 8x64)" in finding.message
    with pytest.raises(AssertionError, match="oracle"):
        check.check(WARMUP, cand)


def test_inputs_marked_not_to_perturb_keep_their_drawn_values(silu):
    """Arg.perturb=False: the loops alternate between the two drawn sets and change nothing
    else in that input; a spec may not set it on an output or an int."""
    import dataclasses

    from kernels.spec import Arg, KernelSpecError

    kept = dataclasses.replace(silu, args=tuple(dataclasses.replace(a, perturb=False) if a.name == "x" else a
                                                for a in silu.args))
    inputs = _inputs(kept)
    assert "x" not in inputs.plan
    buf = inputs.buffer()
    for i in range(WARMUP + REPS):
        inputs.restore(buf, i)
        assert V.bitwise_equal(buf["x"], inputs.sets[i % 2]["x"])
    with pytest.raises(KernelSpecError, match="perturb=False"):
        Arg("out", "tensor", role="out", perturb=False)
    with pytest.raises(KernelSpecError, match="perturb=False"):
        Arg("n", "int", perturb=False)
