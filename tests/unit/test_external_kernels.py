"""Kernel folders outside the library, end to end on the CPU (local Ray, stand-in evaluator).

The kernels' names are not library names, so every process that loaded a kernel by name
would fail; and two libraries each hold a ``scale_rows`` (x2 on two shapes, x3 on three,
with one and the same ``baseline.cu``), so a run that keyed anything by name or by source
alone would give one kernel the other's records, shapes or verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.llm.scripted_server import ScriptedLLMServer
from experiments.llm_demo import role_of
from kernels.folders import KernelRef
from kernels.records import ShapeSet, read_evaluations, read_jsonl
from kernels.spec import kernel_ref, load_kernel, shape_label
from search import export, run, sweep
from search.proposal_records import read_calls
from tests.unit.kernel_folders import BASELINE, LIBRARIES, write_libraries

TOY = "tests.unit.search_toy_agent:ToyAgent"
SMALL = ["--evaluator", "standin", "--population", "2", "--rounds", "1", "--variants", "2", "--trials", "2"]


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_libraries(tmp_path_factory.mktemp("libs"))


def _run_dir(out: Path) -> Path:
    found = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    assert len(found) == 1, found
    return found[0]


def _search_labels(library: str) -> list[str]:
    return [shape_label(s) for s in LIBRARIES[library][1]]


def _check_kernel(run_dir: Path, name: str, folder: Path, library: str) -> dict[str, Any]:
    """The kernel's records, summary entry and best files are its own: its folder, its shapes."""
    summary = json.loads((run_dir / "summary.json").read_text())
    entry = next(k for k in summary["kernels"] if k["kernel"] == name)
    assert KernelRef.from_dict(entry["kernel_ref"]) == kernel_ref(folder, name)
    assert [s["label"] for s in entry["shapes"]] == _search_labels(library)
    assert entry["heldout_status"] == "OK"
    records = [r for r in read_evaluations(run_dir / "evaluations.jsonl") if r.kernel == name]
    search = [r for r in records if r.shape_set is ShapeSet.SEARCH and r.evaluation.shapes]
    assert any(r.variant.author == "baseline" and r.evaluation.extra.get("same_binary_as") is None for r in search)
    assert search and all([shape_label(s.shape) for s in r.evaluation.shapes] == _search_labels(library)
                          for r in search)
    assert (run_dir / "best" / f"{name}.cu").is_file() and (run_dir / "best" / f"{name}.json").is_file()
    return entry


def test_kernel_dir_with_the_embedded_agent_then_export(local_ray, libraries, tmp_path):
    lib_a, _ = libraries
    out = tmp_path / "runs"
    assert run.main(["--kernel-dir", str(lib_a), *SMALL, "--out", str(out)]) == 0
    run_dir = _run_dir(out)
    _check_kernel(run_dir, "scale_rows", lib_a / "scale_rows", "a")
    proposals = list(read_jsonl(run_dir / "proposals.jsonl"))
    assert proposals and all(p["variant"]["author"].startswith("embedded-") for p in proposals)
    assert {p["kernel"] for p in proposals} == {"scale_rows"}
    assert json.loads((run_dir / run.KERNELS_FILE).read_text()) == {
        "scale_rows": kernel_ref(lib_a / "scale_rows", "scale_rows").to_dict()}
    # The export reads the run alone: no kernel is loaded by name.
    assert export.main([str(run_dir), "--out", str(tmp_path / "export")]) == 0
    exported = [json.loads(line) for f in sorted((tmp_path / "export").glob("*.jsonl"))
                for line in f.read_text().splitlines()]
    assert exported and {row["kernel"] for row in exported} == {"scale_rows"}


def test_sweep_over_an_external_library_with_the_embedded_agent(local_ray, libraries, tmp_path):
    _, lib_b = libraries
    out = tmp_path / "sweeps"
    args = ["--library", str(lib_b), "--evaluator", "standin", "--population", "2", "--budget-rounds", "1",
            "--variants", "2", "--trials", "2", "--out", str(out)]
    assert sweep.main(args) == 0
    sweep_dir = next(out.glob("sweep-*"))
    meta = json.loads((sweep_dir / sweep.SWEEP_FILE).read_text())
    entry = _check_kernel(sweep_dir / meta["run_dir"], "scale_rows", lib_b / "scale_rows", "b")
    table = (sweep_dir / "sweep.md").read_text()
    assert "| scale_rows |" in table and "evaluator busy s" in table and "GPU busy" not in table
    assert entry["winner"] in table


def test_one_run_over_two_libraries_keeps_their_same_named_kernels_apart(local_ray, libraries, tmp_path):
    lib_a, lib_b = libraries
    folders = {"a": lib_a / "scale_rows", "b": lib_b / "scale_rows"}
    names = {lib: f"scale_rows@{kernel_ref(f).digest[:8]}" for lib, f in folders.items()}
    out = tmp_path / "runs"
    # The toy agent proposes the same edits to both: every variant id occurs in both kernels.
    args = ["--kernel", str(folders["a"]), "--kernel", str(folders["b"]), *SMALL, "--agent", TOY, "--out", str(out)]
    assert run.main(args) == 0
    run_dir = _run_dir(out)
    for lib, folder in folders.items():
        _check_kernel(run_dir, names[lib], folder, lib)
    # The same baseline source is one variant id in both kernels, evaluated once for each.
    baseline = [r for r in read_evaluations(run_dir / "evaluations.jsonl")
                if r.variant.source == BASELINE and r.shape_set is ShapeSet.SEARCH and r.evaluation.shapes]
    assert {r.kernel for r in baseline} == set(names.values())
    assert set(json.loads((run_dir / run.HELDOUT_SHAPES_FILE).read_text())) == set(names.values())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(k["kernel"] for k in summary["kernels"]) == sorted(names.values())
    # Killed just before its summary: the resume replays every verdict from the records, and
    # each kernel must get back its own (the two baselines' records differ only in the kernel).
    before = (run_dir / "evaluations.jsonl").read_text()
    (run_dir / "summary.json").unlink()
    assert run.main(["--resume", str(run_dir)]) == 0
    assert (run_dir / "evaluations.jsonl").read_text() == before  # nothing evaluated again
    for lib, folder in folders.items():
        _check_kernel(run_dir, names[lib], folder, lib)


def test_the_same_folder_twice_is_refused(libraries, capsys):
    lib_a, _ = libraries
    folder = str(lib_a / "scale_rows")
    assert run.main(["--kernel", folder, "--kernel", folder, "--evaluator", "standin"]) == 2
    assert "hold the same files" in capsys.readouterr().err


def _llm_config(path: Path, server: ScriptedLLMServer) -> Path:
    path.write_text(f"agent:\n  kind: llm\n  model: test-model\n  options:\n    llm:\n"
                    f"      base_url: {server.base_url}\n      api_key: {server.api_key}\n")
    return path


VARIANT = BASELINE.replace("scalar_t* out", "scalar_t* __restrict__ out").replace(
    "const scalar_t* x", "const scalar_t* __restrict__ x")


def _responder(body: dict[str, Any]) -> dict[str, Any]:
    role = role_of(body)
    replies = {
        "tester": {"shapes": [{"n": 8192}], "why": "a middle size"},
        "planner": {"analysis": "memory-bound", "suggestions": [
            {"title": "restrict pointers", "change": "mark out and x __restrict__"}]},
    }
    if role in replies:
        return {"reply": "```json\n" + json.dumps(replies[role]) + "\n```", "usage": (100, 20)}
    if role == "coder":
        return {"reply": f"```cuda\n{VARIANT}```\n", "usage": (100, 50)}
    return {"status": 500, "error": f"no reply for {role}"}


def test_the_llm_agent_on_two_libraries_same_named_kernels(local_ray, libraries, tmp_path):
    lib_a, lib_b = libraries
    folders = [lib_a / "scale_rows", lib_b / "scale_rows"]
    names = [f"scale_rows@{kernel_ref(f).digest[:8]}" for f in folders]
    out = tmp_path / "runs"
    with ScriptedLLMServer(models=["test-model"], responder=_responder) as server:
        config = _llm_config(tmp_path / "llm.yaml", server)
        args = ["--config", str(config), "--kernel", str(folders[0]), "--kernel", str(folders[1]),
                "--evaluator", "standin", "--population", "1", "--rounds", "1", "--variants", "1", "--trials", "1",
                "--out", str(out)]
        assert run.main(args) == 0
        prompts = [str(r["body"]["messages"][-1]["content"]) for r in server.chat_requests()
                   if role_of(r["body"]) in ("planner", "coder")]
    run_dir = _run_dir(out)
    # Prompts name the entry point (the spec's name), never the run's suffixed name.
    assert prompts and all("Kernel `scale_rows`" in p and "@" not in p.split("\n")[0] for p in prompts)
    assert json.loads((run_dir / run.EXTRA_SHAPES_FILE).read_text()) == {n: [{"n": 8192}] for n in names}
    calls = read_calls(run_dir / "llm_calls.jsonl")
    assert {c.kernel for c in calls if c.is_tester} == set(names)
    variant_evals = [r for r in read_evaluations(run_dir / "evaluations.jsonl") if r.variant.source == VARIANT]
    assert {r.kernel for r in variant_evals} == set(names)
    for name, folder, lib in zip(names, folders, ("a", "b"), strict=True):
        spec = load_kernel(kernel_ref(folder))
        mine = [r for r in variant_evals if r.kernel == name and r.shape_set is ShapeSet.SEARCH and r.evaluation.shapes]
        want = [shape_label(s) for s in spec.search_shapes] + ["[8192]"]
        assert mine and all([shape_label(s.shape) for s in r.evaluation.shapes] == want for r in mine), lib
