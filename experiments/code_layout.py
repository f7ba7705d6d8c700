"""Where each kernel's vector path starts in its binary (CPU only; needs nvdisasm).

    python -m experiments.code_layout --out experiments/results/code-layout.md
    python -m experiments.code_layout --root ../old-checkout   # the same table for other code

For every recipe of the library kernels and every generated schedule of the unseen
benchmark, at its default tuning with fast math, in its first dtype, compiled for sm_90 by
the evaluator's admission: the byte offset of the first 16-byte global load from the
kernel's entry, the instruction count, the calls (out-of-line paths and slow-path helpers)
and the registers. A vector path laid behind code the common launch skips shows as a large
first-load offset. These are facts about the binary, not timings: what they cost is for the
GPU to say (``experiments.code_fetch``).

nvdisasm comes from ``$NVDISASM``, the PATH, or the ``nvidia-cuda-nvdisasm`` wheel
(``pip install nvidia-cuda-nvdisasm``); without it the script stops with exit code 2.
``--root`` imports the recipes and the code generator from another checkout (for a
before/after comparison), the rest from this one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LIBRARY = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "fused_add_rmsnorm", "rmsnorm",
           "gemma_fused_add_rmsnorm", "layernorm", "merge_attn_states_lse", "merge_attn_states_multi",
           "per_token_fp8_quant", "rotary_embedding_neox", "rotary_embedding_gptj", "topk_softmax")
_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
_WIDE_LOAD = re.compile(r"\bLDG\.E(?:\.\w+)*\.(?:128|ENL2\.256)\b|\bLDG\.E\.128\b")


def nvdisasm() -> str | None:
    """The nvdisasm binary, or None."""
    found = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if found:
        return found
    # The nvidia-cuda-nvdisasm wheel's binary, found on the path without importing anything.
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        for candidate in sorted(base.glob("cu*/bin/nvdisasm")) + sorted(base.glob("cuda_nvdisasm/bin/nvdisasm")):
            return str(candidate)
    return None


def layout(sass: str) -> dict[str, Any]:
    """From nvdisasm's text of one kernel: instructions, the byte offset of the first 16-byte
    global load (None without one) and the number of calls."""
    offsets, texts = [], []
    for line in sass.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            offsets.append(int(m.group(1), 16))
            texts.append(m.group(2))
    first = next((off for off, text in zip(offsets, texts, strict=True) if _WIDE_LOAD.search(text)), None)
    return {"instructions": len(texts), "first_16B_load": first, "calls": sum("CALL" in t for t in texts)}


def _sources(root: Path) -> list[tuple[str, str, Any, str]]:
    """(kernel, recipe or schedule, spec, source) for the library's recipes and the unseen
    kernels' generated schedules."""
    from agents.embedded.codegen import schedules_for
    from agents.embedded.recipes import recipes_for
    from kernels.spec import load_kernel

    out = []
    for name in LIBRARY:
        spec = load_kernel(name)
        out += [(name, r.name, spec, r.build(spec)) for r in recipes_for(spec)]
    for folder in sorted((root / "experiments" / "unseen").iterdir()):
        if (folder / "spec.py").is_file():
            spec = load_kernel(folder)
            out += [(folder.name, n, spec, s.source) for n, s in schedules_for(spec).items()]
    return out


def run(root: Path, disassembler: str) -> list[dict[str, Any]]:
    from evaluators.admit import Artifact, admit
    from kernels.launch import parse_launch_header

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        for kernel, name, spec, source in _sources(root):
            source = "// flags: --use_fast_math\n" + source
            params = {k: v[0] for k, v in parse_launch_header(source).tune.items()}
            dtype = spec.dtypes[0]
            art = admit(spec, source, dtype, params, arch="sm_90")
            row: dict[str, Any] = {"kernel": kernel, "variant": name, "dtype": dtype, "params": params}
            if not isinstance(art, Artifact):
                rows.append({**row, "error": str(art)[:200]})
                continue
            cubin.write_bytes(art.cubin)
            sass = subprocess.run([disassembler, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
            rows.append({**row, **layout(sass), "registers": art.registers, "spill_bytes": art.spill_bytes})
    return rows


def _markdown(rows: list[dict[str, Any]], command: str, commit: str, date: str) -> str:
    lines = ["# Where each kernel's vector path starts in its binary (sm_90)", "",
             f"- command: `{command}`", f"- git commit: {commit}", f"- date: {date}",
             "- compiled for sm_90 by the evaluator's admission (NVRTC) at each variant's default tuning, "
             "with --use_fast_math, in its first dtype; disassembled with nvdisasm; no GPU involved", "",
             "| kernel | variant | dtype | instructions | first 16-byte load (byte offset) | calls | registers |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kernel']} | {r['variant']} | {r['dtype']} | refused: {r['error']} | | | |")
            continue
        first = "-" if r["first_16B_load"] is None else f"0x{r['first_16B_load']:x}"
        lines.append(f"| {r['kernel']} | {r['variant']} | {r['dtype']} | {r['instructions']} | {first} | "
                     f"{r['calls']} | {r['registers']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                   help="checkout whose recipes and code generator to lay out (default: this one)")
    p.add_argument("--out", type=Path, help="write the table here (.md; the rows beside it as .json)")
    args = p.parse_args(argv)
    disassembler = nvdisasm()
    if disassembler is None:
        print("error: nvdisasm not found: set NVDISASM, put it on the PATH or `pip install nvidia-cuda-nvdisasm`",
              file=sys.stderr)
        return 2
    root = args.root.resolve()
    sys.path.insert(0, str(root))  # before the first import of agents / kernels / evaluators
    from experiments.bench_baselines import git_commit

    rows = run(root, disassembler)
    command = "python -m experiments.code_layout " + " ".join(argv if argv is not None else sys.argv[1:])
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or git_commit()
    text = _markdown(rows, command.strip(), commit, datetime.now(UTC).isoformat(timespec="seconds"))
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
