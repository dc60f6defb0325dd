"""How much pool a net needs: all of it at once (LMS off), one step's working set, and the least
pool with which the planner succeeds (a search over ``make_plan``)."""
from dataclasses import replace

from ..device.pool import Pool, align_up
from ..errors import PlanError
from ..net import Net, Step
from .collector import collector_paused
from .plan import Policy
from .planner import make_plan
from .substeps import batch_blobs, most_chunks, plan_split, splittable


def resident_bytes(net: Net, steps: list[Step]) -> int:
    """The pool LMS off needs: every blob of the schedule resident at once (aligned)."""
    return sum(align_up(net.blobs[name].nbytes) for name in
               dict.fromkeys(name for step in steps for name in step.blobs))


def working_set_bytes(net: Net, step: Step) -> int:
    return sum(align_up(net.blobs[name].nbytes) for name in set(step.blobs))


# The first stride of the searches' gallop up from their bound, as a fraction of it: where the
# bound does not fit, the answer was within a few percent above it (fragmentation, pinned blobs),
# and strides from one alignment unit took twenty failing plans to get there
FIRST_STRIDE = 1 / 256
SUMMARY_PRECISION = 1 / 1024   # ``least_pool``'s, for a figure people read (``minilms.plan``)


def least_pool(net: Net, steps: list[Step], policy: Policy = Policy(),
               precision: float = 0.0) -> int:
    """The smallest pool (a multiple of the alignment) with which ``make_plan`` succeeds under
    ``policy``. No pool below the largest working set can hold that step, so that bound is tried
    first: it usually fits, and then it is the least pool, exactly. Where fragmentation (or
    pinned blobs) needs more, the search gallops up from it (strides from ``FIRST_STRIDE`` of it,
    doubling) and bisects the last gap: a few plans when the answer is near the bound, as it is,
    instead of a bisection over the whole range up to LMS off's need. ``precision``: the
    bisection stops once the pool it has that fits is within that fraction of the bound of one
    that does not, and returns it (``SUMMARY_PRECISION``, a summary's figure, takes half the
    plans an exact one does); 0, the default: exact, to the alignment."""
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
        return _search(fits, low, max(1, int(low * precision))) * unit


def _search(fits, low: int, within: int) -> int:
    """The least of ``low``, ``low + 1``, ... (units) that ``fits``, to ``within`` units: tried
    at ``low``, then galloping up (strides from ``FIRST_STRIDE`` of ``low``, doubling), then
    bisecting the last stride until what fits is within ``within`` of what does not."""
    if fits(low):
        return low
    failed, gap = low, max(within, int(low * FIRST_STRIDE), 1)   # known not to fit; next stride
    while not fits(failed + gap):
        failed, gap = failed + gap, gap * 2
    high = failed + gap
    while high - failed > within:
        middle = (failed + high) // 2
        if fits(middle):
            high = middle
        else:
            failed = middle
    return high


def least_split_pool(net: Net, steps: list[Step], policy: Policy = Policy(),
                     precision: float = 0.0) -> int:
    """The smallest pool with which the planner succeeds when steps may split along the batch
    (``lms.split``, at most ``policy``'s chunk count; ``minilms.lms.substeps.plan_split``). Its
    floor is no longer the largest working set but the largest of what one chunk of a step, or
    a step that cannot split, needs: the search gallops up from that bound and bisects. Whether
    a pool fits is asked with chunks sized to a quarter of it, doubled where that fails: the
    least pool, not the fewest chunks, is the question. ``precision``: as ``least_pool``'s, a
    fraction of the floor (each of its plans is a split plan, made again with more chunks where
    it fails: ResNet-152 at batch 256 took nine minutes for the exact pool)."""
    policy = replace(policy, prefetch=0, split="auto" if policy.split == "off" else policy.split)
    if not policy.enabled:
        return least_pool(net, steps, policy, precision)
    unit = Pool(1 << 20).alignment
    def fits(units: int) -> bool:
        try:
            plan_split(net, steps, units * unit, policy,
                       lambda schedule: make_plan(net, schedule, units * unit, policy),
                       fill=0.25, eager=True)
            return True
        except PlanError:
            return False
    with collector_paused():
        low = split_floor(net, steps, policy)[0] // unit
        return _search(fits, low, max(1, int(low * precision))) * unit


def split_floor(net: Net, steps: list[Step], policy: Policy = Policy()) -> tuple[int, Step]:
    """A floor under the least pool when steps may split, and the step that sets it: the
    largest working set of a step split into as many chunks as allowed (its shared blobs whole,
    one chunk of its batch blobs), or of a step that cannot split. No pool below it holds that
    step; the planner may need more (what stays pinned, fragmentation). Computed from the bytes
    alone, with no plan: instant, where ``least_split_pool`` plans many times."""
    train = any(step.kind == "backward" for step in steps)
    floor, where = 0, None
    for step in steps:
        bytes_ = working_set_bytes(net, step)
        if policy.max_chunks != 1 and splittable(net, step, train):
            batch = sum(align_up(net.blobs[n].nbytes) for n in batch_blobs(net, step, train))
            bytes_ -= batch - -(-batch // most_chunks(net, step, policy))
        if bytes_ > floor:
            floor, where = bytes_, step
    return floor, where
