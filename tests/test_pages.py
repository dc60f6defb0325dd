"""Pages mapped before their first touch (``minilms.device.pages``) and the ``cpu`` device's
``prefault``: the pages are mapped (the process's resident memory grows by them), nothing in them
changes, and nothing beyond what was asked is touched."""
import ctypes
import mmap
import platform

import numpy as np
import pytest

from minilms.device import cpu, make_device, pages
from minilms.device.pages import PAGE_SIZE, populate, populate_behind, small_pages

MiB = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)


def resident(buffer: np.ndarray) -> int:
    """The bytes of ``buffer``'s pages that are in memory, from ``mincore``: exactly its own
    pages (the kernel merges neighbouring mappings with the same flags, so a mapping's Rss in
    /proc/self/smaps may count another buffer's pages too)."""
    low = buffer.ctypes.data & ~(PAGE_SIZE - 1)
    length = buffer.ctypes.data + buffer.nbytes - low
    vector = (ctypes.c_ubyte * -(-length // PAGE_SIZE))()
    if _libc.mincore(ctypes.c_void_p(low), ctypes.c_size_t(length), vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return int(np.count_nonzero(np.frombuffer(vector, np.uint8) & 1)) * PAGE_SIZE


def kernel_has_populate() -> bool:
    """Linux 5.14 and on: ``MADV_POPULATE_WRITE``."""
    if platform.system() != "Linux":
        return False
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (5, 14)


def small_page_buffer(nbytes: int) -> np.ndarray:
    """Fresh zero pages of 4 KiB: a mapping of its own, kept off huge pages, so a page counts
    4 KiB in resident memory whatever the machine's huge-page setting."""
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buffer, np.uint8)


needs_linux = pytest.mark.skipif(platform.system() != "Linux",
                                 reason="madvise's populate and huge-page flags are Linux's")


@needs_linux
def test_populate_maps_the_pages_and_changes_nothing():
    buffer = small_page_buffer(64 * MiB)
    buffer[5 * MiB] = 7                          # one written before: kept
    assert resident(buffer) == PAGE_SIZE
    mapped = populate(buffer, 0, 32 * MiB)
    assert mapped == kernel_has_populate()
    if mapped:       # the range asked for (to the pages it starts and ends in), not the buffer
        assert 32 * MiB - PAGE_SIZE <= resident(buffer) <= 32 * MiB + 2 * PAGE_SIZE
    assert buffer[5 * MiB] == 7 and np.count_nonzero(buffer) == 1


@needs_linux
def test_populate_behind_maps_the_ranges_on_a_thread_of_its_own():
    buffer = small_page_buffer(48 * MiB)
    thread = populate_behind(buffer, [(40 * MiB, 48 * MiB), (0, 20 * MiB + 123)])
    assert thread.daemon and thread.name == "minilms-populate"
    thread.join(60)
    assert not thread.is_alive()
    if kernel_has_populate():   # 8 MiB and 20 MiB (to the page the range ends in)
        assert 28 * MiB < resident(buffer) <= 28 * MiB + 4 * PAGE_SIZE
    assert not np.count_nonzero(buffer)


@needs_linux
def test_populate_takes_an_unaligned_start_and_an_empty_range():
    buffer = small_page_buffer(8 * MiB)
    assert populate(buffer, 4 * MiB, 4 * MiB) == kernel_has_populate()
    assert populate(buffer, 1, 4 * MiB) == kernel_has_populate()   # from the next page boundary
    if kernel_has_populate():
        assert resident(buffer) == 4 * MiB - PAGE_SIZE
    assert not np.count_nonzero(buffer)


@pytest.mark.parametrize(("bits", "reclaims"), [
    ("0110010100000000", True),       # this project's VM: stats, deflate on OOM, reporting
    ("0110000100000000", False),      # a balloon without free page reporting
    (None, False)])                   # no balloon at all
def test_huge_pages_are_left_alone_unless_a_balloon_reports_free_pages(
        tmp_path, monkeypatch, bits, reclaims):
    if bits is not None:
        (tmp_path / "virtio3").mkdir()
        (tmp_path / "virtio3" / "features").write_text(bits + "\n")
    (tmp_path / "bind").write_text("")
    monkeypatch.setattr(pages, "BALLOONS", str(tmp_path))
    monkeypatch.setattr(pages, "_reclaims", [])
    assert pages.host_reclaims_huge_pages() is reclaims
    monkeypatch.setattr(pages, "BALLOONS", str(tmp_path / "absent"))
    assert pages.host_reclaims_huge_pages() is reclaims      # read once


@needs_linux
def test_small_pages_keeps_a_large_array_off_huge_pages_where_the_host_reclaims_them(
        monkeypatch):
    monkeypatch.setattr(pages, "_reclaims", [True])
    # Laid out as numpy's large arrays are: fresh pages of a mapping of their own, marked for
    # huge pages, the data after malloc's header (np.zeros itself may hand back memory malloc
    # had used and must clear, already resident: CI's machine did)
    mapping = mmap.mmap(-1, 64 * MiB + PAGE_SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    buffer = np.frombuffer(mapping, np.uint8, count=64 * MiB, offset=16)
    assert small_pages(buffer) and not small_pages(np.zeros(pages.HUGE_FROM // 2, np.uint8))
    buffer[32 * MiB] = 1
    assert resident(buffer) == PAGE_SIZE        # the page touched, not the 2 MiB around it
    monkeypatch.setattr(pages, "_reclaims", [False])
    assert not small_pages(np.zeros(64 * MiB, np.uint8))


@needs_linux
def test_the_cpu_device_prefaults_what_it_is_asked_and_not_more(monkeypatch):
    device = make_device("cpu", 256 * MiB)
    threads = []

    def counted(buffer, ranges):
        threads.append(populate_behind(buffer, ranges))
        return threads[-1]
    monkeypatch.setattr(cpu, "populate_behind", counted)
    arena = device._bytes(0, device.capacity)       # (huge pages, where the machine has them)
    beyond = arena[42 * MiB:]           # (past a huge page's worth of the 40 MiB asked)
    resident_beyond = resident(beyond)  # (the arena may be memory malloc had used before)
    device.prefault(40 * MiB)
    threads[-1].join(60)
    if kernel_has_populate():
        assert resident(arena[:40 * MiB]) >= 40 * MiB
        assert resident(beyond) == resident_beyond
    device.prefault(24 * MiB)           # asked already: nothing more
    device.prefault(10 * 1024 * MiB)    # beyond the arena: up to its end
    threads[-1].join(60)
    assert len(threads) == 2
    if kernel_has_populate():
        assert resident(arena) >= device.capacity
    assert not np.count_nonzero(arena)


def test_the_cpu_device_maps_the_ranges_asked_first_before_the_rest(monkeypatch):
    device = make_device("cpu", 64 * MiB)
    asked = []
    monkeypatch.setattr(cpu, "populate_behind", lambda buffer, ranges: asked.append(ranges))
    device.prefault(32 * MiB, [(20 * MiB, 24 * MiB), (2 * MiB, 3 * MiB), (3 * MiB, 5 * MiB),
                               (4 * MiB, 4 * MiB + 10), (30 * MiB, 40 * MiB), (8 * MiB, 8 * MiB)])
    # in the arena's order, touching and overlapping ones merged, empty ones left out, none
    # beyond what is asked; then the whole
    assert asked == [[[2 * MiB, 5 * MiB], [20 * MiB, 24 * MiB], [30 * MiB, 32 * MiB],
                      [0, 32 * MiB]]]
    device.prefault(48 * MiB, [(10 * MiB, 40 * MiB)])   # what is mapped already is not asked
    assert asked[1] == [[32 * MiB, 40 * MiB], [32 * MiB, 48 * MiB]]
