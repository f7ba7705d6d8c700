"""A GPU search on a two-node Ray cluster on one GPU machine (run on the H200:
``python -m pytest tests/gpu/test_cluster_gpu.py``).

The head node holds GPU 0, a worker node only CPUs; the driver runs from a folder neither
node can see (:mod:`tests.ray_nodes`). The run must complete with the GPU evaluator on the
head's GPU, import the project from Ray's runtime resources and take the external kernel
folders from the staged root.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.ray_nodes import check_placement, two_node_cluster

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.slow
def test_gpu_run_on_a_gpu_node_and_a_cpu_node():
    with two_node_cluster(["--num-cpus", "4", "--num-gpus", "1"], ["--num-cpus", "4", "--num-gpus", "0"],
                          head_env={"CUDA_VISIBLE_DEVICES": "0"}) as c:
        proc = c.drive("search.run", "--kernel-dir", str(c.library), "--rounds", "1", "--population", "2",
                       "--variants", "2", "--trials", "2", "--out", str(c.driver_dir / "runs"), timeout_s=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        (run_dir,) = (c.driver_dir / "runs").iterdir()
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["evaluator"] == "gpu" and summary["n_gpus"] == 1
        record = check_placement(c, run_dir, n_evaluators=1, n_agents=2)
        gpu_nodes = {n["node_id"] for n in record["nodes"] if n["resources"].get("GPU")}
        assert {e["node_id"] for e in record["evaluators"]} == gpu_nodes
