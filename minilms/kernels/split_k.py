"""Split-K: a summed product's partial sums, and their ordered sum.

A summed product (a weight gradient over a chunk of samples, ``gemm.gemm_batched`` with ``c`` of
one) of a small ``[M, N]`` has few tiles: 5 blocks of 128x128 for a 64x576 gradient, 2 for the
64x147 of a 7x7 convolution of 3 channels, on a GPU of 132 SMs. Split over the samples, and over
each sample's K where the samples are too few (a chunk of 9 large images), each block sums a
share into a partial of its own (``split_k`` says how many), and ``sum_splits`` adds the partials
in order: deterministic, no atomics. docs/kernels.md has the measured effect.
"""
import numpy as np

from ..lazy_cuda import cuda
from . import gemm
from .common import grid_1d, launch, view
from .registry import cuda_kernel, on_cpu

__all__ = ["split_k", "sum_splits", "SPLIT_K_BLOCKS", "MIN_K_SPAN"]

SPLIT_K_BLOCKS = 264     # two blocks per SM of an H100 (132 SMs): what a summed product should fill
MIN_K_SPAN = 512         # a part of K at least 64 slices deep: its first load and its store small


def split_k(m: int, n: int, samples: int, depth: int, most: int | None = None) \
        -> tuple[int, int]:
    """``(groups, k_parts)``: partial sums enough (``groups * k_parts``, the batch of ``c`` in
    ``gemm_batched``) to give a product of ``[m, n]`` summed over ``samples`` products of depth
    ``depth`` (each sample's K) the blocks to fill a GPU, at most ``most`` of them. ``groups``
    divides ``samples`` (a block sums ``samples / groups`` of them); where that is too few, each
    sample's K is split into ``k_parts`` spans of at least ``MIN_K_SPAN``. ``(1, 1)`` where the
    tiles alone fill the GPU."""
    tiles = -(-m // gemm.BM) * -(-n // gemm.BN)     # the module's: tests shrink the tile
    want = min(-(-SPLIT_K_BLOCKS // tiles), most or SPLIT_K_BLOCKS)
    if tiles >= SPLIT_K_BLOCKS // 2 or want < 2:
        return 1, 1
    groups = max(d for d in range(1, min(samples, want) + 1) if samples % d == 0)
    return groups, max(1, min(want // groups, depth // MIN_K_SPAN))


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
