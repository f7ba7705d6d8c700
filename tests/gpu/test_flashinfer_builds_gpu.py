"""FlashInfer's JIT builds in processes beside each other (GPU machine).

Three processes, started at once with the environment every candidate process gets
(:func:`evaluators.child_env.run_environment`, whose ninja takes turns per build folder:
:mod:`evaluators.ninja_turns`), each call one kernel's peers once per shape, so that each builds
a different FlashInfer op from an empty JIT folder. Every module they built must then be up to
date (ninja's dry run finds nothing to do), and a fourth process calling all three kernels' peers
must build nothing. Run on the GPU machine:
``python -m pytest -m gpu tests/gpu/test_flashinfer_builds_gpu.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evaluators.child_env import run_environment
from evaluators.jit_watch import changes, snapshot, still_dirty
from evaluators.ninja_turns import REAL

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse")
FIRST_CALLS = ("import json, sys\n"
               "from evaluators.peer_compile import first_calls\n"
               "from kernels.spec import load_kernel\n"
               "print(json.dumps({k: first_calls(load_kernel(k), 'float16', 'search', 'cuda', None) "
               "for k in sys.argv[1:]}))\n")


def _calls(env: dict[str, str], *kernels: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", FIRST_CALLS, *kernels], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _done(proc: subprocess.Popen[str]) -> dict[str, dict[str, str]]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_ops_built_beside_each_other_are_built_once(tmp_path: Path):
    pytest.importorskip("flashinfer")
    env = run_environment({"FLASHINFER_WORKSPACE_BASE": str(tmp_path)})
    assert env.get(REAL), "no ninja on this machine's PATH: FlashInfer cannot build"
    root = tmp_path / ".cache" / "flashinfer"
    answers = [_done(p) for p in [_calls(env, k) for k in KERNELS]]
    for kernel, answer in zip(KERNELS, answers, strict=True):
        assert answer[kernel].get("flashinfer") == "ok", answer
    built = sorted(snapshot(root)["modules"])
    print("built:", built)
    assert len(built) >= len(KERNELS), built
    assert {m: why for m, why in still_dirty(root, built).items() if why} == {}
    before = snapshot(root)
    _done(_calls(env, *KERNELS))
    assert changes(before, snapshot(root)) == {}  # nothing built or rebuilt by a later process
