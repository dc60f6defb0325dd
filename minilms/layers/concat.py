"""Concat: join bottoms ``[N, C_i, ...]`` along the channel axis into ``[N, sum C_i, ...]``
(inception blocks). All other dimensions must agree.

Forward copies each bottom into its channel slice; backward copies each slice of the gradient out.
Neither reads a forward blob. The copy kernel sees every array as ``[N, C, inner]``.
"""
import numpy as np
from numba import cuda, njit, prange

from ..kernels import cuda_kernel, on_cpu
from ..kernels.registry import grid_1d
from .base import Layer, ShapeError, register

_SIGS = [f"void({t}[:, :, ::1], {t}[:, :, ::1], int64, boolean)" for t in ("float32", "float64")]


@cuda_kernel(*_SIGS)
def channel_slice_copy_cuda(part, whole, offset, into_whole):
    n, c, inner = part.shape
    for i in range(cuda.grid(1), n * c * inner, cuda.gridsize(1)):
        s, rest = i // (c * inner), i % (c * inner)
        ch, k = rest // inner, rest % inner
        if into_whole:
            whole[s, offset + ch, k] = part[s, ch, k]
        else:
            part[s, ch, k] = whole[s, offset + ch, k]


@njit(parallel=True, cache=True)
def channel_slice_copy_cpu(part, whole, offset, into_whole):
    n, c, _ = part.shape
    for s in prange(n):
        for ch in range(c):
            if into_whole:
                whole[s, offset + ch, :] = part[s, ch, :]
            else:
                part[s, ch, :] = whole[s, offset + ch, :]


def channel_slice_copy(part, whole, offset: int, into_whole: bool, stream=None) -> None:
    """Copy ``part [N, C_p, ...]`` into (or out of) channels ``offset:offset+C_p`` of ``whole``."""
    n, c = part.shape[:2]
    part3 = part.reshape(n, c, -1)
    whole3 = whole.reshape(n, whole.shape[1], -1)
    if on_cpu(part):
        channel_slice_copy_cpu(part3, whole3, offset, into_whole)
    else:
        blocks, threads = grid_1d(part3.size)
        channel_slice_copy_cuda[blocks, threads, stream or 0](part3, whole3, offset, into_whole)


@register
class Concat(Layer):
    type = "Concat"
    bottoms = (1, 64)
    backward_reads = frozenset()

    def infer(self, bottom_shapes):
        first = bottom_shapes[0]
        self.expect_rank(0, first, (2, 3, 4, 5))
        for i, shape in enumerate(bottom_shapes[1:], 1):
            if len(shape) != len(first) or shape[0] != first[0] or shape[2:] != first[2:]:
                raise ShapeError(self, f"bottom {i} ({self.bottom[i]})",
                                 f"[{first[0]}, C, {', '.join(map(str, first[2:]))}]", shape)
        channels = sum(shape[1] for shape in bottom_shapes)
        return [(first[0], channels, *first[2:])]

    def forward(self, io):
        offset = 0
        for part in io.bottom:
            channel_slice_copy(part, io.top[0], offset, True, io.stream)
            offset += part.shape[1]

    def backward(self, io):
        offset = 0  # from the shapes, not io.bottom: backward reads no forward blob
        for part_grad, shape in zip(io.bottom_grad, self.bottom_shapes):
            if part_grad is not None:
                channel_slice_copy(part_grad, io.top_grad[0], offset, False, io.stream)
            offset += shape[1]
