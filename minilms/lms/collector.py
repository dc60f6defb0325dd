"""Python's cycle collector paused while plans are made (``make_plan``, ``least_pool``,
``policy: auto``): a plan is tens of thousands of small objects that live until it is done."""
import gc
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused():
    """Python's cycle collector off while plans are made, as it was after. A plan (and the
    schedule's ``Liveness``) is tens of thousands of small objects that all live until it is
    done, so the collector's passes, each over everything the process holds (the net, the
    kernels' modules), find nothing and cost a third of the planning time; a search
    (``least_pool``, ``policy: auto``) pauses it once for all its plans. Nothing here makes a
    reference cycle: what a plan drops, reference counting frees."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
