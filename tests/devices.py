"""Devices for tests: the same small device on ``cpu`` or on ``cuda`` (simulator without a GPU)."""
import pytest

from minilms.device import CpuDevice

KINDS = ("cpu", pytest.param("cuda", marks=pytest.mark.cuda))


def new_device(kind: str, capacity: int, **options):
    if kind == "cpu":
        return CpuDevice(capacity, **options)
    from minilms.device.cuda import CudaDevice
    return CudaDevice(capacity, **options)
