"""What a first run meets: declared dependencies, one-line errors without a GPU, default output
folders that never overwrite kept results, and a quiet, truthful progress line."""

from __future__ import annotations

import ast
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments import bench_library
from search.progress import Progress
from search.run import RAY_AUTH_LOGGER, RAY_AUTH_NOTICE, RayAuthNoticeFilter, quiet_ray_auth_notice
from search.sweep import SweepProgress

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PRODUCT_PACKAGES = ("agents", "evaluators", "kernels", "search", "experiments")
# Imported only behind a guard or on the GPU machine, and provided by an extra or that
# machine's image rather than the core dependencies.
OPTIONAL_IMPORTS = {"cupy": "gpu-cu12/gpu-cu13 extras", "matplotlib": "plots extra",
                    "flashinfer": "peer, GPU image", "liger_kernel": "peer, GPU image",
                    "triton": "torch's CUDA builds, GPU image (experiments.timing_neighbours)"}
GPU_SCRIPTS = [
    ["experiments.bench_library", "--kernel", "silu_and_mul"],
    ["experiments.bench_baselines", "--kernel", "silu_and_mul"],
    ["experiments.explore_recipes", "--kernel", "silu_and_mul", "--out", "map"],
]


def _requirement_name(req: str) -> str:
    return re.split(r"[\[<>=!~;\s]", req, maxsplit=1)[0].lower().replace("_", "-")


def _third_party_imports() -> set[str]:
    names: set[str] = set()
    for package in PRODUCT_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in PRODUCT_PACKAGES}


# -- pyproject ------------------------------------------------------------------------------

def test_every_imported_library_is_declared():
    declared = {_requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    dists = packages_distributions()
    undeclared = []
    for module in sorted(_third_party_imports()):
        if module in OPTIONAL_IMPORTS:
            continue
        provided_by = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if not provided_by & declared:
            undeclared.append(f"{module} (from {sorted(provided_by)})")
    assert not undeclared, f"imported but not in [project].dependencies: {undeclared}"
    assert "jinja2" in declared


@pytest.mark.parametrize("major", [12, 13])
def test_each_gpu_extra_holds_one_cuda_major(major):
    extra = PYPROJECT["project"]["optional-dependencies"][f"gpu-cu{major}"]
    by_name = {_requirement_name(r): r for r in extra}
    assert set(by_name) == {f"cupy-cuda{major}x", "cuda-bindings", "cuda-toolkit"}
    # The bindings and NVRTC (with the runtime headers) must be bounded to this major on both sides.
    for name in ("cuda-bindings", "cuda-toolkit"):
        spec = by_name[name]
        assert f"<{major + 1}" in spec.replace(" ", ""), spec
        assert re.search(rf">={major}(\.|,|$)", spec.replace(" ", "")), spec
    assert "nvrtc" in by_name["cuda-toolkit"] and "cudart" in by_name["cuda-toolkit"]
    assert "gpu" not in PYPROJECT["project"]["optional-dependencies"]  # no extra of an unnamed major


def test_core_provides_nvrtc_for_cpu_compiles_without_fixing_a_major():
    deps = {_requirement_name(r): r for r in PYPROJECT["project"]["dependencies"]}
    assert "nvrtc" in deps["cuda-toolkit"] and "cudart" in deps["cuda-toolkit"]
    # An upper bound in the core would make one of the two extras unsatisfiable.
    assert "<" not in deps["cuda-toolkit"] and "<" not in deps["cuda-bindings"]
    assert not any(n.startswith("cupy") for n in deps)  # the core installs on a machine without a GPU


# -- GPU-only scripts without a GPU ----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("argv", GPU_SCRIPTS, ids=[a[0] for a in GPU_SCRIPTS])
def test_gpu_script_without_gpu_says_so_in_one_line(argv, tmp_path):
    # No visible device even on a GPU machine, so the test means the same everywhere.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no CUDA GPU visible; "), proc.stderr[-2000:]
    assert argv[0] in lines[0]
    assert list(tmp_path.iterdir()) == []  # checked before anything was written


def test_gpu_check_passes_through_when_a_gpu_is_visible(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench_library.exit_without_gpu("experiments.bench_library") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_library.exit_without_gpu("experiments.bench_library") == 2
    assert capsys.readouterr().err.startswith("error: no CUDA GPU visible; experiments.bench_library")


# -- default output folders ------------------------------------------------------------------

def test_default_out_is_a_new_runs_folder():
    import datetime as dt

    now = dt.datetime(2026, 12, 1, 7, 15, 0, tzinfo=dt.UTC)
    assert bench_library.default_out("library", now) == Path("runs/bench-20261201-071500/library")
    assert "experiments" not in bench_library.default_out("baselines").parts


class _NoTimingEvaluator:
    """Stands in for the GPU evaluator: names a GPU, then fails every kernel it is asked to time."""

    def __init__(self, **_: object) -> None:
        pass

    def info(self) -> dict[str, str]:
        return {"gpu": "test GPU"}

    def time_peers_full(self, *_: object, **__: object) -> dict[str, object]:
        from evaluators.gpu import EvaluatorError

        raise EvaluatorError("no timing in this test")

    def close(self) -> None:
        pass


def test_bench_library_without_out_writes_under_runs(tmp_path, monkeypatch):
    import evaluators.gpu

    kept = ROOT / "experiments" / "results" / "sweep-h200.json"
    before = kept.read_bytes() if kept.is_file() else None
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench_library, "exit_without_gpu", lambda program: None)
    monkeypatch.setattr(evaluators.gpu, "GpuEvaluator", _NoTimingEvaluator)
    assert bench_library.main(["--kernel", "silu_and_mul", "--no-plots"]) == 1  # the kernel failed
    (written,) = (tmp_path / "runs").glob("bench-*/library.json")
    assert json.loads(written.read_text())["meta"]["failed"] == {"silu_and_mul float16": "no timing in this test"}
    assert (kept.read_bytes() if kept.is_file() else None) == before


def test_bench_library_help_names_the_default(capsys):
    with pytest.raises(SystemExit):
        bench_library.main(["--help"])
    assert "runs/bench-<UTC time>/library" in " ".join(capsys.readouterr().out.split())


@pytest.mark.gpu
def test_bench_library_without_out_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bench_library.main(["--kernel", "silu_and_mul", "--repetitions", "5", "--no-plots"]) == 0
    (written,) = (tmp_path / "runs").glob("bench-*/library.json")
    assert json.loads(written.read_text())["results"][0]["kernel"] == "silu_and_mul"


# -- progress line and Ray start-up ----------------------------------------------------------

def _controller() -> SimpleNamespace:
    return SimpleNamespace(states=[], config=SimpleNamespace(search=SimpleNamespace(rounds=2)), cache={},
                           start=time.time(), pool=SimpleNamespace(busy_s=0.0))


@pytest.mark.parametrize("cls", [Progress, SweepProgress])
def test_progress_line_names_what_was_busy(cls):
    standin = cls(stream=io.StringIO(), evaluator_kind="standin").line(_controller())
    assert "evaluator busy" in standin and "gpu" not in standin.lower()
    assert "gpu busy" in cls(stream=io.StringIO(), evaluator_kind="gpu").line(_controller())


@pytest.mark.slow
def test_standin_run_says_evaluator_busy(tmp_path):
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "search.run", "--evaluator", "standin", "--rounds", "1", "--population", "1",
           "--kernel", "silu_and_mul", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "evaluator busy" in proc.stderr and "gpu busy" not in (proc.stderr + proc.stdout).lower()
    assert "Token authentication" not in proc.stderr  # Ray's notice about its own default


def test_only_rays_notice_about_its_default_is_filtered():
    notice = logging.LogRecord(RAY_AUTH_LOGGER, logging.WARNING, "", 0, RAY_AUTH_NOTICE + ". Set ...", None, None)
    other = logging.LogRecord(RAY_AUTH_LOGGER, logging.WARNING, "", 0,
                              "Token authentication is disabled for this Ray cluster. Anyone ...", None, None)
    assert not RayAuthNoticeFilter().filter(notice) and RayAuthNoticeFilter().filter(other)
    quiet_ray_auth_notice()
    quiet_ray_auth_notice()
    filters = logging.getLogger(RAY_AUTH_LOGGER).filters
    assert sum(isinstance(f, RayAuthNoticeFilter) for f in filters) == 1


@pytest.mark.slow
def test_a_cluster_started_after_a_run_in_the_same_process_starts(tmp_path):
    # What setting RAY_AUTH_MODE ourselves once broke: the run starts (and ends) its own local
    # cluster in this process; a test cluster started afterwards must come up and run tasks.
    import ray

    from search import run

    if ray.is_initialized():
        ray.shutdown()
    args = ["--evaluator", "standin", "--rounds", "1", "--population", "1", "--variants", "1", "--trials", "1",
            "--kernel", "silu_and_mul", "--out", str(tmp_path)]
    try:
        assert run.main(args) == 0
    finally:
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=run.worker_runtime_env(), log_to_driver=False)
    try:
        assert ray.get(ray.remote(lambda: 7).remote()) == 7
    finally:
        ray.shutdown()
