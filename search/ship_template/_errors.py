"""The errors a shipped op raises; each message is one line that says what to change.

Argument errors are raised before anything is launched, in eager mode and while
``torch.compile`` traces the op (its fake implementation runs the same checks, except the
pointer alignment, which a fake tensor does not have).
"""

from __future__ import annotations


class ShipError(Exception):
    """Base class of every error of a shipped package."""


class ArgumentError(ShipError, ValueError):
    """An input outside what the kernel's spec promises; the subclasses say which promise."""


class DtypeError(ArgumentError):
    """A tensor of a dtype the op was not shipped for, or tensors whose dtypes disagree."""


class LayoutError(ArgumentError):
    """A tensor that is not contiguous, not on one CUDA device with the others, whose data
    pointer is not aligned, or a written tensor that overlaps another argument in memory."""


class ShapeError(ArgumentError):
    """Tensor sizes that do not fit the spec's shapes: a wrong rank, sizes that disagree
    between tensors, a size below its minimum, not a multiple of its promised alignment, or
    too large for the kernel's 32-bit size arguments."""


class DeviceError(ShipError, RuntimeError):
    """No CUDA device in reach: torch was built without CUDA, or sees no GPU."""


class ArchitectureError(ShipError, RuntimeError):
    """The GPU is of another architecture than the one the cubins were built for."""


class LaunchError(ShipError, RuntimeError):
    """The CUDA driver refused to load a cubin or launch a kernel."""
