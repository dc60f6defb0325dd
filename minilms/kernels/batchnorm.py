"""Batch normalisation over NCHW, per channel (``[N, C]`` works too: it is ``H = W = 1``).

Shapes: ``x``, ``y``, ``dy``, ``dx`` ``[N, C, H, W]`` or ``[N, C]``; every per-channel array
(``gamma``, ``beta``, ``mean``, ``invstd``, ``running_mean``, ``running_var``, ``dgamma``,
``dbeta``) is ``[C]``. ``M = N*H*W`` values per channel. Training forward, per channel::

    mean   = sum(x) / M
    var    = sum((x - mean)^2) / M                    (biased: used to normalise)
    invstd = 1 / sqrt(var + eps)
    y      = (x - mean) * invstd * gamma + beta
    running_mean = (1 - momentum) * running_mean + momentum * mean
    running_var  = (1 - momentum) * running_var  + momentum * sum((x - mean)^2) / (M - 1)

(unbiased in the running variance: ``torch.nn.BatchNorm2d``'s formulation, momentum 0.1 there).
``mean`` and ``invstd`` are saved for backward. Inference uses the running statistics::

    y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta

A recompute (issue 21) applies the *saved* statistics, and updates nothing::

    y = (x - mean) * (invstd * gamma) + beta          (bit for bit the training forward's y)

with the training kernels' own expression and rounding: ``g = gamma * invstd`` rounded in the data's
dtype, then ``(x - mean) * g + beta``, under the same fastmath flags on the CPU (so LLVM contracts
it into the same FMA, or not) and as the same expression on CUDA.

Backward (training mode), with ``xhat = (x - mean) * invstd``::

    dbeta  = sum(dy)            dgamma = sum(dy * xhat)          (overwritten, not accumulated)
    dx     = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M)

Sums: the variance is two-pass (no cancellation of ``E[x^2] - E[x]^2``), and every sum runs in
float64 on both devices, so that they agree at 2240x2240 (millions of values a channel), where
float32 sums drift. CUDA: one block per channel, float64 per thread and a fixed-order float64 tree,
deterministic. CPU: per channel in float64 over vector lanes.

A step split along the batch runs the same arithmetic in pieces: ``batchnorm_split``.
"""
import math

import numpy as np
from numba import cuda, float64, njit, prange

from .common import block_sum, grid_1d, launch, view
from .registry import cuda_kernel, on_cpu

__all__ = ["batchnorm_forward_train", "batchnorm_forward_saved", "batchnorm_forward_inference",
           "batchnorm_backward", "THREADS", "SUMS", "signatures", "nchw", "channel_views"]

THREADS = 256   # one block per channel
# The CPU sums run in float64 with reassociation allowed, so LLVM splits them over vector lanes
# (measured faster on backward); the order then depends on the vector width only, not the threads.
SUMS = {"reassoc", "contract"}

_A = (("float32[:, :, ::1]", "float32[::1]", "float32"),
      ("float64[:, :, ::1]", "float64[::1]", "float64"))


def signatures(pattern):
    """Each kernel's float32 and float64 signatures: ``X`` the data, ``V`` a per-channel array,
    ``S`` a scalar (shared with ``batchnorm_split``)."""
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


@cuda_kernel(*signatures("void(X, V, V, X, V, V, V, V, S, S)"), block=THREADS)
def forward_train_cuda(x, gamma, beta, y, mean, invstd, running_mean, running_var, momentum, eps):
    buf = cuda.shared.array(THREADS, dtype=float64)   # float64 sums, as the CPU twin's
    t = cuda.threadIdx.x
    n_, c_, hw = x.shape
    m = n_ * hw
    one = x.dtype.type(1)
    for c in range(cuda.blockIdx.x, c_, cuda.gridDim.x):
        acc = 0.0
        for i in range(t, m, THREADS):
            acc += float64(x[i // hw, c, i % hw])
        buf[t] = acc
        mu64 = block_sum(buf, t) / m
        acc = 0.0
        for i in range(t, m, THREADS):
            d = float64(x[i // hw, c, i % hw]) - mu64
            acc += d * d
        buf[t] = acc
        ssd = block_sum(buf, t)
        mu = x.dtype.type(mu64)
        inv = x.dtype.type(1.0 / math.sqrt(ssd / m + float64(eps)))
        g = gamma[c] * inv
        b = beta[c]
        for i in range(t, m, THREADS):
            y[i // hw, c, i % hw] = (x[i // hw, c, i % hw] - mu) * g + b
        if t == 0:
            mean[c] = mu
            invstd[c] = inv
            # the fused multiply-add spelled out: left to the compiler, the whole-batch and the
            # split kernels contracted differently (an H100: running means 1 ulp apart)
            running_mean[c] = cuda.fma(one - momentum, running_mean[c], momentum * mu)
            running_var[c] = cuda.fma(one - momentum, running_var[c],
                                      momentum * x.dtype.type(ssd / (m - 1)))


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def forward_train_cpu(x, gamma, beta, y, mean, invstd, running_mean, running_var, momentum, eps):
    n_, c_, hw = x.shape
    m = n_ * hw
    one = x.dtype.type(1)
    for c in prange(c_):
        acc = 0.0
        for n in range(n_):
            x_row = x[n, c]
            for j in range(hw):
                acc += x_row[j]
        mu64 = acc / m
        acc = 0.0
        for n in range(n_):
            x_row = x[n, c]
            for j in range(hw):
                d = x_row[j] - mu64
                acc += d * d
        mu = x.dtype.type(mu64)
        inv = x.dtype.type(1.0 / math.sqrt(acc / m + eps))
        g = gamma[c] * inv
        for n in range(n_):
            x_row, y_row = x[n, c], y[n, c]
            for j in range(hw):
                y_row[j] = (x_row[j] - mu) * g + beta[c]
        mean[c] = mu
        invstd[c] = inv
        running_mean[c] = (one - momentum) * running_mean[c] + momentum * mu
        running_var[c] = (one - momentum) * running_var[c] + momentum * x.dtype.type(acc / (m - 1))


def batchnorm_forward_train(x, gamma, beta, y, mean, invstd, running_mean, running_var,
                            momentum=0.1, eps=1e-5, stream=None):
    """Normalise with batch statistics, save ``mean``/``invstd`` (``[C]``) for backward and update
    the running statistics in place. ``y`` may be ``x``."""
    c = x.shape[1]
    x3, y3 = nchw(x), nchw(y)
    if x3.size // c < 2:
        raise ValueError("batch norm in training needs more than one value per channel")
    t = x3.dtype.type
    args = (x3, *channel_views(c, gamma, beta), y3,
            *channel_views(c, mean, invstd, running_mean, running_var), t(momentum), t(eps))
    if on_cpu(x):
        forward_train_cpu(*args)
    else:
        launch(forward_train_cuda, min(c, 65535), THREADS, stream)(*args)


@cuda_kernel(*signatures("void(X, V, V, V, V, X)"))
def forward_saved_cuda(x, gamma, beta, mean, invstd, y):
    _, c_, hw = x.shape
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = (i // hw) % c_
        n, j = i // (hw * c_), i % hw
        g = gamma[c] * invstd[c]        # as forward_train_cuda: g, then (x - mu) * g + b
        y[n, c, j] = (x[n, c, j] - mean[c]) * g + beta[c]


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def forward_saved_cpu(x, gamma, beta, mean, invstd, y):
    n_, c_, hw = x.shape
    for c in prange(c_):
        mu = mean[c]
        g = gamma[c] * invstd[c]        # as forward_train_cpu's last loop, with its flags
        for n in range(n_):
            x_row, y_row = x[n, c], y[n, c]
            for j in range(hw):
                y_row[j] = (x_row[j] - mu) * g + beta[c]


def batchnorm_forward_saved(x, gamma, beta, mean, invstd, y, stream=None):
    """Normalise with the statistics a training forward saved (``mean``, ``invstd``): its ``y``
    again, bit for bit, for a recompute. Nothing else is read or written. ``y`` may be ``x``."""
    c = x.shape[1]
    x3, y3 = nchw(x), nchw(y)
    args = (x3, *channel_views(c, gamma, beta, mean, invstd), y3)
    if on_cpu(x):
        forward_saved_cpu(*args)
    else:
        launch(forward_saved_cuda, *grid_1d(x3.size), stream)(*args)


@cuda_kernel(*signatures("void(X, V, V, V, V, X, S)"))
def forward_inference_cuda(x, gamma, beta, running_mean, running_var, y, eps):
    _, c_, hw = x.shape
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = (i // hw) % c_
        n, j = i // (hw * c_), i % hw
        inv = x.dtype.type(1) / math.sqrt(running_var[c] + eps)
        y[n, c, j] = (x[n, c, j] - running_mean[c]) * (gamma[c] * inv) + beta[c]


@njit(parallel=True, cache=True, nogil=True)
def forward_inference_cpu(x, gamma, beta, running_mean, running_var, y, eps):
    n_, c_, hw = x.shape
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        inv = x.dtype.type(1) / math.sqrt(running_var[c] + eps)
        g = gamma[c] * inv
        for j in range(hw):
            y[n, c, j] = (x[n, c, j] - running_mean[c]) * g + beta[c]


def batchnorm_forward_inference(x, gamma, beta, running_mean, running_var, y, eps=1e-5,
                                stream=None):
    """Normalise with the running statistics; nothing is updated. ``y`` may be ``x``."""
    c = x.shape[1]
    x3, y3 = nchw(x), nchw(y)
    args = (x3, *channel_views(c, gamma, beta, running_mean, running_var), y3, x3.dtype.type(eps))
    if on_cpu(x):
        forward_inference_cpu(*args)
    else:
        launch(forward_inference_cuda, *grid_1d(x3.size), stream)(*args)


@cuda_kernel(*signatures("void(X, X, V, V, V, X, V, V)"), block=THREADS)
def backward_cuda(x, dy, gamma, mean, invstd, dx, dgamma, dbeta):
    buf = cuda.shared.array(THREADS, dtype=float64)   # float64 sums, as the CPU twin's
    t = cuda.threadIdx.x
    n_, c_, hw = x.shape
    m = n_ * hw
    for c in range(cuda.blockIdx.x, c_, cuda.gridDim.x):
        mu, inv = mean[c], invstd[c]
        acc = 0.0
        for i in range(t, m, THREADS):
            acc += float64(dy[i // hw, c, i % hw])
        buf[t] = acc
        sum_dy = block_sum(buf, t)
        acc = 0.0
        for i in range(t, m, THREADS):
            acc += float64(dy[i // hw, c, i % hw] * ((x[i // hw, c, i % hw] - mu) * inv))
        buf[t] = acc
        sum_dy_xhat = block_sum(buf, t)
        # rounded to the data's dtype first, as dbeta and dgamma are saved: a split step's dx
        # reads them so
        a = x.dtype.type(sum_dy) / x.dtype.type(m)
        b = x.dtype.type(sum_dy_xhat) / x.dtype.type(m)
        g = gamma[c] * inv
        for i in range(t, m, THREADS):
            n, j = i // hw, i % hw
            dx[n, c, j] = g * (dy[n, c, j] - a - (x[n, c, j] - mu) * inv * b)
        if t == 0:
            dgamma[c] = sum_dy_xhat
            dbeta[c] = sum_dy


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def backward_cpu(x, dy, gamma, mean, invstd, dx, dgamma, dbeta):
    n_, c_, hw = x.shape
    m = n_ * hw
    for c in prange(c_):
        mu, inv = mean[c], invstd[c]
        s_dy = 0.0
        s_dy_x = 0.0
        for n in range(n_):
            x_row, dy_row = x[n, c], dy[n, c]
            for j in range(hw):
                s_dy += dy_row[j]
                s_dy_x += np.float64(dy_row[j]) * np.float64(x_row[j])
        # sum(dy * xhat) = (sum(dy * x) - mean * sum(dy)) * invstd: float32 products are exact
        # in float64, so one pass loses nothing that matters against the two-pass form.
        s_dy_xhat = (s_dy_x - np.float64(mu) * s_dy) * inv
        g = gamma[c] * inv
        shift = x.dtype.type(g * s_dy / m)
        slope = x.dtype.type(g * inv * s_dy_xhat / m)
        for n in range(n_):
            x_row, dy_row, dx_row = x[n, c], dy[n, c], dx[n, c]
            for j in range(hw):
                dx_row[j] = g * dy_row[j] - slope * (x_row[j] - mu) - shift
        dgamma[c] = s_dy_xhat
        dbeta[c] = s_dy


def batchnorm_backward(x, dy, gamma, mean, invstd, dx, dgamma, dbeta, stream=None):
    """``dx``, ``dgamma``, ``dbeta`` of a training-mode forward, from its input ``x`` and its saved
    ``mean``/``invstd``. ``dx`` may be ``dy`` (or ``x``): the sums are complete before any ``dx``
    is written, and each element is then read and written by the same thread."""
    c = x.shape[1]
    x3, dy3, dx3 = nchw(x), nchw(dy), nchw(dx)
    args = (x3, dy3, *channel_views(c, gamma, mean, invstd), dx3, *channel_views(c, dgamma, dbeta))
    if on_cpu(x):
        backward_cpu(*args)
    else:
        launch(backward_cuda, min(c, 65535), THREADS, stream)(*args)
