"""The ``cuda`` device: a real GPU through numba.cuda, or the Numba CUDA simulator.

The pool is one ``device_array`` of uint8; blobs are typed views of it. Host copies that cross the
link every iteration are page-locked (pinned) so that copies on the copy streams (one each way,
for the GPU's two copy engines) are truly asynchronous and overlap with kernels on the compute
stream and with each other; the others are ordinary memory.
"""
import numba
import numpy as np
from numba import cuda

from .. import events
from ..sizes import format_bytes
from .base import Device
from .cpu import host_memory_info


class CudaDevice(Device):
    kind = "cuda"

    def __init__(self, capacity: int, device_id: int = 0):
        super().__init__(capacity)
        self.simulated = bool(numba.config.ENABLE_CUDASIM)
        cuda.select_device(device_id)
        self.device_id = device_id
        self._buffer = cuda.device_array(self.capacity, dtype=np.uint8)
        self.compute_stream = cuda.stream()
        self.h2d_stream = cuda.stream()
        self.d2h_stream = cuda.stream()
        what = "simulator" if self.simulated else f"GPU {device_id}"
        self.name = f"cuda ({what}, {format_bytes(self.capacity)})"

    def _bytes(self, offset: int, nbytes: int):
        return self._buffer[offset:offset + nbytes]

    def alloc_host(self, shape, dtype, page_locked: bool = False) -> np.ndarray:
        return cuda.pinned_array(shape, dtype=dtype) if page_locked else np.empty(shape, dtype)

    def h2d(self, dst, src: np.ndarray, stream=None, label: str = "") -> None:
        _check_same(dst, src)
        self._report("h2d", label, src.nbytes, stream)
        dst.copy_to_device(src, stream=stream or 0)

    def d2h(self, dst: np.ndarray, src, stream=None, label: str = "") -> None:
        _check_same(src, dst)
        self._report("d2h", label, dst.nbytes, stream)
        src.copy_to_host(dst, stream=stream or 0)

    def _report(self, direction: str, label: str, nbytes: int, stream) -> None:
        # Copies are asynchronous here: the trace gets when each was issued, not when it ran.
        if events.listening:
            now = events.clock()
            events.emit("copy", label, nbytes, direction=direction, start=now, end=now,
                        stream=self.stream_name(stream), timing="issued")

    def zero(self, dst, stream=None) -> None:
        if self.simulated:
            dst.copy_to_device(np.zeros(dst.shape, dst.dtype), stream=stream or 0)
            return
        from numba.cuda.cudadrv.driver import device_memset
        device_memset(dst, 0, dst.nbytes, stream=stream or 0)
        if stream is None:  # cuMemset is asynchronous to the host; stream=None promises completion
            cuda.default_stream().synchronize()

    def to_host(self, src) -> np.ndarray:
        return src.copy_to_host()

    def event(self, timing: bool = False):
        if self.simulated:  # the simulator runs everything at once, and its Event lacks query()
            event = cuda.event()
            event.query = lambda: True
            return event
        return cuda.event(timing=timing)

    def synchronize(self) -> None:
        cuda.synchronize()

    def memory_info(self) -> tuple[int, int]:
        if self.simulated:  # the simulator reports infinite memory; its arrays live in host RAM
            return host_memory_info()
        return tuple(cuda.current_context().get_memory_info())


def free_gpu_memory(device_id: int = 0) -> int:
    """Bytes free on GPU ``device_id`` before the pool is made (host RAM under the simulator)."""
    from ..errors import ConfigError
    if not cuda.is_available():
        raise ConfigError("device.kind", "a CUDA GPU (none is present; use cpu or auto)", "cuda")
    if numba.config.ENABLE_CUDASIM:
        return host_memory_info()[0]
    cuda.select_device(device_id)
    return cuda.current_context().get_memory_info()[0]


def _check_same(device_array, host: np.ndarray) -> None:
    if tuple(device_array.shape) != host.shape or device_array.dtype != host.dtype:
        raise ValueError(f"copy between device {device_array.shape} {device_array.dtype} "
                         f"and host {host.shape} {host.dtype}")
