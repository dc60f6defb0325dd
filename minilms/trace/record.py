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
D2H, time stalled waiting for copies, a per-layer table, how close the peak came to the
capacity and to the planner's least pool, and where the time goes (``tr.time_table()``,
``timing``). ``tr.summary()`` says it in words, ``tr.to_chrome(path)`` writes a Perfetto /
chrome://tracing file, ``tr.plot(path)`` draws the pool over time. ``tr.save(path)`` writes
plain JSON (never pickle) and ``load_trace`` reads it back;
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
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import events
from ..errors import TraceError
from .file_format import Malformed, check_document
from .fold import ROLE_ORDER, Fold, PlanInfo
from .timing import TimeTables

__all__ = ["ROLE_ORDER", "record", "Trace", "TraceError", "load_trace", "measure_overhead",
           "Overhead", "LayerRow"]

FORMAT, VERSION, READS = "minilms-trace", 2, (1, 2)   # 1: no step times (file_format.py)
# The kinds the trace reads; "state" (a third of all events) it does not need.
KINDS = ("alloc", "free", "h2d", "d2h", "copy", "drop", "kernel", "stall", "iteration", "plan",
         "gap")


@dataclass(frozen=True)
class LayerRow:
    layer: str
    h2d: int           # bytes staged in
    d2h: int           # bytes sent home
    dropped: int       # bytes given back without a copy
    pinned: int        # bytes resident for the whole run


class Trace(TimeTables):
    """The events of one recording, and what they say. See the module docstring."""

    def __init__(self, max_events: int = 100_000):
        self.max_events = max_events
        self.roles: dict = {}
        self.plans: list[PlanInfo] = []
        self.capacity_hint: int | None = None
        self._raw: list = []
        self._fold = Fold(self.roles)
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
            self._fold = Fold(self.roles, live)

    def _add_plan(self, plan, net, train) -> None:
        if id(plan) not in self._plans_seen:
            info = PlanInfo.of(plan, net, train)
            self._plans_seen[id(plan)] = (plan, info)   # the plan kept alive: its id stays its
            self.plans.append(info)
            for name, role in info.roles.items():
                self.roles.setdefault(name, role)

    def _update(self) -> Fold:
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
            from ..lms.bounds import least_pool
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
        from .plot import timeline
        return timeline(self)

    def summary(self, table: bool = False, top: int | None = 20) -> str:
        """``table``: with the tables, bytes and time per layer (the ``top`` longest; 0: all)."""
        from .plot import summary_text
        return summary_text(self, table, top)

    def to_chrome(self, path=None) -> dict:
        """The trace in the Trace Event Format (Perfetto, chrome://tracing); written to ``path``
        when given."""
        from .chrome import chrome_trace
        document = chrome_trace(self)
        if path is not None:
            _write(path, lambda f: json.dump(document, f))
        return document

    def plot(self, path=None, iteration=None, axis="step"):
        """The pool over time, stacked by role (a matplotlib Figure; saved to ``path`` when
        given). ``iteration``: which of the iterations kept to show (0 the first, -1 the
        latest); by default the latest training iteration, or the whole trace if it has none.
        ``axis``: ``"step"`` (each step the same width) or ``"time"``."""
        from .plot import plot
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
    """A trace saved by ``Trace.save``: the file, or a run directory holding ``trace.json``.
    Every field the readers use is checked here (``check_document``), so a file that loads can
    be summarised, drawn and exported; one that cannot is a one-line TraceError naming the file,
    where in it, what was expected and what was found."""
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
    except ValueError as error:     # bad JSON, bad UTF-8, an integer of over 4300 digits
        raise TraceError(f"{path}: not a minilms trace: bad JSON "
                         f"({' '.join(str(error).split())})") from None
    except RecursionError:
        raise TraceError(f"{path}: not a minilms trace: JSON nested too deeply") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TraceError(f"{path}: not a minilms trace (no \"format\": \"{FORMAT}\")")
    version = document.get("version")
    if type(version) is not int or version not in READS:
        raise TraceError(f"{path}: trace format version {version!r}, this minilms reads "
                         f"versions {', '.join(map(str, READS))}")
    try:
        check_document(document, version)
    except Malformed as error:
        raise TraceError(f"{path}: not a minilms trace: malformed: {error}") from None
    try:
        trace = Trace()
        trace.origin, trace.capacity_hint = float(document["origin"]), document["capacity_hint"]
        trace.initial_live = document["initial_live"]
        trace.roles.update(document["roles"])
        trace.plans = [PlanInfo(**p) for p in document["plans"]]
        trace._raw = [events.Event(kind, who, nbytes, float(when), detail)
                      for kind, who, nbytes, when, detail in document["events"]]
        trace._done = len(trace._raw)
        trace._fold = Fold.from_json(dict(document["totals"]), trace.roles)
    except (KeyError, TypeError, ValueError, IndexError) as error:   # what the checks missed
        raise TraceError(f"{path}: not a minilms trace: malformed "
                         f"({type(error).__name__}: {error})") from None
    return trace


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
