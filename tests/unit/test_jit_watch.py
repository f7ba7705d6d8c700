"""What a loop notes of a peer library's on-disk builds (evaluators.jit_watch)."""

from __future__ import annotations

import os
import time

from evaluators import jit_watch


def _module(root, op, ninja):
    folder = root / "90" / "cached_ops" / op
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "build.ninja").write_text(ninja)
    (folder / f"{op}.so").write_bytes(b"\x7fELF")
    return folder


def test_the_folder_follows_the_variables_the_library_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    assert jit_watch.jit_root() == tmp_path / ".cache" / "flashinfer"
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert jit_watch.jit_root() == tmp_path / "home" / ".cache" / "flashinfer"


def test_nothing_changed_gives_nothing_and_a_missing_folder_is_empty(tmp_path):
    assert jit_watch.snapshot(tmp_path / "none") == {"root": str(tmp_path / "none"), "modules": {}, "builds": {}}
    _module(tmp_path, "norm", "cuda_cflags = -O3\n")
    before = jit_watch.snapshot(tmp_path)
    assert jit_watch.changes(before, jit_watch.snapshot(tmp_path)) == {}


def test_built_rebuilt_and_rewritten_are_told_apart(tmp_path):
    norm = _module(tmp_path, "norm", "cuda_cflags = -O3 --threads=16\nbuild norm.so: link norm.o\n")
    _module(tmp_path, "cascade", "cuda_cflags = -O3\n")
    before = jit_watch.snapshot(tmp_path)
    # norm rebuilt from a build file whose flags changed; silu_and_mul built for the first time
    (norm / "build.ninja").write_text("cuda_cflags = -O3 --threads=4\nbuild norm.so: link norm.o\n")
    later = time.time() + 5
    os.utime(norm / "norm.so", (later, later))
    _module(tmp_path, "silu_and_mul", "cuda_cflags = -O3\n")
    got = jit_watch.changes(before, jit_watch.snapshot(tmp_path))
    assert got["built"] == ["90/cached_ops/silu_and_mul/silu_and_mul.so"]
    assert got["rebuilt"] == ["90/cached_ops/norm/norm.so"]
    assert got["rewritten"] == {"90/cached_ops/norm/build.ninja":
                                "-cuda_cflags = -O3 --threads=16\n+cuda_cflags = -O3 --threads=4"}


def test_the_environment_names_what_the_build_files_depend_on(monkeypatch):
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-to-be-copied")
    env = jit_watch.environment()
    assert env["env"]["CUDA_HOME"] == "/usr/local/cuda" and env["cpu_count"] == os.cpu_count()
    assert "OPENAI_API_KEY" not in env["env"]  # an allow-list: nothing else of the environment


def test_the_workspace_flashinfer_chose_is_named_once_it_is_imported(monkeypatch):
    import sys
    import types

    assert "workspace" not in jit_watch.environment() or "flashinfer.jit.env" in sys.modules
    fake = types.ModuleType("flashinfer.jit.env")
    fake.FLASHINFER_WORKSPACE_DIR = "/root/.cache/flashinfer/90"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer.jit.env", fake)
    assert jit_watch.environment()["workspace"] == "/root/.cache/flashinfer/90"


def _ninja_module(root, op):
    """A module folder as FlashInfer lays it out, built by a real ninja from one source."""
    import shutil

    if shutil.which("ninja") is None:
        import pytest

        pytest.skip("needs ninja")
    ops = root / "90" / "cached_ops"
    folder = ops / op
    folder.mkdir(parents=True)
    (folder / "src.txt").write_text("source\n")
    (folder / "build.ninja").write_text(
        f"rule copy\n  command = cp $in $out\nbuild {op}/{op}.so: copy {folder / 'src.txt'}\ndefault {op}/{op}.so\n")
    return ops, folder


def test_a_module_built_and_up_to_date_is_not_dirty_and_one_with_a_newer_source_is(tmp_path):
    import subprocess

    ops, folder = _ninja_module(tmp_path, "norm")
    subprocess.run(["ninja", "-C", str(ops), "-f", str(folder / "build.ninja")], check=True, capture_output=True)
    module = "90/cached_ops/norm/norm.so"
    assert jit_watch.still_dirty(tmp_path, [module]) == {module: []}
    later = time.time() + 10
    os.utime(folder / "src.txt", (later, later))
    why = jit_watch.still_dirty(tmp_path, [module])[module]
    assert why and all(line.startswith("ninja explain:") for line in why)
    assert (folder / "norm.so").exists()  # a dry run: nothing was built


def test_the_report_names_modules_that_would_be_built_again(tmp_path):
    import subprocess

    before = jit_watch.snapshot(tmp_path)
    ops, folder = _ninja_module(tmp_path, "cascade")
    subprocess.run(["ninja", "-C", str(ops), "-f", str(folder / "build.ninja")], check=True, capture_output=True)
    got = jit_watch.report(before)
    assert got["built"] == ["90/cached_ops/cascade/cascade.so"] and "still_dirty" not in got
    later = time.time() + 10
    os.utime(folder / "src.txt", (later, later))
    assert list(jit_watch.report(before)["still_dirty"]) == ["90/cached_ops/cascade/cascade.so"]
