"""``python -m kernels.new NAME --dir DIR``: a commented skeleton of a new kernel folder.

Writes ``DIR/NAME/spec.py`` and ``DIR/NAME/baseline.cu``. Every place that needs the kernel
author's knowledge is a ``TODO``: in spec.py a line that raises ``NotImplementedError``, in
baseline.cu an ``#error`` line, so ``python -m kernels.check DIR/NAME`` names each one left
until it is filled. The argument list starts as an elementwise example (``out``, ``x``, ``n``)
to be replaced by the kernel's own. ``docs/kernels.md`` walks through filling it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

SPEC_TEMPLATE = '''"""__NAME__: TODO one line: what the kernel computes, e.g. "x [n] -> out [n], out = f(x)"."""

from __future__ import annotations

from kernels.spec import Arg, KernelSpec

# A shape gives every int argument a value: the sizes the kernel is called with.


def make_inputs(shape, dtype, generator, case, device):
    """Every tensor argument, by name, for one shape: inputs drawn with ``generator`` (so a
    seed gives the same tensors) on ``device``, ``out`` buffers allocated (the evaluator
    poisons them before each launch). ``dtype`` is the run's torch dtype: tensors whose Arg
    says dtype="scalar" (the default) have it; others have the dtype their Arg names.
    ``case`` is "random" or one of SPEC.edge_cases: inputs that stress the kernel's edges
    (zeros, values near the dtype's range, ties, masked entries, ...)."""
    import torch  # noqa: F401  (torch is imported inside: the spec loads without it)

    raise NotImplementedError("TODO: make_inputs: return {arg name: tensor} for every tensor argument")


def reference(inputs, shape, constants):
    """What the kernel must compute, in fp32 torch, from the inputs as they were before the
    launch: {name: fp32 tensor of the argument's shape} for every argument whose role is
    "out" or "inout", and nothing else. Never change ``inputs`` in place."""
    raise NotImplementedError("TODO: reference: return {written arg name: fp32 tensor}")


def torch_eager(t, shape, constants):
    """A peer timed beside our kernel, writing into the output tensors of ``t``: here the
    reference rounded into the outputs; better, the torch code a serving engine runs today.
    Add production libraries' kernels the same way (imported inside, so a machine without
    them skips that peer)."""
    expected = reference(t, shape, constants)
    for name, value in expected.items():
        t[name].copy_(value)


def bytes_moved(shape, dtype):
    """The least DRAM traffic of one launch, in bytes, for ``dtype`` the run's dtype name
    ("float16", "bfloat16", "float32"): every input element read once plus every output
    element written once. Bandwidth figures and the faster-than-copy guard divide by it."""
    raise NotImplementedError("TODO: bytes_moved: bytes read + bytes written at this shape")


def flops(shape):
    """Arithmetic operations of one launch (0 for a pure copy); reports only."""
    raise NotImplementedError("TODO: flops: operations per launch at this shape")


SPEC = KernelSpec(
    name="__NAME__",  # also the extern "C" entry point of every variant
    description=(
        # What an agent and a report read: the layout (shapes, row-major, contiguous), the math
        # and where it is computed (fp32, rounded once), the alignment callers promise.
        "TODO: describe the kernel for the agents."
    ),
    # The C argument list, in order. TODO: replace this elementwise example by the kernel's own.
    # kind "tensor" (a device pointer), "int" (a shape symbol) or "float" (a value in constants).
    # role "in" (must stay unchanged), "out" (fully written), "inout" (read and written).
    # dtype "scalar" (the run's dtype, scalar_t in CUDA) or a fixed one: "float32", "int32",
    # "int64", "uint8", "int8", "float8_e4m3fn".
    # multiple_of: the alignment callers promise (8 elements = 16-byte rows in fp16/bf16);
    # min_value: the smallest value (1 for sizes, 0 for flags).
    args=(
        Arg("out", "tensor", role="out"),
        Arg("x", "tensor"),
        Arg("n", "int", multiple_of=8),
    ),
    # Shapes the search optimises on: the sizes the kernel really runs at, small to large.
    search_shapes=(
        {"n": 4096},
        {"n": 1048576},
    ),
    # Shapes the search never sees, to re-validate winners: none may repeat a search shape;
    # include odd multiples of each multiple_of (tails) and sizes between the search shapes.
    heldout_shapes=(
        {"n": 8200},
        {"n": 3000008},
    ),
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=bytes_moved,
    flops=flops,
    dtypes=("float16", "bfloat16"),
    # Extra input cases make_inputs understands besides "random". TODO: name the kernel's edges.
    edge_cases=(),
    # Values of "float" arguments, e.g. {"eps": 1e-6}.
    constants={},
    # Per output dtype (rtol, atol); the defaults allow a few units in the last place.
    tolerances={},
    peers={"torch_eager": torch_eager},
)
'''

BASELINE_TEMPLATE = '''// __NAME__ baseline: TODO one line: what it computes, e.g. out[i] = f(x[i]) in fp32.
// The starting kernel the search must beat: the one in use today, or a plain correct one.
//
// The launch line below gives grid and block as tuples of one to three expressions over the
// kernel's int arguments (and any tunables), using + - * // % ( ) min max cdiv, and smem in
// bytes of dynamic shared memory. A line "// tune: NAME=v1,v2" declares a tunable (each value
// reaches the source as -DNAME=value; the first is the default); "// flags: --use_fast_math"
// asks for an allowed compiler flag. scalar_t is the run's element type (__half,
// __nv_bfloat16 or float); cuda_fp16.h, cuda_bf16.h and cuda_fp8.h are already included.
// launch: grid=(cdiv(n, 256),) block=(256,) smem=0

#error "TODO: write the kernel below for the spec's arguments, then delete this line"

extern "C" __global__ void __NAME__(scalar_t* out, const scalar_t* x, int n) {
    // The signature keeps the spec's argument list in order: tensors as pointers of their
    // type (const for role "in"), ints as int, floats as float. Index in 64 bits where a
    // tensor may pass 2^31 elements.
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = x[i];
    }
}
'''


class NewKernelError(ValueError):
    """The skeleton cannot be written as asked (a name that is not a C identifier, a folder
    that exists)."""


def write_skeleton(name: str, parent: Path) -> Path:
    """Writes ``parent/name/spec.py`` and ``baseline.cu``; returns the kernel folder.

    Raises:
        NewKernelError: ``name`` is not a C identifier, or ``parent/name`` already exists.
    """
    if not _NAME_RE.match(name):
        raise NewKernelError(f"{name!r} is not a C identifier: it becomes the kernel's entry point")
    folder = parent / name
    if folder.exists():
        raise NewKernelError(f"{folder} already exists; choose another name or --dir")
    folder.mkdir(parents=True)
    (folder / "spec.py").write_text(SPEC_TEMPLATE.replace("__NAME__", name))
    (folder / "baseline.cu").write_text(BASELINE_TEMPLATE.replace("__NAME__", name))
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.new", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", metavar="NAME", help="the kernel's name (a C identifier)")
    p.add_argument("--dir", type=Path, default=Path("."), help="folder to write NAME/ into (default: here)")
    args = p.parse_args(argv)
    try:
        folder = write_skeleton(args.name, args.dir)
    except (NewKernelError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {folder / 'spec.py'} and {folder / 'baseline.cu'}; fill their TODOs (docs/kernels.md), "
          f"then check with: python -m kernels.check {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
