"""Convolution on the ``cpu`` device, a chunk of samples at a time: few calls, large GEMMs.

The per-sample loop (one im2col, one GEMM and one bias GEMM per sample and group, each a Python
call on a small matrix) spends most of its time in call overhead and thread-pool wake-ups. Here a
chunk of ``k`` samples costs one batched im2col (Numba, parallel over ``(sample, col row)``), one
GEMM per group (numpy's matmul, BLAS in C) and one numpy pass for the bias, whatever ``k`` is.

Notation as in ``minilms.layers.convolution``: ``G`` groups, ``O = G * Og`` outputs, ``C = G * Cg``
channels, ``Kt = C * kh * kw`` col rows (``Kg = Kt / G`` per group, a group's rows are consecutive),
``P = out_h * out_w``.

Forward: ``col[k, Kt, P]`` (sample-major), then ``top[n, g] = weight_g @ col[n, rows of g]`` as one
broadcast matmul straight into the NCHW output (no staging), then ``top += bias``.

Backward: the sums over samples are GEMMs with a long inner dimension when the chunk's columns
are side by side: ``col[Kt, k * P]`` (column ``n * P + p``) and ``dyT[O, k * P]`` (``dy`` of the
chunk, its sample and channel axes swapped)::

    dbias   += sum over the columns of dyT
    dweight_g += dyT_g @ col_g^T                   [Og, Kg]
    col_g    = weight_g^T @ dyT_g                  [Kg, k * P], in place of col
    dx[chunk] = col2im(col)                        (written, not added)

Deterministic: the same shapes take the same calls and the same summation order every run (the
first chunk writes ``dweight``/``dbias``, later chunks add in order). Arrays are numpy only.
"""
import numpy as np
from numba import njit, prange

from . import slotted
from .blas_threads import matmul
from .gemm import gemm
from .im2col import PARALLEL_MIN, source_index
from .registry import cpu_variant

source_cpu = source_index.cpu   # a plain global: what Numba can call from compiled code
U = np.uint64                   # unsigned indices: no wrap-around test to stop the vectoriser

__all__ = ["im2col_batch", "col2im_batch", "conv_forward", "conv_backward"]


def _im2col_kernel(side_by_side: bool):
    """The batched im2col for one layout of ``col`` (C-contiguous, 3-D): ``[k, Kt, P]``, or
    ``[Kt, k, P]`` when ``side_by_side`` (a closure constant: each variant compiles its own
    indexing). 3-D C arrays, not a flat one with computed offsets: Numba vectorises the former's
    rows and not the latter's (measured faster)."""
    def im2col_batch(x, col, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w):
        samples, channels, height, width = x.shape
        # One (sample, channel) per task, its kh * kw rows of col: integer divisions (slow) once
        # per task, not once per row. Ordered as col is, so consecutive tasks write close by.
        for task in prange(samples * channels):
            if side_by_side:
                c, n = task // samples, task % samples
            else:
                n, c = task // channels, task % channels
            for i in range(kh):
                for j in range(kw):
                    row = (c * kh + i) * kw + j
                    dst = col[row, n] if side_by_side else col[n, row]
                    lo, hi, off = _inside_stride2(j, pw, dw, width, out_w)
                    for oh in range(out_h):
                        h = source_cpu(oh, i, sh, ph, dh)
                        at = oh * out_w
                        if 0 <= h < height and sw == 2 and dw == 1:
                            # A horizontal stride of 2: the columns inside the row without a
                            # test, at a constant stride, vectorise (every other element).
                            src = x[n, c, h]
                            for ow in range(lo):
                                dst[U(at + ow)] = 0
                            for ow in range(lo, hi):
                                dst[U(at + ow)] = src[U(2 * ow + off)]
                            for ow in range(hi, out_w):
                                dst[U(at + ow)] = 0
                        elif 0 <= h < height:
                            # A test per element, not loops split at the padding: their short
                            # runs become memset/memmove calls at stride 1, several times slower.
                            for ow in range(out_w):
                                w = source_cpu(ow, j, sw, pw, dw)
                                if 0 <= w < width:
                                    dst[at + ow] = x[n, c, h, w]
                                else:
                                    dst[at + ow] = 0
                        else:
                            for ow in range(out_w):
                                dst[at + ow] = 0
    return im2col_batch


@njit(inline="always")
def _inside_stride2(j, pw, dw, width, out_w):
    """``(lo, hi, off)``: at a horizontal stride of 2, tap ``j`` reads column ``2 * ow + off``,
    inside the row for the outputs ``lo <= ow < hi``."""
    off = j * dw - pw
    lo = min(out_w, max(0, (1 - off) // 2))
    return lo, max(lo, min(out_w, (width - 1 - off) // 2 + 1)), off


def _col2im_kernel(side_by_side: bool):
    """The batched col2im, ``col`` laid out as for ``_im2col_kernel(side_by_side)``."""
    def col2im_batch(col, x, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w):
        channels, height, width = x.shape[1], x.shape[2], x.shape[3]
        # One (sample, channel) per task: overlapping patches add only into their own channel,
        # in tap order, so every pixel's sum has the same order whatever the threads do.
        for task in prange(x.shape[0] * channels):
            n, c = task // channels, task % channels
            img = x[n, c]
            for h in range(height):
                for w in range(width):
                    img[h, w] = 0
            for i in range(kh):
                for j in range(kw):
                    row = (c * kh + i) * kw + j
                    src = col[row, n] if side_by_side else col[n, row]
                    for oh in range(out_h):
                        h = source_cpu(oh, i, sh, ph, dh)
                        if 0 <= h < height:
                            at = oh * out_w
                            for ow in range(out_w):  # a test per element, as in im2col
                                w = source_cpu(ow, j, sw, pw, dw)
                                if 0 <= w < width:
                                    img[h, w] += src[at + ow]
    return col2im_batch


# [parallel][side_by_side]. Small chunks are done faster by one thread than the thread pool wakes
# up (see im2col.PARALLEL_MIN): the same code compiled serial. Each variant is cached on disk.
def _variants(make):
    return {par: {side: cpu_variant(make(side), f"{'par' if par else 'serial'}_"
                                    f"{'side' if side else 'stacked'}", par)
                  for side in (False, True)} for par in (False, True)}


_IM2COL = _variants(_im2col_kernel)
_COL2IM = _variants(_col2im_kernel)


def _layout(x, col, kernel_size, stride, padding, dilation):
    """``(side_by_side, col as 3-D, geometry...)`` for ``col`` given as ``[k, Kt, P]`` (sample
    after sample) or ``[Kt, k * P]`` (the samples' columns side by side; wider, the first ``k *
    P`` columns: ``kernels.slotted``), C-contiguous."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
    out_h = (x.shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (x.shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    samples, rows, plane = x.shape[0], x.shape[1] * kh * kw, out_h * out_w
    if col.shape == (samples, rows, plane):
        side_by_side, col3 = False, col
    elif col.ndim == 2 and col.shape[0] == rows and col.shape[1] >= samples * plane:
        side_by_side, col3 = True, col[:, :samples * plane].reshape(rows, samples, plane)
    else:
        raise ValueError(f"col {col.shape}: expected {(samples, rows, plane)} or "
                         f"{(rows, samples * plane)} for a batch {x.shape}")
    if x.dtype != col.dtype or not (x.flags.c_contiguous and col.flags.c_contiguous):
        raise ValueError("im2col_batch/col2im_batch need C-contiguous x and col of one dtype")
    return side_by_side, col3, (kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w)


def im2col_batch(x, col, kernel_size, stride, padding, dilation):
    """``im2col`` of every sample of ``x[k, C, H, W]`` into ``col``: ``[k, C * kh * kw, P]`` (sample
    after sample) or ``[C * kh * kw, k * P]`` (sample ``n``'s columns at ``n * P``). Geometry as
    ``(h, w)`` pairs. Returns ``col``."""
    side_by_side, col3, params = _layout(x, col, kernel_size, stride, padding, dilation)
    _IM2COL[col.size >= PARALLEL_MIN][side_by_side](x, col3, *params)
    return col


def col2im_batch(col, x, kernel_size, stride, padding, dilation):
    """``x[n] = col2im(col of sample n)`` for every sample, ``col`` as ``im2col_batch`` fills it:
    ``x`` is *written* (zeroed, then added into), not accumulated. Returns ``x``."""
    side_by_side, col3, params = _layout(x, col, kernel_size, stride, padding, dilation)
    _COL2IM[col.size >= PARALLEL_MIN][side_by_side](col3, x, *params)
    return x


def conv_forward(x, weight, bias, y, work, chunk, geometry, slots: int = 1):
    """``y = conv(x, weight) + bias`` in chunks of ``chunk`` samples through ``work`` (flat, at
    least ``chunk * Kt * P`` elements). ``weight [O, Cg, kh, kw]``, ``bias [O]`` or None.
    ``slots`` > 1 (a short plane's, no groups: ``kernels.slotted``): one product per ``slots``
    samples, their columns side by side (``work`` then holds ``(Kt + O) * slotted.width``)."""
    n_samples, out, groups = x.shape[0], weight.shape[0], x.shape[1] // weight.shape[1]
    k_group = weight[0].size
    plane = y.shape[2] * y.shape[3]
    if slots > 1 and groups == 1:
        width = slotted.width(slots, plane)
        col = work[:k_group * width].reshape(k_group, width)
        product = work[col.size:][:out * width].reshape(out, width)
        for n0 in range(0, n_samples, slots):
            n1 = min(n_samples, n0 + slots)
            im2col_batch(x[n0:n1], col, *geometry)
            slotted.clear_unused(col, n1 - n0, plane)
            slotted.product(weight.reshape(out, k_group), col, product)
            slotted.from_side_by_side(product, y[n0:n1].reshape(n1 - n0, out, plane))
        if bias is not None:
            y += bias.reshape(1, out, 1, 1)
        return
    w = weight.reshape(groups, out // groups, k_group)
    for n0 in range(0, n_samples, chunk):
        n1 = min(n_samples, n0 + chunk)
        col = work[:(n1 - n0) * groups * k_group * plane].reshape(n1 - n0, groups * k_group, plane)
        im2col_batch(x[n0:n1], col, *geometry)
        top = y[n0:n1].reshape(n1 - n0, groups, out // groups, plane)
        for g in range(groups):
            matmul(w[g], col[:, g * k_group:(g + 1) * k_group], out=top[:, g])
        if bias is not None:
            y[n0:n1] += bias.reshape(1, out, 1, 1)


def conv_backward(x, dy, weight, dx, dweight, dbias, work, chunk, geometry):
    """Gradients (each overwritten; None where not wanted) in chunks of ``chunk`` samples through
    ``work`` (flat, at least ``chunk * (Kt + O) * P`` elements)."""
    n_samples, out, groups = x.shape[0], weight.shape[0], x.shape[1] // weight.shape[1]
    k_group = weight[0].size
    k_total, out_group, plane = groups * k_group, out // groups, dy.shape[2] * dy.shape[3]
    w = weight.reshape(groups, out_group, k_group)
    dw = None if dweight is None else dweight.reshape(groups, out_group, k_group)
    for n0 in range(0, n_samples, chunk):
        n1 = min(n_samples, n0 + chunk)
        width = (n1 - n0) * plane
        col = work[:k_total * width].reshape(k_total, width)
        dy_t = work[k_total * chunk * plane:][:out * width].reshape(out, width)
        dy_t.reshape(out, n1 - n0, plane)[...] = dy[n0:n1].reshape(n1 - n0, out, plane) \
            .transpose(1, 0, 2)
        first = n0 == 0
        if dbias is not None:
            if first:
                np.sum(dy_t, axis=1, out=dbias)
            else:
                dbias += dy_t.sum(axis=1)
        if dw is not None:
            im2col_batch(x[n0:n1], col, *geometry)
            for g in range(groups):
                gemm(dy_t[g * out_group:(g + 1) * out_group], col[g * k_group:(g + 1) * k_group],
                     dw[g], trans_b=True, beta=0.0 if first else 1.0)
        if dx is not None:
            for g in range(groups):
                gemm(w[g], dy_t[g * out_group:(g + 1) * out_group],
                     col[g * k_group:(g + 1) * k_group], trans_a=True)
            col2im_batch(col, dx[n0:n1], *geometry)
