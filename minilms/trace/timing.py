"""Where the time goes: the steps' times per layer, per phase and per layer type, the way a
profiler's summary gives them (PyTorch's ``key_averages().table()``, ``caffe time``), so tuning
a kernel starts from a measurement.

Every figure is a mean per iteration over the iterations of one kind the trace counted (training
ones, else evaluation ones): each step's time (its "kernel" event, start to end), the stalls before
steps (compute waiting for copies: not compute, so kept apart, and measured on ``cpu`` only) and
each iteration's wall time. A kind's first iteration warms up (Numba kernels load, pages fault in:
a first convolution can take a thousand times a later one), so, as in a profiler's summary, it is
left out: the tables are the mean of the iterations after it (the fold's ``times``), or the first
alone when it is the only one (``times_first``; ``PhaseTime.warmup`` says so); ``which`` asks for
the first alone or all. The fold keeps them through a long run's folded iterations, so they cover
every iteration, not only those kept in full. A layer's update is the solver's step for its
parameters, a step of its own in the schedule. Shares of a layer or type are of all the steps'
time; shares of a phase are of the iteration's wall time, whose rest ("outside the steps") is
staging, the epilogue's copies home and the host's own work. A trace written before step times
were kept (file version 1) has none: the text says so.
"""
from dataclasses import dataclass

from ..sizes import format_bytes
from .fold import PHASES, add_times, new_times

UNKNOWN = "(unknown)"          # the type of a layer no plan in the trace names
KIND_WORDS = {"train": "training", "eval": "evaluation"}
WHICH = ("steady", "first", "all")     # the iterations counted: after the first, the first, all


@dataclass(frozen=True)
class LayerTime:
    """One layer's steps: seconds per iteration by phase, and its share of all the steps' time."""
    layer: str
    type: str
    forward: float
    recompute: float
    backward: float
    update: float
    share: float

    @property
    def total(self) -> float:
        return self.forward + self.recompute + self.backward + self.update


@dataclass(frozen=True)
class TypeTime:
    """The layers of one type together (``layers`` of them), as ``LayerTime``."""
    type: str
    layers: int
    forward: float
    recompute: float
    backward: float
    update: float
    share: float

    @property
    def total(self) -> float:
        return self.forward + self.recompute + self.backward + self.update


@dataclass(frozen=True)
class PhaseTime:
    """Seconds per iteration: the iteration's wall time, its steps by phase, its stalls."""
    kind: str             # the iterations counted: "train" or "eval"
    iterations: int       # how many
    warmup: bool          # whether the first of them (the warm-up) is among them
    wall: float
    forward: float
    recompute: float
    backward: float
    update: float
    stall: float
    # per iteration, ``(direction, bytes, seconds)`` of each direction that copied: the copies
    # that ended in these iterations (beside the steps where copies run on threads of their own,
    # in the time outside them where they run where issued); empty in a file without them
    copies: tuple = ()

    @property
    def steps(self) -> float:
        return self.forward + self.recompute + self.backward + self.update

    @property
    def outside(self) -> float:
        """Wall time in no step and no stall."""
        return self.wall - self.steps - self.stall


def iteration_count(fold, kind: str) -> int:
    """How many iterations of ``kind`` the trace timed, the first included."""
    return (kind in fold.times_first) + fold.times.get(kind, {}).get("iterations", 0)


def counted(fold, kind: str | None = None, which: str = "steady") -> tuple | None:
    """The iterations the tables count, as ``(kind, their times added up, warmup)``: ``kind`` if
    given, else "train" if the trace timed any, else "eval". ``which``: "steady", those after the
    first (the first alone, ``warmup`` True, when it is the only one); "first"; "all". None when
    there are none (or no step times at all)."""
    if which not in WHICH:
        raise ValueError(f"which: expected one of {', '.join(WHICH)}, found {which!r}")
    kinds = (kind,) if kind is not None else ("train", "eval")
    kind = next((k for k in kinds if fold.times is not None and iteration_count(fold, k)), None)
    if kind is None:
        return None
    first, rest = fold.times_first[kind], fold.times.get(kind)
    if which == "first" or not (rest and rest["iterations"]):
        return kind, first, True
    if which == "steady":
        return kind, rest, False
    return kind, add_times(add_times(new_times(), first), rest), True


def layer_times(fold, types: dict, kind: str | None = None,
                which: str = "steady") -> list[LayerTime]:
    """Per layer, longest total first (ties in the order the layers first ran)."""
    found = counted(fold, kind, which)
    if found is None:
        return []
    times = found[1]
    n = times["iterations"]
    means = {layer: [phases.get(p, (0.0, 0))[0] / n for p in PHASES]
             for layer, phases in times["steps"].items()}
    whole = sum(sum(m) for m in means.values())
    rows = [LayerTime(layer, types.get(layer, UNKNOWN), *m, sum(m) / whole if whole else 0.0)
            for layer, m in means.items()]
    return sorted(rows, key=lambda r: -r.total)


def type_times(rows: list[LayerTime]) -> list[TypeTime]:
    """``layer_times`` summed by layer type, longest total first."""
    by_type: dict = {}
    for row in rows:
        entry = by_type.setdefault(row.type, [0] + [0.0] * len(PHASES))
        entry[0] += 1
        for i, phase in enumerate(PHASES, 1):
            entry[i] += getattr(row, phase)
    whole = sum(sum(e[1:]) for e in by_type.values())
    out = [TypeTime(t, e[0], *e[1:], sum(e[1:]) / whole if whole else 0.0)
           for t, e in by_type.items()]
    return sorted(out, key=lambda r: -r.total)


def phase_times(fold, kind: str | None = None, which: str = "steady") -> PhaseTime | None:
    found = counted(fold, kind, which)
    if found is None:
        return None
    kind, times, warmup = found
    n = times["iterations"]
    phases = [sum(p.get(phase, (0.0, 0))[0] for p in times["steps"].values()) / n
              for phase in PHASES]
    copies = tuple((direction, nbytes / n, seconds / n) for direction, (nbytes, seconds)
                   in times.get("copies", {}).items() if nbytes)
    return PhaseTime(kind, n, warmup, times["wall"] / n, *phases, times["stall"] / n, copies)


class TimeTables:
    """The time tables as ``Trace`` methods (it mixes this in, and provides ``_update()``, its
    fold, and ``plans``)."""

    @property
    def layer_types(self) -> dict:
        """Each layer's type, as the trace's plans name them (empty without a plan)."""
        self._update()
        return {layer: kind for plan in self.plans for layer, kind in plan.types.items()}

    def time_table(self, iterations: str | None = None, which: str = "steady") -> list[LayerTime]:
        """Where the time goes, per layer: seconds per iteration in forward, backward and update
        steps, and the share of all the steps' time, longest first. ``iterations``: "train" or
        "eval" (default: training ones if the trace has any). ``which``: "steady" (default), the
        mean of the iterations after the first, which warms up (the first alone if it is the only
        one); "first", that first iteration; "all", the mean of every one. Empty without step
        times."""
        return layer_times(self._update(), self.layer_types, iterations, which)

    def time_by_type(self, iterations: str | None = None, which: str = "steady") -> list[TypeTime]:
        """``time_table`` summed by layer type (Convolution, ReLU, ...), longest first."""
        return type_times(self.time_table(iterations, which))

    def time_by_phase(self, iterations: str | None = None,
                      which: str = "steady") -> PhaseTime | None:
        """Seconds per iteration: wall, forward, backward, update, stalled, and which iterations
        are counted (``iterations`` and ``which`` as in ``time_table``); None without step
        times."""
        return phase_times(self._update(), iterations, which)


# -- text ----------------------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _cell(seconds: float) -> str:
    """A layer's or type's time in one phase: "-" where it has no such step."""
    return _ms(seconds) if seconds else "-"


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _columns(rows: list, left: int) -> list[str]:
    """Rows of cells as aligned lines: the first ``left`` columns left-aligned, the rest right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(f"{c:<{w}}" if i < left else f"{c:>{w}}"
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def copies_text(fold, phase: PhaseTime) -> list[str]:
    """The copies per iteration, each direction's bytes, time and rate, and the first
    iteration's apart where it is left out of the tables: a copy into a host page never touched
    before waits for the page to be mapped, so the first iteration's copies home can run many
    times slower than the later ones, and a rate over the whole run mixes the two."""
    def rates(counted: PhaseTime) -> str:
        return ", ".join(f"{direction.upper()} {format_bytes(round(nbytes))} in {_ms(seconds)} ms"
                         + (f" ({nbytes / seconds / 1e9:.3g} GB/s)" if seconds > 0 else "")
                         for direction, nbytes, seconds in counted.copies)
    if not phase.copies:
        return []
    out = [f"  copies per iteration: {rates(phase)}"]
    first = None if phase.warmup else phase_times(fold, phase.kind, "first")
    if first is not None and first.copies:
        out.append(f"  copies in the first (left out): {rates(first)}")
    return out


def time_text(fold, types: dict, top: int | None = 20) -> str:
    """The three time tables in words (``--table``): per phase, per layer (the ``top`` longest;
    None or 0: all), per layer type."""
    if fold.times is None:
        return ("time          no step times in this trace (a version 1 file, written before "
                "minilms kept them: record the run again)")
    phase = phase_times(fold)
    if phase is None:
        return "time          no timed iterations in this trace"
    n, kind, first = phase.iterations, phase.kind, fold.times_first[phase.kind]
    counts = ("the only one, warm-up included" if phase.warmup else
              f"the mean of {n}, after the first: {_ms(first['wall'])} ms, warm-up, left out")
    head = (f"time          per {KIND_WORDS.get(kind, kind)} iteration ({counts}): "
            f"{_ms(phase.wall)} ms wall, {_ms(phase.steps)} ms in steps, "
            f"{_ms(phase.stall)} ms stalled")
    others = {k: iteration_count(fold, k) for k in fold.times_first if k != kind}
    if others:
        head += " (not counted: " + ", ".join(f"{n_} {KIND_WORDS.get(k, k)}"
                                               for k, n_ in sorted(others.items())) + ")"
    layers = layer_times(fold, types, kind)
    shown = [p for p in PHASES if getattr(phase, p) or any(getattr(r, p) for r in layers)]
    rows = [("phase", "ms/iter", "% of wall")]
    rows += [(p, _ms(getattr(phase, p)), _percent(getattr(phase, p), phase.wall))
             for p in shown]
    rows += [("stalled (waiting for copies)", _ms(phase.stall),
              _percent(phase.stall, phase.wall)),
             ("outside the steps", _ms(phase.outside), _percent(phase.outside, phase.wall)),
             ("iteration (wall)", _ms(phase.wall), _percent(phase.wall, phase.wall))]
    out = [head, *_columns(rows, 1), *copies_text(fold, phase), ""]
    kept = layers[:top] if top and top > 0 else layers
    out.append(f"time per layer, ms per iteration, longest first ({len(kept)} of {len(layers)} "
               "layers)")
    rows = [("layer", "type", *shown, "total", "% of steps")]
    rows += [(r.layer, r.type, *(_cell(getattr(r, p)) for p in shown), _ms(r.total),
              _percent(r.share, 1.0)) for r in kept]
    out += _columns(rows, 2)
    if len(kept) < len(layers):
        rest = layers[len(kept):]
        seconds = sum(r.total for r in rest)
        out.append(f"  ({len(rest)} more layer{'s' * (len(rest) > 1)} left out: "
                   f"{_ms(seconds)} ms per iteration, {_percent(seconds, phase.steps)} of the "
                   "steps' time; --top 0 shows all)")
    out += ["", "time by layer type, ms per iteration, longest first"]
    rows = [("type", "layers", *shown, "total", "% of steps")]
    rows += [(t.type, str(t.layers), *(_cell(getattr(t, p)) for p in shown), _ms(t.total),
              _percent(t.share, 1.0)) for t in type_times(layers)]
    out += _columns(rows, 1)
    if layers and all(r.type == UNKNOWN for r in layers):
        out.append("  (no plan in this trace names the layers' types)")
    return "\n".join(out)
