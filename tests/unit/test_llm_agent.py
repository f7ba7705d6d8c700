"""The LLM agent against a local scripted OpenAI-compatible server, through the real client.

Covers: a good variant, a compile error then its repair, a wrong variant (returned; the
verdict comes later), a reply without code (failed proposal), a 429 with Retry-After, a
stalled response past the client timeout, preflight failures, the tester's shapes, the
single-agent mode, cost accounting, and that the API key never reaches records or prompts.
"""

from __future__ import annotations

import json
import pickle
import socket

import pytest

from agents.base import AgentContext, Attempt
from agents.llm import LLMAgent, LLMConfig, PreflightError, UsageLedger
from agents.llm.cost import PriceTable
from agents.llm.scripted_server import ScriptedLLMServer
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status

KEY = "sk-test-secret-0123456789"

SIGNATURE = "scalar_t* out, const scalar_t* x, int num_tokens, int d"

GOOD = """\
// silu_and_mul: one thread per output element, grid-stride loop, fast exp.
// launch: grid=(min(cdiv(num_tokens * d, BLOCK), 8192),) block=(BLOCK,) smem=0
// tune: BLOCK=256,512
extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long total = (long long)num_tokens * d;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long t = i / d, j = i % d;
        const float g = static_cast<float>(x[t * 2 * d + j]);
        const float u = static_cast<float>(x[t * 2 * d + d + j]);
        out[i] = static_cast<scalar_t>(g / (1.0f + __expf(-g)) * u);
    }
}
"""
# Compiles and runs, but multiplies by the gate instead of the up projection.
WRONG = GOOD.replace("* u);", "* g);").replace("fast exp.", "fast exp (gate twice).")
# A missing semicolon: NVRTC refuses it.
BROKEN = GOOD.replace("const long long t = i / d, j = i % d;", "const long long t = i / d, j = i % d")


def fenced(source: str, before: str = "Here is the kernel.") -> str:
    return f"{before}\n```cuda\n{source}```\n"


def plan_reply(*titles: str) -> str:
    items = [{"title": t, "change": f"{t} in the main loop", "rationale": "fewer instructions"} for t in titles]
    return "Sure.\n```json\n" + json.dumps({"analysis": "memory-bound", "suggestions": items}) + "\n```"


def context(n_variants: int = 1, round_: int = 2) -> AgentContext:
    spec = load_kernel("silu_and_mul")
    base = Variant(kernel="silu_and_mul", source=spec.baseline_source(), author="baseline")
    shapes = tuple(dict(s) for s in spec.search_shapes)
    base_eval = Evaluation(
        status=Status.OK, message="", kernel="silu_and_mul", dtype="float16", variant_id=base.id,
        shapes=tuple(ShapeResult(shape=s, candidate_ms=0.01, baseline_ms=0.01, copy_bw_fraction=0.4) for s in shapes),
        registers=18,
    )
    failed = Variant(kernel="silu_and_mul", source=WRONG, parent=base.id, author="llm-multi-0",
                     note="half2 loads", round=1)
    failed_eval = Evaluation(status=Status.INCORRECT, message="out[0, 3]: expected 0.5, got 0.25")
    return AgentContext(
        kernel="silu_and_mul", description=spec.description, signature=SIGNATURE, shapes=shapes,
        dtype="float16", parent=base, parent_eval=base_eval,
        history=(Attempt(base, base_eval), Attempt(failed, failed_eval)),
        elites=(Attempt(base, base_eval),), round=round_, n_variants=n_variants, seed=0,
    )


@pytest.fixture
def env_key(monkeypatch: pytest.MonkeyPatch, compile_cache) -> str:
    """The key comes from the environment, as in production; compiles go to a private cache."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    return KEY


def make_agent(server: ScriptedLLMServer, seed: int = 0, **overrides) -> LLMAgent:
    settings = {"base_url": server.base_url, "model": "test-model", "timeout_s": 5.0,
                "max_retries": 2, "backoff_s": 0.01, "repair_turns": 2, **overrides}
    return LLMAgent(LLMConfig(**settings), seed)


def test_good_variant_is_proposed_with_call_records(env_key):
    steps = [{"reply": plan_reply("fast exp"), "usage": (900, 120)},
             {"reply": fenced(GOOD), "usage": (1500, 600)}]
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        (prop,) = make_agent(server).propose(context())
        planner_request = server.chat_requests()[0]["body"]
    assert prop.failure == ""
    assert prop.variant.source == GOOD
    assert prop.variant.parent == context().parent.id and prop.variant.round == 2
    assert prop.variant.note == "fast exp"
    assert [c["role"] for c in prop.calls] == ["planner", "coder"]
    planner, coder = prop.calls
    assert coder["plan_call_id"] == planner["call_id"]
    assert {c["proposal_id"] for c in prop.calls} == {prop.variant.meta["proposal_id"]}
    assert coder["usage"] == {"prompt_tokens": 1500, "completion_tokens": 600, "total_tokens": 2100}
    assert coder["attempts"] == 1 and coder["error"] == ""
    assert coder["messages"][-1]["role"] == "user" and "fast exp" in coder["messages"][-1]["content"]
    # The planner sees the whole lineage history, the failure's message and the profile.
    prompt = planner_request["messages"][1]["content"]
    assert "half2 loads" in prompt and "INCORRECT" in prompt and "expected 0.5" in prompt
    assert "18 registers" in prompt and "[4096, 14336]" in prompt
    assert "sm_90" in planner_request["messages"][0]["content"]


def test_compile_error_gets_the_log_back_and_is_repaired(env_key):
    steps = [{"reply": plan_reply("fast exp")}, {"reply": fenced(BROKEN)}, {"reply": fenced(GOOD)}]
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        (prop,) = make_agent(server).propose(context())
        repair_request = server.chat_requests()[2]["body"]
    assert prop.failure == "" and prop.variant.source == GOOD
    assert [c["role"] for c in prop.calls] == ["planner", "coder", "coder"]
    assert prop.variant.meta["repairs"] == 1
    roles = [m["role"] for m in repair_request["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert "expected a \";\"" in repair_request["messages"][-1]["content"]


def test_repairs_are_bounded_and_the_last_source_is_returned(env_key):
    steps = [{"reply": plan_reply("fast exp")}] + [{"reply": fenced(BROKEN)}] * 2
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        (prop,) = make_agent(server, repair_turns=1).propose(context())
        assert len(server.chat_requests()) == 3
    # The evaluator records the COMPILE_ERROR verdict; the agent does not hide the variant.
    assert prop.failure == "" and prop.variant.source == BROKEN
    assert "precheck" in prop.variant.meta


def test_wrong_variant_is_returned_for_the_evaluator_to_judge(env_key):
    steps = [{"reply": plan_reply("gate reuse")}, {"reply": fenced(WRONG)}]
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        (prop,) = make_agent(server).propose(context())
    assert prop.failure == "" and prop.variant.source == WRONG


def test_reply_without_code_is_a_failed_proposal(env_key):
    steps = [{"reply": plan_reply("fast exp")}, {"reply": "I would use __expf here, good luck."}]
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        (prop,) = make_agent(server).propose(context())
    ctx = context()
    assert "no code block" in prop.failure
    assert prop.variant.id == ctx.parent.id and prop.variant.source == ctx.parent.source
    assert len(prop.calls) == 2


def test_planner_without_suggestions_is_a_failed_proposal(env_key):
    with ScriptedLLMServer([{"reply": "   "}], api_key=KEY) as server:
        props = make_agent(server).propose(context(n_variants=3))
    assert len(props) == 1 and "planner" in props[0].failure


def test_rate_limit_waits_for_retry_after_then_succeeds(env_key):
    steps = [{"status": 429, "headers": {"Retry-After": "1"}},
             {"reply": plan_reply("fast exp")}, {"reply": fenced(GOOD)}]
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        (prop,) = make_agent(server).propose(context())
        first, second = server.chat_requests()[:2]
    assert prop.failure == ""
    assert prop.calls[0]["attempts"] == 2 and prop.calls[0]["error"] == ""
    # backoff_s is 0.01: only the server's Retry-After explains a one-second gap.
    assert second["received"] - first["received"] >= 0.9


def test_stalled_response_times_out_and_the_retry_succeeds(env_key):
    steps = [{"sleep_s": 2.0, "reply": plan_reply("late")},
             {"reply": plan_reply("fast exp")}, {"reply": fenced(GOOD)}]
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        (prop,) = make_agent(server, timeout_s=0.5).propose(context())
    assert prop.failure == "" and prop.variant.note == "fast exp"
    assert prop.calls[0]["attempts"] == 2


def test_exhausted_retries_make_a_failed_proposal(env_key):
    steps = [{"status": 503}] * 3
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        (prop,) = make_agent(server, max_retries=2).propose(context())
        assert len(server.chat_requests()) == 3
    assert "503" in prop.failure and prop.calls[0]["attempts"] == 3


def test_preflight_fails_fast_on_a_wrong_port(env_key):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = LLMAgent(LLMConfig(base_url=f"http://127.0.0.1:{port}/v1", model="test-model"), 0)
    with pytest.raises(PreflightError, match=f"cannot reach http://127.0.0.1:{port}/v1.*OPENAI_BASE_URL"):
        agent.preflight()


def test_preflight_fails_on_a_wrong_key_without_retrying(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    with ScriptedLLMServer(api_key=KEY) as server:
        with pytest.raises(PreflightError, match="refused the API key.*OPENAI_API_KEY"):
            make_agent(server).preflight()
        assert len(server.requests) == 1


def test_preflight_names_a_missing_model(env_key):
    with ScriptedLLMServer(api_key=KEY, models=["other-model"]) as server:
        with pytest.raises(PreflightError, match="test-model.*other-model"):
            make_agent(server).preflight()
        assert make_agent(server, model="other-model").preflight() == ["other-model"]


def test_tester_shapes_are_checked_against_the_spec(env_key):
    spec = load_kernel("silu_and_mul")
    proposed = [
        {"num_tokens": 3, "d": 4104},  # odd count, tail after vectorising: kept
        {"num_tokens": 7, "d": 18944},  # a held-out shape: refused
        {"num_tokens": 1, "d": 11008},  # already a search shape: refused
        {"num_tokens": 0, "d": 4096},  # not positive
        {"num_tokens": 5, "d": 4099},  # breaks the alignment every spec shape has
        {"num_tokens": 5},  # a symbol missing
        {"num_tokens": 10**7, "d": 4096},  # too large
        {"num_tokens": 3, "d": 4104},  # a repeat
        {"num_tokens": 1, "d": 256},  # kept
    ]
    steps = [{"reply": "Shapes:\n" + json.dumps({"shapes": proposed, "why": "edges"})}]
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        agent = make_agent(server)
        shapes = agent.propose_shapes(spec)
    assert shapes == [{"num_tokens": 3, "d": 4104}, {"num_tokens": 1, "d": 256}]
    assert len(agent.tester_calls[0]["rejected_shapes"]) == 7
    assert agent.usage()["kernels"]["silu_and_mul"]["calls"] == 1


def test_single_agent_mode_plans_and_codes_in_one_call(env_key):
    def responder(body):
        assert "Plan:" in body["messages"][0]["content"]
        return {"reply": "Plan: fast exp and a grid-stride loop.\n" + fenced(GOOD, before="")}

    with ScriptedLLMServer(api_key=KEY, responder=responder) as server:
        props = make_agent(server, mode="single").propose(context(n_variants=3))
        assert len(server.chat_requests()) == 3
    assert len(props) == 3 and all(p.failure == "" for p in props)
    assert props[0].variant.note.startswith("fast exp")
    assert all([c["role"] for c in p.calls] == ["single"] for p in props)
    assert len({p.variant.meta["proposal_id"] for p in props}) == 3


def test_usage_and_cost_are_summed_per_kernel_and_per_run(env_key):
    steps = [{"reply": plan_reply("a", "b"), "usage": (1000, 200)},
             {"reply": fenced(GOOD), "usage": (2000, 1000)},
             {"reply": fenced(WRONG), "usage": (2000, 1000)}]
    with ScriptedLLMServer(steps, api_key=KEY, models=["gpt-4o-mini"]) as server:
        agent = make_agent(server, model="gpt-4o-mini", concurrency=1)
        props = agent.propose(context(n_variants=2))
    calls = [c for p in props for c in p.calls]
    assert len(calls) == 3  # the shared planner call is recorded once
    totals = agent.usage()
    kernel = totals["kernels"]["silu_and_mul"]
    assert (kernel["prompt_tokens"], kernel["completion_tokens"], kernel["calls"]) == (5000, 2200, 3)
    assert kernel["cost_usd"] == pytest.approx((5000 * 0.15 + 2200 * 0.60) / 1e6)
    # The same sums from the run's llm_calls.jsonl lines, with a second kernel beside it.
    ledger = UsageLedger()
    ledger.add_all([{**c, "kernel": "silu_and_mul"} for c in calls])
    ledger.add({"usage": {"prompt_tokens": 10, "completion_tokens": 5}, "cost_usd": 0.5, "kernel": "other"})
    run = ledger.totals()
    assert run["kernels"]["silu_and_mul"]["cost_usd"] == pytest.approx(kernel["cost_usd"])
    assert run["run"]["prompt_tokens"] == 5010 and run["run"]["calls"] == 4
    assert run["run"]["cost_usd"] == pytest.approx(kernel["cost_usd"] + 0.5)


def test_prices_match_dated_models_and_take_overrides():
    table = PriceTable({"my-local": [0.0, 0.0], "gpt-4o": [1.0, 2.0]})
    assert table.price("gpt-4o-mini-2024-07-18") == (0.15, 0.60)
    assert table.price("openai/gpt-4o-2024-08-06") == (1.0, 2.0)
    assert table.price("qwen2.5-coder:32b") is None
    assert table.cost_usd("qwen2.5-coder:32b", 10**6, 10**6) == 0.0


def test_api_key_never_reaches_records_prompts_or_proposals(env_key):
    steps = [{"reply": plan_reply("fast exp")}, {"reply": fenced(GOOD)}]
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        agent = make_agent(server)
        props = agent.propose(context())
        bodies = json.dumps([r["body"] for r in server.requests])
    assert KEY not in bodies
    assert KEY.encode() not in pickle.dumps(props)
    assert KEY not in json.dumps([c for p in props for c in p.calls])
    assert KEY.encode() not in pickle.dumps(agent)  # the agent travels to Ray actors
    assert "api_key" not in LLMConfig(api_key=KEY).to_dict()
    assert KEY not in repr(LLMConfig(api_key=KEY))


def test_agent_pickles_and_works_after_unpickling(env_key):
    steps = [{"reply": plan_reply("fast exp")}, {"reply": fenced(GOOD)}] * 2
    with ScriptedLLMServer(steps, api_key=KEY) as server:
        agent = make_agent(server)
        agent.propose(context())
        clone = pickle.loads(pickle.dumps(agent))
        (prop,) = clone.propose(context())
    assert prop.failure == ""
