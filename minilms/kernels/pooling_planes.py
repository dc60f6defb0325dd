"""The ``cpu`` device's max-pool forward a plane at a time in two passes: each row's window maxima,
then the maxima of those down the window's rows.

``pooling.max_pool_forward_cpu`` scans each output's window on its own, and ``pooling_rows``
vectorises a row of outputs, which fills no vector on GoogLeNet's 28-, 14- and 7-wide planes. A
max over a ``kh x kw`` window is the max over its rows of each row's max over ``kw`` columns, so:

1. **across**: for every input row, the max of each output column's ``kw`` inputs (``kw`` 2 or 3),
   and where it was, into a scratch plane of ``height x out_w``. Where the width is ``stride x
   out_w``, an output's first input in the flattened plane is ``stride * q - pad`` for the
   scratch position ``q``: one loop over the whole plane, with a constant stride, vectorises
   whatever the width. The outputs whose window the row's ends clip are redone after it, a
   column of them at a time (the flattened loop read the next row's elements for them).
2. **down**: for every output, the max of its window's rows' maxima; for a 3-row window of stride
   1 and padding 1 (GoogLeNet's inception pools), one loop over the flattened plane too. Any
   other window takes, in one loop over the flattened scratch plane, the maxima of every
   ``kh`` consecutive rows (at a vertical stride of 2 twice the rows it needs), then copies the
   output rows' out of them; only rows the window's top or bottom clips are done a row at a time.
   A loop over one output row (7-28 wide) runs scalar: LLVM's vector loop takes 32 at a time.

At a horizontal stride of 2 the plane is first split into its even and odd columns (``ev``,
``od``: the flattened plane's even and odd elements, since the width is ``2 x out_w``), so the
across loop reads each tap's column consecutively, not every other element.

The result is ``max_pool_forward_cpu``'s bit for bit, values and argmax: that kernel keeps the
first maximum in row-major order, and a NaN replaces whatever is kept (so the last NaN wins);
each pass applies the same rule in the same order (a row's first maximum, or its last NaN; then
the first row whose maximum is the window's, or the last row with a NaN), which picks the same
element (tests/kernels/test_pooling.py). A plane's scratch (values and indices) is taken once per
chunk of planes, a few KiB to a few MiB, and given back after it.

Small planes are stacked: a block of ``block_planes`` consecutive planes (``BLOCK_ELEMENTS``
inputs) is one tall plane to both passes, since a flattened loop over one 7x7 or 14x14 plane is
mostly its scalar remainder. The rows of a window never cross two planes: across works row by
row, and down redoes each plane's clipped rows from its own; the positions found are made each
plane's own at the end.
"""
import numpy as np
from numba import njit, prange

__all__ = ["ENABLED", "applies", "block_planes", "max_pool_forward_planes_cpu"]

ENABLED = True  # False: ``applies`` says no everywhere (the benchmark's A/B)
CHUNKS = 64     # of blocks, in parallel: each takes one block's scratch for all of its blocks
BLOCK_ELEMENTS = 4096   # inputs a block of planes stacked into one tall plane, at least a plane
U = np.uint64   # unsigned indices: numba's negative-index wrap-around stops the vectoriser


def applies(geom, width: int, out_w: int) -> bool:
    """Whether the two passes run this pooling (``geom`` as ``pooling._geometry`` gives it):
    ``kw`` 2 or 3, a horizontal stride of 1 or 2 that steps ``out_w`` outputs across the whole
    width (``width == stride * out_w``), and at least one output whose window the row's ends do
    not clip; never while ``ENABLED`` is False."""
    _, kw, _, sw, _, pw = geom
    inner, outer = _interior(width, out_w, kw, sw, pw)
    return ENABLED and kw in (2, 3) and sw in (1, 2) and width == sw * out_w and inner < outer


@njit(cache=True)
def _interior(width, out_w, kw, stride, pw):
    """Outputs ``[inner, outer)`` of a row whose windows lie inside it."""
    inner = min(out_w, (pw + stride - 1) // stride)
    return inner, max(inner, min(out_w, (width - kw + pw) // stride + 1))


@njit(inline="always")
def _keep(v, at, b, a):
    """``max_at``'s rule: a greater value or a NaN replaces the one kept."""
    replace = (v > b) | (v != v)
    return (v if replace else b), (at if replace else a)


@njit(inline="always")
def _across(src, hv, hi, q0, q1, pw, kw):
    """Scratch positions ``q0 .. q1`` of the flattened plane at stride 1: the max of ``src[q - pw
    + j]`` for ``j < kw``, and where it is. Called with a constant ``kw`` (stride 2 reads the
    plane's halves: ``_across_halves``)."""
    for q in range(q0, q1):
        base = q - pw
        b, a = src[U(base)], np.int32(base)
        b, a = _keep(src[U(base + 1)], np.int32(base + 1), b, a)
        if kw == 3:
            b, a = _keep(src[U(base + 2)], np.int32(base + 2), b, a)
        hv[U(q)], hi[U(q)] = b, a


@njit(inline="always")
def _split(src, ev, od):
    """``ev[k] = src[2k]``, ``od[k] = src[2k + 1]``: the flattened plane's even and odd elements."""
    for k in range(ev.size):
        ev[U(k)] = src[U(2 * k)]
        od[U(k)] = src[U(2 * k + 1)]


@njit(inline="always")
def _tap(ev, od, m):
    """Where element ``2q + m`` of the plane lies for every ``q``: the half (``ev`` or ``od``)
    and the shift to add to ``q``."""
    return (ev if m % 2 == 0 else od), m // 2


@njit(inline="always")
def _across_halves(ev, od, hv, hi, q0, q1, pw, kw):
    """``_across`` at stride 2 from the plane's halves: the same maxima and positions, each tap
    read consecutively. Called with a constant ``kw`` and ``pw`` (0 or 1)."""
    a0, s0 = _tap(ev, od, -pw)
    a1, s1 = _tap(ev, od, 1 - pw)
    a2, s2 = _tap(ev, od, 2 - pw)
    for q in range(q0, q1):
        base = 2 * q - pw
        b, a = a0[U(q + s0)], np.int32(base)
        b, a = _keep(a1[U(q + s1)], np.int32(base + 1), b, a)
        if kw == 3:
            b, a = _keep(a2[U(q + s2)], np.int32(base + 2), b, a)
        hv[U(q)], hi[U(q)] = b, a


@njit(inline="always")
def _across_clipped(src, hv, hi, h, ow, width, out_w, stride, pw, kw):
    """One scratch position whose window the row's ends clip, element by element."""
    w_lo, w_hi = max(ow * stride - pw, 0), min(ow * stride - pw + kw, width)
    at = h * width + w_lo
    b, a = src[at], np.int32(at)
    for w in range(w_lo + 1, w_hi):
        b, a = _keep(src[h * width + w], np.int32(h * width + w), b, a)
    hv[h * out_w + ow], hi[h * out_w + ow] = b, a


@njit(inline="always")
def _clipped_column(src, hv, hi, height, width, out_w, ow, sw, pw, kw):
    """Scratch column ``ow`` of every row, whose window the rows' ends clip. Where two columns
    are left (the zoo's pools: a 3-wide window with one column in the padding), without the
    general loop, which took as long as the flattened pass."""
    w_lo, w_hi = max(ow * sw - pw, 0), min(ow * sw - pw + kw, width)
    if w_hi - w_lo == 2:
        for h in range(height):
            at = h * width + w_lo
            b, a = _keep(src[U(at + 1)], np.int32(at + 1), src[U(at)], np.int32(at))
            hv[U(h * out_w + ow)], hi[U(h * out_w + ow)] = b, a
    else:
        for h in range(height):
            _across_clipped(src, hv, hi, h, ow, width, out_w, sw, pw, kw)


@njit(inline="always")
def _down_same3(hv, hi, out, arg, out_w, out_h, planes):
    """A 3-row window of stride 1 and padding 1 (``out_h == height``) over ``planes`` planes
    stacked: rows ``oh - 1 .. oh + 1``, flattened over them all; then each plane's first and
    last output rows, which have two of their own (the flattened loop read a neighbour's)."""
    plane, n = out_h * out_w, planes * out_h * out_w
    for o in range(out_w, n - out_w):
        b, a = hv[U(o - out_w)], hi[U(o - out_w)]
        b, a = _keep(hv[U(o)], hi[U(o)], b, a)
        b, a = _keep(hv[U(o + out_w)], hi[U(o + out_w)], b, a)
        out[U(o)], arg[U(o)] = b, a
    for p in range(planes):
        first, last = p * plane, p * plane + plane - out_w
        for o in range(first, first + out_w):
            b, a = hv[U(o)], hi[U(o)]
            if out_h > 1:
                b, a = _keep(hv[U(o + out_w)], hi[U(o + out_w)], b, a)
            out[U(o)], arg[U(o)] = b, a
        for o in range(max(last, first + out_w), first + plane):
            b, a = hv[U(o - out_w)], hi[U(o - out_w)]
            b, a = _keep(hv[U(o)], hi[U(o)], b, a)
            out[U(o)], arg[U(o)] = b, a


@njit(inline="always")
def _down(hv, hi, dv, di, out, arg, out_w, out_h, height, kh, sh, ph, planes):
    """Any window down, over ``planes`` planes stacked: the maxima of every ``kh`` rows of the
    scratch in one flattened loop (``dv``, ``di``; windows across two planes are computed and
    never used), each output row a copy of its window's; a row whose window its plane's top or
    bottom clips from its rows one by one. Called with a constant ``kh`` where it can be: a
    loop over the taps inside the flattened loop keeps LLVM from vectorising it."""
    inside = (planes * height - kh + 1) * out_w
    for q in range(max(inside, 0)):
        b, a = hv[U(q)], hi[U(q)]
        for i in range(1, kh):
            b, a = _keep(hv[U(q + i * out_w)], hi[U(q + i * out_w)], b, a)
        dv[U(q)], di[U(q)] = b, a
    for p in range(planes):
        start = p * height * out_w                 # the plane's first scratch row
        for oh in range(out_h):
            top, row = oh * sh - ph, (p * out_h + oh) * out_w
            if top >= 0 and top + kh <= height:
                at = start + top * out_w
                for ow in range(out_w):
                    out[U(row + ow)], arg[U(row + ow)] = dv[U(at + ow)], di[U(at + ow)]
            else:
                _down_clipped(hv, hi, out, arg, out_w, height, kh, top, row, start)


@njit(inline="always")
def _down_clipped(hv, hi, out, arg, out_w, height, kh, top, row, start):
    """One output row whose window starts at row ``top`` of the plane whose scratch starts at
    ``start``, and is clipped by the plane."""
    h_lo, h_hi = max(top, 0), min(top + kh, height)
    first = start + h_lo * out_w
    for ow in range(out_w):
        out[U(row + ow)], arg[U(row + ow)] = hv[U(first + ow)], hi[U(first + ow)]
    for h in range(h_lo + 1, h_hi):
        at = start + h * out_w
        for ow in range(out_w):
            b, a = _keep(hv[U(at + ow)], hi[U(at + ow)], out[U(row + ow)], arg[U(row + ow)])
            out[U(row + ow)], arg[U(row + ow)] = b, a


@njit(inline="always")
def _within_planes(arg, planes, plane_out, plane_in):
    """The positions found in a stack of planes made each plane's own (``argmax`` counts from
    the plane's first element)."""
    for p in range(1, planes):
        shift = np.int32(p * plane_in)
        for o in range(p * plane_out, (p + 1) * plane_out):
            arg[U(o)] -= shift


@njit(cache=True)
def block_planes(height, width):
    """Planes a block: as many as make ``BLOCK_ELEMENTS`` inputs, one at least."""
    return max(1, BLOCK_ELEMENTS // (height * width))


@njit(parallel=True, cache=True, nogil=True)
def max_pool_forward_planes_cpu(x, y, argmax, geom, per=0):
    """``pooling.max_pool_forward_cpu`` where ``applies`` (the module docstring), ``per`` planes
    a block (0: ``block_planes``'s)."""
    kh, kw, sh, sw, ph, pw = geom
    n_, c_, out_h, out_w = y.shape
    height, width = x.shape[2], x.shape[3]
    planes, plane_in, plane_out = n_ * c_, height * width, out_h * out_w
    per = block_planes(height, width) if per == 0 else per
    xs, ys, args = x.reshape(planes * plane_in), y.reshape(-1), argmax.reshape(-1)
    blocks = (planes + per - 1) // per
    chunks = min(blocks, CHUNKS)
    same3 = kh == 3 and sh == 1 and ph == 1 and out_h == height
    for chunk in prange(chunks):
        hv = np.empty(per * height * out_w, x.dtype)
        hi = np.empty(per * height * out_w, np.int32)
        dv = np.empty(0 if same3 else per * height * out_w, x.dtype)
        di = np.empty(0 if same3 else per * height * out_w, np.int32)
        halves = per * plane_in // 2 if sw == 2 else 0
        ev_all, od_all = np.empty(halves, x.dtype), np.empty(halves, x.dtype)
        for block in range(chunk * blocks // chunks, (chunk + 1) * blocks // chunks):
            p0 = block * per
            k = min(per, planes - p0)
            _pool_block(xs[p0 * plane_in:(p0 + k) * plane_in], ys[p0 * plane_out:
                        (p0 + k) * plane_out], args[p0 * plane_out:(p0 + k) * plane_out],
                        hv, hi, dv, di, ev_all[:k * plane_in // 2], od_all[:k * plane_in // 2],
                        geom, k, height, width, out_h, out_w, same3)


@njit(cache=True, nogil=True)
def _pool_block(src, out, arg, hv, hi, dv, di, ev, od, geom, k, height, width, out_h, out_w,
                same3):
    """Both passes over one block of ``k`` planes stacked (``src`` in, ``out`` and ``arg`` out,
    the rest scratch). A function of its own, not the parallel loop's body: numba's parallel
    passes over the inlined helpers' dozens of loops took a minute to compile a signature; as
    a serial function it takes seconds, and the call is one a block."""
    kh, kw, sh, sw, ph, pw = geom
    inner, outer = _interior(width, out_w, kw, sw, pw)
    rows = k * height                      # the block's planes stacked: one tall plane
    q0, q1 = inner, rows * out_w - (out_w - outer)
    if sw == 1 and kw == 3:
        _across(src, hv, hi, q0, q1, pw, 3)
    elif sw == 1:
        _across(src, hv, hi, q0, q1, pw, 2)
    else:     # constant taps and padding: each tap's half and shift known
        _split(src, ev, od)
        if kw == 3 and pw == 0:
            _across_halves(ev, od, hv, hi, q0, q1, 0, 3)
        elif kw == 3:
            _across_halves(ev, od, hv, hi, q0, q1, 1, 3)
        elif pw == 0:
            _across_halves(ev, od, hv, hi, q0, q1, 0, 2)
        else:
            _across_halves(ev, od, hv, hi, q0, q1, 1, 2)
    for ow in range(inner):
        _clipped_column(src, hv, hi, rows, width, out_w, ow, sw, pw, kw)
    for ow in range(outer, out_w):
        _clipped_column(src, hv, hi, rows, width, out_w, ow, sw, pw, kw)
    if same3:
        _down_same3(hv, hi, out, arg, out_w, out_h, k)
    elif kh == 3:        # a constant window: the flattened loop's taps unrolled
        _down(hv, hi, dv, di, out, arg, out_w, out_h, height, 3, sh, ph, k)
    elif kh == 2:
        _down(hv, hi, dv, di, out, arg, out_w, out_h, height, 2, sh, ph, k)
    else:
        _down(hv, hi, dv, di, out, arg, out_w, out_h, height, kh, sh, ph, k)
    _within_planes(arg, k, out_h * out_w, height * width)
