"""A bias per channel over a chunk of samples: ``y[n, c, :] += bias[c]`` (``add_channel_bias``) and
its gradient ``out[c] = beta * out[c] + sum_{n, p} dy[n, c, p]`` (``channel_sums``).

A convolution run over a chunk of samples at once (``minilms.layers.convolution`` on CUDA) adds its
bias and reduces its bias gradient with these: one launch per chunk each, where Caffe's bias
multiplier (a GEMM against a vector of ones) costs one per sample. Arrays are ``[N, C, P]`` views
of NCHW blobs (``batchnorm.nchw``).

CUDA: the add is one thread per element, the grid over the ``(n, c)`` planes
(``common.grid_planes``: no index divided per element); the sum is one block per channel (a
grid-stride over channels when there are more than 65535), each thread summing a strided share
of the channel's ``N * P`` values and the block adding the shares by a fixed tree
(``block_sum``): deterministic, run to run. CPU: Numba, one channel per task, in the same
``(n, p)`` order.
"""
from numba import njit, prange

from ..lazy_cuda import cuda
from .batchnorm import nchw, signatures
from .common import block_sum, grid_planes, launch, view
from .registry import cuda_kernel, on_cpu

__all__ = ["add_channel_bias", "channel_sums", "THREADS"]

THREADS = 256   # one block per channel


@cuda_kernel(*signatures("void(X, V)"))
def add_channel_bias_cuda(y, bias):
    n_, c_, p_ = y.shape
    for plane in range(cuda.blockIdx.y, n_ * c_, cuda.gridDim.y):      # grid_planes
        n = plane // c_
        c = plane - n * c_
        b = bias[c]
        for p in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, p_,
                       cuda.gridDim.x * cuda.blockDim.x):
            y[n, c, p] += b


@njit(parallel=True, cache=True, nogil=True)
def add_channel_bias_cpu(y, bias):
    n_, c_, p_ = y.shape
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        b = bias[c]         # a value: read in the loop it might alias y, and stops LLVM's vectors
        for p in range(p_):
            y[n, c, p] += b


@cuda_kernel(*signatures("void(X, V, S)"), block=THREADS)
def channel_sums_cuda(dy, out, beta):
    buf = cuda.shared.array(THREADS, dtype=dy.dtype)
    t = cuda.threadIdx.x
    n_, c_, p_ = dy.shape
    m = n_ * p_
    for c in range(cuda.blockIdx.x, c_, cuda.gridDim.x):
        acc = dy.dtype.type(0)
        for i in range(t, m, THREADS):
            acc += dy[i // p_, c, i % p_]
        buf[t] = acc
        total = block_sum(buf, t)
        if t == 0:
            out[c] = total if beta == 0 else beta * out[c] + total


@njit(parallel=True, cache=True, nogil=True)
def channel_sums_cpu(dy, out, beta):
    n_, c_, p_ = dy.shape
    for c in prange(c_):
        acc = dy.dtype.type(0)
        for n in range(n_):
            for p in range(p_):
                acc += dy[n, c, p]
        out[c] = acc if beta == 0 else beta * out[c] + acc


def add_channel_bias(y, bias, stream=None):
    """``y[n, c, ...] += bias[c]`` for a blob ``y[N, C, ...]``; returns ``y``."""
    y3, b = nchw(y), view(bias, bias.size)
    if b.size != y3.shape[1]:
        raise ValueError(f"bias of {b.size} for {y3.shape[1]} channels")
    if on_cpu(y):
        add_channel_bias_cpu(y3, b)
    else:
        launch(add_channel_bias_cuda, *grid_planes(y3.shape[0] * y3.shape[1], y3.shape[2]),
               stream)(y3, b)
    return y


def channel_sums(dy, out, beta=0.0, stream=None):
    """``out[c] = beta * out[c] + sum over n and the plane of dy[n, c]`` (``beta == 0``: ``out``
    is not read); returns ``out``."""
    dy3, o = nchw(dy), view(out, out.size)
    if o.size != dy3.shape[1]:
        raise ValueError(f"out of {o.size} for {dy3.shape[1]} channels")
    scalar = dy3.dtype.type(beta)
    if on_cpu(dy):
        channel_sums_cpu(dy3, o, scalar)
    else:
        launch(channel_sums_cuda, min(dy3.shape[1], 65535), THREADS, stream)(dy3, o, scalar)
    return out
