"""Recompute in the plan (issue 21): drop an activation after its last forward use and rebuild it
before backward reads it, by re-running the forwards that made it.

A recompute is a *schedule rewrite*: for each chosen blob, the forwards that made it (its writer
and the in-place layers over it, ``cost.producers``) run again as steps of kind ``"recompute"``
right before the first backward-phase step that reads it. The blob's next use after its last
forward read is then the recompute's write, so the planner drops it there (no copy) and the
replay checker checks the rewritten schedule like any other: nothing in them knows about
recompute. What a re-run reads must be there when it runs (its bottoms, its learnable
parameters, the saved buffers its rule names): the schedule says so, and the planner keeps, moves
or rebuilds them as it would for any step; a bottom that is itself chosen, and not rebuilt yet, is
rebuilt first (a chain).

Which blobs, ``lms.recompute`` (``Policy.recompute``): ``off``; a list of layer types (every
candidate blob whose producers are all of those types, as PyTorch's selective checkpointing by
op); or ``auto``: the cost model weighs it (``choose``). A candidate is an activation that a
backward step reads, made by forwards that can be re-run exactly (``layers.recompute``), and not
a net output.

Training is bit for bit the same: a re-run's tops are the first forward's (each layer type's rule
says how: batch norm applies its saved statistics, dropout its saved mask), and it changes nothing
else.
"""
import math
from dataclasses import replace

from ..net import Net, Step
from .cost import producers, recompute_seconds, recompute_step, simulate, swap_seconds

RECOMPUTE = "recompute"
# layers whose forward is a pass over memory: cheap to run again
CHEAP = ("BatchNorm", "ReLU", "Pooling", "Eltwise", "Concat", "Dropout", "Flatten")


def candidates(net: Net, steps: list[Step]) -> list[str]:
    """The blobs a plan may recompute, in the order the forward makes them."""
    backward_reads = {name for step in steps if step.kind == "backward"
                      for name in step.reads + step.updates}
    outputs = {layer.top[0] for layer in net.layers if layer.is_loss or layer.type == "Accuracy"}
    found = []
    for step in steps:
        if step.kind != "forward" or step.part is not None:
            continue
        for name in net.layer[step.layer].top:
            info = net.blobs.get(name)
            if (name in found or name in outputs or name not in backward_reads or info is None
                    or info.role != "activation"):
                continue
            if all(type(layer).recompute.possible for layer in producers(net, name)):
                found.append(name)
    return found


def of_types(net: Net, blobs: list[str], types) -> list[str]:
    """The blobs whose producers are all of the layer ``types``."""
    wanted = set(types)
    return [b for b in blobs if all(layer.type in wanted for layer in producers(net, b))]


def checkpointed(net: Net, blobs: list[str], segments: int) -> list[str]:
    """Chen et al.'s checkpoints: ``blobs`` (in forward order) cut into ``segments`` runs of
    about equal bytes; the blob that ends a run is kept, the others returned, to recompute. A run
    ends at a blob that is costly to make again (not only memory-bound layers made it), so a
    cheap batch norm or ReLU output is rebuilt from the convolution's kept output rather than
    the reverse (Chen et al.'s "mirror" of cheap operators). With sqrt(N) segments a chain of N
    blocks holds O(sqrt(N)) activations for one extra forward: the kept blobs, and one segment
    rebuilt at a time before its backward."""
    total = sum(net.blobs[b].nbytes for b in blobs)
    share, run, chosen = total / max(1, segments), 0, []
    for name in blobs:
        run += net.blobs[name].nbytes
        cheap = all(layer.type in CHEAP for layer in producers(net, name))
        if run >= share - 1e-9 and not cheap:
            run = 0
        else:
            chosen.append(name)
    return chosen


def recompute_schedule(net: Net, steps: list[Step], blobs) -> list[Step]:
    """``steps`` with the forwards that make each of ``blobs`` run again, as steps of kind
    ``"recompute"``, right before the first backward-phase step that reads it (a bottom of
    theirs that is chosen too is rebuilt before them); numbered again in order."""
    chosen = set(blobs)
    first_read: dict = {}
    for position, step in enumerate(steps):
        if step.kind == "forward":
            continue
        for name in step.reads + step.updates:
            if name in chosen:
                first_read.setdefault(name, position)
    before: dict = {}        # position -> recompute steps to run before it
    rebuilt: set = set()

    def rebuild(name: str, position: int) -> None:
        if name in rebuilt:
            return
        rebuilt.add(name)
        for layer in producers(net, name):
            for bottom in layer.bottom:
                if bottom in chosen and bottom != name:
                    rebuild(bottom, position)
            step = recompute_step(net, layer)
            before.setdefault(position, []).append(replace(step, kind=RECOMPUTE))
    for name, position in sorted(first_read.items(), key=lambda item: item[1]):
        rebuild(name, position)
    out: list[Step] = []
    for position, step in enumerate(steps):
        out.extend(before.get(position, ()))
        out.append(step)
    return [replace(step, index=i) for i, step in enumerate(out)]


def choose(net: Net, steps: list[Step], policy, plan, model=None):
    """``(plan, blobs)``: the plan of ``steps`` with the blobs ``policy.recompute`` says rebuilt
    (``plan(schedule)`` makes one). A list of layer types takes every candidate of those types.
    ``auto`` weighs, by ``model``'s predicted iteration time, the plan without recompute against
    plans that recompute: the outputs of the memory-bound layers (batch norm, ReLU, pooling,
    sums, concats, dropout: cheap to run again, from inputs their own backward needs anyway),
    then the candidates with the most bytes per second of re-run (a quarter, half, all of
    them), then those whose re-run is faster than their copy out and back in, then sqrt(N)
    checkpoints (``checkpointed``). The fastest that fits wins, the plan
    without recompute on a tie."""
    from ..errors import PlanError
    found = candidates(net, steps)
    if policy.recompute != "auto":
        blobs = of_types(net, found, policy.recompute)
        return plan(recompute_schedule(net, steps, blobs)), blobs
    if model is None or not found:
        return plan(steps), []
    worth = sorted(found, key=lambda b: -net.blobs[b].nbytes
                   / max(recompute_seconds(net, b, model), 1e-12))
    tiers = [[], of_types(net, found, CHEAP)] + [worth[:max(1, len(worth) // share)]
                                                 for share in (4, 2, 1)]
    # the rule per blob: a re-run faster than the copy out and back in (what prefetch hides
    # of the copy, the plan's simulation weighs)
    tiers.append([b for b in found
                  if recompute_seconds(net, b, model) < swap_seconds(net, b, model)])
    tiers.append(checkpointed(net, found, round(math.sqrt(len(found)))))
    tiers = list({frozenset(blobs): blobs for blobs in tiers}.values())    # each set planned once
    best = None
    for number, blobs in enumerate(tiers):
        try:
            made = plan(recompute_schedule(net, steps, blobs) if blobs else steps)
        except PlanError:
            if number == len(tiers) - 1 and best is None:
                raise
            continue
        seconds = simulate(made, net, model).seconds
        if best is None or seconds < best[0] - 1e-12:
            best = (seconds, made, blobs)
    return best[1], best[2]


def recomputed(net: Net, plan) -> list[str]:
    """The blobs a plan rebuilds: the tops of its recompute steps, in the order they run."""
    return list(dict.fromkeys(top for step_plan in plan.steps
                              if step_plan.step.kind == RECOMPUTE
                              for top in net.layer[step_plan.step.layer].top))
