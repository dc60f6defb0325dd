"""Every state x every access of the blob state machine, in the spirit of Caffe's SyncedMemory test.

Each blob starts in a known state, with the host copy holding 1s and (where it is the truth) the
device copy holding 2s. An access must end in the stated state, make exactly the stated copies, and
show the stated values.
"""
import numpy as np
import pytest

from minilms import events
from minilms.blob import Blob, State

from .devices import KINDS, new_device

U, H, D, S = State.UNINITIALIZED, State.HOST, State.DEVICE, State.SYNCED


def blob_in(state: State, device) -> Blob:
    blob = Blob(device, "x", (3, 5), np.float32)
    blob.place()
    if state is H:
        blob.mutable_host_data()[...] = 1
    elif state is D:
        device.h2d(blob.mutable_device_data(), np.full(blob.shape, 2, np.float32))
    elif state is S:
        blob.mutable_host_data()[...] = 1
        blob.device_data()
    assert blob.state is state
    return blob


def host_read(b):
    return b.host_data()


def host_write(b):
    return b.mutable_host_data()


def device_read(b):
    return b.device.to_host(b.device_data())


def device_write(b):
    return b.device.to_host(b.mutable_device_data())


def device_overwrite(b):
    b.mutable_device_data(overwrite=True)
    return None  # contents undefined on purpose


def release_needed(b):
    b.release(needed_later=True)
    return b.host_data() if b.state is not U else None


def release_dead(b):
    b.release(needed_later=False)
    return None


ACCESSES = [host_read, host_write, device_read, device_write, device_overwrite, release_needed,
            release_dead]

# (state before, access) -> (state after, H2D copies, D2H copies, value seen or None)
EXPECTED = {
    (U, host_read): (H, 0, 0, 0), (U, host_write): (H, 0, 0, 0),
    (U, device_read): (D, 0, 0, 0), (U, device_write): (D, 0, 0, 0),
    (U, device_overwrite): (D, 0, 0, None),
    (U, release_needed): (U, 0, 0, None), (U, release_dead): (U, 0, 0, None),

    (H, host_read): (H, 0, 0, 1), (H, host_write): (H, 0, 0, 1),
    (H, device_read): (S, 1, 0, 1), (H, device_write): (D, 1, 0, 1),
    (H, device_overwrite): (D, 0, 0, None),
    (H, release_needed): (H, 0, 0, 1), (H, release_dead): (H, 0, 0, None),

    (D, host_read): (S, 0, 1, 2), (D, host_write): (H, 0, 1, 2),
    (D, device_read): (D, 0, 0, 2), (D, device_write): (D, 0, 0, 2),
    (D, device_overwrite): (D, 0, 0, None),
    (D, release_needed): (H, 0, 1, 2), (D, release_dead): (U, 0, 0, None),

    (S, host_read): (S, 0, 0, 1), (S, host_write): (H, 0, 0, 1),
    (S, device_read): (S, 0, 0, 1), (S, device_write): (D, 0, 0, 1),
    (S, device_overwrite): (D, 0, 0, None),
    (S, release_needed): (H, 0, 0, 1), (S, release_dead): (H, 0, 0, None),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("state", [U, H, D, S], ids=lambda s: s.value)
@pytest.mark.parametrize("access", ACCESSES, ids=lambda f: f.__name__)
def test_transition(kind, state, access):
    after, h2d, d2h, value = EXPECTED[(state, access)]
    with new_device(kind, 4096) as device:
        blob = blob_in(state, device)
        with events.listen() as got:
            seen = access(blob)
        copies = [e.kind for e in got if e.kind in ("h2d", "d2h")]
        assert blob.state is after
        assert (copies.count("h2d"), copies.count("d2h")) == (h2d, d2h)
        if value is not None:
            np.testing.assert_array_equal(seen, np.full(blob.shape, value, np.float32))
        released = access in (release_needed, release_dead)
        assert blob.placed is not released
        assert device.pool.stats().in_use == (0 if released else 256)


def test_every_transition_is_specified():
    assert len(EXPECTED) == 4 * len(ACCESSES)


@pytest.mark.parametrize("kind", KINDS)
def test_device_data_places_an_unplaced_blob_and_release_needs_a_slot(kind):
    with new_device(kind, 4096) as device:
        blob = Blob(device, "y", (4,), np.int32)
        blob.mutable_host_data()[...] = [1, 2, 3, 4]
        assert not blob.placed
        np.testing.assert_array_equal(device.to_host(blob.device_data()), [1, 2, 3, 4])
        assert blob.placed and blob.state is S
        blob.release()
        with pytest.raises(RuntimeError, match="not placed"):
            blob.release()
        with pytest.raises(RuntimeError, match="already placed"):
            blob.place()
            blob.place()


def test_host_data_is_read_only():
    with new_device("cpu", 4096) as device:
        blob = Blob(device, "z", (2,))
        with pytest.raises(ValueError):
            blob.host_data()[0] = 1.0


def test_unknown_role_is_refused():
    with new_device("cpu", 4096) as device:
        with pytest.raises(ValueError, match="role must be one of"):
            Blob(device, "w", (2,), role="weights")
