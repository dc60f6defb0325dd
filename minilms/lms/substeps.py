"""Sub-steps: a step split along the batch, as steps the planner places and the executor runs.

Issue 20. A layer declares how its step splits (``minilms.layers.split``); here a split step
becomes *sub-steps*, one per pass and chunk of samples, each an ordinary ``Step`` with a ``Part``
that says which. A sub-step names the *chunks* it touches, ``x[n0:n1]``: blobs of their own to the
planner (sizes, places, copies), declared in the net beside their parent (``net.chunks``). Blobs
are sample-major, so a chunk's home is rows ``n0 .. n1`` of its parent's home, and a chunk comes in
or goes out as those rows.

What a sub-step of a phase declares, from the unsplit step's lists:

* the batch blobs the step reads (bottoms, top gradients, per-sample saved buffers): their chunk,
  read, in every pass over the chunks; a once-pass gets none (it sees empty rows);
* the batch blobs the step writes (tops, bottom gradients, per-sample saved buffers): their chunk,
  written, in the *last* pass over the chunks only, the one that writes them (BatchNorm's
  normalisation, its input gradient); an in-place blob (ReLU's) is updated in every pass;
* what the whole step shares (parameters and their gradients, statistics, workspace): in every
  sub-step, as the step declares it, except that what the step writes is written by the first
  sub-step and updated by the rest (the first writes it, or its value is not read before);
* what is carried from sub-step to sub-step: the layer's split workspace (BatchNorm's partial
  sums) and workspace that holds a sum (Accuracy's hit count), written first, then updated;
* the temporaries of the sums (``split_buffers``), as workspace of every chunk after the first.

The planner keeps a blob and its chunks consistent (``minilms.lms.liveness``: a chunk's need is any
overlapping blob's; ``minilms.lms.planner``: no two overlapping blobs resident at once, the host
copy valid per sample), and the replay checker checks it per sample (``minilms.lms.check``).
"""
from dataclasses import dataclass, replace

import numpy as np

from ..device.pool import align_up
from ..errors import PlanError, ShapeError
from ..layers.split import CHUNKS, ONCE, chunk_bounds, rule_of, split_buffers
from ..net import Net, Step
from ..sizes import format_bytes
from .plan import Plan


@dataclass(frozen=True)
class Part:
    """Which sub-step of a split step a ``Step`` is."""
    phase: str                 # "forward", "backward", "inference"
    method: str                # the layer method the pass calls
    chunk: tuple | None        # (n0, n1): its samples; None: once for the whole step
    index: int                 # the chunk's number (0 for a once-pass)
    chunks: int                # how many chunks the step is split into
    names: tuple = ()          # (whole name, chunk name or None: empty rows) per batch blob
    temps: tuple = ()          # (split_buffers name, blob name) for this sub-step

    @property
    def label(self) -> str:
        where = f" {self.chunk[0]}:{self.chunk[1]}" if self.chunk else ""
        return f"[{self.method}{where}]"


def chunk_name(parent: str, n0: int, n1: int) -> str:
    return f"{parent}[{n0}:{n1}]"


def phase_of(step: Step, train: bool) -> str:
    if step.kind == "backward":
        return "backward"
    return "forward" if train else "inference"


def splittable(net: Net, step: Step, train: bool) -> bool:
    """Whether ``step`` may run as sub-steps: its layer declares how, for this phase, and the
    batch has two samples or more."""
    if step.kind not in ("forward", "backward") or step.part is not None:
        return False
    layer = net.layer[step.layer]
    try:
        rule_of(layer, phase_of(step, train))
    except ShapeError:
        return False
    return layer.bottom_shapes[0][0] >= 2


def batch_blobs(net: Net, step: Step, train: bool) -> set:
    """The blobs of ``step`` that are sample-major and sliced with a chunk."""
    layer = net.layer[step.layer]
    rule = type(layer).split
    batch = set(layer.bottom) | {f"{b}.grad" for b in layer.bottom}
    batch |= {f"{b}.grad@{layer.name}" for b in layer.bottom}
    if rule.batch_tops:
        batch |= set(layer.top) | {f"{t}.grad" for t in layer.top}
    batch |= {f"{layer.name}.{name}" for name in rule.batch_saved}
    return batch & set(step.blobs)


def split_step(net: Net, step: Step, chunks: int, train: bool) -> list[Step]:
    """The sub-steps of ``step`` over ``chunks`` consecutive sample ranges (indices unset: the
    caller numbers the schedule), declaring the chunk blobs and split buffers in ``net``."""
    layer = net.layer[step.layer]
    phase = phase_of(step, train)
    rule = rule_of(layer, phase)
    n = layer.bottom_shapes[0][0]
    bounds = chunk_bounds(n, chunks)
    batch = batch_blobs(net, step, train)
    prefix = f"{layer.name}.split."
    buffers = split_buffers(layer, phase)
    sums = set(rule.sums)
    temps = [(spec.name, declare_buffer(net, prefix + spec.name, spec, "workspace"))
             for spec in buffers if spec.name in sums]
    carried = [declare_buffer(net, prefix + spec.name, spec, "activation")
               for spec in buffers if spec.name not in sums]
    carried += [f"{layer.name}.{name.split('.', 1)[1]}" for name in rule.sums
                if name.startswith("work.")]
    workspace = tuple(w for w in step.workspace if w not in carried)
    shared_writes = [b for b in step.writes if b not in batch]
    whole = {f"{layer.name}.{name.split('.', 1)[1]}" for name in rule.whole}
    # updated in place (a ReLU's top, its gradient) rather than summed into (another reader's)
    in_place = {b for b in step.updates if b in batch and (b in layer.top or b.endswith(".grad")
                                                           and b[:-5] in layer.top)}
    last = max(i for i, p in enumerate(rule.passes) if p.over == CHUNKS)
    out: list[Step] = []
    for number, one in enumerate(rule.passes):
        spans = [(None, 0)] if one.over == ONCE else [(b, i) for i, b in enumerate(bounds)]
        for bound, index in spans:
            first = not out
            names = {}

            def chunk(name):
                names[name] = declare_chunk(net, name, *bound)
                return names[name]
            reads = [b for b in step.reads if b not in batch]
            updates = [b for b in step.updates if b not in batch]
            writes = []
            if bound is not None:
                reads = [chunk(b) for b in step.reads if b in batch] + reads
                updates = [chunk(b) for b in step.updates if b in in_place] + updates
                if number == last:
                    writes += [chunk(b) for b in step.writes if b in batch]
                    updates = [chunk(b) for b in step.updates
                               if b in batch and b not in in_place] + updates
            else:
                reads = [b for b in step.blobs if b in whole] + reads
            (writes if first else updates).extend(shared_writes + carried)
            sub_temps = tuple(temps) if bound is not None and index > 0 else ()
            for name in batch:     # what it does not touch: empty rows (a once-pass reads
                if bound is not None or name not in whole:    # what ``whole`` names whole)
                    names.setdefault(name, None)
            part = Part(phase, one.method, bound, index, len(bounds),
                        tuple(sorted(names.items())), sub_temps)
            out.append(Step(
                -1, step.kind, step.layer, reads=tuple(dict.fromkeys(reads)),
                writes=tuple(dict.fromkeys(writes)), updates=tuple(dict.fromkeys(updates)),
                workspace=workspace + tuple(blob for _, blob in sub_temps),
                accumulate=step.accumulate if number == last and bound is not None else (),
                adds=step.adds, part=part))
    return out


def declare_chunk(net: Net, parent: str, n0: int, n1: int) -> str:
    info = net.blobs[parent]
    name = chunk_name(parent, n0, n1)
    net._declare(name, (n1 - n0,) + tuple(info.shape[1:]), info.dtype, info.role)
    net.chunks[name] = (parent, n0, n1)
    return name


def declare_buffer(net: Net, name: str, spec, role: str) -> str:
    return net._declare(name, spec.shape, spec.dtype_in(np.float32), role)


def split_schedule(net: Net, steps: list[Step], counts: dict, train: bool,
                   origin: list | None = None) -> list[Step]:
    """``steps`` with the step at position ``i`` split into ``counts[i]`` chunks (absent or 1:
    whole), numbered again in order. ``origin``, if given, gets each new step's position in
    ``steps``."""
    out: list[Step] = []
    for position, step in enumerate(steps):
        chunks = counts.get(position, 1)
        parts = split_step(net, step, chunks, train) if chunks > 1 else [step]
        base = len(out)
        out.extend([replace(part, index=base + i) for i, part in enumerate(parts)])
        if origin is not None:
            origin.extend([position] * len(parts))
    return out


def plan_split(net: Net, steps: list[Step], capacity: int, policy, plan, fill: float = 1.0,
               eager: bool = False, seconds=None) -> Plan:
    """``plan(schedule)`` of ``steps`` (the planner, or ``policy: auto``'s search), with the
    steps that do not fit split along the batch (``lms.split``): first those whose working set
    is over ``fill`` of the pool, into as few chunks as the bytes say fit; then, while planning
    fails at a step that can split, that step into more (one more up to four, then half as
    many again; ``eager``: twice as many, for a search that asks only whether anything fits).
    With ``seconds`` (a plan's predicted iteration time), twice as many chunks everywhere is
    weighed too: smaller chunks leave room around a huge step, which can save more copies than
    the extra sub-steps cost; the faster plan is kept. Raises the planner's error where no
    split helps."""
    try:
        return plan(steps)
    except PlanError:
        if policy.max_chunks == 1 or not policy.enabled:
            raise
    train = any(step.kind == "backward" for step in steps)
    counts = {}
    for position, step in enumerate(steps):
        if splittable(net, step, train):
            chunks = chunks_to_fit(net, step, int(capacity * fill), train)
            if chunks > 1:
                counts[position] = min(chunks, most_chunks(net, step, policy))
    while True:
        origin: list = []
        schedule = split_schedule(net, steps, counts, train, origin)
        try:
            made = plan(schedule)
        except PlanError as error:
            index = getattr(error, "step", None)
            if index is None:
                raise
            position = origin[index]
            step, now = steps[position], counts.get(position, 1)
            if not splittable(net, step, train) or now >= most_chunks(net, step, policy):
                raise
            more = 2 * now if eager else now + 1 if now < 4 else -(-now * 3 // 2)
            counts[position] = min(more, most_chunks(net, step, policy))
            continue
        if seconds is not None:
            made, counts = _weigh_more_chunks(net, steps, counts, train, policy, plan, seconds,
                                              made)
        split = ", ".join(f"{steps[p].name} in {k}" for p, k in sorted(counts.items()))
        made.notes.append(f"split along the batch to fit {format_bytes(capacity)}: {split}")
        return made


def _weigh_more_chunks(net, steps, counts, train, policy, plan, seconds, made):
    """``made`` and its counts, or the plan with every split step in twice as many chunks if
    the cost model predicts it faster."""
    more = {p: min(2 * k, most_chunks(net, steps[p], policy)) for p, k in counts.items()}
    if more == counts:
        return made, counts
    try:
        other = plan(split_schedule(net, steps, more, train))
    except PlanError:
        return made, counts
    if seconds(other) < seconds(made):
        return other, more
    return made, counts


def share_of_flops(layer, part: Part) -> float:
    """The share of its step's FLOPs a sub-step computes: its chunk's samples over the passes
    over the chunks (a once-pass's reductions: none worth counting)."""
    if part.chunk is None:
        return 0.0
    rule = rule_of(layer, part.phase)
    passes = sum(1 for one in rule.passes if one.over == CHUNKS)
    return (part.chunk[1] - part.chunk[0]) / layer.bottom_shapes[0][0] / passes


def most_chunks(net: Net, step: Step, policy) -> int:
    samples = net.layer[step.layer].bottom_shapes[0][0]
    return samples if policy.max_chunks is None else min(samples, policy.max_chunks)


def chunks_to_fit(net: Net, step: Step, capacity: int, train: bool) -> int:
    """The fewest chunks whose sub-steps' working sets fit ``capacity`` by their bytes alone:
    the batch blobs' share divided, what the step shares whole kept (1 if the step fits)."""
    batch = batch_blobs(net, step, train)
    sizes = {name: align_up(net.blobs[name].nbytes) for name in set(step.blobs)}
    whole = sum(sizes.values())
    if whole <= capacity:
        return 1
    per_sample = sum(sizes[name] for name in batch)
    room = capacity - (whole - per_sample)
    samples = net.layer[step.layer].bottom_shapes[0][0]
    return samples if room <= 0 else min(samples, max(2, -(-per_sample // room)))


def split_counts(steps: list[Step]) -> dict:
    """``{layer step name: chunks}`` of a schedule's split steps, for people."""
    counts: dict = {}
    for step in steps:
        if step.part is not None:
            counts[f"{step.kind} {step.layer}"] = step.part.chunks
    return counts
