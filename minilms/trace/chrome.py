"""A trace in the Trace Event Format, for https://ui.perfetto.dev and chrome://tracing.

One process (the device) with one thread per stream: the iterations, the compute stream (steps
and the stalls before them), the two copy streams (H2D, D2H), and copies made synchronously by
the host. Steps,
stalls and copies are complete ("X") slices, in microseconds from the start of the trace; the
pool's use by role is one counter ("C") with an argument per role, which chrome://tracing draws
stacked (Perfetto as one track per role). Slices on one thread must nest: clock readings taken
on different threads can overlap by a tick, so a slice that would overlap the one before it
partially is clipped to it.
"""
from ..sizes import format_bytes
from .plot import timeline

PID = 1
THREADS = {"iterations": 1, "compute": 2, "h2d": 3, "d2h": 4, "sync": 5}
THREAD_NAMES = {"iterations": "iterations", "compute": "compute stream (steps, stalls)",
                "h2d": "H2D stream", "d2h": "D2H stream",
                "sync": "synchronous copies (host thread)"}
COUNTER = "device pool by role (bytes)"


def _us(seconds: float, origin: float) -> float:
    return round((seconds - origin) * 1e6, 3)


def chrome_trace(trace) -> dict:
    origin = trace.origin
    capacity = trace.capacity
    name = "minilms device" + (f" ({format_bytes(capacity)} pool)" if capacity else "")
    out = [{"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": 0,
            "args": {"name": name}}]
    for key, tid in THREADS.items():
        out.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": PID, "tid": tid,
                    "args": {"name": THREAD_NAMES[key]}})
        out.append({"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": PID, "tid": tid,
                    "args": {"sort_index": tid}})
    slices = []
    for event in trace.events:
        d, kind = event.detail, event.kind
        if kind == "kernel":
            slices.append((THREADS["compute"], event.who, f"step,{d['phase']}", d["start"],
                           d["end"], {"layer": d["layer"], "step": d["step"]}))
        elif kind == "stall":
            slices.append((THREADS["compute"], "stall: waiting for copies", "stall", d["start"],
                           d["end"], {"before step": d["step"]}))
        elif kind == "copy":
            # by direction: traces written before there were two copy streams say "copy"
            tid = THREADS["sync"] if d["stream"] == "sync" else THREADS[d["direction"]]
            slices.append((tid, f"{d['direction'].upper()} {event.who}", d["direction"],
                           d["start"], d["end"], {"bytes": event.nbytes, "blob": event.who,
                                                  "role": trace.roles.get(event.who, "other")}))
        elif kind == "iteration":
            slices.append((THREADS["iterations"], f"{event.who} iteration {d['index']}",
                           "iteration", d["start"], d["end"], {"index": d["index"]}))
        elif kind == "gap":
            out.append({"name": event.who, "ph": "i", "s": "g", "ts": _us(event.time, origin),
                        "pid": PID, "tid": THREADS["iterations"], "args": {}})
    out += _nested(slices, origin)
    line = timeline(trace)
    roles = list(line.by_role)
    for i, when in enumerate(line.times):
        out.append({"name": COUNTER, "ph": "C", "ts": _us(when, origin), "pid": PID, "tid": 0,
                    "args": {role: int(line.by_role[role][i]) for role in roles}})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"capacity": capacity, "peak": trace.peak,
                          "peak_step": trace.peak_step}}


def _nested(slices, origin) -> list:
    """X events, each thread's slices properly nested: sorted by start (longest first on a tie),
    a slice that starts inside another but would end after it is cut at the other's end."""
    out = []
    for tid in sorted({s[0] for s in slices}):
        mine = sorted(((_us(a, origin), _us(max(b, a), origin), name, cat, args)
                       for t, name, cat, a, b, args in slices if t == tid),
                      key=lambda s: (s[0], -s[1]))
        open_ends: list = []
        for start, end, name, cat, args in mine:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            if open_ends:
                end = min(end, open_ends[-1])
            open_ends.append(end)
            out.append({"name": name, "cat": cat, "ph": "X", "ts": start,
                        "dur": round(end - start, 3), "pid": PID, "tid": tid, "args": args})
    return out
