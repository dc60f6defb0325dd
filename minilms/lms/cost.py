"""The planner's cost model: how long one iteration of a plan takes, and ``policy: auto``.

A plan is replayed on three streams, as the executor runs it (``minilms.lms.replay``), and, on a
GPU, the host beside them (``host_runs_ahead``: it queues a step's copies and kernels, its fixed
cost, and goes on while they run; nothing waits for it but what it has not queued yet): a copy
stream each way takes step ``i``'s copies once step ``i - 1`` has computed (its space may be
reused, its outputs swapped out), in plan order: releases, the step's own loads, then prefetches
for later steps; a load also waits for the swap-outs still reading its space or writing its blob's
home. The compute stream runs step ``i`` once step ``i - 1`` is done, step ``i``'s own loads have
landed and no copy is still using the space it writes. The time compute waits for copies is the
*stall*; prefetching moves loads under earlier compute, and a swap-out runs beside a load.

Step times come from the layers' FLOPs and the bytes each step touches, at rates a ``CostModel``
states (defaults per device kind; ``measure_cpu`` takes this machine's), added on the ``cpu``
device and the larger of the two on a GPU (``roofline``), plus a fixed cost per step (dispatch
and launches). Copies take ``bytes / link`` plus a fixed cost per copy (the hand-off
to the copy thread or engine). The model ranks plans; the executor's trace measures them.

``auto`` is the Caffe tuning guideline computed instead of tried: over pinning thresholds
(``min_swap_bytes``), keeping parameters and optimizer state resident or not, a soft limit of
the whole pool or none, and LMS off where it fits, it takes the plan with the least predicted
time; then the prefetch distance, likewise.
The choice is planned in full, so it always fits; a candidate that can no longer beat the best
so far is cut short while it is planned (``auto_plan``), which does not change the choice.

Swap or recompute (``lms.recompute`` chooses): ``swap_seconds`` is two copies on the link;
``recompute_seconds`` re-running the forwards that made the blob (``recompute_step``, costed by
``CostModel.step_seconds`` like any step).
"""
import time
from dataclasses import dataclass, replace

import numpy as np

from ..device.pool import ALIGNMENT
from ..errors import PlanError
from ..kernels.gemm import INNER_LOOP_FFMA_SHARE
from ..layers.recompute import in_place, recompute_reads, recompute_writes
from ..net import Net, Step
from ..sizes import format_bytes
from .collector import collector_paused
from .forked import map_halves
from .liveness import Liveness
from .plan import Plan, Policy
from .planner import make_plan, pinned_blobs
from .substeps import plan_split, share_of_flops

GB = 1e9

# The cuda device's constants, for an H100 PCIe, from the kernels themselves or measured on an
# H100 SXM and an H200 (docs/benchmarks.md, "CUDA on an H100" and "... on an H200"); the model as
# a whole is a prediction. The FLOP rate is what the convolutions reached, under the GEMM's bound
# (kernels.gemm.INNER_LOOP_FFMA_SHARE); a step's host time is its launches (a launcher and
# kernels/prepared_launch.py) plus the executor's own Python work.
GPU_FP32_PEAK = 51.2e12      # FLOP/s: an H100 PCIe, 114 SMs x 128 FP32 lanes x 2 x 1.755 GHz
CONV_SHARE_OF_PEAK = 0.18    # what the convolutions reached of the peak, measured (H200)
GPU_MEMORY = 2.0e12          # bytes/s: its HBM2e
MEMORY_SHARE_OF_PEAK = 0.10  # what memory-bound layers reached of it (a blob counted once), H200
GPU_LINK = 25 * GB           # bytes/s: PCIe 4.0 x16 as copies reach it, where no link is named
LAUNCH_SECONDS = 20e-6       # host time a launch costs: a launcher and prepared_launch (H100 host)
LAUNCHES_PER_STEP = 2.55     # scripts/launch_count.py: ResNet-18 launches 459 times in 180 steps
HOST_STEP_SECONDS = 55e-6    # the executor's own work a step: 10 ms an iteration of ResNet-18's
#                              180 steps, measured with the kernels counted and not run
COPY_SECONDS = 10e-6         # a cudaMemcpyAsync's host time

PREFETCH_CHOICES = (1, 2, 3, 4, 6, 8)
THRESHOLD_QUANTILES = (0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9)


@dataclass(frozen=True)
class CostModel:
    flops_per_second: float
    memory_bytes_per_second: float
    copy_bytes_per_second: float
    name: str = ""
    step_seconds_fixed: float = 0.0     # each step's own cost: dispatch, launches, bookkeeping
    copy_seconds_fixed: float = 0.0     # each copy's: a hand-off to the copy thread or engine
    # a GPU's host queues a step's kernels and goes on to the next step while they run, so its
    # fixed cost is a host stream's time beside the device's, not added to it (the cpu device
    # runs its kernels on the host: added)
    host_runs_ahead: bool = False
    # a GPU kernel's memory traffic runs under its arithmetic: a step's work is the larger of
    # the two times (a roofline); the cpu device's cores wait for memory: the sum
    roofline: bool = False

    @classmethod
    def for_device(cls, kind: str, link=None) -> "CostModel":
        """Typical rates: the ``cpu`` device of a small machine, or a GPU; the copy rate is the
        link's where one is modelled (never above memory's). A GPU's come from its kernels:
        ``cuda_flops``, the HBM's rate times ``MEMORY_SHARE_OF_PEAK``, and a step's host time
        ``LAUNCHES_PER_STEP x LAUNCH_SECONDS + HOST_STEP_SECONDS``."""
        if kind == "cpu":
            flops, memory, copy, fixed = 40e9, 8 * GB, 6 * GB, (100e-6, 30e-6)
        else:
            flops, memory, copy = cuda_flops(), GPU_MEMORY * MEMORY_SHARE_OF_PEAK, GPU_LINK
            fixed = (LAUNCHES_PER_STEP * LAUNCH_SECONDS + HOST_STEP_SECONDS, COPY_SECONDS)
        # a GPU copies at the link's rate; the cpu device no faster than memory
        if link is not None:
            copy = link.bytes_per_second if kind == "cuda" else min(copy, link.bytes_per_second)
        what = f"{kind}, link {link.name}" if link is not None else kind
        return cls(flops, memory, copy, what if kind == "cpu" else f"{what} (predicted)",
                   *fixed, host_runs_ahead=kind != "cpu", roofline=kind != "cpu")

    def with_link(self, link) -> "CostModel":
        copy = self.memory_bytes_per_second if link is None else \
            min(self.memory_bytes_per_second, link.bytes_per_second)
        return replace(self, copy_bytes_per_second=copy,
                       name=f"{self.name.split(',')[0]}, link {link.name if link else 'none'}")

    def step_seconds(self, net: Net, step: Step) -> float:
        """The step's fixed cost and its work: what it costs alone, nothing overlapping it."""
        return sum(self.step_parts(net, step))

    def step_parts(self, net: Net, step: Step) -> tuple[float, float]:
        """``(host, device)`` seconds of a step on the timeline: the host's time to queue it
        beside the device's to run it where the host runs ahead, else ``(0, both)``."""
        layer = net.layer[step.layer]
        flops = {"forward": 1, "recompute": 1, "backward": 2, "update": 0}[step.kind] \
            * layer.flops()
        if step.part is not None:     # a sub-step: its chunk's share of one pass over the batch
            flops *= share_of_flops(layer, step.part)
        touched = sum(net.blobs[name].nbytes for name in set(step.blobs))
        compute, memory = flops / self.flops_per_second, touched / self.memory_bytes_per_second
        work = max(compute, memory) if self.roofline else compute + memory
        if self.host_runs_ahead:
            return self.step_seconds_fixed, work
        return 0.0, self.step_seconds_fixed + work

    def copy_seconds(self, nbytes: int) -> float:
        return self.copy_seconds_fixed + nbytes / self.copy_bytes_per_second

    def describe(self) -> str:
        return (f"{self.name}: {self.flops_per_second / 1e9:.0f} GFLOP/s, memory "
                f"{self.memory_bytes_per_second / GB:.1f} GB/s, copies "
                f"{self.copy_bytes_per_second / GB:.1f} GB/s, {self.step_seconds_fixed * 1e6:.0f} "
                f"us a step{' of host time, beside the device' if self.host_runs_ahead else ''}"
                f"{', its work the larger of FLOPs and bytes' if self.roofline else ''}, "
                f"{self.copy_seconds_fixed * 1e6:.0f} us a copy")


def cuda_flops() -> float:
    """The GPU's FLOP/s for the cost model: its FP32 peak times the share the convolutions
    reached on a GPU (``CONV_SHARE_OF_PEAK``), under the ceiling the GEMM's instruction mix
    sets (``INNER_LOOP_FFMA_SHARE``, the model's rate until the convolutions' was measured)."""
    return GPU_FP32_PEAK * min(CONV_SHARE_OF_PEAK, INNER_LOOP_FFMA_SHARE)


def measure_cpu(link=None, repeat: int = 3) -> CostModel:
    """This machine's rates for the ``cpu`` device: a 512x512 float32 GEMM (BLAS, as the
    convolutions and inner products use) and a 32 MiB copy. About a tenth of a second."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 512, 512), dtype=np.float32)
    src, dst = np.ones(8 << 20, np.float32), np.empty(8 << 20, np.float32)
    best_gemm = best_copy = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        a @ b
        best_gemm = min(best_gemm, time.perf_counter() - start)
        start = time.perf_counter()
        np.copyto(dst, src)
        best_copy = min(best_copy, time.perf_counter() - start)
    memory = 2 * src.nbytes / best_copy      # read and write
    typical = CostModel.for_device("cpu")
    model = CostModel(2 * 512**3 / best_gemm, memory, src.nbytes / best_copy, "cpu (measured)",
                      typical.step_seconds_fixed, typical.copy_seconds_fixed)
    return model.with_link(link) if link is not None else model


@dataclass
class Timeline:
    """Predicted seconds per step: compute start and end, the stall before it; and totals."""
    start: list
    end: list
    stall: list
    copy_seconds: float
    compute_seconds: float
    seconds: float

    @property
    def stall_seconds(self) -> float:
        return sum(self.stall)


def simulate(plan: Plan, net: Net, model: CostModel) -> Timeline:
    """Replay ``plan`` on the three streams described in the module docstring."""
    times = step_times(net, [step_plan.step for step_plan in plan.steps], model)
    streams = _Streams(model)
    for step_plan, (host, device) in zip(plan.steps, times):
        streams.step(step_plan, device, host)
    return streams.finish(plan.epilogue)


class _Streams:
    """The three streams of ``simulate``, fed a step at a time: ``policy: auto`` watches each
    candidate's time grow while it is planned, and stops one that can no longer win."""

    def __init__(self, model: CostModel):
        self.model = model
        self.free = {"h2d": 0.0, "d2h": 0.0}     # when each copy stream is next idle
        self.compute_end = 0.0
        self.host = 0.0         # when the host has queued the steps so far (``host_runs_ahead``)
        # copies that may still run: (end, start, stop, blob) by direction
        self.flying: dict = {"h2d": [], "d2h": []}
        self.starts, self.ends, self.stalls = [], [], []
        self.copies = self.compute = 0.0
        self.moved = 0            # bytes copied, either way: ``Plan.bytes_moved`` of both

    def _copy(self, action) -> float:
        """Queue ``action``'s copy on its stream; returns when it ends."""
        direction = action.copies
        start, stop = action.offset, action.offset + action.size
        begin = max(self.free[direction], self.compute_end, self.host)
        if direction == "h2d":      # after the swap-outs reading its space or writing its home
            for end, a, b, blob in self.flying["d2h"]:
                if end > begin and ((a < stop and start < b) or blob == action.blob):
                    begin = end
        seconds = self.model.copy_seconds(action.nbytes)
        end = self.free[direction] = begin + seconds
        self.copies += seconds
        self.moved += action.nbytes
        self.flying[direction].append((end, start, stop, action.blob))
        return end

    def step(self, step_plan, seconds: float, host: float = 0.0) -> None:
        """The step's copies and then ``seconds`` on the compute stream, once the host has spent
        ``host`` queuing it (``CostModel.step_parts``); the wait for its own copies is its
        stall."""
        for direction, flying in self.flying.items():   # what ended before now matters no more
            self.flying[direction] = [f for f in flying if f[0] > self.compute_end]
        self.host += host
        ready = queued = max(self.compute_end, self.host)
        for action in step_plan.release + step_plan.demand:
            if action.copies:
                end = self._copy(action)
                if action.copies == "h2d":          # the step's own loads
                    ready = max(ready, end)
            elif action.kind == "alloc":            # space a copy in flight still uses
                stop = action.offset + action.size
                for flying in self.flying.values():
                    for end, a, b, _ in flying:
                        if a < stop and action.offset < b:
                            ready = max(ready, end)
        for action in step_plan.prefetch:
            if action.copies:
                self._copy(action)
        start = ready
        self.compute += seconds
        self.starts.append(start)
        self.stalls.append(start - queued)
        self.compute_end = start + seconds
        self.ends.append(self.compute_end)

    def finish(self, epilogue: list) -> Timeline:
        for action in epilogue:
            if action.copies:
                self._copy(action)
        end = max(self.compute_end, self.host, *self.free.values())
        return Timeline(self.starts, self.ends, self.stalls, self.copies, self.compute, end)


class _CutShort(Exception):
    """A candidate stopped while it was planned: it can no longer beat the best so far."""


def step_times(net: Net, steps: list[Step], model: CostModel) -> list[tuple[float, float]]:
    """Each step's ``(host, device)`` seconds by ``model`` (``CostModel.step_parts``): the same
    for every plan of the schedule."""
    return [model.step_parts(net, step) for step in steps]


def producers(net: Net, blob: str) -> list:
    """The layers whose forwards make ``blob``'s value, in schedule order: the one that writes it
    and the in-place layers after it (a ReLU or BatchNorm over a convolution's top). Empty for a
    blob no forward makes (an input, a parameter, a gradient)."""
    return [layer for layer in net.layers if blob in layer.top]


def recompute_step(net: Net, layer) -> Step:
    """``layer``'s forward run again as a recompute, as a ``Step`` (index -1: in no schedule) of
    the blobs it reads and writes (``layers.recompute``): bottoms, learnable parameters, the saved
    buffers the rule reads, the workspace; tops and the saved buffers it rewrites. Needs the
    net's schedule made (which names the parameter, saved and workspace blobs). Raises
    ``ShapeError`` for a layer that cannot be recomputed."""
    reads, writes = recompute_reads(layer), recompute_writes(layer)
    prefix = layer.name + "."
    own = [prefix + name for name in reads["params"] + reads["saved"] + writes["saved"]
           + reads["workspace"]]
    missing = [name for name in own if name not in net.blobs]
    if missing:
        raise ValueError(f"layer {layer.name}: blobs {missing} are not declared: make the net's "
                         "schedule (net.schedule()) first")
    overwritten = in_place(layer)
    return Step(-1, "forward", layer.name,
                reads=tuple(b for b in reads["bottom"] if b not in overwritten)
                + tuple(prefix + n for n in reads["params"] + reads["saved"]),
                writes=tuple(t for t in writes["top"] if t not in overwritten)
                + tuple(prefix + n for n in writes["saved"]),
                updates=tuple(overwritten),
                workspace=tuple(prefix + n for n in reads["workspace"]))


def recompute_seconds(net: Net, blob: str, model: CostModel) -> float:
    """Seconds to rebuild ``blob`` on the device by re-running the forwards that made it
    (``producers``: for an in-place chain, from its first writer on), each costed as a step by
    ``model`` (FLOPs at its rate, the bytes touched at memory bandwidth, the fixed cost of a
    step). Their inputs are taken as resident: what bringing them back costs is the planner's to
    add. Raises ``ValueError`` for a blob no forward makes, ``ShapeError`` where a producer cannot
    be recomputed."""
    layers = producers(net, blob)
    if not layers:
        raise ValueError(f"blob {blob}: no forward makes it (an input, a parameter or a "
                         "gradient): it cannot be recomputed")
    return sum(model.step_seconds(net, recompute_step(net, layer)) for layer in layers)


def swap_seconds(net: Net, blob: str, model: CostModel) -> float:
    """Seconds to send ``blob`` home and bring it back over ``model``'s link: a swap-out and a
    swap-in, each ``CostModel.copy_seconds`` (what prefetch may hide of it is the timeline's)."""
    return 2 * model.copy_seconds(net.blobs[blob].nbytes)


def auto_plan(net: Net, steps: list[Step], capacity: int, model: CostModel,
              reduce_grads: bool = False) -> Plan:
    """The fastest plan that fits, by the model; ``plan.candidates`` lists what was weighed,
    ``plan.cut_short`` what was stopped as it could not win.
    ``reduce_grads`` is kept in every candidate (it is what the plan is for, not a knob).

    What every candidate shares is computed once: the schedule's liveness, each step's compute
    time, the pinned blobs' placement. Candidates that differ only in knobs with no effect (two
    thresholds that pin the same blobs) make the same plan: it is made once. A candidate is
    simulated while it is planned, and stopped as soon as its time so far plus the compute still
    ahead (a lower bound on its total) is more than the best total so far: it cannot win, and
    the rest of it is not made. The choice is the one weighing every candidate in full makes
    (the first of the fastest, in the same order). Only candidates without prefetch are cut
    short: one with prefetch that does not fit is planned again with less, and that could win.
    On a GPU (copy engines beside the kernels: ``host_runs_ahead``) the choice is then weighed
    against itself with early write-back (``lms.write_back``, ``minilms.lms.write_back``).
    Where a second core and ``fork`` allow (``forked.map_halves``), a child process weighs every
    other candidate, cutting short against the best it has seen; the choice, by time, then bytes
    moved, then order, is the same, and where the child found it the plan is made again here."""
    with collector_paused():
        return _auto_plan(net, steps, capacity, model, reduce_grads)


def _auto_plan(net: Net, steps: list[Step], capacity: int, model: CostModel,
               reduce_grads: bool) -> Plan:
    live = Liveness.of(net, steps)
    times = step_times(net, steps, model)
    # ahead[i]: the host's and the device's time for steps i and on
    ahead = [(0.0, 0.0)] * (len(times) + 1)
    for index in range(len(times) - 1, -1, -1):
        ahead[index] = (ahead[index + 1][0] + times[index][0],
                        ahead[index + 1][1] + times[index][1])
    sizes = sorted(set(live.nbytes.values()))
    thresholds = sorted({0} | {sizes[int(q * (len(sizes) - 1))] + 1 for q in THRESHOLD_QUANTILES})
    made: dict = {}     # what decides a plan -> its outcome (``weigh``), in this process
    own = [None, None]  # (key, plan) of the fastest plan this process made in full

    def weigh(index, policy):
        """``policy``'s outcome: ``[seconds, bytes moved]``, ``["cut", step]`` where it was cut
        short, or None where it does not fit. A plan with prefetch is never cut short."""
        same = (policy.enabled, frozenset(pinned_blobs(live, policy)),
                policy.soft_limit(capacity - capacity % ALIGNMENT), policy.prefetch,
                policy.reduce_grads, policy.write_back)
        if same in made:     # the plan is made already: an equal key never replaces the best
            return made[same]
        # the least total that still loses to the best so far, whatever rounding does to both
        cut = None if own[0] is None or policy.prefetch else own[0][0] * (1 + 1e-9) + 2e-9
        streams = None

        def watch(step_index, step_plan):
            nonlocal streams
            if step_index == 0:        # a new plan (make_plan may start again with less prefetch)
                streams = _Streams(model)
            host, device = times[step_index]
            streams.step(step_plan, device, host)
            host_ahead, device_ahead = ahead[step_index + 1]
            if cut is not None and max(streams.compute_end + device_ahead,
                                       streams.host + host_ahead) > cut:
                raise _CutShort(step_index)
        try:
            if policy.write_back == "early":     # rewritten after the walk: timed whole
                plan = make_plan(net, steps, capacity, policy)
                moved = plan.bytes_moved("h2d") + plan.bytes_moved("d2h")
                made[same] = outcome = [simulate(plan, net, model).seconds, moved]
            else:
                plan = make_plan(net, steps, capacity, policy, watch)
                seconds = streams.finish(plan.epilogue).seconds
                made[same] = outcome = [seconds, streams.moved]
        except PlanError:
            made[same] = outcome = None
        except _CutShort as stop:     # not kept: the exception holds the partial plan
            made[same] = outcome = ["cut", stop.args[0]]
        if outcome and outcome[0] != "cut":
            key = (round(outcome[0], 9), outcome[1], index)
            if own[0] is None or key < own[0]:
                own[:] = [key, plan]
        return outcome

    def weighed_all(candidates):
        """Each of ``candidates`` (``(index, policy)``) weighed, half of them in a forked child
        (``forked.map_halves``): ``(index, policy, outcome)`` in their order."""
        outcomes = map_halves(lambda items: [weigh(*item) for item in items], candidates)
        return [(index, policy, outcome)
                for (index, policy), outcome in zip(candidates, outcomes)]

    policies = [Policy(enabled=False)]
    # Lazy (soft limit = the pool) moves the fewest bytes; eager (Caffe's default) fragments the
    # pool least, and is what still fits in the tightest pools.
    for limit in (capacity, None):
        for keep_state in (False, True):
            for threshold in thresholds:
                policies.append(Policy(limit=limit, min_swap_bytes=threshold,
                                       keep_state=keep_state))
    results = weighed_all([(i, replace(p, reduce_grads=reduce_grads))
                           for i, p in enumerate(policies)])
    best = _fastest(results)
    if best is None:
        raise make_plan_error(net, steps, capacity)
    chosen = best[1]
    if chosen.enabled:
        more = weighed_all([(len(policies) + i, replace(chosen, prefetch=distance))
                            for i, distance in enumerate(PREFETCH_CHOICES)])
        results += more
        best = _fastest([best] + more)
        if model.host_runs_ahead:    # a GPU's copy engines run beside its kernels (write_back.py)
            more = weighed_all([(len(policies) + len(PREFETCH_CHOICES),
                                 replace(best[1], write_back="early"))])
            results += more
            best = _fastest([best] + more)
    key = (round(best[2][0], 9), best[2][1], best[0])
    plan = own[1] if own[0] == key else make_plan(net, steps, capacity, best[1])
    plan.policy = replace(plan.policy, policy="auto")
    plan.candidates = [(p, o if o is None else o[0]) for _, p, o in results
                       if o is None or o[0] != "cut"]
    plan.cut_short = [(p, o[1]) for _, p, o in results if o is not None and o[0] == "cut"]
    return plan


def _fastest(results):
    """The ``(index, policy, outcome)`` planned in full with the least time, then the fewest
    bytes moved, then the first; None if none fits."""
    full = [r for r in results if r[2] is not None and r[2][0] != "cut"]
    return min(full, key=lambda r: (round(r[2][0], 9), r[2][1], r[0]), default=None)


def make_plan_error(net: Net, steps: list[Step], capacity: int) -> PlanError:
    """The error of the leanest plan (LMS on, nothing pinned): it names the step that cannot fit."""
    try:
        make_plan(net, steps, capacity, Policy())
    except PlanError as error:
        return error
    return PlanError(f"no plan fits in {format_bytes(capacity)}")


def plan_for(net: Net, steps: list[Step], capacity: int, policy: Policy,
             model: CostModel | None = None) -> Plan:
    """``make_plan`` for manual knobs, ``auto_plan`` for ``policy: auto``."""
    if policy.enabled and policy.recompute != "off":
        # recompute (minilms.lms.recompute) rewrites the schedule on top of this module
        from .recompute import choose
        plan, blobs = choose(net, steps, policy, lambda schedule: _plan_split_for(
            net, schedule, capacity, policy, model), model)
        plan.policy = replace(plan.policy, recompute=policy.recompute)
        if blobs:
            plan.notes.append(f"recompute ({plan.policy.describe().split('recompute ')[-1]}): "
                              f"{len(blobs)} activations rebuilt before backward instead of "
                              "kept or swapped: " + ", ".join(blobs))
        return plan
    return _plan_split_for(net, steps, capacity, policy, model)


def _plan_split_for(net: Net, steps: list[Step], capacity: int, policy: Policy,
                    model: CostModel | None) -> Plan:
    seconds = None if model is None else (lambda plan: simulate(plan, net, model).seconds)
    if policy.enabled and policy.policy == "auto":
        model = model or CostModel.for_device("cpu")
        return plan_split(net, steps, capacity, policy, lambda schedule: auto_plan(
            net, schedule, capacity, model, policy.reduce_grads), seconds=seconds)
    return plan_split(net, steps, capacity, policy,
                      lambda schedule: make_plan(net, schedule, capacity, policy),
                      seconds=seconds)
