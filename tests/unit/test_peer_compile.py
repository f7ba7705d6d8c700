"""evaluators/peer_compile.py on the CPU (Inductor's C++ backend stands in for Triton): a
compilation made ahead in a process of its own is loaded from its cache folder by another
process instead of being compiled again, a folder of another loop is not, and the benchmark
lock excludes other processes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evaluators.gpu_turns import GpuTurns
from evaluators.peer_compile import (
    FIRST_CALLS,
    REPORT,
    STEP,
    cache_folder,
    compile_ahead,
    first_calls,
    sharing_the_gpu,
    why_missed,
)
from evaluators.peer_steps import EVERY_SHAPE, peer_step
from evaluators.peers import _loop_folder, compile_name, peer_fns
from kernels.peer import call_once
from kernels.spec import load_kernel, shape_label
from tests.unit.test_codegen import _kernel_here
from tests.unit.test_codegen_reviewer_kernels import FOLDERS as REVIEWER


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("k")
    _kernel_here(root, "clip_deadzone", *REVIEWER["clip_deadzone"])
    return root / "clip_deadzone"


def _load(kernel: Path, folder: Path, **inductor: object) -> dict[str, int]:
    """The loop's side: the program called in the loop's folder, as run_peers does (under
    Inductor settings ``inductor``); FX-graph cache counts."""
    import torch._inductor.config as inductor_config

    spec = load_kernel(kernel)
    fn = peer_fns(spec, modes=("default",), trials=1, cached=True, only_compiled=True)[compile_name("default", 1)]
    shape = dict(spec.search_shapes[0])
    inputs = spec.make_inputs(shape, torch.float32, torch.Generator().manual_seed(7), "random", torch.device("cpu"))
    with _loop_folder({"compile_cache": str(folder)}) as counts, inductor_config.patch(inductor):
        call_once(fn, inputs, shape, spec.constants)
    return counts


def test_a_compilation_made_ahead_is_loaded_by_the_loop_and_another_loops_folder_is_not(kernel: Path, tmp_path: Path):
    ahead = tmp_path / "loop-1"
    report = compile_ahead(kernel, "float32", "search", ahead, tmp_path / "gpu.lock", timeout_s=600,
                           modes=["default"], device="cpu", nice=5)
    assert report["status"] == "OK", report
    assert report["nice"] == min(19, os.nice(0) + 5)  # it ran below this process's CPU priority
    assert set(report["modes"]["default"].values()) == {"ok"}
    assert json.loads((ahead / REPORT).read_text())["kernel"] == "clip_deadzone"
    assert _load(kernel, ahead) == {"hit": 1, "miss": 0, "bypass": 0}
    assert why_missed(ahead) == []
    # A loop whose process hashes a detail otherwise (here one Inductor setting) compiles for
    # itself, and the folder's keys say which detail it was.
    assert _load(kernel, ahead, epilogue_fusion=False)["miss"] == 1
    assert [line.split("]", 1)[1].strip() for line in why_missed(ahead)] == [
        "inductor_config[epilogue_fusion]: False", "inductor_config[epilogue_fusion]: True"]
    # An empty folder (another loop's, compiled by nobody yet): compiled here, as without one.
    assert _load(kernel, tmp_path / "loop-2")["miss"] == 1
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") != str(ahead.resolve())  # the folder is left on the way out


def test_a_loop_loads_its_triton_kernels_from_their_files_beside_their_tuning():
    """Compiled ahead, a kernel's autotuning choice lies beside its source file: the loop loads
    the kernels from there, not from the FX graph's bundle (where coordinate descent ran again)."""
    import torch._inductor.config as inductor_config

    from evaluators.peers import _fresh_inductor

    before = inductor_config.bundle_triton_into_fx_graph_cache
    with _fresh_inductor(cached=True):
        assert inductor_config.bundle_triton_into_fx_graph_cache is False
        assert inductor_config.fx_graph_cache and inductor_config.autotune_local_cache
    with _fresh_inductor(cached=False):
        assert not inductor_config.fx_graph_cache and not inductor_config.autotune_local_cache
    assert inductor_config.bundle_triton_into_fx_graph_cache == before


def test_the_other_peers_are_called_once_per_shape_ahead_holding_the_gpu_shared(tmp_path: Path):
    """A library that builds its kernels on first use (FlashInfer) builds them in the
    compile-ahead process: each peer that is not a torch.compile program is called once per
    shape there, under the GPU's lock held shared (no benchmark of another process beside
    it); a peer that fails is not called again and its failure is reported."""
    path = tmp_path / "gpu.lock"
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')\n")
    seen: list[tuple[int, str]] = []

    def watching(t, shape, constants):
        seen.append((shape["d"], subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True,
                                                text=True).stdout.strip()))
        t["out"].copy_(torch.nn.functional.silu(t["x"][:, :shape["d"]]) * t["x"][:, shape["d"]:])

    def failing(t, shape, constants):
        seen.append((-1, "failing"))
        raise RuntimeError("no kernel for this GPU")

    spec = dataclasses.replace(load_kernel("silu_and_mul"), peers={"watching": watching, "failing": failing},
                               search_shapes=({"num_tokens": 3, "d": 8}, {"num_tokens": 2, "d": 16}))
    outcome = first_calls(spec, "float32", "search", "cpu", path)
    assert outcome == {"watching": "ok", "failing": "RuntimeError: no kernel for this GPU"}
    assert [d for d, _ in seen if d >= 0] == [s["d"] for s in spec.search_shapes]
    assert {state for d, state in seen if d >= 0} == {"held"}
    assert sum(d < 0 for d, _ in seen) == 1


def test_a_failed_compile_ahead_says_why(tmp_path: Path):
    report = compile_ahead(tmp_path / "no-such-kernel", "float32", "search", tmp_path / "c", tmp_path / "l",
                           timeout_s=120, device="cpu")
    assert report["status"] == "ERROR" and "rc" in report["summary"]


def test_the_report_is_read_from_its_file_whatever_the_process_printed_after_it(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    import evaluators.peer_compile as pc

    folder = tmp_path / "loop-1"

    def run_group(cmd, **kw):
        if "--first-calls-only" in cmd:
            (folder / FIRST_CALLS).write_text(json.dumps({"first_calls": {"lib": "ok"}}))
            return 0, "", ""
        (folder / REPORT).write_text(json.dumps({"kernel": "k", "modes": {"default": {"[1]": "ok"}}}))
        return 0, '{"kernel": "k"}\nflashinfer: 2 modules loaded (a line a library printed at exit)\n', ""

    monkeypatch.setattr(pc, "run_group", run_group)
    report = compile_ahead("k", "float32", "search", folder, tmp_path / "l", device="cpu")
    assert report == {"status": "OK", "kernel": "k", "modes": {"default": {"[1]": "ok"}}, "first_calls": {"lib": "ok"}}
    monkeypatch.setattr(pc, "run_group", lambda cmd, **kw: (0, "", ""))
    (folder / REPORT).unlink()
    assert compile_ahead("k", "float32", "search", folder, tmp_path / "l", device="cpu")["status"] == "ERROR"


def test_a_benchmark_has_the_gpu_alone_and_nests_in_one_process(tmp_path: Path):
    hold = GpuTurns(tmp_path / "gpu.lock")
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')\n")
    with hold.alone():
        with hold.alone():  # re-entrant: a benchmark inside a benchmark does not deadlock
            pass
        out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "gpu.lock")], capture_output=True, text=True)
        assert out.stdout.strip() == "held"
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "gpu.lock")], capture_output=True, text=True)
    assert out.stdout.strip() == "free"


def test_a_sanitizer_run_shares_the_lock_with_others_and_keeps_benchmarks_out(tmp_path: Path):
    path = tmp_path / "gpu.lock"
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "mode = fcntl.LOCK_SH if sys.argv[2] == 'shared' else fcntl.LOCK_EX\n"
             "try:\n    fcntl.flock(fd, mode | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')\n")

    def other(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", probe, str(path), mode], capture_output=True,
                              text=True).stdout.strip()

    with sharing_the_gpu(path):
        assert other("shared") == "free"  # another sanitizer run
        assert other("exclusive") == "held"  # a benchmark waits
    assert other("exclusive") == "free"


def test_a_shape_without_inputs_costs_that_shape_not_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An error a refused launch leaves behind can surface at the next shape's first launch,
    making its inputs: that shape is reported as not compiled and the others go on, in the
    compilations and in the other peers' first calls."""
    import evaluators.peer_compile as peer_compile
    import kernels.spec

    calls: list[int] = []

    def watching(t, shape, constants):
        calls.append(shape["d"])

    base = load_kernel("silu_and_mul")
    shapes = ({"num_tokens": 3, "d": 8}, {"num_tokens": 2, "d": 16})

    def make_inputs(shape, *args, **kwargs):
        if shape["d"] == 8:
            raise RuntimeError("CUDA error: invalid argument")
        return base.make_inputs(shape, *args, **kwargs)

    spec = dataclasses.replace(base, peers={"watching": watching}, search_shapes=shapes, make_inputs=make_inputs)
    assert first_calls(spec, "float32", "search", "cpu", tmp_path / "gpu.lock") == {"watching": "ok"}
    assert calls == [16]

    # Every shape without inputs: nothing is compiled, and the report says why for each.
    never = dataclasses.replace(spec, make_inputs=lambda *a, **k: make_inputs({"d": 8}))
    monkeypatch.setattr(kernels.spec, "load_kernel", lambda kernel: never)
    report = peer_compile.compile_kernel("silu_and_mul", "float32", "search", tmp_path / "c", modes=["default"],
                                         device="cpu")
    assert list(report["modes"]["default"].values()) == ["inputs: RuntimeError: CUDA error: invalid argument"] * 2
    assert json.loads((tmp_path / "c" / REPORT).read_text())["modes"] == report["modes"]


def test_a_memory_format_pickles_by_name_inside_a_loops_folder(tmp_path: Path):
    """Inductor hashes every example input's memory format into its FX-graph keys; pickled by
    default, it is named after whichever module that imported torch comes first in this
    process's sys.modules, so a compile-ahead process and a loop's worker hashed one graph to
    two keys. Inside a loop's folder it pickles through evaluators.peers.memory_format."""
    import copyreg
    import io
    import pickle

    buffer = io.BytesIO()
    with cache_folder(tmp_path):
        pickler = pickle.Pickler(buffer)
        pickler.dispatch_table = copyreg.dispatch_table.copy()  # as Inductor's pickler starts
        pickler.dump(torch.channels_last)
    data = buffer.getvalue()
    assert b"evaluators.peers" in data and b"memory_format" in data and b"channels_last" in data, data
    assert pickle.loads(data) is torch.channels_last
    assert type(torch.channels_last) not in copyreg.dispatch_table  # left as found


def _crashing_kernel(root: Path, crash_if: str, search_shapes: str | None = None) -> Path:
    """clip_deadzone with one more peer, ``crashing``, whose call segfaults its process (a real
    SIGSEGV) where ``crash_if`` (an expression of ``shape``) holds; ``search_shapes`` replaces
    the spec's search shapes."""
    spec_text, baseline = REVIEWER["clip_deadzone"]
    crashing = (f"\ndef crash(inputs, shape, constants):\n    if {crash_if}:\n        import ctypes\n"
                "        ctypes.string_at(0)\n\n\nSPEC = KernelSpec(")
    assert spec_text.count("\nSPEC = KernelSpec(") == 1
    spec_text = spec_text.replace("\nSPEC = KernelSpec(", crashing).replace(
        "    constants={\"cap\": 6.0, \"dead\": 0.05},\n)", "    constants={\"cap\": 6.0, \"dead\": 0.05},\n"
        "    peers={\"crashing\": crash},\n)")
    assert "peers={" in spec_text
    if search_shapes is not None:
        old = 'search_shapes=({"num_tokens": 64, "hidden": 4096},),'
        assert old in spec_text
        spec_text = spec_text.replace(old, f"search_shapes={search_shapes},")
    _kernel_here(root, "clip_deadzone", spec_text, baseline)
    return root / "clip_deadzone"


def test_a_library_that_kills_the_process_in_its_first_call_costs_the_first_calls_only(tmp_path: Path):
    """A peer whose first call segfaults its process costs nothing of the compilations, made in
    another: the report comes back OK, says how the first calls' process ended and where
    (faulthandler's dump names the signal and the frames), and names the call that ended it,
    which a second process, making the first calls again without it, leaves out."""
    folder = _crashing_kernel(tmp_path, "True")
    cache = tmp_path / "c"
    report = compile_ahead(folder, "float32", "search", cache, tmp_path / "l", timeout_s=300,
                           modes=("default",), device="cpu")
    assert report["status"] == "OK", report
    assert set(report["modes"]["default"].values()) == {"ok"}
    assert "crashed" not in report  # the compilations' process
    crashed = report["first_calls_crashed"]
    assert "rc -11" in crashed and "Segmentation fault" in crashed
    assert "crash" in crashed  # the innermost frames: the peer's own function
    label = shape_label(load_kernel(folder).search_shapes[0])
    assert list(report["peer_crashes"]) == ["crashing"] and list(report["peer_crashes"]["crashing"]) == [label]
    assert "ended a compile-ahead process (rc -11" in report["peer_crashes"]["crashing"][label]
    assert report["first_calls"] == {}  # the second process made no call: the only one there was ended the first
    assert _load(folder, cache) == {"hit": 1, "miss": 0, "bypass": 0}


def test_the_calls_that_end_processes_are_found_one_shape_at_a_time_and_the_others_made(tmp_path: Path):
    """A library that ends its process on two of three shapes: three processes (the compile-ahead
    one and two that make the first calls again), each leaving out what ended the ones before;
    the peer's call on the third shape is made and succeeds."""
    shapes = '({"num_tokens": 64, "hidden": 1000}, {"num_tokens": 64, "hidden": 4096}, {"num_tokens": 64, "hidden": 3000})'
    folder = _crashing_kernel(tmp_path, "shape['hidden'] != 4096", shapes)
    report = compile_ahead(folder, "float32", "search", tmp_path / "c", tmp_path / "l", timeout_s=300,
                           modes=("default",), device="cpu")
    labels = [shape_label(s) for s in load_kernel(folder).search_shapes]
    assert report["status"] == "OK", report
    assert sorted(report["peer_crashes"]["crashing"]) == sorted([labels[0], labels[2]])
    assert report["first_calls"] == {"crashing": "ok"}
    assert not (tmp_path / "c" / STEP).read_text()  # the last process got past every call


def test_a_peer_left_out_by_its_step_is_not_called_and_the_step_names_each_call(tmp_path: Path):
    """first_calls in this process: an excluded call is not made (on its shape, or on every
    shape with EVERY_SHAPE); the step file names each call before it and is emptied after."""
    folder = _crashing_kernel(tmp_path, "False")
    spec = load_kernel(folder)
    label = shape_label(spec.search_shapes[0])
    step = tmp_path / "step"
    seen: list[str] = []
    original = Path.write_text

    def spy(self: Path, text: str, *args: object, **kwargs: object) -> int:
        if self == step:
            seen.append(text)
        return original(self, text, *args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "write_text", spy)
        assert first_calls(spec, "float32", "search", "cpu", None, step) == {"crashing": "ok"}
        assert first_calls(spec, "float32", "search", "cpu", None, step, {"crashing": {label: "why"}}) == {}
        assert first_calls(spec, "float32", "search", "cpu", None, step, {"crashing": {EVERY_SHAPE: "why"}}) == {}
    assert seen == ["", peer_step("crashing", label), "", "", "", "", ""]
