"""CPU tests of the GPU evaluator's parent side: the one admission path, the artifact a caller
hands in, and the peers' loop surviving a kernel of ours that crashes it. The sandbox is
replaced by a scripted one where a GPU would be needed."""

from __future__ import annotations

from typing import Any

import pytest

from evaluators.admit import Artifact, admit
from evaluators.api import EvalRequest
from evaluators.gpu import EvaluatorError, GpuEvaluator
from kernels.launch import DeviceLimits
from kernels.spec import load_kernel, shape_label
from kernels.variant import Variant
from kernels.verdict import Status
from tests.adversarial.index import FIXTURE_DIR

HONEST = (FIXTURE_DIR / "honest_silu_vectorized.cu").read_text()
TOO_MANY_THREADS = (FIXTURE_DIR / "too_many_threads.cu").read_text()


class ScriptedEvaluator(GpuEvaluator):
    """A GpuEvaluator whose sandbox answers from a script: ``crashes(job)`` says whether the
    job faults; every other job times each implementation at 1 ms per shape."""

    def __init__(self, crashes: Any) -> None:
        super().__init__(arch="sm_90", start_timeout_s=5.0)
        self.crashes = crashes
        self.jobs: list[dict[str, Any]] = []

    @property
    def limits(self) -> DeviceLimits:
        return DeviceLimits()

    def _job(self, job: dict[str, Any], timeout_s: float | None = None) -> tuple[str, dict[str, Any]]:
        self.jobs.append(job)
        if self.crashes(job):
            return "result", {"status": "CRASH", "message": "CUDA fault: an illegal instruction", "fatal": True}
        impls = list(job["kernels"]) + (["torch_eager"] if job.get("peers", True) else [])
        times = {name: {"s": 1.0} for name in impls}
        return "result", {"status": "OK", "peers": times, "iqr": times, "errors": {}, "failed": {},
                          "copy_bw_bytes_per_s": 4e12}


def _ours(*names: str) -> dict[str, tuple[str, dict[str, int]]]:
    spec = load_kernel("silu_and_mul")
    return {n: (HONEST if n != "baseline" else spec.baseline_source(), {}) for n in names}


def test_a_kernel_that_crashes_the_peers_loop_is_failed_and_the_others_are_timed(compile_cache):
    ev = ScriptedEvaluator(lambda job: "bad" in job["kernels"])
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=_ours("good", "bad", "baseline"))
    assert reply["failed"]["bad"].startswith("CRASH") and "illegal instruction" in reply["failed"]["bad"]
    assert "bad" not in reply["peers"]
    assert {"good", "baseline", "torch_eager"} <= set(reply["peers"])
    # the whole loop, then each of ours alone without the peers, then the survivors together
    assert [sorted(j["kernels"]) for j in ev.jobs] == [["bad", "baseline", "good"], ["good"], ["bad"], ["baseline"],
                                                       ["baseline", "good"]]
    assert [j.get("peers", True) for j in ev.jobs] == [True, False, False, False, True]
    assert all(j["baseline"]["cubin"] for j in ev.jobs)  # our kernels are verified against the baseline


def test_a_crash_that_needs_two_kernels_still_costs_no_run(compile_cache):
    ev = ScriptedEvaluator(lambda job: {"a", "b"} <= set(job["kernels"]))
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=_ours("a", "b"))
    assert reply["failed"] == {} and reply["separate_loops"]
    assert {"a", "b", "torch_eager"} <= set(reply["peers"])


def test_refused_kernels_of_ours_are_failed_not_errors(compile_cache):
    ev = ScriptedEvaluator(lambda job: False)
    ours = {**_ours("good"), "wide": (TOO_MANY_THREADS, {})}
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=ours)
    assert reply["failed"]["wide"].startswith("RESOURCE_ERROR") and "1024" in reply["failed"]["wide"]
    assert list(ev.jobs[0]["kernels"]) == ["good"]


def test_a_loop_that_fails_without_any_kernel_of_ours_is_an_evaluator_error(compile_cache):
    ev = ScriptedEvaluator(lambda job: True)
    with pytest.raises(EvaluatorError, match="none of our kernels"):
        ev.time_peers_full("silu_and_mul", "float16", ours={})


def test_a_refusal_is_the_verdict_and_starts_no_sandbox(compile_cache):
    ev = GpuEvaluator(arch="sm_90", start_timeout_s=5.0)
    result = ev.evaluate(EvalRequest("silu_and_mul", Variant("silu_and_mul", TOO_MANY_THREADS)))
    assert result.status is Status.RESOURCE_ERROR and "1024" in result.message
    assert ev._worker is None


def _artifact(source: str, params: dict[str, int] | None = None) -> Artifact:
    artifact = admit(load_kernel("silu_and_mul"), source, "float16", params, arch="sm_90")
    assert isinstance(artifact, Artifact), artifact
    return artifact


@pytest.mark.parametrize("change", ["variant", "dtype", "params"])
def test_an_artifact_for_another_request_is_refused_loudly(compile_cache, change):
    ev = GpuEvaluator(arch="sm_90", start_timeout_s=5.0)
    artifact = _artifact(HONEST, {"BLOCK": 128})
    request = EvalRequest("silu_and_mul", Variant("silu_and_mul", HONEST), params={"BLOCK": 128})
    if change == "variant":
        request = EvalRequest("silu_and_mul", Variant("silu_and_mul", HONEST + "\n"), params={"BLOCK": 128})
    elif change == "dtype":
        request = EvalRequest("silu_and_mul", Variant("silu_and_mul", HONEST), params={"BLOCK": 128},
                              dtype="bfloat16")
    else:
        request = EvalRequest("silu_and_mul", Variant("silu_and_mul", HONEST), params={"BLOCK": 256})
    with pytest.raises(EvaluatorError, match="artifact"):
        ev.evaluate(request, artifact)
    assert ev._worker is None


class PeerCrashEvaluator(ScriptedEvaluator):
    """A sandbox in which peer ``peer`` ends the process on the shapes in ``kills`` unless the
    job leaves it out there (``exclude_peers``), as a library's segfault would."""

    def __init__(self, peer: str, kills: set[str]) -> None:
        super().__init__(lambda job: False)
        self.peer, self.kills = peer, kills

    def _job(self, job: dict[str, Any], timeout_s: float | None = None) -> tuple[str, dict[str, Any]]:
        from evaluators.peer_steps import EVERY_SHAPE, peer_step

        loops = job.get("loops", [job])
        for loop in loops:
            left_out = loop.get("exclude_peers", {}).get(self.peer, {})
            for label in sorted(self.kills):
                if loop.get("peers", True) and EVERY_SHAPE not in left_out and label not in left_out:
                    self.jobs.append(job)
                    return "died", {"exitcode": -11, "last_step": peer_step(self.peer, label)}
        if "loops" in job:
            self.jobs.append(job)
            return "result", {"status": "OK", "loops": [super(PeerCrashEvaluator, self)._job(loop)[1] for loop in loops]}
        return super()._job(job, timeout_s)


def test_a_peer_that_ends_the_process_on_a_shape_is_left_out_there_only(compile_cache):
    ev = PeerCrashEvaluator("flashinfer", {"[16, 14336]"})
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=_ours("good", "baseline"))
    assert {"good", "baseline", "torch_eager"} <= set(reply["peers"]) and reply["failed"] == {}
    assert len(ev.jobs) == 2  # the loop that died, then the loop without that peer on that shape
    left_out = ev.jobs[-1]["exclude_peers"]
    assert list(left_out) == ["flashinfer"] and list(left_out["flashinfer"]) == ["[16, 14336]"]
    assert "exit code -11" in left_out["flashinfer"]["[16, 14336]"]


def test_a_peer_that_ends_the_process_on_two_shapes_is_still_timed_on_the_others(compile_cache):
    # FlashInfer's merge_state ends the process on the head sizes it was not built for and runs
    # on the rest: the shapes where it ran keep it.
    ev = PeerCrashEvaluator("flashinfer", {"[1, 11008]", "[16, 14336]"})
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=_ours("good", "baseline"))
    assert reply["failed"] == {} and "good" in reply["peers"]
    assert len(ev.jobs) == 3
    left_out = ev.jobs[-1]["exclude_peers"]["flashinfer"]
    assert sorted(left_out) == ["[1, 11008]", "[16, 14336]"]  # those shapes only, not EVERY_SHAPE


def test_the_evaluator_remembers_where_a_peer_ended_the_process(compile_cache):
    # the next loop of the same kernel and dtype leaves the peer out there from its start
    ev = PeerCrashEvaluator("flashinfer", {"[16, 14336]"})
    ev.time_peers_full("silu_and_mul", "float16", ours=_ours("good", "baseline"))
    first = len(ev.jobs)
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=_ours("good", "baseline"))
    assert len(ev.jobs) == first + 1 and reply["failed"] == {}
    assert list(ev.jobs[-1]["exclude_peers"]["flashinfer"]) == ["[16, 14336]"]
    # another dtype is another kernel to the library: it learns there afresh
    ev.time_peers_full("silu_and_mul", "bfloat16", ours=_ours("good", "baseline"))
    assert "exclude_peers" not in ev.jobs[first + 1]


def test_a_round_told_where_a_peer_ends_its_process_leaves_it_out_from_the_start(compile_cache):
    # what the compile-ahead process found (search.finalize: the loops' exclude_peers): the round
    # runs once, with those calls left out in its loop only, and why is the loop's error
    class OnItsShapes(PeerCrashEvaluator):  # a loop dies only on a shape it has
        def _job(self, job: dict[str, Any], timeout_s: float | None = None) -> tuple[str, dict[str, Any]]:
            from evaluators.peer_steps import peer_step

            for loop in job.get("loops", [job]):
                left_out = loop.get("exclude_peers", {}).get(self.peer, {})
                dies = {shape_label(s) for s in loop["shapes"]} & self.kills - set(left_out)
                if dies:
                    self.jobs.append(job)
                    return "died", {"exitcode": -11, "last_step": peer_step(self.peer, min(dies))}
            saved, self.kills = self.kills, set()  # it lives: the answer as the parent class gives it
            try:
                return super()._job(job, timeout_s)
            finally:
                self.kills = saved

    ev = OnItsShapes("flashinfer", {"[16, 14336]"})
    why = "its first call ended a compile-ahead process (rc -11: ...); not timed here"
    replies = ev.time_round("silu_and_mul", "float16", [
        {"shape_set": "search", "ours": _ours("good"), "exclude_peers": {"flashinfer": {"[16, 14336]": why}}},
        {"shape_set": "heldout", "ours": _ours("good")}])
    rounds = [j for j in ev.jobs if j.get("type") == "peers_round"]  # (the fake records each loop's too)
    assert len(rounds) == 1 and [r["failed"] for r in replies] == [{}, {}]
    search, heldout = rounds[0]["loops"]
    assert search["exclude_peers"] == {"flashinfer": {"[16, 14336]": why}} and "exclude_peers" not in heldout


def test_where_a_peer_ended_a_loops_process_adds_to_what_the_loop_left_out_from_the_start(compile_cache):
    ev = PeerCrashEvaluator("flashinfer", {"[1, 11008]", "[16, 14336]"})
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=_ours("good", "baseline"),
                               exclude_peers={"flashinfer": {"[16, 14336]": "found ahead"}})
    assert reply["failed"] == {} and len(ev.jobs) == 2  # one death, on the shape nobody knew of
    assert ev.jobs[-1]["exclude_peers"]["flashinfer"]["[16, 14336]"] == "found ahead"
    assert "exit code -11" in ev.jobs[-1]["exclude_peers"]["flashinfer"]["[1, 11008]"]


def test_peer_exclusions_are_bounded():
    from evaluators.gpu import PEER_EXCLUSIONS
    from evaluators.peer_steps import EVERY_SHAPE, peer_step

    class EveryPeerDies(ScriptedEvaluator):
        def _job(self, job: dict[str, Any], timeout_s: float | None = None) -> tuple[str, dict[str, Any]]:
            self.jobs.append(job)  # a new peer name every time: never the same one left out twice
            return "died", {"exitcode": -11, "last_step": peer_step(f"peer{len(self.jobs)}", "[1, 2]")}

    ev = EveryPeerDies(lambda job: False)
    reply, why = ev._peers_job({"type": "peers", "kernels": {}})
    assert reply is None and "exit code -11" in why
    # the re-runs, then one last run with every peer that ended a process left out everywhere
    assert len(ev.jobs) == PEER_EXCLUSIONS + 2
    last = ev.jobs[-1]["exclude_peers"]
    assert len(last) == PEER_EXCLUSIONS + 1 and all(list(v) == [EVERY_SHAPE] for v in last.values())


def test_a_peer_that_crashes_on_every_shape_costs_a_bounded_number_of_runs(compile_cache):
    from evaluators.gpu import PEER_EXCLUSIONS
    from evaluators.peer_steps import EVERY_SHAPE

    spec = load_kernel("silu_and_mul")
    labels = {shape_label(s) for s in spec.shapes("search")} | {f"[{i}, 1]" for i in range(PEER_EXCLUSIONS)}
    ev = PeerCrashEvaluator("flashinfer", labels)
    reply = ev.time_peers_full("silu_and_mul", "float16", ours=_ours("good", "baseline"))
    assert reply["failed"] == {}
    assert len(ev.jobs) == PEER_EXCLUSIONS + 2
    assert list(ev.jobs[-1]["exclude_peers"]["flashinfer"]) == [EVERY_SHAPE]


def test_a_round_keeps_the_loops_that_ran_when_one_fails_on_its_own(compile_cache):
    # the held-out loop's peers crash with or without our kernels (no peer named): the round's
    # search-shape loop still answers
    ev = ScriptedEvaluator(lambda job: job.get("type") == "peers_round" or (
        job.get("shapes") == [dict(s) for s in load_kernel("silu_and_mul").shapes("heldout")] and job.get("peers", True)))
    replies = ev.time_round("silu_and_mul", "float16", [{"shape_set": "search", "ours": _ours("good")},
                                                        {"shape_set": "heldout", "ours": _ours("good")}])
    assert "good" in replies[0]["peers"]
    assert "none of our kernels" in replies[1]["loop_error"]
