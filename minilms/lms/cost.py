"""The planner's cost model: how long one iteration of a plan takes; ``plan_for``, the plan for a
policy (``make_plan``, or ``policy: auto``'s search in ``minilms.lms.auto``).

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

Swap or recompute (``lms.recompute`` chooses): ``swap_seconds`` is two copies on the link;
``recompute_seconds`` re-running the forwards that made the blob (``recompute_step``, costed by
``CostModel.step_seconds`` like any step).
"""
import time
from dataclasses import dataclass, replace

import numpy as np

from ..kernels.shapes import INNER_LOOP_FFMA_SHARE
from ..layers.recompute import in_place, recompute_reads, recompute_writes
from ..net import Net, Step
from .plan import Plan, Policy
from .planner import make_plan
from .substeps import plan_split, share_of_flops

GB = 1e9

# The cuda device's constants, for an H100 PCIe, from the kernels themselves or measured on an
# H100 SXM and an H200 (docs/benchmarks.md, "CUDA on an H100" and "... on an H200"); the model as
# a whole is a prediction. The FLOP rate is what the convolutions reached, under the GEMM's bound
# (kernels.shapes.INNER_LOOP_FFMA_SHARE); a step's host time is its launches (a launcher and
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
    streams = Streams(model)
    for step_plan, (host, device) in zip(plan.steps, times):
        streams.step(step_plan, device, host)
    return streams.finish(plan.epilogue)


class Streams:
    """The three streams of ``simulate``, fed a step at a time: ``policy: auto`` (``lms.auto``)
    watches each
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
    params = [layer.param_blob(name) for name in reads["params"]]
    own = params + [prefix + name for name in reads["saved"] + writes["saved"]
                    + reads["workspace"]]
    missing = [name for name in own if name not in net.blobs]
    if missing:
        raise ValueError(f"layer {layer.name}: blobs {missing} are not declared: make the net's "
                         "schedule (net.schedule()) first")
    overwritten = in_place(layer)
    return Step(-1, "forward", layer.name,
                reads=tuple(b for b in reads["bottom"] if b not in overwritten)
                + tuple(params) + tuple(prefix + n for n in reads["saved"]),
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
        from .auto import auto_plan  # its search weighs plans by this module's model
        model = model or CostModel.for_device("cpu")
        return plan_split(net, steps, capacity, policy, lambda schedule: auto_plan(
            net, schedule, capacity, model, policy.reduce_grads), seconds=seconds)
    return plan_split(net, steps, capacity, policy,
                      lambda schedule: make_plan(net, schedule, capacity, policy),
                      seconds=seconds)
