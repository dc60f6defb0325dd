"""The views of a trace people read: the summary text and the picture of the pool over time,
and the timeline of the pool by role both the picture and the Chrome export draw from.

The picture is meant to be read at a glance: device memory stacked by role (what fills the pool),
the capacity and the planner's least pool as lines (how close the run came to each), and below it
one lane each for the steps (forward and backward shaded), H2D copies, D2H copies and stalls, so
a swap can be matched with the step that caused it. It is drawn on a bare matplotlib ``Figure``
(Agg, no pyplot, nothing shown), which a notebook displays inline when it is returned.
"""
from typing import NamedTuple

import numpy as np

from ..errors import TraceError
from ..sizes import format_bytes
from .fold import ROLE_ORDER, PoolReplay
from .timing import time_text

ROLE_COLORS = {"param": "#1f77b4", "param_grad": "#9ecae1", "activation": "#ff7f0e",
               "activation_grad": "#fdae6b", "optimizer_state": "#9467bd",
               "workspace": "#969696", "input": "#2ca02c", "other": "#8c564b"}
PHASE_COLORS = {"forward": "#4c78a8", "backward": "#e45756"}
STEP_COLORS = {**PHASE_COLORS, "recompute": "#f58518"}     # a recompute's steps, in the lanes
LANES = ("stall", "D2H", "H2D", "steps")


class Timeline(NamedTuple):
    times: np.ndarray          # clock seconds: the trace's start, then each pool event
    by_role: dict              # role -> bytes in use after each of those moments
    gaps: list                 # times where folded iterations were cut out


def timeline(trace) -> Timeline:
    trace._update()                    # the roles the events name, before replaying the pool
    replay = PoolReplay(trace.roles, trace.initial_live)
    times, rows, gaps = [trace.origin], [tuple(replay.by_role.values())], []
    for event in trace.events:
        if event.kind == "alloc" or event.kind == "free":
            if not replay.started:
                replay.begin(event)
                rows[-1] = tuple(replay.by_role.values())
            replay.apply(event)
        elif event.kind == "gap":
            replay = PoolReplay(trace.roles, event.detail["live"])
            gaps.append(event.time)
        else:
            continue
        times.append(event.time)
        rows.append(tuple(replay.by_role.values()))
    matrix = np.array(rows, dtype=np.int64).reshape(len(rows), len(ROLE_ORDER))
    by_role = {role: matrix[:, i] for i, role in enumerate(ROLE_ORDER) if matrix[:, i].any()}
    return Timeline(np.array(times), by_role, gaps)


# -- text ----------------------------------------------------------------------------------------
def _percent(part, whole) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def split_steps(names: list) -> dict:
    """``{"forward bn1": chunks}`` for the steps a plan split along the batch, from its step
    names (a sub-step is ``"forward bn1 [sum_x 0:4]"``: ``minilms.lms.substeps.Part.label``)."""
    ranges: dict = {}
    for name in names:
        if name.endswith("]") and " [" in name:
            whole, part = name[:-1].split(" [", 1)
            chunk = part.rsplit(" ", 1)[-1] if " " in part else None
            ranges.setdefault(whole, set())
            if chunk is not None:
                ranges[whole].add(chunk)
    return {whole: len(chunks) for whole, chunks in ranges.items()}


def summary_text(trace, table: bool = False, top: int | None = 20) -> str:
    fold, plan = trace._update(), trace.main_plan
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(fold.iterations.items())) or "none"
    span = (fold.last_time - fold.first_time) if fold.first_time is not None else 0.0
    out = [f"minilms trace: iterations {kinds}; {fold.kernels} steps run; "
           f"{len(trace.events)} events kept over {span:.3f} s"]
    if plan:
        out.append(f"plan          {plan.policy}")
        split = split_steps(plan.steps)
        if split:
            out.append("split         " + ", ".join(f"{name} in {chunks}"
                                                     for name, chunks in split.items()))
    capacity, least = trace.capacity, plan.least_pool if plan else None
    pool = [f"capacity {format_bytes(capacity)}" if capacity else "capacity unknown"]
    if least:
        pool.append(f"the planner's least pool {format_bytes(least)}")
    elif plan:
        pool.append("least pool not computed (Trace.least_pool)")
    out.append("pool          " + ", ".join(pool))
    step = f"at step {fold.peak_step[0]} ({fold.peak_step[1]})" if fold.peak_step else \
        "outside any step"
    near = [f"{_percent(fold.peak, capacity)} of capacity"] if capacity else []
    if least:
        near.append(f"{_percent(fold.peak, least)} of the least pool")
    out.append(f"peak          {format_bytes(fold.peak)} {step}"
               + (f": {', '.join(near)}" if near else ""))
    roles = [r for r in ROLE_ORDER if fold.at_peak.get(r) or fold.role_peak.get(r)]
    if roles:
        out.append(f"  {'role':<17}{'at the peak':>12}{'own peak':>12}")
        out += [f"  {r:<17}{format_bytes(fold.at_peak.get(r, 0)):>12}"
                f"{format_bytes(fold.role_peak.get(r, 0)):>12}" for r in roles]
    if fold.peak_owners:
        out.append("biggest then  " + ", ".join(f"{o} {format_bytes(b)} ({r})"
                                                for o, b, r in fold.peak_owners[:4]))
    moved = {d: (sum(b for b, _ in fold.issued[d].values()),
                 sum(n for _, n in fold.issued[d].values())) for d in ("h2d", "d2h")}
    line = (f"copies        H2D {format_bytes(moved['h2d'][0])} in {moved['h2d'][1]}, "
            f"D2H {format_bytes(moved['d2h'][0])} in {moved['d2h'][1]}")
    if plan:
        line += (f" ({'training' if plan.train else 'evaluation'} plan: "
                 f"{format_bytes(plan.predicted['h2d'])} H2D, "
                 f"{format_bytes(plan.predicted['d2h'])} D2H per iteration)")
    out.append(line)
    busy = fold.ran["h2d"][2] + fold.ran["d2h"][2]
    if busy:
        out.append(f"              copy time {busy * 1e3:.2f} ms over the run (H2D "
                   f"{fold.ran['h2d'][2] * 1e3:.2f} ms, D2H {fold.ran['d2h'][2] * 1e3:.2f} ms; "
                   "per iteration, the first apart: --table)")
    out.append(f"dropped       {format_bytes(sum(fold.dropped.values()))} given back without "
               "a copy")
    seconds, waits, longest, where = fold.stall
    out.append(f"stalled       {seconds * 1e3:.2f} ms waiting for copies, {waits} waits"
               + (f" (longest {longest * 1e3:.2f} ms, before {where})" if waits else ""))
    out.append(f"compute       {fold.compute_seconds * 1e3:.2f} ms in {fold.kernels} steps")
    if table:
        out += ["", layer_table_text(trace), "", time_text(fold, trace.layer_types, top)]
    return "\n".join(out)


def layer_table_text(trace) -> str:
    columns = ("layer", "in (H2D)", "out (D2H)", "dropped", "pinned")
    rows = [(r.layer, *(format_bytes(v) for v in (r.h2d, r.d2h, r.dropped, r.pinned)))
            for r in trace.layer_table()]
    if not rows:
        return "(no bytes moved, dropped or pinned)"
    widths = [max(len(row[i]) for row in rows + [columns]) for i in range(len(columns))]
    return "\n".join("  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                               for i, (c, w) in enumerate(zip(row, widths)))
                     for row in [columns] + rows)


# -- picture -------------------------------------------------------------------------------------
def _window(trace, iteration):
    """(start, end, label) of what the picture shows."""
    spans = [e for e in trace.events if e.kind == "iteration"]
    if not spans:
        if iteration is not None:
            raise TraceError(f"iteration {iteration}: the trace has no iterations")
        times = [e.time for e in trace.events] or [trace.origin]
        return min(trace.origin, *times), max(times), "the whole trace"
    if iteration is None:
        train = [i for i, e in enumerate(spans) if e.who == "train"] or [len(spans) - 1]
        iteration = train[-1]
    if not -len(spans) <= iteration < len(spans):
        raise TraceError(f"iteration {iteration}: the trace keeps {len(spans)} iterations "
                         f"(0..{len(spans) - 1})")
    event = spans[iteration]
    return event.detail["start"], event.detail["end"], \
        f"{event.who} iteration {iteration % len(spans) + 1} of the {len(spans)} kept"


def _unit(nbytes: float):
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= 2 * size:
            return name, size
    return "B", 1


def _axis(kind, kernels, start, end):
    """``(seconds -> x, x label)``. ``"step"``: every step the same width, from the end of the
    step before it to its own end (what was staged for it, then its compute), so the pattern
    of an iteration does not depend on which step happened to run slowly; copies and stalls
    land where they happened in time within their step. ``"time"``: milliseconds."""
    if kind == "time" or not kernels:
        return (lambda t: (np.asarray(t) - start) * 1e3), "time (ms)"
    if kind != "step":
        raise TraceError(f"axis {kind!r}: expected 'step' or 'time'")
    knots = np.maximum.accumulate([start] + [k.detail["end"] for k in kernels] + [end])
    positions = np.append(np.arange(len(kernels) + 1, dtype=float), len(kernels) + 0.5)
    first = kernels[0].detail["step"]
    label = (f"step (equal widths; steps {first}..{kernels[-1].detail['step']}, then the "
             "copies after the last)") if len(kernels) > 1 else "step"
    return (lambda t: np.interp(t, knots, positions) + first), label


def plot(trace, iteration=None, axis="step"):
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    start, end, label = _window(trace, iteration)
    end = max(end, start + 1e-6)
    line = timeline(trace)
    capacity, plan = trace.capacity, trace.main_plan
    least = trace.least_pool if plan is not None else None
    kernels = sorted((e for e in trace.events if e.kind == "kernel"
                      and e.detail["end"] >= start and e.detail["start"] <= end),
                     key=lambda e: e.detail["start"])
    place, xlabel = _axis(axis, kernels, start, end)
    # The pool as it stood at the window's start, then every change inside it: steps, not slopes.
    inside = np.flatnonzero((line.times > start) & (line.times <= end))
    first = max(int(np.searchsorted(line.times, start, side="right")) - 1, 0)
    index = np.concatenate([[first], inside])
    times = np.concatenate([[start], line.times[inside]])
    x = place(np.append(np.repeat(times, 2)[1:], end))
    totals = sum((values[index] for values in line.by_role.values()), np.zeros(len(index)))
    top = max([capacity or 0, least or 0, int(totals.max(initial=0)), 1])
    unit, scale = _unit(top)

    figure = Figure(figsize=(12, 6.4), layout="constrained")
    grid = figure.add_gridspec(2, 1, height_ratios=(4.2, 1.3))
    ax = figure.add_subplot(grid[0])
    lanes = figure.add_subplot(grid[1], sharex=ax)
    roles = list(line.by_role)
    if roles:
        ax.stackplot(x, *[np.repeat(line.by_role[r][index], 2) / scale for r in roles],
                     labels=[r.replace("_", " ") for r in roles],
                     colors=[ROLE_COLORS[r] for r in roles], alpha=0.9, linewidth=0)
    else:
        ax.text(0.5, 0.5, "no pool events in this window", transform=ax.transAxes,
                ha="center", color="grey")
    if capacity:
        ax.axhline(capacity / scale, color="black", linewidth=1.6,
                   label=f"capacity {format_bytes(capacity)}")
    if least:
        ax.axhline(least / scale, color="crimson", linewidth=1.3, linestyle="--",
                   label=f"planner's least pool {format_bytes(least)}")
    _shade_phases(ax, kernels, place, blended_transform_factory(ax.transData, ax.transAxes))
    peak_at = int(np.argmax(totals)) if len(totals) else None
    if peak_at is not None and totals[peak_at] > 0:
        when = times[peak_at]
        step = next((k.who for k in kernels if k.detail["end"] >= when), "after the last step")
        left = place(when) > place(start) + 0.6 * (place(end) - place(start))
        ax.annotate(f"peak {format_bytes(totals[peak_at])}\n{step}",
                    (place(when), totals[peak_at] / scale), xytext=(-14 if left else 14, -34),
                    textcoords="offset points", fontsize=9, ha="right" if left else "left",
                    bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85,
                          "linewidth": 0},
                    arrowprops={"arrowstyle": "->", "color": "black"})
    for gap in line.gaps:
        if start <= gap <= end:
            ax.axvline(place(gap), color="grey", linestyle=":", linewidth=1)
    ax.set_ylim(0, top / scale * 1.12)
    ax.set_xlim(place(start), place(end))
    ax.set_ylabel(f"device pool ({unit})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.tick_params(labelbottom=False)
    _lanes(lanes, trace, kernels, start, end, place)
    lanes.set_xlabel(xlabel)
    ax.set_title(_title(trace, label, start, end, totals, capacity, plan), fontsize=10,
                 loc="left")
    return figure


def _title(trace, label, start, end, totals, capacity, plan) -> str:
    peak = int(totals.max(initial=0))
    headline = f"Device memory, {label}: peak {format_bytes(peak)}"
    if capacity:
        headline += f" ({_percent(peak, capacity)} of capacity)"
    within = [e for e in trace.events if start <= e.time <= end]
    moved = {kind: format_bytes(sum(e.nbytes for e in within if e.kind == kind))
             for kind in ("h2d", "d2h")}
    stalled = sum(e.detail["end"] - e.detail["start"] for e in within if e.kind == "stall")
    detail = f"H2D {moved['h2d']}, D2H {moved['d2h']}, stalled {stalled * 1e3:.1f} ms"
    if plan:
        detail += f"; {plan.policy}"
    fold = trace._update()
    if fold.peak_step and fold.peak > peak:
        detail += f"\nwhole trace: peak {format_bytes(fold.peak)} at {fold.peak_step[1]}"
    return f"{headline}\n{detail}"


def _shade_phases(ax, kernels, place, transform) -> None:
    """Forward and backward (with the updates that follow each backward) as shaded regions."""
    spans = []
    for kernel in kernels:
        phase = "forward" if kernel.detail["phase"] == "forward" else "backward"
        if spans and spans[-1][0] == phase:
            spans[-1][2] = kernel.detail["end"]
        else:
            spans.append([phase, kernel.detail["start"], kernel.detail["end"]])
    for phase, begin, finish in spans:
        left, right = place(begin), place(finish)
        ax.axvspan(left, right, color=PHASE_COLORS[phase], alpha=0.07, linewidth=0)
        ax.text((left + right) / 2, 0.985, phase, transform=transform, ha="center",
                va="top", fontsize=9, color=PHASE_COLORS[phase])


def _lanes(axis, trace, kernels, start, end, place) -> None:
    """One row each: steps by phase, H2D and D2H copies as they ran, stalls. Short spans are
    widened to a visible tick."""
    least = (place(end) - place(start)) * 0.0015
    rows = {lane: [] for lane in LANES}
    for kernel in kernels:
        phase = kernel.detail["phase"] if kernel.detail["phase"] in STEP_COLORS else "backward"
        rows["steps"].append((kernel.detail["start"], kernel.detail["end"], STEP_COLORS[phase]))
    for event in trace.events:
        if event.kind == "copy":
            lane = event.detail["direction"].upper()
            rows[lane].append((event.detail["start"], event.detail["end"],
                               "#2ca02c" if lane == "H2D" else "#d62728"))
        elif event.kind == "stall":
            rows["stall"].append((event.detail["start"], event.detail["end"], "#000000"))
    for y, lane in enumerate(LANES):
        spans = [(place(a), max(place(b) - place(a), least), c) for a, b, c in rows[lane]
                 if b >= start and a <= end]
        if spans:
            axis.broken_barh([(a, w) for a, w, _ in spans], (y - 0.35, 0.7),
                             facecolors=[c for *_, c in spans], linewidth=0)
    axis.set_yticks(range(len(LANES)), LANES, fontsize=9)
    axis.set_ylim(-0.6, len(LANES) - 0.4)
    axis.grid(axis="x", alpha=0.3)
