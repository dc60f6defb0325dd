"""Softmax cross-entropy loss and accuracy.

Shapes: ``logits``, ``prob``, ``dlogits`` ``[N, K]`` (float32 or float64); ``labels`` ``[N]`` int32;
``loss`` ``[N]``; ``mean_loss`` ``[1]``; ``count`` ``[1]`` int32.

Forward, per row ``n`` with ``m = max_k z[n, k]`` (subtracted so no ``exp`` overflows)::

    prob[n, k] = exp(z[n, k] - m) / S,   S = sum_k exp(z[n, k] - m)
    loss[n]    = log(S) - (z[n, label[n]] - m)          ( = -log prob[n, label[n]], without the
                                                          underflow of log(prob) for tiny prob )
    mean_loss  = sum_n loss[n] / N

A label outside ``[0, K)`` gives ``loss[n] = NaN`` (kernels cannot raise; NaN cannot go unnoticed).
Backward, for the loss ``loss_weight * mean_loss``::

    dlogits[n, k] = (prob[n, k] - [k == label[n]]) * loss_weight / N

All sums are fixed-order shared-memory tree reductions (CUDA) or sequential loops (CPU): run to run
deterministic.
"""
import math

import numpy as np
from numba import int32, njit, prange

from ..lazy_cuda import cuda
from .common import block_max, block_sum, grid_1d, launch, view
from .registry import cuda_kernel, on_cpu

__all__ = ["softmax_xent_forward", "batch_mean", "softmax_xent_backward", "accuracy"]

ROW_THREADS = 128   # one block per row of logits
SUM_THREADS = 256   # the single block of the mean and count reductions

_F = (("float32[:, ::1]", "float32[::1]", "float32"),
      ("float64[:, ::1]", "float64[::1]", "float64"))


def _sigs(pattern):
    return [pattern.replace("M", m).replace("V", v).replace("S", s) for m, v, s in _F]


def _labels(labels, n):
    if labels.dtype != np.int32 or labels.size != n:
        raise ValueError(f"labels must be int32 [{n}], got {labels.dtype} {labels.shape}")
    return view(labels, n)


@cuda_kernel(*_sigs("void(M, int32[::1], M, V)"), block=ROW_THREADS)
def softmax_xent_forward_cuda(z, labels, prob, loss):
    buf = cuda.shared.array(ROW_THREADS, dtype=z.dtype)
    t = cuda.threadIdx.x
    k_ = z.shape[1]
    for n in range(cuda.blockIdx.x, z.shape[0], cuda.gridDim.x):
        m = z[n, 0]
        for k in range(t, k_, ROW_THREADS):
            v = z[n, k]
            if v > m or v != v:
                m = v
        buf[t] = m
        m = block_max(buf, t)
        s = z.dtype.type(0)
        for k in range(t, k_, ROW_THREADS):
            e = math.exp(z[n, k] - m)
            prob[n, k] = e
            s += e
        buf[t] = s
        s = block_sum(buf, t)
        for k in range(t, k_, ROW_THREADS):  # the same thread wrote these: no barrier needed
            prob[n, k] = prob[n, k] / s
        if t == 0:
            lab = labels[n]
            if 0 <= lab < k_:
                loss[n] = math.log(s) - (z[n, lab] - m)
            else:
                loss[n] = math.nan


@njit(parallel=True, cache=True, nogil=True)
def softmax_xent_forward_cpu(z, labels, prob, loss):
    k_ = z.shape[1]
    for n in prange(z.shape[0]):
        m = z[n, 0]
        for k in range(k_):
            v = z[n, k]
            if v > m or v != v:
                m = v
        s = z.dtype.type(0)
        for k in range(k_):
            e = math.exp(z[n, k] - m)
            prob[n, k] = e
            s += e
        for k in range(k_):
            prob[n, k] = prob[n, k] / s
        lab = labels[n]
        if 0 <= lab < k_:
            loss[n] = math.log(s) - (z[n, lab] - m)
        else:
            loss[n] = math.nan


@cuda_kernel("void(float32[::1], float32[::1])", "void(float64[::1], float64[::1])",
             block=SUM_THREADS)
def mean_cuda(src, out):
    buf = cuda.shared.array(SUM_THREADS, dtype=src.dtype)
    t = cuda.threadIdx.x
    acc = src.dtype.type(0)
    for i in range(t, src.size, SUM_THREADS):
        acc += src[i]
    buf[t] = acc
    total = block_sum(buf, t)
    if t == 0:
        out[0] = total / src.dtype.type(src.size)


@njit(cache=True, nogil=True)
def mean_cpu(src, out):
    acc = src.dtype.type(0)
    for i in range(src.size):
        acc += src[i]
    out[0] = acc / src.dtype.type(src.size)


def softmax_xent_forward(logits, labels, prob, loss, mean_loss=None, stream=None):
    """Probabilities ``prob``, per-sample ``loss`` and, when ``mean_loss`` (``[1]``) is given, the
    mean over the batch (see the module docstring)."""
    n, k = logits.shape
    if tuple(prob.shape) != (n, k) or loss.size != n:
        raise ValueError(f"softmax: logits {logits.shape}, labels {labels.shape}, "
                         f"prob {prob.shape}, loss {loss.shape}")
    args = (view(logits, n, k), _labels(labels, n), view(prob, n, k), view(loss, n))
    if on_cpu(logits):
        softmax_xent_forward_cpu(*args)
    else:
        launch(softmax_xent_forward_cuda, min(n, 65535), ROW_THREADS, stream)(*args)
    if mean_loss is not None:
        batch_mean(loss, mean_loss, stream)


def batch_mean(loss, mean_loss, stream=None):
    """``mean_loss[0] = sum(loss) / loss.size``, in the fixed order of ``mean_cpu`` /
    ``mean_cuda``: the mean of the per-sample losses, for the whole batch at once."""
    src = view(loss, loss.size)
    if on_cpu(loss):
        mean_cpu(src, view(mean_loss, 1))
    else:
        launch(mean_cuda, 1, SUM_THREADS, stream)(src, view(mean_loss, 1))


@cuda_kernel(*_sigs("void(M, int32[::1], S, M)"))
def softmax_xent_backward_cuda(prob, labels, w, dz):
    k_ = prob.shape[1]
    for i in range(cuda.grid(1), prob.size, cuda.gridsize(1)):
        n, k = i // k_, i % k_
        p = prob[n, k]
        if labels[n] == k:
            p -= prob.dtype.type(1)
        dz[n, k] = p * w


@njit(parallel=True, cache=True, nogil=True)
def softmax_xent_backward_cpu(prob, labels, w, dz):
    for n in prange(prob.shape[0]):
        for k in range(prob.shape[1]):
            p = prob[n, k]
            if labels[n] == k:
                p -= prob.dtype.type(1)
            dz[n, k] = p * w


def softmax_xent_backward(prob, labels, dlogits, loss_weight=1.0, stream=None, batch=None):
    """``dlogits = (prob - onehot(labels)) * loss_weight / N``; ``dlogits`` may be ``prob``.
    ``N`` is ``batch`` when given (the rows are a chunk of a larger batch), else the rows."""
    n, k = prob.shape
    if tuple(dlogits.shape) != (n, k):
        raise ValueError(f"softmax backward: prob {prob.shape}, dlogits {dlogits.shape}")
    w = prob.dtype.type(loss_weight / (batch or n))   # 1/N folded in on the host, in double
    args = (view(prob, n, k), _labels(labels, n), w, view(dlogits, n, k))
    if on_cpu(prob):
        softmax_xent_backward_cpu(*args)
    else:
        launch(softmax_xent_backward_cuda, *grid_1d(n * k), stream)(*args)


@cuda_kernel("void(float32[:, ::1], int32[::1], int64, int32[::1])",
             "void(float64[:, ::1], int32[::1], int64, int32[::1])", block=SUM_THREADS)
def accuracy_cuda(z, labels, top_k, count):
    buf = cuda.shared.array(SUM_THREADS, dtype=int32)
    t = cuda.threadIdx.x
    hits = 0
    for n in range(t, z.shape[0], SUM_THREADS):   # one thread per row: K compares, no reduction
        lab = labels[n]
        if 0 <= lab < z.shape[1]:
            mine = z[n, lab]
            above = 0
            for k in range(z.shape[1]):
                if z[n, k] > mine:
                    above += 1
            if above < top_k:
                hits += 1
    buf[t] = hits
    total = block_sum(buf, t)
    if t == 0:
        count[0] = total


@njit(cache=True, nogil=True)
def accuracy_cpu(z, labels, top_k, count):
    hits = 0
    for n in range(z.shape[0]):
        lab = labels[n]
        if 0 <= lab < z.shape[1]:
            above = 0
            for k in range(z.shape[1]):
                if z[n, k] > z[n, lab]:
                    above += 1
            if above < top_k:
                hits += 1
    count[0] = hits


def accuracy(logits, labels, count, top_k=1, stream=None):
    """``count[0]`` (int32) = number of rows whose label is among the ``top_k`` highest logits: a
    row counts when fewer than ``top_k`` classes score strictly higher than its label (Caffe's rule:
    ties count in the label's favour). Divide by N on the host for a rate."""
    n, k = logits.shape
    if count.size != 1 or count.dtype != np.int32:
        raise ValueError(f"accuracy: count must be int32 [1], got {count.dtype} {count.shape}")
    args = (view(logits, n, k), _labels(labels, n), int(top_k), view(count, 1))
    if on_cpu(logits):
        accuracy_cpu(*args)
    else:
        launch(accuracy_cuda, 1, SUM_THREADS, stream)(*args)
