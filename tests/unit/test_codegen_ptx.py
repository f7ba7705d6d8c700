"""What the generated schedules compile to: read in the PTX NVRTC writes for sm_90 (no GPU).

A pack of 2-byte elements assigned as a struct came out as 2- and 4-byte stores (four
``st.global.v2.u16`` for 16 bytes of fp16); the schedules store packs through ``cg_store``,
one vector store per pack."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from agents.embedded.codegen import generate
from evaluators.compile import DEFAULT_ARCH, build_options, full_source
from kernels.launch import parse_launch_header
from kernels.spec import load_kernel

pytest.importorskip("cuda.bindings.nvrtc")

ROOT = Path(__file__).resolve().parents[2]
UNSEEN = sorted(p.parent for p in (ROOT / "experiments" / "unseen").glob("*/spec.py"))


def ptx_of(source: str, dtype: str, defines: dict[str, int]) -> str:
    from cuda.bindings import nvrtc as rt

    options = [o.replace("sm_", "compute_") for o in build_options(source, dtype, defines, DEFAULT_ARCH)]
    _, prog = rt.nvrtcCreateProgram(full_source(source).encode(), b"variant.cu", 0, [], [])
    (status,) = rt.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
    _, size = rt.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    rt.nvrtcGetProgramLog(prog, log)
    assert status == rt.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace")
    _, size = rt.nvrtcGetPTXSize(prog)
    ptx = b" " * size
    rt.nvrtcGetPTX(prog, ptx)
    rt.nvrtcDestroyProgram(prog)
    return ptx.decode(errors="replace")


def global_stores(ptx: str) -> Counter:
    return Counter(re.findall(r"\bst\.global[.a-z0-9]*", ptx))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("folder", UNSEEN, ids=[f.name for f in UNSEEN])
def test_packs_of_2_byte_elements_are_stored_whole(folder, dtype):
    spec = load_kernel(folder)
    if dtype not in spec.dtypes:
        pytest.skip(f"{spec.name} does not run in {dtype}")
    for schedule in generate(spec):
        defaults = {k: v[0] for k, v in parse_launch_header(schedule.source).tune.items()}
        stores = global_stores(ptx_of(schedule.source, dtype, defaults))
        split = {k: n for k, n in stores.items() if re.search(r"\.v[24]\.(u16|b16)$", k)}
        assert not split, f"{spec.name} {schedule.name}: a pack stored in pieces: {dict(stores)}"


@pytest.mark.parametrize("name", ["bias_gelu", "transpose_2d", "logits_mask_fill"])
def test_full_size_16_bit_outputs_get_16_byte_stores(name):
    spec = load_kernel(ROOT / "experiments" / "unseen" / name)
    for schedule in generate(spec):
        if schedule.name == "codegen:transpose/tiled":
            continue  # VW x VW blocks: packs of VW elements, at most 8 bytes
        defaults = {k: v[0] for k, v in parse_launch_header(schedule.source).tune.items()}
        stores = global_stores(ptx_of(schedule.source, "float16", defaults))
        assert any(k.endswith(".v4.u32") for k in stores), f"{schedule.name}: {dict(stores)}"


@pytest.mark.parametrize("name", ["l2norm_rows", "log_softmax_rows", "fused_add_rmsnorm"])
def test_a_rows_pass_issues_its_cached_vectors_loads_before_their_arithmetic(name):
    """The first ITEMS vectors of a row (the register cache) are loaded in a loop of their
    own: as one loop of guarded load-then-fold per vector, ptxas emitted one branch per
    vector, each waiting on its load before the next was issued (nvdisasm of rows/block)."""
    folder = ROOT / "experiments" / "unseen" / name
    spec = load_kernel(folder if folder.is_dir() else name)
    schedule = next(s for s in generate(spec) if s.name.startswith("codegen:rows/block"))
    ptx = ptx_of(schedule.source, "float16", {"ITEMS": 4, "RU": 1})
    # 16-byte loads (L) and fp32 arithmetic (F) in program order; the scalar path has no L.
    seq = "".join("L" if "ld.global" in m else "F"
                  for m in re.findall(r"ld\.global(?:\.nc)?\.v4\.\w+|\b(?:fma|add|mul|sub|max|min|ex2)(?:\.\w+)*\.f32", ptx))
    first_run = re.search(r"L+", seq)
    assert first_run is not None and len(first_run.group()) >= 4, f"{name}: {seq[:80]}"


@pytest.mark.parametrize("name", ["kv_cache_write", "merge_attn_states_lse"])
def test_elementwise_reads_row_values_after_its_vector_loads(name):
    """A row value the loads do not need (kv_cache_write's slot, the merge's per-row lse) is
    read after the vector path's 16-byte loads are issued: read first, ptxas put the slot's
    arithmetic ahead of the vector loads, which then waited a trip to memory for it
    (nvdisasm, sm_90). In the kernel's entry (the vector path; the scalar one is a function
    of its own), the first 16-byte load precedes the first scalar load."""
    folder = ROOT / "experiments" / "unseen" / name
    spec = load_kernel(folder if folder.is_dir() else name)
    schedule = next(s for s in generate(spec) if s.name == "codegen:elementwise/rows")
    defaults = {k: v[0] for k, v in parse_launch_header(schedule.source).tune.items()}
    ptx = ptx_of(schedule.source, "float16", defaults)
    entry = ptx[ptx.index(".entry"):]
    loads = re.findall(r"ld\.global(?:\.nc)?(\.v4)?\.\w+", entry)
    assert loads and loads[0] == ".v4", f"{name}: first loads {loads[:6]}"
