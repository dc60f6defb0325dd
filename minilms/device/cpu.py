"""The ``cpu`` device: a simulated GPU whose memory is a fixed arena in host RAM.

Kernels only ever touch views of the arena, and copies between host copies and the arena are real
memory copies (large ones with streaming stores, ``streaming``: around the caches, as a GPU's copy
engine writes; swap-ins in plain stores where the whole pool fits in the last-level cache,
``CACHED_SWAP_INS``), so LMS behaves here as it does on a GPU and can be tested and studied
without one.
An optional ``Link`` makes each copy last at least ``bytes / bandwidth``.

Streams mirror CUDA's (``cpu_streams``): work on a stream runs in order. The compute stream runs
work at once in the calling thread; each copy stream (``h2d``, ``d2h``) has a thread of its own,
which runs its copies where a core is free for it or the device has a ``Link``
(``cpu_streams.copy_threads``), so copies each way overlap with compute and with each other (a
``Link`` holds each direction on its own, as a full-duplex link carries both at once), and a
compute thread that waits for a copy does copy work meanwhile; with every core computing, the
copies run where they are issued.
"""
import os

import numpy as np

from .. import events
from ..sizes import format_bytes
from .base import Device
from .cpu_streams import CpuEvent, CpuStream, SplitCopy, splits, streaming
from .link import Link
from .pages import populate_behind, small_pages

# Swap-ins in plain stores (``streaming.copy``'s ``cached``) where the pool fits in the last-level
# cache: there the lines a swap-in writes are in cache already, and its reader, the next steps,
# finds them there; a streaming store sends them to memory, and the reader after them
# (docs/benchmarks.md, "Why the code chose", session 67). Swap-outs stream whatever the cache:
# their host copy is not read until the blob's next swap-in. None: that rule; True or False:
# always, never (the benchmark's A/B, ``scripts/bench_copy.py --switch cached``).
CACHED_SWAP_INS = None
CACHES = "/sys/devices/system/cpu/cpu0/cache"


def last_level_cache(caches: str | None = None) -> int:
    """Bytes of the first processor's last-level data (or unified) cache, from Linux's sysfs
    (``caches``, default ``CACHES``); 0 where that is not there to say (another system)."""
    caches = CACHES if caches is None else caches
    def read(index: str, name: str) -> str:
        with open(os.path.join(caches, index, name), encoding="ascii") as file:
            return file.read().strip()
    levels = []
    try:
        for index in sorted(os.listdir(caches)):
            if index.startswith("index") and read(index, "type") in ("Data", "Unified"):
                size = read(index, "size")      # "2048K", "480M"
                scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
                levels.append((int(read(index, "level")), int(size.rstrip("KMG")) * scale))
    except (OSError, ValueError, IndexError):
        return 0
    return max(levels)[1] if levels else 0


class CpuDevice(Device):
    kind = "cpu"

    def __init__(self, capacity: int, link: Link | None = None):
        super().__init__(capacity)
        self.link = link
        # Zeroed pages the kernel maps on first touch: the size was checked against available
        # memory (``resolve_memory``), and touching gigabytes up front cost seconds of start-up
        # that a run whose plan uses less of the pool never needed.
        self._arena = np.zeros(self.capacity, np.uint8)
        small_pages(self._arena)
        self._prefaulted = 0
        self.pool_in_cache = self.capacity <= last_level_cache()   # CACHED_SWAP_INS's rule
        self.compute_stream = CpuStream("compute", threaded=False)
        self.h2d_stream = CpuStream("h2d", threaded=True, linked=link is not None)
        self.d2h_stream = CpuStream("d2h", threaded=True, linked=link is not None)
        link_name = f", link {link.name}" if link else ""
        self.name = f"cpu (simulated, {format_bytes(self.capacity)}{link_name})"

    def _bytes(self, offset: int, nbytes: int):
        return self._arena[offset:offset + nbytes]

    def prefault(self, nbytes: int, first=()) -> None:
        """The arena's first ``nbytes`` mapped on a thread of its own (``pages.populate_behind``),
        the ranges of ``first`` first: several times faster than a fault a page as the host's
        copies and the first step touch them, and beside them. Only what a plan uses: the rest
        of a large arena stays untouched until something does."""
        nbytes = min(nbytes, self.capacity)
        if nbytes > self._prefaulted:
            ranges = []         # ``first`` in the order of the arena, touching ones merged
            for start, stop in sorted(first):
                start, stop = max(start, self._prefaulted), min(stop, nbytes)
                if ranges and start <= ranges[-1][1]:
                    ranges[-1][1] = max(ranges[-1][1], stop)
                elif start < stop:
                    ranges.append([start, stop])
            populate_behind(self._arena, ranges + [[self._prefaulted, nbytes]])
            self._prefaulted = nbytes

    def alloc_host(self, shape, dtype, page_locked: bool = False) -> np.ndarray:
        home = np.empty(shape, dtype)   # the host's memory is the device's: nothing to lock
        small_pages(home)
        return home

    def h2d(self, dst: np.ndarray, src: np.ndarray, stream: CpuStream | None = None,
            label: str = "") -> None:
        self._copy(dst, src, stream, "h2d", label)

    def d2h(self, dst: np.ndarray, src: np.ndarray, stream: CpuStream | None = None,
            label: str = "") -> None:
        self._copy(dst, src, stream, "d2h", label)

    def _copy(self, dst: np.ndarray, src: np.ndarray, stream: CpuStream | None, direction: str,
              label: str) -> None:
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"copy between {src.shape} {src.dtype} and {dst.shape} {dst.dtype}")
        link = self.link

        def after(started):
            if link is not None:
                link.hold(started, dst.nbytes)
            if events.listening:   # when the bytes really moved, reported from where they moved
                events.emit("copy", label, dst.nbytes, direction=direction, start=started,
                            end=events.clock(), stream=self.stream_name(stream))

        # where it is issued, a copy runs on the kernels' thread and may use all their threads
        here = stream is None or not stream.copies_on_thread()
        cached = direction == "h2d" and self.swap_ins_cached()

        def copy():
            started = events.clock()
            streaming.copy(dst, src, parallel=here, cached=cached)
            after(started)
        if stream is None:
            copy()
        elif splits(dst, src, stream):
            stream.submit(SplitCopy(dst, src, after, cached))   # pieces a waiting thread can share
        else:
            stream.submit(copy)

    def swap_ins_cached(self) -> bool:
        """Whether copies into the pool leave their lines in cache (``CACHED_SWAP_INS``)."""
        return self.pool_in_cache if CACHED_SWAP_INS is None else CACHED_SWAP_INS

    def zero(self, dst: np.ndarray, stream: CpuStream | None = None) -> None:
        if stream is None:
            dst.fill(0)
        else:
            stream.submit(lambda: dst.fill(0))

    def to_host(self, src: np.ndarray) -> np.ndarray:
        return np.array(src, copy=True)

    def event(self, timing: bool = False) -> CpuEvent:
        return CpuEvent(timing, helped=(self.h2d_stream, self.d2h_stream))

    def synchronize(self) -> None:
        # d2h first: the h2d stream may wait for it, never the other way round
        self.d2h_stream.synchronize()
        self.h2d_stream.synchronize()
        self.compute_stream.synchronize()

    def memory_info(self) -> tuple[int, int]:
        return host_memory_info()

    def close(self) -> None:
        self.synchronize()
        self.h2d_stream.close()
        self.d2h_stream.close()


def host_memory_info() -> tuple[int, int]:
    """(available, total) bytes of host RAM: what a new arena could take without swapping."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        kib = lambda key: int(fields[key].split()[0]) * 1024  # noqa: E731
        return kib("MemAvailable"), kib("MemTotal")
    except (OSError, KeyError, ValueError):
        import os
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
