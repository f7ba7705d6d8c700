"""CPU checks of the adversarial fixtures: the index is consistent, every variant parses,
those meant to compile do compile with NVRTC, and those meant to be refused are refused
with a message that says why: by admission (:func:`evaluators.admit.admit`), by
``python -m evaluators.check --compile-only --json`` and by the GPU evaluator's front end,
none of which needs a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evaluators.admit import Artifact, Refusal, admit
from evaluators.api import EvalRequest
from evaluators.compile import CompileLimits, compile_variant
from kernels.launch import LaunchSpecError, parse_launch_header
from kernels.spec import KernelSpecError, check_signature, list_kernels, load_kernel
from kernels.variant import Variant
from kernels.verdict import Status
from tests.adversarial.index import (
    FIXTURE_DIR,
    FRONT_END_GUARDS,
    REJECT_GUARDS,
    SANITIZER_TOOLS,
    fixtures,
    load_index,
)

FIXTURES = fixtures()
SECTION5_ITEMS = range(1, 16)


def _ids(fs):
    return [f.name for f in fs]


def test_index_lists_exactly_the_variant_files():
    listed = [f.file for f in FIXTURES]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    on_disk = sorted(p.name for p in FIXTURE_DIR.glob("*.cu"))
    assert sorted(listed) == on_disk


def test_index_entries_are_consistent():
    kernels = set(list_kernels())
    for f in FIXTURES:
        assert f.kernel in kernels, f"{f.file}: unknown kernel {f.kernel}"
        status = Status(f.status)  # raises on a misspelt status
        assert f.trick.strip(), f"{f.file}: no trick line"
        if status is Status.REJECTED:
            assert f.guard in REJECT_GUARDS, f"{f.file}: REJECTED needs a guard from {sorted(REJECT_GUARDS)}"
        elif f.guard:
            assert status is Status.COMPILE_ERROR and f.guard in FRONT_END_GUARDS, f"{f.file}: guard {f.guard!r}"
        if f.sanitizer:
            assert f.sanitizer in SANITIZER_TOOLS
        if f.name.startswith(("honest_", "baseline_")):
            assert status is Status.OK, f"{f.file}: honest kernels must pass"
        assert all(i in SECTION5_ITEMS for i in f.covers), f"{f.file}: covers {f.covers}"
        if f.twin:
            (twin,) = [t for t in FIXTURES if t.file == f.twin]
            assert twin.honest and twin.kernel == f.kernel, f"{f.file}: twin {f.twin} must be honest, same kernel"
            assert not f.honest and status is Status.OK, f"{f.file}: only correct hostile code has a twin"


def test_every_cheat_of_reference_section5_is_covered_or_ruled_out():
    _, not_applicable = load_index()
    ruled_out = {e["item"] for e in not_applicable}
    assert all(e.get("reason", "").strip() for e in not_applicable), "each not_applicable entry needs a reason"
    covered = {i for f in FIXTURES for i in f.covers}
    assert not covered & ruled_out, f"items both covered and ruled out: {sorted(covered & ruled_out)}"
    assert covered | ruled_out == set(SECTION5_ITEMS), f"missing: {sorted(set(SECTION5_ITEMS) - covered - ruled_out)}"


def test_the_trick_families_and_faults_are_all_present():
    statuses = {Status(f.status) for f in FIXTURES}
    assert statuses == set(Status), f"no fixture for {set(Status) - statuses}"
    guards = {f.guard for f in FIXTURES if f.guard}
    assert guards >= (REJECT_GUARDS - {"roofline"}) | FRONT_END_GUARDS
    assert sum(f.name.startswith("honest_") for f in FIXTURES) >= 3


@pytest.mark.parametrize("fx", FIXTURES, ids=_ids(FIXTURES))
def test_launch_header_and_signature(fx):
    spec = load_kernel(fx.kernel)
    source = fx.source()
    if fx.guard == "launch":
        with pytest.raises(LaunchSpecError):
            spec.check_launch(parse_launch_header(source))
        return
    launch = parse_launch_header(source)
    spec.check_launch(launch)
    for params in launch.param_grid():
        for shape in (*spec.search_shapes, *spec.heldout_shapes):
            launch.resolve(shape, params)
    if fx.guard == "signature":
        with pytest.raises(KernelSpecError, match="argument"):
            check_signature(spec, source)
    else:
        check_signature(spec, source)


# Fixtures whose verdict admission decides on the CPU; the others must pass admission.
ADMISSION = [f for f in FIXTURES if f.status in ("COMPILE_ERROR", "RESOURCE_ERROR")]
COMPILING = [f for f in FIXTURES if f not in ADMISSION]
# A compile bomb must be stopped by a limit; a small one keeps CI fast (the default is 60 s).
FAST_LIMITS = CompileLimits(timeout_s=10.0)


@pytest.mark.parametrize("fx", COMPILING, ids=_ids(COMPILING))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_compiles_with_nvrtc(fx, dtype, compile_cache):
    source = fx.source()
    for params in parse_launch_header(source).param_grid():
        result = compile_variant(source, fx.kernel, dtype, params, "sm_90")
        assert result.ok, f"{fx.file} {dtype} {params}:\n{result.log}"
        assert result.cubin and result.registers is not None


NVRTC_ERRORS = [f for f in FIXTURES if f.status == "COMPILE_ERROR" and not f.guard]


@pytest.mark.parametrize("fx", NVRTC_ERRORS, ids=_ids(NVRTC_ERRORS))
def test_refused_sources_fail_to_compile_with_a_useful_log(fx, compile_cache):
    result = compile_variant(fx.source(), fx.kernel, "float16", {}, "sm_90")
    assert not result.ok and not result.cubin
    for text in fx.message_contains:
        assert text.lower() in result.log.lower(), f"{fx.file}: {text!r} not in log:\n{result.log}"


REFUSED = [f for f in FIXTURES if f.status == "COMPILE_ERROR"]


@pytest.mark.parametrize("fx", REFUSED, ids=_ids(REFUSED))
def test_gpu_evaluator_front_end_gives_compile_error(fx, compile_cache):
    from evaluators.gpu import GpuEvaluator

    # A compile error is decided before any sandbox starts, so this runs without a GPU.
    evaluator = GpuEvaluator(arch="sm_90", start_timeout_s=5.0)
    try:
        ev = evaluator.evaluate(EvalRequest(fx.kernel, Variant(fx.kernel, fx.source()), dtype="float16"))
    finally:
        evaluator.close()
    assert ev.status is Status.COMPILE_ERROR, ev.message
    assert ev.guard in ("", fx.guard)
    for text in fx.message_contains:
        assert text.lower() in ev.message.lower(), f"{fx.file}: {text!r} not in {ev.message!r}"


def _assert_message(fx, message):
    for text in fx.message_contains:
        assert text.lower() in message.lower(), f"{fx.file}: {text!r} not in {message!r}"


@pytest.mark.parametrize("fx", FIXTURES, ids=_ids(FIXTURES))
def test_admission_gives_the_verdict(fx, compile_cache):
    outcome = admit(load_kernel(fx.kernel), fx.source(), "float16", arch="sm_90", compile_limits=FAST_LIMITS)
    if fx in ADMISSION:
        assert isinstance(outcome, Refusal), f"{fx.file} was admitted"
        assert outcome.status is Status(fx.status), outcome.message
        assert "\n" not in outcome.message.split("\n")[0]  # the reason leads the message
        assert len(outcome.message) <= 4100
        _assert_message(fx, outcome.message)
    else:
        assert isinstance(outcome, Artifact), getattr(outcome, "message", "")
        assert outcome.cubin.startswith(b"\x7fELF")


@pytest.mark.parametrize("fx", ADMISSION, ids=_ids(ADMISSION))
def test_check_compile_only_json_gives_the_verdict(fx, compile_cache):
    cmd = [sys.executable, "-m", "evaluators.check", "--kernel", fx.kernel, str(fx.path), "--compile-only",
           "--json", "--compile-timeout", str(FAST_LIMITS.timeout_s)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    verdict = json.loads(done.stdout)  # one JSON object, nothing else on stdout
    assert done.returncode == 1, done.stderr
    assert verdict["status"] == fx.status
    assert verdict["variant_id"] == Variant(fx.kernel, fx.source()).id
    _assert_message(fx, verdict["message"])
