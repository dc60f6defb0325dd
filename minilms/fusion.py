"""Layer fusion: a ReLU done in the pass of the layer before it, one pass over memory fewer.

A memory-bound layer reads its input and writes its output; a ReLU after it reads that output
again and writes it again. Where the ReLU works in place on a top that no other layer reads
first, the layer before it can apply ``max(v, 0)`` as it writes ``v``, and in backward mask the
gradient as it reads it: oneDNN's ``fuse_norm_relu``, cuDNN's ``BN_ACTIVATION``, the residual
add + ReLU of every fused ResNet block. A layer that can take the ReLU offers ``with_relu()``:
the same layer, fused (``Eltwise``, ``BatchNorm``). Fused or not, a net computes the same
numbers bit for bit (``tests/test_fusion.py``); the fused ReLU's layer leaves the schedule, so
the trace and the plan show one step where there were two. The cost: a fused step holds what
both held (a fused add's backward its top, the top's gradient and both input gradients at
once), so the least pool of an unsplit net may grow; the split floor does not.

``Net(..., fuse=True)`` applies it after checking the listed layers as written; a config's
``model.fuse`` (default true) sets it.
"""
from .layers.base import Layer


def fusible_relu(layer: Layer) -> bool:
    """A ReLU that works in place (its top is its bottom), the only kind that can be fused: a ReLU
    with a top of its own leaves its input readable by later layers."""
    return layer.type == "ReLU" and layer.top == layer.bottom


def fuse_relu(layers: list[Layer]) -> tuple[list[Layer], dict]:
    """``(layers, fused)``: ``layers`` with every in-place ReLU whose blob was last touched by a
    layer offering ``with_relu()`` that made it (no layer between them reads or writes it) folded
    into that layer; ``fused`` maps each folded ReLU's name to the layer that took it."""
    out: list[Layer] = []
    fused: dict = {}
    last = {}                         # blob -> index in ``out`` of the last layer naming it
    for layer in layers:
        if fusible_relu(layer):
            blob = layer.bottom[0]
            before = out[last[blob]] if blob in last else None
            if before is not None and before.top == [blob] and blob not in before.bottom \
                    and hasattr(before, "with_relu") and not getattr(before, "relu", False):
                out[last[blob]] = before.with_relu()
                fused[layer.name] = before.name
                continue
        out.append(layer)
        for blob in layer.bottom + layer.top:
            last[blob] = len(out) - 1
    return out, fused
