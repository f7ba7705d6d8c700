"""The reward service inside an existing (trainer's) Ray cluster of two nodes on this machine:
``python -m search.reward_serve --address`` starts it, a second driver of the same cluster (a
trainer) gets rewards through verl's ``compute_score`` from the named actor, and HTTP clients
from its endpoint; Ctrl-C ends it."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from kernels.records import read_jsonl
from kernels.spec import load_kernel
from search.reward_client import HttpClient
from tests.ray_nodes import ray_cluster

BASELINE = load_kernel("silu_and_mul").baseline_source()
TRAINER = """
import json, sys, ray
ray.init(address=sys.argv[1])
from search.reward_verl import compute_score
print(json.dumps(compute_score("kernel-search", sys.argv[2], "silu_and_mul:float16", {"client": "trainer"})))
"""


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return out


def _wait_for_url(lines: queue.Queue[str], proc: subprocess.Popen[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        found = re.search(r"(http://\S+):?\d*/score", line)
        if found:
            return found.group(1)
    raise AssertionError(f"no URL from reward_serve: {''.join(seen)[-2000:]}")


@pytest.mark.slow
def test_served_from_a_trainer_cluster(tmp_path):
    with ray_cluster(["--num-cpus", "2"], [["--num-cpus", "1"]]) as c:
        serve = subprocess.Popen([sys.executable, "-m", "search.reward_serve", "--address", c.address, "--evaluator",
                                  "standin", "--port", "0", "--out", str(tmp_path / "rewards")], cwd=c.project,
                                 env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            url = _wait_for_url(_lines(serve), serve, timeout_s=240)
            trainer = subprocess.run([sys.executable, "-c", TRAINER, c.address, f"```cuda\n{BASELINE}```"],
                                     cwd=c.project, env=c.env, capture_output=True, text=True, timeout=240)
            assert trainer.returncode == 0, trainer.stderr[-3000:]
            verl = json.loads(trainer.stdout.strip().splitlines()[-1])
            assert verl["correct"] == 1.0 and verl["score"] > 0
            http = HttpClient(url, timeout_s=240)
            assert http.score("silu_and_mul", BASELINE)["cached"]  # the trainer's request is on record
            with urllib.request.urlopen(url + "/health", timeout=60) as resp:
                assert json.loads(resp.read())["served"] == 2
        finally:
            serve.send_signal(signal.SIGINT)
            serve.wait(timeout=60)
        rows = list(read_jsonl(tmp_path / "rewards" / "rewards.jsonl"))
        assert [r["client"] for r in rows][:1] == ["trainer"] and len(rows) == 2
