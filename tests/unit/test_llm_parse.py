"""Parsing model replies and validating the ``llm`` config."""

from __future__ import annotations

import pytest

from agents.llm import LLMConfig, LLMConfigError, RoleConfig
from agents.llm.agent import coerce_config
from agents.llm.parse import extract_code, extract_json, parse_shapes, parse_suggestions

KERNEL = 'extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {}'


def test_code_prefers_the_last_block_that_defines_the_entry():
    reply = (f"<think>```cuda\n// draft\n{KERNEL}\n```</think>First a helper:\n```cpp\n__device__ float f();\n```\n"
             f"Old:\n```cuda\n// old\n{KERNEL}\n```\nFinal:\n```cuda\n// launch: grid=(1,) block=(1,)\n{KERNEL}\n```")
    code = extract_code(reply, "silu_and_mul")
    assert code is not None and code.startswith("// launch:") and "draft" not in code


def test_code_from_an_unterminated_fence_and_from_unfenced_text():
    assert "// v" in (extract_code(f"```cuda\n// v\n{KERNEL}\n", "silu_and_mul") or "")
    assert (extract_code(f"Here you go.\n// launch: grid=(1,) block=(1,)\n{KERNEL}", "silu_and_mul") or "").startswith("// launch")


def test_no_code_in_prose_or_in_a_json_block():
    assert extract_code("Use __expf and half2 loads.", "silu_and_mul") is None
    assert extract_code('```json\n{"a": 1}\n```', "silu_and_mul") is None


def test_json_inside_prose_with_trailing_commas():
    assert extract_json('Plan below.\n{"suggestions": [{"title": "x",},],}\nDone.') == {"suggestions": [{"title": "x"}]}
    assert extract_json("no json at all") is None


def test_suggestions_from_json_with_other_keys_and_from_bullets():
    got = parse_suggestions('```json\n{"plans": [{"name": "vectorize", "description": "half2"}, "unroll"]}\n```')
    assert [s["title"] for s in got] == ["vectorize", "unroll"] and got[0]["change"] == "half2"
    bullets = parse_suggestions("Ideas:\n1. hoist the row pointer\n2) use __expf\n- fewer blocks", limit=2)
    assert [s["title"] for s in bullets] == ["hoist the row pointer", "use __expf"]


def test_shapes_from_object_or_list():
    assert parse_shapes('{"shapes": [{"d": 8}, 3]}') == [{"d": 8}]
    assert parse_shapes('[{"d": 8}]') == [{"d": 8}]
    assert parse_shapes("none") == []


def test_config_roles_fall_back_to_the_defaults():
    cfg = LLMConfig.from_dict({"model": "m", "roles": {"coder": {"model": "big", "temperature": 0.2}}})
    assert cfg.role("coder") == RoleConfig(model="big", temperature=0.2)
    assert cfg.role("planner").model == "m"


def test_config_reads_the_endpoint_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:8000/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    cfg = LLMConfig()
    assert cfg.base_url == "http://localhost:8000/v1" and cfg.resolved_api_key() == "sk-env"
    assert "sk-env" not in str(cfg.to_dict())


@pytest.mark.parametrize("bad", [{"mode": "swarm"}, {"roles": {"critic": {}}}, {"concurrency": 0},
                                 {"base_url": "localhost:8000"}, {"roles": {"coder": {"reasoning_effort": "max"}}},
                                 {"temprature": 0.5}])
def test_config_refuses_bad_values(bad):
    with pytest.raises(LLMConfigError):
        LLMConfig.from_dict(bad)


def test_agent_section_of_a_run_config_is_accepted():
    class Section:
        model = "gpt-4.1"
        options = {"llm": {"mode": "single", "repair_turns": 1}}

    cfg = coerce_config(Section())
    assert (cfg.model, cfg.mode, cfg.repair_turns) == ("gpt-4.1", "single", 1)
