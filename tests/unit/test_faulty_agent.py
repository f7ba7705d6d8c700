"""The fault-injecting agent takes its hostile corpus only from an index it is given, and a
stand-in search run with it is accounted for by experiments.integrity and search.export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from agents.factory import AgentConfigError, make_agent
from agents.faulty import FaultInjectingAgent, load_hostile_fixtures
from experiments import integrity
from search.config import AgentConfig
from search.export import export_run

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "tests" / "adversarial" / "fixtures.yaml"
KIND = "agents.faulty:FaultInjectingAgent"
TOY = "tests.unit.search_toy_agent:ToyAgent"


def _config(**options: object) -> AgentConfig:
    return AgentConfig(kind=KIND, options={"inner": TOY, **options})


def test_the_fixtures_index_is_required_and_named_in_the_error():
    with pytest.raises(AgentConfigError, match="agent.options.fixtures is required"):
        make_agent(KIND, _config(), 0)


@pytest.mark.parametrize("content, match", [
    (None, "is not a file"),
    ("fixtures: [", "not valid YAML"),
    ("other: 1\n", "no 'fixtures' list"),
    ("fixtures:\n  - {file: a.cu, kernel: silu_and_mul, status: FINE}\n", "no valid status"),
])
def test_a_bad_index_is_a_config_error(tmp_path: Path, content: str | None, match: str):
    index = tmp_path / "index.yaml"
    if content is not None:
        index.write_text(content)
    with pytest.raises(AgentConfigError, match=match):
        make_agent(KIND, _config(fixtures=str(index)), 0)


def test_hostile_fixtures_come_from_the_given_index_only(tmp_path: Path):
    (tmp_path / "hang.cu").write_text("// hang\n")
    (tmp_path / "honest.cu").write_text("// honest\n")
    (tmp_path / "loop_cheat.cu").write_text("// cheats only where the evaluator does not look\n")
    index = tmp_path / "index.yaml"
    index.write_text("fixtures:\n"
                     "  - {file: hang.cu, kernel: silu_and_mul, status: TIMEOUT, trick: spins}\n"
                     "  - {file: honest.cu, kernel: silu_and_mul, status: OK, trick: 'none; plain'}\n"
                     "  - {file: loop_cheat.cu, kernel: silu_and_mul, status: OK, trick: skips rows later}\n")
    fixtures = load_hostile_fixtures(index)
    # Honest kernels stay out; a cheat that the evaluator alone judges OK is still hostile.
    assert [fx["file"] for fx in fixtures["silu_and_mul"]] == ["hang.cu", "loop_cheat.cu"]
    assert fixtures["silu_and_mul"][0]["source"] == "// hang\n"
    agent = make_agent(KIND, _config(fixtures=str(index), fault_fraction=1.0), 3)
    assert isinstance(agent, FaultInjectingAgent) and agent.fixtures == fixtures


def test_the_integrity_config_names_the_index_explicitly():
    import yaml

    config = yaml.safe_load((ROOT / "experiments" / "configs" / "integrity.yaml").read_text())
    assert config["agent"]["kind"] == KIND
    assert (ROOT / config["agent"]["options"]["fixtures"]).resolve() == INDEX.resolve()


@pytest.mark.slow
def test_a_standin_run_with_hostile_proposals_is_fully_accounted(tmp_path: Path):
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "search.run", "--config", "experiments/configs/integrity.yaml",
           "--kernel", "silu_and_mul", "--evaluator", "standin", "--rounds", "1", "--population", "2",
           "--variants", "2", "--trials", "1", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    account = integrity.account_run(run_dir)
    assert account["completed"] and account["proposals"] == 4 and not account["proposals_without_verdict"]
    assert account["injected"] >= 1  # a quarter on average: seeded, so this run has at least one
    assert sum(account["injected_verdicts"].values()) == account["injected"]
    assert sum(account["evaluations_by_status"].values()) == account["evaluations"] > 0
    paths = export_run(run_dir, "parquet")
    samples = pl.read_parquet(paths["samples"])
    assert samples.height == 4 and samples["synthetic"].all()  # a stand-in run: every reward synthetic
    injected = samples.filter(pl.col("transformation").str.starts_with("injected:"))
    assert injected.height == account["injected"]
    json.dumps(account)  # the results file is JSON
