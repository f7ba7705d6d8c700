"""Kernel folders written for tests: kernels whose names are not in the library, and two
libraries that both hold a kernel of the same name computing different things.

``scale_rows`` in library ``a`` multiplies by 2 on one set of shapes; in library ``b`` it
multiplies by 3 on other shapes, with the very same ``baseline.cu`` (so the two baselines are
one binary, one variant id): anything keyed by name or by variant alone mixes them up.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

SPEC_PY = '''
"""scale_rows: out = x * FACTOR (test kernel)."""

from kernels.spec import Arg, KernelSpec


def make_inputs(shape, dtype, gen, case, device):
    import torch

    n = shape["n"]
    x = torch.randn(n, generator=gen, device=device, dtype=torch.float32).to(dtype) if device.type != "meta" \\
        else torch.empty(n, device=device, dtype=dtype)
    return {"x": x, "out": torch.empty(n, device=device, dtype=dtype)}


def reference(inputs, shape, constants):
    return {"out": inputs["x"].float() * constants["factor"]}


SPEC = KernelSpec(
    name="scale_rows",
    description="out[i] = x[i] * factor for i < n (library LIBRARY)",
    args=(Arg("out", "tensor", role="out"), Arg("x", "tensor"), Arg("n", "int", multiple_of=8),
          Arg("factor", "float")),
    search_shapes=SEARCH,
    heldout_shapes=HELDOUT,
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, dt: 2 * s["n"] * (4 if dt == "float32" else 2),
    flops=lambda s: s["n"],
    constants={"factor": FACTOR},
    dtypes=("float16", "bfloat16", "float32"),
)
'''

BASELINE = """// scale_rows: out[i] = x[i] * factor, one element per thread.
// launch: grid=(cdiv(n, 256),) block=(256,)
extern "C" __global__ void scale_rows(scalar_t* out, const scalar_t* x, int n, float factor) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = static_cast<scalar_t>(static_cast<float>(x[i]) * factor);
    }
}
"""

# library -> (factor, search shapes, held-out shapes)
LIBRARIES = {
    "a": (2.0, ({"n": 4096}, {"n": 65536}), ({"n": 1000},)),
    "b": (3.0, ({"n": 1024}, {"n": 16384}, {"n": 262144}), ({"n": 2040},)),
}


def write_scale_rows(folder: Path, library: str) -> Path:
    """Writes library ``library``'s ``scale_rows`` into ``folder`` (created); returns it."""
    factor, search, heldout = LIBRARIES[library]
    folder.mkdir(parents=True)
    text = (textwrap.dedent(SPEC_PY).replace("FACTOR", repr(factor)).replace("LIBRARY", library)
            .replace("SEARCH", repr(search)).replace("HELDOUT", repr(heldout)))
    (folder / "spec.py").write_text(text)
    (folder / "baseline.cu").write_text(BASELINE)
    return folder


def write_libraries(root: Path) -> tuple[Path, Path]:
    """Two libraries under ``root``, ``a`` and ``b``, each with its own ``scale_rows``."""
    return write_scale_rows(root / "a" / "scale_rows", "a").parent, write_scale_rows(root / "b" / "scale_rows", "b").parent
