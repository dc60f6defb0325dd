"""The LMS planner: one iteration's memory decisions, computed before anything runs.

The schedule is static, so every blob's next use is known at every step. Planning is register
allocation: blobs are virtual registers, the pool is the register file, swap-out and swap-in are
spills and reloads. ``make_plan`` walks the schedule once over a planning ``Pool`` (the same
allocator the device uses, silent to the trace) and records, per step, what the executor must do:

    release    after the previous step: drop blobs with no further use, evict down to the soft limit
    demand     make the step's working set resident: ``alloc`` (about to be written, no copy) or
               ``swap_in`` (H2D); evicting, furthest next use first, when the pool is full
    prefetch   ``swap_in`` for the next ``prefetch`` steps, into free space or space of blobs needed
               later than the one brought in, issued while this step computes

Eviction is ``swap_out`` (D2H, then free) for a dirty blob that is needed again, ``drop`` (free, no
copy) for anything else. To make room, the blob needed furthest in the future goes first, until
there is space enough; if that space is in pieces (nothing moves once placed), the cheapest
contiguous window of free space and evictable blobs is cleared; as a last resort, the step's own
resident blobs are moved through the host (evicted and brought back elsewhere). Each eviction says
why. Every action carries its pool offset, so the executor runs no allocator
search; the device's pool checks each placement and would reject an overlap.

A blob's *need* is its next read or update before any overwrite: a blob whose next use writes it
whole is dead until then, and is freed. Blobs that outlive the iteration (parameters, optimizer
state) are needed again in the next one; the net's outputs (loss, accuracy) are read by the host
after the last step; its inputs (and the loss gradient seed) arrive fresh on the host each
iteration.

With ``reduce_grads`` (data-parallel training, ``minilms.training.distributed``) every parameter
gradient goes home right after the backward step that wrote it (``swap_out``, or ``sync`` if it is
pinned), followed by a ``reduce`` action: the executor averages the host copy across processes, so
the device copy is stale from then on and the update step loads the reduced one (``swap_in``).

Pinned blobs (those under ``min_swap_bytes``; parameters and optimizer state with ``keep_state``;
every blob with LMS off) stay in one place for the whole run.
Every other blob leaves the pool by the end of the iteration (the epilogue), so the plan starts and
ends in the same state and is replayed as it is every iteration. The ``prologue`` places the pinned
blobs and loads those that hold data, once.

The knobs (``Policy``) and where they come from are in docs/design.md. The soft limit is
``max(limit, start_fraction * capacity)``: up to it blobs stay resident after their step; above it
the planner evicts after every step (0, the default, is Caffe's default: keep only what the next
step needs). ``policy: auto`` is computed in ``minilms.lms.cost``.
"""
from dataclasses import replace

from ..device.pool import Pool, align_up
from ..errors import OutOfDeviceMemory, PlanError
from ..net import Net, Step
from ..sizes import format_bytes
from .liveness import INFINITY, Liveness
from .plan import Action, Plan, Policy, StepPlan


# -- planning -----------------------------------------------------------------------------------
class _Planner:
    def __init__(self, net: Net, steps: list[Step], capacity: int, policy: Policy):
        self.live = Liveness(net, steps)
        self.capacity, self.policy = capacity, policy
        self.pool = Pool(capacity, report=False)
        self.soft = policy.soft_limit(self.pool.capacity)
        blobs = self.live.blobs
        if policy.enabled:
            self.pinned_names = [n for n, b in blobs.items() if b.nbytes < policy.min_swap_bytes
                                 or (policy.keep_state and n in self.live.persistent)]
        else:
            self.pinned_names = list(blobs)
        self.pinned = set(self.pinned_names)
        self.resident: dict[str, object] = {}   # name -> Slot
        self.dirty: set = set()
        self.host_valid = set(self.live.persistent) | set(self.live.host_inputs)
        self.device_valid: set = set()

    def run(self) -> Plan:
        prologue = self._place_pinned()
        plans = [StepPlan(step) for step in self.live.steps]
        pending: list[Action] = []
        for index, step_plan in enumerate(plans):
            step_plan.release = pending
            self._demand(index, step_plan.demand)
            self._prefetch(index, step_plan.prefetch)
            step_plan.in_use = self.pool.in_use
            step_plan.resident = tuple(self.resident)
            self._run(index)
            pending = []
            self._release_after(index, pending)
        self._epilogue(pending)
        pinned = {name: self.resident[name].offset for name in self.pinned_names}
        live = self.live
        return Plan(self.policy, self.pool.capacity, dict(live.blobs), pinned, prologue, plans,
                    pending, frozenset(live.persistent), tuple(live.host_inputs),
                    tuple(live.outputs))

    # -- pinned blobs ---------------------------------------------------------------------------
    def _place_pinned(self) -> list[Action]:
        prologue = []
        for name in sorted(self.pinned_names, key=lambda n: -self.live.blobs[n].nbytes):
            info = self.live.blobs[name]
            try:
                slot = self.pool.allocate(info.nbytes, name)
            except OutOfDeviceMemory:
                raise PlanError(self._pinned_message()) from None
            self.resident[name] = slot
            load = name in self.live.persistent
            prologue.append(self._action("swap_in" if load else "alloc", name))
            if load:
                self.device_valid.add(name)
        return prologue

    def _pinned_message(self) -> str:
        blobs = self.live.blobs
        total = sum(align_up(blobs[n].nbytes) for n in self.pinned_names)
        if not self.policy.enabled:   # name the step at which resident blobs outgrow the pool
            seen, running = set(), 0
            for step in self.live.steps:
                for name in set(step.blobs) - seen:
                    seen.add(name)
                    running += align_up(blobs[name].nbytes)
                if running > self.pool.capacity:
                    break
            return (f"out of device memory at step {step.index} ({step.name}): LMS off keeps "
                    f"every blob resident, {format_bytes(running)} by this step and "
                    f"{format_bytes(total)} for all {len(blobs)}, capacity "
                    f"{format_bytes(self.pool.capacity)}: turn LMS on (lms.enabled) or raise "
                    "device.memory")
        return (f"out of device memory before the first step: blobs under min_swap_bytes "
                f"({format_bytes(self.policy.min_swap_bytes)}) or kept by keep_state stay "
                f"resident, {format_bytes(total)} for {len(self.pinned_names)} blobs, capacity "
                f"{format_bytes(self.pool.capacity)}: lower lms.min_swap_bytes, set "
                "lms.keep_state false, or raise device.memory")

    # -- one step -------------------------------------------------------------------------------
    def _demand(self, index: int, actions: list) -> None:
        step = self.live.steps[index]
        working = set(step.blobs)
        names = list(dict.fromkeys(step.reads + step.updates + step.writes + step.workspace))
        # Largest first: a big blob finds a hole before the small ones split the free space.
        pending = sorted(names, key=lambda n: -self.live.blobs[n].nbytes)
        placements = 0
        while pending:
            name = pending.pop(0)
            load = self.live.kind_at(name, index) in ("read", "update")
            if load and name not in self.host_valid and name not in self.device_valid:
                raise PlanError(f"step {index} ({step.name}) reads {name} before any step "
                                "writes it: the schedule is inconsistent")
            if name in self.resident:
                if load and name not in self.device_valid:   # a pinned input: fresh on the host
                    actions.append(self._action("swap_in", name))
                    self.device_valid.add(name)
                continue
            placements += 1
            if placements > 4 * len(names) or \
                    not self._allocate(name, index, working, actions, relocate=True):
                raise PlanError(self._demand_message(index, name))
            actions.append(self._action("swap_in" if load else "alloc", name))
            if load:
                self.device_valid.add(name)
            # Relocation may have sent some of this step's own blobs home: bring them back.
            pending += [n for n in names if n not in self.resident and n not in pending]

    def _prefetch(self, index: int, actions: list) -> None:
        protect = set(self.live.steps[index].blobs)
        last = min(self.live.n - 1, index + self.policy.prefetch)
        for ahead in range(index + 1, last + 1):
            protect |= set(self.live.steps[ahead].blobs)
            for name in self.live.loads(ahead):
                if name in self.resident or name not in self.host_valid:
                    continue   # resident already, or made by a step before ``ahead``
                if not self._allocate(name, index, protect, actions, victims_after=ahead):
                    return   # no room: later loads would overtake this one, so stop here
                actions.append(self._action("swap_in", name, for_step=ahead))
                self.device_valid.add(name)

    def _run(self, index: int) -> None:
        step = self.live.steps[index]
        for name in step.writes + step.updates + step.workspace:
            self.dirty.add(name)
            self.device_valid.add(name)
            self.host_valid.discard(name)

    def _reduce(self, index: int, actions: list) -> None:
        """``reduce_grads``: each parameter gradient this step wrote goes home now (a pinned one
        keeps its slot) and is reduced there; its device copy is stale until reloaded."""
        for name in self.live.steps[index].writes:
            if self.live.blobs[name].role != "param_grad":
                continue
            reduce = replace(self._action("reduce", name), size=0)   # offset: where it was
            if name in self.pinned:
                actions.append(self._action("sync", name))
                self.dirty.discard(name)
                self.host_valid.add(name)
            else:
                self._evict(name, index, actions, "reduce", needed=True)
            self.device_valid.discard(name)
            actions.append(reduce)

    def _release_after(self, index: int, actions: list) -> None:
        if self.policy.reduce_grads:
            self._reduce(index, actions)
        for name in list(self.resident):
            if name not in self.pinned and self.live.need_after(name, index) == INFINITY:
                self._evict(name, index, actions, "dead")
        if self.pool.in_use <= self.soft:
            return
        keep = set()
        for ahead in range(index + 1, min(self.live.n, index + 1 + max(1, self.policy.prefetch))):
            keep |= set(self.live.steps[ahead].blobs)
        for name in self._victims(index, keep):
            if self.pool.in_use <= self.soft:
                break
            self._evict(name, index, actions, "soft limit")

    def _epilogue(self, actions: list) -> None:
        last = self.live.n - 1
        for name in self.live.outputs:
            if name in self.resident and name in self.dirty:
                if name in self.pinned:
                    actions.append(self._action("sync", name))
                    self.dirty.discard(name)
                    self.host_valid.add(name)
        for name in list(self.resident):
            if name not in self.pinned:
                self._evict(name, last, actions, "end of iteration")

    # -- space ----------------------------------------------------------------------------------
    def _victims(self, index: int, protect: set, victims_after: float = -1) -> list[str]:
        """Evictable blobs, furthest next need first; only those needed after ``victims_after``."""
        found = []
        for name in self.resident:
            if name in protect or name in self.pinned:
                continue
            need = self.live.need_after(name, index)
            if need > victims_after:
                found.append((-need, -self.live.blobs[name].nbytes, name))
        return [name for *_, name in sorted(found)]

    def _allocate(self, name: str, index: int, protect: set, actions: list,
                  victims_after: float = -1, relocate: bool = False) -> bool:
        """Place ``name``: in a free block if one is large enough, else in the cheapest window
        of the pool that free space and evictable blobs make contiguous (nothing moves once
        placed, so total free space is not enough)."""
        nbytes = self.live.blobs[name].nbytes
        size = align_up(max(nbytes, 1), self.pool.alignment)
        top = self.live.blobs[name].role == "workspace"
        victims = None
        while True:
            try:
                self.resident[name] = self.pool.allocate(nbytes, name, from_top=top)
                return True
            except OutOfDeviceMemory:
                pass
            if self.pool.capacity - self.pool.in_use >= size:
                break                        # space enough, not in one piece
            if victims is None:
                victims = self._victims(index, protect, victims_after)
            if not victims:
                return False
            self._evict(victims.pop(0), index, actions, "furthest next use")
        window = self._window(nbytes, index, protect, victims_after)
        why = "contiguous space"
        if window is None and relocate:   # last resort: move the step's own blobs via the host
            window, why = self._window(nbytes, index, set(), victims_after, protect), "relocation"
        if window is None:
            return False
        start, victims = window
        for victim in victims:
            self._evict(victim, index, actions, why, needed=victim in protect or None)
        self.resident[name] = self.pool.allocate(nbytes, name, at=start)
        return True

    def _window(self, nbytes: int, index: int, protect: set, victims_after: float,
                costly: set = frozenset()):
        """``(offset, blobs to evict)`` of the cheapest window of ``nbytes`` (aligned) that holds
        only free space and evictable blobs, or None. A victim costs its bytes over the steps
        until it is needed again (twice that if it is dirty: a swap-out too): far-off and dead
        blobs go first, as furthest-next-use eviction would have it. A sliding window per run of
        blocks between unmovable ones."""
        size = align_up(max(nbytes, 1), self.pool.alignment)
        blocks = [(offset, length, None, 0.0) for offset, length in self.pool.free_blocks()]
        for slot in self.pool.slots():
            name = slot.owner
            need = self.live.need_after(name, index)
            movable = name not in protect and name not in self.pinned and need > victims_after
            if name in costly:
                cost = 1e6 * slot.nbytes
            else:
                cost = INFINITY if not movable else 0.0 if need == INFINITY else \
                    slot.nbytes * (2 if name in self.dirty else 1) / (need - index)
            blocks.append((slot.offset, slot.nbytes, name, cost))
        blocks.sort()
        best = None
        left, covered, cost = 0, 0, 0.0
        for right, (_, length, _, block_cost) in enumerate(blocks):
            if block_cost == INFINITY:           # an unmovable blob: no window spans it
                left, covered, cost = right + 1, 0, 0.0
                continue
            covered += length
            cost += block_cost
            while covered - blocks[left][1] >= size:   # drop blocks the window does not need
                covered -= blocks[left][1]
                cost -= blocks[left][3]
                left += 1
            if covered >= size and (best is None or cost < best[0] - 1e-12):
                best = (cost, left, right)
        if best is None:
            return None
        _, left, right = best
        return blocks[left][0], [b[2] for b in blocks[left:right + 1] if b[2] is not None]

    def _evict(self, name: str, index: int, actions: list, why: str,
                needed: bool | None = None) -> None:
        if needed is None:
            needed = self.live.need_after(name, index) != INFINITY
        if name in self.dirty and needed:
            actions.append(replace(self._action("swap_out", name), why=why))
            self.host_valid.add(name)
        else:
            actions.append(replace(self._action("drop", name), why=why if needed else "dead"))
        self.dirty.discard(name)
        self.device_valid.discard(name)
        self.pool.free(self.resident.pop(name))

    def _action(self, kind: str, name: str, for_step: int | None = None) -> Action:
        slot = self.resident[name]
        return Action(kind, name, self.live.blobs[name].nbytes, slot.offset, slot.nbytes, for_step)

    def _demand_message(self, index: int, name: str) -> str:
        step = self.live.steps[index]
        working = sum(align_up(self.live.blobs[b].nbytes) for b in set(step.blobs))
        pinned = sum(align_up(self.live.blobs[b].nbytes) for b in self.pinned_names
                     if b not in step.blobs)
        fix = ("lower lms.min_swap_bytes, " if pinned else "") + \
            "raise device.memory, or lower the batch size (or max_workspace)"
        return (f"out of device memory at step {index} ({step.name}): its working set needs "
                f"{format_bytes(working)} (placing {name}, "
                f"{format_bytes(self.live.blobs[name].nbytes)})"
                f"{f' beside {format_bytes(pinned)} pinned' if pinned else ''}, capacity "
                f"{format_bytes(self.pool.capacity)}, largest free block "
                f"{format_bytes(self.pool.stats().largest_free)}: {fix}")


def make_plan(net: Net, steps: list[Step], capacity: int, policy: Policy = Policy()) -> Plan:
    """The plan of one iteration of ``steps`` in a pool of ``capacity`` bytes under ``policy``
    (manual knobs; see ``minilms.lms.cost.plan_for`` for ``auto``). Raises PlanError if none fits.

    Prefetched blobs take space early and can leave the pool too fragmented for a later step
    (nothing moves once placed): then the prefetch distance is shortened until the plan fits,
    and ``plan.notes`` says so. Prefetch never makes a plan that fits fail."""
    try:
        return _Planner(net, steps, capacity, policy).run()
    except PlanError:
        if policy.prefetch == 0 or not policy.enabled:
            raise
    for distance in range(policy.prefetch - 1, -1, -1):
        try:
            plan = _Planner(net, steps, capacity, replace(policy, prefetch=distance)).run()
        except PlanError:
            if distance == 0:
                raise
            continue
        plan.notes.append(f"prefetch {policy.prefetch} does not fit in "
                          f"{format_bytes(capacity)}: planned with prefetch {distance}")
        return plan


# -- sizes the planner reports ------------------------------------------------------------------
def resident_bytes(net: Net, steps: list[Step]) -> int:
    """The pool LMS off needs: every blob of the schedule resident at once (aligned)."""
    return sum(align_up(info.nbytes) for info in Liveness(net, steps).blobs.values())


def working_set_bytes(net: Net, step: Step) -> int:
    return sum(align_up(net.blobs[name].nbytes) for name in set(step.blobs))


def least_pool(net: Net, steps: list[Step], policy: Policy = Policy()) -> int:
    """The smallest pool (a multiple of the alignment) with which ``make_plan`` succeeds under
    ``policy``, by bisection between the largest working set and LMS off's need. Fragmentation
    can make it more than the largest working set; planning is cheap, so it is searched, not
    estimated."""
    policy = replace(policy, prefetch=0)    # prefetch only uses space that is there
    unit = Pool(1 << 20).alignment
    low = max(working_set_bytes(net, s) for s in steps) // unit
    high = -(-resident_bytes(net, steps) // unit)
    if not policy.enabled:
        return high * unit

    def fits(units: int) -> bool:
        try:
            make_plan(net, steps, units * unit, policy)
            return True
        except PlanError:
            return False
    while not fits(high):   # pinned blobs can fragment beyond the sum; rarely
        high *= 2
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return high * unit

