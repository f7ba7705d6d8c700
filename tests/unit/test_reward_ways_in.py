"""The reward service's ways in, on the CPU stand-in evaluator behind a real named Ray actor
and a real HTTP server on 127.0.0.1: verl's ``compute_score``, the HTTP endpoints
(OpenRLHF's remote reward among them), the multi-turn environment, and the trajectory file
that searches and served episodes share, read back with polars (and ``datasets`` if present)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from kernels.records import read_jsonl
from kernels.spec import load_kernel
from search.reward import RewardConfig
from search.reward_client import ActorClient, HttpClient, RewardClientError, extract_kernel
from search.reward_env import EpisodeError, KernelEnv
from search.reward_serve import start_actor
from search.trajectory import (
    POLARS_SCHEMA,
    SCHEMA,
    from_search_run,
    from_service,
    read_trajectories,
    write_trajectories,
)
from tests.adversarial.index import fixtures
from tests.unit.test_llm_export import run_dir  # noqa: F401 - a fixture: a small search run's records

ROOT = Path(__file__).resolve().parents[2]
BASELINE = load_kernel("silu_and_mul").baseline_source()
REFUSED = ("COMPILE_ERROR", "RESOURCE_ERROR")  # verdicts admission gives on the CPU too


def response(source: str, prose: str = "Plan: keep it simple.") -> str:
    return f"<think>maybe ```cuda\nnot this\n```</think>\n{prose}\n```cuda\n{source}\n```\nDone."


@pytest.fixture(scope="module")
def served(local_ray, tmp_path_factory):
    import ray

    out = tmp_path_factory.mktemp("served")
    actor = start_actor(out, RewardConfig(evaluator="standin", gpus=1), max_concurrency=64)
    url = ray.get(actor.serve_http.remote("127.0.0.1", 0), timeout=120)
    yield actor, url, out
    ray.get(actor.close.remote())
    ray.kill(actor)


def test_extract_kernel_takes_the_last_tagged_block_outside_thinking():
    assert extract_kernel(response("int a;")) == "int a;\n"
    assert extract_kernel("```\nuntagged\n```") == "untagged\n"
    assert extract_kernel("```cuda\nfirst\n```\n```python\nprint()\n```\n```cu\nsecond\n```") == "second\n"
    assert extract_kernel("no code at all") == ""


# A trainer's reward worker: its own process, joined to the cluster, finds the named actor.
VERL_WORKER = """
import json, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
from search import reward_verl
from tests.unit.test_reward_ways_in import BASELINE, response
print(json.dumps([
    reward_verl.compute_score("kernelbook", response(BASELINE), "silu_and_mul", {"dtype": "float16"}),
    reward_verl.compute_score("kernelbook", "I would vectorise it.", '{"kernel": "silu_and_mul"}'),
    reward_verl.compute_score("kernelbook", response(BASELINE + "// standin: rejected\\n"), "silu_and_mul:float16"),
]))
"""


def test_verl_compute_score_through_the_named_actor(served):
    """verl's reward function in a process of its own that joins the cluster (as a trainer's
    reward worker does; the test process, which has started and stopped a Ray cluster per
    module, is not one) and reaches the service by the actor's name."""
    import ray

    env = {k: v for k, v in os.environ.items() if k != "KERNEL_SEARCH_REWARD_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", VERL_WORKER, ray.get_runtime_context().gcs_address], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    good, none, cheat = json.loads(out.stdout.strip().splitlines()[-1])
    assert good["correct"] == 1.0 and good["score"] >= 0.1 and good["compiled"] == 1.0
    assert all(isinstance(v, float) for v in good.values())
    assert none == {"score": 0.0, "correct": 0.0, "speedup": 0.0, "compiled": 0.0, "rejected": 0.0, "cached": 0.0}
    assert cheat["score"] < 0 and cheat["rejected"] == 1.0


def test_verl_compute_score_over_http(served, monkeypatch):
    from search import reward_verl

    _, url, out = served
    monkeypatch.setenv("KERNEL_SEARCH_REWARD_URL", url)
    again = reward_verl.compute_score("kernelbook", response(BASELINE), "silu_and_mul", {"client": "w1"})
    assert again["correct"] == 1.0 and again["cached"] == 1.0  # judged once already: from the records
    rows = list(read_jsonl(out / "rewards.jsonl"))
    assert rows[-1]["client"] == "w1" and rows[-1]["cached"]


def test_http_endpoints(served):
    _, url, _ = served
    http = HttpClient(url, timeout_s=120)
    assert http.score("silu_and_mul", BASELINE + "// http\n")["correct"]
    batch = http.post("/openrlhf", {"query": [response(BASELINE), "no code", response("garbage")],
                                    "prompts": ["p"] * 3, "labels": ["silu_and_mul", "silu_and_mul", "silu_and_mul:float16"]})
    assert batch["rewards"][0] > 0 and batch["rewards"][1:] == [0.0, 0.0]
    assert batch["extra_logs"]["status"] == ["OK", "NO_VARIANT", "COMPILE_ERROR"]
    assert http.post("/score", {"kernel": "silu_and_mul", "response": response(BASELINE)})["correct"]
    with pytest.raises(RewardClientError, match="HTTP 400.*no kernel"):
        http.score("no_such_kernel", BASELINE)
    with pytest.raises(RewardClientError, match="HTTP 404"):
        http.post("/nowhere", {})


def test_a_burst_of_concurrent_http_clients_is_answered(served):
    """48 clients at once (a rollout batch): none is turned away at the socket."""
    from concurrent.futures import ThreadPoolExecutor

    _, url, _ = served
    source = BASELINE + "// burst\n"
    with ThreadPoolExecutor(48) as ex:
        answers = list(ex.map(lambda i: HttpClient(url, timeout_s=180).score("silu_and_mul", source, "", f"b{i}"),
                              range(48)))
    assert all(a["correct"] for a in answers) and len({a["request_id"] for a in answers}) == 48


def test_hostile_fixtures_refused_on_the_cpu_get_no_positive_reward(served):
    """Every hostile fixture is sent; those admission refuses (the verdicts a CPU can give)
    must come back with their verdict and a non-positive reward. tests/gpu/test_reward_gpu.py
    checks all of them on the real evaluator."""
    _, url, _ = served
    http = HttpClient(url, timeout_s=300)
    hostile = [f for f in fixtures() if not f.honest]
    answers = http.post("/openrlhf", {"query": [response(f.source()) for f in hostile], "prompts": [""] * len(hostile),
                                      "labels": [f"{f.kernel}:{f.dtype}" for f in hostile], "client": "hostile"})
    by_name = dict(zip((f.name for f in hostile), zip(answers["extra_logs"]["status"], answers["rewards"], strict=True),
                       strict=True))
    refused = [f for f in hostile if f.status in REFUSED]
    assert len(refused) >= 15
    for f in refused:
        status, score = by_name[f.name]
        assert status == f.status and score <= 0, f"{f.name}: {status} {score}"


def test_environment_episode_is_recorded_as_a_trajectory(served):
    actor, _, out = served
    env = KernelEnv(ActorClient(actor), max_turns=2, client_id="env-test")
    obs = env.reset("silu_and_mul")
    assert [m["role"] for m in obs["messages"]] == ["system", "user"] and BASELINE.strip() in obs["messages"][1]["content"]
    first = env.step("Plan: nothing yet.")
    assert (first.reward, first.done, first.info["status"]) == (0.0, False, "NO_VARIANT")
    assert "1 more attempt" in first.observation["feedback"]
    second = env.step(response(BASELINE + "// env\n"))
    assert second.done and second.reward > 0 and second.info["correct"]
    with pytest.raises(EpisodeError):
        env.step("again")
    frame = read_trajectories(out / "trajectories.jsonl")
    row = frame.filter(pl.col("trajectory_id") == f"episode:{env.episode_id}").row(0, named=True)
    assert row["origin"] == "service" and row["n_turns"] == 2 and row["reward"] == second.reward
    assert [t["status"] for t in row["turns"]] == ["NO_VARIANT", "OK"]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert json.loads(row["turns"][1]["evidence"])["gates"]


def test_search_and_service_trajectories_share_one_schema(served, run_dir, tmp_path):  # noqa: F811
    _, _, out = served
    searched = from_search_run(run_dir)
    assert searched and all(t.origin == "search" for t in searched)
    path = write_trajectories(tmp_path / "search.jsonl", searched)
    single = from_service(out)  # every served request but those of episodes, one turn each
    assert single and all(len(t.turns) == 1 and t.messages[-1]["role"] == "assistant" for t in single)
    responses = [t.messages[-1]["content"] for t in single]
    assert any("<think>" in r for r in responses)  # verl's response as the model wrote it
    assert "Plan: nothing yet." not in responses  # the episode's turn is in trajectories.jsonl
    served_path = write_trajectories(tmp_path / "served.jsonl", single)
    both = pl.concat([read_trajectories(p) for p in (path, served_path, out / "trajectories.jsonl")])
    assert dict(both.schema) == POLARS_SCHEMA and set(both["schema"]) == {SCHEMA}
    assert set(both["origin"]) == {"search", "service"}
    # Rewards of search steps follow the service's shaping: a compile error scores 0, not a penalty.
    statuses = {t["status"]: t["reward"] for turns in both["turns"] for t in turns}
    assert statuses["COMPILE_ERROR"] == 0.0 and statuses["OK"] > 0
    if importlib.util.find_spec("datasets") is not None:
        import datasets

        ds = datasets.load_dataset("json", data_files=[str(path), str(served_path), str(out / "trajectories.jsonl")],
                                   split="train")
        assert len(ds) == both.height


def test_trajectory_cli_writes_a_search_run(run_dir, tmp_path):  # noqa: F811
    from search.trajectory import main

    assert main([str(run_dir), "--out", str(tmp_path / "t.jsonl")]) == 0
    assert read_trajectories(tmp_path / "t.jsonl").height == len(from_search_run(Path(run_dir)))


def test_reward_data_writes_verl_prompts_that_compute_score_reads(tmp_path):
    from search.reward_data import main

    assert main(["--out", str(tmp_path / "k.parquet"), "--kernel", "silu_and_mul", "--dtype", "bfloat16"]) == 0
    (row,) = pl.read_parquet(tmp_path / "k.parquet").to_dicts()
    assert row["reward_model"]["ground_truth"] == "silu_and_mul:bfloat16"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "__nv_bfloat16" in row["prompt"][0]["content"]


def test_an_llm_policy_over_the_openai_api_plays_an_episode(served):
    """A scripted OpenAI-compatible server as the policy: it first replays a hostile fixture
    (refused by admission), then sends an honest kernel; the second prompt carries the
    evaluator's verdict on the first."""
    import openai

    from agents.llm.scripted_server import ScriptedLLMServer

    actor, _, _ = served
    (cheat,) = [f for f in fixtures() if f.name == "wrong_signature"]
    script = [{"reply": response(cheat.source()), "usage": (10, 10)},
              {"reply": response(BASELINE + "// from the llm\n"), "usage": (10, 10)}]
    with ScriptedLLMServer(script) as llm:
        chat = openai.OpenAI(base_url=llm.base_url, api_key="test-key", max_retries=0)
        env = KernelEnv(ActorClient(actor), max_turns=2, client_id="llm-policy")
        obs, rewards = env.reset("silu_and_mul"), []
        while True:
            reply = chat.chat.completions.create(model="test-model", messages=obs["messages"]).choices[0].message.content
            step = env.step(reply or "")
            obs, rewards = step.observation, [*rewards, step.reward]
            if step.done:
                break
        second_prompt = llm.chat_requests()[1]["body"]["messages"]
    assert rewards[0] <= 0 < rewards[1]
    assert second_prompt[-1]["role"] == "user" and "COMPILE_ERROR" in second_prompt[-1]["content"]


def test_verl_loads_the_reward_function_by_its_path_from_anywhere(tmp_path):
    """verl imports ``custom_reward_function.path`` as a file, from the trainer's folder."""
    path = ROOT / "search" / "reward_verl.py"
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('custom_module', {str(path)!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(m.compute_score.__name__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "compute_score", out.stderr[-2000:]

