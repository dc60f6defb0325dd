"""Batch-norm sums on CUDA: a grid-wide reduction in two stages, deterministic, and the same for a
whole batch and for any split of it into chunks of samples.

A channel's ``M = N*HW`` values are ``N`` rows ``(n, c)`` of ``HW`` values; each row is cut
into ``P = ceil(HW / PIECE)`` pieces (``pieces``). Stage 1 (``piece_sums``, ``grad_piece_sums``):
one warp per piece, lane ``l`` adding values ``l, l + 32, ...`` of the piece in float64, then a
fixed tree over the 32 lanes (``common.warp_sums``); the piece's sum goes to
``stats[row, c, n*P + p]``.
Stage 2 (``finish_mean``, ``finish_invstd``, ``finish_grads``): one block per channel adds the
channel's ``N*P`` piece sums, thread ``t`` those at ``t, t + THREADS, ...`` in order, then
``block_sum``'s tree. Every SM has work at any channel count (ResNet's first stage: 64 channels,
``32 * 64 * 7`` pieces at batch 32 and 224x224, where one block per channel left half of an H100's
132 SMs idle and made each of its threads read 1,568 values one after another).

``stats`` is float64 ``[2, C, N*P + 1]`` (``stats_shape``): row 0 the piece sums of ``x`` (forward)
or ``dy`` (backward), row 1 of the squares about the mean (forward) or of ``dy * xhat``
(backward); ``stats[0, c, N*P]`` keeps the float64 mean, the centre of the squares. The number of
piece sums a channel adds is read off ``stats`` (its last axis less one), so ``stats`` is always
sized for the whole batch.

A chunk of samples ``n0 ..`` covers whole rows: it writes its own rows' piece sums, and stage 2
adds the same numbers in the same order whatever the chunks were. The whole batch is one chunk
(``n0 = 0``), so a split step is the unsplit one bit for bit by construction. The ``cpu`` device
sums per channel instead (``batchnorm``, ``batchnorm_split``); both devices sum in float64.
"""
import math

import numpy as np
from numba import float64

from ..lazy_cuda import cuda
from .common import block_sum, launch, view, warp_sums
from .registry import cuda_kernel
from .shapes import PIECE, pieces, stats_shape

__all__ = ["THREADS", "PIECE", "pieces", "stats_shape", "signatures", "nchw", "channel_views",
           "cuda_sums", "cuda_grad_sums", "cuda_mean", "cuda_invstd", "cuda_param_grads"]

THREADS = 256        # a block: 8 warps, 8 pieces at a time in stage 1; one channel in stage 2
WARPS = THREADS // 32
MAX_BLOCKS = 32768   # stage 1's grid, at most (a grid-stride loop covers the rest)

_A = (("float32[:, :, ::1]", "float32[::1]", "float32"),
      ("float64[:, :, ::1]", "float64[::1]", "float64"))
_S = "float64[:, :, ::1]"
_V = ("float32[::1]", "float64[::1]")


def signatures(pattern):
    """Each kernel's float32 and float64 signatures: ``X`` the data, ``V`` a per-channel array,
    ``S`` a scalar (shared with ``batchnorm`` and ``batchnorm_split``)."""
    return [pattern.replace("X", x).replace("V", v).replace("S", s) for x, v, s in _A]


def nchw(x):
    """``x`` viewed as ``[N, C, H*W]``."""
    n, c = x.shape[:2]
    return view(x, n, c, x.size // (n * c) if n * c else 0)


def channel_views(c, *arrays):
    for a in arrays:
        if a.size != c:
            raise ValueError(f"per-channel array of shape {a.shape} for {c} channels")
    return [view(a, c) for a in arrays]


# -- stage 1: one warp a piece -----------------------------------------------------------------

@cuda_kernel(*signatures(f"void(X, int64, int64, {_S}, boolean)"), block=THREADS)
def piece_sums_cuda(x, n0, p_, stats, centered):
    buf = cuda.shared.array(THREADS, dtype=float64)
    t = cuda.threadIdx.x
    lane, warp = t % 32, t // 32
    n_, c_, hw = x.shape
    total = n_ * c_ * p_
    row = 1 if centered else 0
    centre = stats.shape[2] - 1
    # every thread of the block goes round the same number of times: warp_sums has barriers
    for first in range(cuda.blockIdx.x * WARPS, total, cuda.gridDim.x * WARPS):
        g = first + warp
        p, c, n = g % p_, (g // p_) % c_, g // (p_ * c_)
        acc = 0.0
        if g < total:
            if centered:
                mu = stats[0, c, centre]
                for j in range(p * PIECE + lane, min(p * PIECE + PIECE, hw), 32):
                    d = float64(x[n, c, j]) - mu
                    acc += d * d
            else:
                for j in range(p * PIECE + lane, min(p * PIECE + PIECE, hw), 32):
                    acc += float64(x[n, c, j])
        buf[t] = acc
        piece = warp_sums(buf, t)
        if lane == 0 and g < total:
            stats[row, c, (n0 + n) * p_ + p] = piece


@cuda_kernel(*signatures(f"void(X, X, int64, int64, V, V, {_S})"), block=THREADS)
def grad_piece_sums_cuda(x, dy, n0, p_, mean, invstd, stats):
    buf = cuda.shared.array(THREADS, dtype=float64)
    t = cuda.threadIdx.x
    lane, warp = t % 32, t // 32
    n_, c_, hw = x.shape
    total = n_ * c_ * p_
    for first in range(cuda.blockIdx.x * WARPS, total, cuda.gridDim.x * WARPS):
        g = first + warp
        p, c, n = g % p_, (g // p_) % c_, g // (p_ * c_)
        s_dy = 0.0
        s_dy_xhat = 0.0
        if g < total:
            mu, inv = mean[c], invstd[c]
            for j in range(p * PIECE + lane, min(p * PIECE + PIECE, hw), 32):
                s_dy += float64(dy[n, c, j])
                s_dy_xhat += float64(dy[n, c, j] * ((x[n, c, j] - mu) * inv))
        buf[t] = s_dy
        s_dy = warp_sums(buf, t)
        buf[t] = s_dy_xhat
        s_dy_xhat = warp_sums(buf, t)
        if lane == 0 and g < total:
            stats[0, c, (n0 + n) * p_ + p] = s_dy
            stats[1, c, (n0 + n) * p_ + p] = s_dy_xhat


def _stage1_blocks(x3, p_) -> int:
    n, c = x3.shape[:2]
    return max(1, min(MAX_BLOCKS, -(-(n * c * p_) // WARPS)))


def _check(x3, n0, stats) -> int:
    """``P`` for ``x3``'s rows, after checking that ``stats`` has room for samples ``n0 ..``."""
    n, c, hw = x3.shape
    p_ = pieces(hw)
    if stats.ndim != 3 or stats.shape[:2] != (2, c) or stats.shape[2] < (n0 + n) * p_ + 1:
        raise ValueError(f"batch-norm stats of shape {tuple(stats.shape)} for samples {n0}.."
                         f"{n0 + n} of {c} channels with {hw} values a row (stats_shape)")
    return p_


def cuda_sums(x3, n0, stats, centered, stream=None):
    """Stage 1 of the forward sums of ``x3`` (``[n, C, HW]``: samples ``n0 ..``), of the values
    or (``centered``) of their squares about the mean ``cuda_mean`` left in ``stats``."""
    p_ = _check(x3, n0, stats)
    launch(piece_sums_cuda, _stage1_blocks(x3, p_), THREADS, stream)(
        x3, np.int64(n0), np.int64(p_), stats, bool(centered))


def cuda_grad_sums(x3, dy3, n0, mean, invstd, stats, stream=None):
    """Stage 1 of backward's sums, ``dy`` and ``dy * xhat``, over samples ``n0 ..``."""
    p_ = _check(x3, n0, stats)
    launch(grad_piece_sums_cuda, _stage1_blocks(x3, p_), THREADS, stream)(
        x3, dy3, np.int64(n0), np.int64(p_), mean, invstd, stats)


# -- stage 2: one block a channel ----------------------------------------------------------------

@cuda.jit(device=True, inline="always")
def _channel_sum(stats, row, c, buf, t):
    acc = 0.0
    for k in range(t, stats.shape[2] - 1, THREADS):
        acc += stats[row, c, k]
    buf[t] = acc
    return block_sum(buf, t)


@cuda_kernel(*[f"void({_S}, int64, {v})" for v in _V], block=THREADS)
def finish_mean_cuda(stats, m, mean):
    buf = cuda.shared.array(THREADS, dtype=float64)
    t = cuda.threadIdx.x
    for c in range(cuda.blockIdx.x, mean.size, cuda.gridDim.x):
        mu = _channel_sum(stats, 0, c, buf, t) / m
        if t == 0:
            mean[c] = mean.dtype.type(mu)
            stats[0, c, stats.shape[2] - 1] = mu      # the squares' centre, unrounded


@cuda_kernel(*[f"void({_S}, int64, {v}, {v}, {v}, {v}, {s}, {s})"
               for v, s in zip(_V, ("float32", "float64"))], block=THREADS)
def finish_invstd_cuda(stats, m, mean, invstd, running_mean, running_var, momentum, eps):
    buf = cuda.shared.array(THREADS, dtype=float64)
    t = cuda.threadIdx.x
    one = mean.dtype.type(1)
    for c in range(cuda.blockIdx.x, mean.size, cuda.gridDim.x):
        ssd = _channel_sum(stats, 1, c, buf, t)
        if t == 0:
            invstd[c] = mean.dtype.type(1.0 / math.sqrt(ssd / m + float64(eps)))
            # the fused multiply-add spelled out: left to the compiler, two kernels that meant
            # the same contracted differently (an H100: running means 1 ulp apart)
            running_mean[c] = cuda.fma(one - momentum, running_mean[c], momentum * mean[c])
            running_var[c] = cuda.fma(one - momentum, running_var[c],
                                      momentum * mean.dtype.type(ssd / (m - 1)))


@cuda_kernel(*[f"void({_S}, {v}, {v})" for v in _V], block=THREADS)
def finish_grads_cuda(stats, dgamma, dbeta):
    buf = cuda.shared.array(THREADS, dtype=float64)
    t = cuda.threadIdx.x
    for c in range(cuda.blockIdx.x, dgamma.size, cuda.gridDim.x):
        sum_dy = _channel_sum(stats, 0, c, buf, t)
        sum_dy_xhat = _channel_sum(stats, 1, c, buf, t)
        if t == 0:
            dgamma[c] = sum_dy_xhat
            dbeta[c] = sum_dy


def _channels(c: int) -> int:
    return min(c, 65535)


def cuda_mean(stats, m, mean, stream=None):
    """Stage 2: ``mean`` (``[C]``) of the ``m`` values a channel, once every sample's pieces are
    in ``stats``; the float64 mean stays in ``stats`` for the squares."""
    launch(finish_mean_cuda, _channels(mean.size), THREADS, stream)(stats, np.int64(m), mean)


def cuda_invstd(stats, m, mean, invstd, running_mean, running_var, momentum, eps, stream=None):
    """Stage 2 of the squares: ``invstd``, and the running statistics updated."""
    t = mean.dtype.type
    launch(finish_invstd_cuda, _channels(mean.size), THREADS, stream)(
        stats, np.int64(m), mean, invstd, running_mean, running_var, t(momentum), t(eps))


def cuda_param_grads(stats, dgamma, dbeta, stream=None):
    """Stage 2 of backward: ``dgamma = sum(dy * xhat)``, ``dbeta = sum(dy)`` (overwritten)."""
    launch(finish_grads_cuda, _channels(dgamma.size), THREADS, stream)(stats, dgamma, dbeta)
