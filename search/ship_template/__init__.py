"""Kernels found by a kernel search, shipped as ``torch.library`` ops.

Importing the package registers one op per kernel under ``torch.ops.<namespace>`` and binds
it here by the kernel's name (``pkg.silu_and_mul(out, x)``). Each op takes the kernel's
tensors in the spec's order, writes its outputs in place and returns nothing; the manifest
(``MANIFEST``, from ``manifest.json``) lists every op's layout, dtypes, the cubins and their
sources, the architecture and NVRTC version they were built with, and the evidence the search
gathered for each. Nothing touches a GPU before the first launch or :func:`load`.

This folder is also the template the engine's ship step copies (without a manifest, it
registers nothing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._errors import (
    ArchitectureError,
    ArgumentError,
    DeviceError,
    DtypeError,
    LaunchError,
    LayoutError,
    ShapeError,
    ShipError,
)
from ._ops import register_all
from ._runtime import Runtime

__all__ = [
    "MANIFEST", "ArchitectureError", "ArgumentError", "DeviceError", "DtypeError", "LaunchError", "LayoutError", "ShapeError",
    "ShipError", "evidence", "load", "ops",
]

PACKAGE_DIR = Path(__file__).resolve().parent
_MANIFEST_FILE = PACKAGE_DIR / "manifest.json"
MANIFEST: dict[str, Any] = json.loads(_MANIFEST_FILE.read_text()) if _MANIFEST_FILE.is_file() else {}
ops: dict[str, Callable[..., None]] = {}
_runtime: Runtime | None = None

if MANIFEST:
    _runtime = Runtime(
        MANIFEST["namespace"], MANIFEST["arch"], MANIFEST["nvrtc"],
        {(kernel, dtype, i): PACKAGE_DIR / b["cubin"]
         for kernel, entry in MANIFEST["kernels"].items() for dtype, build in entry["builds"].items()
         for i, b in enumerate([build, *build.get("members", [])])},
    )
    ops = register_all(MANIFEST["namespace"], MANIFEST, _runtime, PACKAGE_DIR)
    globals().update(ops)


def load(device: Any = None) -> None:
    """Checks the GPU's architecture and loads every cubin on it now (before a CUDA-graph
    capture, say) instead of at each op's first launch.

    Args:
        device: a CUDA device (index, ``"cuda:1"`` or ``torch.device``); default the current one.

    Raises:
        DeviceError: no CUDA device is in reach (torch without CUDA, or no GPU visible).
        ArchitectureError: the GPU is not of the architecture the cubins were built for.
        LaunchError: the driver refused a cubin.
    """
    import torch

    if _runtime is None:
        raise ShipError("this is the package template: it has no kernels (build a package with the ship step)")
    if not torch.cuda.is_available():
        # torch's own answer here would be a bare AssertionError or a driver message
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise DeviceError(f"no CUDA device: torch {torch.__version__} ({built}) sees no GPU; the kernels of this "
                          f"package need an NVIDIA GPU of {MANIFEST['arch']}")
    index = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    _runtime.load(index.index if index.index is not None else torch.cuda.current_device())


def evidence(kernel: str, dtype: str) -> dict[str, Any]:
    """What the search measured and checked for one shipped kernel and dtype (see the manifest)."""
    try:
        return dict(MANIFEST["kernels"][kernel]["builds"][dtype]["evidence"])
    except KeyError:
        raise KeyError(f"no {kernel} for {dtype} in this package") from None
