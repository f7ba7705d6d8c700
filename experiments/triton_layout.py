"""Where a Triton kernel like Inductor's for silu_and_mul issues its loads (CPU only).

    pip install triton nvidia-cuda-nvdisasm
    python -m experiments.triton_layout --out experiments/results/triton-layout-silu.md

Inductor writes a pointwise kernel for the fp32 reference of silu_and_mul at a fixed shape: a
flat index over the output, the row and column by division by the constant d, two loads from
x, sigmoid, two multiplies and a store. This is a hand-written kernel of that form (the shape's
d a constant, XBLOCK 1024, 4 warps, as Inductor's default for that size), compiled by Triton
for sm_90 without a GPU and disassembled with nvdisasm, to set beside `code_layout`'s table of
our recipes: the instruction count and the index of each global load and branch. A fact about
the binary, not a timing.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from experiments.code_layout import _INSTRUCTION, nvdisasm


def triton_cubin(d: int, xblock: int, warps: int) -> bytes:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    # Unannotated but for the constexprs: Triton reads the annotations of what it compiles.
    def silu_mul(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr, D: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:]
        xmask = xindex < xnumel
        x0 = xindex % D
        x1 = xindex // D
        gate = tl.load(in_ptr0 + (x0 + 2 * D * x1), xmask).to(tl.float32)
        up = tl.load(in_ptr0 + (D + x0 + 2 * D * x1), xmask).to(tl.float32)
        tl.store(out_ptr0 + xindex, (gate * tl.sigmoid(gate) * up).to(tl.float16), xmask)

    src = ASTSource(fn=silu_mul, signature={"in_ptr0": "*fp16", "out_ptr0": "*fp16", "xnumel": "i32",
                                            "XBLOCK": "constexpr", "D": "constexpr"},
                    constexprs={"XBLOCK": xblock, "D": d},
                    attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["cubin"]


def layout(sass: str) -> dict[str, Any]:
    texts = [m.group(2) for m in (_INSTRUCTION.match(line) for line in sass.splitlines()) if m]
    marks = [(i + 1, t) for i, t in enumerate(texts) if re.search(r"\b(LDG|STG|BRA|EXIT|CALL)\b", t)]
    return {"instructions": len(texts), "marks": marks}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=14336)
    p.add_argument("--xblock", type=int, default=1024)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    disassembler = nvdisasm()
    if disassembler is None:
        print("error: nvdisasm not found (pip install nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    try:
        import triton
    except ImportError:
        print("error: triton not importable (pip install triton)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(triton_cubin(args.d, args.xblock, args.warps))
        sass = subprocess.run([disassembler, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    got = layout(sass)
    # The commit by git itself: this runs in an environment with Triton, not the project's packages.
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = ["# A Triton kernel of Inductor's form for silu_and_mul, laid out (sm_90)", "",
             "- command: `python -m experiments.triton_layout " + " ".join(argv if argv is not None else sys.argv[1:]) + "`",
             f"- git commit: {commit or 'unknown'}", f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
             f"- Triton {triton.__version__}, target sm_90, d={args.d}, XBLOCK={args.xblock}, {args.warps} warps; "
             "compiled without a GPU, disassembled with nvdisasm", "",
             f"{got['instructions']} instructions; global loads, stores and branches by their index from the entry:", ""]
    lines += [f"- {i}: `{t}`" for i, t in got["marks"]]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
