"""The tracer hook: every allocation, free, copy and state change is reported, and costs nothing
when nobody listens."""
import numpy as np
import pytest

from minilms import events
from minilms.blob import Blob

from .devices import KINDS, new_device


def exercise(device):
    blob = Blob(device, "act", (8, 8), np.float32, role="activation")
    blob.mutable_host_data()[...] = 1
    blob.device_data()
    blob.mutable_device_data()
    blob.release(needed_later=True)
    blob.device_data()
    blob.release(needed_later=False)
    return blob


def test_nothing_is_built_when_nobody_listens(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an event was emitted with no listener")
    monkeypatch.setattr(events, "emit", refuse)
    assert not events.listening
    with new_device("cpu", 4096) as device:
        exercise(device)


@pytest.mark.parametrize("kind", KINDS)
def test_every_alloc_free_copy_and_state_change_is_reported(kind):
    with new_device(kind, 4096) as device:
        with events.listen() as got:
            exercise(device)
    assert not events.listening
    kinds = [e.kind for e in got]
    assert kinds.count("alloc") == kinds.count("free") == 2
    assert kinds.count("h2d") == 2 and kinds.count("d2h") == 1 and kinds.count("drop") == 1
    states = [(e.detail["before"], e.detail["after"]) for e in got if e.kind == "state"]
    assert states == [("uninitialized", "host"), ("host", "synced"), ("synced", "device"),
                      ("device", "host"), ("host", "synced"), ("synced", "host")]
    assert all(e.who == "act" for e in got)
    assert all(e.nbytes == (256 if e.kind in ("alloc", "free") else 256) for e in got)
    times = [e.time for e in got]
    assert times == sorted(times)
    allocs = [e for e in got if e.kind == "alloc"]
    assert allocs[0].detail == {"offset": 0, "in_use": 256}


def test_listeners_nest_and_unsubscribe():
    outer, inner = [], []
    with events.listen(outer.append):
        with events.listen(inner.append):
            events.emit("x", "a")
        events.emit("y", "b")
    assert [e.kind for e in outer] == ["x", "y"] and [e.kind for e in inner] == ["x"]
    assert not events.listening
