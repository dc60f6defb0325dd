"""Property tests of the memory core: random sequences of place / read / write / release / evict
over many blobs on a small device never lose data (checked against a shadow copy), never hand out
overlapping pool space, and keep the pool's statistics consistent. On ``cpu`` and on ``cuda``
(the Numba simulator when there is no GPU)."""
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from minilms.blob import Blob, State
from minilms.device.pool import align_up
from minilms.errors import OutOfDeviceMemory

from .devices import new_device

CAPACITY = 8 * 1024
DTYPES = (np.float32, np.float64, np.int32, np.uint8)


def machine_for(kind: str):
    class MemoryCore(RuleBasedStateMachine):
        """Blobs, each with a shadow: the values a correct memory core must give back."""

        @initialize(shapes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12)),
                                    min_size=2, max_size=8),
                    dtypes=st.lists(st.sampled_from(DTYPES), min_size=8, max_size=8))
        def make_blobs(self, shapes, dtypes):
            self.device = new_device(kind, CAPACITY)
            self.blobs = [Blob(self.device, f"b{i}", shape, dtype)
                          for i, (shape, dtype) in enumerate(zip(shapes, dtypes))]
            self.shadow = {b.name: np.zeros(b.shape, b.dtype) for b in self.blobs}
            self.rng = np.random.default_rng(0)

        def teardown(self):
            if hasattr(self, "device"):
                self.device.close()

        def _values(self, blob):
            return self.rng.integers(0, 100, blob.shape).astype(blob.dtype)

        def _place(self, blob) -> bool:
            """Place ``blob`` if it is not; False (and check the refusal was right) when full."""
            if blob.placed:
                return True
            largest_free = self.device.pool.stats().largest_free
            try:
                blob.place()
            except OutOfDeviceMemory:
                assert largest_free < align_up(blob.nbytes), "refused although a block was free"
                return False
            return True

        blob_index = st.integers(0, 7)

        @rule(i=blob_index)
        def place(self, i):
            self._place(self.blobs[i % len(self.blobs)])

        @rule(i=blob_index)
        def write_host(self, i):
            blob = self.blobs[i % len(self.blobs)]
            values = self._values(blob)
            blob.mutable_host_data()[...] = values
            self.shadow[blob.name] = values

        @rule(i=blob_index, overwrite=st.booleans())
        def write_device(self, i, overwrite):
            blob = self.blobs[i % len(self.blobs)]
            if not self._place(blob):
                return
            values = self._values(blob)
            view = blob.mutable_device_data(overwrite=overwrite)
            self.device.h2d(view, values)  # stands in for a kernel writing its output
            self.shadow[blob.name] = values

        @rule(i=blob_index)
        def read_host(self, i):
            blob = self.blobs[i % len(self.blobs)]
            np.testing.assert_array_equal(blob.host_data(), self.shadow[blob.name])

        @rule(i=blob_index)
        def read_device(self, i):
            blob = self.blobs[i % len(self.blobs)]
            if self._place(blob):
                got = self.device.to_host(blob.device_data())
                np.testing.assert_array_equal(got, self.shadow[blob.name])

        @rule(i=blob_index, asynchronous=st.booleans())
        def evict(self, i, asynchronous):
            """Release a blob that is still needed: a dirty one must be swapped out."""
            blob = self.blobs[i % len(self.blobs)]
            if not blob.placed:
                return
            was = blob.state
            stream = self.device.d2h_stream if asynchronous else None
            action = blob.release(needed_later=True, stream=stream)
            if stream is not None:  # the contract: order reuse of the space after the copy
                done = self.device.event()
                done.record(stream)
                done.synchronize()
            assert action == {State.DEVICE: "swap_out", State.SYNCED: "drop"}.get(was, "free")

        @rule(i=blob_index)
        def release_dead(self, i):
            """Release a blob with no future use: dropped, never copied; dirty data is discarded."""
            blob = self.blobs[i % len(self.blobs)]
            if not blob.placed:
                return
            was = blob.state
            action = blob.release(needed_later=False)
            assert action != "swap_out"
            if was is State.DEVICE:
                assert blob.state is State.UNINITIALIZED
                self.shadow[blob.name] = np.zeros(blob.shape, blob.dtype)  # reads see zeros

        @invariant()
        def pool_is_consistent(self):
            if not hasattr(self, "device"):
                return
            pool = self.device.pool
            pool.check()
            placed = sorted((b.slot for b in self.blobs if b.placed), key=lambda s: s.offset)
            assert placed == pool.slots()
            for left, right in zip(placed, placed[1:]):
                assert left.end <= right.offset, f"{left} overlaps {right}"
            for b in self.blobs:
                if b.slot is not None:
                    assert b.nbytes <= b.slot.nbytes
            stats = pool.stats()
            assert stats.in_use == sum(s.nbytes for s in placed)
            assert stats.free == stats.capacity - stats.in_use
            assert stats.largest_free <= stats.free and stats.peak >= stats.in_use
            assert 0.0 <= stats.fragmentation < 1.0

        @invariant()
        def head_state_matches_placement(self):
            for b in getattr(self, "blobs", ()):
                if b.state in (State.DEVICE, State.SYNCED):
                    assert b.placed, f"{b.name} has its head on the device but no slot"

    return MemoryCore


SETTINGS = settings(max_examples=1000, stateful_step_count=30, deadline=None)

TestMemoryCoreCpu = machine_for("cpu").TestCase
TestMemoryCoreCpu.settings = SETTINGS

TestMemoryCoreCuda = machine_for("cuda").TestCase
TestMemoryCoreCuda.settings = SETTINGS
TestMemoryCoreCuda = pytest.mark.cuda(TestMemoryCoreCuda)
