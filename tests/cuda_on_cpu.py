"""The tests' name for the CPU emulator, which lives in the product as :mod:`kernels.cpu_run`."""

from kernels.cpu_run import CXX, SHIM, CpuRunError, available, run

__all__ = ["CXX", "SHIM", "CpuRunError", "available", "run"]
