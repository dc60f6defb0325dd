"""Convolutions as GEMMs over row windows: ``kw`` shifted copies of the input, not im2col's
``kh * kw``.

Output row ``oh`` at tap row ``i`` reads padded input row ``oh * sh + i * dh``. Copy a sample's
input once per horizontal tap ``j``, its rows in ``sh`` phases of ``Q`` rows each (phase ``p``,
row ``q``: padded row ``q * sh + p``; one phase of ``R = H + 2 * ph`` rows at stride 1)::

    xw[(c, j), p * Q + q, ow] = x_padded[c, q * sh + p, ow * sw + j * dw]     [C * kw, sh * Q * OW]

Output ``o = oh * OW + ow`` at tap ``(i, j)`` then reads ``xw[(c, j), o + offset_i]``, with
``offset_i = ((i * dh) % sh * Q + (i * dh) // sh) * OW``: tap row ``i``'s columns are a *window*
of ``xw``, a matrix BLAS reads where it lies (its rows ``sh * Q * OW`` apart). With ``W_i[o, (c,
j)] = weight[o, c, i, j]``, per sample::

    y          = sum_i W_i @ window_i(xw)                           kh GEMMs, inner C * kw
    dW_i      += dy @ window_i(xw)^T                                kh GEMMs, inner P
    window_i(dxw) += W_i^T @ dy;   dx = the copy's adjoint of dxw (a gather of its kw taps)

Against im2col + GEMM (``conv_cpu``): the same GEMM work in ``kh`` calls, a copy ``kw`` times the
input (at stride 1; ``kw * sh`` rows per output row at a vertical stride ``sh``) where im2col
writes ``kh * kw`` times the output plane, and a gather where col2im adds ``kh * kw`` taps. And
each sample goes through whole on one core (``blas_threads.run_workers``: its copy, GEMMs and
gather, single-threaded BLAS), so its ``xw`` is written and read in that core's cache; im2col +
GEMM writes a chunk's columns, then reads them back with BLAS's threads.

Deterministic: the same shapes and threads take the same calls in the same order. The forward
and ``dx`` are a sample's own (GEMMs of one sample's shapes), so a split step's equal the whole
step's. ``dW`` is summed per worker, in sample order, then the workers' sums in worker order:
its bits depend on the thread count (and are regrouped when a step is split), as BLAS's own
threads' would. Equal to im2col + GEMM up to float32 rounding (the tests compare them).
"""
import numpy as np
from numba import njit, prange

from .. import blas_threads, cblas, mkl
from ..blas_threads import run_workers, sample_runs
from ..cblas import NO_TRANS, ROW_MAJOR, TRANS
from ..registry import cpu_variant
from .rules.windows import (  # noqa: F401  (its rules, named as its own)
    MAX_SLOTS,
    WINDOWS_CHANNELS,
    WINDOWS_PLANE,
    applies,
    pays,
    sizes,
    slot_count,
    workspace_elements,
)
from .weight_grad import bias_grad

__all__ = ["applies", "pays", "MAX_SLOTS", "slot_count", "workspace_elements", "forward",
           "backward"]


def _shift_copy(x, xw, sh, sw, ph, pw, dw):
    """``xw[c, j, p * Q + q, ow] = x_padded[c, q * sh + p, ow * sw + j * dw]`` (0 in the padding)
    for one sample's ``x [C, H, W]`` and ``xw [C, kw, sh * Q, OW]``: the rows of phase ``p``."""
    channels, height, width = x.shape
    copies, rows, out_w = xw.shape[1], xw.shape[2], xw.shape[3]
    per_phase = rows // sh
    for c in range(channels):
        for j in range(copies):
            for at in range(rows):
                h = (at % per_phase) * sh + at // per_phase - ph
                dst = xw[c, j, at]
                if 0 <= h < height:
                    src = x[c, h]
                    # A test per element, as in im2col: loops split at the padding were 2-3x
                    # slower here (measured: their short runs become library calls).
                    for ow in range(out_w):
                        w = ow * sw + j * dw - pw
                        dst[ow] = src[w] if 0 <= w < width else 0
                else:
                    for ow in range(out_w):
                        dst[ow] = 0


def _gather_taps(dxw, dx, sh, sw, ph, pw, dw):
    """``dx[c, h, w] = sum of dxw[c, j, p * Q + q, ow]`` over the ``(j, p, q, ow)`` whose
    ``x_padded[c, q * sh + p, ow * sw + j * dw]`` is ``x[c, h, w]`` (``dx`` written), for one
    sample: ``shift_copy``'s adjoint, added in the copy's order."""
    channels, height, width = dx.shape
    copies, rows, out_w = dxw.shape[1], dxw.shape[2], dxw.shape[3]
    per_phase = rows // sh
    for c in range(channels):
        img = dx[c]
        for h in range(height):
            for w in range(width):
                img[h, w] = 0
        for j in range(copies):
            for at in range(rows):
                h = (at % per_phase) * sh + at // per_phase - ph
                if not 0 <= h < height:
                    continue
                src = dxw[c, j, at]
                row = img[h]
                for ow in range(out_w):     # a test per element, as in shift_copy
                    w = ow * sw + j * dw - pw
                    if 0 <= w < width:
                        row[w] += src[ow]


@njit(parallel=True, cache=True, nogil=True)
def reorder_taps(weight, reordered):
    """``reordered[i, o, c * kw + j] = weight[o, c, i, j]``: ``W_i``, a task per output."""
    out, channels, kh, kw = weight.shape
    for o in prange(out):
        for c in range(channels):
            for i in range(kh):
                for j in range(kw):
                    reordered[i, o, c * kw + j] = weight[o, c, i, j]


@njit(parallel=True, cache=True, nogil=True)
def restore_taps(grouped, weight):
    """``weight[o, c, i, j] = grouped[i, o, c * kw + j]``: ``reorder_taps``' inverse."""
    out, channels, kh, kw = weight.shape
    for o in prange(out):
        for c in range(channels):
            for i in range(kh):
                for j in range(kw):
                    weight[o, c, i, j] = grouped[i, o, c * kw + j]


shift_copy = cpu_variant(_shift_copy, "serial", False)
gather_taps = cpu_variant(_gather_taps, "serial", False)


class _Shape:
    """One layer shape's sizes and the workspace's arrays: ``reordered`` (``W_i``, ``[kh, O, C *
    kw]``), ``grouped`` (``dW`` in that order) and ``slots`` workers' ``xw [C * kw, sh * Q * OW]``
    (the input gradient's ``dxw`` after it)."""

    def __init__(self, work, slots, x_shape, weight_shape, geometry):
        (kh, kw), (sh, self.sw), (self.ph, self.pw), (dh, self.dw) = geometry
        rows, out_h, out_w, copy, weight = sizes(x_shape, weight_shape, geometry)
        out, channels = weight_shape[0], x_shape[1]
        self.sh, self.out, self.plane = sh, out, out_h * out_w
        self.reordered = work[:weight].reshape(kh, out, channels * kw)
        self.grouped = work[weight:2 * weight].reshape(kh, out, channels * kw)
        self.copies = work[2 * weight:2 * weight + slots * copy].reshape(
            slots, channels, kw, sh * rows, out_w)
        # tap row i reads padded row oh * sh + i * dh: phase (i * dh) % sh, (i * dh) // sh on
        self.offsets = [((i * dh) % sh * rows + (i * dh) // sh) * out_w for i in range(kh)]

    def windows(self, slot):
        """Slot ``slot``'s ``xw`` as 4-D (for the copy and the gather) and 2-D."""
        xw = self.copies[slot]
        return xw, xw.reshape(-1, xw.shape[2] * xw.shape[3])


_NONE4 = np.empty((0, 1, 1, 1), np.float32)
_NONE3 = np.empty((0, 1, 1), np.float32)
_NONE1 = np.empty(0, np.float32)


def forward(x, weight, bias, y, work, slots, geometry) -> None:
    """``y = conv(x, weight) + bias`` (bias may be None) through ``work``
    (``workspace_elements`` for ``slots``)."""
    shape = _Shape(work, slots, x.shape, weight.shape, geometry)
    reorder_taps(weight, shape.reordered)
    out, plane = shape.out, shape.plane
    library = mkl.library_for(shape.reordered[0], y[0].reshape(out, plane))
    runs = sample_runs(x.shape[0], slots)
    if _on_numba_threads(shape, library, runs, x, _NONE4, _NONE1 if bias is None else bias, y,
                         _NONE4, _NONE3, _NONE4):
        return

    def worker(t):
        xw, flat = shape.windows(t)
        for n in range(*runs[t]):
            shift_copy(x[n], xw, shape.sh, shape.sw, shape.ph, shape.pw, shape.dw)
            top = y[n].reshape(out, plane)
            for i, at in enumerate(shape.offsets):
                mkl.product(shape.reordered[i], flat[:, at:at + plane], top, library, i > 0)
            if bias is not None:
                top += bias.reshape(out, 1)

    run_workers(worker, len(runs))


def backward(x, dy, weight, dx, dweight, dbias, work, slots, geometry) -> None:
    """The gradients (each overwritten; None where not wanted) through ``work``
    (``workspace_elements`` for ``slots``)."""
    samples = x.shape[0]
    shape = _Shape(work, slots, x.shape, weight.shape, geometry)
    out, plane = shape.out, shape.plane
    if dbias is not None:
        bias_grad(dy.reshape(samples, out, plane), dbias)
    if dx is None and dweight is None:
        return
    if dx is not None:
        reorder_taps(weight, shape.reordered)
    library = mkl.library_for(shape.reordered[0], dy[0].reshape(out, plane))
    runs = sample_runs(samples, slots)
    # a worker's dW sum: the first's in the workspace, the others' temporaries (their number is
    # the threads', which the plan does not know; each is the weight's size)
    others = np.empty((len(runs) - 1,) + shape.grouped.shape, np.float32) \
        if dweight is not None else _NONE4
    sums = [shape.grouped] + list(others) if dweight is not None else []
    native = _on_numba_threads(shape, library, runs, x, np.ascontiguousarray(dy), _NONE1, _NONE4,
                               _NONE4 if dx is None else dx,
                               shape.grouped if dweight is not None else _NONE3, others)

    def worker(t):
        xw, flat = shape.windows(t)
        for n in range(*runs[t]):
            grad = dy[n].reshape(out, plane)
            if dweight is not None:
                shift_copy(x[n], xw, shape.sh, shape.sw, shape.ph, shape.pw, shape.dw)
                for i, at in enumerate(shape.offsets):
                    mkl.product(grad, flat[:, at:at + plane].T, sums[t][i], library,
                                n > runs[t][0])
            if dx is not None:      # xw's room, done with: dxw
                flat[:, plane:] = 0     # the columns only the later windows reach
                for i, at in enumerate(shape.offsets):
                    mkl.product(shape.reordered[i].T, grad, flat[:, at:at + plane],
                                library, i > 0)
                gather_taps(xw, dx[n], shape.sh, shape.sw, shape.ph, shape.pw, shape.dw)

    if not native:
        run_workers(worker, len(runs))
    if dweight is not None:
        for other in sums[1:]:
            shape.grouped += other
        restore_taps(shape.grouped, dweight)


def _on_numba_threads(shape, library, runs, x, dy, bias, y, dx, grouped, others) -> bool:
    """The workers' calls on Numba's threads (``_window_runs``), where
    ``blas_threads.NUMBA_THREADS`` holds and the library has a ``cblas_sgemm``; False, with
    nothing done, elsewhere. Arrays without samples stand for what is not computed."""
    gemm = cblas.sgemm(library) if blas_threads.NUMBA_THREADS else None
    if gemm is None or x.dtype != np.float32:
        return False
    with blas_threads.one_blas_thread():
        _window_runs(gemm, np.ascontiguousarray(x), dy, shape.reordered, bias, y, dx, grouped,
                     others, np.array(runs, np.int64), shape.copies,
                     np.array(shape.offsets, np.int64), shape.sh, shape.sw, shape.ph, shape.pw,
                     shape.dw, shape.plane)
    return True


@njit(parallel=True, cache=True, nogil=True)
def _window_runs(gemm, x, dy, reordered, bias, y, dx, grouped, others, runs, copies, offsets,
                 sh, sw, ph, pw, dw, plane):
    """The workers on Numba's threads (``blas_threads.NUMBA_THREADS``): worker ``t`` its samples
    ``runs[t, 0] <= n < runs[t, 1]`` in its copy ``copies[t]``, with the calls the Python
    workers make. Where ``y`` has samples, the forward; else the backward: where ``grouped`` has
    taps, ``dW``'s sums (worker 0's into ``grouped``, the others' into ``others[t - 1]``), and
    where ``dx`` has samples, ``dx``."""
    taps, out, inner = reordered.shape
    for t in prange(runs.shape[0]):
        xw = copies[t]
        flat = xw.reshape(inner, xw.shape[2] * xw.shape[3])
        width = flat.shape[1]
        sums = grouped if t == 0 or grouped.shape[0] == 0 else others[t - 1]
        for n in range(runs[t, 0], runs[t, 1]):
            if y.shape[0] > 0:
                shift_copy(x[n], xw, sh, sw, ph, pw, dw)
                top = y[n].reshape(out, plane)
                for i in range(taps):
                    gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, out, plane, inner, 1.0,
                         reordered[i].ctypes.data, inner, flat[:, offsets[i]:].ctypes.data,
                         width, 0.0 if i == 0 else 1.0, top.ctypes.data, plane)
                if bias.shape[0] > 0:
                    for o in range(out):
                        top[o] += bias[o]
                continue
            grad = dy[n].reshape(out, plane)
            if grouped.shape[0] > 0:
                shift_copy(x[n], xw, sh, sw, ph, pw, dw)
                for i in range(taps):
                    gemm(ROW_MAJOR, NO_TRANS, TRANS, out, inner, plane, 1.0, grad.ctypes.data,
                         plane, flat[:, offsets[i]:].ctypes.data, width,
                         0.0 if n == runs[t, 0] else 1.0, sums[i].ctypes.data, inner)
            if dx.shape[0] > 0:      # xw's room, done with: dxw
                flat[:, plane:] = 0     # the columns only the later windows reach
                for i in range(taps):
                    gemm(ROW_MAJOR, TRANS, NO_TRANS, inner, plane, out, 1.0,
                         reordered[i].ctypes.data, inner, grad.ctypes.data, plane,
                         0.0 if i == 0 else 1.0, flat[:, offsets[i]:].ctypes.data, width)
                gather_taps(xw, dx[n], sh, sw, ph, pw, dw)
