"""The LMS executor: replays a plan, step by step, and does nothing the plan does not say.

For each step ``i`` of the plan (``minilms.plan``), in order:

1. the copy stream waits until step ``i - 1`` has computed (its space may now be reused);
2. the step's releases and demand are issued on the copy stream: swap-outs, drops, placements at
   the plan's offsets, loads; an event marks the point where step ``i``'s own data has landed;
3. prefetches for later steps are issued behind that event;
4. the compute stream waits for the event, and the step runs.

On ``cuda`` the copy stream overlaps kernels on the compute stream; on ``cpu`` it is a thread of its
own and the copies (``numpy.copyto``, and the link model's wait) run while the kernels compute.

Every access a step makes goes through ``Blob.resident_view``, which neither places nor copies: a
blob that the plan failed to bring in is an error, not a silent fix. Each release checks that the
blob did what the plan predicted (a swap-out copies, a drop does not).

A plan is made once per input shape and mode (training, or forward only for evaluation) and
cached: a smaller last batch gets its own. Switching between them sends the pinned blobs of the one
left home; parameters and optimizer state are the same ``Blob`` objects in all of them.
"""
import time
from dataclasses import dataclass

from .blob import Blob, State
from .cost import CostModel, plan_for
from .executor import Executor
from .net import Net
from .plan import Plan, Policy


@dataclass
class Program:
    net: Net
    plan: Plan
    blobs: dict
    train: bool


class LmsExecutor(Executor):
    """``LmsExecutor(net, device, solver, policy)``: train ``net`` within ``device``'s pool."""

    def __init__(self, net: Net, device, solver=None, policy: Policy = Policy(), seed: int = 0,
                 cost_model: CostModel | None = None):
        super().__init__(device, solver, seed)
        self.policy = policy
        self.cost_model = cost_model or CostModel.for_device(device.kind,
                                                             getattr(device, "link", None))
        self.state_names = tuple(solver.state_names) if solver else ()
        self.shared: dict[str, Blob] = {}       # parameters and optimizer state, by name
        self.programs: dict = {}
        self.current: Program | None = None
        self.stall_seconds = 0.0                 # cpu: time compute waited for copies, last iteration
        program = self._program(net, train=solver is not None)
        self.net, self.blobs = program.net, program.blobs
        self.initialise(seed)        # on the host, before the prologue loads what is pinned
        self._activate(program)

    # -- programs --------------------------------------------------------------------------------
    def _program(self, net: Net, train: bool) -> Program:
        key = (tuple(sorted((k, v[0]) for k, v in net.inputs.items())), train)
        if key not in self.programs:
            steps = net.schedule(self.state_names)
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
            self.programs[key] = Program(net, plan, blobs, train)
        return self.programs[key]

    def _activate(self, program: Program) -> None:
        if program is self.current:
            return
        if self.current is not None:
            self.flush()
        self.current, self.net, self.blobs = program, program.net, program.blobs
        self.device.synchronize()
        for action in program.plan.prologue:
            self._apply(action, None)

    def flush(self) -> None:
        """Send the pinned blobs home and leave the pool empty (before switching plans, or to
        read every parameter on the host)."""
        if self.current is None:
            return
        for name in self.current.plan.pinned:
            blob = self.blobs[name]
            keep = blob.role in ("param", "optimizer_state")
            blob.release(needed_later=keep)
        self.device.synchronize()
        self.current = None

    @property
    def plan(self) -> Plan:
        return self.current.plan

    def sync_state(self) -> None:
        """Bring parameters and optimizer state home (they may be newer on the device)."""
        for blob in self.shared.values():
            if blob.placed:
                blob.sync_home()
        self.device.synchronize()

    # -- one iteration ---------------------------------------------------------------------------
    def iterate(self, inputs: dict, train: bool = True) -> dict:
        """Run one iteration on ``inputs`` (host arrays by input name) under the plan for their
        shapes; returns the loss and accuracy values. ``train=False``: forward only."""
        solver = self.solver if train else None
        shapes = {name: (value.shape, value.dtype) for name, value in inputs.items()}
        net = self.net if shapes == self.net.inputs else self.net.with_inputs(shapes)
        self._activate(self._program(net, train=solver is not None))
        if solver is not None:
            solver.begin_iteration(self.iteration)
            self.iteration += 1
        for name, value in inputs.items():
            self.blobs[name].mutable_host_data(overwrite=True)[...] = value
        plan = self.current.plan
        if solver is not None:
            for loss in self.net.loss_blobs:
                self.blobs[f"{loss}.grad"].mutable_host_data(overwrite=True)[...] = 1.0
        compute, copy = self.device.compute_stream, self.device.copy_stream
        stall, unwaited = 0.0, False   # unwaited: copies issued that some step may depend on
        for index, step_plan in enumerate(plan.steps):
            now = step_plan.release + step_plan.demand
            if any(a.copies for a in now + step_plan.prefetch):
                self._after_compute(compute, copy)
            for action in now:
                self._apply(action, copy)
            # The step waits for its own loads, for prefetches meant for it, and for swap-outs
            # (their space may be what it writes). Steps that need none of that do not wait.
            unwaited |= any(a.copies for a in now)
            if unwaited:
                ready = self.device.event()
                ready.record(copy)
            for action in step_plan.prefetch:
                self._apply(action, copy)
            if unwaited:
                waited = time.perf_counter()
                ready.wait(compute)
                stall += time.perf_counter() - waited
            unwaited = any(a.copies for a in step_plan.prefetch)
            step = step_plan.step
            if step.kind == "forward":
                self.forward(step, train)
            elif step.kind == "backward":
                self.backward(step)
            else:
                self.update(step, solver)
        self._after_compute(compute, copy)
        for action in plan.epilogue:
            self._apply(action, copy)
        self.device.synchronize()
        self.stall_seconds = stall if self.device.kind == "cpu" else float("nan")
        return {name: float(self.blobs[name].host_data()[0]) for name in plan.outputs}

    def _after_compute(self, compute, copy) -> None:
        """Order the copy stream after the kernels issued so far (on ``cpu`` they are done)."""
        if self.device.kind == "cuda":
            done = self.device.event()
            done.record(compute)
            done.wait(copy)

    def _apply(self, action, stream) -> None:
        blob = self.blobs[action.blob]
        kind = action.kind
        if action.places and not blob.placed:
            blob.place(at=action.offset)
        if kind == "swap_in":
            if blob.state is not State.HOST:
                raise RuntimeError(f"plan mismatch: swap-in of {blob.name} in state "
                                   f"{blob.state.value}: its host copy is not the newest")
            blob.device_data(stream)
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
