"""The interface both devices implement: the pool buffer, views into it, host copies, streams.

A device owns one buffer of ``capacity`` bytes, allocated once, and a ``Pool`` that sub-allocates
it. Everything a kernel touches is a view of that buffer (``view``). Host copies come from
``alloc_host`` (page-locked on ``cuda`` when asked: for what crosses the link every iteration).
Copies run on a stream: ``compute_stream`` is where kernels run; ``h2d_stream`` and ``d2h_stream``
carry transfers each way, so that loads, swap-outs and kernels overlap (a GPU has a copy engine
per direction, and PCIe and NVLink carry both directions at once). Work on one stream runs in
order; between streams, events order it. With ``stream=None`` a copy is synchronous: it is
complete when the call returns.
"""
from abc import ABC, abstractmethod

import numpy as np

from .pool import Pool, Slot


class Device(ABC):
    kind: str          # "cpu" or "cuda"
    name: str          # for people: "cpu (simulated, 512.00 MiB, link pcie3)"

    def __init__(self, capacity: int):
        self.pool = Pool(capacity)
        self.capacity = self.pool.capacity

    def view(self, slot: Slot, shape, dtype):
        """The device array of ``shape``/``dtype`` stored at ``slot`` (a view, no copy)."""
        shape = tuple(shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes > slot.nbytes:
            raise ValueError(f"{slot.owner}: {nbytes} bytes do not fit its slot of {slot.nbytes}")
        return self._bytes(slot.offset, nbytes).view(dtype).reshape(shape)

    def prefault(self, nbytes: int, first=()) -> None:
        """The buffer's first ``nbytes`` will be used, the ``(start, stop)`` ranges of ``first``
        before the rest: map them now if that is cheaper than on first touch (the ``cpu``
        device's arena). Returns at once; nothing else changes."""

    @abstractmethod
    def _bytes(self, offset: int, nbytes: int):
        """A uint8 view of ``nbytes`` of the buffer from ``offset``."""

    @abstractmethod
    def alloc_host(self, shape, dtype, page_locked: bool = False) -> np.ndarray:
        """A host array for a blob's home copy, contents undefined. ``page_locked`` (pinned, on
        ``cuda``) for copies that must run asynchronously; page-locked memory is scarce (the OS
        cannot page it out), so only what crosses the link every iteration asks for it."""

    @abstractmethod
    def h2d(self, dst, src: np.ndarray, stream=None, label: str = "") -> None:
        """Copy host ``src`` into device view ``dst``. ``label`` names it in the trace."""

    @abstractmethod
    def d2h(self, dst: np.ndarray, src, stream=None, label: str = "") -> None:
        """Copy device view ``src`` into host ``dst``. ``label`` names it in the trace."""

    @abstractmethod
    def zero(self, dst, stream=None) -> None:
        """Fill device view ``dst`` with zero bytes."""

    @abstractmethod
    def to_host(self, src) -> np.ndarray:
        """A new host array with the contents of device view ``src`` (for tests and inspection)."""

    @abstractmethod
    def event(self, timing: bool = False):
        """A new event: ``record(stream)``, ``wait(stream)``, ``synchronize()``, ``query()``;
        with ``timing``, ``elapsed_time(end)`` too. As in CUDA, an event that only orders or
        waits is made without timing, which is cheaper to record."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until all work on every stream is done."""

    @abstractmethod
    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the memory the pool's buffer comes from."""

    def copy_stream(self, direction: str):
        """The stream that carries copies of ``direction``: ``"h2d"`` or ``"d2h"``."""
        if direction == "h2d":
            return self.h2d_stream
        if direction == "d2h":
            return self.d2h_stream
        raise ValueError(f"copy direction must be h2d or d2h, found {direction!r}")

    def stream_name(self, stream) -> str:
        """``"sync"`` (no stream: the host copies and waits), ``"h2d"``, ``"d2h"`` or
        ``"compute"``: how the trace names where a copy was issued."""
        if stream is None:
            return "sync"
        if stream is self.h2d_stream:
            return "h2d"
        return "d2h" if stream is self.d2h_stream else "compute"

    def close(self) -> None:
        self.synchronize()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<Device {self.name}>"
