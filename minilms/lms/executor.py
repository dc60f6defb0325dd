"""Executors: run a net's schedule on a device, one step at a time.

Every blob of the net is a ``Blob`` (its home on the host). ``Executor`` turns a step into one layer
call: its blobs' device arrays are gathered into a ``StepIO`` (reads, writes claimed without a
copy), then the layer runs; a backward step adds partial gradients where a blob feeds several
layers; an update step hands parameters, gradients and state to the solver. How blobs reach the
device is the subclass's business:

* ``ResidentExecutor`` is LMS off: every blob is placed in the pool once and stays, so it needs the
  whole net to fit, and it is the reference every LMS plan must reproduce bit for bit. It uses the
  blobs' own lazy syncing.
* ``minilms.lms.LmsExecutor`` replays a plan and touches a blob only as the plan said.
"""
import numpy as np

from .. import events
from ..blob import Blob
from ..device.pool import align_up
from ..errors import OutOfDeviceMemory
from ..kernels import families
from ..layers import StepIO
from ..layers.recompute import rerun_forward
from ..layers.split import add_sums, part_io
from ..net import Net, Step
from ..sizes import format_bytes
from .ring import Pending

# numba's: imported with the first kernel that runs (``kernels.families``)
elementwise, blas_threads = families("elementwise", "blas_threads")


class Executor:
    """The shared part: parameter initialisation and the step-to-layer translation."""

    net: Net
    blobs: dict

    def __init__(self, device, solver=None, seed: int = 0):
        self.device, self.solver = device, solver
        self.iteration = 0
        self.rng = np.random.default_rng(seed)
        self._named = {}        # (id(step), kind) -> the step's blob names (``_names``)

    def initialise(self, seed: int) -> None:
        """Parameters from their initialisers (seeded), optimizer state zeroed, on the host."""
        rng = np.random.default_rng(seed)
        for name, spec in self.net.initial_params:
            spec.fill(self.blobs[name].mutable_host_data(overwrite=True), rng)
        for blob in self.blobs.values():
            if blob.role == "optimizer_state":
                blob.mutable_host_data()[...] = 0

    def iterate(self, inputs: dict, train: bool = True) -> dict:
        """Run one iteration on ``inputs`` (host arrays by input name) and wait for the device:
        the loss and accuracy values by name, and every host copy up to date. ``submit`` returns
        before the device is done (a training loop that reads an iteration's loss after issuing
        the next keeps a GPU busy)."""
        pending = self.submit(inputs, train)
        self.device.synchronize()
        return pending.result()

    def submit(self, inputs: dict, train: bool = True) -> Pending:
        """``issue`` the iteration. On the ``cpu`` device BLAS is held to one thread meanwhile:
        each product sets every BLAS library to one thread and back around its call
        (``blas_threads``, its threads are the cores'), and an iteration makes hundreds; held
        here, those are a counter's steps (docs/benchmarks.md, session 68)."""
        if self.device.kind != "cpu":
            return self.issue(inputs, train)
        with blas_threads.one_blas_thread():
            return self.issue(inputs, train)

    def issue(self, inputs: dict, train: bool = True) -> Pending:
        raise NotImplementedError

    def outputs(self) -> list[str]:
        return [layer.top[0] for layer in self.net.layers
                if layer.is_loss or layer.type == "Accuracy"]

    # -- running a step, timed for the trace -----------------------------------------------------
    def run_step(self, index: int, step: Step, train: bool, solver) -> None:
        """One step on the compute stream. While a tracer listens, it is reported as a "kernel"
        event: timed by the clock on ``cpu`` (kernels are synchronous there), by device events
        on ``cuda`` (reported by ``report_kernels`` once the iteration has synchronized)."""
        if not events.listening:
            self._dispatch(step, train, solver)
            return
        if self.device.kind == "cuda":
            begin, end = self.device.event(timing=True), self.device.event(timing=True)
            begin.record(self.device.compute_stream)
            self._dispatch(step, train, solver)
            end.record(self.device.compute_stream)
            self._timed.append((index, step, begin, end))
            return
        start = events.clock()
        self._dispatch(step, train, solver)
        events.emit("kernel", step.name, layer=step.layer, phase=step.kind, step=index,
                    start=start, end=events.clock(), stream="compute")

    def _dispatch(self, step: Step, train: bool, solver) -> None:
        if step.part is not None:
            self.run_part(step, train)
        elif step.kind == "recompute":
            self.recompute(step)
        elif step.kind == "forward":
            self.forward(step, train)
        elif step.kind == "backward":
            self.backward(step)
        else:
            self.update(step, solver)

    def begin_iteration_trace(self) -> float:
        self._timed = []
        return events.clock()

    def end_iteration_trace(self, started: float, train: bool) -> None:
        """After the device synchronized: cuda kernel times, and the iteration's own event."""
        if not events.listening:
            return
        if self._timed:
            origin = self._timed[0][2]
            for index, step, begin, end in self._timed:
                events.emit("kernel", step.name, layer=step.layer, phase=step.kind, step=index,
                            start=started + origin.elapsed_time(begin) / 1e3,
                            end=started + origin.elapsed_time(end) / 1e3, stream="compute")
            self._timed = []
        events.emit("iteration", "train" if train else "eval", index=self.iteration,
                    start=started, end=events.clock())

    def stream(self):
        return self.device.compute_stream if self.device.kind == "cuda" else None

    def _buffers(self, layer, specs, claim):
        return {spec.name: claim(f"{layer.name}.{spec.name}") for spec in specs}

    # -- a step's blobs, named once ---------------------------------------------------------------
    def _names(self, step: Step, kind: str, make, *key):
        """What ``make(step, layer, *key)`` lists of the blobs a step of ``kind`` touches, worked
        out at the step's first run and kept (with the step, its layer and ``key``, to know it
        again): a layer builds its parameter, saved and workspace lists anew at each
        ``params()``, ``saved()`` or ``workspace()``, too slow for every step of every iteration
        (docs/benchmarks.md, session 45)."""
        layer = self.net.layer[step.layer]
        found = self._named.get((id(step), kind))
        if found is None or found[0] is not step or found[1] is not layer or found[2] != key:
            found = self._named[(id(step), kind)] = (step, layer, key, make(step, layer, *key))
        return found[3]

    def _accesses(self) -> dict:
        """The planned accesses by the letters the names carry: read, write, update (a split
        step's sub-step puts chunk-aware ones in their place: ``run_part``)."""
        return {"r": self._read, "w": self._write, "u": self._update}

    @staticmethod
    def _forward_names(step: Step, layer) -> tuple:
        prefix = layer.name + "."
        return ([(b, "u" if b in layer.top else "r") for b in layer.bottom],
                [(t, "u" if t in layer.bottom else "w") for t in layer.top],
                [(p.name, layer.param_blob(p.name), "r" if p.learnable else "u")
                 for p in layer.params()],
                [(b.name, prefix + b.name) for b in layer.saved()],
                [(b.name, prefix + b.name) for b in layer.workspace()])

    def _backward_names(self, step: Step, layer) -> tuple:
        prefix, reads = layer.name + ".", layer.backward_reads
        targets = dict((grad, part) for part, grad in step.accumulate)
        bottom_grad = []
        for b in layer.bottom:
            grad = f"{b}.grad"
            if b not in self.net.grad_blobs:
                bottom_grad.append(None)
            elif b in layer.top or grad in step.adds:
                bottom_grad.append((grad, "u"))
            else:
                bottom_grad.append((targets.get(grad, grad), "w"))
        top_access = "u" if layer.backward_rewrites_top_grad else "r"
        return ([b if "bottom" in reads else None for b in layer.bottom],
                [t if "top" in reads else None for t in layer.top],
                [(f"{t}.grad", top_access) if f"{t}.grad" in self.blobs else None
                 for t in layer.top],
                bottom_grad,
                [(p.name, layer.param_blob(p.name)) for p in layer.params()],
                [(b.name, prefix + b.name) for b in layer.saved()],
                [(b.name, prefix + b.name) for b in layer.workspace()],
                [(p.name, layer.param_blob(p.name) + ".grad") for p in self.net.learnable(layer)],
                frozenset(i for i, b in enumerate(layer.bottom) if f"{b}.grad" in step.adds))

    def _update_names(self, step: Step, layer, states: tuple) -> list:
        names = [layer.param_blob(spec.name) for spec in self.net.learnable(layer)]
        return [(name, f"{name}.grad", [f"{name}.{s}" for s in states]) for name in names]

    def forward(self, step: Step, train: bool) -> None:
        self.net.layer[step.layer].forward(self.forward_io(step, train))

    def forward_io(self, step: Step, train: bool) -> StepIO:
        bottom, top, params, saved, work = self._names(step, "forward", self._forward_names)
        access = self._accesses()
        write = access["w"]
        return StepIO(bottom=[access[how](name) for name, how in bottom],
                      top=[access[how](name) for name, how in top],
                      params={key: access[how](name) for key, name, how in params},
                      saved={key: write(name) for key, name in saved},
                      work={key: write(name) for key, name in work},
                      train=train, rng=self.rng, stream=self.stream())

    def backward(self, step: Step) -> None:
        self.net.layer[step.layer].backward(self.backward_io(step))
        for part, grad in step.accumulate:
            elementwise.accumulate(self._update(grad), self._read(part), self.stream())

    def backward_io(self, step: Step) -> StepIO:
        bottom, top, top_grad, bottom_grad, params, saved, work, param_grad, adds = \
            self._names(step, "backward", self._backward_names)
        access = self._accesses()
        read, write = access["r"], access["w"]
        bottom_grad = [None if named is None else access[named[1]](named[0])
                       for named in bottom_grad]
        top_grad = [None if named is None else access[named[1]](named[0]) for named in top_grad]
        return StepIO(bottom=[None if name is None else read(name) for name in bottom],
                      top=[None if name is None else read(name) for name in top],
                      params={key: read(name) for key, name in params},
                      saved={key: read(name) for key, name in saved},
                      work={key: write(name) for key, name in work},
                      top_grad=top_grad, bottom_grad=bottom_grad,
                      param_grad={key: write(name) for key, name in param_grad},
                      train=True, rng=self.rng, stream=self.stream(), adds=adds)

    def recompute(self, step: Step) -> None:
        """A forward run again to rebuild its tops (``minilms.lms.recompute``): with what the
        layer's rule says a re-run touches, and nothing else (``layers.recompute``): bottoms
        and learnable parameters read, the saved buffers it reads or rewrites, its workspace;
        the running statistics it leaves alone are not handed over."""
        layer = self.net.layer[step.layer]
        rule = type(layer).recompute
        prefix = layer.name + "."
        saved = {}
        for spec in layer.saved():
            if spec.name in rule.saved_rewrites:
                saved[spec.name] = self._write(prefix + spec.name)
            elif spec.name in rule.saved_reads:
                saved[spec.name] = self._read(prefix + spec.name)
        io = StepIO(bottom=[self._update(b) if b in layer.top else self._read(b)
                            for b in layer.bottom],
                    top=[self._update(t) if t in layer.bottom else self._write(t)
                         for t in layer.top],
                    params={p.name: self._read(layer.param_blob(p.name)) if p.learnable else None
                            for p in layer.params()},
                    saved=saved, work=self._buffers(layer, layer.workspace(), self._write),
                    train=True, rng=self.rng, stream=self.stream())
        rerun_forward(layer, io)

    def run_part(self, step: Step, train: bool) -> None:
        """A sub-step of a split step (``minilms.lms.substeps``): the step's StepIO with each
        batch blob's chunk in its place (or empty rows, for what the sub-step does not touch),
        made into the pass's (``layers.split.part_io``), then the pass; after a chunk other than
        the first its sums are added in, and after the last pass's chunks, partial gradients."""
        part, layer = step.part, self.net.layer[step.layer]
        chunks = dict(part.names)
        read, write, update = self._read, self._write, self._update

        def through_chunks(access):
            def get(name):
                if name not in chunks:
                    return access(name)
                return self._empty_rows(name) if chunks[name] is None else access(chunks[name])
            return get
        self._read, self._write, self._update = map(through_chunks, (read, write, update))
        try:
            io = self.forward_io(step, train) if step.kind == "forward" else \
                self.backward_io(step)
            temps = {key: write(blob) for key, blob in part.temps}
            for spec in layer.split_workspace(part.phase):     # carried: written, then updated
                name = f"{layer.name}.split.{spec.name}"
                temps[spec.name] = (write if name in step.writes else update)(name)
            getattr(layer, part.method)(part_io(layer, part.phase, io, part.chunk, temps,
                                                first=not part.temps))
            if part.temps:
                add_sums(layer, part.phase, io, temps)
            for partial, grad in step.accumulate:
                elementwise.accumulate(self._update(grad), self._read(partial), self.stream())
        finally:
            del self._read, self._write, self._update

    def _empty_rows(self, name):
        """No samples of ``name``: what a sub-step gets for a batch blob it does not touch."""
        blob = self.blobs[name]
        return self.device._bytes(0, 0).view(blob.dtype).reshape((0,) + blob.shape[1:])

    def update(self, step: Step, solver) -> None:
        for name, grad, states in self._names(step, "update", self._update_names,
                                              tuple(solver.state_names)):
            solver.update(self._update(name), self._read(grad),
                          [self._update(state) for state in states], self.stream())


class ResidentExecutor(Executor):
    def __init__(self, net: Net, device, solver=None, seed: int = 0):
        super().__init__(device, solver, seed)
        self.net = net
        self.steps = net.schedule(tuple(solver.state_names) if solver else ())
        self.blobs = {name: Blob(device, name, info.shape, info.dtype, info.role)
                      for name, info in net.blobs.items()}
        need = sum(align_up(b.nbytes) for b in self.blobs.values())
        if need > device.pool.capacity:
            raise OutOfDeviceMemory(
                f"LMS off needs every blob resident: {format_bytes(need)} for {len(self.blobs)} "
                f"blobs, but the pool holds {format_bytes(device.pool.capacity)}: turn LMS on "
                f"(lms.enabled) or raise device.memory")
        for blob in self.blobs.values():
            blob.place()
        self.initialise(seed)

    # -- one iteration ---------------------------------------------------------------------------
    def issue(self, inputs: dict, train: bool = True) -> Pending:
        """Run the schedule once on ``inputs`` (host arrays by input name) and wait for it (the
        reference keeps it simple); the loss and accuracy blobs' values come from the
        ``Pending``. Without a solver, or with ``train=False``, only forward runs."""
        solver = self.solver if train else None
        if solver is not None:
            solver.begin_iteration(self.iteration)
            self.iteration += 1
        for name, value in inputs.items():
            self.blobs[name].mutable_host_data(overwrite=True)[...] = value
        for loss in self.net.loss_blobs:
            self.blobs[f"{loss}.grad"].mutable_host_data(overwrite=True)[...] = 1.0
        started = self.begin_iteration_trace()
        for index, step in enumerate(self.steps):
            if step.kind == "forward" or solver is not None:
                self.run_step(index, step, train, solver)
        self.device.synchronize()
        self.end_iteration_trace(started, train)
        return Pending(self.iteration, values={name: float(self.blobs[name].host_data()[0])
                                               for name in self.outputs()})

    def _read(self, name):
        return self.blobs[name].device_data()

    def _write(self, name):
        return self.blobs[name].mutable_device_data(overwrite=True)

    def _update(self, name):
        return self.blobs[name].mutable_device_data()
