"""The kernel library: one folder per kernel with ``spec.py`` and ``baseline.cu``."""

from kernels.spec import (
    Arg,
    KernelSpec,
    KernelSpecError,
    check_signature,
    list_kernels,
    load_kernel,
    load_library,
    shape_label,
)

__all__ = [
    "Arg",
    "KernelSpec",
    "KernelSpecError",
    "check_signature",
    "list_kernels",
    "load_kernel",
    "load_library",
    "shape_label",
]
