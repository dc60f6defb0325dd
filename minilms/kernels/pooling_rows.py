"""The ``cpu`` device's max-pool forward a row of outputs at a time, where the horizontal stride
is 1 or 2 (GoogLeNet's 3x3 pools in its inception blocks; ResNet's and GoogLeNet's 3x3 stride-2
pools between stages).

``pooling.max_pool_forward_cpu`` scans each output's window on its own: scalar code, a branch per
element. Here each tap ``(i, j)`` of the window is one pass along a row of outputs, whose inputs
are consecutive (stride 1) or every other element (stride 2), so the compare-and-keep
vectorises. Every output still sees its window's elements in row-major order from the window's
first, with ``max_at``'s rule (a greater value or a NaN replaces): the same values and argmax bit
for bit (tests/kernels/test_pooling.py).

Why two kernels and not one with the stride as an argument: LLVM vectorises the strided loads
only with the stride a constant (a runtime stride ran no faster than the per-output kernel). The
stride-2 kernel's inner loop, over the outputs whose windows lie inside the row, indexes with
unsigned integers: a signed index keeps numba's negative-index wrap-around, whose select stopped
the vectoriser too. The measurements: docs/benchmarks.md, session 34.
"""
import numpy as np
from numba import njit, prange

from .direct.vector_ir import VL

__all__ = ["max_pool_forward_rows_cpu", "max_pool_forward_stride2_cpu", "stride2_rows_pay"]


@njit(inline="always", cache=True)
def _window_starts(src, best, where, h0, stride, pw, width):
    """Each output of the row starts from its window's first element (row ``h0``)."""
    for ow in range(best.size):
        w0 = max(ow * stride - pw, 0)
        best[ow], where[ow] = src[h0, w0], h0 * width + w0


@njit(parallel=True, cache=True, nogil=True)
def max_pool_forward_rows_cpu(x, y, argmax, geom):
    """``pooling.max_pool_forward_cpu`` for a horizontal stride of 1."""
    kh, kw, sh, sw, ph, pw = geom
    n_, c_, ho, wo = y.shape
    height, width = x.shape[2], x.shape[3]
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        src, best, where = x[n, c], y[n, c], argmax[n, c]
        for oh in range(ho):
            h0 = max(oh * sh - ph, 0)
            b, a = best[oh], where[oh]
            _window_starts(src, b, a, h0, 1, pw, width)
            for i in range(kh):
                h = oh * sh - ph + i
                if h < 0 or h >= height:
                    continue
                row = src[h]
                for j in range(kw):
                    for ow in range(wo):
                        w = ow - pw + j
                        if 0 <= w < width:
                            v = row[w]
                            if v > b[ow] or v != v:
                                b[ow], a[ow] = v, h * width + w


@njit(cache=True)
def interior(width, out_w, kw, pw):
    """Outputs ``[inner, outer)`` of a stride-2 row whose windows lie inside the input row:
    ``2 * ow - pw >= 0`` and ``2 * ow - pw + kw <= width``."""
    inner = min(out_w, (pw + 1) // 2)
    return inner, max(inner, min(out_w, (width - kw + pw) // 2 + 1))


def stride2_rows_pay(width: int, out_w: int, kw: int, pw: int) -> bool:
    """Whether the stride-2 kernel beats the per-output one: where a row's interior fills a
    vector at least (shorter interiors ran slower: docs/benchmarks.md, session 34)."""
    inner, outer = interior(width, out_w, kw, pw)
    return outer - inner >= VL


@njit(parallel=True, cache=True, nogil=True)
def max_pool_forward_stride2_cpu(x, y, argmax, geom):
    """``pooling.max_pool_forward_cpu`` for a horizontal stride of 2 (``geom[3]``)."""
    kh, kw, sh, _, ph, pw = geom
    n_, c_, ho, wo = y.shape
    height, width = x.shape[2], x.shape[3]
    inner, outer = interior(width, wo, kw, pw)
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        src, best, where = x[n, c], y[n, c], argmax[n, c]
        for oh in range(ho):
            h0 = max(oh * sh - ph, 0)
            b, a = best[oh], where[oh]
            _window_starts(src, b, a, h0, 2, pw, width)
            for i in range(kh):
                h = oh * sh - ph + i
                if h < 0 or h >= height:
                    continue
                row, at = src[h], h * width
                for j in range(kw):
                    for ow in range(inner):
                        w = 2 * ow - pw + j
                        if 0 <= w < width:
                            v = row[w]
                            if v > b[ow] or v != v:
                                b[ow], a[ow] = v, at + w
                    first = 2 * inner - pw + j
                    for k in range(outer - inner):
                        w, o = first + 2 * k, np.uint64(inner + k)
                        v, kept = row[np.uint64(w)], b[o]
                        replace = (v > kept) | (v != v)
                        b[o] = v if replace else kept
                        a[o] = np.int32(at + w) if replace else a[o]
                    for ow in range(outer, wo):
                        w = 2 * ow - pw + j
                        if 0 <= w < width:
                            v = row[w]
                            if v > b[ow] or v != v:
                                b[ow], a[ow] = v, at + w
