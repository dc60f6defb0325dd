"""Convolutions over a few input channels (a net's stem: 7x7, stride 2, over an image's three)
as im2col + GEMM in bands of output rows, each band made and used in one core's cache.

A stem's im2col columns are ``kh * kw / (sh * sw)`` times its input (12 times for ResNet's and
GoogLeNet's: 59 MiB for eight 224x224 images), so the columns of a sample, let alone of a chunk,
are written far beyond the core's cache and read back by the GEMM from memory; the direct kernels
reach half the GEMM's rate there. A band of ``rows`` output rows needs ``K = C * kh * kw`` rows
of ``rows * OW`` columns (``BAND_COLUMNS`` or more), made, multiplied and dropped in the core's
cache. Per sample and band, from output row ``r0``::

    xp[c, r, f, q] = x_padded[c, r0 * sh + r, q * sw + f]      the band's input rows, one copy
                                                              per column phase f (stride sw)
    col[(c, i, j), (oh - r0) * OW + ow] = xp[c, (oh - r0) * sh + i * dh, f, ow + s]
                       with (s, f) = divmod(j * dw, sw): each run of OW a contiguous copy
    y[n][:, band]  = W @ col                        [O, K] @ [K, rows * OW]
    dW_n          += dy[n][:, band] @ col^T         a sample's weight gradient, over its bands
    col            = W^T @ dy[n][:, band];  dx[n] += col2im(col), band after band
    dW             = dW_0 + dW_1 + ...              in sample order

Each worker (``blas_threads.run_workers``) takes a run of samples and does all of each in its
own slot of the workspace on one thread: the copies in a compiled loop (``nogil``) that calls
``cblas_sgemm`` itself (``kernels.cblas``), as ``winograd`` does.

Deterministic whatever the threads: a sample's forward, input gradient and weight gradient are
its own (the same GEMMs in the same order), and the samples' weight gradients are added in sample
order; a step split along the batch sums its chunks' (regrouped, as every engine's dW is). Equal
to im2col + GEMM up to float32 rounding (the tests compare them with float64 references).
"""
import numpy as np
from numba import njit, prange

from .. import blas_threads, cblas
from ..blas_threads import run_workers, sample_runs
from ..cblas import NO_TRANS, ROW_MAJOR, TRANS
from .rules.bands import (  # noqa: F401  (its rules, named as its own)
    BAND_COLUMNS,
    BANDS_CHANNELS,
    BANDS_OUTPUTS,
    BANDS_PLANE,
    BANDS_TAPS,
    MAX_SLOTS,
    Sizes,
    applies,
    band_rows,
    pays,
    slot_count,
    workspace_elements,
)
from .weight_grad import bias_grad

U = np.uint64   # unsigned indices: numba's negative-index wrap-around stops the vectoriser

__all__ = ["applies", "pays", "MAX_SLOTS", "band_rows", "slot_count", "workspace_elements",
           "forward", "backward"]


@njit(cache=True, nogil=True)
def _band_copy(x, xp, top, sh, sw, ph, pw):
    """``xp[c, r, f, q] = x_padded[c, top + r, q * sw + f]`` (0 in the padding and below the
    input) for one sample's ``x [C, H, W]``."""
    channels, height, width = x.shape
    rows, phases, cols = xp.shape[1], xp.shape[2], xp.shape[3]
    for c in range(channels):
        for r in range(rows):
            h = top + r - ph
            for f in range(phases):
                dst = xp[c, r, f]
                if 0 <= h < height:
                    # the columns inside the row: from q_lo, whose column f - pw + q_lo * sw is
                    # the first >= 0, to q_hi; one loop from 0 over views by an unsigned index
                    # (a test per element, and numba's wrap-around, kept it scalar)
                    q_lo = min(cols, max(0, (pw - f + sw - 1) // sw))
                    q_hi = max(q_lo, min(cols, (width - 1 - f + pw) // sw + 1))
                    for q in range(q_lo):
                        dst[q] = 0.0
                    inside, src = dst[q_lo:q_hi], x[c, h, q_lo * sw + f - pw:]
                    for q in range(q_hi - q_lo):
                        inside[U(q)] = src[U(q * sw)]
                    for q in range(q_hi, cols):
                        dst[q] = 0.0
                else:
                    dst[:] = 0.0


@njit(cache=True, nogil=True)
def _band_columns(xp, col, count, kh, kw, sh, sw, dh, dw, out_w):
    """The band's ``count`` output rows of im2col from ``xp``: contiguous runs of ``out_w``."""
    channels = xp.shape[0]
    for c in range(channels):
        for i in range(kh):
            for j in range(kw):
                dst = col[(c * kh + i) * kw + j]
                shift, phase = divmod(j * dw, sw)
                for r in range(count):
                    # a loop (a slice's copy checks for overlap) over views that start where
                    # the run does, by an unsigned index: ``dst[at + ow]`` made numba wrap a
                    # negative index around at each element, and the loop did not vectorise
                    src, run = xp[c, r * sh + i * dh, phase][shift:], dst[r * out_w:]
                    for ow in range(U(out_w)):
                        run[ow] = src[ow]


@njit(cache=True, nogil=True)
def _band_col2im(col, dx, top, count, kh, kw, sh, sw, ph, pw, dh, dw, out_w):
    """``dx += col2im(col)`` for the band of ``count`` output rows from output row ``top``,
    in ``(c, i, j, row)`` order."""
    channels, height, width = dx.shape
    for c in range(channels):
        img = dx[c]
        for i in range(kh):
            for j in range(kw):
                src = col[(c * kh + i) * kw + j]
                offset = j * dw - pw
                # the output columns whose input column 0 <= ow * sw + offset < width
                first = max(0, -(offset // sw))
                stop = min(out_w, (width - 1 - offset) // sw + 1)
                for r in range(count):
                    h = (top + r) * sh + i * dh - ph
                    if 0 <= h < height:
                        row = img[h]
                        at = r * out_w
                        for ow in range(first, stop):
                            row[ow * sw + offset] += src[at + ow]


@njit(cache=True, nogil=True)
def _samples(gemm, x, dy, weight, bias, y, dx, parts, first, stop, xp, col, band, kh, kw, sh,
             sw, ph, pw, dh, dw, out_h, out_w):
    """Samples ``first <= n < stop``, band by band. Where ``y`` has samples (``y.shape[0] >
    0``), the forward; else the backward: where ``parts`` has samples, each sample's weight
    gradient, transposed, ``parts[n] [K, O]``, and where ``dx`` has, its input gradient (``dx[n]``
    written)."""
    out, taps = weight.shape
    plane = out_h * out_w
    ld = col.shape[1]
    forward, weight_grad, input_grad = y.shape[0] > 0, parts.shape[0] > 0, dx.shape[0] > 0
    for n in range(first, stop):
        if input_grad:
            dx[n, :, :, :] = 0.0
        for top in range(0, out_h, band):
            count = min(band, out_h - top)
            width, at = count * out_w, top * out_w
            if forward or weight_grad:
                _band_copy(x[n], xp, top * sh, sh, sw, ph, pw)
                _band_columns(xp, col, count, kh, kw, sh, sw, dh, dw, out_w)
            if forward:
                gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, out, width, taps, 1.0,
                     weight.ctypes.data, taps, col.ctypes.data, ld, 0.0,
                     y[n, 0, at:].ctypes.data, plane)
                if bias.shape[0] > 0:
                    for o in range(out):
                        y[n, o, at:at + width] += bias[o]
            if weight_grad:     # dW^T = col @ dy^T: MKL ran it 1.13x dy @ col^T (session 69)
                gemm(ROW_MAJOR, NO_TRANS, TRANS, taps, out, width, 1.0,
                     col.ctypes.data, ld, dy[n, 0, at:].ctypes.data, plane,
                     0.0 if top == 0 else 1.0, parts[n].ctypes.data, out)
            if input_grad:      # the columns' room, done with: the band's columns of dx
                gemm(ROW_MAJOR, TRANS, NO_TRANS, taps, width, out, 1.0,
                     weight.ctypes.data, taps, dy[n, 0, at:].ctypes.data, plane, 0.0,
                     col.ctypes.data, ld)
                _band_col2im(col, dx[n], top, count, kh, kw, sh, sw, ph, pw, dh, dw, out_w)


class _Layout:
    """The workspace's arrays for one call: ``parts [N, K, O]`` and each slot's ``xp`` and
    ``col``."""

    def __init__(self, work, slots, x_shape, weight_shape, geometry):
        sizes = self.sizes = Sizes(x_shape, weight_shape, geometry)
        (_, _), (_, sw), _, _ = geometry
        self.parts = work[:sizes.parts].reshape(x_shape[0], sizes.taps, sizes.out)
        at = sizes.parts
        self.copies, self.columns = [], []
        for _ in range(slots):
            self.copies.append(work[at:at + sizes.copy].reshape(
                x_shape[1], sizes.in_rows, sw, sizes.phase_cols))
            at += sizes.copy
            self.columns.append(work[at:at + sizes.columns].reshape(
                sizes.taps, sizes.rows * sizes.out_w))
            at += sizes.columns


_NONE4 = np.empty((0, 1, 1, 1), np.float32)
_NONE3 = np.empty((0, 1, 1), np.float32)
_NONE1 = np.empty(0, np.float32)


def _run(x, dy, weight, bias, y, dx, work, slots, geometry, weight_grad: bool = False):
    """Deals the samples out to workers, each running ``_samples`` in its slot (the samples'
    weight gradients into the workspace's ``parts`` where ``weight_grad``); returns ``parts``."""
    layout = _Layout(work, slots, x.shape, weight.shape, geometry)
    sizes = layout.sizes
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
    w = np.ascontiguousarray(weight).reshape(sizes.out, sizes.taps)
    gemm = cblas.chosen_sgemm()[0]
    parts = layout.parts[:x.shape[0]] if weight_grad else _NONE3
    runs = sample_runs(x.shape[0], slots)
    if blas_threads.NUMBA_THREADS:
        rooms = work[sizes.parts:sizes.parts + len(runs) * (sizes.copy + sizes.columns)]
        with blas_threads.one_blas_thread():
            _sample_runs(gemm, x, dy, w, bias, y, dx, parts, np.array(runs, np.int64),
                         rooms.reshape(len(runs), -1), layout.copies[0].shape,
                         layout.columns[0].shape, sizes.rows, kh, kw, sh, sw, ph, pw, dh, dw,
                         sizes.out_h, sizes.out_w)
        return layout.parts

    def worker(t):
        _samples(gemm, x, dy, w, bias, y, dx, parts, *runs[t], layout.copies[t],
                 layout.columns[t], sizes.rows, kh, kw, sh, sw, ph, pw, dh, dw, sizes.out_h,
                 sizes.out_w)

    run_workers(worker, len(runs))
    return layout.parts


@njit(parallel=True, cache=True, nogil=True)
def _sample_runs(gemm, x, dy, weight, bias, y, dx, parts, runs, rooms, copy_shape,
                 columns_shape, band, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w):
    """``_samples`` for each worker ``t`` on a thread of Numba's (``blas_threads.NUMBA_THREADS``):
    samples ``runs[t, 0] <= n < runs[t, 1]`` in its room ``rooms[t]`` (``_Layout``'s copy, then
    its columns)."""
    copy = copy_shape[0] * copy_shape[1] * copy_shape[2] * copy_shape[3]
    for t in prange(runs.shape[0]):
        room = rooms[t]
        _samples(gemm, x, dy, weight, bias, y, dx, parts, runs[t, 0], runs[t, 1],
                 room[:copy].reshape(copy_shape),
                 room[copy:copy + columns_shape[0] * columns_shape[1]].reshape(columns_shape),
                 band, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w)


def forward(x, weight, bias, y, work, slots, geometry) -> None:
    """``y = conv(x, weight) + bias`` (bias may be None) through ``work``
    (``workspace_elements`` for ``slots``)."""
    samples, out = y.shape[0], y.shape[1]
    _run(np.ascontiguousarray(x), _NONE3, weight,
         _NONE1 if bias is None else np.ascontiguousarray(bias), y.reshape(samples, out, -1),
         _NONE4, work, slots, geometry)


def backward(x, dy, weight, dx, dweight, dbias, work, slots, geometry) -> None:
    """The gradients (each overwritten; None where not wanted) through ``work``
    (``workspace_elements`` for ``slots``): one pass over the samples for both ``dW`` and
    ``dx``."""
    samples, out = dy.shape[0], dy.shape[1]
    dy3 = np.ascontiguousarray(dy).reshape(samples, out, -1)
    if dbias is not None:
        bias_grad(dy3, dbias)
    if dweight is None and dx is None:
        return
    parts = _run(np.ascontiguousarray(x), dy3, weight, _NONE1, _NONE3,
                 _NONE4 if dx is None else dx, work, slots, geometry,
                 weight_grad=dweight is not None)
    if dweight is not None:
        total = dweight.reshape(out, -1)
        total[...] = parts[0].T
        for n in range(1, samples):     # in sample order, whatever the workers
            total += parts[n].T
