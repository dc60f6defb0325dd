"""``policy: auto``: the Caffe tuning guideline computed instead of tried.

Over pinning thresholds (``min_swap_bytes``), keeping parameters and optimizer state resident or
not, a soft limit of the whole pool or none, and LMS off where it fits, it takes the plan with the
least time the cost model (``minilms.lms.cost``) predicts; then the prefetch distance, likewise;
then, on a GPU, early write-back. The choice is planned in full, so it always fits; a candidate
that can no longer beat the best so far is cut short while it is planned, which does not change
the choice. A forked child may weigh candidates beside this process (``minilms.lms.forked``).
"""
from dataclasses import replace

from ..device.pool import ALIGNMENT
from ..errors import PlanError
from ..net import Net, Step
from ..sizes import format_bytes
from .collector import collector_paused
from .cost import CostModel, Streams, simulate, step_times
from .forked import SharedLeast, map_forked
from .liveness import Liveness
from .plan import Plan, Policy
from .planner import make_plan, pinned_blobs

__all__ = ["PREFETCH_CHOICES", "THRESHOLD_QUANTILES", "OwedLoads", "auto_plan", "make_plan_error"]

PREFETCH_CHOICES = (1, 2, 3, 4, 6, 8)
THRESHOLD_QUANTILES = (0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9)


class _CutShort(Exception):
    """A candidate stopped while it was planned: it can no longer beat the best so far."""


def auto_plan(net: Net, steps: list[Step], capacity: int, model: CostModel,
              reduce_grads: bool = False) -> Plan:
    """The fastest plan that fits, by the model; ``plan.candidates`` lists what was weighed,
    ``plan.cut_short`` what was stopped as it could not win.
    ``reduce_grads`` is kept in every candidate (it is what the plan is for, not a knob).

    What every candidate shares is computed once: the schedule's liveness, each step's compute
    time, the pinned blobs' placement. Candidates that differ only in knobs with no effect (two
    thresholds that pin the same blobs) make the same plan: it is made once. A candidate is
    simulated while it is planned, and stopped as soon as its time so far plus the compute still
    ahead and the loads it still owes (``OwedLoads``: a lower bound on its total) is more than
    the best total so far: it cannot win, and the rest of it is not made. The choice is the one
    weighing every candidate in full makes (the first of the fastest, in the same order). Only
    candidates without prefetch are cut short: one with prefetch that does not fit is planned
    again with less, and that could win.
    On a GPU (copy engines beside the kernels: ``host_runs_ahead``) the choice is then weighed
    against itself with early write-back (``lms.write_back``, ``minilms.lms.write_back``).
    Where a second core and ``fork`` allow (``forked.map_forked``), a child process takes
    candidates too, whichever process is free taking the next, and both cut short against the
    best either has planned (``forked.SharedLeast``); the choice, by time, then bytes moved, then
    order, is the same (which candidates are cut short can differ from run to run), and where the
    child found it the plan is made again here."""
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
    # what a candidate without prefetch still owes is part of its lower bound (``OwedLoads``)
    owes_loads = not live.family
    made: dict = {}     # what decides a plan -> its outcome (``weigh``), in this process
    best_so_far = SharedLeast()     # the least total planned in full, here or in the child
    own = [None, None]  # (key, plan) of the fastest plan this process made in full

    def weigh(index, policy):
        """``policy``'s outcome: ``[seconds, bytes moved]``, ``["cut", step]`` where it was cut
        short, or None where it does not fit. A plan with prefetch is never cut short."""
        same = (policy.enabled, frozenset(pinned_blobs(live, policy)),
                policy.soft_limit(capacity - capacity % ALIGNMENT), policy.prefetch,
                policy.reduce_grads, policy.write_back)
        if same in made:     # the plan is made already: an equal key never replaces the best
            return made[same]
        streams = owed = None

        def watch(step_index, step_plan):
            nonlocal streams, owed
            if step_index == 0:        # a new plan (make_plan may start again with less prefetch)
                streams = Streams(model)
                owed = OwedLoads(live, model, same[1]) \
                    if owes_loads and not policy.prefetch else None
            host, device = times[step_index]
            streams.step(step_plan, device, host)
            if policy.prefetch:
                return
            if owed is not None:
                owed.step(step_index, step_plan)
            host_ahead, device_ahead = ahead[step_index + 1]
            # more than the best so far, whatever rounding does to both: it cannot win
            if max(streams.compute_end + device_ahead + (0.0 if owed is None else owed.seconds),
                   streams.host + host_ahead) > best_so_far.value() * (1 + 1e-9) + 2e-9:
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
            best_so_far.offer(outcome[0])
            key = (round(outcome[0], 9), outcome[1], index)
            if own[0] is None or key < own[0]:
                own[:] = [key, plan]
        return outcome

    def weighed_all(candidates):
        """Each of ``candidates`` (``(index, policy)``) weighed, some in a forked child
        (``forked.map_forked``): ``(index, policy, outcome)`` in their order."""
        outcomes = map_forked(lambda item: weigh(*item), candidates)
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


class OwedLoads:
    """The demand loads a plan without prefetch still owes after each step: the blobs off the
    device (never loaded, or sent away) that a later step of the iteration reads or updates.
    Each is a copy its step waits for (``Streams.step`` starts a step's loads after the step
    before it, and the step after its loads), so ``seconds``, their copies' time, added to the
    compute still ahead, is a lower bound on the time still ahead. ``pinned``: the blobs the
    plan keeps in place (loaded in its prologue). For schedules without chunks (a chunk's load
    is part of its parent's); recompute steps are in the schedule, and their writes end a
    blob's need as any write does."""

    def __init__(self, live: Liveness, model: CostModel, pinned):
        self.live, self.model = live, model
        starts_home = (set(live.persistent) | set(live.host_inputs)) - set(pinned)
        self.owed = {name: model.copy_seconds(live.nbytes[name]) for name in starts_home
                     if live.need_after(name, -1) < live.n}
        self.seconds = sum(self.owed.values())

    def step(self, index: int, step_plan) -> None:
        """Step ``index``'s actions, as planned: its loads paid, its evictions owed."""
        live, owed = self.live, self.owed
        for action in step_plan.release + step_plan.demand:
            if action.kind == "swap_in":
                self.seconds -= owed.pop(action.blob, 0.0)
            elif action.kind in ("swap_out", "drop", "reduce") and \
                    live.need_after(action.blob, index) < live.n:
                seconds = self.model.copy_seconds(action.nbytes)
                self.seconds += seconds - owed.get(action.blob, 0.0)
                owed[action.blob] = seconds


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
