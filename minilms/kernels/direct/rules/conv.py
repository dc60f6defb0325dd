"""Where the direct forward pays, and how it lays out a sample's input: what its workspace holds
(``direct.conv`` runs it)."""
from typing import NamedTuple

import numpy as np

from . import host_lanes

__all__ = ["Layout", "layout", "lanes", "padded_size", "FWD_GEMM_WEIGHTS", "FWD_GEMM_PLANE",
           "forward_pays"]


class Layout(NamedTuple):
    """Where the kernels read one sample's input: ``x`` itself (``prepared`` False), or the copy
    ``prepare_input`` makes (``per_sample`` its shape); tap ``t`` of a tile is ``offsets[t]``
    elements from the tile's first input; ``flat``: a tile spans output rows."""
    flat: bool
    prepared: bool
    vl: int
    step: int        # elements between a tap's consecutive inputs (2: ``x`` at stride 2)
    per_sample: tuple
    offsets: list
    x_channel: int
    x_row: int


def layout(x_shape, kernel_size, stride, padding, dilation, max_step: int = 2,
           vl: int | None = None) -> Layout:
    """The input layout for ``x_shape``. The kernels read ``x`` itself, taps masked where they
    fall in the padding, where its rows line up with the tiles': rows mode with a horizontal
    stride of 1 or 2 (at most ``max_step``), or flat with stride 1 and rows as long as the
    output's. Else a prepared copy. Flat where the vertical stride is 1 and rows of ``out_w``
    would leave lanes empty. ``vl``: the vectors' lanes (the host's, ``host_lanes()``, where
    None)."""
    vl = host_lanes() if vl is None else vl
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
    channels, height, width = x_shape[1], x_shape[2], x_shape[3]
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    flat = sh == 1 and out_w % vl != 0
    if (sw == 1 and (not flat or out_w == width)) or (sw == 2 <= max_step and not flat):
        offsets = [i * dh * width + j * dw for i in range(kh) for j in range(kw)]
        return Layout(flat, False, vl if flat else lanes(out_w, vl), sw, (), offsets,
                      height * width, width)
    rows = max(height + 2 * ph, (out_h - 1) * sh + dh * (kh - 1) + 1)
    if flat:
        offsets = [j * rows * out_w + i * dh * out_w for i in range(kh) for j in range(kw)]
        return Layout(True, True, vl, 1, (channels, kw, rows, out_w), offsets,
                      kw * rows * out_w, out_w)
    quarters = -(-max(width + 2 * pw, (out_w - 1) * sw + dw * (kw - 1) + 1) // sw)
    offsets = [i * dh * sw * quarters + ((j * dw) % sw) * quarters + (j * dw) // sw
               for i in range(kh) for j in range(kw)]
    return Layout(False, True, lanes(out_w, vl), 1, (channels, rows, sw, quarters), offsets,
                  rows * sw * quarters, sw * quarters)


def lanes(out_w: int, vl: int | None = None) -> int:
    """The vector width for rows of ``out_w`` outputs: ``vl`` (the host's, ``host_lanes()``,
    where None), or 8 where that takes as few vectors a row (an 8-wide row fills a ymm register
    and leaves no zmm half empty)."""
    vl = host_lanes() if vl is None else vl
    return vl if -(-out_w // vl) < -(-out_w // 8) else 8


def padded_size(x_shape, kernel_size, stride, padding, dilation, max_step: int = 2,
                vl: int | None = None) -> int:
    """Float elements of one sample's prepared input (``xs`` or ``xw``); 0 where the kernels
    read ``x`` itself. ``vl`` as ``layout``'s: with ``SIZE_LANES`` it is at least the size on
    any host (8 lanes prepare a copy only where 16 do, and never a larger one)."""
    lay = layout(x_shape, kernel_size, stride, padding, dilation, max_step, vl)
    return int(np.prod(lay.per_sample)) if lay.prepared else 0


# Weights (output x input channels) from which im2col + GEMM makes the forward faster than the
# direct kernel, on output planes of at most FWD_GEMM_PLANE positions (measured). The same bounds
# as the weight gradient's (weight_grad.DW_GEMM_*): a layer whose forward takes the GEMM takes it
# for dW too, so it keeps the columns' workspace it had.
FWD_GEMM_WEIGHTS = 1 << 14
FWD_GEMM_PLANE = 28 * 28


def forward_pays(weight_shape, out_plane: int) -> bool:
    """Measured (``scripts/bench_blas.py``'s way, alternating; the figures in docs/benchmarks.md):
    the direct forward beats im2col + GEMM on few channels or a large plane (ResNet's first stage,
    LeNet, a small ResNet, GoogLeNet's 5x5s), and loses where many channels meet a small plane:
    there each tile of the plane streams the whole weight through the cache again."""
    out, channels, kh, kw = weight_shape
    return not (out * channels >= FWD_GEMM_WEIGHTS and out_plane <= FWD_GEMM_PLANE)
