"""Flatten: ``[N, d1, d2, ...] -> [N, d1*d2*...]``, the same elements in the same order.

Backward copies the gradient back into the bottom's shape; neither direction reads a forward blob.
"""
import numpy as np

from ..kernels import on_cpu
from .base import Layer, register
from .recompute import DETERMINISTIC, Recompute
from .split import SAMPLE_WISE


def copy_flat(src, dst, stream=None) -> None:
    """``dst[...] = src`` for two contiguous arrays of the same size, any shapes, on either
    device."""
    src, dst = src.reshape(-1), dst.reshape(-1)
    if on_cpu(src):
        np.copyto(dst, src)
    else:
        dst.copy_to_device(src, stream=stream or 0)


@register
class Flatten(Layer):
    type = "Flatten"
    backward_reads = frozenset()
    split = SAMPLE_WISE
    recompute = Recompute.rerun(DETERMINISTIC)

    def infer(self, bottom_shapes):
        shape = bottom_shapes[0]
        self.expect_rank(0, shape, (2, 3, 4, 5))
        return [(shape[0], int(np.prod(shape[1:])))]

    def forward(self, io):
        copy_flat(io.bottom[0], io.top[0], io.stream)

    def backward(self, io):
        if io.bottom_grad[0] is not None:
            copy_flat(io.top_grad[0], io.bottom_grad[0], io.stream)
