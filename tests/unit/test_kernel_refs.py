"""Kernel references: folder digests, resolving a folder on any machine, and loading two
libraries' kernels of one name in one process without mixing them up."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from kernels.folders import KERNEL_ROOT_VAR, KernelRef, folder_digest, resolve_folder
from kernels.spec import KernelSpecError, kernel_ref, load_kernel
from tests.unit.kernel_folders import write_libraries, write_scale_rows


def test_the_digest_follows_the_files_not_the_place(tmp_path: Path) -> None:
    one = write_scale_rows(tmp_path / "one" / "scale_rows", "a")
    two = shutil.copytree(one, tmp_path / "elsewhere" / "renamed")
    assert folder_digest(one) == folder_digest(two)
    assert len(folder_digest(one)) == 16 and int(folder_digest(one), 16) >= 0
    (two / "__pycache__").mkdir()
    (two / "__pycache__" / "spec.cpython-311.pyc").write_bytes(b"\0compiled")
    (two / "stale.pyc").write_bytes(b"\0")
    assert folder_digest(one) == folder_digest(two)  # bytecode caches are not the kernel
    (two / "notes.txt").write_text("x")
    assert folder_digest(one) != folder_digest(two)
    (two / "notes.txt").unlink()
    (two / "baseline.cu").write_text((two / "baseline.cu").read_text() + " ")
    assert folder_digest(one) != folder_digest(two)


def test_a_file_moved_between_names_changes_the_digest(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "ab").write_text("c")
    (second / "a").write_text("bc")
    assert folder_digest(first) != folder_digest(second)


def test_resolve_folder_takes_the_path_then_the_staged_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_scale_rows(tmp_path / "lib" / "scale_rows", "a")
    digest = folder_digest(folder)
    monkeypatch.delenv(KERNEL_ROOT_VAR, raising=False)
    assert resolve_folder(str(folder), digest) == folder
    gone = str(tmp_path / "not-on-this-machine" / "scale_rows")
    with pytest.raises(KernelSpecError, match=f"kernel folder {gone} with digest {digest}.*{KERNEL_ROOT_VAR}") as err:
        resolve_folder(gone, digest)
    assert "\n" not in str(err.value)
    # A cluster worker: the folder staged under a relative root, found from the working directory.
    monkeypatch.chdir(tmp_path)
    shutil.copytree(folder, tmp_path / "staged" / digest)
    monkeypatch.setenv(KERNEL_ROOT_VAR, "staged")
    assert resolve_folder(gone, digest) == Path.cwd() / "staged" / digest
    spec = load_kernel(KernelRef(gone, digest))
    assert spec.directory == (tmp_path / "staged" / digest).resolve()


def test_a_changed_folder_is_not_taken_for_the_one_referenced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_scale_rows(tmp_path / "lib" / "scale_rows", "a")
    ref = kernel_ref(folder)
    monkeypatch.delenv(KERNEL_ROOT_VAR, raising=False)
    assert load_kernel(ref).constants["factor"] == 2.0
    (folder / "spec.py").write_text((folder / "spec.py").read_text().replace("2.0", "5.0"))
    with pytest.raises(KernelSpecError, match="has other files"):
        load_kernel(ref)
    # A staged copy with other files is no stand-in either.
    monkeypatch.setenv(KERNEL_ROOT_VAR, str(tmp_path / "root"))
    shutil.copytree(folder, tmp_path / "root" / ref.digest)
    with pytest.raises(KernelSpecError, match="nor in"):
        load_kernel(ref)


def test_library_names_and_folders_give_references() -> None:
    ref = kernel_ref("silu_and_mul")
    assert Path(ref.folder).name == "silu_and_mul" and Path(ref.folder).is_absolute()
    assert ref.name == "silu_and_mul" and ref.digest == folder_digest(ref.folder)
    assert KernelRef.from_dict(ref.to_dict()) == ref
    assert load_kernel(ref).name == "silu_and_mul"
    with pytest.raises(KernelSpecError, match="no kernel 'nope'"):
        kernel_ref("nope")


def test_two_libraries_with_one_kernel_name_load_side_by_side(tmp_path: Path) -> None:
    lib_a, lib_b = write_libraries(tmp_path)
    ref_a, ref_b = kernel_ref(lib_a / "scale_rows"), kernel_ref(lib_b / "scale_rows")
    assert ref_a.digest != ref_b.digest
    spec_a, spec_b = load_kernel(ref_a), load_kernel(ref_b)
    again_a = load_kernel(ref_a)  # loading b in between must not have replaced a's module
    assert spec_a.name == spec_b.name == "scale_rows"
    x = {"x": torch.ones(8)}
    assert spec_a.reference(x, {"n": 8}, spec_a.constants)["out"][0].item() == 2.0
    assert spec_b.reference(x, {"n": 8}, spec_b.constants)["out"][0].item() == 3.0
    assert again_a.search_shapes == ({"n": 4096}, {"n": 65536})
    assert spec_b.search_shapes == ({"n": 1024}, {"n": 16384}, {"n": 262144})
    modules = {spec_a.reference.__module__, spec_b.reference.__module__}
    assert len(modules) == 2 and all(sys.modules[m].SPEC.directory in (spec_a.directory, spec_b.directory)
                                     for m in modules)


def test_one_evaluator_judges_each_reference_against_its_own_spec(tmp_path: Path, compile_cache: Path) -> None:
    from evaluators.api import EvalRequest
    from evaluators.standin import StandinEvaluator
    from kernels.variant import Variant
    from tests.unit.kernel_folders import BASELINE

    lib_a, lib_b = write_libraries(tmp_path)
    evaluator = StandinEvaluator()
    variant = Variant("scale_rows", BASELINE)
    shapes = {}
    for lib, folder in (("a", lib_a), ("b", lib_b)):
        ev = evaluator.evaluate(EvalRequest(kernel_ref(folder / "scale_rows"), variant, dtype="float32"))
        assert ev.status.is_ok, ev.message
        shapes[lib] = [s.shape for s in ev.shapes]
    assert shapes == {"a": [{"n": 4096}, {"n": 65536}], "b": [{"n": 1024}, {"n": 16384}, {"n": 262144}]}


def test_a_resumed_run_refuses_kernel_folders_that_changed(tmp_path: Path) -> None:
    from search.run import KERNELS_FILE, UsageError, check_recorded_kernels, name_kernels

    lib_a, lib_b = write_libraries(tmp_path / "libs")
    folders = [lib_a / "scale_rows", lib_b / "scale_rows"]
    kernels = name_kernels([(load_kernel(f), kernel_ref(f)) for f in folders])
    names = [ref.name for _, ref in kernels]
    assert names == [f"scale_rows@{kernel_ref(f).digest[:8]}" for f in folders]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    check_recorded_kernels(run_dir, kernels)
    check_recorded_kernels(run_dir, kernels)  # the same folders with the same files: resumable
    assert set(json.loads((run_dir / KERNELS_FILE).read_text())) == set(names)
    (folders[1] / "spec.py").write_text((folders[1] / "spec.py").read_text() + "\n# edited\n")
    changed = name_kernels([(load_kernel(f), kernel_ref(f)) for f in folders])
    with pytest.raises(UsageError, match="changed since the run started"):
        check_recorded_kernels(run_dir, changed)
    with pytest.raises(UsageError, match="changed since the run started"):
        check_recorded_kernels(run_dir, kernels[:1])  # a kernel left out is a different run too
    with pytest.raises(UsageError, match="hold the same files"):
        name_kernels([kernels[0], kernels[0]])
