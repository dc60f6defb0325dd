"""Pages of host memory mapped before their first touch (Linux 5.14+: ``MADV_POPULATE_WRITE``),
and small pages where huge ones cost the host a fault each.

The ``cpu`` device's arena is zeroed pages the kernel maps on first touch, a page fault for each
4 KiB page. One ``madvise(MADV_POPULATE_WRITE)`` maps a range in the kernel, without a fault per
page, and writes nothing: the contents stay what they were (zeros). It is several times faster
than touching the pages one by one (``docs/benchmarks.md``, "Start-up: time to the first step"),
and it can run on a thread of its own while the host plans, copies the prologue in and starts the
first step: ``ctypes`` releases the GIL for the call. Where the call is not there (another OS, an
older kernel) nothing is done, and the pages are mapped on first touch as before.

numpy asks for transparent huge pages for every array of 4 MiB and more. In a virtual machine
whose balloon reports free memory to the host (virtio's free page reporting, which reports free
blocks of 2 MiB and more), a huge page is just what the host took back, and its first touch waits
for the host to fault it in again, several times what a 4 KiB page costs (the guest recycles
those before they are reported; ``scripts/bench_pages.py``); an iteration once the pages are
mapped measured the same with either. There (``host_reclaims_huge_pages``), ``small_pages``
keeps the arena and the homes on 4 KiB pages; elsewhere numpy's huge pages stay.
"""
import ctypes
import ctypes.util
import mmap
import os
import sys
import threading

import numpy as np

MADV_POPULATE_WRITE = 23      # linux/mman.h
MADV_NOHUGEPAGE = 15
HUGE_FROM = 4 << 20           # numpy madvises huge pages for allocations this large
BALLOONS = "/sys/bus/virtio/drivers/virtio_balloon"
FREE_PAGE_REPORTING = 5       # the virtio balloon's feature bit (VIRTIO_BALLOON_F_REPORTING)
# a call at a time: the first pages are ready first, and the call holds the address space's lock
# (which an allocation elsewhere in the process waits for) a few milliseconds at most
CHUNK = 8 << 20
PAGE_SIZE = mmap.PAGESIZE

_madvise = []     # [the libc function, or None where there is none], found on first use
_reclaims = []    # [host_reclaims_huge_pages()], read once


def _libc_madvise():
    if not _madvise:
        function = None
        if sys.platform.startswith("linux"):
            try:
                function = ctypes.CDLL(ctypes.util.find_library("c") or None,
                                       use_errno=True).madvise
                function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                function.restype = ctypes.c_int
            except (OSError, AttributeError):
                function = None
        _madvise.append(function)
    return _madvise[0]


def host_reclaims_huge_pages() -> bool:
    """True in a virtual machine whose balloon reports free pages to the host (read once from
    sysfs): there a huge page's first touch is a fault on the host."""
    if not _reclaims:
        found = False
        try:
            for name in os.listdir(BALLOONS):
                if name.startswith("virtio"):
                    with open(os.path.join(BALLOONS, name, "features")) as features:
                        bits = features.read().strip()
                    found |= len(bits) > FREE_PAGE_REPORTING and bits[FREE_PAGE_REPORTING] == "1"
        except OSError:
            found = False
        _reclaims.append(found)
    return _reclaims[0]


def _page_up(address: int) -> int:
    """``address`` rounded up to a page boundary (madvise takes page-aligned starts)."""
    return -(-address // PAGE_SIZE) * PAGE_SIZE


def small_pages(buffer: np.ndarray) -> bool:
    """Keep ``buffer`` (an array of ``HUGE_FROM`` bytes or more) on small pages where the host
    reclaims huge ones (``host_reclaims_huge_pages``); True where it did so."""
    madvise = _libc_madvise()
    if buffer.nbytes < HUGE_FROM or madvise is None or not host_reclaims_huge_pages():
        return False
    first = _page_up(buffer.ctypes.data)
    end = (buffer.ctypes.data + buffer.nbytes) // PAGE_SIZE * PAGE_SIZE
    return end > first and madvise(first, end - first, MADV_NOHUGEPAGE) == 0


def populate(buffer: np.ndarray, start: int, stop: int) -> bool:
    """Map ``buffer``'s bytes ``[start, stop)`` (whole pages within them) now, in one call; False
    where the OS cannot (the pages are then mapped on first touch)."""
    madvise = _libc_madvise()
    first = _page_up(buffer.ctypes.data + start)
    end = buffer.ctypes.data + stop
    if madvise is None or end <= first:
        return madvise is not None
    return madvise(first, end - first, MADV_POPULATE_WRITE) == 0


def populate_behind(buffer: np.ndarray, ranges) -> threading.Thread:
    """``populate`` on a daemon thread over ``ranges`` (``(start, stop)`` pairs) in their order,
    ``CHUNK`` bytes a call (a range mapped already costs little): started, and returned (join it
    to wait). The thread holds ``buffer`` until it is done."""
    def run():
        for start, stop in ranges:
            for at in range(start, stop, CHUNK):
                if not populate(buffer, at, min(stop, at + CHUNK)):
                    return
    thread = threading.Thread(target=run, name="minilms-populate", daemon=True)
    thread.start()
    return thread
