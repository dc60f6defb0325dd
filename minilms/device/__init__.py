"""Devices: where kernels run and where the pool lives. ``make_device`` is the way to get one.

``cuda`` is a real GPU (or the Numba CUDA simulator); ``cpu`` is a simulated device whose memory
is a fixed arena in host RAM. ``auto`` picks a real GPU when there is one, else ``cpu``.
"""
import os
import sys

from ..errors import ConfigError
from ..sizes import format_bytes, parse_size
from .base import Device
from .cpu import CpuDevice, host_memory_info
from .link import LINKS_GBPS, Link, parse_link

__all__ = ["Device", "CpuDevice", "make_device", "resolve_memory", "real_gpu_available",
           "Link", "LINKS_GBPS", "parse_link", "AUTO_FRACTION"]

# device.memory: auto takes this fraction of what is free. On a GPU the rest is left for the CUDA
# context and other processes; on the cpu device the host copies of every blob need RAM too.
AUTO_FRACTION = {"cuda": 0.9, "cpu": 0.5}
KINDS = ("auto", "cpu", "cuda")


def real_gpu_available() -> bool:
    if not driver_present():    # first: without a driver, numba need not be imported at all
        return False
    import numba
    if numba.config.ENABLE_CUDASIM:
        return False
    from numba import cuda
    return cuda.is_available()


def driver_present() -> bool:
    """Whether a CUDA driver library loads, where numba-cuda looks for one
    (``numba.cuda.cudadrv.driver.locate_driver_and_loader``, or ``$NUMBA_CUDA_DRIVER``). Without
    one there is no GPU, and asking numba costs a third of a second: the import of numba.cuda."""
    import ctypes
    if os.environ.get("NUMBA_CUDA_DRIVER"):
        candidates = [os.environ["NUMBA_CUDA_DRIVER"]]
    elif sys.platform == "win32":
        candidates = ["nvcuda.dll", "\\windows\\system32\\nvcuda.dll"]
    elif sys.platform == "darwin":
        candidates = ["libcuda.dylib", "/usr/local/cuda/lib/libcuda.dylib"]
    else:
        candidates = [os.path.join(folder, name) for folder in ("", "/usr/lib", "/usr/lib64")
                      for name in ("libcuda.so", "libcuda.so.1")]
    for path in candidates:
        try:
            ctypes.CDLL(path)
        except OSError:
            continue
        return True
    return False


def resolve_kind(kind: str, key: str = "device.kind") -> str:
    if kind not in KINDS:
        raise ConfigError(key, f"one of {', '.join(KINDS)}", kind)
    if kind == "auto":
        return "cuda" if real_gpu_available() else "cpu"
    return kind


def resolve_memory(memory, free: int, kind: str, key: str = "device.memory",
                   need: int | None = None) -> int:
    """Pool bytes for ``memory`` (a size or ``"auto"``) given ``free`` bytes where it comes from.
    ``auto`` takes ``AUTO_FRACTION`` of ``free``, or ``need`` (what the run can use: LMS off's
    pool) where that is less: a pool is taken, and on ``cpu`` touched, whole at start-up."""
    if isinstance(memory, str) and memory.strip().lower() == "auto":
        share = int(free * AUTO_FRACTION[kind])
        return share if need is None else min(share, need)
    try:
        nbytes = parse_size(memory, key)
    except ConfigError:
        raise ConfigError(key, "a size like '512MiB' or '2GiB', or 'auto'", memory) from None
    if nbytes > free:
        where = "free on the GPU" if kind == "cuda" else "available host memory"
        raise ConfigError(key, f"at most {format_bytes(free)} ({where})", memory)
    return nbytes


def make_device(kind: str = "auto", memory="auto", link=None, device_id: int = 0,
                need: int | None = None) -> Device:
    """A device with its pool allocated: ``make_device("cpu", "512MiB", link="pcie3")``.
    ``need``: the most a run can use, which caps ``memory="auto"`` (``resolve_memory``)."""
    kind = resolve_kind(kind)
    if kind == "cpu":
        free, _ = host_memory_info()
        return CpuDevice(resolve_memory(memory, free, kind, need=need), link=parse_link(link))
    if link is not None:
        raise ConfigError("device.link", "no link model on a cuda device (its link is real)", link)
    from .cuda import CudaDevice, free_gpu_memory
    free = free_gpu_memory(device_id)
    return CudaDevice(resolve_memory(memory, free, kind, need=need), device_id=device_id)
