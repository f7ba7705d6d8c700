"""Shipped ops on the GPU: outputs match the spec's fp32 reference within its tolerance on the
search shapes and every input case, first launches inside a CUDA-graph capture work, replays
compute fresh inputs, and a foreign architecture is refused before anything loads.

The package is ``$SHIP_PACKAGE/$SHIP_NAME`` (ship's ``--out`` and ``--name``) when set, e.g. a
package shipped from a real GPU search; otherwise one is built here from a stand-in run of the
three model kernels (its cubins are real NVRTC output; the stand-in only judged them on the CPU).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from kernels.spec import load_kernel

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("silu_and_mul", "fused_add_rmsnorm", "rotary_embedding_neox")
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder, name = os.environ.get("SHIP_PACKAGE"), os.environ.get("SHIP_NAME", "kernel_ops")
    if not folder:
        runs = tmp_path_factory.mktemp("runs")
        cmd = [sys.executable, "-m", "search.run", "--evaluator", "standin", "--rounds", "1", "--population", "1",
               "--dtype", "bfloat16", "--out", str(runs), *[a for k in KERNELS for a in ("--kernel", k)]]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)
        (run_dir,) = [p for p in runs.iterdir() if (p / "summary.json").is_file()]
        folder, name = str(tmp_path_factory.mktemp("shipped")), "gpu_ship_ops"
        subprocess.run([sys.executable, "-m", "search.ship", str(run_dir), "--out", folder, "--name", name],
                       cwd=ROOT, check=True, capture_output=True, timeout=600)
    sys.path.insert(0, folder)
    return importlib.import_module(name)


def _builds(pkg: Any) -> list[tuple[str, str]]:
    return [(k, d) for k, e in sorted(pkg.MANIFEST["kernels"].items()) for d in sorted(e["builds"])]


def _inputs(spec: Any, shape: dict[str, int], dtype: str, seed: int, case: str = "random") -> dict[str, torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return spec.make_inputs(shape, getattr(torch, dtype), generator, case, torch.device("cuda"))


def _call(pkg: Any, spec: Any, tensors: dict[str, torch.Tensor]) -> None:
    getattr(pkg, spec.name)(*[tensors[a.name] for a in spec.args if a.kind == "tensor"],
                            **{a.name: spec.constants[a.name] for a in spec.args if a.kind == "float"})


def _check(spec: Any, dtype: str, shape: dict[str, int], got: dict[str, torch.Tensor],
           expected: dict[str, torch.Tensor], where: str) -> None:
    rtol, atol = spec.tolerance(dtype)
    for a in spec.written_args:
        if spec.compare is not None:
            problem = spec.compare(a.name, got[a.name], expected[a.name])
            assert problem is None, f"{where} {a.name}: {problem}"
            continue
        g, e = got[a.name].float(), expected[a.name].float()
        bad = ~((g - e).abs() <= atol + rtol * e.abs()) & ~(g.isnan() & e.isnan())
        assert not bool(bad.any()), f"{where} {a.name}: {int(bad.sum())} elements off, first at {bad.nonzero()[0].tolist()}"


def test_ops_match_the_reference_on_every_search_shape_and_case(pkg: Any):
    pkg.load()
    for kernel, dtype in _builds(pkg):
        spec = load_kernel(kernel)
        for shape in spec.search_shapes:
            for case in ("random", *spec.edge_cases):
                tensors = _inputs(spec, shape, dtype, 0, case)
                before = {n: t.clone() for n, t in tensors.items()}
                expected = spec.reference(before, shape, spec.constants)
                for a in spec.written_args:
                    if a.role == "out":
                        tensors[a.name].fill_(float("nan"))
                _call(pkg, spec, tensors)
                torch.cuda.synchronize()
                _check(spec, dtype, shape, tensors, expected, f"{kernel} {dtype} {shape} {case}")


def test_ops_run_under_cuda_graph_capture_and_replay_on_new_inputs(pkg: Any):
    for kernel, dtype in _builds(pkg):
        spec = load_kernel(kernel)
        shape = spec.search_shapes[len(spec.search_shapes) // 2]
        static = _inputs(spec, shape, dtype, 1)
        # a fresh runtime, so the first load of the cubin happens inside the capture
        runtime_mod = sys.modules[f"{pkg.__name__}._runtime"]
        fresh = runtime_mod.Runtime(pkg.__name__, pkg.MANIFEST["arch"], pkg.MANIFEST["nvrtc"],
                                    {(kernel, dtype): Path(pkg.__file__).parent / pkg.MANIFEST["kernels"][kernel]
                                     ["builds"][dtype]["cubin"]})
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            _call(pkg, spec, static)  # warm-up of the package's own runtime
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            fresh.function(kernel, dtype, torch.cuda.current_device())
            _call(pkg, spec, static)
        for seed in (2, 3):
            new = _inputs(spec, shape, dtype, seed)
            for name, t in new.items():
                static[name].copy_(t)
            expected = spec.reference({n: t.clone() for n, t in new.items()}, shape, spec.constants)
            graph.replay()
            torch.cuda.synchronize()
            _check(spec, dtype, shape, static, expected, f"{kernel} {dtype} replay {seed}")


def test_a_foreign_architecture_is_refused_on_this_gpu(pkg: Any):
    runtime_mod = sys.modules[f"{pkg.__name__}._runtime"]
    runtime = runtime_mod.Runtime(pkg.__name__, "sm_10", "0.0", {})
    with pytest.raises(pkg.ArchitectureError, match="built for sm_10"):
        runtime.check_device(torch.cuda.current_device())
