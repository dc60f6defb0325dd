"""im2col / col2im: convolution as GEMM, for one NCHW image at a time (Caffe's layout), or a chunk.

For an image ``img[C, H, W]``, a kernel ``kh x kw``, stride ``(sh, sw)``, padding ``(ph, pw)`` and
dilation ``(dh, dw)``, the output is ``out_h x out_w`` with
``out_h = (H + 2 ph - dh (kh - 1) - 1) // sh + 1`` (likewise ``out_w``), and

    col[(c * kh + i) * kw + j, oh * out_w + ow] = img[c, oh * sh - ph + i * dh, ow * sw - pw + j *
    dw]

(zero where that falls in the padding), so ``col`` is ``[C * kh * kw, out_h * out_w]`` and a
convolution's forward pass is ``gemm(weight.reshape(K, C * kh * kw), col, out.reshape(K, -1))``.

``col2im`` is the adjoint: it *adds* every column entry back into the pixel it came from
(``img += im2col^T(col)``), which is the input gradient once ``col`` holds ``weight^T @ dout``.
Adding, not overwriting, lets a caller accumulate gradients.

One image per call, so the ``col`` workspace never grows with the batch: the caller loops over the
batch. Or a chunk of images per call (``im2col_batch``, ``col2im_batch``: ``cols[B, K, L]``), which
on CUDA is one launch whatever ``B``, the batch in the grid: what a GPU wants, where each launch
costs tens of microseconds of host time. Groups are the caller's too: for group ``g`` of ``G``,
pass the channel slice ``img[g * C // G:(g + 1) * C // G]`` (still C-contiguous) and its own
``col``.

Bands: ``rows=(r0, r1)`` restricts both to output rows ``r0 <= oh < r1``. ``col`` is then
``[C * kh * kw, (r1 - r0) * out_w]``, the columns ``r0 * out_w:r1 * out_w`` of the full ``col``,
and ``col2im`` adds only those columns back. A caller whose full ``col`` would be too large (a
2240x2240 image) walks the output in bands of rows through a bounded workspace.

CPU: Numba ``njit(parallel=True)``. CUDA: float32 and float64 kernels; arrays must be C-contiguous.
"""
import numpy as np
from numba import njit, prange

from ..lazy_cuda import cuda
from .common import grid_1d, launch
from .registry import cpu_variant, cuda_kernel, on_cpu, shared
from .shapes import conv_out_size

__all__ = ["im2col", "col2im", "im2col_batch", "col2im_batch", "conv_out_size", "col_shape",
           "out_shape"]


def _pair(value, name):
    pair = (value, value) if np.isscalar(value) else tuple(value)
    if len(pair) != 2 or any(int(v) != v for v in pair):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def col_shape(img_shape, kernel_size, stride=1, padding=0, dilation=1,
              rows=None) -> tuple[int, int]:
    """Shape of ``col`` for an image of shape ``(C, H, W)``: ``(C * kh * kw, out_h * out_w)``, or
    ``(C * kh * kw, (r1 - r0) * out_w)`` for the band ``rows=(r0, r1)`` of output rows."""
    shape, params = _geometry(img_shape, kernel_size, stride, padding, dilation)
    r0, r1 = _rows(rows, params[-2])
    return shape[0], (r1 - r0) * params[-1]


def out_shape(img_shape, kernel_size, stride=1, padding=0, dilation=1) -> tuple[int, int]:
    """``(out_h, out_w)`` for an image of shape ``(C, H, W)``, validated as ``col_shape`` is."""
    return _geometry(img_shape, kernel_size, stride, padding, dilation)[1][-2:]


def _rows(rows, out_h) -> tuple[int, int]:
    """The band ``(r0, r1)`` of output rows, all of them when ``rows`` is None; validated."""
    if rows is None:
        return 0, out_h
    r0, r1 = (int(r) for r in rows)
    if not 0 <= r0 < r1 <= out_h:
        raise ValueError(f"rows must be a band 0 <= r0 < r1 <= out_h = {out_h}, got {tuple(rows)}")
    return r0, r1


def _geometry(img_shape, kernel_size, stride, padding, dilation):
    """``(col shape, (kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w))``, validated."""
    if len(img_shape) != 3:
        raise ValueError(f"im2col takes one image [C, H, W], got shape {tuple(img_shape)}")
    channels, height, width = img_shape
    kh, kw = _pair(kernel_size, "kernel_size")
    sh, sw = _pair(stride, "stride")
    ph, pw = _pair(padding, "padding")
    dh, dw = _pair(dilation, "dilation")
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError("kernel_size, stride and dilation must be >= 1 and padding >= 0")
    out_h = conv_out_size(height, kh, sh, ph, dh)
    out_w = conv_out_size(width, kw, sw, pw, dw)
    if out_h < 1 or out_w < 1:
        raise ValueError(f"a {kh}x{kw} kernel (dilation {dh}x{dw}) does not fit a {height}x{width}"
                         f" image with padding {ph}x{pw}")
    return (channels * kh * kw, out_h * out_w), (kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w)


@shared
def source_index(out, k, stride, pad, dilation):
    """The image coordinate that output position ``out`` reads through kernel tap ``k``."""
    return out * stride - pad + k * dilation


# Kernels cannot call `source_index.cuda` through the _SharedFunction object (Numba cannot type
# it as a global); a plain global bound to the device function works.
_source_cpu = source_index.cpu
_source_cuda = source_index.cuda


# --- CPU ------------------------------------------------------------------------------------------

@njit(parallel=True, cache=True, nogil=True)
def _im2col_cpu(img, col, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w, r0, r1):
    height, width = img.shape[1], img.shape[2]
    # One col row per task: its writes are contiguous and no two tasks share one.
    for row in prange(col.shape[0]):
        c = row // (kh * kw)
        i = row // kw % kh
        j = row % kw
        for oh in range(r0, r1):
            h = _source_cpu(oh, i, sh, ph, dh)
            base = (oh - r0) * out_w
            for ow in range(out_w):
                w = _source_cpu(ow, j, sw, pw, dw)
                if 0 <= h < height and 0 <= w < width:
                    col[row, base + ow] = img[c, h, w]
                else:
                    col[row, base + ow] = 0


@njit(inline="always", cache=False)
def _inside(out_size, size, k, stride, pad, dilation):
    """The range of output positions whose tap ``k`` falls inside the image (not in the padding)."""
    offset = k * dilation - pad  # source = out * stride + offset
    low = 0 if offset >= 0 else (stride - 1 - offset) // stride
    high = min(out_size, (size - offset + stride - 1) // stride) if size > offset else 0
    return low, max(low, high)


@njit(parallel=True, cache=True, nogil=True)
def _col2im_cpu(col, img, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w, r0, r1):
    height, width = img.shape[1], img.shape[2]
    # One channel per task: overlapping patches add into the same pixels, but only within a channel.
    for c in prange(img.shape[0]):
        for i in range(kh):
            oh_low, oh_high = _inside(out_h, height, i, sh, ph, dh)
            oh_low, oh_high = max(oh_low, r0), min(oh_high, r1)  # this band's rows only
            for j in range(kw):
                # Loop bounds instead of a test per element: the inner loop is branch-free.
                ow_low, ow_high = _inside(out_w, width, j, sw, pw, dw)
                row = (c * kh + i) * kw + j
                for oh in range(oh_low, oh_high):
                    h = _source_cpu(oh, i, sh, ph, dh)
                    base = (oh - r0) * out_w
                    for ow in range(ow_low, ow_high):
                        img[c, h, _source_cpu(ow, j, sw, pw, dw)] += col[row, base + ow]


# --- CUDA -----------------------------------------------------------------------------------------

_SIG_IM2COL = "void({0}[:, :, ::1], {0}[:, ::1], " + ", ".join(["int64"] * 12) + ")"
_SIG_COL2IM = "void({0}[:, ::1], {0}[:, :, ::1], " + ", ".join(["int64"] * 14) + ")"
_SIG_IM2COL_BATCH = "void({0}[:, :, :, ::1], {0}[:, :, ::1], " + ", ".join(["int64"] * 10) + ")"
_SIG_COL2IM_BATCH = "void({0}[:, :, ::1], {0}[:, :, :, ::1], " + ", ".join(["int64"] * 10) + ")"


# Waking the thread pool costs more than copying a small column (LeNet's: 25 x 576 per sample)
# with one thread. The same code, compiled serial (prange runs as range).
PARALLEL_MIN = 1 << 17
_im2col_cpu_serial = cpu_variant(_im2col_cpu.py_func, "serial", parallel=False)
_col2im_cpu_serial = cpu_variant(_col2im_cpu.py_func, "serial", parallel=False)


@cuda.jit(device=True, inline="always")  # IR-inlined: compile_ptx needs no GPU
def _patch_down_column(img, col, c, oh, ow, column, kh, kw, sh, sw, ph, pw, dh, dw):
    """Copy the ``kh * kw`` taps of patch ``(c, oh, ow)`` of ``img[C, H, W]`` down ``column`` of
    ``col``: the one body of the image and the batch kernels."""
    height, width = img.shape[1], img.shape[2]
    row = c * kh * kw
    for i in range(kh):
        h = _source_cuda(oh, i, sh, ph, dh)
        for j in range(kw):
            w = _source_cuda(ow, j, sw, pw, dw)
            if 0 <= h < height and 0 <= w < width:
                col[row, column] = img[c, h, w]
            else:
                col[row, column] = 0
            row += 1


@cuda.jit(device=True, inline="always")  # IR-inlined: compile_ptx needs no GPU
def _gather_pixel(col, img, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, out_w, r0, r1):
    """``img[c, h, w]`` plus every entry of ``col`` (the band ``r0 <= oh < r1``) copied from it.

    Tap ``i`` reached ``h`` from ``oh`` when ``h + ph - i * dh == oh * sh``: a non-negative
    multiple of the stride, inside the band. A gather rather than a scatter: no atomics, and the
    sum's order is fixed, so results are deterministic."""
    total = img[c, h, w]
    for i in range(kh):
        h_off = h + ph - i * dh
        if h_off < 0:       # and for every later tap: h_off falls as i grows
            break
        # stride 1 (most convolutions) divides nothing: a 64-bit division or remainder is a
        # software routine of tens of instructions, and this loop ran four per tap
        if sh == 1:
            oh = h_off
        elif h_off % sh != 0:
            continue
        else:
            oh = h_off // sh
        if oh < r0 or oh >= r1:
            continue
        for j in range(kw):
            w_off = w + pw - j * dw
            if w_off < 0:
                break
            if sw == 1:
                ow = w_off
            elif w_off % sw != 0:
                continue
            else:
                ow = w_off // sw
            if ow < out_w:
                total += col[(c * kh + i) * kw + j, (oh - r0) * out_w + ow]
    return total


@cuda_kernel(_SIG_IM2COL.format("float32"), _SIG_IM2COL.format("float64"))
def im2col_kernel(img, col, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w, r0, r1):
    """One thread per ``(c, oh, ow)`` of the band ``r0 <= oh < r1``: it copies that patch's
    ``kh * kw`` taps down its column.

    1-D grid over ``C * (r1 - r0) * out_w``. For each tap, a warp writes consecutive columns of one
    row (coalesced); the division into ``(c, oh, ow)`` is paid once per patch, not once per tap.
    """
    t = cuda.grid(1)
    band = (r1 - r0) * out_w
    if t >= img.shape[0] * band:
        return
    column = t % band
    _patch_down_column(img, col, t // band, r0 + column // out_w, column % out_w, column,
                       kh, kw, sh, sw, ph, pw, dh, dw)


@cuda_kernel(_SIG_IM2COL_BATCH.format("float32"), _SIG_IM2COL_BATCH.format("float64"))
def im2col_batch_kernel(imgs, cols, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w):
    """``im2col_kernel`` over a chunk of images at once, the batch in the grid: one thread per
    ``(n, c, oh, ow)``, 1-D grid over ``B * C * out_h * out_w``; one launch per chunk."""
    t = cuda.grid(1)
    plane = out_h * out_w
    per_image = imgs.shape[1] * plane
    if t >= imgs.shape[0] * per_image:
        return
    n = t // per_image
    column = t % plane
    _patch_down_column(imgs[n], cols[n], t % per_image // plane, column // out_w,
                       column % out_w, column, kh, kw, sh, sw, ph, pw, dh, dw)


@cuda_kernel(_SIG_COL2IM.format("float32"), _SIG_COL2IM.format("float64"))
def col2im_kernel(col, img, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w, r0, r1, h0, h1):
    """One thread per pixel ``(c, h, w)``: it gathers every column entry copied from it, and adds.

    1-D grid over ``C * (h1 - h0) * W``: ``h0 <= h < h1`` are the image rows that the output band
    ``r0 <= oh < r1`` reads (all of them for the whole output; the launcher computes them).
    """
    t = cuda.grid(1)
    width = img.shape[2]
    rows = h1 - h0
    if t >= img.shape[0] * rows * width:
        return
    w = t % width
    h = h0 + t // width % rows
    c = t // (width * rows)
    img[c, h, w] = _gather_pixel(col, img, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, out_w, r0,
                                 r1)


@cuda_kernel(_SIG_COL2IM_BATCH.format("float32"), _SIG_COL2IM_BATCH.format("float64"))
def col2im_batch_kernel(cols, imgs, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w):
    """``col2im_kernel`` over a chunk of images, the batch in the grid: one thread per
    ``(n, c, h, w)``, 1-D grid over ``B * C * H * W``; one launch per chunk."""
    t = cuda.grid(1)
    plane = imgs.shape[2] * imgs.shape[3]
    per_image = imgs.shape[1] * plane
    if t >= imgs.shape[0] * per_image:
        return
    n = t // per_image
    c = t % per_image // plane
    h = t % plane // imgs.shape[3]
    w = t % imgs.shape[3]
    img = imgs[n]
    img[c, h, w] = _gather_pixel(cols[n], img, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, out_w,
                                 0, out_h)


# --- launchers ------------------------------------------------------------------------------------

def im2col(img, col, kernel_size, stride=1, padding=0, dilation=1, stream=None, rows=None):
    """Fill ``col[C * kh * kw, out_h * out_w]`` from ``img[C, H, W]`` (see the module doc);
    returns col.

    ``kernel_size``, ``stride``, ``padding``, ``dilation``: an int or an ``(h, w)`` pair. Every
    element of ``col`` is written (padding taps get 0). ``stream``: CUDA stream (ignored on CPU).
    ``rows=(r0, r1)``: only output rows ``r0 <= oh < r1``, into
    ``col[C * kh * kw, (r1 - r0) * out_w]``.
    """
    params = _check(img, col, kernel_size, stride, padding, dilation, rows)
    if on_cpu(img):
        (_im2col_cpu if col.size >= PARALLEL_MIN else _im2col_cpu_serial)(img, col, *params)
    else:
        launch(im2col_kernel, *grid_1d(img.shape[0] * col.shape[1]), stream)(img, col, *params)
    return col


def col2im(col, img, kernel_size, stride=1, padding=0, dilation=1, stream=None, rows=None):
    """``img[C, H, W] += im2col^T(col)``: add every column entry into its source pixel; returns img.

    The adjoint of ``im2col`` with the same geometry: ``<col2im(y), x> == <y, im2col(x)>`` when
    ``img`` starts at zero. Zero ``img`` first for a plain (non-accumulating) result. With
    ``rows=(r0, r1)``, ``col`` is that band's (as ``im2col`` fills it) and only the pixels the band
    reads are touched: summing ``col2im`` over bands that cover the output gives the full result.
    """
    params = _check(img, col, kernel_size, stride, padding, dilation, rows)
    if on_cpu(img):
        (_col2im_cpu if col.size >= PARALLEL_MIN else _col2im_cpu_serial)(col, img, *params)
    else:
        kh, _, sh, _, ph, _, dh, _, _, _, r0, r1 = params
        h0 = max(0, r0 * sh - ph)  # the image rows the band reads: tap 0 of r0 .. tap kh-1 of r1-1
        h1 = min(img.shape[1], (r1 - 1) * sh - ph + (kh - 1) * dh + 1)
        if h1 > h0:  # else the band reads only padding: nothing to add
            blocks, threads = grid_1d(img.shape[0] * (h1 - h0) * img.shape[2])
            launch(col2im_kernel, blocks, threads, stream)(col, img, *params, h0, h1)
    return img


def im2col_batch(imgs, cols, kernel_size, stride=1, padding=0, dilation=1, stream=None):
    """``im2col`` of each image of ``imgs[B, C, H, W]`` into ``cols[B, C * kh * kw, out_h *
    out_w]``; on CUDA one launch for the whole chunk (the batch in the grid); returns cols."""
    params = _check_batch(imgs, cols, kernel_size, stride, padding, dilation)
    if on_cpu(imgs):
        for img, col in zip(imgs, cols):
            im2col(img, col, kernel_size, stride, padding, dilation)
    else:
        launch(im2col_batch_kernel, *grid_1d(imgs.shape[0] * imgs.shape[1] * cols.shape[2]),
               stream)(imgs, cols, *params)
    return cols


def col2im_batch(cols, imgs, kernel_size, stride=1, padding=0, dilation=1, stream=None):
    """``imgs[n] += im2col^T(cols[n])`` for each image of the chunk (``col2im`` batched); on CUDA
    one launch for the whole chunk; returns imgs."""
    params = _check_batch(imgs, cols, kernel_size, stride, padding, dilation)
    if on_cpu(imgs):
        for img, col in zip(imgs, cols):
            col2im(col, img, kernel_size, stride, padding, dilation)
    else:
        launch(col2im_batch_kernel, *grid_1d(imgs.size), stream)(cols, imgs, *params)
    return imgs


def _check_batch(imgs, cols, kernel_size, stride, padding, dilation):
    if imgs.ndim != 4 or cols.ndim != 3 or imgs.shape[0] != cols.shape[0]:
        raise ValueError(f"im2col_batch/col2im_batch take imgs [B, C, H, W] and cols [B, K, L] "
                         f"of one B, got {tuple(imgs.shape)} and {tuple(cols.shape)}")
    # one image's shapes, not imgs[0]: a CUDA array's slice costs tens of microseconds
    return _check(imgs, cols, kernel_size, stride, padding, dilation, None,
                  shapes=(imgs.shape[1:], cols.shape[1:]))[:-2]


def _check(img, col, kernel_size, stride, padding, dilation, rows, shapes=None):
    img_shape, col_shape = shapes or (img.shape, col.shape)
    full, params = _geometry(img_shape, kernel_size, stride, padding, dilation)
    r0, r1 = _rows(rows, params[-2])
    shape = (full[0], (r1 - r0) * params[-1])
    if tuple(col_shape) != shape:
        raise ValueError(f"col has shape {tuple(col_shape)}, expected {shape} for image "
                         f"{tuple(img_shape)}")
    if on_cpu(img) != on_cpu(col):
        raise TypeError("img and col must both be numpy arrays or both CUDA device arrays")
    if img.dtype != col.dtype or img.dtype not in (np.float32, np.float64):
        raise TypeError(f"img and col must share a dtype, float32 or float64: {img.dtype}, "
                        f"{col.dtype}")
    if not on_cpu(img) and not (img.is_c_contiguous() and col.is_c_contiguous()):
        raise ValueError("im2col/col2im on CUDA need C-contiguous img and col")
    return params + (r0, r1)
