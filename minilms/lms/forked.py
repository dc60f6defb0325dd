"""Half of a list of pure-Python work done in a forked child, the other half here.

``policy: auto`` plans a few dozen candidates, one after another, in Python: seconds for the
largest nets (``docs/benchmarks.md``, "Start-up: planning a large net"), on one core of the two
or more a machine has. Threads would share one interpreter lock; a forked child shares the
parent's memory (the net, its liveness) without copying it, and sends back only its results.

``map_halves(work, items)`` calls ``work(items[1::2])`` in a child and ``work(items[0::2])`` here
and returns the results of both in the order of ``items``. ``work`` returns one JSON value per
item (no pickle crosses the pipe). The child is used only where it is safe and can help: ``fork``
exists, this process runs one thread (a fork copies only the calling thread; a lock another one
held would stay held in the child), and two cores are there to run the halves at once. Anywhere
else, and if the child fails, ``work`` runs here on everything, as it would have without it.
"""
import json
import os
import threading

__all__ = ["can_fork", "map_halves"]


def can_fork() -> bool:
    """Whether ``map_halves`` would use a child here (the module docstring)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return hasattr(os, "fork") and threading.active_count() == 1 and cores >= 2


def map_halves(work, items: list, fork: bool | None = None) -> list:
    """``work(items)``'s results, the odd-numbered items' computed in a forked child where
    ``fork`` (default ``can_fork()``)."""
    if fork is None:
        fork = can_fork()
    if not fork or len(items) < 2:
        return list(work(items))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: its half, then out at once
        status = 1
        try:
            os.close(read)
            with os.fdopen(write, "w") as pipe:
                json.dump(list(work(items[1::2])), pipe)
            status = 0
        finally:
            os._exit(status)    # no atexit handlers, no buffers of the parent's flushed twice
    os.close(write)
    try:
        mine = list(work(items[0::2]))
        with os.fdopen(read) as pipe:
            read = None                            # closed with the file
            text = pipe.read()
    finally:             # an error here, or an interrupt: the child is reaped all the same
        if read is not None:
            os.close(read)                         # a child still writing gets a broken pipe
        _, status = os.waitpid(pid, 0)
    try:
        theirs = json.loads(text) if status == 0 else None
    except ValueError:
        theirs = None
    if theirs is None or len(theirs) != len(items[1::2]):
        theirs = list(work(items[1::2]))           # the child failed: its half here
    merged = [None] * len(items)
    merged[0::2], merged[1::2] = mine, theirs
    return merged
