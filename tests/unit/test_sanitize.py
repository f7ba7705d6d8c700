"""evaluators.sanitize on the CPU: parsing of compute-sanitizer output (captured texts), the
report when compute-sanitizer is missing, and the launcher up to the point a GPU is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evaluators.sanitize import (
    BASE_TIMEOUT_S,
    LAUNCH_MARK,
    LAUNCHER_DONE,
    LAUNCHES_PER_SHAPE,
    PER_SHAPE_TIMEOUT_S,
    SanitizerReport,
    SanitizerStatus,
    ToolReport,
    find_compute_sanitizer,
    parse_output,
    plan_shapes,
    sanitize,
    smallest_shape,
    tool_timeout_s,
)
from kernels import gated
from kernels.spec import load_kernel, shape_label

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "adversarial"

MEMCHECK_OOB = """\
========= COMPUTE-SANITIZER
sanitize-launcher: fused_add_rmsnorm shape {'num_tokens': 1, 'hidden': 4096} params {'BLOCK': 512} grid (1, 1, 1) block (512, 1, 1) smem 0
========= Invalid __global__ read of size 16 bytes
=========     at fused_add_rmsnorm+0x4a0
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f3a2e002000 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3a2e000000 of size 8,192 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f2d4f] in libcuda.so.1
=========
========= Invalid __global__ read of size 16 bytes
=========     at fused_add_rmsnorm+0x4a0
=========     by thread (1,0,0) in block (0,0,0)
=========     Address 0x7f3a2e002000 is out of bounds
=========
sanitize-launcher: launch failed: RuntimeError: CUDA error: unspecified launch failure
========= Target application returned an error
========= ERROR SUMMARY: 2 errors
"""
MEMCHECK_CLEAN = f"""\
========= COMPUTE-SANITIZER
sanitize-launcher: silu_and_mul shape {{'num_tokens': 1, 'd': 11008}} params {{'BLOCK': 256}} grid (6, 1, 1) block (256, 1, 1) smem 0
{LAUNCHER_DONE}
========= ERROR SUMMARY: 0 errors
"""
RACECHECK_HAZARD = f"""\
========= COMPUTE-SANITIZER
sanitize-launcher: fused_add_rmsnorm shape {{'num_tokens': 1, 'hidden': 4096}} params {{}} grid (1, 1, 1) block (256, 1, 1) smem 0
========= Error: Race reported between Write access at fused_add_rmsnorm+0x2f0
=========     and Read access at fused_add_rmsnorm+0x330 [248 hazards]
=========
{LAUNCHER_DONE}
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
RACECHECK_WARNING = f"""\
========= COMPUTE-SANITIZER
========= Warning: Race reported between Read access at merge_attn_states_lse+0x120
=========     and Write access at merge_attn_states_lse+0x160 [32 hazards]
{LAUNCHER_DONE}
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
"""


def test_memcheck_out_of_bounds_read_is_reported_with_where():
    report = parse_output("memcheck", MEMCHECK_OOB)
    assert report.status is SanitizerStatus.FINDINGS
    assert report.errors == 2
    assert report.findings[0] == "Invalid __global__ read of size 16 bytes at fused_add_rmsnorm+0x4a0"
    assert len(report.findings) == 2  # banners, summaries and detail lines are not findings


def test_memcheck_clean_run():
    report = parse_output("memcheck", MEMCHECK_CLEAN)
    assert report.status is SanitizerStatus.CLEAN
    assert report.errors == 0 and report.findings == ()


def test_racecheck_hazard_is_reported_with_both_accesses():
    report = parse_output("racecheck", RACECHECK_HAZARD)
    assert report.status is SanitizerStatus.FINDINGS
    assert report.errors == 1
    assert report.findings == (
        "Error: Race reported between Write access at fused_add_rmsnorm+0x2f0 "
        "and Read access at fused_add_rmsnorm+0x330 [248 hazards]",
    )


def test_racecheck_warnings_alone_are_kept_but_not_errors():
    report = parse_output("racecheck", RACECHECK_WARNING)
    assert report.status is SanitizerStatus.CLEAN
    assert report.warnings == 1 and report.errors == 0
    assert report.findings[0].startswith("Warning: Race reported between Read access")


def test_output_without_a_summary_is_a_failed_run():
    text = "========= COMPUTE-SANITIZER\nTraceback (most recent call last):\nImportError: no torch\n"
    report = parse_output("memcheck", text)
    assert report.status is SanitizerStatus.FAILED
    assert "no summary" in report.message
    assert "ImportError" in report.output_tail


def test_zero_errors_without_a_finished_launch_is_not_clean():
    text = "========= COMPUTE-SANITIZER\nsanitize-launcher: compile error:\nvariant.cu(3): error\n========= ERROR SUMMARY: 0 errors\n"
    report = parse_output("memcheck", text)
    assert report.status is SanitizerStatus.FAILED
    assert "did not finish" in report.message


def test_report_status_is_the_worst_tool_status():
    clean = ToolReport("memcheck", SanitizerStatus.CLEAN)
    found = ToolReport("racecheck", SanitizerStatus.FINDINGS, errors=3, findings=("Error: Race reported",))
    report = SanitizerReport("fused_add_rmsnorm", "float16", (clean, found))
    assert report.status is SanitizerStatus.FINDINGS and not report.clean
    assert report.tool("racecheck").errors == 3
    assert "racecheck FINDINGS (3 errors): Error: Race reported" in report.summary()
    assert SanitizerReport("k", "float16", (clean,)).clean
    assert not SanitizerReport("k", "float16", ()).clean
    with pytest.raises(KeyError):
        report.tool("initcheck")
    assert json.loads(json.dumps(report.to_dict()))["status"] == "FINDINGS"


def test_missing_compute_sanitizer_gives_an_unavailable_report(tmp_path):
    source = (FIXTURES / "honest_silu_vectorized.cu").read_text()
    report = sanitize("silu_and_mul", source, executable=str(tmp_path / "compute-sanitizer"))
    assert report.status is SanitizerStatus.UNAVAILABLE
    assert [t.tool for t in report.tools] == ["memcheck", "racecheck", "synccheck"]
    assert all(t.status is SanitizerStatus.UNAVAILABLE for t in report.tools)
    assert "not found" in report.message and not report.clean


def test_unknown_tool_is_refused():
    with pytest.raises(ValueError, match="initcheck"):
        sanitize("silu_and_mul", "", tools=("initcheck",))


def test_find_compute_sanitizer_in_given_folders(tmp_path):
    empty, cuda_bin = tmp_path / "empty", tmp_path / "bin"
    empty.mkdir()
    cuda_bin.mkdir()
    assert find_compute_sanitizer([empty]) is None
    exe = cuda_bin / "compute-sanitizer"
    exe.write_text("#!/bin/sh\n")
    assert find_compute_sanitizer([empty, cuda_bin]) is None  # not executable
    exe.chmod(0o755)
    assert find_compute_sanitizer([empty, cuda_bin]) == str(exe)


def test_smallest_shape_is_taken_from_search_and_heldout_shapes():
    assert smallest_shape(load_kernel("silu_and_mul")) == {"num_tokens": 1, "d": 11000}  # held-out tail
    assert smallest_shape(load_kernel("merge_attn_states_lse")) == {"num_tokens": 1, "num_heads": 3, "head_dim": 40}


def test_plan_covers_every_shape_and_the_extremes_and_skips_huge_ones():
    spec = load_kernel("silu_and_mul")
    drawn = spec.draw_heldout(5)
    plan = plan_shapes(spec, drawn)
    every_key = {tuple(sorted(s.items())) for s in plan.every}
    for shape in (*spec.search_shapes, *spec.heldout_shapes, *drawn):
        key = tuple(sorted(shape.items()))
        assert (key in every_key) != spec.is_huge(shape), shape
    assert plan.skipped == (gated.HUGE_SHAPE,)
    sizes = [spec.largest_tensor_elements(s) for s in plan.every]
    assert sizes == sorted(sizes) and len(set(map(str, plan.every))) == len(plan.every)
    assert plan.extremes == (plan.every[0], plan.every[-1])
    assert plan.for_tool("memcheck") == plan.every
    assert plan.for_tool("racecheck") == plan.for_tool("synccheck") == plan.extremes
    assert plan_shapes(spec, include_huge=True).every[-1] == gated.HUGE_SHAPE


def test_tool_timeout_grows_with_the_shapes_and_launches():
    assert tool_timeout_s(2) < tool_timeout_s(14) < tool_timeout_s(14, launches=6)
    assert tool_timeout_s(14) == BASE_TIMEOUT_S + 14 * PER_SHAPE_TIMEOUT_S


def test_findings_name_the_shape_and_launch_they_followed():
    text = f"""\
========= COMPUTE-SANITIZER
{LAUNCH_MARK} shape [1, 11008] launch 1/3
{LAUNCH_MARK} shape [129, 1352] launch 1/3
{LAUNCH_MARK} shape [129, 1352] launch 2/3
========= Invalid __global__ write of size 2 bytes
=========     at silu_and_mul+0x1f0
=========
sanitize-launcher: launch failed: RuntimeError: CUDA error: unspecified launch failure
========= ERROR SUMMARY: 1 error
"""
    report = parse_output("memcheck", text)
    assert report.status is SanitizerStatus.FINDINGS
    assert report.findings == ("[shape [129, 1352] launch 2/3] Invalid __global__ write of size 2 bytes at silu_and_mul+0x1f0",)


FAKE_SANITIZER = """#!{python}
# Stands in for compute-sanitizer: records the tool and the shapes the launcher was given.
import json, sys
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
shapes = json.load(open(args[args.index("--shapes-file") + 1]))
launches = int(args[args.index("--launches") + 1])
with open({log!r}, "a") as f:
    f.write(json.dumps({{"tool": tool, "shapes": shapes, "launches": launches}}) + "\\n")
for s in shapes:
    for k in range(launches):
        print("{mark} shape", list(s.values()), "launch", k + 1)
print("{done}")
print("========= ERROR SUMMARY: 0 errors")
"""


def test_sanitize_gives_each_tool_its_shapes_and_launches(tmp_path):
    log = tmp_path / "calls.jsonl"
    exe = tmp_path / "compute-sanitizer"
    exe.write_text(FAKE_SANITIZER.format(python=sys.executable, log=str(log), mark=LAUNCH_MARK, done=LAUNCHER_DONE))
    exe.chmod(0o755)
    spec = load_kernel("silu_and_mul")
    drawn = spec.draw_heldout(11)
    source = (FIXTURES / "honest_silu_vectorized.cu").read_text()
    report = sanitize("silu_and_mul", source, executable=str(exe), shapes=drawn)
    assert report.clean, report.summary()
    calls = {c["tool"]: c for c in map(json.loads, log.read_text().splitlines())}
    plan = plan_shapes(spec, drawn)
    assert calls["memcheck"]["shapes"] == [dict(s) for s in plan.every]
    assert all(d in calls["memcheck"]["shapes"] for d in drawn)
    assert calls["racecheck"]["shapes"] == calls["synccheck"]["shapes"] == [dict(s) for s in plan.extremes]
    assert {c["launches"] for c in calls.values()} == {LAUNCHES_PER_SHAPE}
    assert report.tool("memcheck").shapes == tuple(shape_label(s) for s in plan.every)
    assert report.skipped_shapes == (shape_label(gated.HUGE_SHAPE),) and "2^31" in report.message
    one = sanitize("silu_and_mul", source, executable=str(exe), tools=("memcheck",), shape={"num_tokens": 3, "d": 64})
    assert one.tool("memcheck").shapes == ("[3, 64]",)


def _launcher(fixture: str, kernel: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KERNEL_SEARCH_CACHE=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "evaluators.sanitize", "--kernel", kernel, str(FIXTURES / fixture), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_launcher_compiles_then_needs_a_gpu(tmp_path):
    import torch

    run = _launcher("honest_silu_vectorized.cu", "silu_and_mul", tmp_path, "--dtype", "bfloat16",
                    "--shape", "num_tokens=4,d=1024", "--param", "BLOCK=128")
    if torch.cuda.is_available():
        assert run.returncode == 0, run.stdout + run.stderr
        assert LAUNCHER_DONE in run.stdout and "'BLOCK': 128" in run.stdout
    else:
        assert run.returncode == 3, run.stdout + run.stderr
        assert "needs a CUDA GPU" in run.stdout


def test_launcher_takes_a_list_of_shapes_and_launch_count(tmp_path):
    import torch

    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps([{"num_tokens": 1, "d": 8}, {"num_tokens": 7, "d": 1352}]))
    run = _launcher("honest_silu_vectorized.cu", "silu_and_mul", tmp_path, "--shapes-file", str(shapes),
                    "--launches", "2")
    if torch.cuda.is_available():
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.count(LAUNCH_MARK) == 4 and "shape [7, 1352] launch 2/2" in run.stdout
    else:
        assert run.returncode == 3, run.stdout + run.stderr


def test_launcher_refuses_a_shape_beyond_the_promised_alignment(tmp_path):
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps([{"num_tokens": 1, "d": 12}]))
    run = _launcher("honest_silu_vectorized.cu", "silu_and_mul", tmp_path, "--shapes-file", str(shapes))
    assert run.returncode == 2 and "multiple of 8" in run.stdout


def test_launcher_reports_compile_errors_and_refusals(tmp_path):
    run = _launcher("undeclared_identifier.cu", "silu_and_mul", tmp_path)
    assert run.returncode == 2
    assert 'identifier "silu" is undefined' in run.stdout
    run = _launcher("wrong_signature.cu", "silu_and_mul", tmp_path)
    assert run.returncode == 2
    assert "refused" in run.stdout and "arguments" in run.stdout
