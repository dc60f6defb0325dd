"""Pure-Python work shared with a forked child: a list, each item done by whichever process is
free next; or one piece begun in the child while this process goes on.

``policy: auto`` plans a few dozen candidates, one after another, in Python: seconds for the
largest nets (``docs/benchmarks.md``, "Start-up: planning a large net"), on one core of the two
or more a machine has. Threads would share one interpreter lock; a forked child shares the
parent's memory (the net, its liveness) without copying it, and sends back only its results.

``map_forked(work, items)`` returns ``[work(item) for item in items]``, in the order of
``items``; a child and this process take the items from one queue (a pipe of their indices), so
neither waits while the other still has work, however unequal the items are. ``work`` returns a
JSON value (no pickle crosses the pipe). A ``SharedLeast`` made before the call is one number
both processes see and lower as they go: ``auto``'s best time so far, against which either
process cuts its candidates short. ``started(work)`` runs one piece of work in a child beside
whatever this process does next, and hands back its value when asked (``minilms.plan``'s least
pool, searched while ``auto`` plans).

The child is used only where it is safe and can help: ``fork`` exists, this process runs one
thread (a fork copies only the calling thread; a lock another one held would stay held in the
child), and two cores are there to run both at once. Anywhere else, ``work`` runs here on
everything, as it would have without it; and if the child fails, the items it took are done here.
"""
import json
import mmap
import os
import struct
import threading

__all__ = ["can_fork", "map_forked", "started", "SharedLeast"]

_INDEX = struct.Struct("<I")    # one queued item: its index, in one atomic pipe read
_QUEUE_LIMIT = 4096             # items beyond it would not fit a pipe's buffer: no child then


class SharedLeast:
    """The least of the numbers offered so far, in memory a forked child shares with its parent
    (an anonymous shared mapping made before the fork), so each sees the other's offers at once.
    ``value()`` is always a number that was offered (infinity before any); two offers at the
    same moment may leave the larger of the two."""

    def __init__(self):
        self._memory = mmap.mmap(-1, 8)
        struct.pack_into("d", self._memory, 0, float("inf"))

    def value(self) -> float:
        return struct.unpack_from("d", self._memory)[0]

    def offer(self, number: float) -> None:
        if number < self.value():
            struct.pack_into("d", self._memory, 0, number)


def can_fork() -> bool:
    """Whether ``map_forked`` would use a child here (the module docstring)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return hasattr(os, "fork") and threading.active_count() == 1 and cores >= 2


def map_forked(work, items: list, fork: bool | None = None) -> list:
    """``[work(item) for item in items]``, shared with a forked child where ``fork`` (default
    ``can_fork()``)."""
    if fork is None:
        fork = can_fork()
    if not fork or len(items) < 2 or len(items) > _QUEUE_LIMIT:
        return [work(item) for item in items]
    queue, enqueue = os.pipe()
    tokens = memoryview(b"".join(_INDEX.pack(i) for i in range(len(items))))
    while tokens:
        tokens = tokens[os.write(enqueue, tokens):]
    os.close(enqueue)                    # an empty queue now reads as the end
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                         # the child: items until none is left, then out at once
        status = 1
        try:
            os.close(read)
            done = [[i, work(items[i])] for i in _taken(queue)]
            with os.fdopen(write, "w") as pipe:
                json.dump(done, pipe)
            status = 0
        finally:
            os._exit(status)    # no atexit handlers, no buffers of the parent's flushed twice
    os.close(write)
    results: dict = {}
    try:
        for i in _taken(queue):
            results[i] = work(items[i])
        with os.fdopen(read) as pipe:
            read = None                            # closed with the file
            text = pipe.read()
    finally:             # an error here, or an interrupt: the child is reaped all the same
        for _ in _taken(queue):     # after an error, what is left: the child stops sooner
            pass
        os.close(queue)
        if read is not None:
            os.close(read)                         # a child still writing gets a broken pipe
        _, status = os.waitpid(pid, 0)
    try:
        theirs = json.loads(text) if status == 0 else []
        results.update((int(i), result) for i, result in theirs)
    except (ValueError, TypeError):
        pass
    # what the child took and did not bring back (it failed): done here
    return [results[i] if i in results else work(items[i]) for i in range(len(items))]


def started(work, fork: bool | None = None):
    """``work()`` begun now in a forked child, beside what this process does next (where
    ``fork``, default ``can_fork()``); returns a function that waits for the child and returns
    ``work()``'s value (JSON), or runs ``work()`` here where there is no child or it failed.
    ``minilms.plan`` searches for the least pool this way while ``auto`` plans: two
    computations that need each other's results only at the end."""
    if fork is None:
        fork = can_fork()
    if not fork:
        return work
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read)
            with os.fdopen(write, "w") as pipe:
                json.dump([work()], pipe)
            status = 0
        finally:
            os._exit(status)
    os.close(write)

    def result():
        try:
            with os.fdopen(read) as pipe:
                text = pipe.read()
        finally:
            _, status = os.waitpid(pid, 0)
        try:
            if status == 0:
                return json.loads(text)[0]
        except (ValueError, IndexError):
            pass
        return work()
    return result


def _taken(queue: int):
    """The indices this process takes from the queue, until it is empty."""
    while True:
        taken = os.read(queue, _INDEX.size)
        if not taken:
            return
        yield _INDEX.unpack(taken)[0]
