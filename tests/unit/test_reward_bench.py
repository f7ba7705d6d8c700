"""``experiments.reward_bench`` on the CPU stand-in: a short run with a few HTTP clients
writes its JSON and markdown with the measures the GPU run reports."""

from __future__ import annotations

import json

from experiments.reward_bench import (
    Item,
    Sample,
    load_script,
    main,
    percentile,
    summarise,
    whole_run,
)
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


def _sample(status: str, score: float, speedup: float | None, hostile: str = "", twin: str = "") -> Sample:
    return Sample(0, 1.0, status, score, False, hostile, end=1.0, speedup=speedup, twin=twin)


def test_a_correct_trick_is_held_to_its_twin_not_to_a_zero_reward():
    hostile = [Item("k", "a", name="zero_inputs"), Item("k", "b", name="kept_in_l2", twin="plain")]
    same = [_sample("REJECTED", -1.0, None, "zero_inputs"), _sample("OK", 1.13, 2.80, "kept_in_l2"),
            _sample("OK", 1.11, 2.76, twin="plain")]
    r = summarise(same, 0.0, 10.0, hostile)
    assert r["hostile_all_held"] and r["hostile_all_nonpositive"]
    assert r["hostile"]["kept_in_l2"]["gains_nothing"] and r["hostile"]["kept_in_l2"]["twin_speedup"] == 2.76
    gains = [*same[:2], _sample("OK", 0.5, 2.0, twin="plain")]  # 2.80x against 2.0x: past the margin
    assert not summarise(gains, 0.0, 10.0, hostile)["hostile_all_held"]
    no_twin = same[:2]  # the twin never answered: nothing shows the trick gained nothing
    assert not summarise(no_twin, 0.0, 10.0, hostile)["hostile_all_held"]
    # a twin's answer is neither a hostile verdict nor a fresh reward of the policy
    assert "plain" not in r["hostile"] and r["fresh_rewards_per_minute"] == 0


def test_the_script_sends_each_named_twin_by_name():
    script = load_script(["silu_and_mul"], FIXTURE_DIR)
    named = {f.name: f.twin for f in fixtures() if f.twin}
    assert named and {t.name for t in script.twins} == {n.removesuffix(".cu") for n in named.values()}
    assert all(i.twin == named[i.name].removesuffix(".cu") for i in script.hostile if i.name in named)


def test_the_whole_run_pace_counts_every_fresh_answer_of_the_policy():
    def at(end: float, hostile: str = "", cached: bool = False, twin: str = "") -> Sample:
        return Sample(0, 1.0, "OK", 0.1, cached, hostile, end=end, twin=twin)

    answered = [at(5.0, "trap"), at(8.0), at(70.0, "infinite_loop"), at(80.0), at(100.0, cached=True),
                at(110.0, twin="plain"), at(130.0)]
    assert whole_run(answered, 10.0) == {"span_s": 120.0, "fresh": 3, "fresh_rewards_per_minute": 1.5}
    assert whole_run([], 10.0)["fresh_rewards_per_minute"] is None
