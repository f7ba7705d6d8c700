"""GPU tests of run-time integrity: every timed launch verified in the evaluator and in the
peers' loop, kernels of ours that fail or crash the peers' loop reported per kernel, launch
paths that run out of resources turned into verdicts, and the device's own launch limits.
Run on the GPU machine: ``python -m pytest -m gpu tests/gpu/test_integrity_loops.py``."""

from __future__ import annotations

import pytest
import torch

from evaluators.api import EvalRequest, TimingConfig
from kernels.launch import DeviceLimits
from kernels.spec import load_kernel, shape_label
from kernels.variant import Variant
from kernels.verdict import Status
from tests.adversarial.index import FIXTURE_DIR

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SCREEN = TimingConfig(5, 20, 0.0)
KERNEL = "silu_and_mul"

# Traps from its 61st launch in a row of one shape on: more than a screening evaluation makes,
# fewer than the peers' loop (20 + 100), so only the peers' loop meets the fault.
TRAP_AFTER_60 = """
// launch: grid=(num_tokens,) block=(256,) smem=0
__device__ int g_last_tokens;
__device__ int g_last_d;
__device__ int g_streak;
__device__ unsigned int g_blocks_done;

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const bool same_shape = g_last_tokens == num_tokens && g_last_d == d;
    const int launch = (same_shape ? g_streak : 0) + 1;
    if (launch > 60) {
        __trap();
    }
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(x[token * 2 * d + d + i]));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&g_blocks_done, 1u) == gridDim.x - 1) {
            g_last_tokens = num_tokens;
            g_last_d = d;
            g_streak = launch;
            g_blocks_done = 0;
            __threadfence();
        }
    }
}
"""
# Wrong on two launches in a row (the 17th and 18th of a shape, timed ones under screening):
# leaves its output untouched there. Two, because a re-run of the validated inputs inside the
# loop (never two in a row) may take one of the two places.
WRONG_ON_TWO_LAUNCHES = """
// launch: grid=(num_tokens,) block=(256,) smem=0
__device__ int g_last_tokens;
__device__ int g_last_d;
__device__ int g_streak;
__device__ unsigned int g_blocks_done;

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const bool same_shape = g_last_tokens == num_tokens && g_last_d == d;
    const int launch = (same_shape ? g_streak : 0) + 1;
    const long long token = blockIdx.x;
    if (launch != 17 && launch != 18) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            const float g = static_cast<float>(x[token * 2 * d + i]);
            out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(x[token * 2 * d + d + i]));
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&g_blocks_done, 1u) == gridDim.x - 1) {
            g_last_tokens = num_tokens;
            g_last_d = d;
            g_streak = launch;
            g_blocks_done = 0;
            __threadfence();
        }
    }
}
"""
# 256 GiB of zero-initialised __device__ memory: a tiny binary the device cannot hold.
HUGE_STATIC = """
// launch: grid=(num_tokens,) block=(256,) smem=0
__device__ char g_table[1ull << 38];
extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        const float u = static_cast<float>(x[token * 2 * d + d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u + g_table[(token * d + i) & 4095]);
    }
}
"""


def _fixture(name: str) -> str:
    return (FIXTURE_DIR / name).read_text()


@pytest.fixture(scope="module")
def evaluator():
    from evaluators.gpu import GpuEvaluator

    ev = GpuEvaluator(device=0)
    yield ev
    ev.close()


def _evaluate(evaluator, source: str, timing: TimingConfig = SCREEN, kernel: str = KERNEL):
    return evaluator.evaluate(EvalRequest(kernel, Variant(kernel, source), dtype="float16", timing=timing))


def _baseline_ok(evaluator) -> None:
    after = _evaluate(evaluator, load_kernel(KERNEL).baseline_source())
    assert after.status is Status.OK, after.message


def test_the_worker_reports_its_devices_launch_limits(evaluator):
    limits = evaluator.info()["limits"]
    assert isinstance(limits, DeviceLimits)
    assert limits.max_threads_per_block == 1024 and limits.max_grid[0] == 2**31 - 1
    assert limits.max_smem_bytes > 48 * 1024


def test_a_kernel_wrong_on_single_timed_launches_is_rejected_naming_one(evaluator):
    ev = _evaluate(evaluator, WRONG_ON_TWO_LAUNCHES)
    assert ev.status is Status.REJECTED and ev.guard == "replay", ev.message
    # The unwritten outputs hold that launch's fill (NaN, the sentinel or stale values).
    assert "on timed launch" in ev.message and "of 20" in ev.message and "got " in ev.message, ev.message


def test_the_peers_loop_cheat_passes_screening_but_not_the_full_protocol(evaluator):
    source = _fixture("peers_loop_count.cu")
    assert _evaluate(evaluator, source).status is Status.OK
    full = _evaluate(evaluator, source, TimingConfig.full())
    assert full.status is Status.REJECTED and full.guard == "replay", full.message


@pytest.mark.parametrize("graph_ours", [False, True])
def test_the_peers_loop_fails_a_cheat_and_times_an_honest_kernel(evaluator, graph_ours):
    ours = {"cheat": (_fixture("peers_loop_count.cu"), {}), "honest": (_fixture("honest_silu_vectorized.cu"), {})}
    reply = evaluator.time_peers_full(KERNEL, "float16", "search", ours, repetitions=100, graph_ours=graph_ours)
    assert "cheat" in reply["failed"] and "timed launch" in reply["failed"]["cheat"], reply["failed"]
    assert "cheat" not in reply["peers"] and "cheat@graph" not in reply["peers"]
    labels = {shape_label(s) for s in load_kernel(KERNEL).search_shapes}
    assert set(reply["peers"]["honest"]) == labels
    assert "honest" not in reply["failed"]
    if graph_ours:
        assert set(reply["peers"]["honest@graph"]) == labels


def test_poison_dependent_kernels_fail_wherever_outputs_hold_stale_values(evaluator):
    # Timing loops fill outputs with NaN, the sentinel or stale values, launch by launch at
    # random: a kernel that writes only over a poison is wrong on a stale launch, one that
    # traps without a poison faults there; in the evaluator and in the peers' loop alike.
    assert _evaluate(evaluator, _fixture("writes_nothing_unless_poisoned.cu")).status is Status.REJECTED
    assert _evaluate(evaluator, _fixture("traps_unless_poisoned.cu")).status is Status.CRASH
    spec = load_kernel(KERNEL)
    ours = {"writes_nothing": (_fixture("writes_nothing_unless_poisoned.cu"), {}),
            "traps": (_fixture("traps_unless_poisoned.cu"), {}), "baseline": (spec.baseline_source(), {})}
    reply = evaluator.time_peers_full(KERNEL, "float16", "search", ours, repetitions=50, graph_ours=True)
    assert set(reply["failed"]) >= {"writes_nothing", "traps"}, reply["failed"]
    assert "baseline" not in reply["failed"], reply["failed"]
    assert not {"writes_nothing", "traps"} & set(reply["peers"]), reply["peers"].keys()
    assert set(reply["peers"]["baseline"]) == {shape_label(s) for s in spec.search_shapes}


def test_a_kernel_that_crashes_the_peers_loop_costs_only_its_own_result(evaluator):
    ours = {"trapper": (TRAP_AFTER_60, {}), "honest": (_fixture("honest_silu_vectorized.cu"), {})}
    assert _evaluate(evaluator, TRAP_AFTER_60).status is Status.OK  # screening never reaches launch 61
    reply = evaluator.time_peers_full(KERNEL, "float16", "search", ours, repetitions=100)
    assert reply["failed"]["trapper"].startswith(("CRASH", "TIMEOUT")), reply["failed"]
    assert "trapper" not in reply["peers"]
    assert len(reply["peers"]["honest"]) == len(load_kernel(KERNEL).search_shapes)
    _baseline_ok(evaluator)


def test_a_binary_the_device_cannot_hold_is_a_resource_error(evaluator):
    ev = _evaluate(evaluator, HUGE_STATIC)
    assert ev.status is Status.RESOURCE_ERROR, f"{ev.status.value}: {ev.message}"
    _baseline_ok(evaluator)


def test_an_honest_kernel_stays_ok_under_the_full_protocol(evaluator):
    # Every timed launch is verified against the baseline within twice the tolerance; an
    # honest fast kernel must not trip it (no false positives from the perturbed inputs).
    for name, kernel in (("honest_silu_vectorized.cu", "silu_and_mul"),
                         ("honest_rmsnorm_warp_shuffle.cu", "fused_add_rmsnorm"),
                         ("honest_merge_vectorized.cu", "merge_attn_states_lse")):
        ev = _evaluate(evaluator, _fixture(name), TimingConfig.full(), kernel=kernel)
        assert ev.status is Status.OK, f"{name}: {ev.status.value} {ev.guard}: {ev.message}"
