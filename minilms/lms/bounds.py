"""How much pool a net needs: all of it at once (LMS off), one step's working set, and the least
pool with which the planner succeeds (a search over ``make_plan``)."""
from dataclasses import replace

from ..device.pool import Pool, align_up
from ..errors import PlanError
from ..net import Net, Step
from .plan import Policy
from .planner import collector_paused, make_plan


def resident_bytes(net: Net, steps: list[Step]) -> int:
    """The pool LMS off needs: every blob of the schedule resident at once (aligned)."""
    return sum(align_up(net.blobs[name].nbytes) for name in
               dict.fromkeys(name for step in steps for name in step.blobs))


def working_set_bytes(net: Net, step: Step) -> int:
    return sum(align_up(net.blobs[name].nbytes) for name in set(step.blobs))


def least_pool(net: Net, steps: list[Step], policy: Policy = Policy()) -> int:
    """The smallest pool (a multiple of the alignment) with which ``make_plan`` succeeds under
    ``policy``. No pool below the largest working set can hold that step, so that bound is tried
    first: it usually fits, and then it is the least pool, exactly. Where fragmentation (or
    pinned blobs) needs more, the search gallops up from it (doubling the step) and bisects the
    last gap: a few plans when the answer is near the bound, as it is, instead of a bisection
    over the whole range up to LMS off's need."""
    policy = replace(policy, prefetch=0)    # prefetch only uses space that is there
    unit = Pool(1 << 20).alignment
    low = max(working_set_bytes(net, s) for s in steps) // unit
    if not policy.enabled:
        return -(-resident_bytes(net, steps) // unit) * unit
    def fits(units: int) -> bool:
        try:
            make_plan(net, steps, units * unit, policy)
            return True
        except PlanError:
            return False
    with collector_paused():
        if fits(low):
            return low * unit
        failed, gap = low, 1       # the largest size known not to fit, and the next stride
        while not fits(failed + gap):
            failed, gap = failed + gap, gap * 2
        low, high = failed + 1, failed + gap
        while low < high:
            middle = (low + high) // 2
            if fits(middle):
                high = middle
            else:
                low = middle + 1
        return high * unit
