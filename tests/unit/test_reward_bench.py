"""``experiments.reward_bench`` on the CPU stand-in: a short run with a few HTTP clients
writes its JSON and markdown with the measures the GPU run reports."""

from __future__ import annotations

import json

from experiments.reward_bench import main, percentile
from tests.adversarial.index import FIXTURE_DIR, fixtures


def test_percentile_interpolates():
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([1.0, 2.0], 0.95) == 1.95 and percentile([], 0.5) is None


def test_standin_bench_writes_its_report(tmp_path):
    out = tmp_path / "bench"
    assert main(["--evaluator", "standin", "--clients", "4", "--duration-s", "30", "--kernel", "silu_and_mul",
                 "--fixtures", str(FIXTURE_DIR), "--out", str(out), "--grace-s", "600"]) == 0
    result = json.loads((out / "reward_bench.json").read_text())
    r = result["results"]
    assert result["gpu"] == "cpu-standin" and result["clients"] == 4 and result["command"].startswith("python -m")
    assert r["errors"] == r["unanswered_at_end"] == 0 and r["answered"] >= r["hostile_sent"] > 0
    assert r["rewards_per_minute"] > 0 and r["latency_s"]["p50"] <= r["latency_s"]["p95"]
    assert set(r["hostile"]) == {f.name for f in fixtures() if not f.honest}
    refused = [f.name for f in fixtures() if not f.honest and f.status in ("COMPILE_ERROR", "RESOURCE_ERROR")]
    assert all(r["hostile"][n]["score"] <= 0 for n in refused)
    md = (out / "reward_bench.md").read_text()
    assert "rewards per minute" in md and "STAND-IN" in md and result["date"] in md
