"""Devices for tests: the same small device on ``cpu`` or on ``cuda`` (simulator without a GPU)."""
import pytest

from minilms.device import CpuDevice

KINDS = ("cpu", pytest.param("cuda", marks=pytest.mark.cuda))

# Elements the gradient checker samples per tensor. The simulator runs each CUDA thread as a Python
# thread, so on cuda fewer: the kernel tests already compare every CUDA kernel with its CPU twin.
GRADCHECK_SAMPLES = {"cpu": 40, "cuda": 6}


def new_device(kind: str, capacity: int, **options):
    if kind == "cpu":
        return CpuDevice(capacity, **options)
    from minilms.device.cuda import CudaDevice
    return CudaDevice(capacity, **options)
