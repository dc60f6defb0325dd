"""Winograd's F(m x m, 3 x 3) tiles, channels last: the transforms written out, and a sample's
(or a group of samples') whole convolution or weight-gradient sums in one ``nogil`` call that runs
its GEMMs through ``cblas_sgemm`` (``kernels.cblas``). ``direct.winograd`` lays out the buffers,
transforms the kernel and deals the samples out to workers; the algebra is in its docstring.

Every array here is C-contiguous with the channels last, and every loop runs along them: the
inputs ``[H, W, C]`` (padded), a block's transformed tiles ``V [a^2, block, C]`` and products ``M
[a^2, block, O]``, the outputs ``[H, W, O]``. A tile ``t`` of a plane of ``tiles_w`` tiles across
sits at ``(r, s) = divmod(t, tiles_w)``.
"""
import numpy as np
from numba import njit, prange

from ..cblas import NO_TRANS, ROW_MAJOR, TRANS

__all__ = ["matrices", "to_channels_last", "from_channels_last", "turn_tiles", "untile",
           "convolve_samples", "weight_sums", "convolve_runs", "weight_sums_runs",
           "convolve_shared", "weight_sums_shared"]


def matrices(m: int, dtype=np.float32):
    """F(m, 3)'s ``(B^T [a, a], G [a, 3], A^T [m, a])``, ``a = m + 2`` (Lavin and Gray's; F(4,
    3)'s points 0, 1, -1, 2, -2)."""
    if m == 2:
        bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        g = [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]
        at = [[1, 1, 1, 0], [0, 1, -1, -1]]
    elif m == 4:
        bt = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
              [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
        g = [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
             [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]
        at = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
              [0, 1, -1, 8, -8, 1]]
    else:
        raise ValueError(f"F(m, 3) is here for m = 2 or 4, not {m}")
    return tuple(np.array(rows, dtype) for rows in (bt, g, at))


STRIP = 16      # channels a copy to or from channels last takes at once (below)


@njit(cache=True, nogil=True)
def to_channels_last(plane, xt, pad, top=0):
    """``xt[i, w + pad, c] = plane[c, top - pad + i, w]`` for ``xt``'s rows ``i`` (the whole
    plane from ``top = 0``, or a band of rows); ``xt``'s border, and whatever lies beyond the
    plane, 0. A strip of ``STRIP`` channels at a time, along the channels innermost: the writes
    run on, and the reads gather from no more planes (pages) than the TLB holds: faster than
    all the channels at once, and than the other orders (docs/benchmarks.md, session 38)."""
    channels, height, width = plane.shape
    rows = xt.shape[0]
    lo = min(rows, max(0, pad - top))               # rows of xt with a row of the plane
    hi = max(lo, min(rows, height + pad - top))
    xt[:lo] = 0
    xt[hi:] = 0
    xt[:, :pad] = 0
    xt[:, pad + width:] = 0
    for first in range(0, channels, STRIP):
        last = min(first + STRIP, channels)
        for i in range(lo, hi):
            h = top - pad + i
            for w in range(width):
                for c in range(first, last):
                    xt[i, pad + w, c] = plane[c, h, w]


@njit(cache=True, nogil=True)
def from_channels_last(yt, plane, bias, top=0):
    """``plane[o, top + h, w] = yt[h, w, o] + bias[o]`` for ``yt``'s rows inside the plane:
    ``to_channels_last``'s inverse, in the same order."""
    out, height, width = plane.shape
    rows = min(yt.shape[0], height - top)
    for first in range(0, out, STRIP):
        last = min(first + STRIP, out)
        for h in range(rows):
            for w in range(width):
                for o in range(first, last):
                    plane[o, top + h, w] = yt[h, w, o] + bias[o]


# The transforms' matrices written out (``matrices`` has them as arrays; the tests check one
# against the other). Each reads rows ``t`` of ``s`` at ``s[a + t * da, b + t * db]`` and writes
# rows ``i`` of ``d`` at ``d[e + i * de, f + i * df]``, every row a vector along the channels
# (the arrays' last axis): a loop along the channels per output row, one store stream each, on
# C-contiguous arrays indexed in place, so that each loop vectorises. (Views made per tile, or
# strided ones, cost more than the arithmetic.)


@njit(cache=True, nogil=True)
def _bt2(s, a, b, da, db, d, e, f, de, df):
    """``d = B^T s``, F(2, 3)."""
    for c in range(s.shape[2]):
        d[e, f, c] = s[a, b, c] - s[a + 2 * da, b + 2 * db, c]
    for c in range(s.shape[2]):
        d[e + de, f + df, c] = s[a + da, b + db, c] + s[a + 2 * da, b + 2 * db, c]
    for c in range(s.shape[2]):
        d[e + 2 * de, f + 2 * df, c] = s[a + 2 * da, b + 2 * db, c] - s[a + da, b + db, c]
    for c in range(s.shape[2]):
        d[e + 3 * de, f + 3 * df, c] = s[a + da, b + db, c] - s[a + 3 * da, b + 3 * db, c]


@njit(cache=True, nogil=True)
def _bt4(s, a, b, da, db, d, e, f, de, df):
    """``d = B^T s``, F(4, 3): rows ``4 s0 - 5 s2 + s4``, ``s3 + s4 - 4 (s1 + s2)``, ``s4 - s3
    + 4 (s1 - s2)``, ``s4 - s2 + 2 (s3 - s1)``, ``s4 - s2 + 2 (s1 - s3)``, ``4 s1 - 5 s3 +
    s5``."""
    four, five, two = np.float32(4), np.float32(5), np.float32(2)
    a1, b1, a2, b2, a3, b3 = a + da, b + db, a + 2 * da, b + 2 * db, a + 3 * da, b + 3 * db
    a4, b4, a5, b5 = a + 4 * da, b + 4 * db, a + 5 * da, b + 5 * db
    for c in range(s.shape[2]):
        d[e, f, c] = four * s[a, b, c] - five * s[a2, b2, c] + s[a4, b4, c]
    for c in range(s.shape[2]):
        d[e + de, f + df, c] = s[a3, b3, c] + s[a4, b4, c] - four * (s[a1, b1, c] +
                                                                       s[a2, b2, c])
    for c in range(s.shape[2]):
        d[e + 2 * de, f + 2 * df, c] = s[a4, b4, c] - s[a3, b3, c] + four * (s[a1, b1, c] -
                                                                               s[a2, b2, c])
    for c in range(s.shape[2]):
        d[e + 3 * de, f + 3 * df, c] = s[a4, b4, c] - s[a2, b2, c] + two * (s[a3, b3, c] -
                                                                              s[a1, b1, c])
    for c in range(s.shape[2]):
        d[e + 4 * de, f + 4 * df, c] = s[a4, b4, c] - s[a2, b2, c] + two * (s[a1, b1, c] -
                                                                              s[a3, b3, c])
    for c in range(s.shape[2]):
        d[e + 5 * de, f + 5 * df, c] = four * s[a1, b1, c] - five * s[a3, b3, c] + s[a5, b5, c]


@njit(cache=True, nogil=True)
def _at2(s, a, b, da, db, d, e, f, de, df):
    """``d = A^T s``, F(2, 3)."""
    a1, b1, a2, b2, a3, b3 = a + da, b + db, a + 2 * da, b + 2 * db, a + 3 * da, b + 3 * db
    for c in range(s.shape[2]):
        d[e, f, c] = s[a, b, c] + s[a1, b1, c] + s[a2, b2, c]
    for c in range(s.shape[2]):
        d[e + de, f + df, c] = s[a1, b1, c] - s[a2, b2, c] - s[a3, b3, c]


@njit(cache=True, nogil=True)
def _at4(s, a, b, da, db, d, e, f, de, df):
    """``d = A^T s``, F(4, 3): rows ``s0 + s1 + s2 + s3 + s4``, ``s1 - s2 + 2 (s3 - s4)``,
    ``s1 + s2 + 4 (s3 + s4)``, ``s1 - s2 + 8 (s3 - s4) + s5``."""
    two, four, eight = np.float32(2), np.float32(4), np.float32(8)
    a1, b1, a2, b2, a3, b3 = a + da, b + db, a + 2 * da, b + 2 * db, a + 3 * da, b + 3 * db
    a4, b4, a5, b5 = a + 4 * da, b + 4 * db, a + 5 * da, b + 5 * db
    for c in range(s.shape[2]):
        d[e, f, c] = s[a, b, c] + s[a1, b1, c] + s[a2, b2, c] + s[a3, b3, c] + s[a4, b4, c]
    for c in range(s.shape[2]):
        d[e + de, f + df, c] = s[a1, b1, c] - s[a2, b2, c] + two * (s[a3, b3, c] -
                                                                      s[a4, b4, c])
    for c in range(s.shape[2]):
        d[e + 2 * de, f + 2 * df, c] = s[a1, b1, c] + s[a2, b2, c] + four * (s[a3, b3, c] +
                                                                               s[a4, b4, c])
    for c in range(s.shape[2]):
        d[e + 3 * de, f + 3 * df, c] = s[a1, b1, c] - s[a2, b2, c] + eight * (
            s[a3, b3, c] - s[a4, b4, c]) + s[a5, b5, c]


@njit(cache=True, nogil=True)
def _a2(s, a, b, da, db, d, e, f, de, df):
    """``d = A s`` (``dy``'s tiles), F(2, 3)."""
    a1, b1 = a + da, b + db
    for c in range(s.shape[2]):
        d[e, f, c] = s[a, b, c]
    for c in range(s.shape[2]):
        d[e + de, f + df, c] = s[a, b, c] + s[a1, b1, c]
    for c in range(s.shape[2]):
        d[e + 2 * de, f + 2 * df, c] = s[a, b, c] - s[a1, b1, c]
    for c in range(s.shape[2]):
        d[e + 3 * de, f + 3 * df, c] = -s[a1, b1, c]


@njit(cache=True, nogil=True)
def _a4(s, a, b, da, db, d, e, f, de, df):
    """``d = A s`` (``dy``'s tiles), F(4, 3): rows ``s0``, ``s0 + s1 + s2 + s3``, ``s0 - s1 + s2
    - s3``, ``s0 + 2 s1 + 4 s2 + 8 s3``, ``s0 - 2 s1 + 4 s2 - 8 s3``, ``s3``."""
    two, four, eight = np.float32(2), np.float32(4), np.float32(8)
    a1, b1, a2, b2, a3, b3 = a + da, b + db, a + 2 * da, b + 2 * db, a + 3 * da, b + 3 * db
    for c in range(s.shape[2]):
        d[e, f, c] = s[a, b, c]
    for c in range(s.shape[2]):
        d[e + de, f + df, c] = s[a, b, c] + s[a1, b1, c] + s[a2, b2, c] + s[a3, b3, c]
    for c in range(s.shape[2]):
        d[e + 2 * de, f + 2 * df, c] = s[a, b, c] - s[a1, b1, c] + s[a2, b2, c] - s[a3, b3, c]
    for c in range(s.shape[2]):
        d[e + 3 * de, f + 3 * df, c] = s[a, b, c] + two * s[a1, b1, c] + four * s[a2, b2, c] + \
            eight * s[a3, b3, c]
    for c in range(s.shape[2]):
        d[e + 4 * de, f + 4 * df, c] = s[a, b, c] - two * s[a1, b1, c] + four * s[a2, b2, c] - \
            eight * s[a3, b3, c]
    for c in range(s.shape[2]):
        d[e + 5 * de, f + 5 * df, c] = s[a3, b3, c]


@njit(cache=True, nogil=True)
def _turn(m, grad, s, a, b, da, db, d, e, f, de, df):
    """``B^T`` (the input's tiles) or, where ``grad``, ``A`` (``dy``'s), of F(m, 3)."""
    if grad:
        if m == 2:
            _a2(s, a, b, da, db, d, e, f, de, df)
        else:
            _a4(s, a, b, da, db, d, e, f, de, df)
    elif m == 2:
        _bt2(s, a, b, da, db, d, e, f, de, df)
    else:
        _bt4(s, a, b, da, db, d, e, f, de, df)


@njit(cache=True, nogil=True)
def turn_tiles(src, first, count, tiles_w, m, grad, v, at):
    """``v[i * a + j, at + k] = (B^T d B)[i, j]`` (vectors along the channels) for tile ``t =
    first + k``, ``k < count``, at ``(r, s) = divmod(t, tiles_w)``, ``d = src[m r + ., m s +
    .]`` (``a x a``); where ``grad``, ``(A e A^T)`` of ``dy``'s ``m x m`` tile ``e`` there. A
    tile row's rows at once (``rows[i, q]``), then each tile's columns."""
    alpha = m + 2
    window = m if grad else alpha
    span, channels = src.shape[1], src.shape[2]
    rows = np.empty((alpha, span, channels), np.float32)
    k = 0
    while k < count:
        r, s0 = divmod(first + k, tiles_w)
        run = min(tiles_w - s0, count - k)
        for q in range(m * s0, m * (s0 + run - 1) + window):
            _turn(m, grad, src, m * r, q, 1, 0, rows, 0, q, 1, 0)
        for s in range(run):
            for i in range(alpha):
                _turn(m, grad, rows, i, m * (s0 + s), 0, 1, v, i * alpha, at + k + s, 1, 0)
        k += run


@njit(cache=True, nogil=True)
def untile(mm, at, first, count, tiles_w, m, yt):
    """``yt[m r + p, m s + q] = (A^T M A)[p, q]`` (vectors along the channels) for tile ``first
    + k``, ``k < count``, from ``mm[:, at + k]`` (``mm [a^2, block, O]``)."""
    alpha = m + 2
    half = np.empty((m, alpha, mm.shape[2]), np.float32)
    for k in range(count):
        r, s = divmod(first + k, tiles_w)
        for j in range(alpha):      # A^T over M's rows i * a + j: half[p, j]
            if m == 2:
                _at2(mm, j, at + k, alpha, 0, half, 0, j, 1, 0)
            else:
                _at4(mm, j, at + k, alpha, 0, half, 0, j, 1, 0)
        for p in range(m):          # then over half[p]'s: y's row m r + p
            if m == 2:
                _at2(half, p, 0, 0, 1, yt, m * r + p, m * s, 0, 1)
            else:
                _at4(half, p, 0, 0, 1, yt, m * r + p, m * s, 0, 1)


@njit(cache=True, nogil=True)
def _band(unit, bands, band_rows, tiles_h, tiles_w):
    """Unit ``unit``'s sample, its first tile row and its tiles: a sample whole where ``bands``
    is 1 (``unit`` is then the sample), else band ``unit % bands`` of it."""
    head, band = divmod(unit, bands)
    first_row = band * band_rows
    return head, first_row, min(band_rows, tiles_h - first_row) * tiles_w


@njit(cache=True, nogil=True)
def convolve_samples(gemm, x, first, stop, lead, u, u_trans, bias, y, pad, group, block, tiles_w,
                     m, bands, band_rows, xt, v, mm, yt):
    """``y[n] = conv(x[n]) + bias`` for the units ``first <= n < stop`` (samples, or where
    ``bands`` > 1 bands of ``band_rows`` tile rows of them) with the transformed kernel ``u``
    (``u[k]`` ``[out, in]`` where ``u_trans``, else ``[in, out]``): a group's (or a band's)
    copies, its blocks' transforms and GEMMs, and its outputs' copies, in one call (``gemm``:
    ``cblas.sgemm``'s). The first group starts ``lead`` places before ``first``: sample ``n``
    sits at place ``(n + lead - first) % group`` of its group, the rows of a place without a
    sample 0."""
    channels, out = x.shape[1], y.shape[1]
    tiles_h = -(-y.shape[2] // m)
    trans = TRANS if u_trans else NO_TRANS
    for unit in range(first - lead, stop, group):
        head, first_row, tiles = _band(unit, bands, band_rows, tiles_h, tiles_w)
        low, high = max(0, first - unit), min(group, stop - unit)     # the places with samples
        for j in range(low, high):
            to_channels_last(x[head + j], xt[j], pad, m * first_row)
        if group > 1:
            v[:, :low * tiles] = 0      # the places without a sample
            v[:, high * tiles:] = 0
        for start in range(0, tiles if group == 1 else 1, block):
            rows = block if group > 1 else min(block, tiles - start)
            count = tiles if group > 1 else rows
            for j in range(low, high):
                turn_tiles(xt[j], start, count, tiles_w, m, False, v, j * tiles)
            for k in range(v.shape[0]):
                gemm(ROW_MAJOR, NO_TRANS, trans, rows, out, channels, 1.0, v[k].ctypes.data,
                     channels, u[k].ctypes.data, u.shape[2], 0.0, mm[k].ctypes.data, out)
            for j in range(low, high):
                untile(mm, j * tiles, start, count, tiles_w, m, yt[j])
        for j in range(low, high):
            from_channels_last(yt[j], y[head + j], bias, m * first_row)


@njit(cache=True, nogil=True)
def weight_sums(gemm, x, dy, first, stop, lead, mw, pad, group, block, tiles_w, m, bands,
                band_rows, xt, v, turned, dyt):
    """``mw[k] = sum of Y[k]^T @ V[k]`` (``[O, C]``) over the tiles of the units ``first <= n <
    stop`` (placed in groups as ``convolve_samples``' are; a sum's inner dimension is the
    places with samples), in unit and block order (``mw`` overwritten)."""
    out, channels = mw.shape[1], mw.shape[2]
    tiles_h = -(-dy.shape[2] // m)
    beta = 0.0
    for unit in range(first - lead, stop, group):
        head, first_row, tiles = _band(unit, bands, band_rows, tiles_h, tiles_w)
        low, high = max(0, first - unit), min(group, stop - unit)
        for j in range(low, high):
            to_channels_last(x[head + j], xt[j], pad, m * first_row)
            to_channels_last(dy[head + j], dyt[j], 0, m * first_row)
        for start in range(0, tiles if group == 1 else 1, block):
            rows = (high - low) * tiles if group > 1 else min(block, tiles - start)
            at = low * tiles if group > 1 else 0
            count = tiles if group > 1 else rows
            for j in range(low, high):
                turn_tiles(xt[j], start, count, tiles_w, m, False, v, j * tiles)
                turn_tiles(dyt[j], start, count, tiles_w, m, True, turned, j * tiles)
            for k in range(v.shape[0]):
                gemm(ROW_MAJOR, TRANS, NO_TRANS, out, channels, rows, 1.0,
                     turned[k, at:].ctypes.data, out, v[k, at:].ctypes.data, channels, beta,
                     mw[k].ctypes.data, channels)
            beta = 1.0


# -- the workers on Numba's threads (``blas_threads.NUMBA_THREADS``) -------------------------------
@njit(cache=True, nogil=True)
def _room(room, xt_shape, v_shape, mm_shape, yt_shape):
    """A worker's ``room`` (1-D) as its four buffers (``rules.winograd.Layout.buffers``)."""
    sizes = (xt_shape[0] * xt_shape[1] * xt_shape[2] * xt_shape[3],
             v_shape[0] * v_shape[1] * v_shape[2], mm_shape[0] * mm_shape[1] * mm_shape[2])
    at_v, at_mm = sizes[0], sizes[0] + sizes[1]
    at_yt = at_mm + sizes[2]
    end = at_yt + yt_shape[0] * yt_shape[1] * yt_shape[2] * yt_shape[3]
    return (room[:at_v].reshape(xt_shape), room[at_v:at_mm].reshape(v_shape),
            room[at_mm:at_yt].reshape(mm_shape), room[at_yt:end].reshape(yt_shape))


@njit(parallel=True, cache=True, nogil=True)
def convolve_runs(gemm, x, runs, lead, u, u_trans, bias, y, pad, group, block, tiles_w, m,
                  bands, band_rows, rooms, xt_shape, v_shape, mm_shape, yt_shape):
    """``convolve_samples`` for each worker ``t`` on a thread of its own: its units ``runs[t,
    0] <= n < runs[t, 1]`` in its room ``rooms[t]``; ``lead`` as the layer's (each worker's
    from ``(runs[t, 0] + lead) % group``)."""
    for t in prange(runs.shape[0]):
        xt, v, mm, yt = _room(rooms[t], xt_shape, v_shape, mm_shape, yt_shape)
        convolve_samples(gemm, x, runs[t, 0], runs[t, 1], (runs[t, 0] + lead) % group, u,
                         u_trans, bias, y, pad, group, block, tiles_w, m, bands, band_rows, xt,
                         v, mm, yt)


@njit(parallel=True, cache=True, nogil=True)
def weight_sums_runs(gemm, x, dy, runs, lead, mw, others, pad, group, block, tiles_w, m, bands,
                     band_rows, rooms, xt_shape, v_shape, mm_shape, yt_shape):
    """``weight_sums`` for each worker ``t`` on a thread of its own, into ``mw`` (worker 0) or
    ``others[t - 1]``; the rest as ``convolve_runs``."""
    for t in prange(runs.shape[0]):
        xt, v, turned, dyt = _room(rooms[t], xt_shape, v_shape, mm_shape, yt_shape)
        sums = mw if t == 0 else others[t - 1]
        weight_sums(gemm, x, dy, runs[t, 0], runs[t, 1], (runs[t, 0] + lead) % group, sums,
                    pad, group, block, tiles_w, m, bands, band_rows, xt, v, turned, dyt)


# -- a group at a time, the workers on it together (``rules.winograd.Layout.shared``) -------------
@njit(parallel=True, cache=True, nogil=True)
def convolve_shared(gemm, x, lead, u, u_trans, bias, y, pad, group, tiles_w, m, xt, v, mm, yt):
    """``convolve_samples`` for every sample of ``x``, a group at a time (the first starting
    ``lead`` places before ``x[0]``), on the threads together: the group's samples turned one a
    thread, then its positions' products one a thread (each whole, the group's tiles), then its
    samples untiled one a thread; one room's buffers. A sample's bits are its own, as there."""
    channels, out, samples = x.shape[1], y.shape[1], x.shape[0]
    tiles = v.shape[1] // group
    trans = TRANS if u_trans else NO_TRANS
    for unit in range(-lead, samples, group):
        low, high = max(0, -unit), min(group, samples - unit)     # the places with samples
        for j in prange(group):
            if low <= j < high:
                to_channels_last(x[unit + j], xt[j], pad, 0)
                turn_tiles(xt[j], 0, tiles, tiles_w, m, False, v, j * tiles)
            else:
                v[:, j * tiles:(j + 1) * tiles] = 0
        for k in prange(v.shape[0]):
            gemm(ROW_MAJOR, NO_TRANS, trans, v.shape[1], out, channels, 1.0, v[k].ctypes.data,
                 channels, u[k].ctypes.data, u.shape[2], 0.0, mm[k].ctypes.data, out)
        for j in prange(low, high):
            untile(mm, j * tiles, 0, tiles, tiles_w, m, yt[j])
            from_channels_last(yt[j], y[unit + j], bias, 0)


@njit(parallel=True, cache=True, nogil=True)
def weight_sums_shared(gemm, x, dy, lead, mw, pad, group, tiles_w, m, xt, v, turned, dyt):
    """``weight_sums`` for every sample of ``x``, a group at a time, on the threads together
    (``convolve_shared``): a position's sum is one thread's, group after group, so that its
    bits do not depend on the threads (``mw`` overwritten)."""
    out, channels, samples = mw.shape[1], mw.shape[2], x.shape[0]
    tiles = v.shape[1] // group
    beta = 0.0
    for unit in range(-lead, samples, group):
        low, high = max(0, -unit), min(group, samples - unit)
        for j in prange(low, high):
            to_channels_last(x[unit + j], xt[j], pad, 0)
            to_channels_last(dy[unit + j], dyt[j], 0, 0)
            turn_tiles(xt[j], 0, tiles, tiles_w, m, False, v, j * tiles)
            turn_tiles(dyt[j], 0, tiles, tiles_w, m, True, turned, j * tiles)
        at = low * tiles
        for k in prange(v.shape[0]):
            gemm(ROW_MAJOR, TRANS, NO_TRANS, out, channels, (high - low) * tiles, 1.0,
                 turned[k, at:].ctypes.data, out, v[k, at:].ctypes.data, channels, beta,
                 mw[k].ctypes.data, channels)
        beta = 1.0
