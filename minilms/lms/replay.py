"""The LMS executor: replays a plan, step by step, and does nothing the plan does not say.

Copies go on two streams, one each way (``h2d``: loads; ``d2h``: swap-outs and syncs), so that a
swap-out and a prefetch run at once (a GPU has a copy engine per direction). For each step ``i``
of the plan (``minilms.plan``), in order:

1. each copy stream with work in step ``i`` waits until step ``i - 1`` has computed (its space
   may now be reused);
2. the step's releases and demand are issued: swap-outs on ``d2h``, drops, placements at the
   plan's offsets, loads on ``h2d``; a load first waits for the swap-outs still reading the space
   it writes, or still writing the home it reads (an event from ``d2h``);
3. prefetches for later steps are issued behind the step's own loads;
4. the compute stream waits for the events that say the step's data has landed (and that copies
   in space it writes are done), and the step runs.

On ``cuda`` the copy streams overlap kernels on the compute stream and each other; on ``cpu`` each
is a thread of its own and the copies (``numpy.copyto``, and the link model's wait) run while the
kernels compute, where a core is free for them or a link's wait must overlap; else they run where
they are issued (``device.cpu_streams.copy_threads``).

Every access a step makes goes through ``Blob.resident_view``, which neither places nor copies: a
blob that the plan failed to bring in is an error, not a silent fix. Each release checks that the
blob did what the plan predicted (a swap-out copies, a drop does not).

Data-parallel training (``minilms.training.distributed``) gives the executor a ``reducer`` and plans
with
``reduce_grads`` on a schedule whose updates come after the last backward. A ``reduce`` action
hands a gradient's host copy to the reducer behind an event on the ``d2h`` stream (its copy home);
between steps the reducer starts the averaging of those whose copies have landed, while earlier
layers' backward steps compute; a ``swap_in`` of a gradient first waits for its average.

The blobs the plan moves across the link, the inputs and outputs the host writes and reads, and
parameters and optimizer state get their host copies (homes) before the first iteration
(``minilms.lms.host``); every other blob lives in the pool only and has none. Parameters and
optimizer state get theirs when the plan is made, page-locked if a step moves them; the
per-iteration blobs' homes are carved from one page-locked arena shared by every program
(``HomeArena``) when their program is activated.

A plan is made once per input shape and mode (training, or forward only for evaluation) and
cached: a smaller last batch gets its own. Switching between them sends the pinned blobs of the one
left home; parameters and optimizer state are the same ``Blob`` objects in all of them.
"""
from dataclasses import dataclass

from .. import events
from ..blob import Blob, State
from ..net import Net
from .cost import CostModel, plan_for
from .executor import Executor
from .host import HomeArena, HostMemory, crossing, homes, host_memory, ring_blobs
from .plan import Plan, Policy
from .ring import HomeRing, Pending


@dataclass
class Program:
    net: Net
    plan: Plan
    blobs: dict
    train: bool

    def __post_init__(self):
        """Which copies each step must wait for, computed once. Copies on one stream run in
        order, so waiting for one waits for all before it on its stream. A step waits, per
        stream, for the latest of: the loads of its own blobs, and the copies in flight in space
        it writes without loading (a kernel must not overwrite a copy still in flight: a
        swap-out still reading the space, or a prefetch still writing it for a blob that was
        evicted before its step came). A load waits for the swap-outs in flight in its space or
        of its own blob (whose home they write). Prefetches for later steps and copies in space
        the step does not touch go on under its compute."""
        self.copying = []             # per step: (actions now, streams with copies, waits)
        self.marks: set = set()       # (stream, number): an event is recorded after that copy
        self.sequence_of: dict = {}   # id(action) -> (stream, its number on that stream)
        self.load_waits: dict = {}    # id(load) -> the d2h number its stream waits for first
        count = {"h2d": 0, "d2h": 0}
        waited = {"h2d": 0, "d2h": 0}           # by the compute stream
        loaded: dict = {}                       # blob -> number of its latest load
        outgoing = {"h2d": [], "d2h": []}       # (number, start, end) compute has not waited for
        homeward: list = []   # (number, start, end, home): d2h the h2d stream has not waited for
        loads_waited = 0
        chunks = self.plan.chunks

        def home(name):   # a chunk of a split step keeps its rows in its parent's home
            return chunks[name][0] if name in chunks else name
        for step_plan in self.plan.steps:
            now = step_plan.release + step_plan.demand
            streams = set()
            for action in now + step_plan.prefetch:
                direction = action.copies
                if direction is None:
                    continue
                streams.add(direction)
                start, end = action.offset, action.offset + action.size
                if direction == "h2d":
                    need = max([n for n, a, b, owner in homeward
                                if (a < end and start < b) or owner == home(action.blob)] + [0])
                    if need > loads_waited:
                        self.load_waits[id(action)] = loads_waited = need
                        self.marks.add(("d2h", need))
                        homeward = [h for h in homeward if h[0] > need]
                count[direction] += 1
                number = count[direction]
                if direction == "h2d":
                    loaded[action.blob] = number
                else:
                    homeward.append((number, start, end, home(action.blob)))
                outgoing[direction].append((number, start, end))
                self.sequence_of[id(action)] = (direction, number)
            need = {"h2d": max([loaded.get(name, 0) for name in step_plan.step.blobs] + [0]),
                    "d2h": 0}
            for action in now:
                if action.kind == "alloc":
                    for direction, copies in outgoing.items():
                        need[direction] = max([need[direction]] + [
                            n for n, start, end in copies
                            if start < action.offset + action.size and action.offset < end])
            waits = []
            for direction in ("h2d", "d2h"):
                if need[direction] > waited[direction]:
                    waited[direction] = need[direction]
                    self.marks.add((direction, need[direction]))
                    outgoing[direction] = [o for o in outgoing[direction]
                                           if o[0] > need[direction]]
                    waits.append((direction, need[direction]))
            self.copying.append((now, frozenset(streams), tuple(waits)))
        self.issue = self.issue_lists()

    def issue_lists(self) -> list:
        """Per step, what the executor issues, worked out once: ``(action, direction, the d2h
        number a load waits for first or None, the mark to record after it or None)``, the
        direction ``d2h`` for actions that copy nothing (a drop; a reduce, whose event follows
        the copy home)."""
        lists = []
        for step_plan, (now, _, _) in zip(self.plan.steps, self.copying):
            issue = []
            for action in now + step_plan.prefetch:
                mark = self.sequence_of.get(id(action))
                issue.append((action, action.copies or "d2h", self.load_waits.get(id(action)),
                              mark if mark in self.marks else None))
            lists.append(issue)
        return lists


class LmsExecutor(Executor):
    """``LmsExecutor(net, device, solver, policy)``: train ``net`` within ``device``'s pool."""

    def __init__(self, net: Net, device, solver=None, policy: Policy = Policy(), seed: int = 0,
                 cost_model: CostModel | None = None, reducer=None):
        super().__init__(device, solver, seed)
        if policy.reduce_grads and reducer is None and solver is not None:
            raise ValueError("a policy with reduce_grads needs a reducer "
                             "(minilms.training.distributed)")
        self.policy, self.reducer = policy, reducer
        self.cost_model = cost_model or CostModel.for_device(device.kind,
                                                             getattr(device, "link", None))
        self.state_names = tuple(solver.state_names) if solver else ()
        self.shared: dict[str, Blob] = {}       # parameters and optimizer state, by name
        self.arena = HomeArena(device)         # the per-iteration homes of every program
        self.ring = HomeRing(device)           # two of each home the host writes or reads
        self._ended = None     # an event after the last iteration's last copy (on d2h)
        self.programs: dict = {}
        self.current: Program | None = None
        self.stall_seconds = 0.0   # cpu: time compute waited for copies, last iteration
        program = self._program(net, train=solver is not None)
        self.net, self.blobs = program.net, program.blobs
        self.initialise(seed)        # on the host, before the prologue loads what is pinned
        self._activate(program)

    # -- programs --------------------------------------------------------------------------------
    def _program(self, net: Net, train: bool) -> Program:
        key = (tuple(sorted((k, v[0]) for k, v in net.inputs.items())), train)
        if key not in self.programs:
            steps = net.schedule(self.state_names, delay_updates=self.policy.reduce_grads)
            if not train:
                steps = [s for s in steps if s.kind == "forward"]
            plan = plan_for(net, steps, self.device.pool.capacity, self.policy, self.cost_model)
            blobs = {}
            for name, info in net.blobs.items():
                if info.role in ("param", "optimizer_state"):
                    blob = self.shared.setdefault(
                        name, Blob(self.device, name, info.shape, info.dtype, info.role))
                    if blob.shape != info.shape:
                        raise ValueError(f"blob {name}: the input shapes {dict(net.inputs)} "
                                         f"change its shape {blob.shape} -> {info.shape}")
                    blobs[name] = blob
                else:
                    blobs[name] = Blob(self.device, name, info.shape, info.dtype, info.role)
            # the homes the plan needs, now (none mid-iteration): the per-iteration blobs' from
            # the arena when the program is activated, the lasting ones here, page-locked if
            # they cross the link every iteration
            locked = set(crossing(plan))
            for name in homes(plan):
                if name in self.shared:
                    blobs[name].ensure_home(page_locked=name in locked)
            self.programs[key] = Program(net, plan, blobs, train)
        return self.programs[key]

    def _share_homes(self, program: Program) -> None:
        """Give ``program``'s per-iteration blobs their homes out of the arena (what the host
        writes or reads every iteration: out of the ring, ``_use_slot``), and each chunk of a
        split step the rows of its parent's home."""
        plan, blobs = program.plan, program.blobs
        ring = ring_blobs(plan)
        self.arena.share(program, [blobs[n] for n in homes(plan)
                                   if n not in self.shared and n not in ring])
        self.ring.share(program, [blobs[n] for n in ring])
        self._use_slot(self.ring.slots[self.ring.turn])
        for name, (parent, n0, n1) in plan.chunks.items():
            if parent not in ring:
                home = blobs[parent].ensure_home()
                blobs[name].share_home(home[n0:n1], blobs[parent].page_locked)

    def _use_slot(self, slot, written=()) -> None:
        """Give the ring's blobs (inputs, seeds, outputs) the homes of ``slot``, and their chunks
        rows of those. The blobs the host writes now (``written``) just take theirs; the others'
        homes are stale (``Blob.move_home``)."""
        blobs, chunks = self.blobs, self.current.plan.chunks
        for name, home in slot.homes.items():
            if name in written:
                blobs[name].share_home(home, page_locked=True)
            else:
                blobs[name].move_home(home, page_locked=True)
        for name, (parent, n0, n1) in chunks.items():
            if parent in slot.homes:
                blobs[name].share_home(slot.homes[parent][n0:n1], page_locked=True)

    def _activate(self, program: Program) -> None:
        if program is self.current:
            return
        if self.current is not None:
            self.flush()
        self.current, self.net, self.blobs = program, program.net, program.blobs
        self._share_homes(program)
        self._parents = {parent for parent, _, _ in program.plan.chunks.values()}
        self.device.synchronize()
        if events.listening:   # the trace learns the plan it is about to see replayed
            events.emit("plan", program.plan.policy.describe(), program.plan.capacity,
                        plan=program.plan, net=program.net, train=program.train)
        # the pages the plan uses, mapped beside the prologue (its loads' first) and the first
        # iteration, which touch them all; not sooner: the host's start-up would wait on them
        self.device.prefault(program.plan.extent, [(a.offset, a.offset + a.size) for a in
                                                   program.plan.prologue if a.copies == "h2d"])
        for action in program.plan.prologue:
            self._apply(action, None)

    def flush(self) -> None:
        """Send the pinned blobs home and leave the pool empty (before switching plans, or to
        read every parameter on the host)."""
        if self.current is None:
            return
        self.ring.settle()
        for name in self.current.plan.pinned:
            blob = self.blobs[name]
            keep = blob.role in ("param", "optimizer_state")
            blob.release(needed_later=keep)
        self.device.synchronize()
        self.current = None

    @property
    def plan(self) -> Plan:
        return self.current.plan

    def host_memory(self, batches: int = 0) -> HostMemory:
        """The host memory the current plan needs on this device, with ``batches`` batches of
        inputs held beside it (``minilms.lms.host``)."""
        return host_memory(self.plan, self.device.kind, batches)

    def sync_state(self) -> None:
        """Bring parameters and optimizer state home (they may be newer on the device)."""
        for blob in self.shared.values():
            if blob.placed:
                blob.sync_home()
        self.device.synchronize()

    # -- one iteration ---------------------------------------------------------------------------
    def issue(self, inputs: dict, train: bool = True) -> Pending:
        """Issue one iteration on ``inputs`` (host arrays by input name) under the plan for their
        shapes, and return at once: its outputs come from the ``Pending`` (``minilms.lms.ring``).
        The host may write the next iteration's inputs now; other host copies are not valid until
        ``sync_state`` (or ``iterate``, which waits for everything). ``train=False``: forward."""
        solver = self.solver if train else None
        shapes = {name: (value.shape, value.dtype) for name, value in inputs.items()}
        net = self.net if shapes == self.net.inputs else self.net.with_inputs(shapes)
        self._activate(self._program(net, train=solver is not None))
        if solver is not None:
            solver.begin_iteration(self.iteration)
            self.iteration += 1
            if self.reducer is not None:
                self.reducer.begin_iteration(self.iteration)
        plan = self.current.plan
        seeds = [f"{loss}.grad" for loss in self.net.loss_blobs] if solver is not None else []
        slot = self.ring.take()       # waits for the loads and outputs of two iterations ago
        self._use_slot(slot, written=set(inputs) | set(seeds))
        for name, value in inputs.items():
            self.blobs[name].mutable_host_data(overwrite=True)[...] = value
        for seed in seeds:
            self.blobs[seed].mutable_host_data(overwrite=True)[...] = 1.0
        device = self.device
        compute = device.compute_stream
        program, stall, events_at = self.current, 0.0, {}
        started = self.begin_iteration_trace()
        on = {"h2d": device.h2d_stream, "d2h": device.d2h_stream}
        if self._ended is not None:   # the last iteration's copies out of the space it reuses
            self._ended.wait(compute)
            self._ended.wait(on["h2d"])
        for index, (step_plan, (_, streams, waits), issue) in enumerate(zip(
                plan.steps, program.copying, program.issue)):
            if streams:
                self._after_compute(streams)
            if self.reducer is not None:
                self.reducer.poll()         # start the averages whose copies home have landed
            for action, direction, first, mark in issue:
                if first is not None:
                    events_at[("d2h", first)].wait(on["h2d"])
                self._apply(action, on[direction])
                if mark is not None:
                    events_at[mark] = event = device.event()
                    event.record(on[direction])
            if waits:
                waited = events.clock()
                for mark in waits:
                    events_at[mark].wait(compute)
                now_ = events.clock()
                stall += now_ - waited
                if events.listening and device.kind == "cpu":
                    events.emit("stall", step_plan.step.name, step=index, start=waited, end=now_)
            self.run_step(index, step_plan.step, train, solver)
        self._after_compute(("h2d", "d2h"))
        for action in plan.epilogue:
            self._apply(action, device.copy_stream(action.copies or "d2h"))
        slot.loaded, self._ended = device.event(), device.event()
        slot.loaded.record(on["h2d"])
        self._ended.record(on["d2h"])
        slot.pending = Pending(self.iteration, {n: slot.homes[n] for n in plan.outputs},
                               self._ended)
        if events.listening:        # the trace reads the kernels' times: it waits for them
            device.synchronize()
        self.end_iteration_trace(started, train)
        self.stall_seconds = stall if device.kind == "cpu" else float("nan")
        return slot.pending

    def _after_compute(self, streams) -> None:
        """Order the copy ``streams`` (directions) after the kernels issued so far (on ``cpu``
        they are done)."""
        if self.device.kind == "cuda":
            done = self.device.event()
            done.record(self.device.compute_stream)
            for direction in streams:
                done.wait(self.device.copy_stream(direction))

    def _apply(self, action, stream) -> None:
        blob = self.blobs[action.blob]
        kind = action.kind
        if action.places and not blob.placed:
            blob.place(at=action.offset)
        if kind == "swap_in":
            if self.reducer is not None:
                self.reducer.finish(blob.name)      # a gradient: wait for its average
            if action.blob in self.current.plan.chunks or blob.name in self._parents:
                blob.state = State.HOST     # its home's rows were written through another blob
            if blob.state is not State.HOST:
                raise RuntimeError(f"plan mismatch: swap-in of {blob.name} in state "
                                   f"{blob.state.value}: its host copy is not the newest")
            blob.device_data(stream)
        elif kind == "reduce":
            if self.reducer is None:
                raise RuntimeError(f"plan mismatch: reduce of {blob.name} without a reducer")
            copied = self.device.event()       # the copy home, just issued, is behind it
            copied.record(stream)
            self.reducer.submit(blob.name, blob.mutable_host_data(), copied)
        elif kind == "sync":
            if not blob.sync_home(stream):
                raise RuntimeError(f"plan mismatch: sync of {blob.name}, which is not dirty")
        elif kind in ("swap_out", "drop"):
            if blob.slot.offset != action.offset:
                raise RuntimeError(f"plan mismatch: {blob.name} is at {blob.slot.offset}, the "
                                   f"plan releases it at {action.offset}")
            did = blob.release(needed_later=kind == "swap_out", stream=stream)
            if (did == "swap_out") != (kind == "swap_out"):
                raise RuntimeError(f"plan mismatch: {kind} of {blob.name} did {did}")

    # -- the planned accesses --------------------------------------------------------------------
    def _read(self, name):
        return self.blobs[name].resident_view(read=True, write=False)

    def _write(self, name):
        return self.blobs[name].resident_view(read=False, write=True)

    def _update(self, name):
        return self.blobs[name].resident_view(read=True, write=True)
