"""im2col / col2im: convolution as GEMM, for one NCHW image at a time (Caffe's layout).

For an image ``img[C, H, W]``, a kernel ``kh x kw``, stride ``(sh, sw)``, padding ``(ph, pw)`` and
dilation ``(dh, dw)``, the output is ``out_h x out_w`` with
``out_h = (H + 2 ph - dh (kh - 1) - 1) // sh + 1`` (likewise ``out_w``), and

    col[(c * kh + i) * kw + j, oh * out_w + ow] = img[c, oh * sh - ph + i * dh, ow * sw - pw + j * dw]

(zero where that falls in the padding), so ``col`` is ``[C * kh * kw, out_h * out_w]`` and a
convolution's forward pass is ``gemm(weight.reshape(K, C * kh * kw), col, out.reshape(K, -1))``.

``col2im`` is the adjoint: it *adds* every column entry back into the pixel it came from
(``img += im2col^T(col)``), which is the input gradient once ``col`` holds ``weight^T @ dout``.
Adding, not overwriting, lets a caller accumulate gradients.

One image per call, so the ``col`` workspace never grows with the batch: the caller loops over the
batch. Groups are the caller's too: for group ``g`` of ``G``, pass the channel slice
``img[g * C // G:(g + 1) * C // G]`` (still C-contiguous) and its own ``col``.

CPU: Numba ``njit(parallel=True)``. CUDA: float32 and float64 kernels; arrays must be C-contiguous.
"""
import numpy as np
from numba import cuda, njit, prange

from .registry import cuda_kernel, grid_1d, on_cpu, shared

__all__ = ["im2col", "col2im", "conv_out_size", "col_shape"]


def _pair(value, name):
    pair = (value, value) if np.isscalar(value) else tuple(value)
    if len(pair) != 2 or any(int(v) != v for v in pair):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def conv_out_size(size, kernel, stride=1, padding=0, dilation=1) -> int:
    """Output extent along one axis: ``(size + 2 padding - dilation (kernel - 1) - 1) // stride + 1``."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def col_shape(img_shape, kernel_size, stride=1, padding=0, dilation=1) -> tuple[int, int]:
    """Shape of ``col`` for an image of shape ``(C, H, W)``: ``(C * kh * kw, out_h * out_w)``."""
    return _geometry(img_shape, kernel_size, stride, padding, dilation)[0]


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

@njit(parallel=True, cache=False)
def _im2col_cpu(img, col, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w):
    height, width = img.shape[1], img.shape[2]
    # One col row per task: its writes are contiguous and no two tasks share one.
    for row in prange(col.shape[0]):
        c = row // (kh * kw)
        i = row // kw % kh
        j = row % kw
        for oh in range(out_h):
            h = _source_cpu(oh, i, sh, ph, dh)
            base = oh * out_w
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


@njit(parallel=True, cache=False)
def _col2im_cpu(col, img, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w):
    height, width = img.shape[1], img.shape[2]
    # One channel per task: overlapping patches add into the same pixels, but only within a channel.
    for c in prange(img.shape[0]):
        for i in range(kh):
            oh_low, oh_high = _inside(out_h, height, i, sh, ph, dh)
            for j in range(kw):
                # Loop bounds instead of a test per element: the inner loop is branch-free.
                ow_low, ow_high = _inside(out_w, width, j, sw, pw, dw)
                row = (c * kh + i) * kw + j
                for oh in range(oh_low, oh_high):
                    h = _source_cpu(oh, i, sh, ph, dh)
                    base = oh * out_w
                    for ow in range(ow_low, ow_high):
                        img[c, h, _source_cpu(ow, j, sw, pw, dw)] += col[row, base + ow]


# --- CUDA -----------------------------------------------------------------------------------------

_SIG_IM2COL = "void({0}[:, :, ::1], {0}[:, ::1], " + ", ".join(["int64"] * 10) + ")"
_SIG_COL2IM = "void({0}[:, ::1], {0}[:, :, ::1], " + ", ".join(["int64"] * 10) + ")"


@cuda_kernel(_SIG_IM2COL.format("float32"), _SIG_IM2COL.format("float64"))
def im2col_kernel(img, col, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w):
    """One thread per ``(c, oh, ow)``: it copies that patch's ``kh * kw`` taps down its column.

    1-D grid over ``C * out_h * out_w``. For each tap, a warp writes consecutive columns of one
    row (coalesced); the division into ``(c, oh, ow)`` is paid once per patch, not once per tap.
    """
    t = cuda.grid(1)
    if t >= img.shape[0] * out_h * out_w:
        return
    height, width = img.shape[1], img.shape[2]
    column = t % (out_h * out_w)
    c = t // (out_h * out_w)
    oh = column // out_w
    ow = column % out_w
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


@cuda_kernel(_SIG_COL2IM.format("float32"), _SIG_COL2IM.format("float64"))
def col2im_kernel(col, img, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w):
    """One thread per pixel ``(c, h, w)``: it gathers every column entry copied from it, and adds.

    1-D grid over ``C * H * W``. A gather rather than a scatter: no atomics, and the sum's order is
    fixed, so results are deterministic. Tap ``i`` reached ``h`` from ``oh`` when
    ``h + ph - i * dh == oh * sh``: a non-negative multiple of the stride, below ``out_h``.
    """
    t = cuda.grid(1)
    height, width = img.shape[1], img.shape[2]
    if t >= img.shape[0] * height * width:
        return
    w = t % width
    h = t // width % height
    c = t // (width * height)
    total = img[c, h, w]
    for i in range(kh):
        h_off = h + ph - i * dh
        if h_off < 0 or h_off % sh != 0 or h_off // sh >= out_h:
            continue
        oh = h_off // sh
        for j in range(kw):
            w_off = w + pw - j * dw
            if w_off < 0 or w_off % sw != 0 or w_off // sw >= out_w:
                continue
            total += col[(c * kh + i) * kw + j, oh * out_w + w_off // sw]
    img[c, h, w] = total


# --- launchers ------------------------------------------------------------------------------------

def im2col(img, col, kernel_size, stride=1, padding=0, dilation=1, stream=None):
    """Fill ``col[C * kh * kw, out_h * out_w]`` from ``img[C, H, W]`` (see the module doc); returns col.

    ``kernel_size``, ``stride``, ``padding``, ``dilation``: an int or an ``(h, w)`` pair. Every
    element of ``col`` is written (padding taps get 0). ``stream``: CUDA stream (ignored on CPU).
    """
    params = _check(img, col, kernel_size, stride, padding, dilation)
    if on_cpu(img):
        _im2col_cpu(img, col, *params)
    else:
        blocks, threads = grid_1d(img.shape[0] * params[-2] * params[-1])
        im2col_kernel[blocks, threads, 0 if stream is None else stream](img, col, *params)
    return col


def col2im(col, img, kernel_size, stride=1, padding=0, dilation=1, stream=None):
    """``img[C, H, W] += im2col^T(col)``: add every column entry into its source pixel; returns img.

    The adjoint of ``im2col`` with the same geometry: ``<col2im(y), x> == <y, im2col(x)>`` when
    ``img`` starts at zero. Zero ``img`` first for a plain (non-accumulating) result.
    """
    params = _check(img, col, kernel_size, stride, padding, dilation)
    if on_cpu(img):
        _col2im_cpu(col, img, *params)
    else:
        blocks, threads = grid_1d(img.size)
        col2im_kernel[blocks, threads, 0 if stream is None else stream](col, img, *params)
    return img


def _check(img, col, kernel_size, stride, padding, dilation):
    shape, params = _geometry(img.shape, kernel_size, stride, padding, dilation)
    if tuple(col.shape) != shape:
        raise ValueError(f"col has shape {tuple(col.shape)}, expected {shape} for image "
                         f"{tuple(img.shape)}")
    if on_cpu(img) != on_cpu(col):
        raise TypeError("img and col must both be numpy arrays or both CUDA device arrays")
    if img.dtype != col.dtype or img.dtype not in (np.float32, np.float64):
        raise TypeError(f"img and col must share a dtype, float32 or float64: {img.dtype}, "
                        f"{col.dtype}")
    if not on_cpu(img) and not (img.is_c_contiguous() and col.is_c_contiguous()):
        raise ValueError("im2col/col2im on CUDA need C-contiguous img and col")
    return params
