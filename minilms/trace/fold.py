"""The trace's one pass over events: the pool replayed from its allocations and frees, by role,
and the totals a ``Trace`` reports (peak and where, bytes by direction, stalls, per-layer counts,
the steps' times by layer and phase, each iteration kind's first iteration apart), kept as a fold
that resumes where it stopped, so reading a trace twice costs one pass.
``minilms.trace`` records the events and reads the results; this module only folds them.
"""
from dataclasses import dataclass, field

from ..blob import ROLES

ROLE_ORDER = ROLES + ("other",)
BEFORE = "(before the trace)"
KEEP_FIRST = 2         # iterations kept in full at the start: the prologue and a steady one
# the kinds of step (``Step.kind``): a recompute re-runs a forward (``minilms.lms.recompute``)
PHASES = ("forward", "recompute", "backward", "update")
# Totals a trace file holds since version 2; a version 1 file lacks them (None once loaded).
SINCE_VERSION_2 = ("times", "times_first", "times_pending")


@dataclass
class PlanInfo:
    """What the trace keeps of a ``Plan`` (plain data, saved as JSON). ``owners`` maps a blob to
    the layer whose step touches it first, as ``python -m minilms.plan`` attributes it; ``types``
    a layer to its type ("Convolution"; empty in a version 1 file)."""
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
    types: dict = field(default_factory=dict)
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
                    "peak": plan.peak},
                   types={layer.name: layer.type for layer in net.layers},
                   live=(net, [sp.step for sp in plan.steps]))

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "live"}


def new_times() -> dict:
    """One iteration kind's times (``Fold.times``), none counted yet: ``copies`` holds each
    direction's ``[bytes, seconds]`` of the copies that ended in its iterations (a file written
    before it was kept has none)."""
    return {"iterations": 0, "wall": 0.0, "stall": 0.0, "steps": {},
            "copies": {"h2d": [0, 0.0], "d2h": [0, 0.0]}}


def add_times(into: dict, more: dict) -> dict:
    """``more``'s iterations, wall and stall seconds and steps added to ``into``; returns it."""
    into["iterations"] += more["iterations"]
    into["wall"] += more["wall"]
    into["stall"] += more["stall"]
    for direction, (nbytes, seconds) in more.get("copies", {}).items():
        entry = into.setdefault("copies", {}).setdefault(direction, [0, 0.0])
        entry[0] += nbytes
        entry[1] += seconds
    for layer, phases in more["steps"].items():
        mine = into["steps"].setdefault(layer, {})
        for phase, (seconds, count) in phases.items():
            entry = mine.setdefault(phase, [0.0, 0])
            entry[0] += seconds
            entry[1] += count
    return into


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


class Fold:
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
        # Where the time went, by iteration kind: each kind's iterations, their wall and stall
        # seconds, and its steps' [seconds, count] by layer and phase. Its first iteration (which
        # compiles kernels and faults pages in) in times_first, the rest in times. A step's kind
        # is known when its iteration ends: until then its times wait in times_pending.
        self.times: dict | None = {}
        self.times_first: dict | None = {}
        self.times_pending: dict | None = new_times()

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
                if self.times_pending is not None:     # the iteration's own, as its steps
                    mine = self.times_pending["copies"][d["direction"]]
                    mine[0] += event.nbytes
                    mine[1] += d["end"] - d["start"]
            elif kind == "kernel":
                self._kernel(event)
            elif kind == "stall":
                seconds = event.detail["end"] - event.detail["start"]
                if self.times_pending is not None:
                    self.times_pending["stall"] += seconds
                self.stall[0] += seconds
                self.stall[1] += 1
                if seconds > self.stall[2]:
                    self.stall[2:] = [seconds, event.who]
            elif kind == "iteration":
                self.iterations[event.who] = self.iterations.get(event.who, 0) + 1
                if self.times is not None:
                    self._iteration_times(event)
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
        if self.times_pending is not None:
            entry = self.times_pending["steps"].setdefault(d["layer"], {}).setdefault(
                d["phase"], [0.0, 0])
            entry[0] += d["end"] - d["start"]
            entry[1] += 1
        if self.peak_step is None and self.peak_time is not None and d["end"] >= self.peak_time:
            self.peak_step = [d["step"], event.who]
        while self.waiting and self.waiting[0][0] <= d["end"]:
            self.owner_layer.setdefault(self.waiting.pop(0)[1], d["layer"])

    def _iteration_times(self, event) -> None:
        """The steps and stalls since the last iteration ended were this one's: the first of
        its kind is kept apart, the others added up."""
        mine, self.times_pending = self.times_pending, new_times()
        mine["iterations"] = 1
        mine["wall"] = event.detail["end"] - event.detail["start"]
        if event.who not in self.times_first:
            self.times_first[event.who] = mine
        else:
            add_times(self.times.setdefault(event.who, new_times()), mine)

    def to_json(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("pool", "marks")}
        state["live"] = self.pool.snapshot()
        return state

    @classmethod
    def from_json(cls, state: dict, roles: dict) -> "Fold":
        fold = cls(roles, state.pop("live"))
        for key in SINCE_VERSION_2:
            state.setdefault(key, None)        # a version 1 file: no step times
        missing = set(fold.to_json()) - {"live"} - set(state)
        if missing:
            raise KeyError(f"totals lack {', '.join(sorted(missing))}")
        fold.__dict__.update(state)
        fold.waiting = [tuple(w) for w in fold.waiting]
        return fold
