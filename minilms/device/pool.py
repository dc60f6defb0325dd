"""Aligned sub-allocation of the device's one buffer.

The pool hands out byte ranges ``[offset, offset + nbytes)`` of a buffer of ``capacity`` bytes; it
never touches memory itself, so the same allocator serves the ``cpu`` and ``cuda`` devices and the
planner (which places blobs at offsets it computed, with ``allocate(..., at=offset)``).

Free space is kept as a sorted list of disjoint, coalesced blocks. Allocation is best fit (the
smallest free block that holds the request, lowest offset on a tie), which keeps large blocks intact
for the large activations that LMS moves around.
"""
import bisect
from dataclasses import dataclass

from .. import events
from ..errors import OutOfDeviceMemory
from ..sizes import format_bytes

ALIGNMENT = 256  # bytes: what cudaMalloc guarantees, and enough for any dtype and coalesced access


def align_up(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return -(-nbytes // alignment) * alignment


@dataclass(frozen=True)
class Slot:
    """A reserved byte range of the pool. ``nbytes`` is the aligned size actually reserved."""
    offset: int
    nbytes: int
    owner: str

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    @classmethod
    def make(cls, offset: int, nbytes: int, owner: str) -> "Slot":
        """``Slot(...)`` without the frozen dataclass's ``object.__setattr__`` per field: twice
        as fast, for the LMS planner's hundreds of thousands of placements."""
        slot = object.__new__(cls)
        slot.__dict__.update(offset=offset, nbytes=nbytes, owner=owner)
        return slot


@dataclass(frozen=True)
class PoolStats:
    capacity: int
    in_use: int
    peak: int
    free: int
    largest_free: int
    free_blocks: int
    used_blocks: int

    @property
    def fragmentation(self) -> float:
        """0 when all free space is one block; approaches 1 as it splinters."""
        return 0.0 if self.free == 0 else 1.0 - self.largest_free / self.free


class Pool:
    def __init__(self, capacity: int, alignment: int = ALIGNMENT, report: bool = True):
        """``report=False``: a pool that only plans (the LMS planner's), silent to the trace."""
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"pool alignment must be a power of two, found {alignment}")
        self.alignment = alignment
        self.capacity = capacity - capacity % alignment
        self._free_offsets: list[int] = [0] if self.capacity else []
        self._free_sizes: dict[int, int] = {0: self.capacity} if self.capacity else {}
        # the same blocks as (size, offset), sorted: best fit is one bisection, not a scan (the
        # LMS planner asks hundreds of thousands of times, of a pool split in hundreds of blocks)
        self._by_size: list[tuple[int, int]] = [(self.capacity, 0)] if self.capacity else []
        self._used: dict[int, Slot] = {}
        self.in_use = 0
        self.peak = 0
        self.report = report

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, nbytes: int, owner: str, at: int | None = None,
                 from_top: bool = False) -> Slot:
        """Reserve ``nbytes`` (rounded up to the alignment) for ``owner``; at ``at`` if given.
        ``from_top``: the highest free block that holds it, filled from its end (the planner
        keeps one-step workspace there, away from longer-lived blobs, to limit fragmentation)."""
        slot = self.try_allocate(nbytes, owner, at, from_top)
        if slot is None:
            size = align_up(max(nbytes, 1), self.alignment)
            raise OutOfDeviceMemory(self._exhausted_message(owner, nbytes, size, at))
        return slot

    def try_allocate(self, nbytes: int, owner: str, at: int | None = None,
                     from_top: bool = False) -> Slot | None:
        """``allocate``, or None where no free block holds the request. The LMS planner asks
        thousands of times per plan whether a blob fits; the error's message (every holder,
        sorted) would cost more than the answer."""
        if nbytes < 0:
            raise ValueError(f"{owner}: cannot allocate {nbytes} bytes")
        size = align_up(max(nbytes, 1), self.alignment)
        if at is not None:
            block = self._block_containing(at, size)
        else:
            block = self._top_fit(size) if from_top else self._best_fit(size)
        if block is None:
            return None
        if at is None:
            at = block + self._free_sizes[block] - size if from_top else block
        start = at
        self._carve(block, start, size)
        slot = Slot.make(start, size, owner)
        self._used[start] = slot
        self.in_use += size
        if self.in_use > self.peak:
            self.peak = self.in_use
        if self.report and events.listening:
            events.emit("alloc", owner, size, offset=start, in_use=self.in_use)
        return slot

    def free(self, slot: Slot) -> None:
        held = self._used.get(slot.offset)
        if held is not slot and held != slot:     # the same object, the common case, first
            raise ValueError(f"{slot.owner}: freeing a slot the pool did not hand out: {slot}")
        del self._used[slot.offset]
        self.in_use -= slot.nbytes
        self._insert_free(slot.offset, slot.nbytes)
        if self.report and events.listening:
            events.emit("free", slot.owner, slot.nbytes, offset=slot.offset, in_use=self.in_use)

    def _best_fit(self, size: int) -> int | None:
        """The smallest free block that holds ``size``, the lowest offset among equals."""
        i = bisect.bisect_left(self._by_size, (size, -1))
        return self._by_size[i][1] if i < len(self._by_size) else None

    def _top_fit(self, size: int) -> int | None:
        for offset in reversed(self._free_offsets):
            if self._free_sizes[offset] >= size:
                return offset
        return None

    def _block_containing(self, at: int, size: int) -> int | None:
        if at < 0 or at % self.alignment:
            raise ValueError(f"pool offset {at} is not a multiple of {self.alignment}")
        i = bisect.bisect_right(self._free_offsets, at) - 1
        if i < 0:
            return None
        offset = self._free_offsets[i]
        return offset if at + size <= offset + self._free_sizes[offset] else None

    def _carve(self, block: int, start: int, size: int) -> None:
        """Take ``[start, start+size)`` out of free block ``block``, keeping what is left around
        it."""
        block_size = self._free_sizes.pop(block)
        del self._free_offsets[bisect.bisect_left(self._free_offsets, block)]
        self._forget_size(block_size, block)
        if start > block:
            self._add_free(block, start - block)
        tail = block + block_size - (start + size)
        if tail:
            self._add_free(start + size, tail)

    def _add_free(self, offset: int, size: int) -> None:
        bisect.insort(self._free_offsets, offset)
        self._free_sizes[offset] = size
        bisect.insort(self._by_size, (size, offset))

    def _forget_size(self, size: int, offset: int) -> None:
        del self._by_size[bisect.bisect_left(self._by_size, (size, offset))]

    def _insert_free(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self._free_offsets, offset)
        if i < len(self._free_offsets) and self._free_offsets[i] == offset + size:  # merge right
            right = self._free_offsets.pop(i)
            right_size = self._free_sizes.pop(right)
            self._forget_size(right_size, right)
            size += right_size
        if i > 0:
            left = self._free_offsets[i - 1]
            left_size = self._free_sizes[left]
            if left + left_size == offset:  # merge left
                self._forget_size(left_size, left)
                self._free_sizes[left] = left_size + size
                bisect.insort(self._by_size, (left_size + size, left))
                return
        self._free_offsets.insert(i, offset)
        self._free_sizes[offset] = size
        bisect.insort(self._by_size, (size, offset))

    def copy(self) -> "Pool":
        """An independent pool in this one's state (slots are immutable, so they are shared):
        the LMS planner places the pinned blobs once and starts each candidate plan from a
        copy."""
        other = Pool.__new__(Pool)
        other.__dict__.update(self.__dict__)
        other._free_offsets = list(self._free_offsets)
        other._free_sizes = dict(self._free_sizes)
        other._by_size = list(self._by_size)
        other._used = dict(self._used)
        return other

    # -- reading ---------------------------------------------------------------------------------
    def stats(self) -> PoolStats:
        sizes = self._free_sizes.values()
        return PoolStats(self.capacity, self.in_use, self.peak, self.capacity - self.in_use,
                         max(sizes, default=0), len(self._free_sizes), len(self._used))

    def slots(self) -> list[Slot]:
        """Every slot in use, by offset."""
        return [self._used[offset] for offset in sorted(self._used)]

    def blocks(self) -> list[tuple[int, int, str | None]]:
        """Every block, used or free, by offset: ``(offset, nbytes, owner)``, owner None where
        free. The layout the LMS planner searches for a window to clear."""
        found = [(slot.offset, slot.nbytes, slot.owner) for slot in self._used.values()]
        found += [(offset, size, None) for offset, size in self.free_blocks()]
        found.sort()
        return found

    def free_blocks(self, start: int = 0) -> list[tuple[int, int]]:
        """The free blocks, by offset; those that begin at ``start`` or later, where given."""
        offsets = self._free_offsets
        if start:
            offsets = offsets[bisect.bisect_left(offsets, start):]
        return [(offset, self._free_sizes[offset]) for offset in offsets]

    def reset_peak(self) -> None:
        self.peak = self.in_use

    def check(self) -> None:
        """Assert the invariants: used and free blocks tile the buffer exactly, free blocks are
        coalesced, counters agree. Cheap enough for tests to call after every operation."""
        pieces = [(s.offset, s.nbytes, "used") for s in self._used.values()]
        pieces += [(o, n, "free") for o, n in self._free_sizes.items()]
        pieces.sort()
        position, previous = 0, None
        for offset, size, kind in pieces:
            assert offset == position, f"pool gap or overlap at {position}: next block at {offset}"
            assert size > 0 and offset % self.alignment == 0 and size % self.alignment == 0
            assert not (kind == previous == "free"), f"free blocks not coalesced at {offset}"
            position, previous = offset + size, kind
        assert position == self.capacity, f"pool blocks end at {position}, not {self.capacity}"
        assert self._free_offsets == sorted(self._free_sizes)
        assert self._by_size == sorted((n, o) for o, n in self._free_sizes.items())
        assert self.in_use == sum(s.nbytes for s in self._used.values()) <= self.peak

    def _exhausted_message(self, owner: str, nbytes: int, size: int, at: int | None) -> str:
        stats = self.stats()
        holders = sorted(self._used.values(), key=lambda s: -s.nbytes)
        shown = ", ".join(f"{s.owner} {format_bytes(s.nbytes)}" for s in holders[:5]) or "nobody"
        more = f" and {len(holders) - 5} more" if len(holders) > 5 else ""
        where = f" at offset {at}" if at is not None else ""
        return (f"out of device memory: {owner} asked for {format_bytes(nbytes)} ({size} bytes "
                f"aligned){where}; free {format_bytes(stats.free)} of "
                f"{format_bytes(stats.capacity)}, largest free block "
                f"{format_bytes(stats.largest_free)}; held by {shown}{more}. Turn LMS on "
                f"(lms.enabled) or raise device.memory")
