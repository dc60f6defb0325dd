"""Layer fusion: a ReLU done in the pass of the layer before it, one pass over memory fewer.

A memory-bound layer reads its input and writes its output; a ReLU after it reads that output
again and writes it again. Where the ReLU works in place on a top that no other layer reads
first, the layer before it can apply ``max(v, 0)`` as it writes ``v``, and in backward mask the
gradient as it reads it: oneDNN's ``fuse_norm_relu``, cuDNN's ``BN_ACTIVATION``, the residual
add + ReLU of every fused ResNet block. A layer that can take the ReLU offers ``with_relu()``:
the same layer, fused (``Eltwise``, ``BatchNorm``). Fused or not, a net computes the same
numbers bit for bit (``tests/test_fusion.py``); the fused ReLU's layer leaves the schedule, so
the trace and the plan show one step where there were two.

Which: ``"auto"`` folds a ReLU only where the fused layer's backward reads no more forward blobs
than the layer's own (a batch norm makes the mask again from its input), so no step holds more
than before; ``"all"`` folds it into a residual add too, whose backward then holds its top for
the mask beside its gradient and both input gradients, four blobs where the add and the ReLU held
three and two: faster, and the least pool of a net whose largest step is such an add grows.
``Net(..., fuse=...)`` applies it after checking the listed layers as written; a config's
``model.fuse`` (default ``auto``) sets it, through ``fusions_for`` and ``first_that_plans``: with
LMS off every blob stays resident for the whole iteration, so a step that holds one blob more
costs no memory, and ``auto`` there folds the adds' ReLUs too (``all``); with LMS on it folds them
where the pool holds a plan of the net so fused, and only the batch norms' where it does not
(the least pool is the unfused adds' net's: a pool between the two plans the latter).

**Sibling 1x1 convolutions** (``stack_siblings``, with ``"all"``, on a net set up for the ``cpu``
device): two or more Convolution layers that read one blob with a 1x1 kernel, stride 1, no
padding, dilation or groups and the same bias setting run as one ``StackedConvolution``, in the
place of the first, where their outputs together have no more channels than their input. There
it measured faster (the input read once, the products taller); where the outputs are wider, the
copies of them out and of their gradients back cost more than it saves (GoogLeNet's ``inc3b``,
ResNet's ``res2a`` pair: ``scripts/bench_siblings.py``, docs/benchmarks.md, session 54). Unlike
the ReLU's, this fusion changes the rounding (float32; dx is summed in one product), never the
parameters: their blobs, initial values and checkpoints are the members'. It is in ``"all"``
alone: the stacked step holds every member's top at once and is never split along the batch, so
with LMS on a pool that holds only ``"auto"``'s plan takes that one.
"""
from dataclasses import replace

from .errors import PlanError
from .layers.base import Layer

CHOICES = ("auto", "all", "none")


def fusion_choice(fuse) -> str:
    """``fuse`` as one of ``CHOICES``: True is ``"all"``, False and None are ``"none"``."""
    if fuse is True:
        return "all"
    if fuse is False or fuse is None:
        return "none"
    if fuse not in CHOICES:
        raise ValueError(f"fuse: expected one of {', '.join(CHOICES)} (or a bool), found {fuse!r}")
    return fuse


def fusions_for(fuse, lms: bool) -> tuple[str, ...]:
    """The fusions a net from a config's ``model.fuse`` (``fusion_choice``'s forms) may get, in
    the order to try them (``first_that_plans``), given whether LMS plans its steps
    (``lms.enabled``): ``auto`` is ``all`` with LMS off, where no pool is to be fitted, and with
    LMS on ``all`` where the pool holds its plan, else ``auto`` (the figures: docs/benchmarks.md,
    "Why the code chose", sessions 41 and 44); any other choice is itself."""
    fuse = fusion_choice(fuse)
    if fuse != "auto":
        return (fuse,)
    return ("all", "auto") if lms else ("all",)


def first_that_plans(fusions, build, plan, policy):
    """``(net, plan(net, policy))`` for the first of ``fusions`` (``fusions_for``'s) whose net
    (``build(fuse)``) ``plan`` takes: a ``PlanError`` (no plan fits the pool) passes to the
    next; the last one's is raised. Each but the last is planned with ``policy``'s steps unsplit
    (``split: off``): a net fused further is worth taking where it fits as it is, not where its
    steps must be split along the batch to fit (the last is planned with ``policy`` itself)."""
    for i, fuse in enumerate(fusions):
        last = i == len(fusions) - 1
        net = build(fuse)
        try:
            return net, plan(net, policy if last else replace(policy, split="off"))
        except PlanError:
            if last:
                raise
    raise ValueError("first_that_plans: no fusion to try")


def fusible_relu(layer: Layer) -> bool:
    """A ReLU that works in place (its top is its bottom), the only kind that can be fused: a ReLU
    with a top of its own leaves its input readable by later layers."""
    return layer.type == "ReLU" and layer.top == layer.bottom


def fuse_relu(layers: list[Layer], which="all") -> tuple[list[Layer], dict]:
    """``(layers, fused)``: ``layers`` with every in-place ReLU whose blob was last touched by a
    layer offering ``with_relu()`` that made it (no layer between them reads or writes it) folded
    into that layer (``which``: ``"all"``, or ``"auto"``: only where the fused backward reads no
    more than the layer's own); ``fused`` maps each folded ReLU's name to the layer that took
    it."""
    which = fusion_choice(which)
    out: list[Layer] = []
    fused: dict = {}
    last = {}                         # blob -> index in ``out`` of the last layer naming it
    for layer in layers:
        if which != "none" and fusible_relu(layer):
            blob = layer.bottom[0]
            before = out[last[blob]] if blob in last else None
            if before is not None and before.top == [blob] and hasattr(before, "with_relu") \
                    and not getattr(before, "relu", False):
                taken = before.with_relu()
                if (blob not in before.bottom or "bottom" not in taken.backward_reads) and \
                        (which == "all" or taken.backward_reads <= before.backward_reads):
                    out[last[blob]] = taken
                    fused[layer.name] = before.name
                    continue
        out.append(layer)
        for blob in layer.bottom + layer.top:
            last[blob] = len(out) - 1
    return out, fused


def sibling_groups(layers: list[Layer]) -> list[list[Layer]]:
    """Lists of two or more Convolution layers that read the same blob with a 1x1 kernel, stride
    1, no padding, dilation or groups, the same bias setting and workspace bound, and the engine
    ``auto``, in the layers' order, with nothing between the first and the last that writes that
    blob (each then reads the same value)."""
    groups: dict = {}
    for layer in layers:
        if layer.type == "Convolution" and layer.kernel_size == (1, 1) and \
                layer.stride == (1, 1) and layer.pad == (0, 0) and layer.dilation == (1, 1) \
                and layer.groups == 1 and layer.engine == "auto" and \
                layer.top[0] != layer.bottom[0]:
            key = (layer.bottom[0], layer.bias, layer.max_workspace)
            groups.setdefault(key, []).append(layer)
    position = {layer.name: i for i, layer in enumerate(layers)}
    found = []
    for (blob, _, _), group in groups.items():
        first, last = position[group[0].name], position[group[-1].name]
        if len(group) > 1 and not any(blob in layer.top for layer in layers[first:last + 1]):
            found.append(group)
    return found


def stack_siblings(layers: list[Layer], blobs: dict, fuse, device_kind) -> tuple[list, dict]:
    """``(layers, stacked)``: with ``fuse`` ``"all"`` (``fusion_choice``'s forms) on a net set up
    for the ``cpu`` device, ``layers`` (set up; ``blobs`` maps their blobs to ``BlobInfo``) with
    each of ``sibling_groups`` whose outputs together have no more channels than its input (and
    one sample of whose stacked output fits the members' ``max_workspace``) run as one
    ``StackedConvolution``, set up, in the place of its first member; ``stacked`` maps each
    member's name to the stacked layer's. Otherwise ``layers`` as they are."""
    if fusion_choice(fuse) != "all" or device_kind != "cpu":
        return layers, {}
    from .layers.stacked_convolution import StackedConvolution
    replaced, stacked = {}, {}
    for group in sibling_groups(layers):
        shape, outputs = blobs[group[0].bottom[0]].shape, sum(m.num_output for m in group)
        if outputs > shape[1] or 4 * outputs * shape[2] * shape[3] > group[0].max_workspace:
            continue
        layer = StackedConvolution(group)
        layer.setup([blobs[group[0].bottom[0]].shape], "cpu")
        replaced[group[0].name] = layer
        stacked.update({member.name: layer.name for member in group})
    return ([replaced.get(layer.name, layer) for layer in layers
             if layer.name in replaced or layer.name not in stacked], stacked)
