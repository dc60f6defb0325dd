"""The planner's cost model: how long one iteration of a plan takes, and ``policy: auto``.

A plan is replayed on two streams, as the executor runs it (``minilms.lms``): the copy stream takes
step ``i``'s copies once step ``i - 1`` has computed (its space may be reused, its outputs swapped
out), in plan order: releases, the step's own loads, then prefetches for later steps; the compute
stream runs step ``i`` once step ``i - 1`` is done and step ``i``'s own loads have landed. The
time compute waits for copies is the *stall*; prefetching moves loads under earlier compute.

Step times come from the layers' FLOPs and the bytes each step touches, at rates a ``CostModel``
states (defaults per device kind; ``measure_cpu`` takes this machine's), plus a fixed cost per
step (dispatch and launches). Copies take ``bytes / link`` plus a fixed cost per copy (the hand-off
to the copy thread or engine). The model ranks plans; the executor's trace measures them.

``auto`` is the Caffe tuning guideline computed instead of tried: over pinning thresholds
(``min_swap_bytes``), keeping parameters and optimizer state resident or not, a soft limit of
the whole pool or none, and LMS off where it fits, it takes the plan with the least predicted
time; then the prefetch distance, likewise.
Every candidate is planned in full, so the choice always fits.
"""
import time
from dataclasses import dataclass, replace

import numpy as np

from ..errors import PlanError
from ..net import Net, Step
from ..sizes import format_bytes
from .liveness import Liveness
from .plan import Plan, Policy
from .planner import make_plan

GB = 1e9
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

    @classmethod
    def for_device(cls, kind: str, link=None) -> "CostModel":
        """Typical rates: the ``cpu`` device of a small machine, or a data-centre GPU; the copy
        rate is the link's where one is modelled (and never above memory's)."""
        flops, memory, copy = (40e9, 8 * GB, 6 * GB) if kind == "cpu" else \
            (15e12, 1500 * GB, 25 * GB)
        # a GPU copies at the link's rate; the cpu device no faster than memory
        if link is not None:
            copy = link.bytes_per_second if kind == "cuda" else min(copy, link.bytes_per_second)
        what = f"{kind}, link {link.name}" if link is not None else kind
        # Python dispatch per step (cpu), a few launches per step (cuda); measured orders.
        fixed = (100e-6, 30e-6) if kind == "cpu" else (30e-6, 10e-6)
        return cls(flops, memory, copy, what, *fixed)

    def with_link(self, link) -> "CostModel":
        copy = self.memory_bytes_per_second if link is None else \
            min(self.memory_bytes_per_second, link.bytes_per_second)
        return replace(self, copy_bytes_per_second=copy,
                       name=f"{self.name.split(',')[0]}, link {link.name if link else 'none'}")

    def step_seconds(self, net: Net, step: Step) -> float:
        layer = net.layer[step.layer]
        flops = {"forward": 1, "backward": 2, "update": 0}[step.kind] * layer.flops()
        touched = sum(net.blobs[name].nbytes for name in set(step.blobs))
        return (self.step_seconds_fixed + flops / self.flops_per_second
                + touched / self.memory_bytes_per_second)

    def copy_seconds(self, nbytes: int) -> float:
        return self.copy_seconds_fixed + nbytes / self.copy_bytes_per_second

    def describe(self) -> str:
        return (f"{self.name}: {self.flops_per_second / 1e9:.0f} GFLOP/s, memory "
                f"{self.memory_bytes_per_second / GB:.1f} GB/s, copies "
                f"{self.copy_bytes_per_second / GB:.1f} GB/s, {self.step_seconds_fixed * 1e6:.0f} "
                f"us a step, {self.copy_seconds_fixed * 1e6:.0f} us a copy")


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
    """Replay ``plan`` on the two streams as described in the module docstring."""
    copy_free = compute_end = 0.0
    starts, ends, stalls = [], [], []
    copies = compute = 0.0
    for step_plan in plan.steps:
        at = max(copy_free, compute_end)
        for action in step_plan.release + step_plan.demand:
            if action.copies:
                at += model.copy_seconds(action.nbytes)
        ready = at
        for action in step_plan.prefetch:
            if action.copies:
                at += model.copy_seconds(action.nbytes)
        copies += at - max(copy_free, compute_end)
        copy_free = at
        start = max(compute_end, ready)
        seconds = model.step_seconds(net, step_plan.step)
        compute += seconds
        starts.append(start)
        stalls.append(start - compute_end)
        compute_end = start + seconds
        ends.append(compute_end)
    at = max(copy_free, compute_end)
    tail = sum(model.copy_seconds(a.nbytes) for a in plan.epilogue if a.copies)
    return Timeline(starts, ends, stalls, copies + tail, compute, at + tail)


def _candidate(net, steps, capacity, policy, model):
    try:
        plan = make_plan(net, steps, capacity, policy)
    except PlanError:
        return None, None
    return plan, simulate(plan, net, model).seconds


def auto_plan(net: Net, steps: list[Step], capacity: int, model: CostModel,
              reduce_grads: bool = False) -> Plan:
    """The fastest plan that fits, by the model; ``plan.candidates`` lists what was weighed.
    ``reduce_grads`` is kept in every candidate (it is what the plan is for, not a knob)."""
    sizes = sorted({info.nbytes for info in Liveness(net, steps).blobs.values()})
    thresholds = sorted({0} | {sizes[int(q * (len(sizes) - 1))] + 1 for q in THRESHOLD_QUANTILES})
    weighed, best = [], (float("inf"), None, None)

    def consider(policy):
        nonlocal best
        policy = replace(policy, reduce_grads=reduce_grads)
        plan, seconds = _candidate(net, steps, capacity, policy, model)
        weighed.append((policy, seconds))
        if plan is not None:
            key = (round(seconds, 9), plan.bytes_moved("h2d") + plan.bytes_moved("d2h"))
            if best[1] is None or key < best[0]:
                best = (key, plan, policy)

    consider(Policy(enabled=False))
    # Lazy (soft limit = the pool) moves the fewest bytes; eager (Caffe's default) fragments the
    # pool least, and is what still fits in the tightest pools.
    for limit in (capacity, None):
        for keep_state in (False, True):
            for threshold in thresholds:
                consider(Policy(limit=limit, min_swap_bytes=threshold, keep_state=keep_state))
    if best[1] is None:
        raise make_plan_error(net, steps, capacity)
    chosen = best[2]
    if chosen.enabled:
        for distance in PREFETCH_CHOICES:
            consider(replace(chosen, prefetch=distance))
    plan = best[1]
    plan.policy = replace(plan.policy, policy="auto")
    plan.candidates = weighed
    return plan


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
    if policy.enabled and policy.policy == "auto":
        return auto_plan(net, steps, capacity, model or CostModel.for_device("cpu"),
                         policy.reduce_grads)
    return make_plan(net, steps, capacity, policy)
