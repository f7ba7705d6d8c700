"""The order of the end of a run (search.finalize.EndOfRun) against a scripted evaluator: every
kernel's final timing (a timed call) comes first; then each kernel's sanitizer runs and
peers' loops are asked for together, so that the loops' set-ups overlap the sanitizer runs;
a result is put together once both are in, and a winner the sanitizer catches is replaced by
the baseline, whose loops start anew while the old winner's late answers are dropped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kernels.records import Stage
from kernels.spec import kernel_ref, load_kernel, shape_label
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status
from search.compile_ahead import GATE_WAIT_S, CompiledAhead
from search.dispatch import single
from search.finalize import EndOfRun, _Progress
from search.selection import Scored
from search.state import KernelState

KERNELS = ("silu_and_mul", "fused_add_rmsnorm")


def _ok(shapes: Any, ms: float) -> Evaluation:
    return Evaluation(Status.OK, shapes=tuple(ShapeResult(dict(s), ms, ms * 2) for s in shapes))


class Scripted:
    """The controller's side: jobs and calls are held until the test answers them."""

    def __init__(self) -> None:
        self.jobs: list[Any] = []
        self.calls: list[tuple[str, str, Any]] = []  # (method, kernel, done)
        evaluator = SimpleNamespace(peer_runs=2, compile_trials=1, fresh_peers=False, compile_ahead=False, peers=True,
                                    overlap_rounds=True, sanitize=True)
        self.config = SimpleNamespace(evaluator=evaluator, search=SimpleNamespace(dispatch=1))
        self.answers: dict[str, Any] = {}
        self.records = SimpleNamespace(run_id="run-x")

    def submit(self, job: Any) -> None:
        self.jobs.append(job)

    def recorded_call(self, key: str, done: Any, method: str, ref: Any, *args: Any, exclusive: bool = True,
                      what: str = "") -> None:
        self.calls.append((method, what.split()[0], (done, args)))

    def pending(self, method: str, kernel: str | None = None) -> list[Any]:
        return [c for c in self.calls if c[0] == method and (kernel is None or c[1] == kernel)]

    def answer_jobs(self) -> None:
        while self.jobs:
            job = self.jobs.pop(0)
            shapes = job.state.heldout_shapes() if job.stage is Stage.HELDOUT else job.state.search_shapes()
            job.on_done(_ok(shapes, 1.0 if job.variant.id != job.state.baseline.id else 3.0))

    def answer_rounds(self, kernel: str) -> None:
        for call in self.pending("time_round", kernel):
            self.calls.remove(call)
            done, (dtype, loops, *_rest) = call[2]
            spec = load_kernel(kernel)
            replies = []
            for loop in loops:
                labels = [shape_label(s) for s in spec.shapes(loop["shape_set"])]
                timed = (*loop["ours"], *(["torch_compile"] if loop.get("peers", True) else []))
                replies.append({"peers": {name: {lb: 1.0 for lb in labels} for name in timed}, "failed": {}, "errors": {}})
            done({"loops": replies}, "")

    def answer_sanitizer(self, kernel: str, status: str) -> None:
        for call in self.pending("sanitize", kernel):
            self.calls.remove(call)
            call[2][0]({"status": status, "summary": f"{status.lower()} (scripted)"}, "")


def _end() -> tuple[EndOfRun, Scripted]:
    ctl = Scripted()
    end = EndOfRun.__new__(EndOfRun)
    end.ctl, end.cache, end.ahead = ctl, None, None  # type: ignore[assignment]
    end.loops_expected, end.loops_done, end.loops_started = 8, 0, 0.0
    end.compiling, end.waiting, end.kernels, end.released = 0, [], {}, False
    for name in KERNELS:
        spec = load_kernel(name)
        st = KernelState(spec, kernel_ref(name), "float16", 1, 1, 1)
        st.baseline_scored = Scored(st.baseline, _ok(spec.search_shapes, 3.0))
        winner = Scored(Variant(name, "// faster\n" + st.baseline.source), _ok(spec.search_shapes, 1.0))
        k = _Progress(st, [winner, st.baseline_scored])
        k.winner, k.heldout = winner, _ok(spec.heldout_shapes, 1.0)
        k.dispatch = single(winner, spec.search_shapes)
        k.member_heldout = {winner.variant.id: k.heldout}
        end.kernels[name] = k
    return end, ctl


def test_the_sanitizer_runs_beside_the_loops_once_every_final_timing_is_in() -> None:
    end, ctl = _end()
    for k in end.kernels.values():
        end._final(k)
    assert ctl.calls == []  # nothing beside a timed call: the final timings are still out
    ctl.answer_jobs()
    # Both kernels' sanitizer runs and rounds are asked for together, before any answers.
    assert len(ctl.pending("sanitize")) == 2 and len(ctl.pending("time_round")) == 2 * 2
    ctl.answer_rounds("silu_and_mul")
    assert end.kernels["silu_and_mul"].result is None  # its sanitizer verdict is not in yet
    ctl.answer_sanitizer("silu_and_mul", "CLEAN")
    result = end.kernels["silu_and_mul"].result
    assert result is not None and result.sanitizer["status"] == "CLEAN"
    assert result.winner.variant.source.startswith("// faster") and result.final.status is Status.OK
    assert len(result.peer_runs) == 2
    ctl.answer_sanitizer("fused_add_rmsnorm", "CLEAN")  # the verdict first, the loops after
    assert end.kernels["fused_add_rmsnorm"].result is None
    ctl.answer_rounds("fused_add_rmsnorm")
    assert end.kernels["fused_add_rmsnorm"].result is not None


def test_a_winner_the_sanitizer_catches_gives_way_to_the_baseline_and_its_loops_are_dropped() -> None:
    end, ctl = _end()
    for k in end.kernels.values():
        end._final(k)
    ctl.answer_jobs()
    old_rounds = ctl.pending("time_round", "silu_and_mul")
    for call in old_rounds:
        ctl.calls.remove(call)
    ctl.answer_sanitizer("silu_and_mul", "FINDINGS")
    k = end.kernels["silu_and_mul"]
    assert k.winner is k.st.baseline_scored
    ctl.answer_jobs()  # the baseline's held-out check and final timing
    assert len(ctl.pending("time_round", "silu_and_mul")) == 2  # the baseline's loops, anew
    assert ctl.pending("sanitize", "silu_and_mul") == []  # the baseline is not sanitized
    for call in old_rounds:  # the caught winner's loops answer late: dropped
        done, (dtype, loops, *_rest) = call[2]
        done({"loops": [{"peers": {}, "failed": {"best": "should never be read"}, "errors": {}} for _ in loops]}, "")
    assert k.result is None
    ctl.answer_rounds("silu_and_mul")
    assert k.result is not None and k.result.winner is k.st.baseline_scored
    assert "sanitizer" in k.result.rejected_why[k.result.rejected[0]] and not k.result.peer_failures


def test_compilations_ahead_start_with_the_sanitizer_runs_not_before_the_final_timings() -> None:
    """Compile-ahead: its processes are non-exclusive calls too, so they are asked for once
    every final timing is in (a final timing asked for while they ran would wait for them
    all), and no round is asked for while they run."""
    end, ctl = _end()
    ctl.config.evaluator.compile_ahead = True
    asked: list[Any] = []
    ctl.pool = SimpleNamespace(call=lambda done, method, *args, **kw: asked.append((method, done)))  # type: ignore[attr-defined]
    for k in end.kernels.values():
        end._final(k)
    assert asked == []
    ctl.answer_jobs()
    # One compilation per kernel and shape set, loaded by every round's loop on that set.
    assert len(asked) == 2 * 2 and {m for m, _ in asked} == {"precompile"}  # kernels x shape sets
    assert len(ctl.pending("sanitize")) == 2 and ctl.pending("time_round") == []
    for n, (_, done) in enumerate(asked):
        done({"status": "OK", "folder": f"/tmp/x{n}"}, "")
    rounds = ctl.pending("time_round")
    assert len(rounds) == 2 * 2
    for kernel in end.kernels:
        folders = [[loop["compile_cache"] for loop in call[2][1][1]] for call in ctl.pending("time_round", kernel)]
        assert len(folders) == 2 and folders[0] == folders[1]  # both rounds: the same folder per shape set
        assert len(set(folders[0])) == len(folders[0]) and all(folders[0])  # a folder of its own per shape set


def _compilations_asked(end: EndOfRun, ctl: Scripted) -> list[tuple[str, str, Any]]:
    """Every final timing answered: the compilations ahead the end asks the pool for, as
    (kernel, shape set, the callback that answers it)."""
    asked: list[tuple[str, str, Any]] = []
    ctl.pool = SimpleNamespace(call=lambda done, method, ref, dtype, shape_set, *a, **kw:  # type: ignore[attr-defined]
                               asked.append((ref.name, shape_set, done)))
    for k in end.kernels.values():
        end._final(k)
    ctl.answer_jobs()
    return asked


def test_compilations_made_beside_the_search_are_taken_not_made_again() -> None:
    """What was compiled beside the search (search.compile_ahead) is taken as it came back: a
    folder for the rounds to load, or a failure after which they compile for themselves; only
    the (kernel, shape set) pairs without such a report are compiled at the end."""
    end, ctl = _end()
    ctl.config.evaluator.compile_ahead = True
    ahead = CompiledAhead("run-x")
    ahead.started |= {("silu_and_mul", "search"), ("silu_and_mul", "heldout")}
    ahead._answered(("silu_and_mul", "search"), {"status": "OK", "folder": "/tmp/made-beside"}, "")
    ahead._answered(("silu_and_mul", "heldout"), None, "the evaluator process died")
    assert ahead.pending() == 0
    end.ahead = ahead
    asked = _compilations_asked(end, ctl)
    assert sorted((name, s) for name, s, _ in asked) == [("fused_add_rmsnorm", "heldout"), ("fused_add_rmsnorm", "search")]
    assert ctl.pending("time_round") == []  # the other kernel's compilations are still out
    for _, shape_set, done in asked:
        done({"status": "OK", "folder": f"/tmp/end-{shape_set}"}, "")
    for call in ctl.pending("time_round", "silu_and_mul"):
        assert [loop["compile_cache"] for loop in call[2][1][1]] == ["/tmp/made-beside", None]
    for call in ctl.pending("time_round", "fused_add_rmsnorm"):
        assert [loop["compile_cache"] for loop in call[2][1][1]] == ["/tmp/end-search", "/tmp/end-heldout"]


def test_where_a_peer_ended_a_compile_ahead_process_its_loops_leave_it_out_from_the_start() -> None:
    """A compile-ahead report's ``peer_crashes`` (evaluators.peer_compile) goes to every round's
    loop on that shape set as its ``exclude_peers``, and to no loop of another shape set or
    kernel: the loops' processes do not die there one shape at a time."""
    end, ctl = _end()
    ctl.config.evaluator.compile_ahead = True
    asked = _compilations_asked(end, ctl)
    crashes = {"flashinfer": {"[7, 18944]": "its first call ended a compile-ahead process (rc -11: ...)"}}
    for name, shape_set, done in asked:
        hit = name == "silu_and_mul" and shape_set == "heldout"
        done({"status": "OK", "folder": f"/tmp/{name}-{shape_set}", **({"peer_crashes": crashes} if hit else {})}, "")
    for kernel in KERNELS:
        for call in ctl.pending("time_round", kernel):
            left_out = {loop["shape_set"]: loop["exclude_peers"] for loop in call[2][1][1]}
            assert left_out == ({"search": {}, "heldout": crashes} if kernel == "silu_and_mul"
                                else {"search": {}, "heldout": {}})


def test_peers_timed_beside_the_search_are_taken_by_the_end_of_run_loops() -> None:
    """With peers_beside_search, a kernel's peers' rounds start once its compilations on every
    shape set are in: one background call per round, the baseline and the peers of each shape
    set in one process, timing behind the run's gate. The end-of-run loops then time our kernels
    alone and take each round's peers' figures, anchored on the baseline; the loops of a round
    that gave none time the peers themselves, from the folders compiled beside the search."""
    end, ctl = _end()
    cfg = ctl.config.evaluator
    cfg.compile_ahead, cfg.peers_beside_search = True, True
    asked: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = []
    pool = SimpleNamespace(call=lambda done, method, *args, **kw: asked.append((method, done, args, kw)))
    ahead = CompiledAhead("run-x", cfg)  # type: ignore[arg-type]
    ahead.start(pool, [(end.kernels[n].st, s) for n in KERNELS for s in ("search", "heldout")])  # type: ignore[arg-type]
    compiles = {(args[0].name, args[2]): done for method, done, args, _ in asked if method == "precompile"}
    asked.clear()
    compiles[("silu_and_mul", "search")]({"status": "OK", "folder": "/tmp/silu-search"}, "")
    assert asked == []  # its held-out shapes' compilations are not in yet
    crashes = {"flashinfer": {"[7, 18944]": "ended a process"}}
    compiles[("silu_and_mul", "heldout")]({"status": "OK", "folder": "/tmp/silu-heldout", "peer_crashes": crashes}, "")
    compiles[("fused_add_rmsnorm", "search")](None, "the evaluator process died")
    compiles[("fused_add_rmsnorm", "heldout")](None, "the evaluator process died")
    rounds = [(done, args, kw) for method, done, args, kw in asked if method == "time_round"]
    assert len(rounds) == 2 and all(kw.get("background") for _, _, kw in rounds)
    for _, (ref, dtype, loops, beside_others, gate, until), _ in rounds:
        assert ref.name == "silu_and_mul" and dtype == "float16" and beside_others and gate == ahead.gate
        assert until == ahead.since + GATE_WAIT_S  # a gate nobody opens does not hold the end for ever
        assert [loop["shape_set"] for loop in loops] == ["search", "heldout"]
        assert all(set(loop["ours"]) == {"baseline"} and loop["peers"] for loop in loops)
        assert [loop["compile_cache"] for loop in loops] == ["/tmp/silu-search", "/tmp/silu-heldout"]
        assert [loop["exclude_peers"] for loop in loops] == [{}, crashes]
    spec = load_kernel("silu_and_mul")
    replies = []
    for shape_set in ("search", "heldout"):
        labels = [shape_label(s) for s in spec.shapes(shape_set)]
        replies.append({"peers": {"baseline": {lb: 3.0 for lb in labels}, "torch_compile": {lb: 2.0 for lb in labels}},
                        "failed": {}, "errors": {}, "nice_timed": 0,
                        "phase_s": {"prepare": 12.5, "search_end_wait": 40.0, "wait": 1.0, "loop": 0.8}})
    rounds[0][0]({"loops": replies}, "")
    rounds[1][0](None, "the round's process died")
    assert ahead.measured("silu_and_mul", "search", 0) is not None and ahead.measured("silu_and_mul", "search", 1) is None
    assert ahead.summary()["silu_and_mul/heldout"]["peer_rounds"] == 1
    # where each round's time went, for the run's summary: its set-up, its wait for the search's end
    assert ahead.summary()["silu_and_mul/search"]["peer_round_phase_s"] == {
        "0": {"prepare": 12.5, "search_end_wait": 40.0, "wait": 1.0, "loop": 0.8, "nice_timed": 0}}

    end.ahead = ahead
    ctl.pool = SimpleNamespace(call=lambda *a, **kw: None)  # type: ignore[attr-defined]
    for k in end.kernels.values():
        end._final(k)
    ctl.answer_jobs()
    silu = ctl.pending("time_round", "silu_and_mul")
    by_round = {call[2][1][1][0]["peers"]: call for call in silu}
    assert len(silu) == 2 and set(by_round) == {False, True}
    assert [loop["compile_cache"] for loop in by_round[True][2][1][1]] == ["/tmp/silu-search", "/tmp/silu-heldout"]
    assert all(loop["peers"] for call in ctl.pending("time_round", "fused_add_rmsnorm") for loop in call[2][1][1])
    ctl.answer_rounds("silu_and_mul")
    ctl.answer_sanitizer("silu_and_mul", "CLEAN")
    result = end.kernels["silu_and_mul"].result
    assert result is not None
    first, second = result.peer_runs
    # loop 1: the round beside the search's 2.0, times the baseline's 1.0 here over its 3.0 there
    assert all(abs(t - 2.0 / 3.0) < 1e-12 for t in first["torch_compile"].values())
    assert all(t == 1.0 for t in second["torch_compile"].values())  # loop 2 timed the peers itself
    cached = result.peer_extra["cached_peers"]
    assert cached[0]["run_id"] == "run-x" and cached[1] is None


def test_no_peers_round_beside_the_search_without_the_setting() -> None:
    end, ctl = _end()
    cfg = ctl.config.evaluator
    cfg.compile_ahead, cfg.peers_beside_search = True, False
    asked: list[tuple[str, Any]] = []
    ahead = CompiledAhead("run-x", cfg)  # type: ignore[arg-type]
    ahead.start(SimpleNamespace(call=lambda done, method, *a, **kw: asked.append((method, done))),  # type: ignore[arg-type]
                [(end.kernels["silu_and_mul"].st, s) for s in ("search", "heldout")])
    for _, done in list(asked):
        done({"status": "OK", "folder": "/tmp/x"}, "")
    assert [m for m, _ in asked] == ["precompile", "precompile"]
    ahead.open_gate()  # nothing waits at the gate: nothing to open
    assert ahead.gate_opened_s is None


def test_the_gate_opens_at_the_search_end_even_before_any_round_began() -> None:
    """Compilations that answer only after the search (a slow machine, a short search) start
    their rounds after the gate was opened: it must have been opened all the same, or they
    would wait at it until their deadline and the end's wait with them."""
    end, ctl = _end()
    cfg = ctl.config.evaluator
    cfg.compile_ahead, cfg.peers_beside_search = True, True
    asked: list[tuple[str, Any, tuple[Any, ...]]] = []
    opened: list[str] = []
    pool = SimpleNamespace(call=lambda done, method, *args, **kw: asked.append((method, done, args)),
                           open_gates=opened.append)
    ahead = CompiledAhead("run-x", cfg)  # type: ignore[arg-type]
    ahead.start(pool, [(end.kernels["silu_and_mul"].st, s) for s in ("search", "heldout")])  # type: ignore[arg-type]
    ahead.open_gate()  # the search is over; no compilation has answered, no round has begun
    assert opened == [ahead.gate] and ahead.gate_opened_s is not None
    for _method, done, args in list(asked):
        done({"status": "OK", "folder": f"/tmp/{args[2]}"}, "")
    rounds = [args for method, _, args in asked if method == "time_round"]
    assert len(rounds) == cfg.peer_runs and all(args[4] == ahead.gate for args in rounds)
    ahead.open_gate()  # once
    assert opened == [ahead.gate]
