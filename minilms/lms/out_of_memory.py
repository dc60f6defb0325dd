"""The planner's out-of-memory messages: the step, the bytes it needs and the capacity, and what
to change, in one line (what ``PlanError`` says to the user)."""
from ..device.pool import align_up
from ..sizes import format_bytes
from .liveness import Liveness
from .plan import Policy

__all__ = ["pinned_message", "demand_message"]


def pinned_message(live: Liveness, policy: Policy, pinned_names: list, capacity: int) -> str:
    """The blobs that stay resident for the whole run do not fit (with LMS off: every blob)."""
    blobs = live.blobs
    total = sum(align_up(blobs[n].nbytes) for n in pinned_names)
    if not policy.enabled:   # name the step at which resident blobs outgrow the pool
        seen, running = set(), 0
        for step in live.steps:
            for name in set(step.blobs) - seen:
                seen.add(name)
                running += align_up(blobs[name].nbytes)
            if running > capacity:
                break
        return (f"out of device memory at step {step.index} ({step.name}): LMS off keeps "
                f"every blob resident, {format_bytes(running)} by this step and "
                f"{format_bytes(total)} for all {len(blobs)}, capacity "
                f"{format_bytes(capacity)}: turn LMS on (lms.enabled) or raise device.memory")
    return (f"out of device memory before the first step: blobs under min_swap_bytes "
            f"({format_bytes(policy.min_swap_bytes)}) or kept by keep_state stay resident, "
            f"{format_bytes(total)} for {len(pinned_names)} blobs, capacity "
            f"{format_bytes(capacity)}: lower lms.min_swap_bytes, set lms.keep_state false, or "
            "raise device.memory")


def demand_message(live: Liveness, pinned_names: list, pool, index: int, name: str) -> str:
    """Step ``index``'s working set does not fit beside the pinned blobs (placing ``name``)."""
    step = live.steps[index]
    working = sum(align_up(live.blobs[b].nbytes) for b in set(step.blobs))
    pinned = sum(align_up(live.blobs[b].nbytes) for b in pinned_names if b not in step.blobs)
    fix = ("lower lms.min_swap_bytes, " if pinned else "") + \
        "raise device.memory, or lower the batch size (or max_workspace)"
    return (f"out of device memory at step {index} ({step.name}): its working set needs "
            f"{format_bytes(working)} (placing {name}, {format_bytes(live.blobs[name].nbytes)})"
            f"{f' beside {format_bytes(pinned)} pinned' if pinned else ''}, capacity "
            f"{format_bytes(pool.capacity)}, largest free block "
            f"{format_bytes(pool.stats().largest_free)}: {fix}")
