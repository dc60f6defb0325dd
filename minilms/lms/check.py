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
    device copy is not already valid; a swap-out copies a dirty blob, and only data that is the
    newest; no data that is read later is ever lost; the iteration ends as it began (only pinned
    blobs placed, state on the host or pinned, outputs on the host). With ``reduce_grads``: a
    reduction rewrites a host copy that is the newest, and every gradient a step reads was
    reduced after it was last written.

    Validity is kept per sample: a split step's chunk (``plan.chunks``) is rows of its parent,
    and shares the parent's home, so the model holds, per parent, which samples the host copy has
    newest, and per placed blob, which of its samples its device copy has newest."""
    pool = Pool(plan.capacity, report=False)
    slots: dict = {}
    samples = _Samples(plan)
    host = {samples.parent(n): samples.full(n) for n in
            set(plan.persistent) | set(plan.host_inputs)}    # parent -> samples newest there
    device: dict = {}           # blob -> its samples newest in its slot
    reduced: set = set()        # gradients reduced since they were last written

    def on_host(name):
        return host.get(samples.parent(name), 0) & samples.mask(name) == samples.mask(name)

    def dirty(name):
        return device.get(name, 0) & ~host.get(samples.parent(name), 0)

    def apply(action: Action, where: str) -> None:
        name = action.blob
        if action.kind == "reduce":    # the host copy is rewritten: the device copy goes stale
            assert on_host(name) and not dirty(name), \
                f"{where}: reduces {name}, whose host copy is not the newest"
            device.pop(name, None)
            reduced.add(name)
            return
        if action.places and name not in slots:
            slots[name] = pool.allocate(action.size, name, at=action.offset)
        assert name in slots, f"{where}: {action.kind} of {name}, which is not placed"
        if action.kind == "swap_in":
            assert on_host(name), f"{where}: loads {name}, whose host copy is not valid"
            assert not device.get(name), f"{where}: loads {name}, already valid on the device"
            device[name] = samples.mask(name)
        elif action.copies == "d2h":
            assert dirty(name), f"{where}: copies {name} home, which is not dirty"
            assert device[name] == samples.mask(name), \
                f"{where}: copies {name} home, whose device copy is partly stale"
            parent = samples.parent(name)
            host[parent] = host.get(parent, 0) | device[name]
        if action.frees:               # dropped dirty: the newest data of those samples is gone
            pool.free(slots.pop(name))
            device.pop(name, None)

    def written(name):
        parent, mask = samples.parent(name), samples.mask(name)
        for other in samples.sharing(name):
            if device.get(other, 0) & mask:
                device[other] &= ~mask
        host[parent] = host.get(parent, 0) & ~mask
        device[name] = mask

    for action in plan.prologue:
        apply(action, "prologue")
    for index, step_plan in enumerate(plan.steps):
        step = step_plan.step
        for action in step_plan.actions:
            apply(action, f"step {index} ({step.name})")
        missing = set(step.blobs) - set(slots)
        assert not missing, f"step {index} ({step.name}) runs without {sorted(missing)} resident"
        stale = {n for n in step.reads + step.updates if device.get(n) != samples.mask(n)}
        assert not stale, f"step {index} ({step.name}) reads {sorted(stale)}, not valid on device"
        if plan.policy.reduce_grads:
            unreduced = {n for n in step.reads if plan.blobs[n].role == "param_grad"} - reduced
            assert not unreduced, f"step {index} ({step.name}) reads {sorted(unreduced)}, " \
                "not reduced since it was written"
        for name in step.writes + step.updates + step.workspace:
            reduced.discard(name)
            written(name)
        pool.check()
    for action in plan.epilogue:
        apply(action, "epilogue")
    assert set(slots) == set(plan.pinned), "the iteration does not end as it began"
    for name in plan.persistent:
        assert on_host(name) or name in plan.pinned, f"{name} lost at the end of the iteration"
    for name in plan.outputs:
        assert on_host(name), f"output {name} is not on the host after the iteration"


class _Samples:
    """Which samples of which home a blob stands for: a chunk, rows of its parent; any other
    blob, all of its own (one bit for a blob no chunk is cut from)."""

    def __init__(self, plan: Plan):
        self.chunks = plan.chunks
        self.families: dict = {}
        for name, (parent, _, _) in plan.chunks.items():
            self.families.setdefault(parent, {parent}).add(name)
        self.rows = {parent: plan.blobs[parent].shape[0] for parent in self.families}

    def parent(self, name: str) -> str:
        chunk = self.chunks.get(name)
        return name if chunk is None else chunk[0]

    def mask(self, name: str) -> int:
        chunk = self.chunks.get(name)
        if chunk is None:
            return self.full(name)
        return (1 << chunk[2]) - (1 << chunk[1])

    def full(self, name: str) -> int:
        return (1 << self.rows[name]) - 1 if name in self.families else 1

    def sharing(self, name: str):
        return self.families.get(self.parent(name), ())
