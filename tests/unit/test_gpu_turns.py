"""evaluators/gpu_turns.py: set-ups share a GPU, timing has it alone, across processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from evaluators.gpu_turns import GpuTurns

PROBE = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
         "mode = fcntl.LOCK_SH if sys.argv[2] == 'shared' else fcntl.LOCK_EX\n"
         "try:\n    fcntl.flock(fd, mode | fcntl.LOCK_NB); print('free')\n"
         "except BlockingIOError:\n    print('held')\n")


def other(path: Path, mode: str) -> str:
    """What another process gets, without waiting, when it asks for ``mode``."""
    return subprocess.run([sys.executable, "-c", PROBE, str(path), mode], capture_output=True,
                          text=True).stdout.strip()


def sharing_for(path: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process that holds the lock shared for ``seconds`` (a set-up), once it holds it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
         f" fcntl.flock(fd, fcntl.LOCK_SH); print('in', flush=True); time.sleep({seconds})", str(path)],
        stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "in"
    return proc


def test_sharing_admits_other_set_ups_and_keeps_timing_out(tmp_path: Path):
    path = tmp_path / "gpu.lock"
    hold = GpuTurns(path)
    with hold.shared():
        assert hold.mode == "shared"
        assert other(path, "shared") == "free"
        assert other(path, "exclusive") == "held"
    assert hold.mode == "none"
    assert other(path, "exclusive") == "free"


def test_timing_inside_a_share_converts_and_returns_to_sharing(tmp_path: Path):
    """A process that shares the GPU for its whole life and times in between does not wait for
    itself, keeps everyone out while it times and shares again after."""
    path = tmp_path / "gpu.lock"
    hold = GpuTurns(path)
    hold.hold_shared()
    with hold.alone():
        assert hold.mode == "alone"
        assert other(path, "shared") == "held"
        with hold.shared(), hold.alone():  # nested either way: no wait for itself
            pass
        assert hold.mode == "alone"
    assert hold.mode == "shared"
    assert other(path, "shared") == "free"
    assert other(path, "exclusive") == "held"


def test_timing_waits_for_another_process_to_end_its_set_up(tmp_path: Path):
    path = tmp_path / "gpu.lock"
    setting_up = sharing_for(path, 1.5)
    hold = GpuTurns(path)
    hold.hold_shared()  # this process's own set-up shares with the other's
    start = time.monotonic()
    with hold.alone():
        waited = time.monotonic() - start
        # The other's set-up had ended: its lock goes with its exit, which the kernel may finish
        # a moment after releasing the lock (poll() could still say it runs), so wait for it.
        assert setting_up.wait(timeout=5) == 0
    assert waited > 1.0  # it held the lock for 1.5 s after it said so


def test_a_thread_waits_while_another_thread_of_the_process_times(tmp_path: Path):
    hold = GpuTurns(tmp_path / "gpu.lock")
    order: list[str] = []
    timing = threading.Event()

    def setter_up() -> None:
        timing.wait()
        with hold.shared():
            order.append("set-up")

    t = threading.Thread(target=setter_up)
    t.start()
    with hold.alone():
        timing.set()
        time.sleep(0.3)
        order.append("timed")
    t.join()
    assert order == ["timed", "set-up"]


def test_a_process_waiting_to_time_beats_while_it_waits(tmp_path: Path):
    path = tmp_path / "gpu.lock"
    setting_up = sharing_for(path, 1.0)
    hold = GpuTurns(path)
    hold.hold_shared()
    beats: list[float] = []
    with hold.alone(waiting=lambda: beats.append(time.monotonic()), every_s=0.2):
        assert other(path, "shared") == "held"
    setting_up.wait()
    assert len(beats) >= 2
    assert hold.mode == "shared"


def test_set_up_benchmarks_take_a_lock_of_their_own_beside_the_gpus(tmp_path: Path):
    """A benchmark inside a set-up waits for other benchmarks and sanitizer runs, not for the
    other set-ups (which hold the GPU's lock shared throughout)."""
    from evaluators.gpu_turns import benchmark_lock_path

    path = tmp_path / "kernel-search-benchmark-gpu0.lock"
    bench = benchmark_lock_path(path)
    assert bench != path and bench.parent == path.parent
    setting_up = GpuTurns(path)
    setting_up.hold_shared()
    with GpuTurns(bench).alone():
        assert other(bench, "shared") == "held"  # a sanitizer run waits
        assert other(path, "shared") == "free"  # another set-up does not


def _turns_taken(path: Path, second: tuple[str, bool], third: tuple[str, bool]) -> tuple[list[str], list[str]]:
    """Three holders of the lock at ``path`` on their own files, as three processes: a benchmark
    has it alone; ``second`` then ``third`` ((name, asks first?)) ask for it in that order, the
    one asking first polling so that it can beat, the others blocking as flock's waiters do.
    Returns the order they had it in, before the benchmark let go and after all were done."""
    order: list[str] = []
    release = threading.Event()

    def hold_first() -> None:
        with GpuTurns(path).alone():
            order.append("benchmark")
            release.wait(10)

    def ask(name: str, first: bool) -> None:
        turns = GpuTurns(path)
        with turns.alone(lambda: None, every_s=1.0, first=first) if first else turns.alone():
            order.append(name)
            time.sleep(0.2)

    threads = [threading.Thread(target=hold_first)]
    threads[0].start()
    while not order:
        time.sleep(0.01)
    for name, first in (second, third):
        threads.append(threading.Thread(target=ask, args=(name, first)))
        threads[-1].start()
        time.sleep(0.3)  # waiting: at the lock, the gate closed if it asks first
    before = list(order)
    release.set()
    for t in threads:
        t.join(10)
    return before, order


def test_a_process_asking_first_goes_before_those_that_ask_after_it(tmp_path: Path):
    # The evaluator asks first; a second benchmark asks after it and must wait for it.
    before, after = _turns_taken(tmp_path / "jobs.lock", ("evaluator", True), ("later", False))
    assert before == ["benchmark"]
    assert after == ["benchmark", "evaluator", "later"]


def test_a_process_asking_first_goes_before_those_already_waiting(tmp_path: Path):
    # A second benchmark already waits (blocked in flock: woken before a polling process looks
    # again) when the evaluator asks first: when the first benchmark ends, the second gets the
    # lock, sees the gate closed and gives it back.
    _, after = _turns_taken(tmp_path / "jobs.lock", ("waiting", False), ("evaluator", True))
    assert after == ["benchmark", "evaluator", "waiting"]


def test_a_process_sharing_the_lock_converts_without_waiting_at_a_closed_gate(tmp_path: Path):
    # A set-up that holds a share and now needs the lock alone must not wait at the gate of
    # one that waits for that very share to go.
    path = tmp_path / "jobs.lock"
    setup, evaluator = GpuTurns(path), GpuTurns(path)
    order: list[str] = []
    with setup.shared():
        waiter = threading.Thread(target=lambda: _alone_then(evaluator, order, "evaluator", first=True))
        waiter.start()
        time.sleep(0.3)  # the evaluator waits for this share, its gate closed
        done = threading.Thread(target=lambda: _alone_then(setup, order, "setup", first=False))
        done.start()
        done.join(5)
        assert not done.is_alive()  # converted to alone without passing the gate
    waiter.join(5)
    assert order == ["setup", "evaluator"]


def _alone_then(turns: GpuTurns, order: list[str], name: str, first: bool) -> None:
    with turns.alone(lambda: None, every_s=1.0, first=first):
        order.append(name)


def test_each_change_of_mode_lands_on_the_timeline_with_its_wait(tmp_path: Path, monkeypatch):
    import json

    from evaluators.gpu_turns import TIMELINE_ENV

    log = tmp_path / "turns"
    log.mkdir()
    monkeypatch.setenv(TIMELINE_ENV, str(log))
    path = tmp_path / "gpu.lock"
    other_setup = sharing_for(path, 0.6)
    hold = GpuTurns(path)
    with hold.shared():
        pass
    with hold.alone(waiting=lambda: None, every_s=5.0):  # waits for the other process's share
        pass
    other_setup.wait()
    (file,) = log.glob("turns-*.jsonl")
    rows = [json.loads(line) for line in file.read_text().splitlines()]
    assert [r["mode"] for r in rows] == ["shared", "none", "alone", "none"]
    assert all(r["lock"] == "gpu.lock" for r in rows)
    assert rows[2]["got"] - rows[2]["asked"] >= 0.3  # asked once, got when the other let go
    assert rows[0]["got"] - rows[0]["asked"] < 0.3  # a share beside a share: no wait


def test_a_process_that_ends_puts_the_end_of_each_of_its_locks_on_the_timeline(tmp_path: Path):
    import json
    import os

    from evaluators.gpu_turns import TIMELINE_ENV

    log = tmp_path / "turns"
    log.mkdir()
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; from evaluators.gpu_turns import GpuTurns\n"
            "GpuTurns(sys.argv[1]).hold_shared(); GpuTurns(sys.argv[2]).hold_shared()\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "gpu.lock"), str(tmp_path / "gpu.benchmarks.lock")],
                   check=True, cwd=root, env={**os.environ, TIMELINE_ENV: str(log), "PYTHONPATH": str(root)})
    (file,) = log.glob("turns-*.jsonl")
    rows = [json.loads(line) for line in file.read_text().splitlines()]
    assert [(r["lock"], r["mode"]) for r in rows] == [
        ("gpu.lock", "shared"), ("gpu.benchmarks.lock", "shared"), ("gpu.benchmarks.lock", "none"), ("gpu.lock", "none")]


def test_a_round_timing_beside_the_pools_evaluator_holds_the_gpu_and_the_benchmark_lock(tmp_path: Path):
    """A round set up beside the search times with the GPU's lock alone and the benchmark lock
    (which the pool's evaluator holds through every job) alone as well: neither a set-up nor an
    evaluation runs beside its timed pass."""
    from evaluators.gpu_turns import benchmark_lock_path

    path = tmp_path / "gpu.lock"
    script = ("import sys, time\nfrom evaluators import gpu_turns\ngpu_turns.take_part(sys.argv[1])\n"
              "with gpu_turns.alone(), gpu_turns.benchmarks_alone():\n    print('in', flush=True); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "in"
        assert other(path, "shared") == "held"
        assert other(benchmark_lock_path(path), "shared") == "held"
    finally:
        proc.kill()
        proc.wait()


def test_outside_a_lock_the_benchmark_lock_is_nothing_to_take():
    from evaluators import gpu_turns

    assert gpu_turns._mine is None  # this test process takes part in no lock
    with gpu_turns.benchmarks_alone():
        pass
