"""Split-K: a summed product's partial sums, and their ordered sum.

A summed product (a weight gradient over a chunk of samples, ``gemm.gemm_batched`` with ``c`` of
one) of a small ``[M, N]`` has few tiles: 5 blocks of 128x128 for a 64x576 gradient, 2 for the
64x147 of a 7x7 convolution of 3 channels, on a GPU of 132 SMs. Split over the samples, and over
each sample's K where the samples are too few (a chunk of 9 large images), each block sums a
share into a partial of its own (``split_k`` says how many), and ``sum_splits`` adds the partials
in order: deterministic, no atomics. docs/kernels.md has the measured effect. The rule is
``shapes.split_k``, read where a layer is set up (planning compiles nothing).
"""
import numpy as np

from ..lazy_cuda import cuda
from .common import grid_1d, launch, view
from .registry import cuda_kernel, on_cpu
from .shapes import MIN_K_SPAN, SPLIT_K_BLOCKS, split_k

__all__ = ["split_k", "sum_splits", "SPLIT_K_BLOCKS", "MIN_K_SPAN"]

@cuda_kernel("void(float32[::1], float32[::1], uint32, float32)")
def sum_splits_cuda(parts, out, splits, beta):
    n = out.size
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        acc = parts[i]
        for z in range(1, splits):
            acc += parts[z * n + i]
        if beta != 0:
            acc += beta * out[i]
        out[i] = acc


def _sum_splits_cpu(parts, out, beta):
    acc = parts[0].copy()
    for z in range(1, parts.shape[0]):      # in order, as the kernel sums
        acc += parts[z]
    if beta != 0:
        acc += beta * out
    out[...] = acc


def sum_splits(parts, out, beta=0.0, stream=None):
    """``out = sum_z parts[z] (+ beta * out)``, ``z`` in order (``beta == 0``: ``out`` not read):
    the partial sums of a split-K ``gemm_batched``, ``parts`` ``[splits, ...]`` of ``out``'s
    size each."""
    splits = parts.shape[0]
    if parts.size != splits * out.size:
        raise ValueError(f"sum_splits: parts {tuple(parts.shape)} are not {splits} of out "
                         f"{tuple(out.shape)}")
    o = view(out, out.size)
    if on_cpu(out):
        _sum_splits_cpu(view(parts, splits, out.size), o, beta)
    elif o.size:
        launch(sum_splits_cuda, *grid_1d(o.size), stream)(
            view(parts, parts.size), o, np.uint32(splits), np.float32(beta))
