"""The processes that run candidate code see no secrets: the GPU sandbox worker and the
compute-sanitizer launcher start with the allow-listed environment of evaluators.child_env,
not the parent's (a Ray actor's environment holds the LLM endpoint's key)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from evaluators import gpu, sanitize
from evaluators.child_env import run_allowed, run_environment
from tests.conftest import cuda_available

SECRETS = {"OPENAI_API_KEY": "sk-test-secret-1", "AWS_SECRET_ACCESS_KEY": "secret-2",
           "HF_TOKEN": "secret-3", "TRITON_API_TOKEN": "secret-4", "MY_DATABASE_URL": "secret-5"}
NEEDED = {"CUDA_VISIBLE_DEVICES": "3", "LD_LIBRARY_PATH": "/opt/cuda/lib64", "TORCHINDUCTOR_CACHE_DIR": "/c/ind",
          "TRITON_CACHE_DIR": "/c/triton", "NVIDIA_VISIBLE_DEVICES": "all", "XDG_CACHE_HOME": "/c/xdg",
          "HOME": "/home/someone", "TMPDIR": "/tmp"}


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**SECRETS, **NEEDED}.items():
        monkeypatch.setenv(name, value)


def _assert_clean(environ: bytes) -> None:
    for value in SECRETS.values():
        assert value.encode() not in environ


def test_the_run_environment_keeps_what_cuda_needs_and_drops_secrets(secret_env: None) -> None:
    env = run_environment({"PYTHONUNBUFFERED": "1"})
    assert not set(SECRETS) & set(env)
    assert {k: env[k] for k in NEEDED} == NEEDED
    assert env["PYTHONUNBUFFERED"] == "1" and env["PYTHONPATH"].split(":")[0] == str(Path(__file__).parents[2])
    # a prefix the list allows still lets no secret-looking name through
    assert run_allowed("CUDA_HOME") and not run_allowed("CUDA_LICENSE_KEY") and not run_allowed("PATHS_SECRET")


def test_the_worker_process_sees_no_secret(secret_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real start-up path of the sandbox worker, with a module that reports its environment."""
    monkeypatch.setattr(gpu, "WORKER_MODULE", "tests.unit.env_echo_worker")
    worker = gpu._Worker(device=1, start_timeout_s=60)
    try:
        environ = worker.info["environ"]
        _assert_clean(environ)
        assert b"CUDA_VISIBLE_DEVICES=3\0" in environ and worker.info["device"] == 1
    finally:
        worker.conn.send(None)
        worker.kill()
    assert not worker.alive()


def test_the_sanitizer_launcher_sees_no_secret(secret_env: None) -> None:
    cmd = [sys.executable, "-c", "import sys; sys.stdout.write(open('/proc/self/environ').read())"]
    rc, out = sanitize._run(cmd, timeout_s=60)
    assert rc == 0
    _assert_clean(out.encode())
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING=1\0" in out and "CUDA_VISIBLE_DEVICES=3\0" in out


@pytest.mark.skipif(cuda_available(), reason="checks the start-up failure on a machine without CUDA")
def test_the_real_worker_without_cuda_fails_in_one_line_not_a_hang() -> None:
    start = time.monotonic()
    with pytest.raises(gpu.EvaluatorError, match="exited while starting"):
        gpu._Worker(device=0, start_timeout_s=120)
    assert time.monotonic() - start < 100
