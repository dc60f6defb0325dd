"""Batch normalisation for a step split along the batch: the arithmetic of ``batchnorm``'s
whole-batch kernels, in pieces. ``minilms.layers.split`` runs a BatchNorm
step over chunks of samples ``n0 .. n0 + n`` of a batch with ``m`` values per channel. The sums
are carried across chunks in ``partial`` (float64 ``[2, C, THREADS]``, ``split_partial_shape``)
exactly as the whole-batch kernels carry them, so a split step gives their results bit for bit:

* CUDA: thread ``t`` of a channel's block adds the values whose index in the whole channel is
  ``t`` modulo ``THREADS``, in order, into its own float64 accumulator, kept in
  ``partial[:, c, t]`` between chunks; a once-kernel adds the ``THREADS`` accumulators with the
  same ``block_sum`` tree.
* CPU: the float64 sums of each channel, carried from row to row, kept in ``partial[:, c, 0]``.

The first chunk (``n0 == 0``) starts the sums from zero. Forward: ``split_sums`` over all chunks
(the mean), ``split_mean``, ``split_sums`` centered (the variance), ``split_invstd`` (and the
running statistics, once), then ``normalize`` per chunk. Backward: ``split_grad_sums`` over all
chunks, ``split_param_grads``, then ``split_input_grad`` per chunk.
"""
import math

import numpy as np
from numba import cuda, float64, njit, prange

from .batchnorm import SUMS, THREADS, channel_views, nchw, signatures
from .common import block_sum, grid_1d, launch, view
from .registry import cuda_kernel, on_cpu

__all__ = ["split_partial_shape", "batchnorm_split_sums", "batchnorm_split_mean",
           "batchnorm_split_invstd", "batchnorm_normalize", "batchnorm_split_grad_sums",
           "batchnorm_split_param_grads", "batchnorm_split_input_grad"]

_P = "float64[:, :, ::1]"
_V = ("float32[::1]", "float64[::1]")


def split_partial_shape(channels: int) -> tuple:
    """The float64 carry of a split step's sums: two per channel and CUDA thread."""
    return (2, channels, THREADS)


@cuda_kernel(*signatures(f"void(X, int64, V, {_P}, boolean)"), block=THREADS)
def split_sums_cuda(x, n0, mean, partial, centered):
    t = cuda.threadIdx.x
    n_, c_, hw = x.shape
    start = n0 * hw
    for c in range(cuda.blockIdx.x, c_, cuda.gridDim.x):
        # float64, as the whole batch's sums; the squares about the float64 mean that
        # split_mean left in partial[0, c, 0], into partial[1]
        row = 1 if centered else 0
        acc = 0.0 if n0 == 0 else partial[row, c, t]
        mu = partial[0, c, 0]
        # from the first index >= start that is t modulo THREADS, as the whole batch's loop
        for i in range(start + (t - start % THREADS + THREADS) % THREADS, start + n_ * hw,
                       THREADS):
            j = i - start
            if centered:
                d = float64(x[j // hw, c, j % hw]) - mu
                acc += d * d
            else:
                acc += float64(x[j // hw, c, j % hw])
        partial[row, c, t] = acc


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def split_sums_cpu(x, n0, m, partial, centered):
    n_, c_, hw = x.shape
    for c in prange(c_):
        if centered:
            mu64 = partial[0, c, 0] / m
            acc = 0.0 if n0 == 0 else partial[1, c, 0]
            for n in range(n_):
                x_row = x[n, c]
                for j in range(hw):
                    d = x_row[j] - mu64
                    acc += d * d
            partial[1, c, 0] = acc
        else:
            acc = 0.0 if n0 == 0 else partial[0, c, 0]
            for n in range(n_):
                x_row = x[n, c]
                for j in range(hw):
                    acc += x_row[j]
            partial[0, c, 0] = acc


def batchnorm_split_sums(x, n0, m, mean, partial, centered, stream=None):
    """Add samples ``n0 ..`` (``x``, a chunk) into the carried sums: of ``x`` (``centered``
    False), or of the squares about the mean (True, after ``batchnorm_split_mean``)."""
    c = x.shape[1]
    x3 = nchw(x)
    if on_cpu(x):
        split_sums_cpu(x3, np.int64(n0), np.int64(m), partial, bool(centered))
    else:
        launch(split_sums_cuda, min(c, 65535), THREADS, stream)(
            x3, np.int64(n0), *channel_views(c, mean), partial, bool(centered))


@cuda_kernel(*[f"void({_P}, int64, {v})" for v in _V], block=THREADS)
def split_mean_cuda(partial, m, mean):
    buf = cuda.shared.array(THREADS, dtype=float64)
    t = cuda.threadIdx.x
    for c in range(cuda.blockIdx.x, mean.size, cuda.gridDim.x):
        buf[t] = partial[0, c, t]
        mu = block_sum(buf, t) / m
        if t == 0:
            mean[c] = mean.dtype.type(mu)
            partial[0, c, 0] = mu       # the centered sums' centre, unrounded


@njit(cache=True, nogil=True, fastmath=SUMS)
def split_mean_cpu(partial, m, mean):
    for c in range(mean.size):
        mean[c] = mean.dtype.type(partial[0, c, 0] / m)


def batchnorm_split_mean(partial, m, mean, stream=None):
    """``mean`` (``[C]``, the data's dtype) from the carried sums, once, after every chunk."""
    c = mean.size
    if on_cpu(mean):
        split_mean_cpu(partial, np.int64(m), view(mean, c))
    else:
        launch(split_mean_cuda, min(c, 65535), THREADS, stream)(partial, np.int64(m),
                                                                view(mean, c))


@cuda_kernel(*[f"void({_P}, int64, {v}, {v}, {v}, {v}, {s}, {s})"
               for v, s in zip(_V, ("float32", "float64"))], block=THREADS)
def split_invstd_cuda(partial, m, mean, invstd, running_mean, running_var, momentum, eps):
    buf = cuda.shared.array(THREADS, dtype=float64)
    t = cuda.threadIdx.x
    one = mean.dtype.type(1)
    for c in range(cuda.blockIdx.x, mean.size, cuda.gridDim.x):
        buf[t] = partial[1, c, t]
        ssd = block_sum(buf, t)
        inv = mean.dtype.type(1.0 / math.sqrt(ssd / m + float64(eps)))
        if t == 0:
            invstd[c] = inv
            # the fused multiply-add spelled out: left to the compiler, the whole-batch and the
            # split kernels contracted differently (an H100: running means 1 ulp apart)
            running_mean[c] = cuda.fma(one - momentum, running_mean[c], momentum * mean[c])
            running_var[c] = cuda.fma(one - momentum, running_var[c],
                                      momentum * mean.dtype.type(ssd / (m - 1)))


@njit(cache=True, nogil=True, fastmath=SUMS)
def split_invstd_cpu(partial, m, mean, invstd, running_mean, running_var, momentum, eps):
    one = mean.dtype.type(1)
    for c in range(mean.size):
        acc = partial[1, c, 0]
        inv = mean.dtype.type(1.0 / math.sqrt(acc / m + eps))
        mu = mean[c]
        invstd[c] = inv
        running_mean[c] = (one - momentum) * running_mean[c] + momentum * mu
        running_var[c] = (one - momentum) * running_var[c] + momentum * mean.dtype.type(
            acc / (m - 1))


def batchnorm_split_invstd(partial, m, mean, invstd, running_mean, running_var, momentum=0.1,
                           eps=1e-5, stream=None):
    """``invstd`` from the carried squares, and the running statistics updated, once."""
    c = mean.size
    t = mean.dtype.type
    args = (partial, np.int64(m), *channel_views(c, mean, invstd, running_mean, running_var),
            t(momentum), t(eps))
    if on_cpu(mean):
        split_invstd_cpu(*args)
    else:
        launch(split_invstd_cuda, min(c, 65535), THREADS, stream)(*args)


@cuda_kernel(*signatures("void(X, V, V, V, V, X)"))
def normalize_cuda(x, gamma, beta, mean, invstd, y):
    _, c_, hw = x.shape
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = (i // hw) % c_
        n, j = i // (hw * c_), i % hw
        g = gamma[c] * invstd[c]
        y[n, c, j] = (x[n, c, j] - mean[c]) * g + beta[c]


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def normalize_cpu(x, gamma, beta, mean, invstd, y):
    n_, c_, hw = x.shape
    for c in prange(c_):
        mu = mean[c]
        g = gamma[c] * invstd[c]
        for n in range(n_):
            x_row, y_row = x[n, c], y[n, c]
            for j in range(hw):
                y_row[j] = (x_row[j] - mu) * g + beta[c]


def batchnorm_normalize(x, gamma, beta, mean, invstd, y, stream=None):
    """``y = (x - mean) * invstd * gamma + beta`` with given batch statistics (a chunk's part of a
    training forward). ``y`` may be ``x``."""
    c = x.shape[1]
    x3, y3 = nchw(x), nchw(y)
    args = (x3, *channel_views(c, gamma, beta, mean, invstd), y3)
    if on_cpu(x):
        normalize_cpu(*args)
    else:
        launch(normalize_cuda, *grid_1d(x3.size), stream)(*args)


@cuda_kernel(*signatures(f"void(X, X, int64, V, V, {_P})"), block=THREADS)
def split_grad_sums_cuda(x, dy, n0, mean, invstd, partial):
    t = cuda.threadIdx.x
    n_, c_, hw = x.shape
    start = n0 * hw
    for c in range(cuda.blockIdx.x, c_, cuda.gridDim.x):
        mu, inv = mean[c], invstd[c]
        s_dy = 0.0 if n0 == 0 else partial[0, c, t]       # float64, as the whole batch's
        s_dy_xhat = 0.0 if n0 == 0 else partial[1, c, t]
        # from the first index >= start that is t modulo THREADS, as the whole batch's loop
        for i in range(start + (t - start % THREADS + THREADS) % THREADS, start + n_ * hw,
                       THREADS):
            j = i - start
            n, k = j // hw, j % hw
            s_dy += float64(dy[n, c, k])
            s_dy_xhat += float64(dy[n, c, k] * ((x[n, c, k] - mu) * inv))
        partial[0, c, t] = s_dy
        partial[1, c, t] = s_dy_xhat


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def split_grad_sums_cpu(x, dy, n0, partial):
    """``backward_cpu``'s sums: ``sum(dy)`` and ``sum(dy * x)``."""
    n_, c_, hw = x.shape
    for c in prange(c_):
        s_dy = 0.0 if n0 == 0 else partial[0, c, 0]
        s_dy_x = 0.0 if n0 == 0 else partial[1, c, 0]
        for n in range(n_):
            x_row, dy_row = x[n, c], dy[n, c]
            for j in range(hw):
                s_dy += dy_row[j]
                s_dy_x += np.float64(dy_row[j]) * np.float64(x_row[j])
        partial[0, c, 0] = s_dy
        partial[1, c, 0] = s_dy_x


@njit(parallel=True, cache=True)
def split_param_sums_cpu(x, dy, n0, mean, invstd, partial):
    """``layers.batch_norm.param_grads_cpu``'s sums (a backward without ``dx``): ``sum(dy)`` and
    ``sum(dy * xhat)``, in order, no reassociation."""
    n_, c_, hw = x.shape
    for c in prange(c_):
        mu, inv = mean[c], invstd[c]
        s_dy = 0.0 if n0 == 0 else partial[0, c, 0]
        s_dy_xhat = 0.0 if n0 == 0 else partial[1, c, 0]
        for n in range(n_):
            for j in range(hw):
                s_dy += dy[n, c, j]
                s_dy_xhat += dy[n, c, j] * ((x[n, c, j] - mu) * inv)
        partial[0, c, 0] = s_dy
        partial[1, c, 0] = s_dy_xhat


def batchnorm_split_grad_sums(x, dy, n0, mean, invstd, partial, with_dx=True, stream=None):
    """Add samples ``n0 ..`` into backward's two carried sums; ``with_dx`` False: the sums of the
    backward that writes no ``dx`` (the ``cpu`` device forms them differently there)."""
    c = x.shape[1]
    x3, dy3 = nchw(x), nchw(dy)
    if on_cpu(x):
        if with_dx:
            split_grad_sums_cpu(x3, dy3, np.int64(n0), partial)
        else:
            split_param_sums_cpu(x3, dy3, np.int64(n0), *channel_views(c, mean, invstd), partial)
    else:
        launch(split_grad_sums_cuda, min(c, 65535), THREADS, stream)(
            x3, dy3, np.int64(n0), *channel_views(c, mean, invstd), partial)


@cuda_kernel(*[f"void({_P}, {v}, {v}, {v}, {v})" for v in _V], block=THREADS)
def split_param_grads_cuda(partial, mean, invstd, dgamma, dbeta):
    buf = cuda.shared.array(THREADS, dtype=float64)
    t = cuda.threadIdx.x
    for c in range(cuda.blockIdx.x, dgamma.size, cuda.gridDim.x):
        buf[t] = partial[0, c, t]
        sum_dy = block_sum(buf, t)
        buf[t] = partial[1, c, t]
        sum_dy_xhat = block_sum(buf, t)
        if t == 0:
            dgamma[c] = sum_dy_xhat
            dbeta[c] = sum_dy


@njit(cache=True, nogil=True, fastmath=SUMS)
def split_param_grads_cpu(partial, mean, invstd, with_dx, dgamma, dbeta):
    for c in range(dgamma.size):
        s_dy = partial[0, c, 0]
        if with_dx:
            mu, inv = mean[c], invstd[c]
            s_dy_xhat = (partial[1, c, 0] - np.float64(mu) * s_dy) * inv
        else:
            s_dy_xhat = partial[1, c, 0]
        dgamma[c] = s_dy_xhat
        dbeta[c] = s_dy


def batchnorm_split_param_grads(partial, mean, invstd, dgamma, dbeta, with_dx=True,
                                stream=None):
    """``dgamma = sum(dy * xhat)``, ``dbeta = sum(dy)`` (overwritten) from the carried sums,
    once, after every chunk."""
    c = dgamma.size
    args = channel_views(c, mean, invstd, dgamma, dbeta)
    if on_cpu(dgamma):
        split_param_grads_cpu(partial, args[0], args[1], bool(with_dx), args[2], args[3])
    else:
        launch(split_param_grads_cuda, min(c, 65535), THREADS, stream)(partial, *args)


@cuda_kernel(*signatures("void(X, X, V, V, V, V, V, int64, X)"))
def split_input_grad_cuda(x, dy, gamma, mean, invstd, dgamma, dbeta, m, dx):
    _, c_, hw = x.shape
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = (i // hw) % c_
        n, j = i // (hw * c_), i % hw
        mu, inv = mean[c], invstd[c]
        a = dbeta[c] / x.dtype.type(m)
        b = dgamma[c] / x.dtype.type(m)
        g = gamma[c] * inv
        dx[n, c, j] = g * (dy[n, c, j] - a - (x[n, c, j] - mu) * inv * b)


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def split_input_grad_cpu(x, dy, gamma, mean, invstd, partial, m, dx):
    n_, c_, hw = x.shape
    for c in prange(c_):
        mu, inv = mean[c], invstd[c]
        s_dy = partial[0, c, 0]
        s_dy_xhat = (partial[1, c, 0] - np.float64(mu) * s_dy) * inv
        g = gamma[c] * inv
        shift = x.dtype.type(g * s_dy / m)
        slope = x.dtype.type(g * inv * s_dy_xhat / m)
        for n in range(n_):
            x_row, dy_row, dx_row = x[n, c], dy[n, c], dx[n, c]
            for j in range(hw):
                dx_row[j] = g * dy_row[j] - slope * (x_row[j] - mu) - shift


def batchnorm_split_input_grad(x, dy, gamma, mean, invstd, partial, dgamma, dbeta, m, dx,
                               stream=None):
    """``dx`` of a chunk, after ``batchnorm_split_param_grads`` (CUDA reads its ``dgamma`` and
    ``dbeta``, the CPU the float64 sums in ``partial``, as the whole-batch kernels do). ``dx``
    may be ``dy``."""
    c = x.shape[1]
    x3, dy3, dx3 = nchw(x), nchw(dy), nchw(dx)
    if on_cpu(x):
        split_input_grad_cpu(x3, dy3, *channel_views(c, gamma, mean, invstd), partial, np.int64(m),
                             dx3)
    else:
        launch(split_input_grad_cuda, *grid_1d(x3.size), stream)(
            x3, dy3, *channel_views(c, gamma, mean, invstd, dgamma, dbeta), np.int64(m), dx3)
