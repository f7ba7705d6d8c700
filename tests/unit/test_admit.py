"""Admission on the CPU: launch limits, the sandboxed compile's limits and environment, the
static checks of source and binary, and the CLI's JSON verdicts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evaluators.admit import Artifact, Refusal, admit
from evaluators.check import main as check_main
from evaluators.compile import CompileLimits, compile_variant
from evaluators.compile_sandbox import CompileSandbox, child_environment
from kernels.launch import DeviceLimits
from kernels.spec import load_kernel
from kernels.verdict import Status

pytest.importorskip("cuda.bindings.nvrtc")

SPEC = load_kernel("silu_and_mul")
BODY = """
extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(x[token * 2 * d + d + i]));
    }
}
"""
BOMB = """
template <int D, long long I> struct Bomb { static constexpr long long v = Bomb<D - 1, 2 * I>::v + Bomb<D - 1, 2 * I + 1>::v; };
template <long long I> struct Bomb<0, I> { static constexpr long long v = I; };
__device__ long long sink = Bomb<40, 0>::v;
"""


def _variant(launch: str, extra: str = "") -> str:
    return f"// launch: {launch}\n{extra}\n{BODY}"


@pytest.mark.parametrize(
    ("launch", "words"),
    [
        ("grid=(num_tokens * d * 1024,) block=(256,)", "grid dimension x"),  # > 2^31 blocks
        ("grid=(num_tokens, 65536) block=(256,)", "grid dimension y"),
        ("grid=(num_tokens, 1, d * 8) block=(256,)", "grid dimension z"),
        ("grid=(num_tokens,) block=(2048,)", "2048 threads"),
        ("grid=(num_tokens,) block=(32, 32, 2)", "2048 threads"),
        ("grid=(num_tokens,) block=(256,) smem=2147483648 * 2", "dynamic shared memory"),  # > 2^31
        ("grid=(num_tokens,) block=(256,) smem=232449", "dynamic shared memory"),  # opt-in max + 1
        ("grid=(num_tokens,) block=(256,) smem=1180591620717411303424", "dynamic shared memory"),  # 2^70
        ("grid=(1180591620717411303424 * d,) block=(256,)", "grid dimension x"),
    ],
)
def test_launches_beyond_the_device_are_resource_errors(launch: str, words: str, compile_cache: Path) -> None:
    outcome = admit(SPEC, _variant(launch), "float16")
    assert isinstance(outcome, Refusal)
    assert outcome.status is Status.RESOURCE_ERROR
    assert words in outcome.message
    assert not compile_cache.exists()  # refused before compiling


def test_smaller_device_limits_come_from_the_caller(compile_cache: Path) -> None:
    source = _variant("grid=(num_tokens,) block=(256,) smem=4096")
    assert isinstance(admit(SPEC, source, "float16"), Artifact)
    small = DeviceLimits(max_smem_bytes=1024)
    outcome = admit(SPEC, source, "float16", limits=small)
    assert isinstance(outcome, Refusal) and outcome.status is Status.RESOURCE_ERROR


def test_a_compile_bomb_is_stopped_by_the_wall_clock_and_the_verdict_cached(compile_cache: Path) -> None:
    limits = CompileLimits(timeout_s=2.0, memory_bytes=8 << 30)  # memory out of the way: time fires
    first = compile_variant(BOMB + BODY, "silu_and_mul", "float16", limits=limits)
    assert not first.ok and first.limit == "timeout"
    assert "2 s time limit" in first.log and first.seconds < 30
    again = compile_variant(BOMB + BODY, "silu_and_mul", "float16", limits=limits)
    assert again.cached and again.limit == "timeout"  # not compiled again every trial
    # A longer limit than the cached refusal's compiles again (stopped by memory this time).
    longer = compile_variant(BOMB + BODY, "silu_and_mul", "float16", limits=CompileLimits(timeout_s=60.0))
    assert not longer.cached and not longer.ok and longer.limit in ("memory", "timeout")
    # The sandbox comes back after the kill: an honest kernel compiles right after.
    assert compile_variant(_variant("grid=(num_tokens,) block=(256,)"), "silu_and_mul", "float16").ok


def test_a_compile_bomb_is_stopped_by_the_memory_limit(compile_cache: Path) -> None:
    limits = CompileLimits(timeout_s=120.0, memory_bytes=768 << 20)
    result = compile_variant(BOMB + BODY, "silu_and_mul", "float16", limits=limits)
    assert not result.ok and result.limit == "memory", result.log[:300]
    assert result.log.startswith("compile limit: NVRTC ran out of memory")


def test_binary_and_stack_limits_are_configurable(compile_cache: Path) -> None:
    stack = "__device__ __noinline__ float spill(int i) { volatile float a[1024]; a[i % 1024] = i; return a[(i * 7) % 1024]; }\n"
    source = _variant("grid=(num_tokens,) block=(256,)", stack).replace("expf(-g)", "expf(-g) + spill(i)")
    assert isinstance(admit(SPEC, source, "float16"), Artifact)  # 4 KB of stack: fine by default
    tight = admit(SPEC, source, "float16", compile_limits=CompileLimits(stack_bytes=1024))
    assert isinstance(tight, Refusal) and tight.status is Status.RESOURCE_ERROR
    assert "stack" in tight.message.split("\n")[0]
    small = admit(SPEC, source, "float16", compile_limits=CompileLimits(cubin_bytes=1024))
    assert isinstance(small, Refusal) and small.status is Status.RESOURCE_ERROR
    assert "bytes" in small.message.split("\n")[0]


@pytest.mark.parametrize(
    ("extra", "call", "symbol"),
    [
        ("", 'printf("%d", i);', "vprintf"),
        ("#define SAY(...) printf(__VA_ARGS__)\n", 'SAY("%f", g);', "vprintf"),
        ("", "float* p = (float*)malloc(4); p[0] = g; free(p);", "malloc"),
    ],
)
def test_device_runtime_calls_are_refused_from_the_binary(extra: str, call: str, symbol: str, compile_cache: Path) -> None:
    line = "const float g = static_cast<float>(x[token * 2 * d + i]);"
    source = _variant("grid=(num_tokens,) block=(256,)", extra).replace(line, f"{line} {call}")
    outcome = admit(SPEC, source, "float16")
    assert isinstance(outcome, Refusal) and outcome.status is Status.COMPILE_ERROR
    assert symbol in outcome.message and "not allowed" in outcome.message


def test_the_compiler_process_sees_no_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-value")
    monkeypatch.setenv("SOME_TOKEN", "another-secret")
    env = child_environment(str(tmp_path))
    assert "sk-test-secret-value" not in json.dumps(env) and "another-secret" not in json.dumps(env)
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)
    sandbox = CompileSandbox()
    try:
        out = sandbox.compile('extern "C" __global__ void k(float* o) { o[0] = 1.0f; }', ["-default-device"],
                              CompileLimits())
        assert out.ok
        child = sandbox._child  # the test looks inside: the real process's environment and directory
        assert child is not None
        environ = Path(f"/proc/{child.proc.pid}/environ").read_bytes()
        assert b"sk-test-secret-value" not in environ and b"another-secret" not in environ
        assert os.listdir(child.workdir) == []  # an empty working directory
    finally:
        sandbox.close()


def test_a_child_whose_parent_goes_removes_its_own_directory() -> None:
    """A parent that ends without closing its sandbox (a killed worker) closes the pipe: the
    child then removes its working directory and exits, so none is left behind."""
    sandbox = CompileSandbox()
    assert sandbox.compile('extern "C" __global__ void k(float* o) { o[0] = 1.0f; }', ["-default-device"],
                           CompileLimits()).ok
    child = sandbox._child  # the test plays the parent that goes: its end of the pipe closes
    assert child is not None and os.path.isdir(child.workdir)
    assert child.proc.stdin is not None
    child.proc.stdin.close()
    assert child.proc.wait(timeout=30) == 0
    assert not os.path.exists(child.workdir)
    sandbox.close()


def test_a_child_whose_parent_stops_reading_mid_compile_removes_its_own_directory() -> None:
    """The parent dies while the child compiles: the child's answer meets a closed pipe, and it
    still removes its working directory on the way out."""
    sandbox = CompileSandbox()
    assert sandbox.compile('extern "C" __global__ void k(float* o) { o[0] = 1.0f; }', ["-default-device"],
                           CompileLimits()).ok
    child = sandbox._child
    assert child is not None and child.proc.stdout is not None and child.proc.stdin is not None
    child.send(json.dumps({"source": 'extern "C" __global__ void k(float* o) { o[0] = 2.0f; }',
                          "options": ["-default-device"], "max_cubin_bytes": 1 << 20, "cpu_s": 60}).encode())
    child.proc.stdout.close()  # the parent's reading end goes before the answer is written
    child.proc.stdin.close()
    child.proc.wait(timeout=60)
    assert not os.path.exists(child.workdir)
    sandbox.close()


def test_directories_of_children_whose_parent_is_gone_are_removed_by_the_next_sandbox(tmp_path: Path) -> None:
    import subprocess
    import sys
    import tempfile

    from evaluators.compile_sandbox import _WORKDIR_PREFIX

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    orphan = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{dead_pid}-"))
    alive = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-"))
    try:
        sandbox = CompileSandbox()
        assert sandbox.compile('extern "C" __global__ void k(float* o) { o[0] = 1.0f; }', ["-default-device"],
                               CompileLimits()).ok
        assert not orphan.exists() and alive.exists()
        assert sandbox._child is not None and f"{_WORKDIR_PREFIX}{os.getpid()}-" in sandbox._child.workdir
        sandbox.close()
    finally:
        alive.rmdir()


def test_check_compile_only_prints_one_json_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    compile_cache: Path) -> None:
    path = tmp_path / "v.cu"
    path.write_text(_variant("grid=(num_tokens,) block=(256,)"))
    assert check_main([str(path), "--kernel", "silu_and_mul", "--compile-only", "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["status"] == "OK" and verdict["registers"] > 0
    assert {"message", "params", "spill_bytes", "stack_bytes", "compile_s", "variant_id"} <= set(verdict)


@pytest.mark.parametrize(
    "argv",
    [
        ["--kernel", "silu_and_mul", "--compile-only", "--json"],  # no file
        ["missing.cu", "--kernel", "silu_and_mul", "--compile-only", "--json"],
        ["x.cu", "--kernel", "no_such_kernel", "--json"],
        ["x.cu", "--kernel", "silu_and_mul", "--param", "B", "--compile-only", "--json"],
        ["x.cu", "--kernel", "silu_and_mul", "--bogus", "--json"],
    ],
)
def test_check_argument_errors_are_json_with_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert check_main(argv) == 2
    out = capsys.readouterr().out
    assert json.loads(out)["error"]
    assert out.count("\n") == 1  # one object, one line
