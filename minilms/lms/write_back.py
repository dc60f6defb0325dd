"""Early write-back (``lms.write_back: early``): a swap-out's copy issued as soon as the blob's
value is final.

The planner evicts lazily: a blob leaves the pool when its space is wanted, and the step that
wants the space waits for the swap-out still reading it. On ResNet-50 at batch 8 in an eighth of
LMS off's pool every stall of the forward pass was such a wait, for a blob written steps before.
vDNN offloads a layer's input as soon as its forward is done; the same here, within the plan: the
copy home of a blob swapped out at step ``j``, last written at step ``w < j - 1``, becomes a
``sync`` issued after step ``w`` computes (its value no longer changes, and the steps between only
read it, as the copy does), and the eviction at ``j`` becomes a ``drop`` that waits for nothing;
a later load finds the host copy the sync wrote. The bytes moved are the same, and the space is
held exactly as long: only when the copy runs changes.

On a GPU the copy engines run it beside the kernels, and the cost model predicts the stalls it
removes (``policy: auto`` weighs it there). On the ``cpu`` device the copy threads share the
kernels' cores: measured, the stall fell and the kernels slowed by as much (docs/benchmarks.md,
session 39), so ``auto`` keeps write-back lazy there.

The sync goes behind the loads that step ``w + 1`` issues for later steps (its ``prefetch``
list): it is the least urgent copy of that step. Left as they are: chunks of split steps (their
rows share a home with other blobs), gradients going home to be reduced, and the epilogue's
evictions (nothing computes after them).
"""
from .plan import Action, Plan

__all__ = ["write_back_early"]


def write_back_early(plan: Plan, family=()) -> Plan:
    """``plan`` with each eligible swap-out split into an early ``sync`` and a ``drop``
    (in place; returned). ``family``: the blobs of split steps' families, left alone."""
    last_write: dict = {}
    steps = plan.steps
    moved = 0
    for index, step_plan in enumerate(steps):
        for actions in (step_plan.release, step_plan.demand):
            for position, action in enumerate(actions):
                if action.kind != "swap_out" or action.why == "reduce" or \
                        action.blob in family:
                    continue
                written = last_write.get(action.blob)
                if written is None or written + 1 >= index:
                    continue
                steps[written + 1].prefetch.append(Action.make(
                    "sync", action.blob, action.nbytes, action.offset, action.size,
                    why="written back early"))
                actions[position] = Action.make(     # evicted for the same reason
                    "drop", action.blob, action.nbytes, action.offset, action.size,
                    why=action.why)
                moved += 1
        step = step_plan.step
        for name in step.writes + step.updates + step.workspace:
            last_write[name] = index
    if moved:
        plan.notes.append(f"early write-back: {moved} swap-outs copied home as soon as their "
                          "blob was last written, and dropped when their space was wanted")
    return plan
