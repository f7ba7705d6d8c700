"""Conformance: what every Agent and every Evaluator implementation must do (in the manner of
Optuna's ``BasicSamplerTestCase``), parametrized over the implementations.

Agents (embedded, LLM against the local scripted server, fault-injecting, the tests' toy):
propose returns at most ``n_variants`` proposals, each a variant of ``ctx.kernel`` derived
from the parent with an author, or a failure with a reason; agents and proposals pickle; the
same context gives the same proposals (from a fresh agent, and from the same agent asked
again, as a resumed run asks); observe accepts attempts.

Evaluators (stand-in; GPU marked): a compile error, a launch beyond the device's limits and a
correct variant each come back as an Evaluation with the right status (never an exception);
``evaluate(request, artifact)`` gives the verdict ``evaluate(request)`` gives; the verdict
names the request's kernel, dtype, variant, parameters and shape set.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.base import Agent, AgentContext, Attempt, Proposal
from agents.llm.scripted_server import ScriptedLLMServer
from evaluators.admit import Artifact, admit
from evaluators.api import EvalRequest, Evaluator, TimingConfig
from kernels.spec import load_kernel
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status

REPO = Path(__file__).resolve().parents[2]
KERNEL = "silu_and_mul"
KEY = "sk-conformance-0123456789"


def _context(n_variants: int = 3, round_: int = 1, seed: int = 11) -> AgentContext:
    spec = load_kernel(KERNEL)
    base = Variant(KERNEL, spec.baseline_source(), author="baseline")
    shapes = tuple(dict(s) for s in spec.search_shapes)
    base_eval = Evaluation(Status.OK, kernel=KERNEL, dtype="float16", variant_id=base.id, shapes=tuple(
        ShapeResult(shape=s, candidate_ms=0.01, baseline_ms=0.01, copy_bw_fraction=0.4) for s in shapes))
    return AgentContext(kernel=KERNEL, description=spec.description,
                        signature=", ".join(f"{a.name}:{a.kind}" for a in spec.args), shapes=shapes,
                        dtype="float16", parent=base, parent_eval=base_eval, history=(Attempt(base, base_eval),),
                        elites=(Attempt(base, base_eval),), round=round_, n_variants=n_variants, seed=seed)


def _llm_reply(body: dict[str, Any]) -> dict[str, Any]:
    """Single-agent mode: every request gets the same correct kernel (a tunable block)."""
    source = load_kernel(KERNEL).baseline_source().replace("block=(256,)", "block=(BLOCK,)").replace(
        "// launch:", "// tune: BLOCK=256,128\n// launch:", 1)
    return {"reply": f"Plan: a tunable block.\n```cuda\n{source}```\n"}


def _embedded(seed: int) -> Agent:
    from agents.embedded import EmbeddedAgent

    return EmbeddedAgent(seed=seed)


def _toy(seed: int) -> Agent:
    from tests.unit.search_toy_agent import ToyAgent

    return ToyAgent(None, seed)


def _faulty(seed: int) -> Agent:
    from agents.faulty import FaultInjectingAgent
    from search.config import AgentConfig

    options = {"fixtures": str(REPO / "tests" / "adversarial" / "fixtures.yaml"), "fault_fraction": 0.5}
    return FaultInjectingAgent(AgentConfig(kind="agents.faulty:FaultInjectingAgent", options=options), seed)


@pytest.fixture
def llm_server(monkeypatch: pytest.MonkeyPatch, compile_cache: Path) -> Iterator[ScriptedLLMServer]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ScriptedLLMServer(api_key=KEY, responder=_llm_reply) as server:
        yield server


def _maker(name: str, request: pytest.FixtureRequest) -> Callable[[int], Agent]:
    if name != "llm":
        return {"embedded": _embedded, "toy": _toy, "faulty": _faulty}[name]
    server = request.getfixturevalue("llm_server")

    def make(seed: int) -> Agent:
        from agents.llm import LLMAgent
        from agents.llm.config import LLMConfig

        return LLMAgent(LLMConfig(base_url=server.base_url, model="test-model", timeout_s=5.0, max_retries=1,
                                  backoff_s=0.01, mode="single"), seed)

    return make


def _signature(proposals: list[Proposal]) -> list[tuple[str, str, bool]]:
    """What must repeat for the same context: each proposal's source, transformation, failure."""
    return [(p.variant.source, p.transformation, bool(p.failure)) for p in proposals]


AGENTS = ["embedded", "llm", "faulty", "toy"]


@pytest.mark.parametrize("name", AGENTS)
def test_agent_proposals_are_well_formed(name, request, compile_cache):
    agent = _maker(name, request)(3)
    ctx = _context()
    proposals = list(agent.propose(ctx))
    assert 0 < len(proposals) <= ctx.n_variants
    for p in proposals:
        assert isinstance(p, Proposal) and isinstance(p.variant, Variant)
        if p.failure:
            assert p.failure.strip(), "a failure says why"
            continue
        assert (p.variant.kernel or ctx.kernel) == ctx.kernel
        assert p.variant.parent == ctx.parent.id, "a proposal names the variant it came from"
        assert p.variant.author, "a proposal names its author"
        assert p.variant.source != ctx.parent.source
    pickle.loads(pickle.dumps(agent))
    pickle.loads(pickle.dumps(proposals))
    agent.observe([Attempt(p.variant, Evaluation(Status.INCORRECT, message="mismatch")) for p in proposals])
    agent.observe([])


@pytest.mark.parametrize("name", AGENTS)
def test_agent_is_deterministic_for_the_same_context(name, request, compile_cache):
    make = _maker(name, request)
    for seed in (1, 2, 5):
        ctx = _context(seed=seed * 7)
        first = list(make(seed).propose(ctx))
        assert _signature(list(make(seed).propose(ctx))) == _signature(first), "a fresh agent with the same seed"
        again = make(seed)
        for earlier in range(3):  # earlier requests must not change the next answer
            again.propose(_context(round_=0, seed=100 + earlier))
        assert _signature(list(again.propose(ctx))) == _signature(first), "the same agent asked again"


# -- evaluators ------------------------------------------------------------------------------

TUNED = load_kernel(KERNEL).baseline_source().replace("block=(256,)", "block=(BLOCK,)").replace(
    "// launch:", "// tune: BLOCK=256,128\n// launch:", 1)
CASES = {
    "ok": (TUNED, {"BLOCK": 128}, Status.OK),
    "compile-error": (TUNED.replace("{", "{ this does not compile;", 1), {"BLOCK": 128}, Status.COMPILE_ERROR),
    "launch-refused": (TUNED.replace("// tune: BLOCK=256,128", "// tune: BLOCK=2048"), {"BLOCK": 2048},
                       Status.RESOURCE_ERROR),
}


def _standin() -> Evaluator:
    from evaluators.standin import StandinEvaluator

    return StandinEvaluator()


def _gpu() -> Evaluator:
    from evaluators.gpu import GpuEvaluator

    return GpuEvaluator(device=0)


EVALUATORS = [pytest.param(_standin, id="standin"), pytest.param(_gpu, id="gpu", marks=pytest.mark.gpu)]


@pytest.fixture
def evaluator(request: pytest.FixtureRequest, compile_cache: Path) -> Iterator[Evaluator]:
    ev = request.param()
    try:
        yield ev
    finally:
        ev.close()


def _request(case: str, shape_set: str = "search") -> EvalRequest:
    source, params, _ = CASES[case]
    return EvalRequest(KERNEL, Variant(KERNEL, source), params=dict(params), dtype="float16", shape_set=shape_set,
                       timing=TimingConfig(2, 5, 0.0), seeds=(0,))


@pytest.mark.parametrize("evaluator", EVALUATORS, indirect=True)
@pytest.mark.parametrize("case", list(CASES))
def test_evaluator_answers_every_case_with_a_verdict(evaluator, case):
    request = _request(case)
    verdict = evaluator.evaluate(request)
    assert isinstance(verdict, Evaluation)
    assert verdict.status is CASES[case][2], verdict.message
    assert (verdict.kernel, verdict.dtype, verdict.variant_id) == (KERNEL, "float16", request.variant.id)
    assert verdict.params == request.params and verdict.shape_set == request.shape_set
    if verdict.status.is_ok:
        assert len(verdict.shapes) == len(request.shapes(load_kernel(KERNEL))) and verdict.speedup is not None
    else:
        assert verdict.message.strip(), "a failed verdict says why"


@pytest.mark.parametrize("evaluator", EVALUATORS, indirect=True)
@pytest.mark.parametrize("shape_set", ["search", "heldout"])
def test_evaluator_gives_the_same_verdict_with_the_admitted_artifact(evaluator, shape_set):
    request = _request("ok", shape_set)
    spec = load_kernel(KERNEL)
    artifact = admit(spec, request.variant.source, request.dtype, request.params, shapes=request.shapes(spec))
    assert isinstance(artifact, Artifact)
    with_artifact, without = evaluator.evaluate(request, artifact), evaluator.evaluate(request)
    for verdict in (with_artifact, without):
        assert verdict.status is Status.OK, verdict.message
        assert (verdict.kernel, verdict.dtype, verdict.variant_id, verdict.params, verdict.shape_set) == (
            KERNEL, "float16", request.variant.id, request.params, shape_set)
    assert [s.shape for s in with_artifact.shapes] == [s.shape for s in without.shapes]
