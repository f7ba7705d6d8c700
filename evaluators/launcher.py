"""Loads a cubin with CuPy and launches its entry on torch's current stream (GPU only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from kernels.launch import LaunchConfig
from kernels.spec import KernelSpec

# Launch-time driver errors that mean "this configuration cannot run", not a fault: the
# context stays healthy and the worker carries on.
RESOURCE_ERRORS = (
    "CUDA_ERROR_INVALID_VALUE",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    "CUDA_ERROR_INVALID_CONFIGURATION",
    "CUDA_ERROR_OUT_OF_MEMORY",
)
# CUfunction_attribute values (cuda.h).
_ATTR = {"max_threads_per_block": 0, "smem_static_bytes": 1, "local_bytes": 3, "registers": 4,
         "max_dynamic_smem": 8}


MAX_LOCAL_BYTES = 64 * 1024  # per-thread stack frame; the driver reserves it for every resident thread


class LaunchResourceError(RuntimeError):
    """The binary or the launch was refused for its resources (threads, shared memory,
    registers, local memory, sizes the driver cannot take): a RESOURCE_ERROR verdict."""


class Kernel:
    """One loaded entry point with the launch configuration of each shape.

    Launch sizes are checked against the device's limits before a Kernel is made
    (:func:`kernels.launch.check_limits`); what the driver still refuses here becomes a
    :class:`LaunchResourceError`.

    Args:
        cubin: the binary from :func:`evaluators.compile.compile_variant`.
        spec: the kernel spec (argument order, constants).
        launches: resolved launch per shape label.

    Raises:
        LaunchResourceError: the binary does not load, its stack frame is above
            :data:`MAX_LOCAL_BYTES`, or its shared memory cannot be raised as asked.
    """

    def __init__(self, cubin: bytes, spec: KernelSpec, launches: Mapping[str, LaunchConfig]) -> None:
        import cupy

        self._cupy = cupy
        self.spec = spec
        self.launches = dict(launches)
        self.module = cupy.cuda.function.Module()
        try:
            self.module.load(cubin)
            self.function = self.module.get_function(spec.name)
        except cupy.cuda.driver.CUDADriverError as exc:
            raise LaunchResourceError(f"the binary cannot be loaded: {exc}") from None
        local_bytes = self.attributes()["local_bytes"]
        if local_bytes > MAX_LOCAL_BYTES:
            raise LaunchResourceError(
                f"{local_bytes} bytes of local memory (stack) per thread, more than {MAX_LOCAL_BYTES}: "
                "keep large per-thread arrays in shared or global memory"
            )
        self.max_smem = max((c.smem_bytes for c in self.launches.values()), default=0)
        if self.max_smem > 48 * 1024:
            try:
                cupy.cuda.driver.funcSetAttribute(self.function.ptr, _ATTR["max_dynamic_smem"], self.max_smem)
            except (cupy.cuda.driver.CUDADriverError, OverflowError, ValueError) as exc:
                raise LaunchResourceError(f"cannot raise dynamic shared memory to {self.max_smem} bytes: {exc}") from None
        self.stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def attributes(self) -> dict[str, int]:
        get = self._cupy.cuda.driver.funcGetAttribute
        ptr = self.function.ptr
        return {
            "registers": int(get(_ATTR["registers"], ptr)),
            "smem_static_bytes": int(get(_ATTR["smem_static_bytes"], ptr)),
            "local_bytes": int(get(_ATTR["local_bytes"], ptr)),
            "max_threads_per_block": int(get(_ATTR["max_threads_per_block"], ptr)),
        }

    def args(self, tensors: Mapping[str, torch.Tensor], shape: Mapping[str, int]) -> tuple[Any, ...]:
        out: list[Any] = []
        for a in self.spec.args:
            if a.kind == "tensor":
                out.append(np.uint64(tensors[a.name].data_ptr()))
            elif a.kind == "int":
                out.append(np.int32(shape[a.name]))
            else:
                out.append(np.float32(self.spec.constants[a.name]))
        return tuple(out)

    def launch(self, label: str, args: tuple[Any, ...], on_current_stream: bool = False) -> None:
        """Launches on the stream the kernel was loaded on, or (``on_current_stream``, for a
        CUDA-graph capture, whose stream is only current while it lasts) on torch's current one."""
        cfg = self.launches[label]
        stream = self._cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream) if on_current_stream else self.stream
        try:
            self.function(cfg.grid, cfg.block, args, shared_mem=cfg.smem_bytes, stream=stream)
        except (OverflowError, ValueError) as exc:  # sizes CuPy cannot pass to the driver
            raise LaunchResourceError(
                f"launch grid={cfg.grid} block={cfg.block} smem={cfg.smem_bytes} refused: {exc}"
            ) from None
        except self._cupy.cuda.driver.CUDADriverError as exc:
            if any(code in str(exc) for code in RESOURCE_ERRORS):
                raise LaunchResourceError(
                    f"launch grid={cfg.grid} block={cfg.block} smem={cfg.smem_bytes} refused: {exc}"
                ) from None
            raise
