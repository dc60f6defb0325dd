"""The net: a DAG of layers built from a config, its blobs with shapes, and its schedule.

Layers name their ``bottom`` and ``top`` blobs (Caffe style), so residual and inception blocks are
plain configs. As in Caffe, the config order is the execution order: each bottom is an input or a
top of an earlier layer. A layer may work in place (``top`` equal to its ``bottom``): readers listed
before it see the old value, readers after it the new one. It may do so only if its backward does
not read its bottom, and no earlier reader of that blob needs the old value for its backward.

The schedule is what one training iteration does, in order, identically every iteration:

    forward L    for each layer, in config order
    backward L   in reverse, for layers that feed a loss and lead to something learnable
    update L     right after backward L, for a layer with learnable parameters

Updating each layer as soon as its backward is done gives the same weights as updating all at the
end (no later backward step reads them), and lets LMS drop every gradient at once.
``schedule(delay_updates=True)`` puts every update after the last backward instead (in the same
order): data-parallel training (``minilms.training.distributed``) averages layer L's gradients
across processes while the backward steps of earlier layers compute, and updates once they have
arrived.

Each ``Step`` lists the blobs it reads, writes (every element, old contents not needed), updates
(reads then writes) and uses as workspace. Those lists are the whole truth the planner works from.
"""
import inspect
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .errors import ConfigError, did_you_mean
from .fusion import fuse_relu, stack_siblings
from .layers import LAYERS, Layer, ShapeError

RESERVED_KEYS = ("name", "type", "bottom", "top")


@dataclass(frozen=True)
class BlobInfo:
    name: str
    shape: tuple
    dtype: np.dtype
    role: str

    @cached_property
    def nbytes(self) -> int:
        """Computed once: the planner asks for it millions of times per plan search."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Step:
    index: int
    kind: str                   # "forward", "backward", "update"
    layer: str
    reads: tuple = ()
    writes: tuple = ()
    updates: tuple = ()
    workspace: tuple = ()
    # (partial gradient, gradient it is added into) pairs: a blob that feeds several layers
    accumulate: tuple = field(default=())
    # gradients the layer adds into itself (``Layer.adds_bottom_grad``): no partial for them
    adds: tuple = field(default=())
    # a sub-step of a step split along the batch (``minilms.lms.substeps.Part``); None: whole
    part: object = field(default=None, compare=False)

    @property
    def name(self) -> str:
        if self.part is not None:
            return f"{self.kind} {self.layer} {self.part.label}"
        return f"{self.kind} {self.layer}"

    @property
    def blobs(self) -> tuple:
        return self.reads + self.writes + self.updates + self.workspace


def as_list(value) -> list:
    return [value] if isinstance(value, str) else list(value or [])


def blob_names(value, key: str) -> list[str]:
    """A layer's ``bottom`` or ``top``: one blob name or a list of them. Anything else is refused
    here: a number is not iterable and a mapping iterates as its keys, so either would otherwise
    surface as a wrong complaint further on."""
    if value is None or isinstance(value, str):
        return as_list(value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise ConfigError(key, "a blob name or a list of blob names (strings)", value)


def layer_options(kind: str) -> list[str]:
    """The options a layer type takes: its constructor's keyword arguments."""
    return [p for p in inspect.signature(LAYERS[kind].__init__).parameters
            if p not in ("self", "name", "bottom", "top")]


def build_layer(spec: dict, where: str) -> Layer:
    """The layer ``spec`` describes; ``where`` names it in errors (``model.layers[3] (conv2)``).
    A bad option value is the layer's ShapeError; a missing or unknown option, or a value the
    layer chokes on without saying which (a TypeError, a ValueError), is a ConfigError here."""
    if not isinstance(spec, dict) or "type" not in spec or "name" not in spec:
        raise ConfigError(where, "a layer with a name and a type", spec)
    kind, name = spec["type"], spec["name"]
    if kind not in LAYERS:
        raise ConfigError(f"{where}.type", f"a layer type ({', '.join(sorted(LAYERS))})", kind,
                          hint=did_you_mean(kind, LAYERS))
    bottom = blob_names(spec.get("bottom"), f"{where}.bottom")
    top = blob_names(spec.get("top"), f"{where}.top")
    options = {k: v for k, v in spec.items() if k not in RESERVED_KEYS}
    try:
        return LAYERS[kind](name, bottom, top, **options)
    except (TypeError, ValueError) as error:
        unknown = [k for k in options if f"'{k}'" in str(error)]
        if isinstance(error, TypeError) and unknown:
            accepted = layer_options(kind)
            raise ConfigError(f"{where}.{unknown[0]}", f"an option of {kind} "
                              f"({', '.join(accepted)})", options[unknown[0]],
                              hint=did_you_mean(unknown[0], accepted)) from None
        raise ConfigError(where, f"the options {kind} needs ({error})", options) from None


class Net:
    """``Net(layer_specs, inputs)``: ``inputs`` maps each input blob to ``(shape, dtype)``."""

    def __init__(self, layer_specs: list[dict], inputs: dict, where: str = "model.layers",
                 listed: bool = True, device_kind: str | None = None, fuse="none"):
        """``where`` names the layers in errors: the config key of their list (``model.layers``),
        or, with ``listed=False``, what made them when the config does not list them (a zoo
        model's: ``model.zoo (lenet)``). ``device_kind``: the device the net will run on
        (``Layer.setup``), or None for a net that may run on either (workspace for both).
        ``fuse``: in-place ReLUs folded into the layer before them (``minilms.fusion``: ``"auto"``,
        ``"all"`` or True, ``"none"`` or False), after the layers are checked as written;
        ``fused`` maps each folded ReLU to its layer. With ``"all"`` on the ``cpu`` device,
        sibling 1x1 convolutions run as one too (``fusion.stack_siblings``), after the layers
        are set up; ``stacked`` maps each of them to its ``StackedConvolution``."""
        self.device_kind, self.fuse = device_kind, fuse
        self.specs, self.where, self.listed = layer_specs, where, listed
        self.inputs = {name: (tuple(shape), np.dtype(dtype))
                       for name, (shape, dtype) in inputs.items()}
        built = []
        for i, spec in enumerate(layer_specs):
            named = isinstance(spec, dict) and "name" in spec
            try:
                built.append(build_layer(spec, self._named(i, spec["name"]) if named
                                         else f"{where}[{i}]"))
            except ShapeError as error:
                raise self._config_error(error, i, spec["name"], spec["type"]) from None
        names = [layer.name for layer in built]
        for i, name in enumerate(names):
            if names.index(name) != i:
                raise ConfigError(f"{where}[{i}].name", "a layer name used once", name)
        self._position = {name: i for i, name in enumerate(names)}
        self.layers = self._ordered(built)
        self.layers, self.fused = fuse_relu(self.layers, fuse)
        self.layer = {layer.name: layer for layer in self.layers}
        self.blobs: dict[str, BlobInfo] = {
            name: BlobInfo(name, shape, dtype, "input")
            for name, (shape, dtype) in self.inputs.items()}
        # the chunks of blobs that split steps use (``minilms.lms.substeps``): name -> (parent,
        # first sample, end); declared as a schedule with splits is made
        self.chunks: dict[str, tuple] = {}
        for i, layer in enumerate(self.layers):
            shapes = [self.blobs[b].shape for b in layer.bottom]
            dtype = np.dtype(np.float32)
            try:
                top_shapes = layer.setup(shapes, device_kind)
            except ShapeError as error:
                raise self._config_error(error, i, layer.name, layer.type) from None
            for top, shape in zip(layer.top, top_shapes):
                if top not in layer.bottom:
                    self.blobs[top] = BlobInfo(top, tuple(shape), dtype, "activation")
                elif tuple(shape) != self.blobs[top].shape:
                    raise ConfigError(f"{self._named(i, layer.name)}.top", f"a new blob name: "
                                      f"{layer.type} changes the shape {self.blobs[top].shape} "
                                      f"-> {tuple(shape)}, so it cannot work in place", top)
        # the parameters in the order the layers draw their initial values: that of the layers
        # before any of them is stacked (``stack_siblings``), whose draws they keep
        self.initial_params = [(layer.param_blob(p.name), p) for layer in self.layers
                               for p in layer.params()]
        self.layers, self.stacked = stack_siblings(self.layers, self.blobs, fuse, device_kind)
        self.layer = {layer.name: layer for layer in self.layers}
        self._check_in_place()
        self.backward_layers = self._backward_layers()
        self.loss_blobs = [ly.top[0] for ly in self.layers if ly.is_loss]

    def _named(self, index: int, name) -> str:
        """Layer ``index`` as errors name it: by its place in the config's list and its name
        (``model.layers[3] (conv2)``: the index finds the line, the name the layer), or, for
        layers the config does not list, by name (``model.zoo (lenet): layer conv2``)."""
        index = getattr(self, "_position", {}).get(name, index)   # the list's, fused or not
        return f"{self.where}[{index}] ({name})" if self.listed else f"{self.where}: layer {name}"

    def _config_error(self, error: ShapeError, index: int, name, kind: str) -> ConfigError:
        """A layer's ShapeError as a ConfigError keyed where the config says what went wrong: the
        option (``model.layers[3] (conv2).stride``), the bottom or top list (a wrong count), or
        the layer itself for a shape it cannot take (``model.layers[3] (conv2): bottom 0 (pool1):
        expected ...``)."""
        what, here = error.what, self._named(index, name)
        if what in layer_options(kind):
            key = f"{here}.{what}"
        elif what in ("bottoms", "tops"):
            key = f"{here}.{what[:-1]}"
        else:
            key = f"{here}: {what}"
        located = ConfigError(key, error.expected, error.found)
        located.args = (f"{key}: expected {error.expected}, found {error.found}",)
        return located

    def with_inputs(self, inputs: dict) -> "Net":
        """The same layers for other input shapes (a smaller last batch): a net of its own, since
        layers size their buffers and workspace at set-up."""
        return Net(self.specs, inputs, self.where, self.listed, self.device_kind, self.fuse)

    # -- structure -------------------------------------------------------------------------------
    def _ordered(self, layers: list[Layer]) -> list[Layer]:
        """Check the config order is an execution order (Caffe's rule: each bottom is an input or
        made by an earlier layer) and that no blob is made twice, except in place."""
        made_by: dict[str, Layer] = {}
        position = {layer.name: i for i, layer in enumerate(layers)}
        for i, layer in enumerate(layers):
            here = self._named(i, layer.name)
            for bottom in layer.bottom:
                if bottom in self.inputs or bottom in made_by:
                    continue
                later = next((ly for ly in layers[i + 1:] if bottom in ly.top), None)
                if later is None:
                    known = set(self.inputs) | {t for ly in layers for t in ly.top}
                    raise ConfigError(f"{here}.bottom", "a blob made by a layer or an input",
                                      bottom, hint=did_you_mean(bottom, known))
                cycle = self._path(layer, later, layers)
                if cycle:
                    raise ConfigError(f"{here}.bottom", "a blob from an earlier layer, not a "
                                      f"cycle ({' -> '.join(cycle + [layer.name])})", bottom)
                raise ConfigError(f"{here}.bottom", f"a blob from an earlier layer: list "
                                  f"{later.name} (at {position[later.name]}) before {layer.name}",
                                  bottom)
            for top in layer.top:
                if top in self.inputs:
                    raise ConfigError(f"{here}.top", "a name that is not an input", top)
                if top in made_by and top not in layer.bottom:
                    raise ConfigError(f"{here}.top", f"a blob no other layer makes (also made "
                                      f"by {made_by[top].name})", top)
                made_by.setdefault(top, layer)
        return list(layers)

    @staticmethod
    def _path(start: Layer, goal: Layer, layers: list[Layer]) -> list[str]:
        """Layer names on a data path from ``start`` to ``goal`` (top feeds bottom), or []."""
        came_from = {start.name: None}
        frontier = [start]
        while frontier:
            layer = frontier.pop(0)
            if layer is goal:
                path = [goal.name]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return path[::-1]
            for after in layers:
                if after.name not in came_from and set(layer.top) & set(after.bottom):
                    came_from[after.name] = layer.name
                    frontier.append(after)
        return []

    def _check_in_place(self) -> None:
        for index, layer in enumerate(self.layers):
            here = f"{self._named(index, layer.name)}.top"
            for blob in set(layer.top) & set(layer.bottom):
                if "bottom" in layer.backward_reads:
                    raise ConfigError(here, f"a new blob name: {layer.type} reads its bottom in "
                                      "backward, so it cannot work in place", blob)
                for reader in self.layers[:index]:
                    if blob in reader.bottom and "bottom" in reader.backward_reads:
                        raise ConfigError(here, f"a new blob name: {reader.name} needs {blob} "
                                          "unchanged for its backward", blob)

    def _backward_layers(self) -> set:
        """Layers whose backward runs: they lead to a learnable parameter (forwards) and feed a
        loss (backwards), Caffe's need_backward and contributes-to-loss."""
        needs_grad, wants = set(), set()
        for layer in self.layers:
            learnable = any(p.learnable for p in layer.params())
            if layer.has_backward and (learnable or any(b in needs_grad for b in layer.bottom)):
                wants.add(layer.name)
                needs_grad.update(layer.top)
        feeds_loss: set = set()
        for layer in reversed(self.layers):
            if layer.is_loss or any(t in feeds_loss for t in layer.top):
                if layer.name in wants:
                    feeds_loss.update(layer.bottom)
            else:
                wants.discard(layer.name)
        made = {t for ly in self.layers if ly.name in wants for t in ly.top}   # one pass: the
        self.grad_blobs = {b for ly in self.layers if ly.name in wants for b in ly.bottom
                           if b in made}       # planner's deepest nets have thousands of layers
        return wants

    # -- blobs and the schedule ------------------------------------------------------------------
    def schedule(self, optimizer_state: tuple = (), delay_updates: bool = False) -> list[Step]:
        """The steps of one training iteration. ``optimizer_state`` names the solver's buffers
        per parameter (SGD with momentum: ``("momentum",)``; Adam: ``("exp_avg", "exp_avg_sq")``);
        they become blobs ``<layer>.<param>.<state>``. ``delay_updates``: every update after the
        last backward, in backward order (the same weights: no backward reads a later layer's
        parameters)."""
        steps: list[Step] = []
        for layer in self.layers:
            steps.append(self._forward_step(len(steps), layer))
        written: set = set()
        delayed = []
        for layer in reversed(self.layers):
            if layer.name in self.backward_layers:
                steps.append(self._backward_step(len(steps), layer, written))
                if self.learnable(layer):
                    if delay_updates:
                        delayed.append(layer)
                    else:
                        steps.append(self._update_step(len(steps), layer, optimizer_state))
        for layer in delayed:
            steps.append(self._update_step(len(steps), layer, optimizer_state))
        return steps

    def learnable(self, layer: Layer) -> list:
        return [p for p in layer.params() if p.learnable]

    def _declare(self, name: str, shape, dtype, role: str) -> str:
        self.blobs.setdefault(name, BlobInfo(name, tuple(shape), np.dtype(dtype), role))
        return name

    def _forward_step(self, index: int, layer: Layer) -> Step:
        prefix = layer.name + "."
        params = [self._declare(layer.param_blob(p.name), p.shape, np.float32, "param")
                  for p in layer.params()]
        learned = {layer.param_blob(p.name) for p in self.learnable(layer)}
        in_place = [t for t in layer.top if t in layer.bottom]
        return Step(
            index, "forward", layer.name,
            reads=tuple(b for b in layer.bottom if b not in in_place)
            + tuple(p for p in params if p in learned),
            writes=tuple(t for t in layer.top if t not in in_place)
            + tuple(self._declare(prefix + b.name, b.shape, b.dtype_in(np.float32), "activation")
                    for b in layer.saved()),
            updates=tuple(in_place) + tuple(p for p in params if p not in learned),
            workspace=tuple(self._declare(prefix + b.name, b.shape, b.dtype_in(np.float32),
                                          "workspace")
                            for b in layer.workspace()))

    def _backward_step(self, index: int, layer: Layer, written: set) -> Step:
        prefix = layer.name + "."
        top_grads = []
        for top in layer.top:
            if top in self.grad_blobs or top in self.loss_blobs:
                top_grads.append(self._declare(top + ".grad", self.blobs[top].shape, np.float32,
                                               "activation_grad"))
        reads = [g for g in top_grads if g[:-5] not in layer.bottom]
        masked = reads if layer.backward_rewrites_top_grad else []
        reads = [g for g in reads if g not in masked]
        reads += [b for b in layer.bottom if "bottom" in layer.backward_reads]
        reads += [t for t in layer.top if "top" in layer.backward_reads and t not in reads]
        reads += [layer.param_blob(p.name) for p in layer.params()]
        reads += [prefix + b.name for b in layer.saved()]
        writes, updates, accumulate, adds = [], list(masked), [], []
        for bottom in layer.bottom:
            if bottom not in self.grad_blobs:
                continue
            grad = self._declare(bottom + ".grad", self.blobs[bottom].shape, np.float32,
                                 "activation_grad")
            if bottom in layer.top:  # in place: dx overwrites dy in the same blob
                updates.append(grad)
            elif grad in written and layer.adds_bottom_grad:   # added in by the layer itself
                updates.append(grad)
                adds.append(grad)
            elif grad in written:  # another reader of this blob already wrote its gradient
                part = self._declare(f"{grad}@{layer.name}", self.blobs[bottom].shape, np.float32,
                                     "activation_grad")
                writes.append(part)
                updates.append(grad)
                accumulate.append((part, grad))
            else:
                writes.append(grad)
            written.add(grad)
        writes += [self._declare(layer.param_blob(p.name) + ".grad", p.shape, np.float32,
                                 "param_grad")
                   for p in self.learnable(layer)]
        return Step(index, "backward", layer.name, reads=tuple(dict.fromkeys(reads)),
                    writes=tuple(writes), updates=tuple(updates),
                    workspace=tuple(prefix + b.name for b in layer.workspace()),
                    accumulate=tuple(accumulate), adds=tuple(adds))

    def _update_step(self, index: int, layer: Layer, optimizer_state: tuple) -> Step:
        params = [(layer.param_blob(p.name), p) for p in self.learnable(layer)]
        states = tuple(self._declare(f"{name}.{state}", p.shape, np.float32, "optimizer_state")
                       for name, p in params for state in optimizer_state)
        return Step(index, "update", layer.name,
                    reads=tuple(name + ".grad" for name, _ in params),
                    updates=tuple(name for name, _ in params) + states)
