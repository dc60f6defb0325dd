"""Batch normalisation for a step split along the batch: the arithmetic of ``batchnorm``'s
whole-batch kernels, in pieces. ``minilms.layers.split`` runs a BatchNorm
step over chunks of samples ``n0 .. n0 + n`` of a batch with ``m`` values per channel. The sums
are carried across chunks in ``stats`` (float64 ``[2, C, K]``) exactly as the whole-batch kernels
carry them, so a split step gives their results bit for bit:

* CUDA: the whole batch's two-stage reduction (``batchnorm_sums``): each chunk writes its own
  samples' piece sums into ``stats`` (``stats_shape`` of the whole batch), and the once-passes add
  every piece, so the whole batch is simply the one-chunk case.
* CPU: the float64 sums of each channel, carried from row to row, kept in ``stats[:, c, 0]``
  (``cpu_stats_shape``).

The first chunk (``n0 == 0``) starts the CPU's sums from zero. Forward: ``split_sums`` over all
chunks (the mean), ``split_mean``, ``split_sums`` centered (the variance), ``split_invstd`` (and the
running statistics, once), then ``batchnorm.batchnorm_normalize`` per chunk. Backward:
``split_grad_sums`` over all chunks, ``split_param_grads``, then ``split_input_grad`` per chunk.
"""
import math

import numpy as np
from numba import njit, prange

from .batchnorm import SUMS, batchnorm_input_grad, channel_views, cuda_stats, nchw
from .batchnorm_sums import cuda_grad_sums, cuda_invstd, cuda_mean, cuda_param_grads, cuda_sums
from .common import view
from .registry import on_cpu
from .shapes import cpu_stats_shape

__all__ = ["cpu_stats_shape", "batchnorm_split_sums", "batchnorm_split_mean",
           "batchnorm_split_invstd", "batchnorm_split_grad_sums", "batchnorm_split_param_grads",
           "batchnorm_split_input_grad"]


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def split_sums_cpu(x, n0, m, stats, centered):
    n_, c_, hw = x.shape
    for c in prange(c_):
        if centered:
            mu64 = stats[0, c, 0] / m
            acc = 0.0 if n0 == 0 else stats[1, c, 0]
            for n in range(n_):
                x_row = x[n, c]
                for j in range(hw):
                    d = x_row[j] - mu64
                    acc += d * d
            stats[1, c, 0] = acc
        else:
            acc = 0.0 if n0 == 0 else stats[0, c, 0]
            for n in range(n_):
                x_row = x[n, c]
                for j in range(hw):
                    acc += x_row[j]
            stats[0, c, 0] = acc


def batchnorm_split_sums(x, n0, m, mean, stats, centered, stream=None):
    """Add samples ``n0 ..`` (``x``, a chunk) into the carried sums: of ``x`` (``centered``
    False), or of the squares about the mean (True, after ``batchnorm_split_mean``)."""
    x3 = nchw(x)
    if on_cpu(x):
        split_sums_cpu(x3, np.int64(n0), np.int64(m), stats, bool(centered))
    else:
        cuda_sums(x3, n0, cuda_stats(stats, x), centered, stream)


@njit(cache=True, nogil=True, fastmath=SUMS)
def split_mean_cpu(stats, m, mean):
    for c in range(mean.size):
        mean[c] = mean.dtype.type(stats[0, c, 0] / m)


def batchnorm_split_mean(stats, m, mean, stream=None):
    """``mean`` (``[C]``, the data's dtype) from the carried sums, once, after every chunk."""
    c = mean.size
    if on_cpu(mean):
        split_mean_cpu(stats, np.int64(m), view(mean, c))
    else:
        cuda_mean(stats, m, view(mean, c), stream)


@njit(cache=True, nogil=True, fastmath=SUMS)
def split_invstd_cpu(stats, m, mean, invstd, running_mean, running_var, momentum, eps):
    one = mean.dtype.type(1)
    for c in range(mean.size):
        acc = stats[1, c, 0]
        inv = mean.dtype.type(1.0 / math.sqrt(acc / m + eps))
        mu = mean[c]
        invstd[c] = inv
        running_mean[c] = (one - momentum) * running_mean[c] + momentum * mu
        running_var[c] = (one - momentum) * running_var[c] + momentum * mean.dtype.type(
            acc / (m - 1))


def batchnorm_split_invstd(stats, m, mean, invstd, running_mean, running_var, momentum=0.1,
                           eps=1e-5, stream=None):
    """``invstd`` from the carried squares, and the running statistics updated, once."""
    c = mean.size
    views = channel_views(c, mean, invstd, running_mean, running_var)
    if on_cpu(mean):
        t = mean.dtype.type
        split_invstd_cpu(stats, np.int64(m), *views, t(momentum), t(eps))
    else:
        cuda_invstd(stats, m, *views, momentum, eps, stream)


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def split_grad_sums_cpu(x, dy, n0, stats):
    """``backward_cpu``'s sums: ``sum(dy)`` and ``sum(dy * x)``."""
    n_, c_, hw = x.shape
    for c in prange(c_):
        s_dy = 0.0 if n0 == 0 else stats[0, c, 0]
        s_dy_x = 0.0 if n0 == 0 else stats[1, c, 0]
        for n in range(n_):
            x_row, dy_row = x[n, c], dy[n, c]
            for j in range(hw):
                s_dy += dy_row[j]
                s_dy_x += np.float64(dy_row[j]) * np.float64(x_row[j])
        stats[0, c, 0] = s_dy
        stats[1, c, 0] = s_dy_x


@njit(parallel=True, cache=True)
def split_param_sums_cpu(x, dy, n0, mean, invstd, stats):
    """``batchnorm.param_grads_cpu``'s sums (a backward without ``dx``): ``sum(dy)`` and
    ``sum(dy * xhat)``, in order, no reassociation."""
    n_, c_, hw = x.shape
    for c in prange(c_):
        mu, inv = mean[c], invstd[c]
        s_dy = 0.0 if n0 == 0 else stats[0, c, 0]
        s_dy_xhat = 0.0 if n0 == 0 else stats[1, c, 0]
        for n in range(n_):
            for j in range(hw):
                s_dy += dy[n, c, j]
                s_dy_xhat += dy[n, c, j] * ((x[n, c, j] - mu) * inv)
        stats[0, c, 0] = s_dy
        stats[1, c, 0] = s_dy_xhat


def batchnorm_split_grad_sums(x, dy, n0, mean, invstd, stats, with_dx=True, stream=None):
    """Add samples ``n0 ..`` into backward's two carried sums; ``with_dx`` False: the sums of the
    backward that writes no ``dx`` (the ``cpu`` device forms them differently there)."""
    c = x.shape[1]
    x3, dy3 = nchw(x), nchw(dy)
    if on_cpu(x):
        if with_dx:
            split_grad_sums_cpu(x3, dy3, np.int64(n0), stats)
        else:
            split_param_sums_cpu(x3, dy3, np.int64(n0), *channel_views(c, mean, invstd), stats)
    else:
        cuda_grad_sums(x3, dy3, n0, *channel_views(c, mean, invstd), cuda_stats(stats, x), stream)


@njit(cache=True, nogil=True, fastmath=SUMS)
def split_param_grads_cpu(stats, mean, invstd, with_dx, dgamma, dbeta):
    for c in range(dgamma.size):
        s_dy = stats[0, c, 0]
        if with_dx:
            mu, inv = mean[c], invstd[c]
            s_dy_xhat = (stats[1, c, 0] - np.float64(mu) * s_dy) * inv
        else:
            s_dy_xhat = stats[1, c, 0]
        dgamma[c] = s_dy_xhat
        dbeta[c] = s_dy


def batchnorm_split_param_grads(stats, mean, invstd, dgamma, dbeta, with_dx=True,
                                stream=None):
    """``dgamma = sum(dy * xhat)``, ``dbeta = sum(dy)`` (overwritten) from the carried sums,
    once, after every chunk."""
    c = dgamma.size
    mean, invstd, dgamma, dbeta = channel_views(c, mean, invstd, dgamma, dbeta)
    if on_cpu(dgamma):
        split_param_grads_cpu(stats, mean, invstd, bool(with_dx), dgamma, dbeta)
    else:
        cuda_param_grads(stats, dgamma, dbeta, stream)


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def split_input_grad_cpu(x, dy, gamma, mean, invstd, stats, m, dx):
    n_, c_, hw = x.shape
    for c in prange(c_):
        mu, inv = mean[c], invstd[c]
        s_dy = stats[0, c, 0]
        s_dy_xhat = (stats[1, c, 0] - np.float64(mu) * s_dy) * inv
        g = gamma[c] * inv
        shift = x.dtype.type(g * s_dy / m)
        slope = x.dtype.type(g * inv * s_dy_xhat / m)
        for n in range(n_):
            x_row, dy_row, dx_row = x[n, c], dy[n, c], dx[n, c]
            for j in range(hw):
                dx_row[j] = g * dy_row[j] - slope * (x_row[j] - mu) - shift


def batchnorm_split_input_grad(x, dy, gamma, mean, invstd, stats, dgamma, dbeta, m, dx,
                               stream=None):
    """``dx`` of a chunk, after ``batchnorm_split_param_grads`` (CUDA reads its ``dgamma`` and
    ``dbeta``, the CPU the float64 sums in ``stats``, as the whole-batch kernels do). ``dx``
    may be ``dy``."""
    if on_cpu(x):
        c = x.shape[1]
        split_input_grad_cpu(nchw(x), nchw(dy), *channel_views(c, gamma, mean, invstd), stats,
                             np.int64(m), nchw(dx))
    else:
        batchnorm_input_grad(x, dy, gamma, mean, invstd, dgamma, dbeta, m, dx, stream)
