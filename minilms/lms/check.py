"""The replay checker: what every LMS plan must satisfy, verified apart from the planner.

``check_plan`` replays a plan's actions on a fresh pool and on its own model of where each blob's
data is valid; it shares no decision logic with ``minilms.plan``, so a planner bug cannot hide
behind the same mistake in its checker. The property tests run it over random knobs, capacities
and nets.
"""
from ..device.pool import Pool
from .plan import Action, Plan


def check_plan(plan: Plan) -> None:
    """Replay ``plan``'s actions on a fresh pool and a model of where each blob's data is valid,
    independently of how the planner decided them, and assert what every plan must satisfy:
    placements never overlap and the pool stays consistent; every step's working set is resident,
    and what it reads is valid on the device; a load (H2D) brings valid host data into a slot whose
    device copy is not already valid; a swap-out copies a dirty blob; no data that is read later is
    ever lost; the iteration ends as it began (only pinned blobs placed, state on the host or
    pinned, outputs on the host). With ``reduce_grads``: a reduction rewrites a host copy that is
    the newest, and every gradient a step reads was reduced after it was last written."""
    pool = Pool(plan.capacity, report=False)
    slots: dict = {}
    host = set(plan.persistent) | set(plan.host_inputs)
    device: set = set()
    dirty: set = set()
    reduced: set = set()        # gradients reduced since they were last written

    def apply(action: Action, where: str) -> None:
        name = action.blob
        if action.kind == "reduce":    # the host copy is rewritten: the device copy goes stale
            assert name in host and name not in dirty, \
                f"{where}: reduces {name}, whose host copy is not the newest"
            device.discard(name)
            reduced.add(name)
            return
        if action.places and name not in slots:
            slots[name] = pool.allocate(action.size, name, at=action.offset)
        assert name in slots, f"{where}: {action.kind} of {name}, which is not placed"
        if action.kind == "swap_in":
            assert name in host, f"{where}: loads {name}, whose host copy is not valid"
            assert name not in device, f"{where}: loads {name}, already valid on the device"
            device.add(name)
        elif action.copies == "d2h":
            assert name in dirty, f"{where}: copies {name} home, which is not dirty"
            host.add(name)
            dirty.discard(name)
        if action.frees:
            pool.free(slots.pop(name))
            device.discard(name)
            if name in dirty:          # dropped dirty: the newest data is gone
                dirty.discard(name)
                host.discard(name)

    for action in plan.prologue:
        apply(action, "prologue")
    for index, step_plan in enumerate(plan.steps):
        step = step_plan.step
        for action in step_plan.actions:
            apply(action, f"step {index} ({step.name})")
        missing = set(step.blobs) - set(slots)
        assert not missing, f"step {index} ({step.name}) runs without {sorted(missing)} resident"
        stale = set(step.reads + step.updates) - device
        assert not stale, f"step {index} ({step.name}) reads {sorted(stale)}, not valid on device"
        if plan.policy.reduce_grads:
            unreduced = {n for n in step.reads if plan.blobs[n].role == "param_grad"} - reduced
            assert not unreduced, f"step {index} ({step.name}) reads {sorted(unreduced)}, " \
                "not reduced since it was written"
        for name in step.writes + step.updates + step.workspace:
            reduced.discard(name)
            device.add(name)
            dirty.add(name)
            host.discard(name)
        pool.check()
    for action in plan.epilogue:
        apply(action, "epilogue")
    assert set(slots) == set(plan.pinned), "the iteration does not end as it began"
    for name in plan.persistent:
        assert name in host or name in plan.pinned, f"{name} lost at the end of the iteration"
    for name in plan.outputs:
        assert name in host, f"output {name} is not on the host after the iteration"
