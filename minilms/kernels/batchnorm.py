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
float32 sums drift. CUDA: a grid-wide reduction in two stages through a float64 workspace,
``stats`` (``batchnorm_sums``: one warp per piece of a row, then one block per channel over the
pieces; deterministic), then an elementwise pass over the grid. CPU: per channel in float64 over
vector lanes.

A step split along the batch runs the same arithmetic in pieces: ``batchnorm_split``.
"""
import math

import numpy as np
from numba import njit, prange

from ..lazy_cuda import cuda
from .batchnorm_sums import (
    THREADS,
    channel_views,
    cuda_grad_sums,
    cuda_invstd,
    cuda_mean,
    cuda_param_grads,
    cuda_sums,
    nchw,
    signatures,
    stats_shape,
)
from .common import grid_planes, launch
from .elementwise import relu_forward
from .registry import cuda_kernel, on_cpu

__all__ = ["batchnorm_forward_train", "batchnorm_normalize", "batchnorm_forward_inference",
           "batchnorm_relu_mask", "batchnorm_backward", "batchnorm_param_grads",
           "batchnorm_input_grad", "THREADS", "SUMS",
           "signatures", "nchw", "channel_views", "stats_shape", "cuda_stats"]

# The CPU sums run in float64 with reassociation allowed, so LLVM splits them over vector lanes
# (measured faster on backward); the order then depends on the vector width only, not the threads.
SUMS = {"reassoc", "contract"}


def planes(x3):
    """The grid of an element-wise kernel over ``x3``'s ``(sample, channel)`` planes."""
    n, c, hw = x3.shape
    return grid_planes(n * c, hw)


def cuda_stats(stats, x):
    """``stats``, the float64 workspace the CUDA sums need (``stats_shape``), or a clear error."""
    if stats is None:
        n, c = x.shape[:2]
        raise ValueError("batch norm on cuda needs its float64 stats workspace, shape "
                         f"{stats_shape(c, n, x.size // (n * c))} (stats_shape): the layer "
                         "declares it when set up for cuda (Layer.setup's device_kind)")
    return stats


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def forward_train_cpu(x, gamma, beta, y, mean, invstd, running_mean, running_var, momentum, eps,
                      relu):
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
        normalize_channel(x, y, c, mu, gamma[c] * inv, beta[c], relu)
        mean[c] = mu
        invstd[c] = inv
        running_mean[c] = (one - momentum) * running_mean[c] + momentum * mu
        running_var[c] = (one - momentum) * running_var[c] + momentum * x.dtype.type(acc / (m - 1))


def batchnorm_forward_train(x, gamma, beta, y, mean, invstd, running_mean, running_var,
                            momentum=0.1, eps=1e-5, stream=None, stats=None, relu=False):
    """Normalise with batch statistics, save ``mean``/``invstd`` (``[C]``) for backward and update
    the running statistics in place. ``y`` may be ``x``. On CUDA, ``stats`` is the float64
    workspace of the sums (``stats_shape``). ``relu``: ``y = max(y, 0)`` (``relu_forward``'s
    bits), on the CPU a channel at a time while it is in cache."""
    c = x.shape[1]
    x3, y3 = nchw(x), nchw(y)
    m = x3.size // c
    if m < 2:
        raise ValueError("batch norm in training needs more than one value per channel")
    mean, invstd, running_mean, running_var = channel_views(c, mean, invstd, running_mean,
                                                            running_var)
    if on_cpu(x):
        t = x3.dtype.type
        forward_train_cpu(x3, *channel_views(c, gamma, beta), y3, mean, invstd, running_mean,
                          running_var, t(momentum), t(eps), relu)
        return
    stats = cuda_stats(stats, x)
    cuda_sums(x3, 0, stats, False, stream)
    cuda_mean(stats, m, mean, stream)
    cuda_sums(x3, 0, stats, True, stream)
    cuda_invstd(stats, m, mean, invstd, running_mean, running_var, momentum, eps, stream)
    batchnorm_normalize(x, gamma, beta, mean, invstd, y, stream, relu)


@cuda_kernel(*signatures("void(X, V, V, V, V, X)"))
def normalize_cuda(x, gamma, beta, mean, invstd, y):
    n_, c_, hw = x.shape
    for plane in range(cuda.blockIdx.y, n_ * c_, cuda.gridDim.y):      # grid_planes
        n = plane // c_
        c = plane - n * c_
        g = gamma[c] * invstd[c]        # as forward_train_cpu: g, then (x - mu) * g + b
        mu, b = mean[c], beta[c]
        for j in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, hw,
                       cuda.gridDim.x * cuda.blockDim.x):
            y[n, c, j] = (x[n, c, j] - mu) * g + b


@njit(inline="always", cache=True, nogil=True)
def normalize_channel(x, y, c, mu, g, b, relu):
    """``y = (x - mu) * g + b`` on channel ``c`` of ``x [N, C, HW]``, and with ``relu``
    ``relu_forward``'s test on each value as it is written: one pass. ``g`` and ``b`` come in
    as values: read from ``gamma`` and ``beta`` inside the loop they might alias ``y``, and LLVM
    reloaded them every element instead of vectorising (a separate ReLU pass cost another)."""
    for n in range(x.shape[0]):
        x_row, y_row = x[n, c], y[n, c]
        if relu:
            for j in range(x.shape[2]):
                v = (x_row[j] - mu) * g + b
                y_row[j] = 0 if v <= 0 else v
        else:
            for j in range(x.shape[2]):
                y_row[j] = (x_row[j] - mu) * g + b


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def normalize_cpu(x, gamma, beta, mean, invstd, y, relu):
    n_, c_, hw = x.shape
    for c in prange(c_):          # as forward_train_cpu's last pass, with its flags
        normalize_channel(x, y, c, mean[c], gamma[c] * invstd[c], beta[c], relu)


def batchnorm_normalize(x, gamma, beta, mean, invstd, y, stream=None, relu=False):
    """``y = (x - mean) * (gamma * invstd) + beta`` with given statistics (``[C]``), in the
    training forward's own expression and rounding: a recompute's forward with the saved
    statistics (the first forward's ``y`` again, bit for bit; nothing else read or written), a
    split step's per-chunk pass, and on CUDA the training forward's last pass. ``y`` may be
    ``x``. ``relu``: then ``y = max(y, 0)``."""
    c = x.shape[1]
    x3, y3 = nchw(x), nchw(y)
    args = (x3, *channel_views(c, gamma, beta, mean, invstd), y3)
    if on_cpu(x):
        normalize_cpu(*args, relu)
    else:
        launch(normalize_cuda, *planes(x3), stream)(*args)
        if relu:
            relu_forward(y, y, stream)


@cuda_kernel(*signatures("void(X, V, V, V, V, X, S)"))
def forward_inference_cuda(x, gamma, beta, running_mean, running_var, y, eps):
    n_, c_, hw = x.shape
    for plane in range(cuda.blockIdx.y, n_ * c_, cuda.gridDim.y):      # grid_planes
        n = plane // c_
        c = plane - n * c_
        inv = x.dtype.type(1) / math.sqrt(running_var[c] + eps)
        g, mu, b = gamma[c] * inv, running_mean[c], beta[c]
        for j in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, hw,
                       cuda.gridDim.x * cuda.blockDim.x):
            y[n, c, j] = (x[n, c, j] - mu) * g + b


@njit(parallel=True, cache=True, nogil=True)
def forward_inference_cpu(x, gamma, beta, running_mean, running_var, y, eps):
    n_, c_, hw = x.shape
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        inv = x.dtype.type(1) / math.sqrt(running_var[c] + eps)
        g, mu, b = gamma[c] * inv, running_mean[c], beta[c]     # values: see normalize_channel
        for j in range(hw):
            y[n, c, j] = (x[n, c, j] - mu) * g + b


@cuda_kernel(*signatures("void(X, V, V, V, V, X, X)"))
def relu_mask_cuda(x, gamma, beta, mean, invstd, dy, out):
    n_, c_, hw = x.shape
    for plane in range(cuda.blockIdx.y, n_ * c_, cuda.gridDim.y):      # grid_planes
        n = plane // c_
        c = plane - n * c_
        g = gamma[c] * invstd[c]        # normalize_cuda's y, then relu_backward's branch
        mu, b = mean[c], beta[c]
        for j in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, hw,
                       cuda.gridDim.x * cuda.blockDim.x):
            if (x[n, c, j] - mu) * g + b <= 0:
                out[n, c, j] = 0
            else:
                out[n, c, j] = dy[n, c, j]


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def relu_mask_cpu(x, gamma, beta, mean, invstd, dy, out):
    n_, c_, hw = x.shape
    zero = dy.dtype.type(0)
    for c in prange(c_):
        mu, b = mean[c], beta[c]
        g = gamma[c] * invstd[c]        # normalize_cpu's y, with its flags
        for n in range(n_):
            x_row, dy_row, out_row = x[n, c], dy[n, c], out[n, c]
            for j in range(hw):
                if (x_row[j] - mu) * g + b <= 0:
                    out_row[j] = zero
                else:
                    out_row[j] = dy_row[j]


def batchnorm_relu_mask(x, gamma, beta, mean, invstd, dy, out, stream=None):
    """``out = relu_backward(y, dy)`` for ``y``, the training forward's output with these
    statistics (made again from ``x`` with ``batchnorm_normalize``'s expression and flags, so the
    same bits: ``y`` need not be kept): the gradient a fused ReLU passes back. ``out`` may be
    ``dy``."""
    c = x.shape[1]
    x3 = nchw(x)
    args = (x3, *channel_views(c, gamma, beta, mean, invstd), nchw(dy), nchw(out))
    if on_cpu(x):
        relu_mask_cpu(*args)
    else:
        launch(relu_mask_cuda, *planes(x3), stream)(*args)


def batchnorm_forward_inference(x, gamma, beta, running_mean, running_var, y, eps=1e-5,
                                stream=None, relu=False):
    """Normalise with the running statistics; nothing is updated. ``y`` may be ``x``. ``relu``:
    then ``y = max(y, 0)``."""
    c = x.shape[1]
    x3, y3 = nchw(x), nchw(y)
    args = (x3, *channel_views(c, gamma, beta, running_mean, running_var), y3, x3.dtype.type(eps))
    if on_cpu(x):
        forward_inference_cpu(*args)
    else:
        launch(forward_inference_cuda, *planes(x3), stream)(*args)
    if relu:
        relu_forward(y, y, stream)


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


@njit(parallel=True, cache=True, nogil=True, fastmath=SUMS)
def backward_relu_cpu(x, dy, gamma, beta, mean, invstd, dx, dgamma, dbeta):
    """``backward_cpu`` behind a fused ReLU: ``dy`` masked where the forward's ``y <= 0``, ``y``
    made again from ``x`` (the forward's expression and flags). Its sums are ``backward_cpu``'s
    loop over the masked ``dy`` (written into ``dx``, read again from cache), so they group as
    its do (with reassociation allowed, a loop of another shape may not)."""
    n_, c_, hw = x.shape
    m = n_ * hw
    zero = dy.dtype.type(0)
    for c in prange(c_):
        mu, inv, b = mean[c], invstd[c], beta[c]     # values: see normalize_channel
        gm = gamma[c] * inv
        for n in range(n_):
            x_row, dy_row, dx_row = x[n, c], dy[n, c], dx[n, c]
            for j in range(hw):
                if (x_row[j] - mu) * gm + b <= 0:
                    dx_row[j] = zero
                else:
                    dx_row[j] = dy_row[j]
        s_dy = 0.0
        s_dy_x = 0.0
        for n in range(n_):
            x_row, dy_row = x[n, c], dx[n, c]
            for j in range(hw):
                s_dy += dy_row[j]
                s_dy_x += np.float64(dy_row[j]) * np.float64(x_row[j])
        s_dy_xhat = (s_dy_x - np.float64(mu) * s_dy) * inv
        g = gamma[c] * inv          # gm's value, made where backward_cpu makes it: see above
        shift = x.dtype.type(g * s_dy / m)
        slope = x.dtype.type(g * inv * s_dy_xhat / m)
        # masked again, not read back from dx: a loop in place does not vectorise
        for n in range(n_):
            x_row, dy_row, dx_row = x[n, c], dy[n, c], dx[n, c]
            for j in range(hw):
                d = dy_row[j]
                if (x_row[j] - mu) * gm + b <= 0:
                    d = zero
                dx_row[j] = g * d - slope * (x_row[j] - mu) - shift
        dgamma[c] = s_dy_xhat
        dbeta[c] = s_dy


def batchnorm_backward(x, dy, gamma, mean, invstd, dx, dgamma, dbeta, stream=None, stats=None,
                       beta=None):
    """``dx``, ``dgamma``, ``dbeta`` of a training-mode forward, from its input ``x`` and its saved
    ``mean``/``invstd``. ``dx`` may be ``dy`` (or ``x``): the sums are complete before any ``dx``
    is written, and each element is then read and written by the same thread. On CUDA, ``stats``
    is the float64 workspace of the sums (``stats_shape``). ``beta`` given: the forward had a
    fused ReLU, and ``dy`` is first masked where its output was ``<= 0`` (``batchnorm_relu_mask``:
    the output made again from ``x``, so backward need not keep it)."""
    c = x.shape[1]
    x3, dy3 = nchw(x), nchw(dy)
    if beta is not None and not on_cpu(x):
        batchnorm_relu_mask(x, gamma, beta, mean, invstd, dy, dx, stream)
        dy, dy3 = dx, nchw(dx)
    gamma, mean, invstd, dgamma, dbeta = channel_views(c, gamma, mean, invstd, dgamma, dbeta)
    if on_cpu(x) and beta is not None:
        backward_relu_cpu(x3, dy3, gamma, channel_views(c, beta)[0], mean, invstd, nchw(dx),
                          dgamma, dbeta)
        return
    if on_cpu(x):
        backward_cpu(x3, dy3, gamma, mean, invstd, nchw(dx), dgamma, dbeta)
        return
    stats = cuda_stats(stats, x)
    cuda_grad_sums(x3, dy3, 0, mean, invstd, stats, stream)
    cuda_param_grads(stats, dgamma, dbeta, stream)
    batchnorm_input_grad(x, dy, gamma, mean, invstd, dgamma, dbeta, x3.size // c, dx, stream)


@njit(parallel=True, cache=True)
def param_grads_cpu(x, dy, mean, invstd, dgamma, dbeta):
    n_, c_, hw = x.shape
    for c in prange(c_):
        mu, inv = mean[c], invstd[c]
        s_dy = 0.0
        s_dy_xhat = 0.0
        for n in range(n_):
            for j in range(hw):
                s_dy += dy[n, c, j]
                s_dy_xhat += dy[n, c, j] * ((x[n, c, j] - mu) * inv)
        dgamma[c] = s_dy_xhat
        dbeta[c] = s_dy


def batchnorm_param_grads(x, dy, mean, invstd, dgamma, dbeta, stream=None, stats=None) -> None:
    """Parameter gradients alone, for a backward that needs no dx (a BatchNorm fed by the data:
    ``batchnorm_backward`` always writes dx, and a dx scratch would be batch-proportional):
    ``dgamma = sum(dy * xhat)``, ``dbeta = sum(dy)`` per channel (overwritten); on CUDA
    backward's own two stages (``batchnorm_sums``) through ``stats``."""
    mean, invstd, dgamma, dbeta = channel_views(x.shape[1], mean, invstd, dgamma, dbeta)
    if on_cpu(x):
        param_grads_cpu(nchw(x), nchw(dy), mean, invstd, dgamma, dbeta)
        return
    cuda_grad_sums(nchw(x), nchw(dy), 0, mean, invstd, cuda_stats(stats, x), stream)
    cuda_param_grads(stats, dgamma, dbeta, stream)


@cuda_kernel(*signatures("void(X, X, V, V, V, V, V, int64, X)"))
def input_grad_cuda(x, dy, gamma, mean, invstd, dgamma, dbeta, m, dx):
    n_, c_, hw = x.shape
    for plane in range(cuda.blockIdx.y, n_ * c_, cuda.gridDim.y):      # grid_planes
        n = plane // c_
        c = plane - n * c_
        mu, inv = mean[c], invstd[c]
        # dbeta and dgamma as saved, in the data's dtype: a whole step and a split one read
        # the same numbers
        a = dbeta[c] / x.dtype.type(m)
        b = dgamma[c] / x.dtype.type(m)
        g = gamma[c] * inv
        for j in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, hw,
                       cuda.gridDim.x * cuda.blockDim.x):
            dx[n, c, j] = g * (dy[n, c, j] - a - (x[n, c, j] - mu) * inv * b)


def batchnorm_input_grad(x, dy, gamma, mean, invstd, dgamma, dbeta, m, dx, stream=None):
    """CUDA: ``dx`` of ``x``'s samples from the step's ``dgamma``/``dbeta`` over ``m`` values a
    channel (the last pass of backward, whole or per chunk). ``dx`` may be ``dy``."""
    c = x.shape[1]
    x3, dy3, dx3 = nchw(x), nchw(dy), nchw(dx)
    launch(input_grad_cuda, *planes(x3), stream)(
        x3, dy3, *channel_views(c, gamma, mean, invstd, dgamma, dbeta), np.int64(m), dx3)
