"""Rewards served per minute by the reward service under concurrent HTTP clients.

    python -m experiments.reward_bench --evaluator gpu --gpus 1 --clients 32 --duration-s 300 \\
        --fixtures tests/adversarial --out experiments/results/reward-bench-h200
    python -m experiments.reward_bench --evaluator standin --clients 4 --duration-s 20 --out /tmp/rb  # CPU

A local Ray cluster runs the service (:mod:`search.reward_serve`: its actor, its evaluator
pool of ``--gpus`` GPUs, its HTTP endpoint on 127.0.0.1); ``--clients`` threads play a
scripted policy over HTTP until ``--duration-s`` has passed. Each client in turn sends a new
variant (a library kernel's baseline or an honest fixture under a fresh comment: a source
never seen, so it is compiled, validated and timed), or, with ``--repeat-fraction``, one it
sent before (answered from the records). Every hostile fixture of ``--fixtures`` (a folder with
``fixtures.yaml``, the adversarial index) is sent once at the start, spread over the
clients; the report lists each one's verdict and reward, and whether each was held: a
non-positive reward, or, for correct code whose trick must gain nothing (its ``twin`` in the
index, sent as well), a speedup no more than the twin's over :data:`TWIN_MARGIN`.

Writes OUT/reward_bench.json and OUT/reward_bench.md: command, git commit, GPU, date,
rewards per minute (all, and freshly evaluated ones), latency p50/p95, verdict counts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shlex
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from kernels.spec import load_kernel
from search.report import git_commit
from search.reward import RewardConfig
from search.reward_client import HttpClient, RewardClientError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_KERNELS = ("silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse")
TWIN_MARGIN = 0.9  # a correct trick's speedup may exceed its honest twin's by 1/0.9 at most


@dataclass(frozen=True)
class Item:
    """One request of the scripted policy: a kernel, a source, and what it is."""

    kernel: str
    source: str
    dtype: str = "float16"
    name: str = ""  # a hostile fixture's name ('' for an honest variant)
    twin: str = ""  # a hostile fixture's honest twin (fixtures.yaml); for a twin sent as such: "twin"


@dataclass
class Script:
    """The scripted policy's material: honest sources per kernel, and hostile fixtures."""

    honest: list[Item]
    hostile: list[Item]
    twins: list[Item] = field(default_factory=list)  # sent once each, by name, beside the hostile
    sent: list[Item] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def load_script(kernels: Sequence[str], fixtures: Path | None) -> Script:
    """Baselines of ``kernels``, plus the honest and hostile fixtures listed in
    ``fixtures/fixtures.yaml`` (an honest fixture's trick starts with 'none'). A hostile
    fixture that is correct code names its honest ``twin`` (the same code without the trick):
    the twin is sent too, by name, so that the trick's speedup can be held to the twin's."""
    honest = [Item(k, load_kernel(k).baseline_source()) for k in kernels]
    hostile: list[Item] = []
    twins: list[Item] = []
    if fixtures is not None:
        entries = yaml.safe_load((fixtures / "fixtures.yaml").read_text())["fixtures"]
        wanted = {Path(e["twin"]).stem for e in entries if e.get("twin")}
        for entry in entries:
            name = Path(entry["file"]).stem
            item = Item(entry["kernel"], (fixtures / entry["file"]).read_text(), entry.get("dtype", "float16"), name,
                        Path(entry.get("twin") or "").stem)
            if str(entry["trick"]).strip().lower().startswith("none"):
                honest.append(Item(item.kernel, item.source, item.dtype))
                if name in wanted:
                    twins.append(replace(item, twin="twin"))
            else:
                hostile.append(item)
    return Script(honest, hostile, twins)


@dataclass
class Sample:
    """One answered request."""

    client: int
    latency_s: float
    status: str
    score: float
    cached: bool
    hostile: str = ""
    error: str = ""
    end: float = 0.0  # when the answer came (seconds since the epoch)
    speedup: float | None = None
    twin: str = ""  # the name of a twin sent as such (then ``hostile`` is empty)


def client_loop(index: int, url: str, script: Script, hostile: list[Item], deadline: float, grace_s: float,
                repeat_fraction: float, seed: int, samples: list[Sample]) -> None:
    """One client: its share of the hostile fixtures first (all of them, whatever the time),
    then honest variants until the deadline. No request waits past ``deadline + grace_s``:
    one still unanswered then is counted as UNANSWERED (the run must end in bounded time)."""
    rng = random.Random(seed * 1000 + index)
    n = 0
    queue = list(hostile)
    while time.time() < deadline or queue:
        if queue:
            item = queue.pop(0)
        elif script.sent and rng.random() < repeat_fraction:
            with script.lock:
                item = rng.choice(script.sent)
        else:
            base = rng.choice(script.honest)
            item = Item(base.kernel, f"{base.source.rstrip()}\n// policy sample {index}-{n}\n", base.dtype)
            n += 1
            with script.lock:
                script.sent.append(item)
        left_s = deadline + grace_s - time.time()
        if left_s <= 0:
            return
        # a twin sent as such is named as a twin, not as a hostile fixture
        as_hostile, as_twin = ("", item.name) if item.twin == "twin" else (item.name, "")
        start = time.perf_counter()
        try:
            answer = HttpClient(url, timeout_s=left_s).score(item.kernel, item.source, item.dtype, f"client{index}")
            speedup = answer.get("speedup")
            samples.append(Sample(index, time.perf_counter() - start, answer["status"], float(answer["score"]),
                                  bool(answer.get("cached")), as_hostile, end=time.time(),
                                  speedup=None if speedup is None else float(speedup), twin=as_twin))
        except RewardClientError as exc:
            late = time.time() >= deadline + grace_s - 1
            samples.append(Sample(index, time.perf_counter() - start, "UNANSWERED" if late else "ERROR", 0.0, False,
                                  as_hostile, str(exc)[:300], time.time(), twin=as_twin))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarise(samples: Sequence[Sample], start: float, deadline: float, hostile: Sequence[Item]) -> dict[str, Any]:
    """Rates count the answers that came within the measured window (start to deadline)."""
    answered = [s for s in samples if s.status not in ("ERROR", "UNANSWERED")]
    in_window = [s for s in answered if s.end <= deadline]
    fresh = [s for s in in_window if not s.cached and not s.hostile and not s.twin]
    lat = [s.latency_s for s in answered]
    window_s = deadline - start
    per_hostile: dict[str, dict[str, Any]] = {s.hostile: {"status": s.status, "score": s.score, "speedup": s.speedup}
                                              for s in samples if s.hostile}
    twins = {s.twin: s for s in samples if s.twin}
    for item in hostile:
        if item.twin and item.name in per_hostile:
            per_hostile[item.name].update(twin=item.twin, **gains_nothing(per_hostile[item.name], twins.get(item.twin)))
    return {
        "requests": len(samples), "answered": len(answered),
        "unanswered_at_end": sum(s.status == "UNANSWERED" for s in samples),
        "errors": sum(s.status == "ERROR" for s in samples),
        "window_s": window_s, "rewards_per_minute": len(in_window) / window_s * 60,
        "fresh_rewards_per_minute": len(fresh) / window_s * 60,
        "whole_run": whole_run(answered, start),
        "latency_s": {"p50": percentile(lat, 0.5), "p95": percentile(lat, 0.95)},
        "fresh_latency_s": {"p50": percentile([s.latency_s for s in fresh], 0.5),
                            "p95": percentile([s.latency_s for s in fresh], 0.95)},
        "cached_latency_s": {"p50": percentile([s.latency_s for s in answered if s.cached], 0.5),
                             "p95": percentile([s.latency_s for s in answered if s.cached], 0.95)},
        "statuses": dict(Counter(s.status for s in answered)),
        "hostile": per_hostile, "hostile_sent": len(hostile),
        "hostile_all_nonpositive": all(v["score"] <= 0 and v["status"] not in ("ERROR", "UNANSWERED")
                                       for v in per_hostile.values() if "twin" not in v)
                                   and len(per_hostile) == len(hostile),
        # every hostile fixture as its fixture asks: a non-positive reward, or (correct code with a
        # twin) no gain over the twin beyond the timing margin
        "hostile_all_held": all(v.get("gains_nothing", False) if "twin" in v else
                                v["score"] <= 0 and v["status"] not in ("ERROR", "UNANSWERED")
                                for v in per_hostile.values()) and len(per_hostile) == len(hostile),
        "first_errors": [s.error for s in samples if s.error][:5],
    }


def whole_run(answered: Sequence[Sample], start: float) -> dict[str, Any]:
    """The policy's fresh rewards over the whole run, from the start to the last answer (the
    grace included): a window that the hostile phase fills (it is sent first, and every hang or
    crash costs its timeout or a new worker) shows little of the service's pace on new sources."""
    fresh = [s for s in answered if not (s.cached or s.hostile or s.twin)]
    span = max((s.end for s in answered), default=start) - start
    return {"span_s": span, "fresh": len(fresh), "fresh_rewards_per_minute": len(fresh) / span * 60 if span > 0 else None}


def gains_nothing(tricked: dict[str, Any], twin: Sample | None) -> dict[str, Any]:
    """A correct trick against its honest twin: both correct (OK), and the trick's speedup at
    most the twin's over :data:`TWIN_MARGIN` (the timing margin tests/gpu/test_reward_gpu.py
    holds the same pair to)."""
    if twin is None or twin.speedup is None or tricked.get("speedup") is None:
        return {"twin_speedup": None if twin is None else twin.speedup, "gains_nothing": False}
    ok = tricked["status"] == twin.status == "OK"
    return {"twin_speedup": twin.speedup, "gains_nothing": ok and tricked["speedup"] <= twin.speedup / TWIN_MARGIN}


def markdown(result: dict[str, Any]) -> str:
    r, lat, fresh = result["results"], result["results"]["latency_s"], result["results"]["fresh_latency_s"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.0f} ms"

    lines = [
        "# Reward service throughput", "",
        f"- command: `{result['command']}`", f"- git commit: {result['git_commit'] or 'unknown'}",
        f"- GPU: {result['gpu']} ({result['evaluator']} evaluator, {result['gpus']} evaluator actor(s))",
        f"- date: {result['date']}", f"- clients: {result['clients']} over HTTP; rates over the first {r['window_s']:.0f} s", "",
        "| measure | value |", "|---|---|",
        f"| rewards per minute | {r['rewards_per_minute']:.1f} |",
        f"| freshly evaluated rewards per minute | {r['fresh_rewards_per_minute']:.1f} |",
        *([f"| freshly evaluated rewards per minute, whole run (grace included) | "
           f"{whole['fresh_rewards_per_minute']:.1f} ({whole['fresh']} in {whole['span_s']:.0f} s) |"]
          if (whole := r.get("whole_run") or {}).get("fresh_rewards_per_minute") is not None else []),
        f"| latency p50 / p95 (all) | {ms(lat['p50'])} / {ms(lat['p95'])} |",
        f"| latency p50 / p95 (fresh) | {ms(fresh['p50'])} / {ms(fresh['p95'])} |",
        f"| requests answered / unanswered at the end / errors | {r['answered']} / {r['unanswered_at_end']} / "
        f"{r['errors']} |",
        f"| verdicts | {', '.join(f'{k} {v}' for k, v in sorted(r['statuses'].items()))} |", "",
    ]
    if r["hostile_sent"]:
        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}x"

        def held(v: dict[str, Any]) -> str:
            if "twin" in v:
                return (f"correct code: speedup {fmt(v['speedup'])} vs its twin {v['twin']} {fmt(v['twin_speedup'])}: "
                        f"{'gains nothing' if v['gains_nothing'] else 'GAINS'}")
            return "yes" if v["score"] <= 0 and v["status"] not in ("ERROR", "UNANSWERED") else "NO"

        lines += [f"Hostile fixtures: {r['hostile_sent']} sent; every one held (a non-positive reward, or for "
                  f"correct code with an honest twin no gain over the twin beyond 1/{TWIN_MARGIN}): "
                  f"**{r.get('hostile_all_held')}**; all rewards of those without a twin non-positive: "
                  f"**{r['hostile_all_nonpositive']}**", "",
                  "| fixture | verdict | reward | held |", "|---|---|---|---|"]
        lines += [f"| {n} | {v['status']} | {v['score']:.3f} | {held(v)} |" for n, v in sorted(r["hostile"].items())]
    if result["evaluator"] == "standin":
        lines += ["", "STAND-IN EVALUATOR: synthetic numbers from a CPU test double, not measurements."]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.reward_bench", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--evaluator", choices=("gpu", "standin"), default="gpu")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration-s", type=float, default=300.0, help="how long clients send new requests")
    p.add_argument("--grace-s", type=float, default=120.0, help="how long past --duration-s a request may wait")
    p.add_argument("--kernel", action="append", dest="kernels", help=f"repeatable; default {', '.join(DEFAULT_KERNELS)}")
    p.add_argument("--fixtures", type=Path, help="adversarial fixture folder holding fixtures.yaml (e.g. the tests' one)")
    p.add_argument("--repeat-fraction", type=float, default=0.25, help="share of requests that resend an earlier source")
    p.add_argument("--no-gates", action="store_true", help="pay on the search shapes' verdict alone")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="folder for reward_bench.json and reward_bench.md")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import ray

    from search.reward_serve import start_actor
    from search.run import quiet_ray_auth_notice, worker_runtime_env

    args = build_parser().parse_args(argv)
    if args.fixtures is not None and not (args.fixtures / "fixtures.yaml").is_file():
        print(f"error: --fixtures {args.fixtures} holds no fixtures.yaml", file=sys.stderr)
        return 2
    script = load_script(args.kernels or DEFAULT_KERNELS, args.fixtures)
    gates = not args.no_gates
    config = RewardConfig(evaluator=args.evaluator, gpus=args.gpus, heldout=gates, sanitize=gates, loop=gates,
                          max_inflight=max(2 * args.gpus, 4))
    quiet_ray_auth_notice()
    ray.init(include_dashboard=False, runtime_env=worker_runtime_env(), log_to_driver=False)
    if args.evaluator == "gpu" and int(ray.cluster_resources().get("GPU", 0)) < args.gpus:
        print(f"error: {args.gpus} GPU(s) asked, the machine has {int(ray.cluster_resources().get('GPU', 0))}; "
              "use --evaluator standin on a CPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    actor = start_actor(args.out / "service", config, max_concurrency=max(64, 2 * args.clients))
    url = ray.get(actor.serve_http.remote("127.0.0.1", 0))
    gpu = ray.get(actor.device.remote())
    samples: list[Sample] = []
    start = time.time()
    deadline = start + args.duration_s
    first = script.hostile + script.twins  # sent whatever the time, shared out among the clients
    threads = [threading.Thread(target=client_loop, args=(i, url, script, first[i::args.clients], deadline,
                                                          args.grace_s, args.repeat_fraction, args.seed, samples))
               for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall_s = time.time() - start
    # Requests still waiting at the grace's end are cut off, not awaited: no evaluator is closed
    # politely behind them, Ray's shutdown ends the actors (every record line is already synced).
    result = {"command": "python -m experiments.reward_bench " + shlex.join(sys.argv[1:] if argv is None else list(argv)),
              "git_commit": git_commit(ROOT), "gpu": gpu, "evaluator": args.evaluator, "gpus": args.gpus,
              "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "clients": args.clients,
              "gates": gates, "wall_s": wall_s, "service": ray.get(actor.stats.remote()),
              "results": summarise(samples, start, deadline, script.hostile)}
    ray.shutdown()
    (args.out / "reward_bench.json").write_text(json.dumps(result, indent=2))
    (args.out / "reward_bench.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
