"""The hook every level of minilms reports to: allocations, frees, copies, state changes, kernels.

It costs nothing when nobody listens: emitters guard each report with ``if events.listening:``,
a plain module attribute read, and build no event at all otherwise. The trace (``minilms.trace``)
and tests subscribe; nothing that listens may change what it observes.

What is reported (``kind``: ``who``, ``nbytes``; ``detail``), all times in ``clock`` seconds:

    alloc, free   pool slot owner, aligned bytes; offset, in_use (pool bytes after it)
    h2d, d2h      blob, bytes; role, stream ("sync", "h2d", "d2h", "compute"): a copy is *issued*
    copy          blob, bytes; direction ("h2d"/"d2h"), start, end, stream: a copy *ran*
                  (cpu: timed on the thread that copied; cuda: issue time, timing="issued")
    state         blob, bytes; before, after (uninitialized, host, device, synced)
    drop          blob, bytes; role: its slot given back without a copy
    kernel        step name ("forward conv1"), 0; layer, phase, step (index), start, end, stream
    stall         step name, 0; step, start, end: compute waited for copies (cpu)
    iteration     "train" or "eval", 0; index, start, end
    plan          the policy described, the pool capacity; plan, net, train: a plan is about to
                  be replayed (``minilms.plan.Plan`` and ``minilms.net.Net`` objects)

The roles of blobs (``Blob.role``) are those of ``minilms.blob.ROLES``; pool owners are blob names.
"""
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Event", "listening", "subscribe", "unsubscribe", "listen", "emit", "clock"]

clock = time.perf_counter


@dataclass(slots=True)     # not frozen: a frozen dataclass builds several times slower
class Event:
    kind: str             # "alloc", "free", "h2d", "d2h", "state", "drop", ...
    who: str              # the blob (or other owner) the event is about
    nbytes: int = 0
    time: float = 0.0     # seconds, minilms.events.clock
    detail: dict = field(default_factory=dict)


_listeners: list[tuple[Callable[[Event], None], frozenset | None]] = []
_wanted: frozenset | None = frozenset()      # kinds some listener wants; None: every kind
listening = False


def subscribe(listener: Callable[[Event], None], kinds=None) -> None:
    """Call ``listener`` with every event, or only those whose kind is in ``kinds``: an event no
    listener wants is never built (the trace skips ``state``, a third of them)."""
    _listeners.append((listener, None if kinds is None else frozenset(kinds)))
    _update()


def unsubscribe(listener: Callable[[Event], None]) -> None:
    for i, (known, _) in enumerate(_listeners):
        if known == listener:     # == : a bound method is a new object at each access
            del _listeners[i]
            break
    else:
        raise ValueError(f"{listener!r} is not subscribed")
    _update()


def _update() -> None:
    global listening, _wanted
    listening = bool(_listeners)
    kinds = [k for _, k in _listeners]
    _wanted = None if any(k is None for k in kinds) else frozenset().union(*kinds)


@contextmanager
def listen(listener: Callable[[Event], None] | None = None):
    """Collect events while the block runs: ``with listen() as got: ...`` gives the list ``got``."""
    collected: list[Event] = []
    sink = listener if listener is not None else collected.append
    subscribe(sink)
    try:
        yield collected
    finally:
        unsubscribe(sink)


def emit(kind: str, who: str, nbytes: int = 0, **detail) -> None:
    """Report one event to every listener that wants its kind. Callers check
    ``events.listening`` first."""
    if _wanted is not None and kind not in _wanted:
        return
    event = Event(kind, who, nbytes, clock(), detail)
    for listener, kinds in tuple(_listeners):
        if kinds is None or kind in kinds:
            listener(event)
