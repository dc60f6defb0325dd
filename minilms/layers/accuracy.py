"""Accuracy: the fraction of samples whose label is among the ``top_k`` highest logits.

Bottoms: ``logits`` ``[N, K]`` (or ``[N, K, 1, 1]``) and ``labels`` ``[N]`` int32. Top: ``(1,)``,
float (the net's dtype)::

    top[0] = #{n : #{k : z[n, k] > z[n, label[n]]} < top_k} / N

Ties count in the label's favour (Caffe's rule); a label outside ``[0, K)`` is a miss. Option
``top_k`` (default 1, at most K). The kernel counts hits into a one-element int32 workspace, which a
tiny kernel turns into the float rate on the device. No backward (``has_backward`` False): it is a
metric, and it keeps nothing. The counting kernel is ``minilms.kernels.softmax.accuracy``.
"""
import numbers

import numpy as np

from ..kernels import families, on_cpu
from ..kernels.common import launch, view
from ..kernels.registry import cuda_kernel
from ..lazy_cuda import cuda
from .base import BufferSpec, Layer, ShapeError, register
from .recompute import Recompute
from .split import ACCUMULATE, ONCE, Pass, Phase, SplitRule

# numba's: imported with the first kernel that runs (``kernels.families``)
(softmax,) = families("softmax")


@cuda_kernel("void(int32[::1], int64, float32[::1])", "void(int32[::1], int64, float64[::1])",
             block=32)
def rate_cuda(count, n, out):
    """``out[0] = count[0] / n``, rounded once in ``out``'s dtype."""
    if cuda.grid(1) == 0:
        out[0] = out.dtype.type(count[0]) / out.dtype.type(n)


@register
class Accuracy(Layer):
    type = "Accuracy"
    bottoms = (2, 2)
    backward_reads = frozenset()
    has_backward = False
    # Split: hits counted per chunk and added up (integers: exact), then the rate once.
    split = SplitRule(Phase(ACCUMULATE, (Pass("count"), Pass("rate", ONCE)),
                            sums=("work.count",)), batch_tops=False)
    recompute = Recompute.never("a metric with no backward: only the host reads its top")

    def __init__(self, name, bottom, top, top_k: int = 1):
        super().__init__(name, bottom, top)
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
            raise ShapeError(self, "top_k", "an int >= 1", repr(top_k))
        self.top_k = int(top_k)

    def infer(self, bottom_shapes):
        logits, labels = bottom_shapes
        self.expect_logits_and_labels(logits, labels)
        if self.top_k > logits[1]:
            raise ShapeError(self, "top_k", f"at most the {logits[1]} classes of bottom 0",
                             self.top_k)
        return [(1,)]

    def workspace(self):
        return [BufferSpec("count", (1,), np.dtype(np.int32))]

    def forward(self, io):
        self.count(io)
        self.rate(io)

    def count(self, io):
        """The hits among the samples ``io`` holds, into the workspace ``count``."""
        logits, labels = io.bottom
        if labels.dtype != np.int32:
            raise ShapeError(self, f"bottom 1 ({self.bottom[1]})", "int32 labels", labels.dtype)
        n, k = labels.shape[0], self.bottom_shapes[0][1]
        softmax.accuracy(view(logits, n, k), labels, io.work["count"], self.top_k, io.stream)

    def rate(self, io):
        """``top = count / N``, N the whole batch's."""
        n = self.bottom_shapes[0][0]
        count, top = io.work["count"], io.top[0]
        if on_cpu(top):
            top[0] = top.dtype.type(count[0]) / top.dtype.type(n)
        else:
            launch(rate_cuda, 1, 32, io.stream)(view(count, 1), n, view(top, 1))

    def backward(self, io):
        raise NotImplementedError(f"layer {self.name} (Accuracy) has no backward")
