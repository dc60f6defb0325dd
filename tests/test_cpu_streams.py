"""The ``cpu`` device's streams: a compute thread that waits for a copy does the copy streams' work
(the next item, in order; pieces of a large copy under way), every byte lands, a stream's order
holds, and a failed piece is reported as a failed copy, with nothing left hanging."""
import threading

import numba
import numpy as np
import pytest

from minilms.device import cpu_streams, make_device, streaming
from minilms.device.cpu_streams import CpuEvent, CpuStream, SplitCopy


@pytest.fixture(autouse=True)
def copies_on_their_threads(monkeypatch):
    """The copy streams' threads whatever cores this machine has (``cpu_streams.copy_threads``
    keeps copies where issued where every core computes): what these tests are about; a test
    of copies where issued sets the switch itself."""
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", True)


def test_a_waiting_compute_thread_copies_pieces_of_a_copy_under_way(monkeypatch):
    """The copy thread holds its first piece until the waiting (compute) thread has copied one:
    without the help the wait would time out; with it, both threads copied pieces and every byte
    is there."""
    monkeypatch.setattr(cpu_streams, "SPLIT", 1 << 16)
    began, helped = threading.Event(), threading.Event()
    by_thread = []
    real_copy = SplitCopy._copy

    def copy(self, piece):
        by_thread.append(threading.current_thread().name)
        if threading.current_thread().name == "minilms-h2d" and not helped.is_set():
            began.set()
            assert helped.wait(10), "the waiting thread never helped"
        real_copy(self, piece)
        if threading.current_thread() is threading.main_thread():
            helped.set()
    monkeypatch.setattr(SplitCopy, "_copy", copy)
    nbytes = 64 << 16
    with make_device("cpu", nbytes) as device:
        view = device.view(device.pool.allocate(nbytes, "x"), (nbytes // 4,), np.float32)
        host = np.arange(nbytes // 4, dtype=np.float32)
        device.h2d(view, host, stream=device.h2d_stream)
        assert began.wait(10)              # the copy is under way on its own thread
        arrived = device.event()
        arrived.record(device.h2d_stream)
        arrived.wait(device.compute_stream)
        assert arrived.query()
        np.testing.assert_array_equal(view, host)
    assert len(by_thread) == 64
    assert {"minilms-h2d", threading.main_thread().name} <= set(by_thread)


def test_a_waiting_thread_runs_the_queued_items_itself_in_order(monkeypatch):
    """A copy stream whose thread never runs: the wait alone takes its items, one after another,
    so the later copy into the same place wins and the event after both completes."""
    monkeypatch.setattr(cpu_streams, "SPLIT", 256)
    with monkeypatch.context() as unstarted:
        unstarted.setattr(cpu_streams.threading.Thread, "start", lambda thread: None)
        idle = CpuStream("h2d", threaded=True)
    compute = CpuStream("compute", threaded=False)
    dst = np.zeros(1000, np.float32)
    first, second = np.full(1000, 1, np.float32), np.full(1000, 2, np.float32)
    landed = []
    idle.submit(SplitCopy(dst, first, lambda started: landed.append(1)))     # in pieces
    idle.submit(lambda: np.copyto(dst, second))                               # whole
    done = CpuEvent(helped=(idle,))
    done.record(idle)
    assert not done.query()
    waiting = threading.Thread(target=done.wait, args=(compute,), daemon=True)
    waiting.start()
    waiting.join(10)                      # a wait that does not run the items would hang
    assert done.query() and landed == [1]
    np.testing.assert_array_equal(dst, second)


def test_without_help_a_wait_only_waits(monkeypatch):
    """``HELP_WHILE_WAITING`` off (the benchmark's baseline): copies go whole and a wait does
    none of the copy streams' work."""
    monkeypatch.setattr(cpu_streams, "HELP_WHILE_WAITING", False)
    monkeypatch.setattr(cpu_streams, "SPLIT", 1 << 10)
    pieces = []
    monkeypatch.setattr(SplitCopy, "_copy", lambda self, piece: pieces.append(piece))
    nbytes = 1 << 16
    with make_device("cpu", nbytes) as device:
        view = device.view(device.pool.allocate(nbytes, "x"), (nbytes,), np.uint8)
        device.h2d(view, np.ones(nbytes, np.uint8), stream=device.h2d_stream)
        arrived = device.event()
        arrived.record(device.h2d_stream)
        arrived.wait(device.compute_stream)
        assert pieces == [] and view.min() == 1


def test_a_failed_piece_fails_its_copy_and_nothing_hangs(monkeypatch):
    monkeypatch.setattr(cpu_streams, "SPLIT", 1 << 10)
    real_copy = streaming.copy
    calls = []

    def copy(dst, src, parallel=False, cached=False):    # a piece's copy, the fifth failing
        assert not parallel                # a piece stays on the thread that claimed it
        calls.append(1)
        if len(calls) == 5:
            raise MemoryError("a planted failure")
        real_copy(dst, src, cached=cached)
    monkeypatch.setattr(streaming, "copy", copy)
    nbytes = 1 << 14
    with make_device("cpu", nbytes) as device:
        view = device.view(device.pool.allocate(nbytes, "x"), (nbytes,), np.uint8)
        device.h2d(view, np.ones(nbytes, np.uint8), stream=device.h2d_stream)
        with pytest.raises(RuntimeError, match="h2d stream failed"):
            device.synchronize()
        assert len(calls) == 16            # every piece was tried: the copy waited for them all
        device.h2d(view, np.full(nbytes, 3, np.uint8), stream=device.h2d_stream)
        device.synchronize()              # the stream still works
        assert view.min() == 3


def test_which_copies_go_in_pieces(monkeypatch):
    """Above ``SPLIT`` (however large: the pieces stream as a whole copy does), contiguous, on a
    stream whose copies go to its thread, and only while waits help."""
    monkeypatch.setattr(cpu_streams, "SPLIT", 16)
    stream = CpuStream("h2d", threaded=False)        # no thread needed to ask
    stream.threaded = True
    a, b = np.zeros(32, np.uint8), np.ones(32, np.uint8)
    assert cpu_streams.splits(a, b, stream)
    assert not cpu_streams.splits(a[:16], b[:16], stream)               # small: whole
    assert cpu_streams.splits(np.zeros(1 << 27, np.uint8), np.ones(1 << 27, np.uint8), stream)
    grid = np.zeros((8, 8), np.uint8)
    assert not cpu_streams.splits(grid[:, :5], np.ones((8, 5), np.uint8), stream)  # not contiguous
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", False)             # copies where issued
    assert not cpu_streams.splits(a, b, stream)
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", True)
    monkeypatch.setattr(cpu_streams, "HELP_WHILE_WAITING", False)
    assert not cpu_streams.splits(a, b, stream)


@pytest.mark.parametrize("cores, threads, linked, on_threads", [
    (2, 2, False, False),      # every core computes: copies where issued
    (2, 2, True, True),        # a link's hold must overlap the kernels
    (4, 2, False, True),       # a core free for the copies
    (1, 1, False, False)])
def test_copy_threads_where_a_core_is_free_or_a_link_must_overlap(monkeypatch, cores, threads,
                                                                   linked, on_threads):
    """``copy_threads``' rule, unless ``COPY_THREADS`` says; and a device's copy stream follows
    it: its copy has landed when ``h2d`` returns where copies run where issued."""
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", None)
    monkeypatch.setattr(cpu_streams.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(numba, "get_num_threads", lambda: threads)   # asked at the call
    assert cpu_streams.copy_threads(linked) == on_threads
    for forced in (True, False):
        monkeypatch.setattr(cpu_streams, "COPY_THREADS", forced)
        assert cpu_streams.copy_threads(linked) == forced
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", None)
    with make_device("cpu", 1 << 12, link=1000.0 if linked else None) as device:
        assert device.h2d_stream.copies_on_thread() == on_threads
        view = device.view(device.pool.allocate(1024, "x"), (256,), np.float32)
        gate = threading.Event()
        if on_threads:
            device.h2d_stream.submit(lambda: gate.wait(10))   # holds the stream's thread
        device.h2d(view, np.arange(256, dtype=np.float32), stream=device.h2d_stream)
        # where issued, it has landed on return; on the thread, it waits behind the held item
        assert np.array_equal(view, np.arange(256)) != on_threads
        gate.set()
        device.synchronize()
        np.testing.assert_array_equal(view, np.arange(256))


def test_without_copy_threads_a_copy_stream_runs_its_work_in_order_where_submitted(monkeypatch):
    """``COPY_THREADS`` off: what a copy stream's thread still holds runs first, then the new
    work, in the submitting thread; its event is complete at once; a failure surfaces there."""
    landed = []
    with make_device("cpu", 1 << 12) as device:
        stream = device.h2d_stream
        gate = threading.Event()
        stream.submit(lambda: (gate.wait(10),
                               landed.append(("queued", threading.current_thread()))))
        monkeypatch.setattr(cpu_streams, "COPY_THREADS", False)
        gate.set()
        stream.submit(lambda: landed.append(("inline", threading.current_thread())))
        assert [name for name, _ in landed] == ["queued", "inline"]
        assert landed[0][1] is not threading.current_thread()
        assert landed[1][1] is threading.current_thread()
        done = device.event()
        done.record(stream)
        assert done.query()
        assert not cpu_streams.splits(np.zeros(1 << 24, np.uint8), np.ones(1 << 24, np.uint8),
                                      stream)
        with pytest.raises(RuntimeError, match="h2d stream failed"):
            stream.submit(lambda: 1 / 0)
        stream.submit(lambda: landed.append(("after", threading.current_thread())))
        assert landed[-1][0] == "after"


def test_work_run_where_submitted_leaves_the_streams_thread_asleep(monkeypatch):
    """``COPY_THREADS`` off, the stream idle: an item, an event's record and a failure each
    run in the submitting thread without notifying the stream's waiting thread (a wake-up for
    nothing took the GIL and a core from the kernels: ``CpuStream._run_here``)."""
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", False)
    with make_device("cpu", 1 << 12) as device:
        stream = device.d2h_stream
        notified = []
        real = stream._changed.notify_all
        monkeypatch.setattr(stream._changed, "notify_all",
                            lambda: (notified.append(1), real()))
        ran = []
        stream.submit(lambda: ran.append(threading.current_thread()))
        done = device.event()
        done.record(stream)
        with pytest.raises(RuntimeError, match="d2h stream failed"):
            stream.submit(lambda: 1 / 0)
        stream.submit(lambda: ran.append(threading.current_thread()))
        assert ran == [threading.current_thread()] * 2 and done.query() and notified == []


def test_an_event_recorded_where_work_runs_at_once_is_complete_and_timed(monkeypatch):
    """Recorded on a stream whose work runs at submit (the compute stream; a copy stream with
    ``COPY_THREADS`` off), an event is complete at once and keeps the time after the stream's
    earlier work; one recorded next on a stream with its thread is not complete until the work
    ahead of it is done (the complete state the first ones share is never the second's)."""
    import time
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", False)
    with make_device("cpu", 1 << 12) as device:
        assert device.event().query()                   # never recorded: complete
        start, end = device.event(timing=True), device.event(timing=True)
        start.record(device.h2d_stream)
        device.h2d_stream.submit(lambda: time.sleep(0.02))
        end.record(device.h2d_stream)
        assert start.query() and end.query()
        assert start.elapsed_time(end) >= 20.0 * 0.9
        monkeypatch.setattr(cpu_streams, "COPY_THREADS", True)
        gate = threading.Event()
        device.h2d_stream.submit(lambda: gate.wait(10))
        later = device.event()
        later.record(device.h2d_stream)
        assert not later.query() and start.query()
        gate.set()
        later.synchronize()
        assert later.query()
