"""Record schema, torn lines after a kill, and the run configuration."""

from __future__ import annotations

import json

import pytest

from agents.base import Proposal
from kernels.records import EvalRecord, read_jsonl
from kernels.variant import Variant
from kernels.verdict import Evaluation, ShapeResult, Status
from search.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    dump_config,
    load_config,
    override,
)
from search.records import RunRecords, load_history


def _record(stage: str = "screen") -> EvalRecord:
    variant = Variant("silu_and_mul", "// launch: grid=(1,) block=(32,)\n", parent="p0", author="agent1", note="vec4")
    evaluation = Evaluation(
        Status.OK, kernel="silu_and_mul", dtype="float16", variant_id=variant.id, params={"BLOCK": 256},
        shapes=(ShapeResult({"num_tokens": 4, "d": 64}, 0.5, 1.0, bytes_moved=1536, copy_bw_fraction=0.3),),
    )
    return EvalRecord("r1", "silu_and_mul", "float16", 2, "agent1", stage, 3, variant, evaluation,
                      compile_key="abc", params={"BLOCK": 256}, time=1.5, busy_s=0.25)


def test_eval_record_round_trips_through_json():
    rec = _record()
    back = EvalRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert back == rec
    assert back.key == rec.key and back.evaluation.speedup == 2.0


def test_unknown_fields_are_tolerated():
    d = _record().to_dict()
    d["added_later"] = 1
    d["variant"]["new_field"] = "x"
    d["evaluation"]["new_metric"] = 3.0
    d["evaluation"]["shapes"][0]["new_shape_field"] = 1
    assert EvalRecord.from_dict(d).variant.note == "vec4"


def test_key_separates_stage_params_and_shape_set():
    a, b = _record("screen"), _record("full")
    assert a.key != b.key
    assert len({a.key, b.key, EvalRecord(**{**a.__dict__, "shape_set": "heldout"}).key}) == 3


def test_records_are_appended_and_a_torn_line_is_cut(tmp_path):
    records = RunRecords(tmp_path, "r1")
    records.evaluation(_record())
    variant = _record().variant
    records.proposal("silu_and_mul", "float16", 0, "agent0", Proposal(variant, "vec4", calls=({"reply": "x"},)), 0, 1)
    records.close()
    with (tmp_path / "evaluations.jsonl").open("a") as f:
        f.write('{"kernel": "silu_and_mul", "trunc')  # killed mid-write
    assert len(list(read_jsonl(tmp_path / "evaluations.jsonl"))) == 1
    records = RunRecords(tmp_path, "r1")
    records.evaluation(_record("full"))
    records.close()
    history = load_history(tmp_path)
    assert [r.stage for r in history.evaluations] == ["screen", "full"]
    calls = list(read_jsonl(tmp_path / "llm_calls.jsonl"))
    assert calls == [{"reply": "x", "variant_id": variant.id, "kernel": "silu_and_mul", "run_id": "r1"}]


def test_config_from_yaml_with_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kernels: [silu_and_mul]\nsearch:\n  population: 3\n  rounds: 7\nevaluator:\n  kind: standin\n")
    config = override(load_config(path), {"search.rounds": 2, "dtype": "bfloat16", "seed": None})
    assert (config.search.population, config.search.rounds, config.dtype) == (3, 2, "bfloat16")
    dump_config(config, tmp_path / "out.yaml")
    assert load_config(tmp_path / "out.yaml") == config


@pytest.mark.parametrize(
    "data, words",
    [
        ({"search": {"population": 0}}, "search.population"),
        ({"dtype": "float64"}, "dtype"),
        ({"agent": {"kind": "magic"}}, "agent.kind"),
        ({"evaluator": {"kind": "tpu"}}, "evaluator.kind"),
        ({"search": {"roundz": 3}}, "roundz"),
        ({"evaluator": {"compile_ahead": True, "compile_trials": 2}}, "evaluator.compile_ahead"),
    ],
)
def test_bad_config_values_are_refused(data, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        config_from_dict(data)


def test_default_config_targets_the_astra_kernels():
    assert RunConfig().kernels == ("silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse")
