"""State and helpers shared by the sandbox worker's jobs (:mod:`evaluators.worker` runs the
evaluations, :mod:`evaluators.peers` the peers' loop); both import this module and neither
imports the other.

Nothing here starts CUDA at import: :class:`Context` does, in the worker process only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from evaluators.launcher import Kernel
from evaluators.validate import Finding
from kernels.compare import tolerances as tolerances  # shared with the CPU checks
from kernels.launch import DeviceLimits, LaunchConfig, check_limits
from kernels.spec import KernelSpec, Shape, load_kernel, shape_label
from kernels.verdict import Status

ROOFLINE_MARGIN = 1.3  # a kernel above 130% of copy bandwidth is measuring something else
Beat = Callable[[str], None]

# Messages of CUDA errors that poison the context (the worker must exit after reporting one).
_FAULT_MARKERS = (
    "CUDA error", "CUDA_ERROR", "cudaError", "illegal memory access", "misaligned address",
    "unspecified launch failure", "device-side assert", "an illegal instruction", "launch timed out",
    "CUDARuntimeError", "CUDADriverError",
)
_FAULT_TYPES = ("CUDADriverError", "CUDARuntimeError", "AcceleratorError")
_OOM_MARKERS = ("out of memory", "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation")


class Verdict(Exception):
    """Ends a job early with a status (raised inside the job, caught at its top)."""

    def __init__(self, status: Status, message: str, guard: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.guard = status, message, guard

    @classmethod
    def rejected(cls, finding: Finding) -> Verdict:
        """The REJECTED verdict of a guard's finding."""
        return cls(Status.REJECTED, finding.message, finding.kind)


def device_limits(props: Mapping[Any, Any]) -> DeviceLimits:
    """The launch limits in a ``cudaDeviceProp`` as CuPy's ``getDeviceProperties`` returns it;
    a field it lacks keeps the H200's value."""
    p = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in props.items()}
    default = DeviceLimits()

    def triple(key: str, fallback: tuple[int, int, int]) -> tuple[int, int, int]:
        value = p.get(key)
        if value is None or len(value) != 3:
            return fallback
        return int(value[0]), int(value[1]), int(value[2])

    return DeviceLimits(
        max_threads_per_block=int(p.get("maxThreadsPerBlock", default.max_threads_per_block)),
        max_block=triple("maxThreadsDim", default.max_block),
        max_grid=triple("maxGridSize", default.max_grid),
        max_smem_bytes=int(p.get("sharedMemPerBlockOptin", default.max_smem_bytes)),
    )


class Context:
    """Per-process state: device, its launch limits, copy bandwidth, flush buffer, loaded specs."""

    def __init__(self, device: int) -> None:
        import cupy

        from evaluators.timing import Flusher, measure_copy_bandwidth

        torch.cuda.set_device(device)
        self.device = torch.device("cuda", device)
        self.copy_bw = measure_copy_bandwidth(self.device)
        self.flush = Flusher(self.device)
        self.specs: dict[str, KernelSpec] = {}
        self.limits = device_limits(cupy.cuda.runtime.getDeviceProperties(device))
        props = torch.cuda.get_device_properties(self.device)
        self.info = {
            "gpu": props.name,
            "arch": f"sm_{props.major}{props.minor}",
            "copy_bw_bytes_per_s": self.copy_bw,
            "limits": self.limits,
            "pid": os.getpid(),
            # what the peers' figures depend on beside the GPU model (search.peer_cache)
            "driver": int(cupy.cuda.runtime.driverGetVersion()),
            "runtime": int(cupy.cuda.runtime.runtimeGetVersion()),
        }

    def spec(self, kernel_dir: str) -> KernelSpec:
        if kernel_dir not in self.specs:
            self.specs[kernel_dir] = load_kernel(kernel_dir)
        return self.specs[kernel_dir]

    def kernel(self, spec: KernelSpec, part: Mapping[str, Any], shapes: list[Shape]) -> Kernel:
        """Loads a binary of a job (``{cubin, launches}``, one launch per shape).

        Raises:
            LaunchLimitError: a launch beyond this device's limits (the parent checks too; a
                job made elsewhere must not reach the driver with one).
            LaunchResourceError: the driver refuses the binary.
        """
        launches = {}
        for shape, cfg in zip(shapes, part["launches"], strict=True):
            resolved = LaunchConfig(*cfg)
            check_limits(resolved, self.limits, f"at shape {shape_label(shape)}")
            launches[shape_label(shape)] = resolved
        return Kernel(part["cubin"], spec, launches)


def oracle_of(kernel: Kernel, shape: Shape) -> Callable[[Mapping[str, torch.Tensor]], None]:
    """Runs ``kernel`` (the trusted baseline) on a shape in the buffers it is given, with the
    launch arguments built once per buffer (its tensors stay where they are)."""
    label = shape_label(shape)
    # Keyed by the buffer's id, holding the buffer too, so that the id cannot be reused.
    args: dict[int, tuple[Mapping[str, torch.Tensor], tuple[Any, ...]]] = {}

    def run(buf: Mapping[str, torch.Tensor]) -> None:
        if id(buf) not in args:
            args[id(buf)] = (buf, kernel.args(buf, shape))
        kernel.launch(label, args[id(buf)][1])

    return run


def torch_dtype(name: str) -> torch.dtype:
    """``"float16"`` -> ``torch.float16``."""
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def roofline_finding(spec: KernelSpec, shape: Shape, dtype: str, median_ms: float, copy_bw: float) -> Finding | None:
    """The roofline guard: a median time below the time of moving the shape's bytes at
    :data:`ROOFLINE_MARGIN` times the measured copy bandwidth is not a measurement of the work."""
    nbytes = int(spec.bytes_moved(shape, dtype))
    roofline_ms = nbytes / copy_bw * 1e3
    if median_ms >= roofline_ms / ROOFLINE_MARGIN:
        return None
    return Finding(
        "roofline",
        f"shape {shape_label(shape)}: {median_ms * 1e3:.2f} us is faster than moving {nbytes} bytes at "
        f"{ROOFLINE_MARGIN:.0%} of the measured copy bandwidth ({roofline_ms * 1e3:.2f} us)",
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """Device memory ran out (torch's allocator or a driver call): the variant asked for too
    much (a huge stack frame or static array), not a fault; the context stays usable."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return any(m in text for m in _OOM_MARKERS)


def is_cuda_fault(exc: BaseException) -> bool:
    """A CUDA error that leaves the context unusable (check :func:`is_out_of_memory` first)."""
    text = str(exc)
    return any(m in text for m in _FAULT_MARKERS) or type(exc).__name__ in _FAULT_TYPES
