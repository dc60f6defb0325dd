"""The LMS planner: one iteration's memory decisions, computed before anything runs.

The schedule is static, so every blob's next use is known at every step. Planning is register
allocation: blobs are virtual registers, the pool is the register file, swap-out and swap-in are
spills and reloads. ``make_plan`` walks the schedule once over a planning ``Pool`` (the same
allocator the device uses, silent to the trace) and records, per step, what the executor must do:
``release`` (after the previous step: drop blobs with no further use, evict down to the soft
limit), ``demand`` (make the step's working set resident: ``alloc`` or ``swap_in``, evicting the
blob needed furthest ahead first, or the cheapest contiguous window: ``victims.py``) and
``prefetch`` (``swap_in`` for the next steps while this one computes). Every action carries its
pool offset, so the executor runs no allocator search, and the device's pool rejects an overlap.

A blob's *need* is its next read or update before any overwrite. Pinned blobs (under
``min_swap_bytes``; parameters and optimizer state with ``keep_state``; all with LMS off) stay put;
every other blob leaves the pool by the epilogue, so the plan is replayed as it is every
iteration; with ``reduce_grads`` each parameter gradient goes home after its backward step to be
averaged there (``reduce``). The whole story: docs/lms.md; ``policy: auto``: ``lms.cost``."""
from bisect import bisect_right
from dataclasses import replace

from ..device.pool import Pool, align_up
from ..errors import OutOfDeviceMemory, PlanError
from ..net import Net, Step
from ..sizes import format_bytes
from .collector import collector_paused
from .liveness import INFINITY, Liveness
from .out_of_memory import demand_message, pinned_message
from .plan import Action, Plan, Policy, Residents, StepPlan
from .victims import Victims, cheapest_window
from .write_back import write_back_early


def pinned_blobs(live: Liveness, policy: Policy) -> list[str]:
    """The blobs ``policy`` keeps in one place for the whole run, in the schedule's order."""
    if not policy.enabled:
        return list(live.blobs)
    return [n for n, size in live.nbytes.items() if (size < policy.min_swap_bytes
            or (policy.keep_state and n in live.persistent)) and n not in live.family]


# -- planning -----------------------------------------------------------------------------------
class _Planner:
    """One plan: a single walk of the schedule over a planning pool.

    Each step costs what it touches, not what is resident: the dead blobs after a step can only
    be those it used or that were placed while it ran (every other resident blob was alive after
    the previous step and has had no use since), and the evictable blobs are kept in a heap keyed
    by (furthest next need, largest, name), re-keyed only when a step uses them, so that
    "furthest next use first" pops the next victim instead of sorting every resident blob."""

    def __init__(self, live: Liveness, capacity: int, policy: Policy, watch=None):
        self.live, self.watch = live, watch
        self.nbytes = live.nbytes
        self.capacity, self.policy = capacity, policy
        self.pool = Pool(capacity, report=False)
        self.soft = policy.soft_limit(self.pool.capacity)
        self.pinned_names = pinned_blobs(live, policy)
        self.pinned = set(self.pinned_names)
        self.resident: dict[str, object] = {}   # name -> Slot, in placement order
        self.movable: dict[str, object] = {}    # the same, less the pinned blobs
        self.placed_at: dict[str, int] = {}      # name -> placement number: the resident order
        self.placements = 0
        self.placed_now: list[str] = []          # placed since the last release
        self.victims = Victims()                 # the movable ones, furthest next need first
        self.pinned_end = 0                      # pinned blobs fill [0, pinned_end)
        self.relocated = False
        self.dirty: set = set()
        self.host_valid = set(self.live.persistent) | set(self.live.host_inputs)
        self.device_valid: set = set()
        # split steps (``minilms.lms.substeps``): a blob and its chunks share one home, valid
        # sample by sample: a bit mask per parent; a member is host-valid where all its are
        self.family = live.family
        self.host_mask = {name: mask if name in self.host_valid else 0
                          for name, (parent, mask) in live.family.items() if name == parent}
        for parent in self.host_mask:
            self._refresh_host(parent)

    def run(self) -> Plan:
        prologue = self._place_pinned()
        plans: list[StepPlan] = []
        pending: list[Action] = []
        residents = Residents(prologue)
        dirty, device_valid, host_valid = self.dirty, self.device_valid, self.host_valid
        for index, (step, made) in enumerate(zip(self.live.steps, self.live.made)):
            demand, prefetch = [], []
            self._demand(index, demand)
            self._prefetch(index, prefetch)
            step_plan = StepPlan(step, pending, demand, prefetch, self.pool.in_use, index,
                                 residents)
            plans.append(step_plan)
            residents.steps.append((pending, demand, prefetch))
            if self.watch is not None:
                self.watch(index, step_plan)
            dirty.update(made)             # the step runs: what it makes is on the device only
            device_valid.update(made)
            host_valid.difference_update(made)
            if self.family:
                self._made_on_device(made)
            pending = []
            self._release_after(index, pending)
        self._epilogue(pending)
        pinned = {name: self.resident[name].offset for name in self.pinned_names}
        live = self.live
        return Plan(self.policy, self.pool.capacity, dict(live.blobs), pinned, prologue, plans,
                    pending, frozenset(live.persistent), tuple(live.host_inputs),
                    tuple(live.outputs), chunks=dict(live.chunks))

    # -- pinned blobs ---------------------------------------------------------------------------
    def _place_pinned(self) -> list[Action]:
        """Place the pinned blobs, largest first, from the bottom of the pool up. Plans of one
        schedule with the same pool size and pinned blobs (``policy: auto`` weighs many) start
        from the same placement: it is made once and each plan starts from a copy."""
        key = (self.pool.capacity, tuple(self.pinned_names))
        made = self.live.prologues.get(key)
        if made is None:
            prologue = []
            for name in sorted(self.pinned_names, key=lambda n: -self.nbytes[n]):
                try:
                    slot = self.pool.allocate(self.nbytes[name], name)
                except OutOfDeviceMemory:
                    raise PlanError(pinned_message(self.live, self.policy, self.pinned_names,
                                                    self.pool.capacity)) from None
                self._place(name, slot, -1)
                load = name in self.live.persistent
                prologue.append(self._action("swap_in" if load else "alloc", name))
                if load:
                    self.device_valid.add(name)
            made = (self.pool.copy(), prologue, dict(self.resident), dict(self.placed_at),
                    set(self.device_valid))
            if len(self.live.prologues) >= 64:     # a sweep over pool sizes: keep it bounded
                self.live.prologues.clear()
            self.live.prologues[key] = made
        else:
            self.pool = made[0].copy()
            self.resident, self.placed_at = dict(made[2]), dict(made[3])
            self.device_valid = set(made[4])
        self.placements = len(self.resident)
        self.placed_now = []
        self.pinned_end = max((slot.end for slot in self.resident.values()), default=0)
        return list(made[1])

    # -- one step -------------------------------------------------------------------------------
    def _demand(self, index: int, actions: list) -> None:
        step = self.live.steps[index]
        working = self.live.working[index]
        loaded = self.live.loaded[index]
        names = self.live.placing[index]   # largest first: a big blob finds a hole before the
        pending = list(names)              # small ones split the free space
        placements = 0
        if self.family:    # first, what shares samples with this step's blobs leaves the pool,
            for name in names:    # before any of them takes space (it is needed by this step)
                if name in self.family and name not in self.resident:
                    self._clear_overlaps(name, index, actions, load=name in loaded)
        while pending:
            name = pending.pop(0)
            load = name in loaded
            if self.family and name in self.family and name not in self.resident:
                self._clear_overlaps(name, index, actions, load=load)
            if load and name not in self.host_valid and name not in self.device_valid:
                raise PlanError(f"step {index} ({step.name}) reads {name} before any step "
                                "writes it: the schedule is inconsistent")
            if name in self.resident:
                if load and name not in self.device_valid:   # a pinned input: fresh on the host
                    actions.append(self._action("swap_in", name))
                    self.device_valid.add(name)
                continue
            placements += 1
            self.relocated = False
            if placements > 4 * len(names) or \
                    not self._allocate(name, index, working, actions, relocate=True):
                error = PlanError(demand_message(self.live, self.pinned_names, self.pool, index,
                                                 name))
                error.step = index     # which step did not fit: splitting it may make it fit
                raise error
            actions.append(self._action("swap_in" if load else "alloc", name))
            if load:
                self.device_valid.add(name)
            if self.relocated:   # some of this step's own blobs went home: bring them back
                pending += [n for n in self._in_list_order(index)
                            if n not in self.resident and n not in pending]

    def _in_list_order(self, index: int) -> list[str]:
        step = self.live.steps[index]
        return list(dict.fromkeys(step.reads + step.updates + step.writes + step.workspace))

    def _prefetch(self, index: int, actions: list) -> None:
        if not self.policy.prefetch:
            return
        live = self.live
        protect = set(live.working[index])
        last = min(live.n - 1, index + self.policy.prefetch)
        for ahead in range(index + 1, last + 1):
            protect |= live.working[ahead]
            for name in live.load_lists[ahead]:
                if name in self.resident or name not in self.host_valid:
                    continue   # resident already, or made by a step before ``ahead``
                if self.family and name in self.family and \
                        not self._clear_overlaps(name, index, actions, protect, load=True):
                    continue   # a blob it overlaps is in use meanwhile: load it on demand
                if not self._allocate(name, index, protect, actions, victims_after=ahead):
                    return   # no room: later loads would overtake this one, so stop here
                actions.append(self._action("swap_in", name, for_step=ahead))
                self.device_valid.add(name)

    def _reduce(self, index: int, actions: list) -> None:
        """``reduce_grads``: each parameter gradient this step wrote goes home now (a pinned one
        keeps its slot) and is reduced there; its device copy is stale until reloaded."""
        for name in self.live.steps[index].writes:
            if self.live.blobs[name].role != "param_grad":
                continue
            slot = self.resident[name]    # the reduction's offset: where it was
            reduce = Action.make("reduce", name, self.nbytes[name], slot.offset, 0)
            if name in self.pinned:
                actions.append(self._action("sync", name))
                self.dirty.discard(name)
                self.host_valid.add(name)
            else:
                self._evict(name, index, actions, "reduce", needed=True)
            self.device_valid.discard(name)
            actions.append(reduce)

    def _release_after(self, index: int, actions: list) -> None:
        """Drop what is dead, re-key what this step used, then evict down to the soft limit.
        Only this step's blobs and those placed while it ran can have died: any other resident
        blob was needed after the previous step and has not been used since."""
        if self.policy.reduce_grads:
            self._reduce(index, actions)
        touched = self.live.working[index].union(self.placed_now)
        self.placed_now = []
        order, resident, pinned = self.placed_at, self.resident, self.pinned
        dead = []
        needs, uses, keyed = self.live.needs, self.live.uses, self.victims.need
        for name in touched:
            if name in resident and name not in pinned:
                need = needs[name][bisect_right(uses[name], index)]    # need_after, inlined
                if need == INFINITY:
                    dead.append(name)
                elif need != keyed[name]:
                    self.victims.key(name, need, self.nbytes[name])
        for name in sorted(dead, key=order.__getitem__):   # in the resident order, as they are
            self._evict(name, index, actions, "dead")
        if self.pool.in_use <= self.soft:
            return
        keep = set()
        for ahead in range(index + 1, min(self.live.n, index + 1 + max(1, self.policy.prefetch))):
            keep |= self.live.working[ahead]
        skipped: list = []
        while self.pool.in_use > self.soft:
            name = self.victims.next(keep, -1, skipped)
            if name is None:
                break
            self._evict(name, index, actions, "soft limit")
        self.victims.restore(skipped)

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
    def _place(self, name: str, slot, index: int) -> None:
        self.resident[name] = slot
        self.placed_at[name] = self.placements
        self.placements += 1
        self.placed_now.append(name)
        if name not in self.pinned:
            self.movable[name] = slot
            need = self.live.needs[name][bisect_right(self.live.uses[name], index)]
            self.victims.key(name, need, self.nbytes[name])

    def _allocate(self, name: str, index: int, protect: set, actions: list,
                  victims_after: float = -1, relocate: bool = False) -> bool:
        """Place ``name``: in a free block if one is large enough, else in the cheapest window
        of the pool that free space and evictable blobs make contiguous (nothing moves once
        placed, so total free space is not enough)."""
        nbytes = self.nbytes[name]
        top = name in self.live.workspace
        slot = self.pool.try_allocate(nbytes, name, from_top=top)
        if slot is not None:          # the common case, first
            self._place(name, slot, index)
            return True
        size = align_up(max(nbytes, 1), self.pool.alignment)
        skipped: list = []
        while True:
            if slot is not None:
                self._place(name, slot, index)
                self.victims.restore(skipped)
                return True
            if self.pool.capacity - self.pool.in_use >= size:
                break                        # space enough, not in one piece
            victim = self.victims.next(protect, victims_after, skipped)
            if victim is None:
                self.victims.restore(skipped)
                return False
            self._evict(victim, index, actions, "furthest next use")
            slot = self.pool.try_allocate(nbytes, name, from_top=top)
        self.victims.restore(skipped)
        window = self._window(nbytes, index, protect, victims_after)
        why = "contiguous space"
        if window is None and relocate:   # last resort: move the step's own blobs via the host
            window, why = self._window(nbytes, index, set(), victims_after, protect), "relocation"
        if window is None:
            return False
        start, victims = window
        for victim in victims:
            if victim in protect:
                self.relocated = True
            self._evict(victim, index, actions, why, needed=victim in protect or None)
        self._place(name, self.pool.allocate(nbytes, name, at=start), index)
        return True

    def _window(self, nbytes: int, index: int, protect: set, victims_after: float,
                costly: set = frozenset()):
        """``(offset, blobs to evict)`` of the cheapest window of ``nbytes`` (aligned) that holds
        only free space and evictable blobs, or None. A victim costs its bytes over the steps
        until it is needed again (twice that if it is dirty: a swap-out too): far-off and dead
        blobs go first, as furthest-next-use eviction would have it. A sliding window per run of
        blocks between unmovable ones.

        The pinned blobs fill the bottom of the pool from the prologue on and never move, so the
        search starts above them (unless ``costly`` lets it move one of this step's own blobs
        and one of those is pinned); each blob's need is the one it is keyed by in the heap,
        current for every blob this step does not use."""
        size = align_up(max(nbytes, 1), self.pool.alignment)
        if costly.isdisjoint(self.pinned) and (self.pinned_end or not self.pinned):
            blocks = [(slot.offset, slot.nbytes, name) for name, slot in self.movable.items()]
            blocks += [(offset, length, None)
                       for offset, length in self.pool.free_blocks(self.pinned_end)]
            blocks.sort()
        else:
            blocks = self.pool.blocks()
        working, needs, pinned, dirty = self.live.working[index], self.victims.need, self.pinned, \
            self.dirty
        lengths, costs = [], []
        for _, length, name in blocks:
            if name is None:
                block_cost = 0.0
            elif name in costly:
                block_cost = 1e6 * length
            elif name in protect or name in pinned:
                block_cost = INFINITY
            else:
                need = self.live.need_after(name, index) if name in working else needs[name]
                block_cost = INFINITY if need <= victims_after else 0.0 if need == INFINITY \
                    else length * (2 if name in dirty else 1) / max(need - index, 1)
            lengths.append(length)
            costs.append(block_cost)
        found = cheapest_window(lengths, costs, size, INFINITY)
        if found is None:
            return None
        left, right = found
        return blocks[left][0], [b[2] for b in blocks[left:right + 1] if b[2] is not None]

    def _evict(self, name: str, index: int, actions: list, why: str,
                needed: bool | None = None) -> None:
        if needed is None:
            needed = self.live.need_after(name, index) != INFINITY
        slot = self.resident.pop(name)
        if name in self.dirty and needed:
            kind = "swap_out"
            self.host_valid.add(name)
            if self.family and name in self.family:
                parent, mask = self.family[name]
                self.host_mask[parent] |= mask
                self._refresh_host(parent)
        else:
            kind, why = "drop", why if needed else "dead"
        actions.append(Action.make(kind, name, self.nbytes[name], slot.offset, slot.nbytes,
                                   None, why))
        self.dirty.discard(name)
        self.device_valid.discard(name)
        self.victims.discard(name)
        self.movable.pop(name, None)
        if name in self.pinned:     # only relocation moves one: the bottom is no longer solid
            self.pinned_end = 0
        self.pool.free(slot)

    # -- a blob and its chunks ------------------------------------------------------------------
    def _refresh_host(self, parent: str) -> None:
        valid = self.host_mask[parent]
        for member in self.live.members[parent]:
            if self.family[member][1] & valid == self.family[member][1]:
                self.host_valid.add(member)
            else:
                self.host_valid.discard(member)

    def _made_on_device(self, made) -> None:
        """A step wrote these: the samples they hold are stale on the host, for every blob of
        the family."""
        touched = set()
        for name in made:
            if name in self.family:
                parent, mask = self.family[name]
                self.host_mask[parent] &= ~mask
                touched.add(parent)
        for parent in touched:
            self._refresh_host(parent)

    def _clear_overlaps(self, name: str, index: int, actions: list, protect=(),
                        load: bool = False) -> bool:
        """Before ``name`` is placed, no blob that shares samples with it stays resident: one
        copy of each sample on the device at a time, so a copy is never stale. A dirty one goes
        home first if ``name`` is to be loaded (its samples are the newest), or if they are
        needed later. False, and nothing done, if one is in ``protect``."""
        resident = [r for r in self.live.overlapping[name] if r in self.resident]
        if any(r in protect for r in resident):
            return False
        for other in resident:
            self._evict(other, index, actions, "overlap", needed=True if load else None)
        return True

    def _action(self, kind: str, name: str, for_step: int | None = None) -> Action:
        slot = self.resident[name]
        return Action.make(kind, name, self.nbytes[name], slot.offset, slot.nbytes, for_step)


def make_plan(net: Net, steps: list[Step], capacity: int, policy: Policy = Policy(),
              watch=None) -> Plan:
    """The plan of one iteration of ``steps`` in a pool of ``capacity`` bytes under ``policy``
    (manual knobs; see ``minilms.lms.cost.plan_for`` for ``auto``). Raises PlanError if none fits.
    ``watch(index, step_plan)``: called as each step's plan is made (from index 0 again if
    prefetch is shortened); what it raises ends the planning (``policy: auto`` stops candidates
    that cannot win).

    Prefetched blobs take space early and can leave the pool too fragmented for a later step
    (nothing moves once placed): then the prefetch distance is shortened until the plan fits,
    and ``plan.notes`` says so. Prefetch never makes a plan that fits fail."""
    with collector_paused():
        live = Liveness.of(net, steps)
        try:
            return _written_back(_Planner(live, capacity, policy, watch).run(), live)
        except PlanError:
            if policy.prefetch == 0 or not policy.enabled:
                raise
        for distance in range(policy.prefetch - 1, -1, -1):
            try:
                plan = _Planner(live, capacity, replace(policy, prefetch=distance), watch).run()
            except PlanError:
                if distance == 0:
                    raise
                continue
            plan.notes.append(f"prefetch {policy.prefetch} does not fit in "
                              f"{format_bytes(capacity)}: planned with prefetch {distance}")
            return _written_back(plan, live)


def _written_back(plan: Plan, live: Liveness) -> Plan:
    """``plan`` with its swap-outs' copies issued early where the policy says so."""
    return write_back_early(plan, live.family) if plan.policy.write_back == "early" else plan
