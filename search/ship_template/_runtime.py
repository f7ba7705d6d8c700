"""Loads the shipped cubins and launches them through the CUDA driver API on torch's stream.

Only ``cuda.bindings.driver`` (NVIDIA's CUDA Python bindings) and torch are used: no CuPy, no
compiler. Nothing touches the GPU until the first launch (or :meth:`Runtime.load`): the
package imports and its ops trace on a machine without one.

Each device gets its own module per (kernel, dtype, member), loaded into the device's primary context
(the one torch uses) after checking that the device is of the architecture the cubins were
built for. Loading switches the thread's stream-capture mode to relaxed for its duration, so a
first launch inside a CUDA-graph capture can still load the module.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._errors import ArchitectureError, LaunchError

DEFAULT_SMEM_LIMIT = 48 * 1024  # dynamic shared memory a kernel gets without opting in


def device_arch(index: int) -> str:
    """The architecture of CUDA device ``index`` as NVRTC names it (``sm_90``)."""
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def check_arch(package: str, built_for: str, nvrtc: str, found: str, device: str) -> None:
    """Refuses a device of another architecture, with a one-line reason.

    Raises:
        ArchitectureError: ``found`` differs from ``built_for``.
    """
    if found != built_for:
        raise ArchitectureError(
            f"{package}: cubins built for {built_for} (NVRTC {nvrtc}), but {device} is {found}; "
            f"ship the runs again on an {found} machine (python -m search.ship RUN_DIR --arch {found})")


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        raise LaunchError("launching needs NVIDIA's CUDA Python bindings: pip install cuda-bindings "
                          "(of the CUDA major of your driver)") from None
    return driver


def _call(driver: Any, what: str, result: Any) -> Any:
    """The value of a driver call's ``(CUresult, value...)`` tuple, or a :class:`LaunchError`."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        text = name.decode() if isinstance(name, bytes) else str(name)
        raise LaunchError(f"{what}: {text}")
    return values[0] if len(values) == 1 else tuple(values)


@dataclass
class Loaded:
    """One kernel's function in one device's context."""

    module: Any
    function: Any
    context: Any
    smem_limit: int = DEFAULT_SMEM_LIMIT


_CTYPES = {"tensor": ctypes.c_void_p, "int": ctypes.c_int, "float": ctypes.c_float}


class Runtime:
    """The package's cubins on the devices that use them.

    Args:
        package: the package name (for messages).
        arch: the architecture the cubins were built for.
        nvrtc: the NVRTC version that built them.
        cubins: file of each (kernel, dtype, member); member 0 is the winner, others the
            kernels dispatched by shape beside it.
    """

    def __init__(self, package: str, arch: str, nvrtc: str, cubins: Mapping[tuple[str, str, int], Path]) -> None:
        self.package = package
        self.arch = arch
        self.nvrtc = nvrtc
        self.cubins = dict(cubins)
        self._loaded: dict[tuple[str, str, int, int], Loaded] = {}
        self._checked: set[int] = set()
        self._lock = threading.Lock()

    def check_device(self, index: int) -> None:
        """Refuses a device of another architecture (once per device)."""
        if index not in self._checked:
            check_arch(self.package, self.arch, self.nvrtc, device_arch(index),
                       f"cuda:{index} ({torch.cuda.get_device_name(index)})")
            self._checked.add(index)

    def load(self, index: int, which: Sequence[tuple[str, str, int]] | None = None) -> None:
        """Loads the cubins (all, or ``which``) on device ``index`` now rather than at first launch."""
        for kernel, dtype, member in which or sorted(self.cubins):
            self.function(kernel, dtype, index, member)

    def function(self, kernel: str, dtype: str, index: int, member: int = 0) -> Loaded:
        key = (kernel, dtype, index, member)
        loaded = self._loaded.get(key)
        if loaded is None:
            with self._lock:
                loaded = self._loaded.get(key) or self._load(kernel, dtype, index, member)
                self._loaded[key] = loaded
        return loaded

    def _load(self, kernel: str, dtype: str, index: int, member: int = 0) -> Loaded:
        self.check_device(index)
        driver = _driver()
        image = self.cubins[(kernel, dtype, member)].read_bytes()
        _call(driver, "cuInit", driver.cuInit(0))
        device = _call(driver, f"cuDeviceGet({index})", driver.cuDeviceGet(index))
        context = _call(driver, "cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(device))
        relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        previous = _call(driver, "cuThreadExchangeStreamCaptureMode", driver.cuThreadExchangeStreamCaptureMode(relaxed))
        _call(driver, "cuCtxPushCurrent", driver.cuCtxPushCurrent(context))
        try:
            module = _call(driver, f"loading {kernel} ({dtype}) on cuda:{index} (cubin for {self.arch}, "
                           f"NVRTC {self.nvrtc})", driver.cuModuleLoadData(image))
            function = _call(driver, f"finding {kernel} in its cubin",
                             driver.cuModuleGetFunction(module, kernel.encode()))
        finally:
            driver.cuCtxPopCurrent()
            driver.cuThreadExchangeStreamCaptureMode(previous)
        return Loaded(module, function, context)

    def launch(self, loaded: Loaded, kernel: str, grid: Sequence[int], block: Sequence[int], smem_bytes: int,
               kinds: Sequence[str], values: Sequence[Any], stream: int) -> None:
        """Launches one kernel on ``stream`` (a ``cudaStream_t`` as an int) with its C arguments.

        Args:
            kinds: per argument ``tensor`` (a device pointer), ``int`` or ``float``.
            values: the argument values (pointers as ints).
        """
        driver = _driver()
        current = _call(driver, "cuCtxGetCurrent", driver.cuCtxGetCurrent())
        if int(current) != int(loaded.context):
            _call(driver, "cuCtxSetCurrent", driver.cuCtxSetCurrent(loaded.context))
        if smem_bytes > loaded.smem_limit:
            attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _call(driver, f"{kernel}: raising dynamic shared memory to {smem_bytes} bytes",
                  driver.cuFuncSetAttribute(loaded.function, attribute, smem_bytes))
            loaded.smem_limit = smem_bytes
        holders = [_CTYPES[k](v) for k, v in zip(kinds, values, strict=True)]
        pointers = (ctypes.c_void_p * len(holders))(*(ctypes.addressof(h) for h in holders))
        _call(driver, f"launching {kernel} grid={tuple(grid)} block={tuple(block)} smem={smem_bytes}",
              driver.cuLaunchKernel(loaded.function, *grid, *block, smem_bytes, driver.CUstream(stream),
                                    ctypes.addressof(pointers), 0))
