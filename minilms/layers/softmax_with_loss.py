"""SoftmaxWithLoss: softmax cross-entropy, averaged over the batch.

Bottoms: ``logits`` ``[N, K]`` (or ``[N, K, 1, 1]``, a classifier's output before Flatten) and
``labels`` ``[N]`` int32 in ``[0, K)``. Top: ``(1,)``, the layer's loss::

    prob[n, k] = exp(z[n, k]) / sum_j exp(z[n, j])          (max-subtracted, no overflow)
    loss[n]    = -log prob[n, label[n]]                      (NaN for a label outside [0, K))
    top[0]     = loss_weight * sum_n loss[n] / N

Option ``loss_weight`` (default 1): the top is already weighted, so a net's objective is the plain
sum of its loss tops and backward is the exact gradient of the top. Backward, for the upstream
scale ``g = top_grad[0]`` (1.0 when the top is the net's loss)::

    dlogits[n, k] = loss_weight * g * (prob[n, k] - [k == label[n]]) / N

Forward saves ``prob`` ``[N, K]``, the per-sample ``loss`` ``[N]`` and a copy of the labels ``[N]``
(int32, 4 bytes a sample), so backward reads no forward blob: LMS need keep neither the logits nor
the label blob for it. The labels get no gradient (a ``bottom_grad[1]`` that is asked for is
zeroed).
``prob`` and ``loss`` are declared in the run's float dtype (``BufferSpec(dtype=None)``), the
logits'. The kernels are in ``minilms.kernels.softmax``.
"""
import numbers

import numpy as np

from ..kernels import families, on_cpu
from ..kernels.common import grid_1d, launch, view
from ..kernels.registry import cuda_kernel
from ..lazy_cuda import cuda
from .base import BufferSpec, Layer, ShapeError, register
from .recompute import Recompute
from .split import ACCUMULATE, ONCE, Pass, Phase, SplitRule, samples

# numba's: imported with the first kernel that runs (``kernels.families``)
elementwise, softmax = families("elementwise", "softmax")


@cuda_kernel("void(float32[::1], float32[::1])", "void(float64[::1], float64[::1])")
def scale_by_first_cuda(x, g):
    """``x *= g[0]``: the upstream gradient scale, read on the device (no host sync)."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = x[i] * g[0]


def copy_device(src, dst, stream=None) -> None:
    """``dst[...] = src`` for two arrays of one device, same size and dtype."""
    if on_cpu(src):
        np.copyto(dst.reshape(-1), src.reshape(-1), casting="no")
    else:
        dst.reshape(dst.size).copy_to_device(src.reshape(src.size), stream=stream or 0)


@register
class SoftmaxWithLoss(Layer):
    type = "SoftmaxWithLoss"
    bottoms = (2, 2)
    backward_reads = frozenset()
    is_loss = True
    # Split: probabilities and losses per sample, then their mean read whole (4 bytes a sample):
    # the unsplit step's arithmetic. Backward per sample, scaled by the whole batch's N.
    split = SplitRule(Phase(ACCUMULATE, (Pass("per_sample"), Pass("mean_loss", ONCE)),
                            whole=("saved.loss",)),
                      samples("backward"), batch_saved=frozenset({"prob", "loss", "label"}),
                      batch_tops=False)
    recompute = Recompute.never(
        "a loss: its top is the objective the host reads, and its forward writes the saved "
        "prob, loss and labels its backward reads: nothing is gained by rebuilding it")

    def __init__(self, name, bottom, top, loss_weight: float = 1.0):
        super().__init__(name, bottom, top)
        if isinstance(loss_weight, bool) or not isinstance(loss_weight, numbers.Real) \
                or not np.isfinite(loss_weight):
            raise ShapeError(self, "loss_weight", "a finite number", repr(loss_weight))
        self.loss_weight = float(loss_weight)

    def infer(self, bottom_shapes):
        self.expect_logits_and_labels(*bottom_shapes)
        return [(1,)]

    def saved(self):
        n, k = self.bottom_shapes[0][:2]
        return [BufferSpec("prob", (n, k)), BufferSpec("loss", (n,)),
                BufferSpec("label", (n,), np.dtype(np.int32))]

    def forward(self, io):
        self.per_sample(io)
        self.mean_loss(io)

    def per_sample(self, io):
        """``prob``, the per-sample ``loss`` and the label copy, for the samples ``io`` holds."""
        logits, labels = io.bottom
        if labels.dtype != np.int32:
            raise ShapeError(self, f"bottom 1 ({self.bottom[1]})", "int32 labels", labels.dtype)
        prob, loss = io.saved["prob"], io.saved["loss"]
        if prob.dtype != logits.dtype:
            raise ShapeError(self, "dtype of prob", f"the logits' {logits.dtype}", prob.dtype)
        n, k = prob.shape
        softmax.softmax_xent_forward(view(logits, n, k), labels, prob, loss, stream=io.stream)
        copy_device(labels, io.saved["label"], io.stream)

    def mean_loss(self, io):
        """``top = loss_weight * mean(loss)`` over the whole batch's per-sample losses."""
        top = io.top[0]
        softmax.batch_mean(io.saved["loss"], top, io.stream)
        if self.loss_weight != 1.0:
            elementwise.scale(top, self.loss_weight, top, io.stream)

    def backward(self, io):
        if len(io.bottom_grad) > 1 and io.bottom_grad[1] is not None:
            elementwise.fill(io.bottom_grad[1], 0.0, io.stream)   # labels are not differentiable
        dlogits = io.bottom_grad[0]
        if dlogits is None:
            return
        prob, labels, g = io.saved["prob"], io.saved["label"], io.top_grad[0]
        dz = view(dlogits, *prob.shape)
        batch = self.bottom_shapes[0][0]   # the whole batch's N, also for a chunk of it
        if on_cpu(prob):   # the upstream scale is at hand: fold it into one pass
            softmax.softmax_xent_backward(prob, labels, dz, self.loss_weight * float(g[0]),
                                          batch=batch)
        else:
            softmax.softmax_xent_backward(prob, labels, dz, self.loss_weight, io.stream, batch)
            flat = view(dlogits, dlogits.size)
            launch(scale_by_first_cuda, *grid_1d(flat.size), io.stream)(flat, view(g, 1))
