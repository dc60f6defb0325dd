"""The pool allocator: alignment, best fit, coalescing, placement at an offset, statistics,
errors."""
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minilms.device.pool import ALIGNMENT, Pool, align_up
from minilms.errors import OutOfDeviceMemory


def test_allocations_are_aligned_and_rounded_up():
    pool = Pool(10 * ALIGNMENT)
    a = pool.allocate(1, "a")
    b = pool.allocate(ALIGNMENT + 1, "b")
    assert (a.offset, a.nbytes) == (0, ALIGNMENT)
    assert (b.offset, b.nbytes) == (ALIGNMENT, 2 * ALIGNMENT)
    assert pool.stats().in_use == 3 * ALIGNMENT


def test_capacity_is_rounded_down_to_the_alignment():
    assert Pool(3 * ALIGNMENT + 17).capacity == 3 * ALIGNMENT


def test_best_fit_keeps_the_large_block_whole():
    pool = Pool(16 * ALIGNMENT)
    small_hole = pool.allocate(ALIGNMENT, "s")
    pool.allocate(ALIGNMENT, "keep")
    pool.free(small_hole)  # free: a 1-block hole at 0, and 14 blocks at the end
    again = pool.allocate(ALIGNMENT, "t")
    assert again.offset == 0
    assert pool.stats().largest_free == 14 * ALIGNMENT


def test_free_coalesces_with_both_neighbours():
    pool = Pool(3 * ALIGNMENT)
    a, b, c = (pool.allocate(ALIGNMENT, n) for n in "abc")
    pool.free(a)
    pool.free(c)
    assert pool.stats().free_blocks == 2 and pool.stats().fragmentation == 0.5
    pool.free(b)
    assert pool.free_blocks() == [(0, 3 * ALIGNMENT)]
    assert pool.stats().fragmentation == 0.0
    pool.check()


def test_allocate_at_a_planned_offset():
    pool = Pool(8 * ALIGNMENT)
    slot = pool.allocate(2 * ALIGNMENT, "planned", at=3 * ALIGNMENT)
    assert slot.offset == 3 * ALIGNMENT
    assert pool.free_blocks() == [(0, 3 * ALIGNMENT), (5 * ALIGNMENT, 3 * ALIGNMENT)]
    with pytest.raises(OutOfDeviceMemory):
        pool.allocate(ALIGNMENT, "clash", at=4 * ALIGNMENT)
    with pytest.raises(ValueError, match="not a multiple"):
        pool.allocate(ALIGNMENT, "odd", at=7)
    pool.check()


def test_peak_survives_frees_and_can_be_reset():
    pool = Pool(8 * ALIGNMENT)
    a = pool.allocate(5 * ALIGNMENT, "a")
    pool.free(a)
    assert pool.stats().peak == 5 * ALIGNMENT
    pool.reset_peak()
    assert pool.stats().peak == 0


def test_freeing_a_foreign_or_stale_slot_is_refused():
    pool = Pool(4 * ALIGNMENT)
    a = pool.allocate(ALIGNMENT, "a")
    pool.free(a)
    with pytest.raises(ValueError, match="did not hand out"):
        pool.free(a)


def test_exhaustion_names_the_request_the_free_space_and_the_holders():
    pool = Pool(4 * 2**20)
    pool.allocate(3 * 2**20, "conv1.out")
    pool.allocate(2**19, "fc.weight")
    with pytest.raises(OutOfDeviceMemory) as error:
        pool.allocate(2**20, "conv2.out")
    message = str(error.value)
    assert "\n" not in message
    for part in ("conv2.out asked for 1.00 MiB", "free 512.00 KiB of 4.00 MiB",
                 "largest free block 512.00 KiB", "conv1.out 3.00 MiB", "fc.weight 512.00 KiB",
                 "lms.enabled", "device.memory"):
        assert part in message


class PoolOperations(RuleBasedStateMachine):
    """Random allocate / allocate-at / free: blocks tile the pool, never overlap, stats agree."""

    def __init__(self):
        super().__init__()
        self.pool = Pool(64 * ALIGNMENT)
        self.held = []

    @rule(nbytes=st.integers(0, 20 * ALIGNMENT))
    def allocate(self, nbytes):
        largest = self.pool.stats().largest_free
        try:
            self.held.append(self.pool.allocate(nbytes, f"o{len(self.held)}"))
        except OutOfDeviceMemory:
            assert largest < align_up(max(nbytes, 1))
        else:
            assert largest >= align_up(max(nbytes, 1))

    @rule(block=st.integers(0, 63), blocks=st.integers(1, 8))
    def allocate_at(self, block, blocks):
        at, size = block * ALIGNMENT, blocks * ALIGNMENT
        fits = any(o <= at and at + size <= o + n for o, n in self.pool.free_blocks())
        try:
            slot = self.pool.allocate(size, "at", at=at)
        except OutOfDeviceMemory:
            assert not fits
        else:
            assert fits and slot.offset == at
            self.held.append(slot)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free(self, data):
        slot = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.pool.free(slot)

    @invariant()
    def consistent(self):
        self.pool.check()
        spans = sorted((s.offset, s.end) for s in self.held)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        stats = self.pool.stats()
        assert stats.in_use == sum(s.nbytes for s in self.held)
        assert stats.used_blocks == len(self.held)
        assert stats.free + stats.in_use == stats.capacity


TestPoolOperations = PoolOperations.TestCase
TestPoolOperations.settings = settings(max_examples=1000, stateful_step_count=40, deadline=None)
