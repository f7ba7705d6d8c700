"""GPU tests of the evaluator (issue: kernel library and GPU evaluator). Run on an H200:
``python -m pytest -m gpu tests/gpu``. Skipped cleanly without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evaluators.api import EvalRequest, TimingConfig
from kernels.spec import list_kernels, load_kernel, shape_label
from kernels.variant import Variant
from kernels.verdict import Status

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ROOT = Path(__file__).resolve().parents[2]

WRONG_SILU = """
// launch: grid=(num_tokens,) block=(256,) smem=0
extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long t = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float g = static_cast<float>(x[t * 2 * d + i]);
        float u = static_cast<float>(x[t * 2 * d + d + i]);
        out[t * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u * 1.01f);  // 1% off
    }
}
"""
ILLEGAL_ADDRESS_SILU = """
// launch: grid=(num_tokens,) block=(256,) smem=0
extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    scalar_t* far = out + (1ll << 40);  // far outside any allocation
    far[threadIdx.x] = x[0];
}
"""
HANG_SILU = """
// launch: grid=(num_tokens,) block=(256,) smem=0
extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    // clock64() is volatile: the loop cannot be optimised away, and it never ends
    const long long t0 = clock64();
    while (clock64() - t0 >= 0) { }
    out[0] = x[0];
}
"""


@pytest.fixture(scope="module")
def evaluator():
    from evaluators.gpu import GpuEvaluator

    ev = GpuEvaluator(step_timeout_s=15.0)
    yield ev
    ev.close()


def _baseline(kernel: str) -> Variant:
    spec = load_kernel(kernel)
    return Variant(spec.name, spec.baseline_source(), author="baseline")


@pytest.mark.parametrize("kernel", list_kernels())
def test_every_baseline_validates_on_all_shapes_and_dtypes(evaluator, kernel):
    spec = load_kernel(kernel)
    for dtype in spec.dtypes:
        for shape_set in ("search", "heldout"):
            ev = evaluator.evaluate(EvalRequest(kernel, _baseline(kernel), dtype=dtype, shape_set=shape_set, time=False))
            assert ev.status is Status.OK, f"{kernel} {dtype} {shape_set}: {ev.status} {ev.message}"


@pytest.mark.parametrize("kernel", ["silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse"])
def test_baseline_against_itself_is_within_noise(evaluator, kernel):
    if kernel not in list_kernels():
        pytest.skip(f"{kernel} not in the library")
    ev = evaluator.evaluate(EvalRequest(kernel, _baseline(kernel), timing=TimingConfig.full()))
    assert ev.status is Status.OK, ev.message
    assert 0.98 <= ev.speedup <= 1.02, f"A/A geomean {ev.speedup:.4f}"


def test_hand_written_fast_variant_is_measured_faster(evaluator):
    variants = sorted((ROOT / "experiments" / "results" / "variants" / "silu_and_mul").glob("*.cu"))
    if not variants:
        pytest.skip("no hand-written silu_and_mul variant")
    ev = evaluator.evaluate(EvalRequest("silu_and_mul", Variant("silu_and_mul", variants[0].read_text()),
                                        timing=TimingConfig.full()))
    assert ev.status is Status.OK, ev.message
    assert ev.speedup > 1.2, f"speedup {ev.speedup:.3f}"


def test_wrong_variant_is_incorrect_with_first_mismatch(evaluator):
    ev = evaluator.evaluate(EvalRequest("silu_and_mul", Variant("silu_and_mul", WRONG_SILU), time=False))
    assert ev.status is Status.INCORRECT
    assert "out[" in ev.message and "expected" in ev.message and "got" in ev.message and "shape" in ev.message


def test_illegal_address_is_crash_and_next_variant_is_fine(evaluator):
    ev = evaluator.evaluate(EvalRequest("silu_and_mul", Variant("silu_and_mul", ILLEGAL_ADDRESS_SILU), time=False))
    assert ev.status is Status.CRASH, ev.message
    after = evaluator.evaluate(EvalRequest("silu_and_mul", _baseline("silu_and_mul"), time=False))
    assert after.status is Status.OK, after.message


def test_infinite_loop_is_timeout_and_evaluator_recovers(evaluator):
    ev = evaluator.evaluate(EvalRequest("silu_and_mul", Variant("silu_and_mul", HANG_SILU), time=False))
    assert ev.status is Status.TIMEOUT, ev.message
    after = evaluator.evaluate(EvalRequest("silu_and_mul", _baseline("silu_and_mul"), time=False))
    assert after.status is Status.OK, after.message


def test_a_failed_graph_capture_gives_the_stream_back():
    # A peer that synchronises inside the capture cannot be captured; afterwards the caller's
    # stream must be current again, or later launches and timing events go to different streams.
    from evaluators.timing import capture_graph

    origin = torch.cuda.current_stream()
    x = torch.ones(16, device="cuda")
    with pytest.raises(Exception):  # noqa: B017 - torch raises a RuntimeError subclass, by version
        capture_graph(lambda: x.sum().item())
    assert torch.cuda.current_stream() == origin
    y = x * 2  # the stream still works
    torch.cuda.synchronize()
    assert float(y.sum()) == 32.0


def test_the_peers_loop_times_our_kernels_doing_their_work(evaluator):
    # Our baseline in the peers' loop must take about as long as in the evaluator's own timing:
    # a loop time far below it means the events timed something else.
    for kernel in ("reshape_and_cache", "silu_and_mul"):
        spec = load_kernel(kernel)
        reply = evaluator.time_peers_full(kernel, "float16", "search", {"baseline": (spec.baseline_source(), {})},
                                          repetitions=20)
        own = evaluator.evaluate(EvalRequest(kernel, _baseline(kernel), timing=TimingConfig.full()))
        assert own.status is Status.OK, own.message
        largest = max(own.shapes, key=lambda s: s.baseline_ms)
        loop_ms = reply["peers"]["baseline"][shape_label(largest.shape)]
        assert loop_ms > 0.7 * largest.baseline_ms, (kernel, loop_ms, largest.baseline_ms, reply.get("errors"))
        # Both torch peers are captured and timed (a host read inside one fails its capture).
        assert {"torch_eager", "torch_compile"} <= set(reply["peers"]), reply["errors"]
        # Every peer's set-up time is kept (the compilations make most of a loop's time).
        by_peer = reply["prepare_s_by_peer"]
        assert "torch_eager" in by_peer and any(n.startswith("torch_compile[") for n in by_peer), by_peer
        assert 0.0 < sum(by_peer.values()) <= reply["phase_s"]["prepare"] + 1e-6, (by_peer, reply["phase_s"])
        first = reply["prepare_s_first_shape_by_peer"]  # the first shape's part of it
        assert set(first) <= set(by_peer) and all(0.0 <= first[n] <= by_peer[n] + 1e-9 for n in first), (first, by_peer)
        # ... and, for the compilations, torch.compile's phases inside that time.
        phases = reply["compile_phases_s"]
        assert phases and all(n.startswith("torch_compile[") for n in phases), phases
        assert all(0.0 < ph.get("_compile.compile_inner", 0.0) <= by_peer[n] + 1e-6 for n, ph in phases.items()), phases


def test_a_loop_loads_the_compilations_made_ahead_of_it(evaluator, tmp_path):
    """evaluators.peer_compile: each mode compiled for each shape in a process of its own, into
    the loop's folder, then a first call of every other peer; the loop then loads every
    compilation from there (FX-graph cache hits, none compiled again) and times torch.compile
    on every shape."""
    from evaluators.peer_compile import compile_ahead

    spec = load_kernel("silu_and_mul")
    folder = tmp_path / "loop-1"
    report = compile_ahead("silu_and_mul", "float16", "search", folder, tmp_path / "gpu.lock")
    assert report["status"] == "OK", report
    assert all(v == "ok" for per_shape in report["modes"].values() for v in per_shape.values()), report
    # The other peers were called there too (FlashInfer built its op ahead of the loop).
    assert report["first_calls"] == {name: "ok" for name in spec.peers}, report
    reply = evaluator.time_peers_full("silu_and_mul", "float16", "search", {"baseline": (spec.baseline_source(), {})},
                                      repetitions=20, fresh_process=True, compile_trials=1, compile_cache=str(folder))
    cache = reply["compile_cache"]
    assert cache["miss"] == 0 and cache["bypass"] == 0 and cache["hit"] >= 2 * len(spec.search_shapes), cache
    assert set(reply["peers"]["torch_compile"]) == {shape_label(s) for s in spec.search_shapes}, reply["errors"]


def _rounds_at_once(count: int, kernel: str, loops: list, lock: Path) -> dict[int, tuple[float, float, list]]:
    """``count`` rounds of ``loops`` at once, each in an evaluator of its own taking part in the
    GPU lock at ``lock``, as the end of a run runs them: per round, when it started and ended
    (monotonic seconds) and its replies."""
    import threading
    import time

    from evaluators.gpu import GpuEvaluator

    got: dict[int, tuple[float, float, list]] = {}

    def one(i: int) -> None:
        ev = GpuEvaluator(step_timeout_s=60.0, gpu_turns=str(lock))
        try:
            start = time.monotonic()
            replies = ev.time_round(kernel, "float16", loops)
            got[i] = (start, time.monotonic(), replies)
        finally:
            ev.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_rounds_beside_each_other_set_up_together_and_time_one_at_a_time(tmp_path):
    """Two rounds (search and held-out loops each) in two evaluators taking part in one GPU
    lock, as the end of a run runs them: both answer every loop with the peers and our
    kernels timed, and their timed passes never overlap (each reports how long it waited for
    the GPU, and their holds of it alone are disjoint)."""
    spec = load_kernel("silu_and_mul")
    ours = {"baseline": (spec.baseline_source(), {})}
    loops = [{"shape_set": s, "ours": ours, "compile_trials": 1, "repetitions": 20} for s in ("search", "heldout")]
    got = _rounds_at_once(2, "silu_and_mul", loops, tmp_path / "gpu.lock")
    assert set(got) == {0, 1}
    for _, _, replies in got.values():
        assert len(replies) == 2
        for loop, reply in zip(loops, replies, strict=True):
            labels = {shape_label(s) for s in spec.shapes(loop["shape_set"])}
            assert set(reply["peers"]["baseline"]) == labels, reply
            assert set(reply["peers"]["torch_compile"]) == labels, reply["errors"]
            assert not reply["failed"], reply["failed"]
        assert replies[0]["phase_s"]["wait"] >= 0.0 and replies[1]["phase_s"]["wait"] == 0.0
    # Timed passes one at a time: the two rounds' holds of the GPU alone do not overlap.
    (a0, a1), (b0, b1) = (got[i][2][0]["timed_at"] for i in range(2))
    assert a1 <= b0 or b1 <= a0, ((a0, a1), (b0, b1))
    assert all(got[i][2][0]["timed_at"] == got[i][2][1]["timed_at"] for i in range(2))


def test_a_round_set_up_beside_the_search_times_once_the_gate_opens_and_no_job_runs(tmp_path):
    """A peers' round set up beside the search (search.compile_ahead): it sets up at once, waits
    at its gate, and once the gate opens times only when the pool evaluator's job (which holds
    the benchmark lock alone, here a process standing in for it) has ended."""
    import os
    import subprocess
    import sys
    import threading
    import time

    from evaluators.gpu import GpuEvaluator
    from evaluators.gpu_turns import benchmark_lock_path

    spec = load_kernel("silu_and_mul")
    lock, gate = tmp_path / "gpu.lock", tmp_path / "gate.open"
    loops = [{"shape_set": "search", "ours": {"baseline": (spec.baseline_source(), {})}, "compile_trials": 1,
              "repetitions": 20}]
    job = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); " \
          "fcntl.flock(fd, fcntl.LOCK_EX); print('in', flush=True); time.sleep(float(sys.argv[2]))"
    got: dict[str, object] = {}

    def run() -> None:
        ev = GpuEvaluator(step_timeout_s=60.0, gpu_turns=str(lock), nice=10)
        try:
            got["replies"] = ev.time_round("silu_and_mul", "float16", loops, time_after=str(gate))
        finally:
            ev.close()

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(20.0)  # long enough to set up
    assert thread.is_alive() and "replies" not in got  # set up, waiting at the gate
    holder = subprocess.Popen([sys.executable, "-c", job, str(benchmark_lock_path(lock)), "5"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "in"
    opened = time.time()
    gate.touch()
    holder.wait()
    released = time.time()
    thread.join(timeout=120)
    (reply,) = got["replies"]  # type: ignore[misc]
    assert not reply["failed"] and set(reply["peers"]["torch_compile"]) == {shape_label(s) for s in spec.search_shapes}
    began, _ = reply["timed_at"]
    assert began >= released - 0.05, (began, opened, released)  # not beside the job holding the lock
    assert reply["phase_s"]["search_end_wait"] > 0.0
    assert reply["nice_timed"] == 0 or os.geteuid() != 0, reply.get("nice_timed")  # back to full priority


def test_rounds_beside_each_other_load_one_folder_compiled_ahead_for_them_all(tmp_path):
    """The end of a run's compile-ahead: each kernel's programs compiled once per shape set
    into one folder, then the rounds' loops on that shape set, each in a fresh process beside
    the others, all load every compilation from it (none compiled again) and time
    torch.compile on every shape."""
    from evaluators.peer_compile import compile_ahead

    spec = load_kernel("silu_and_mul")
    lock = tmp_path / "gpu.lock"
    folder = tmp_path / "search"
    report = compile_ahead("silu_and_mul", "float16", "search", folder, lock)
    assert report["status"] == "OK", report
    ours = {"baseline": (spec.baseline_source(), {})}
    loops = [{"shape_set": "search", "ours": ours, "compile_trials": 1, "repetitions": 20,
              "compile_cache": str(folder)}]
    got = _rounds_at_once(3, "silu_and_mul", loops, lock)
    assert set(got) == {0, 1, 2}
    labels = {shape_label(s) for s in spec.search_shapes}
    for _, _, (reply,) in got.values():
        cache = reply["compile_cache"]
        assert cache["miss"] == 0 and cache["bypass"] == 0 and cache["hit"] >= 2 * len(labels), cache
        assert set(reply["peers"]["torch_compile"]) == labels, reply["errors"]
        assert not reply["failed"], reply["failed"]
        # What loading still costs (printed, not asserted: torch's own behaviour).
        print("set-up", reply["phase_s"], "coordinate descent on load:",
              {n: ph.get("CachingAutotuner.coordinate_descent_tuning") for n, ph in reply.get("compile_phases_s", {}).items()})


def test_our_kernels_can_be_timed_through_graphs_like_the_peers(evaluator):
    # The same binary timed both ways in one loop: the graph replay must time the kernel
    # doing its work (not an empty graph: the capture has to see our launch on its stream).
    spec = load_kernel("silu_and_mul")
    reply = evaluator.time_peers_full("silu_and_mul", "float16", "search", {"baseline": (spec.baseline_source(), {})},
                                      repetitions=20, graph_ours=True)
    direct, graphed = reply["peers"]["baseline"], reply["peers"]["baseline@graph"]
    assert set(direct) == set(graphed)
    largest = max(direct, key=direct.get)
    assert 0.7 * direct[largest] < graphed[largest] < 1.3 * direct[largest], (direct, graphed)
