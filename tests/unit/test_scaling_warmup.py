"""The throughput comparison (experiments/scaling.py) and the peer warm-up's process handling."""

from __future__ import annotations

import json
import time
from pathlib import Path

from evaluators.peer_warmup import PeerWarmup
from experiments.scaling import main as scaling_main
from experiments.scaling import run_rates
from kernels.records import EvalRecord, Stage
from kernels.variant import Variant
from kernels.verdict import Evaluation, Status


def _record(stage: Stage, time_s: float, busy_s: float, i: int) -> dict:
    variant = Variant("k", f"// variant {i}\n")
    return EvalRecord("r", "k", "float16", 0, "a", stage, None, variant, Evaluation(Status.COMPILE_ERROR),
                      time=time_s, busy_s=busy_s).to_dict()


def _run(tmp: Path, name: str, n_gpus: int, trial_s: float, n: int = 60) -> Path:
    run = tmp / name
    run.mkdir()
    t0 = 1000.0
    rows = [_record(Stage.SCREEN, t0 + (i + 1) * trial_s, trial_s, i) for i in range(n)]
    rows.append(_record(Stage.FINAL, t0 + n * trial_s + 30.0, 1.0, n))
    (run / "evaluations.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    summary = {"run_id": name, "command": "python -m search.run", "git_commit": "abc", "gpu": "G", "date": "d",
               "n_gpus": n_gpus, "wall_s": n * trial_s + 60.0, "gpu_busy_fraction": 0.8,
               "kernels": [{"kernel": "k", "speedup_search": 2.0}]}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_rates_come_from_the_search_phase_of_the_records(tmp_path):
    one = run_rates(_run(tmp_path, "one", 1, 1.0))
    assert one["variant_trials"] == 60
    assert abs(one["search_phase_s"] - 60.0) < 1e-6  # the final stage is not search work
    assert abs(one["trials_per_min"] - 60.0) < 1e-6


def test_two_gpu_ratio_and_target(tmp_path):
    out = tmp_path / "scaling"
    assert scaling_main([str(_run(tmp_path, "one", 1, 1.0)), str(_run(tmp_path, "two", 2, 0.5)), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert abs(data["ratio_search_phase"] - 2.0) < 1e-6
    assert "(target 1.8x: met)" in out.with_suffix(".md").read_text()
    scaling_main([str(_run(tmp_path, "one1", 1, 1.0)), str(_run(tmp_path, "slow", 2, 0.8)), "--out", str(out)])
    assert "NOT met" in out.with_suffix(".md").read_text()


def test_warmup_processes_end_and_log(tmp_path):
    # On a machine without a GPU the processes fail at once; on one with a GPU they compile.
    # Either way wait() returns once they have ended and each wrote its log.
    warm = PeerWarmup(["silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse"], "float16", tmp_path, processes=2)
    assert len(warm.procs) == 2
    warm.wait(timeout_s=300.0)
    assert all(p.poll() is not None for p in warm.procs)
    assert sorted(p.name for p in tmp_path.glob("peer_warmup-*.log")) == ["peer_warmup-0.log", "peer_warmup-1.log"]


def test_warmup_stop_kills_what_still_runs(tmp_path):
    warm = PeerWarmup(["silu_and_mul"], "float16", tmp_path, processes=1)
    start = time.time()
    warm.stop()
    assert warm.procs[0].poll() is not None and time.time() - start < 30.0


def test_warmup_stop_kills_what_its_processes_started(tmp_path):
    """A warm-up process's own children (a build it started) end with it, not after it."""
    import os

    from evaluators.proc_group import start_group
    from tests.unit.test_proc_group import alive, parent_of_a_child, wait_for_child

    warm = PeerWarmup(["silu_and_mul"], "float16", tmp_path, processes=1)
    warm.stop()
    # In its place a process that starts a long child and waits: the child stands for a build.
    pid_file = tmp_path / "child.pid"
    warm.procs = [start_group(parent_of_a_child(pid_file), env=dict(os.environ), cwd=tmp_path)]
    child = wait_for_child(pid_file)
    warm.stop()
    assert warm.procs[0].poll() is not None
    deadline = time.time() + 10
    while alive(child):
        assert time.time() < deadline, "the leader's child outlived stop()"
        time.sleep(0.05)


def test_the_end_of_a_run_stops_a_warm_up_that_still_runs_instead_of_waiting(tmp_path, capsys):
    import os
    import sys

    from evaluators.proc_group import start_group
    from search.finalize import stop_warmup

    warm = PeerWarmup(["silu_and_mul"], "float16", tmp_path, processes=1)
    warm.stop()
    # In its place a process that would run for a minute: the end of the run must not wait.
    warm.procs = [start_group([sys.executable, "-c", "import time; time.sleep(60)"], env=dict(os.environ), cwd=tmp_path)]
    start = time.time()
    ran = stop_warmup(warm)
    assert ran is not None and time.time() - start < 10.0
    assert warm.procs[0].poll() is not None and not warm.running()
    assert "peer warm-up stopped" in capsys.readouterr().out
    assert stop_warmup(warm) is None  # nothing left to stop: no message


def test_the_warm_up_builds_every_kernels_libraries_before_compiling_any(monkeypatch, capsys):
    """A warm-up stopped part way should leave the libraries' builds (FlashInfer's JIT, about 20 s
    an op, paid again by every loop that finds them missing) done before torch.compile's work."""
    from evaluators import peer_warmup

    order: list[tuple[str, str]] = []
    monkeypatch.setattr(peer_warmup, "warm_libraries", lambda k, d, s: order.append(("libraries", k)) or {"kernel": k})
    monkeypatch.setattr(peer_warmup, "warm_kernel", lambda k, d, s: order.append(("compile", k)) or {"kernel": k})
    assert peer_warmup.main(["silu_and_mul", "merge_attn_states_lse"]) == 0
    assert order == [("libraries", "silu_and_mul"), ("libraries", "merge_attn_states_lse"),
                     ("compile", "silu_and_mul"), ("compile", "merge_attn_states_lse")]
    assert len(capsys.readouterr().out.splitlines()) == 4  # one report line per step


def test_library_warm_up_reports_per_kernel_and_skips_a_dtype_the_kernel_lacks():
    """warm_libraries reports a kernel's library first calls (without CUDA no shape gets inputs,
    so none is called, and it still returns); a dtype the kernel lacks is skipped."""
    from evaluators import peer_warmup

    got = peer_warmup.warm_libraries("silu_and_mul", "float16")
    assert got["kernel"] == "silu_and_mul" and isinstance(got["libraries"], dict)
    assert peer_warmup.warm_libraries("silu_and_mul", "float64").get("skipped") == "no float64"
