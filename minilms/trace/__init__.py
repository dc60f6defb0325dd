"""The memory microscope: ``record`` what a run does with the device pool, then read it back.

``record`` (the listener and ``Trace``, its summaries and table), ``fold`` (one pass over the
events that every reading shares), ``timing`` (where the time goes: per layer, phase and layer
type), ``plot`` (the pool over an iteration, stacked by role),
``chrome`` (Perfetto / chrome://tracing export) and ``command`` (``python -m minilms.trace``).
"""
from ..errors import TraceError
from .fold import ROLE_ORDER
from .record import LayerRow, Overhead, Trace, load_trace, measure_overhead, record
from .timing import LayerTime, PhaseTime, TypeTime

__all__ = ["ROLE_ORDER", "LayerRow", "LayerTime", "Overhead", "PhaseTime", "Trace", "TraceError",
           "TypeTime", "load_trace", "measure_overhead", "record"]
