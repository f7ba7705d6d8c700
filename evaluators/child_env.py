"""The environment of every process that compiles or runs candidate code, from allow-lists.

A candidate's code (its device code, and whatever the process around it reports: a compiler
log, a sanitizer report, a crash message) must never see the parent's secrets: the LLM
endpoint's key, cloud credentials, tokens. A process started with the parent's environment
holds them in ``/proc/self/environ`` however carefully it later edits ``os.environ``, so
these processes are started with an environment built here, from the lists below, and
nothing else of the parent's.

Two lists, both here so that one file says what reaches a sandbox:

* :data:`COMPILE_NAMES`: the NVRTC sandbox (:mod:`evaluators.compile_sandbox`) needs only
  the loader's paths and the locale.
* :data:`RUN_NAMES` and :data:`RUN_PREFIXES`: the GPU sandbox worker
  (:mod:`evaluators.worker`) and the compute-sanitizer runs (:mod:`evaluators.sanitize`)
  need the CUDA driver and runtime settings (``CUDA_VISIBLE_DEVICES`` picks the GPU a Ray
  actor was given), the loader's paths, a home and a temporary directory, and the caches
  and settings of torch, TorchInductor, Triton, FlashInfer and CuPy (the peers compile in
  the worker). The list is generous with those on purpose: a missing cache variable costs
  minutes of recompiling, a missing CUDA one a failed start.

A name on either list is still left out when it looks like a secret (:data:`SECRET_WORDS`),
so ``TRITON_API_TOKEN`` or ``CUDA_SOMETHING_KEY`` never passes through a prefix.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)

COMPILE_NAMES = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "LANG", "LC_ALL")

RUN_NAMES = (
    # processes, paths and the locale
    "PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TMP", "TEMP",
    "LANG", "LANGUAGE", "TZ", "TERM", "VIRTUAL_ENV", "CONDA_PREFIX", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
    # Python (PYTHONPATH itself is rebuilt, see python_path)
    "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE", "PYTHONUSERBASE",
    # compilers the JIT paths of TorchInductor, Triton and FlashInfer call
    "CC", "CXX", "CPATH", "LIBRARY_PATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "MAX_JOBS",
    # threads of the host libraries
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    # this project's own compile cache, and the GPU lock's timeline (evaluators.gpu_turns)
    "KERNEL_SEARCH_CACHE", "KERNEL_SEARCH_TURNS_LOG",
)
RUN_PREFIXES = (
    "CUDA_", "NVIDIA_", "NV_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "NCCL_", "LC_",
    "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_", "FLASHINFER_", "CUPY_",
)
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


def looks_secret(name: str) -> bool:
    """Whether a variable's name says it holds a secret (then no list lets it through)."""
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def run_allowed(name: str) -> bool:
    """Whether a variable reaches the processes that run candidate code."""
    return (name in RUN_NAMES or name.startswith(RUN_PREFIXES)) and not looks_secret(name)


def python_path() -> str:
    """PYTHONPATH for a child: the project, then every directory of this process's
    ``sys.path`` (a Ray worker's path differs from the shell's; the child needs the same)."""
    return os.pathsep.join([PROJECT_ROOT, *(p for p in sys.path if p and os.path.isdir(p))])


def compile_environment(workdir: str) -> dict[str, str]:
    """The NVRTC sandbox's whole environment: :data:`COMPILE_NAMES`, the project on
    PYTHONPATH, and its empty working directory as HOME and TMPDIR."""
    env = {name: os.environ[name] for name in COMPILE_NAMES if name in os.environ and not looks_secret(name)}
    env.update(HOME=workdir, TMPDIR=workdir, PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
               PYTHONPATH=python_path())
    return env


def run_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a process that runs candidate code: the allowed variables of
    this process, PYTHONPATH rebuilt by :func:`python_path`, then ``extra`` (the caller's own
    settings, which are not checked against the lists). Its ninja takes turns per build folder
    (:mod:`evaluators.ninja_turns`): a peer library building beside other processes (FlashInfer)
    would otherwise corrupt ninja's log and build again in every process."""
    from evaluators.ninja_turns import environment

    env = {name: value for name, value in os.environ.items() if run_allowed(name)}
    env["PYTHONPATH"] = python_path()
    env.update(extra or {})
    return environment(env)
