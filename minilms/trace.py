"""The memory microscope: record what a run does with the device pool, then read it back.

``with minilms.trace.record() as tr:`` around anything that touches a device (one layer's forward,
an iteration, a training run) keeps the events of ``minilms.events``: every pool allocation and
free, every copy issued and every copy that ran, every kernel, stall and iteration, and the plan
being replayed. Recording only appends: the listener must not slow what it watches, so all analysis
is done when the trace is read, by one fold over the events that is resumed where it stopped.
``measure_overhead(iterate)`` times an iteration with and without recording. What recording costs
is the events' own (``events.emit`` builds each one, about a microsecond), not this listener's.

Reading: ``tr.peak`` (bytes) and ``tr.peak_step`` (the step the pool was being filled for, or
running, when it peaked; approximate on ``cuda``, whose kernel times are device times reported
after the iteration), the pool's use by role at the peak and each role's own peak, bytes H2D and
D2H, time stalled waiting for copies, a per-layer table, and how close the peak came to the
capacity and to the planner's least pool. ``tr.summary()`` says it in words,
``tr.to_chrome(path)`` writes a Perfetto / chrome://tracing file, ``tr.plot(path)`` draws the pool
over time. ``tr.save(path)`` writes plain JSON (never pickle) and ``load_trace`` reads it back;
so does the command ``python -m minilms.trace RUN_DIR_OR_TRACE [--png F] [--chrome F] [--table]``.

Roles: pool owners are blob names; their roles come from the plan event (every blob of the plan),
then from the ``h2d``/``d2h``/``drop`` events, and from the executor or blobs given to ``record``.
An owner never seen with a role counts as "other"; bytes in use when the trace began, by owners
the trace never saw placed, are "(before the trace)" unless ``record`` was given the device.

A long run stays bounded: past ``max_events`` the events of middle iterations are folded into the
totals and dropped (the first iterations and the latest stay in full, a "gap" marks the cut), so
every total covers the whole run while the timeline keeps what a picture needs. One pool at a time:
events do not say which device they come from.
"""
import argparse
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import events
from .blob import ROLES
from .errors import MinilmsError

__all__ = ["record", "Trace", "TraceError", "load_trace", "measure_overhead", "Overhead",
           "LayerRow", "main"]

ROLE_ORDER = ROLES + ("other",)
BEFORE = "(before the trace)"
FORMAT, VERSION = "minilms-trace", 1
KEEP_FIRST = 2         # iterations kept in full at the start: the prologue and a steady one
# The kinds the trace reads; "state" (a third of all events) it does not need.
KINDS = ("alloc", "free", "h2d", "d2h", "copy", "drop", "kernel", "stall", "iteration", "plan",
         "gap")


class TraceError(MinilmsError):
    """A trace file that cannot be read: names the file and what is wrong, in one line."""


@dataclass
class PlanInfo:
    """What the trace keeps of a ``Plan`` (plain data, saved as JSON). ``owners`` maps a blob to
    the layer whose step touches it first, as ``python -m minilms.plan`` attributes it."""
    policy: str
    capacity: int
    train: bool
    roles: dict
    sizes: dict
    pinned: list
    steps: list
    owners: dict
    predicted: dict            # per iteration: "h2d", "d2h" bytes, "peak"
    least_pool: int | None = None
    live: tuple | None = field(default=None, repr=False)   # (net, steps): to compute least_pool

    @classmethod
    def of(cls, plan, net, train: bool) -> "PlanInfo":
        owners = {}
        for step_plan in plan.steps:
            for name in step_plan.step.blobs:
                owners.setdefault(name, step_plan.step.layer)
        return cls(plan.policy.describe(), plan.capacity, bool(train),
                   {n: b.role for n, b in plan.blobs.items()},
                   {n: int(b.nbytes) for n, b in plan.blobs.items()}, list(plan.pinned),
                   [sp.step.name for sp in plan.steps], owners,
                   {"h2d": plan.bytes_moved("h2d"), "d2h": plan.bytes_moved("d2h"),
                    "peak": plan.peak}, None, (net, [sp.step for sp in plan.steps]))

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "live"}


class PoolReplay:
    """The pool as its alloc/free events rebuild it: live slots by offset, bytes by role. The
    bytes in use before the first event are inferred from that event's ``in_use``."""

    def __init__(self, roles: dict, live=None):
        self.roles = roles
        self.live: dict = {}                      # offset -> [owner, nbytes, role]
        self.by_role = dict.fromkeys(ROLE_ORDER, 0)
        self.in_use = 0
        self.started = live is not None
        for offset, owner, nbytes, role in live or ():
            self._add(offset, owner, nbytes, role)

    def _add(self, offset, owner, nbytes, role):
        self.live[offset] = [owner, nbytes, role]
        self.by_role[role] += nbytes
        self.in_use += nbytes

    def begin(self, event) -> None:
        """Infer what was in use before ``event``, the first alloc or free seen."""
        self.started = True
        before = event.detail["in_use"] + (event.nbytes if event.kind == "free" else -event.nbytes)
        if before > 0:
            self._add(-1, BEFORE, before, "other")

    def apply(self, event) -> None:
        detail = event.detail
        if event.kind == "alloc":
            self._add(detail["offset"], event.who, event.nbytes,
                      self.roles.get(event.who, "other"))
            return
        entry = self.live.pop(detail["offset"], None)
        if entry is None:                       # placed before the trace began
            entry = self.live.get(-1)
            if entry is None:                   # never seen at all: another pool's
                return
            entry[1] -= event.nbytes
            if entry[1] <= 0:
                del self.live[-1]
        self.by_role[entry[2]] -= event.nbytes
        self.in_use -= event.nbytes

    def snapshot(self) -> list:
        return [[offset, *entry] for offset, entry in self.live.items()]


class _Fold:
    """Every total of a trace, built by one pass over its events; resumable, and plain data."""

    def __init__(self, roles: dict, live=None):
        self.pool = PoolReplay(roles, live)
        self.peak, self.peak_time, self.peak_step = self.pool.in_use, None, None
        self.at_peak = dict(self.pool.by_role)
        self.peak_owners = self._biggest()
        self.role_peak = dict(self.pool.by_role)
        self.issued = {"h2d": {}, "d2h": {}}     # owner -> [bytes, copies]
        self.dropped: dict = {}                  # owner -> bytes
        self.ran = {"h2d": [0, 0, 0.0], "d2h": [0, 0, 0.0]}   # bytes, copies, seconds
        self.stall = [0.0, 0, 0.0, None]         # seconds, waits, longest, its step
        self.kernels, self.compute_seconds = 0, 0.0
        self.iterations: dict = {}               # kind -> count
        self.first_time = self.last_time = None
        self.owner_layer: dict = {}              # owner -> layer of the first step it served
        self.waiting: list = []                  # (time, owner) placed, no step seen after yet
        self.marks: list = []                    # (raw index, live snapshot) of iteration ends
        self.head_end: int | None = None         # raw index after the first KEEP_FIRST iterations

    def _biggest(self, n: int = 8) -> list:
        owners = sorted(self.pool.live.values(), key=lambda e: -e[1])
        return [list(e) for e in owners[:n]]

    def consume(self, batch, start: int) -> None:
        pool = self.pool
        for index, event in enumerate(batch, start):
            kind = event.kind
            if self.first_time is None:
                self.first_time = event.time
            self.last_time = event.time
            if kind == "alloc" or kind == "free":
                if not pool.started:
                    pool.begin(event)
                    self._new_peak(event.time)
                    self.role_peak = {r: max(b, self.role_peak[r])
                                      for r, b in pool.by_role.items()}
                pool.apply(event)
                if kind == "alloc":
                    role = pool.live[event.detail["offset"]][2]
                    if pool.by_role[role] > self.role_peak[role]:
                        self.role_peak[role] = pool.by_role[role]
                    if event.who not in self.owner_layer:
                        self.waiting.append((event.time, event.who))
                    self._new_peak(event.time)
            elif kind == "h2d" or kind == "d2h":
                entry = self.issued[kind].setdefault(event.who, [0, 0])
                entry[0] += event.nbytes
                entry[1] += 1
            elif kind == "drop":
                self.dropped[event.who] = self.dropped.get(event.who, 0) + event.nbytes
            elif kind == "copy":
                entry, d = self.ran[event.detail["direction"]], event.detail
                entry[0] += event.nbytes
                entry[1] += 1
                entry[2] += d["end"] - d["start"]
            elif kind == "kernel":
                self._kernel(event)
            elif kind == "stall":
                seconds = event.detail["end"] - event.detail["start"]
                self.stall[0] += seconds
                self.stall[1] += 1
                if seconds > self.stall[2]:
                    self.stall[2:] = [seconds, event.who]
            elif kind == "iteration":
                self.iterations[event.who] = self.iterations.get(event.who, 0) + 1
                self.marks = self.marks[-1:] + [(index, pool.snapshot())]
                if self.head_end is None and sum(self.iterations.values()) >= KEEP_FIRST:
                    self.head_end = index + 1

    def _new_peak(self, now: float) -> None:
        if self.pool.in_use > self.peak:
            self.peak, self.peak_time, self.peak_step = self.pool.in_use, now, None
            self.at_peak, self.peak_owners = dict(self.pool.by_role), self._biggest()

    def _kernel(self, event) -> None:
        """The first step that ends after a placement is the step the placement served (it was
        staged before the step ran, or made lazily while it ran)."""
        d = event.detail
        self.kernels += 1
        self.compute_seconds += d["end"] - d["start"]
        if self.peak_step is None and self.peak_time is not None and d["end"] >= self.peak_time:
            self.peak_step = [d["step"], event.who]
        while self.waiting and self.waiting[0][0] <= d["end"]:
            self.owner_layer.setdefault(self.waiting.pop(0)[1], d["layer"])

    def to_json(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("pool", "marks")}
        state["live"] = self.pool.snapshot()
        return state

    @classmethod
    def from_json(cls, state: dict, roles: dict) -> "_Fold":
        fold = cls(roles, state.pop("live"))
        missing = set(fold.to_json()) - {"live"} - set(state)
        if missing:
            raise KeyError(f"totals lack {', '.join(sorted(missing))}")
        fold.__dict__.update(state)
        fold.waiting = [tuple(w) for w in fold.waiting]
        return fold


@dataclass(frozen=True)
class LayerRow:
    layer: str
    h2d: int           # bytes staged in
    d2h: int           # bytes sent home
    dropped: int       # bytes given back without a copy
    pinned: int        # bytes resident for the whole run


class Trace:
    """The events of one recording, and what they say. See the module docstring."""

    def __init__(self, max_events: int = 100_000):
        self.max_events = max_events
        self.roles: dict = {}
        self.plans: list[PlanInfo] = []
        self.capacity_hint: int | None = None
        self._raw: list = []
        self._fold = _Fold(self.roles)
        self._done = 0                  # events folded so far
        self.initial_live: list | None = None   # what the pool held at the start, if known
        self._plans_seen: dict = {}     # id(plan) -> (plan, PlanInfo)
        self.origin = events.clock()

    # -- recording -------------------------------------------------------------------------------
    def _listen(self, event) -> None:
        self._raw.append(event)
        if event.kind == "iteration" and len(self._raw) > self.max_events:
            self._compact()

    def _seed(self, device=None, executor=None, blobs=()) -> None:
        """What a trace started mid-run cannot see: roles, the plan, what the pool holds."""
        if executor is not None:
            device = executor.device
            blobs = [*blobs, *executor.blobs.values(), *getattr(executor, "shared", {}).values()]
            if getattr(executor, "current", None) is not None:
                self._add_plan(executor.plan, executor.net, executor.current.train)
        for blob in blobs:
            self.roles.setdefault(blob.name, blob.role)
        if device is not None:
            self.capacity_hint = device.pool.capacity
            live = [[s.offset, s.owner, s.nbytes, self.roles.get(s.owner, "other")]
                    for s in device.pool.slots()]
            self.initial_live = live
            self._fold = _Fold(self.roles, live)

    def _add_plan(self, plan, net, train) -> None:
        if id(plan) not in self._plans_seen:
            info = PlanInfo.of(plan, net, train)
            self._plans_seen[id(plan)] = (plan, info)   # the plan kept alive: its id stays its
            self.plans.append(info)
            for name, role in info.roles.items():
                self.roles.setdefault(name, role)

    def _update(self) -> _Fold:
        """Fold the events that arrived since the last read (roles first: a role may be named
        after the blob was placed)."""
        end = len(self._raw)
        if self._done < end:
            batch = self._raw[self._done:end]
            for event in batch:
                if event.kind == "plan" and hasattr(event.detail.get("plan"), "steps"):
                    d = event.detail
                    self._add_plan(d["plan"], d["net"], d["train"])
                elif event.kind in ("h2d", "d2h", "drop"):
                    self.roles.setdefault(event.who, event.detail.get("role", "other"))
            self._fold.consume(batch, self._done)
            self._done = end
        return self._fold

    def _compact(self) -> None:
        """Fold everything, then drop the iterations between the first ones and the latest."""
        fold = self._update()
        head = fold.head_end
        if head is None or len(fold.marks) < 2 or fold.marks[0][0] < head:
            return
        cut, live = fold.marks[0]
        dropped = self._raw[head:cut + 1]
        skipped = sum(e.detail.get("iterations", 0) if e.kind == "gap" else e.kind == "iteration"
                      for e in dropped)
        gap = events.Event("gap", f"{skipped} iterations folded into the totals", 0,
                           dropped[-1].time, {"iterations": skipped, "live": live})
        self._raw[head:cut + 1] = [gap]
        removed = len(dropped) - 1
        self._done -= removed
        fold.marks = [(index - removed, snap) for index, snap in fold.marks]

    # -- reading ---------------------------------------------------------------------------------
    @property
    def events(self) -> list:
        """The events kept (all of them unless a long run was folded: see ``gap`` events)."""
        return list(self._raw)

    @property
    def main_plan(self) -> PlanInfo | None:
        """The training plan seen last (else the last plan): the one the pictures compare with."""
        self._update()
        train = [p for p in self.plans if p.train]
        return (train or self.plans or [None])[-1]

    @property
    def capacity(self) -> int | None:
        plan = self.main_plan
        return plan.capacity if plan else self.capacity_hint

    @property
    def peak(self) -> int:
        return self._update().peak

    @property
    def peak_step(self) -> str | None:
        step = self._update().peak_step
        return step[1] if step else None

    @property
    def peak_step_index(self) -> int | None:
        step = self._update().peak_step
        return step[0] if step else None

    @property
    def at_peak(self) -> dict:
        """Bytes by role when the pool peaked (roles holding nothing left out)."""
        return {r: b for r, b in self._update().at_peak.items() if b}

    @property
    def peak_by_role(self) -> dict:
        """Each role's own peak, whenever it happened."""
        return {r: b for r, b in self._update().role_peak.items() if b}

    def biggest_at_peak(self, n: int = 5) -> list[tuple]:
        """``(owner, bytes, role)`` of the largest slots held at the peak."""
        return [(owner, nbytes, role) for owner, nbytes, role in self._update().peak_owners[:n]]

    @property
    def in_use(self) -> int:
        return self._update().pool.in_use

    @property
    def bytes_h2d(self) -> int:
        return sum(b for b, _ in self._update().issued["h2d"].values())

    @property
    def bytes_d2h(self) -> int:
        return sum(b for b, _ in self._update().issued["d2h"].values())

    @property
    def stall_seconds(self) -> float:
        return self._update().stall[0]

    @property
    def iterations(self) -> int:
        return sum(self._update().iterations.values())

    @property
    def least_pool(self) -> int | None:
        """The planner's least pool for the main plan's net and steps (``minilms.plan.
        least_pool``), computed on first request; None when the net is not known (a trace
        saved without it)."""
        plan = self.main_plan
        if plan is None:
            return None
        if plan.least_pool is None and plan.live is not None:
            from .plan import least_pool
            plan.least_pool = least_pool(*plan.live)
        return plan.least_pool

    def layer_table(self) -> list[LayerRow]:
        """Bytes in, out, dropped and pinned per layer, over the whole trace. A blob belongs to
        the layer whose step touches it first (the plan says; else the first step it served)."""
        fold, plan = self._update(), self.main_plan
        owner = dict(fold.owner_layer)
        for info in self.plans:
            owner.update(info.owners)
        rows: dict = {layer: [0, 0, 0, 0] for layer in owner.values()}

        def add(name, column, nbytes):
            rows.setdefault(owner.get(name, "(outside any step)"), [0, 0, 0, 0])[column] += nbytes
        for column, direction in enumerate(("h2d", "d2h")):
            for name, (nbytes, _) in fold.issued[direction].items():
                add(name, column, nbytes)
        for name, nbytes in fold.dropped.items():
            add(name, 2, nbytes)
        for name in plan.pinned if plan else ():
            add(name, 3, plan.sizes[name])
        return [LayerRow(layer, *row) for layer, row in rows.items() if any(row)]

    def timeline(self):
        """``(times, by_role, gaps)``: the pool's bytes by role after each pool event kept,
        and the times where folded iterations were cut out (``trace_plot.Timeline``)."""
        from .trace_plot import timeline
        return timeline(self)

    def summary(self, table: bool = False) -> str:
        from .trace_plot import summary_text
        return summary_text(self, table)

    def to_chrome(self, path=None) -> dict:
        """The trace in the Trace Event Format (Perfetto, chrome://tracing); written to ``path``
        when given."""
        from .trace_chrome import chrome_trace
        document = chrome_trace(self)
        if path is not None:
            _write(path, lambda f: json.dump(document, f))
        return document

    def plot(self, path=None, iteration=None, axis="step"):
        """The pool over time, stacked by role (a matplotlib Figure; saved to ``path`` when
        given). ``iteration``: which of the iterations kept to show (0 the first, -1 the
        latest); by default the latest training iteration, or the whole trace if it has none.
        ``axis``: ``"step"`` (each step the same width) or ``"time"``."""
        from .trace_plot import plot
        figure = plot(self, iteration, axis)
        if path is not None:
            _write(path, lambda f: figure.savefig(f, format="png", dpi=110), binary=True)
        return figure

    # -- saving ----------------------------------------------------------------------------------
    def save(self, path, least_pool: bool = False) -> Path:
        """Write the trace as plain JSON: the events kept (a plan event refers to ``plans`` by
        index), the plans as data, and the totals. ``least_pool=True`` computes it first."""
        fold = self._update()
        if least_pool:
            _ = self.least_pool
        plan_index = {id(p): i for i, p in enumerate(self.plans)}
        rows = []
        for event in self._raw[:self._done]:
            detail = event.detail
            if event.kind == "plan" and hasattr(detail.get("plan"), "steps"):
                detail = {"plan": plan_index[id(self._plans_seen[id(detail["plan"])][1])],
                          "train": bool(detail["train"])}
            rows.append([event.kind, event.who, event.nbytes, event.time, detail])
        document = {"format": FORMAT, "version": VERSION, "origin": self.origin,
                    "capacity_hint": self.capacity_hint, "initial_live": self.initial_live,
                    "roles": self.roles,
                    "plans": [p.to_json() for p in self.plans], "totals": fold.to_json(),
                    "events": rows}
        path = Path(path)
        _write(path, lambda f: json.dump(document, f, default=_plain, separators=(",", ":")))
        return path


def _plain(value):
    """JSON for what an event detail may hold besides numbers and strings (numpy scalars)."""
    return value.item() if hasattr(value, "item") else str(value)


def _write(path, write, binary: bool = False) -> None:
    try:
        with open(path, "wb" if binary else "w") as f:
            write(f)
    except OSError as error:
        raise TraceError(f"{path}: cannot write: {error.strerror or error}") from None


@contextmanager
def record(executor=None, device=None, blobs=(), max_events: int = 100_000):
    """Record the events of the block into a ``Trace``. Started mid-run, give the ``executor``
    (its plan, blob roles and device) or the ``device`` (what its pool already holds), so the
    trace can name what was placed before it began."""
    trace = Trace(max_events)
    trace._seed(device, executor, blobs)
    events.subscribe(trace._listen, KINDS)
    try:
        yield trace
    finally:
        events.unsubscribe(trace._listen)


def load_trace(path) -> Trace:
    """A trace saved by ``Trace.save``: the file, or a run directory holding ``trace.json``."""
    path = Path(path)
    if path.is_dir():
        path = path / "trace.json"
    try:
        with open(path) as f:
            document = json.load(f)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file (expected a trace.json written by Trace.save, "
                         "or a run directory holding one)") from None
    except OSError as error:
        raise TraceError(f"{path}: cannot read: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: not a minilms trace: bad JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TraceError(f"{path}: not a minilms trace (no \"format\": \"{FORMAT}\")")
    if document.get("version") != VERSION:
        raise TraceError(f"{path}: trace format version {document.get('version')!r}, this "
                         f"minilms reads version {VERSION}")
    try:
        trace = Trace()
        trace.origin, trace.capacity_hint = float(document["origin"]), document["capacity_hint"]
        trace.initial_live = document["initial_live"]
        trace.roles.update(document["roles"])
        trace.plans = [PlanInfo(**p) for p in document["plans"]]
        trace._raw = [_event(row) for row in document["events"]]
        trace._done = len(trace._raw)
        trace._fold = _Fold.from_json(dict(document["totals"]), trace.roles)
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise TraceError(f"{path}: not a minilms trace: malformed "
                         f"({type(error).__name__}: {error})") from None
    return trace


# What the readers of a trace take from each kind of event, checked when a file is loaded.
DETAIL_KEYS = {"alloc": ("offset", "in_use"), "free": ("offset", "in_use"),
               "copy": ("direction", "start", "end", "stream"),
               "kernel": ("layer", "phase", "step", "start", "end"),
               "stall": ("step", "start", "end"), "iteration": ("index", "start", "end"),
               "gap": ("iterations", "live")}


def _event(row) -> events.Event:
    kind, who, nbytes, when, detail = row
    if not (isinstance(kind, str) and isinstance(who, str) and isinstance(nbytes, int)
            and isinstance(when, (int, float)) and isinstance(detail, dict)):
        raise ValueError(f"an event is [kind, who, bytes, time, detail], found {row!r:.80}")
    missing = [key for key in DETAIL_KEYS.get(kind, ()) if key not in detail]
    if missing:
        raise KeyError(f"a {kind} event without {', '.join(missing)}")
    return events.Event(kind, who, nbytes, float(when), detail)


@dataclass(frozen=True)
class Overhead:
    plain_seconds: float      # the fastest iteration without recording
    traced_seconds: float     # ... and with
    events_per_iteration: int

    @property
    def fraction(self) -> float:
        return self.traced_seconds / self.plain_seconds - 1.0

    def __str__(self) -> str:
        return (f"recording overhead {self.fraction:+.1%}: {self.plain_seconds * 1e3:.2f} ms "
                f"per iteration, {self.traced_seconds * 1e3:.2f} ms recorded "
                f"({self.events_per_iteration} events per iteration)")


def measure_overhead(iterate, repeats: int = 10) -> Overhead:
    """Time ``iterate()`` (one training iteration, say) with and without recording, alternating
    so both see the same machine, and keep the fastest of each (noise only ever adds time)."""
    iterate()
    plain, traced, count = [], [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        iterate()
        plain.append(time.perf_counter() - started)
        with record() as trace:
            started = time.perf_counter()
            iterate()
            traced.append(time.perf_counter() - started)
        count = len(trace._raw)
    return Overhead(min(plain), min(traced), count)


# -- the command ---------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minilms.trace",
                                description="Read a memory trace: its summary, a picture, a "
                                            "Perfetto / chrome://tracing file.")
    p.add_argument("trace", help="a trace.json (Trace.save), or a run directory holding one")
    p.add_argument("--png", metavar="FILE", help="draw the pool over time, stacked by role")
    p.add_argument("--chrome", metavar="FILE", help="write the Trace Event Format JSON")
    p.add_argument("--table", action="store_true", help="add the per-layer table")
    p.add_argument("--iteration", type=int, help="the picture shows this iteration (0 the "
                                                  "first kept, -1 the latest; default: the "
                                                  "latest training iteration)")
    p.add_argument("--axis", choices=("step", "time"), default="step",
                   help="the picture's x axis: steps of equal width, or time")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    trace = load_trace(args.trace)
    print(trace.summary(table=args.table))
    if args.png:
        trace.plot(args.png, iteration=args.iteration, axis=args.axis)
        print(f"picture: {args.png}")
    if args.chrome:
        trace.to_chrome(args.chrome)
        print(f"chrome trace: {args.chrome} (open in https://ui.perfetto.dev)")
    return 0


if __name__ == "__main__":
    from minilms.commands.common import run
    from minilms.trace import main as trace_main   # the package's module, not this __main__ copy
    sys.exit(run(trace_main))
