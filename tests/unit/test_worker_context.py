"""CPU tests of the sandbox worker's shared helpers (evaluators.context): the device's launch
limits as the worker reports them, which exceptions are verdicts, and the roofline guard."""

from __future__ import annotations

import pytest
import torch

from evaluators.context import device_limits, is_cuda_fault, is_out_of_memory, roofline_finding
from kernels.launch import DeviceLimits
from kernels.spec import load_kernel


def test_device_limits_from_cupy_properties():
    props = {"maxThreadsPerBlock": 1024, "maxThreadsDim": (1024, 1024, 64), "maxGridSize": (2**31 - 1, 65535, 65535),
             "sharedMemPerBlockOptin": 101376, "name": b"NVIDIA A100"}
    limits = device_limits(props)
    assert limits == DeviceLimits(max_smem_bytes=101376)
    # bytes keys, as some CuPy builds return, and missing fields keep the H200's values
    assert device_limits({b"sharedMemPerBlockOptin": 49152}).max_smem_bytes == 49152
    assert device_limits({}) == DeviceLimits()


@pytest.mark.parametrize("exc", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    RuntimeError("CUDA error: out of memory"),
    RuntimeError("CUDADriverError: CUDA_ERROR_OUT_OF_MEMORY: out of memory"),
])
def test_running_out_of_device_memory_is_a_resource_error_not_a_fault(exc):
    assert is_out_of_memory(exc)


@pytest.mark.parametrize("text", ["CUDA error: an illegal memory access was encountered",
                                  "CUDA_ERROR_ILLEGAL_INSTRUCTION: an illegal instruction was encountered",
                                  "misaligned address"])
def test_cuda_faults_are_recognised(text):
    exc = RuntimeError(text)
    assert is_cuda_fault(exc) and not is_out_of_memory(exc)


def test_our_own_bugs_are_neither():
    exc = KeyError("out")
    assert not is_cuda_fault(exc) and not is_out_of_memory(exc)


def test_roofline_guard():
    spec = load_kernel("silu_and_mul")
    shape = {"num_tokens": 4096, "d": 14336}
    nbytes = spec.bytes_moved(shape, "float16")
    copy_bw = 4e12
    at_copy_speed_ms = nbytes / copy_bw * 1e3
    assert roofline_finding(spec, shape, "float16", at_copy_speed_ms, copy_bw) is None
    assert roofline_finding(spec, shape, "float16", at_copy_speed_ms / 1.25, copy_bw) is None
    finding = roofline_finding(spec, shape, "float16", at_copy_speed_ms / 2, copy_bw)
    assert finding is not None and finding.kind == "roofline" and "[4096, 14336]" in finding.message
