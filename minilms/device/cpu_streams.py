"""Streams and events of the ``cpu`` device, as CUDA's behave: work on a stream runs in order,
events order work between streams.

The compute stream runs work at once in the calling thread (kernels are synchronous on the host).
Each copy stream (``h2d``, ``d2h``) has a thread of its own, and ``numpy.copyto`` releases the
GIL, so copies each way overlap with compute and with each other.

A waiting compute thread helps. On a GPU the copy engines move the bytes and a stalled host loses
nothing; here copies take the same cores as the kernels, and while the compute thread waits for a
copy it would sit idle beside it. So a wait on the compute stream for an event of a copy stream
(``CpuEvent.wait``) does the streams' work itself: it runs the next item of the event's stream if
that stream's thread has not started it (``CpuStream.run_next``: still in order, one item at a
time), and it copies pieces of a large copy under way on either copy stream (``SplitCopy``: a copy
of more than ``SPLIT`` bytes goes in pieces that any thread may claim, and the copy is complete
when all are). Two threads copy a large block faster than one where memory, not a core, bounds
one thread's copy, as on the machines measured (docs/benchmarks.md). Each piece, as each whole
copy, goes through ``streaming.copy``.

Where the copy threads run (``copy_threads``): only where a core is free for them, beside the
kernels' threads (``os.cpu_count()`` above ``numba.get_num_threads()``), or where the device has a
``Link``, whose hold is a wait that must overlap the kernels. Elsewhere each copy stream's work runs
at once in the thread that submits it, as the compute stream's: a valid order of the same work
(CUDA's ``CUDA_LAUNCH_BLOCKING``), where no copy overlaps a kernel and none takes a core from one,
and a large copy is shared out to the kernels' threads (``streaming.copy``'s ``parallel``), which
would otherwise wait for it.
With every core computing, a copy thread is one thread more than there are cores, and the
kernels' threads, which work in step, wait for the one it displaced (measured on two cores:
docs/benchmarks.md, "Why the code chose", session 44). ``COPY_THREADS`` True or False overrides
the rule
(the benchmark's A/B, ``scripts/bench_copy.py --switch threads``, and the tests of either mode).
"""
import collections
import os
import threading

import numpy as np

from .. import events
from ..lazy import LazyModule

streaming = LazyModule("minilms.device.streaming")    # numba's: at the first copy

__all__ = ["COPY_THREADS", "HELP_WHILE_WAITING", "SPLIT", "CpuStream", "CpuEvent", "SplitCopy",
           "copy_threads", "splits"]

HELP_WHILE_WAITING = True    # False: a wait only waits and copies go whole (the benchmark's A/B)
COPY_THREADS = None          # None: ``copy_threads``' rule; True, False: always, never (the same)
SPLIT = 1 << 20          # bytes: larger copies go in pieces of this size (each streamed:
#                          ``streaming``; before the pieces streamed, a copy of over 64 MiB went
#                          whole, where memcpy's own non-temporal path ran faster than pieces)
HELP_WAIT_SECONDS = 2e-4  # between looks for work to help with, while a wait has none


def copy_threads(linked: bool = False) -> bool:
    """Whether copy streams run their work on threads of their own (the module docstring):
    ``COPY_THREADS`` where set, else where a core is free beside the kernels' threads or the
    device has a link (``linked``)."""
    if COPY_THREADS is not None:
        return COPY_THREADS
    return _core_free_or(linked)


def _core_free_or(linked: bool) -> bool:
    import numba  # here, not at import: planning never asks, nor needs numba
    return linked or (os.cpu_count() or 1) > numba.get_num_threads()


def splits(dst: np.ndarray, src: np.ndarray, stream: "CpuStream") -> bool:
    """Whether a copy on ``stream`` goes in pieces (``SplitCopy``) rather than whole: only where
    another thread may share them."""
    return HELP_WHILE_WAITING and stream.copies_on_thread() and SPLIT < dst.nbytes and \
        dst.flags.c_contiguous and src.flags.c_contiguous


class SplitCopy:
    """``dst[...] = src`` (C-contiguous, equal bytes) in pieces of ``SPLIT`` bytes that the stream's
    thread and a waiting thread share (``help``); as an item of a stream, complete when every
    piece is, then ``after(started)`` (the link's hold, the trace's event). A piece that fails
    fails the copy, and the stream reports it as any failed item. ``cached``: as
    ``streaming.copy``'s."""

    def __init__(self, dst: np.ndarray, src: np.ndarray, after, cached: bool = False):
        self.dst = dst.reshape(-1).view(np.uint8)
        self.src = src.reshape(-1).view(np.uint8)
        self.after, self.cached = after, cached
        self.pieces = -(-self.dst.size // SPLIT)
        self.error: BaseException | None = None
        self._next = self._done = 0
        self._lock = threading.Lock()
        self._all_done = threading.Event()

    def left(self) -> bool:
        """Whether some piece is still unclaimed."""
        return self._next < self.pieces

    def _claim(self):
        with self._lock:
            if self._next >= self.pieces:
                return None
            piece, self._next = self._next, self._next + 1
            return piece

    def _copy(self, piece: int) -> None:
        at = piece * SPLIT
        try:
            streaming.copy(self.dst[at:at + SPLIT], self.src[at:at + SPLIT], cached=self.cached)
        except BaseException as error:   # re-raised by the stream's item (__call__)
            self.error = error
        finally:
            with self._lock:
                self._done += 1
                if self._done == self.pieces:
                    self._all_done.set()

    def help(self) -> bool:
        """Copy unclaimed pieces until none is left; False if there was none."""
        piece = self._claim()
        if piece is None:
            return False
        while piece is not None:
            self._copy(piece)
            piece = self._claim()
        return True

    def __call__(self) -> None:
        started = events.clock()
        self.help()
        self._all_done.wait()      # pieces other threads claimed
        if self.error is not None:
            raise self.error
        self.after(started)


class CpuStream:
    def __init__(self, name: str, threaded: bool, linked: bool = False):
        """``threaded``: a copy stream, with a thread of its own for its work where
        ``copy_threads(linked)`` (``linked``: the device has a ``Link``)."""
        self.name = name
        self.threaded = threaded
        # the rule's answer, worked out once: os.cpu_count() costs microseconds a call, and a
        # stream is asked at every submit (``COPY_THREADS`` is still read each time)
        self._by_rule = threaded and _core_free_or(linked)
        self.running = None          # the item under way (a thread may help a SplitCopy)
        self._error: BaseException | None = None
        self._items: collections.deque = collections.deque()
        self._busy = False           # an item is under way: the next waits for it
        self._changed = threading.Condition()
        if threaded:
            threading.Thread(target=self._serve, name=f"minilms-{name}", daemon=True).start()

    def submit(self, work) -> None:
        self._raise_pending()
        if not self.threaded:
            work()
            return
        if not self.copies_on_thread():   # here and now, after what the thread still has
            self.synchronize()
            self._run_here(work)
            return
        with self._changed:
            self._items.append(work)
            self._changed.notify_all()

    def copies_on_thread(self) -> bool:
        """Whether work submitted now goes to the stream's thread (``copy_threads``)."""
        if not self.threaded:
            return False
        return self._by_rule if COPY_THREADS is None else COPY_THREADS

    def synchronize(self) -> None:
        if self.threaded:
            with self._changed:
                while self._items or self._busy:
                    self._changed.wait()
        self._raise_pending()

    def close(self) -> None:
        if self.threaded:
            with self._changed:
                self._items.append(None)
                self._changed.notify_all()

    def run_next(self) -> bool:
        """Run the next item here, in order, if none of this stream's is under way; False if
        there was none to run."""
        with self._changed:
            if self._busy or not self._items or self._items[0] is None:
                return False
            work = self._items.popleft()
            self._busy, self.running = True, work
            self._changed.notify_all()      # the stream's thread may help with it
        self._run(work)
        return True

    def _run_here(self, work) -> None:
        """``work`` on the calling thread, the stream idle, and a failure reported as a failed
        item of the thread's is. The stream's thread, waiting for items, is not notified: woken
        for nothing at every copy and event, it took the GIL and a core from the kernels' thread
        (docs/benchmarks.md, session 67)."""
        try:
            work()
        except BaseException as error:
            self._error = error
        self._raise_pending()

    def _run(self, work) -> None:
        try:
            work()
        except BaseException as error:  # surfaced on the next submit/synchronize
            self._error = error
        finally:
            with self._changed:
                self._busy, self.running = False, None
                self._changed.notify_all()

    def _serve(self) -> None:
        """The stream's thread: the next item when none is under way, else pieces of the copy
        that another thread runs."""
        while True:
            with self._changed:
                while True:
                    running = self.running
                    if not self._busy and self._items:
                        work = self._items.popleft()
                        if work is None:
                            return
                        self._busy, self.running, running = True, work, None
                        break
                    if self._busy and isinstance(running, SplitCopy) and running.left():
                        break
                    self._changed.wait()
            if running is None:
                self._run(work)
            else:
                running.help()

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"a copy on the {self.name} stream failed") from error

    def __repr__(self) -> str:
        return f"<CpuStream {self.name}>"


_COMPLETE = threading.Event()      # the state of an event never recorded, or recorded where
_COMPLETE.set()                    # its stream's work runs at once: set, and never cleared


class CpuEvent:
    """A marker in a stream. As in CUDA, an event never recorded counts as complete, and ``wait``
    waits for the latest ``record`` made before it. ``helped``: the copy streams a wait on the
    compute stream works for while it waits (the module docstring)."""

    def __init__(self, timing: bool = False, helped: tuple = ()):
        self._done = _COMPLETE
        self._recorded_on: CpuStream | None = None
        self.helped = helped
        self.timing = timing
        self.time: float | None = None

    def record(self, stream: CpuStream) -> None:
        self._recorded_on = stream
        if not stream.copies_on_thread():   # runs at submit, after the stream's earlier work:
            stream.submit(self._stamp)      # complete when submit returns, no Event to make
            self._done = _COMPLETE          # (an LMS iteration records a hundred or more)
            return
        done = self._done = threading.Event()

        def mark():
            self.time = events.clock()
            done.set()
        stream.submit(mark)

    def _stamp(self) -> None:
        self.time = events.clock()

    def wait(self, stream: CpuStream) -> None:
        source = self._recorded_on
        if stream.threaded or source is None or not source.threaded or not HELP_WHILE_WAITING:
            stream.submit(self._done.wait)
            return
        done = self._done       # the compute stream: wait here, doing the copies' work
        while not done.is_set():
            if not (source.run_next() or self._help_a_copy()):
                done.wait(HELP_WAIT_SECONDS)    # a copy may start that there is help for

    def _help_a_copy(self) -> bool:
        for stream in self.helped:
            running = stream.running
            if isinstance(running, SplitCopy) and running.help():
                return True
        return False

    def synchronize(self) -> None:
        self._done.wait()

    def query(self) -> bool:
        return self._done.is_set()

    def elapsed_time(self, end: "CpuEvent") -> float:
        """Milliseconds from this event to ``end``, both complete and made with ``timing``."""
        if not (self.timing and end.timing):
            raise RuntimeError("elapsed_time of an event made without timing (device.event("
                               "timing=True) makes one that keeps its time)")
        self.synchronize()
        end.synchronize()
        return (end.time - self.time) * 1e3
