"""The input gradient of a convolution on the ``cpu`` device, two direct ways.

**Transposed** (``conv_input_grad_direct``, stride 1): ``dx`` is a direct convolution of ``dy``
with the weights flipped and their channel axes swapped (``transposed_geometry``), run by
``conv``'s kernel; ``input_grad_pays`` says where that beats col2im.

**Samples in the vector lanes** (``conv_input_grad_lanes``): the transposed convolution puts output
positions in the lanes. Where most of what it reads is padding, that wastes the vector: LeNet
conv2's 5x5 kernel on an 8x8 ``dy`` pads it by 4 on each side (56% of the products are with zeros),
and a stride of 2 would need ``dy`` dilated by zeros (3 of 4). col2im instead goes through a ``kh *
kw`` times larger buffer and a GEMM whose OpenBLAS threads keep spinning after it. Here ``VL``
samples ride in the lanes, and every element of ``dx`` sums exactly its valid taps, for any stride,
padding and dilation::

    dx[n, c, h, w] = sum over (i, oh) in rows(h), (j, ow) in cols(w), o of
                     weight[o, c, i, j] * dy[n, o, oh, ow]
    rows(h) = {(i, oh): oh * sh - ph + i * dh = h, 0 <= oh < OH}      (cols(w) alike)

``dy`` is first copied, a chunk of samples at a time, to ``dyT[oh * OW + ow, o, n]`` (zero past
the batch), the weights to ``wT[i * kw + j, o, c]``. For one position ``(h, w)`` and ``VL``
samples, the microkernel (``_sample_tile``) keeps ``block`` channels' accumulators in registers
and loops over the position's valid taps and then ``o``: one vector load of ``dyT``, ``block``
FMAs with broadcast weights. Each lane is one sample: a row of ``dx`` is stored as ``[W, C, VL]``
in a buffer of the task's own and then transposed into place. Two layouts measured slower, both
because every access of a loop fell a power of two apart, into one cache set: ``o`` outermost in
``dyT``, and results scattered straight into ``dx``, lanes ``C * H * W`` apart (the figures of
this and of every rule below are in docs/benchmarks.md, "Why the code chose").
Every sum runs in the same order whatever the threads do: deterministic.
"""
from functools import lru_cache

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from ..registry import cpu_variant
from .conv import chunk_size, conv_forward_direct, supports
from .rules.input_grad import (  # noqa: F401  (its rules, named as its own)
    DX_GEMM_PLANE,
    DX_GEMM_WEIGHTS,
    GEMM_CHANNELS,
    LANES_MIN_SIZE,
    LANES_MIN_SIZE_8,
    input_grad_pays,
    sample_lanes_pay,
    transposed_geometry,
)
from .vector_ir import BLOCK, I64, VL, Vectors, variant

__all__ = ["transposed_geometry", "DX_GEMM_WEIGHTS", "DX_GEMM_PLANE", "input_grad_pays",
           "conv_input_grad_direct", "valid_taps", "sample_lanes_pay", "conv_input_grad_lanes"]

def conv_input_grad_direct(dy, weight, dx, work, geometry) -> bool:
    """``dx`` (overwritten) of a stride-1 convolution as a direct convolution of ``dy``, through
    ``work``. False, with nothing written, where the direct path does not apply or ``work`` holds
    less than one sample."""
    transposed = transposed_geometry(geometry)
    if transposed is None or not supports(dy.dtype, 1):
        return False
    chunk = chunk_size(dy.shape, transposed, work.size)
    if chunk < 1:
        return False
    flipped = np.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
    conv_forward_direct(dy, flipped, None, dx, work, chunk, transposed)
    return True


@intrinsic
def _sample_tile(typingctx, block, vl, dy, w, pairs, count, outputs, dy_output, w_output, out):
    """``out[b, l] = sum over count pairs k, o of dyT[., o, n0 + l] wT[., o, c0 + b]`` for ``b <
    block`` and all ``vl`` lanes (``block``, ``vl`` integer literals): addresses as integers,
    strides in elements. ``pairs`` points at ``count >= 1`` int64 pairs ``(dyT offset, wT
    offset)`` of the position's valid taps; ``dy`` at ``dyT[0, 0, n0]``, ``w`` at ``wT[0, 0,
    c0]``, ``out`` at ``block`` rows of ``vl`` floats; ``outputs >= 1``."""
    if not all(isinstance(t, types.IntegerLiteral) for t in (block, vl)):
        return None
    sig = types.void(block, vl, *([types.intp] * 8))
    block, vl = block.literal_value, vl.literal_value

    def codegen(context, builder, signature, args):
        dy, w, pairs, count, outputs, dy_output, w_output, out = args[2:]
        v = Vectors(builder, vl)
        dy, w, pairs, out = v.pointer(dy), v.pointer(w), v.pointer(pairs, I64), v.pointer(out)
        constant = v.constant

        tap_body, k, tap_acc = v.open_loop("tap", [v.zero] * block)
        pair = v.at(pairs, builder.mul(k, constant(2)))
        dy_k = v.at(dy, builder.load(pair))
        w_k = v.at(w, builder.load(v.at(pair, constant(1))))
        output_body, o, acc = v.open_loop("output", tap_acc)
        inputs = v.load(v.at(dy_k, builder.mul(o, dy_output)))
        w_o = v.at(w_k, builder.mul(o, w_output))
        current = [v.fma(inputs, v.splat(builder.load(v.at(w_o, constant(b)))), acc[b])
                   for b in range(block)]
        v.close_loop(output_body, o, acc, current, outputs, "outputs_done")
        v.close_loop(tap_body, k, tap_acc, current, count, "taps_done")
        every = v.lanes_below(constant(vl))
        for b in range(block):
            v.masked_store(current[b], v.at(out, constant(b * vl)), every)
        return context.get_dummy_value()

    return sig, codegen


def _lanes_kernel(block: int, rest: int, vl: int):
    """The driver for ``C = q * block + rest`` channels (``block``, ``rest``: literals)."""
    def input_grad_lanes(dyT, wT, dx, row_taps, row_start, col_taps, col_start, out_w, kw):
        samples, channels, height, width = dx.shape
        plane, outputs, lanes_total = dyT.shape
        groups = (samples + vl - 1) // vl
        most = (row_start[1:] - row_start[:-1]).max() * (col_start[1:] - col_start[:-1]).max()
        da, wa = dyT.ctypes.data, wT.ctypes.data
        for task in prange(groups * height):
            g, h = task // height, task % height
            pairs = np.empty(2 * max(most, 1), np.int64)
            row = np.empty((width, channels, vl), np.float32)
            pa, ra = pairs.ctypes.data, row.ctypes.data
            for x in range(width):
                count = 0
                for a in range(row_start[h], row_start[h + 1]):
                    i, oh = row_taps[a, 0], row_taps[a, 1]
                    for b in range(col_start[x], col_start[x + 1]):
                        j, ow = col_taps[b, 0], col_taps[b, 1]
                        pairs[2 * count] = (oh * out_w + ow) * outputs * lanes_total
                        pairs[2 * count + 1] = (i * kw + j) * outputs * channels
                        count += 1
                if count == 0:      # no tap reaches this position (stride > kernel reach)
                    row[x] = 0
                    continue
                dy_at, out_at = da + 4 * g * vl, ra + 4 * x * channels * vl
                c0 = 0
                while c0 + block <= channels:
                    _sample_tile(block, vl, dy_at, wa + 4 * c0, pa, count, outputs,
                                 lanes_total, channels, out_at + 4 * c0 * vl)
                    c0 += block
                if rest:
                    _sample_tile(rest, vl, dy_at, wa + 4 * c0, pa, count, outputs,
                                 lanes_total, channels, out_at + 4 * c0 * vl)
            for lane in range(min(vl, samples - g * vl)):
                for c in range(channels):
                    target = dx[g * vl + lane, c, h]
                    for x in range(width):
                        target[x] = row[x, c, lane]
    return cpu_variant(input_grad_lanes, variant(f"block{block}_rest{rest}_vl{vl}"), True)


@njit(parallel=True, cache=True, nogil=True)
def _samples_last(dy, dyT):
    """``dyT[p, o, n] = dy[n, o, p]``, 0 for ``n`` past ``dy``'s samples."""
    samples = dy.shape[0]
    plane, outputs, lanes_total = dyT.shape
    # Sixteen positions a task, gathered in a buffer of the task's own and written out as whole
    # rows: written straight, sixteen rows of dyT ``outputs * lanes`` apart (a power of two,
    # often) would share one cache set (measured slower).
    per = (plane + 15) // 16
    for task in prange(outputs * per):
        o, p0 = task // per, (task % per) * 16
        p1 = min(plane, p0 + 16)
        tile = np.zeros((16, lanes_total), np.float32)
        for n in range(samples):
            source = dy[n, o]
            for p in range(p0, p1):
                tile[p - p0, n] = source[p]
        for p in range(p0, p1):
            row, target = tile[p - p0], dyT[p, o]
            for n in range(lanes_total):
                target[n] = row[n]


@lru_cache(maxsize=256)
def valid_taps(size: int, out_size: int, k: int, stride: int, pad: int, dilation: int):
    """``(taps, start)``: input index ``h`` is reached by the pairs ``taps[start[h]:start[h + 1]]``
    of ``(kernel index i, output index oh)`` with ``oh * stride - pad + i * dilation = h``."""
    taps, start = [], [0]
    for h in range(size):
        for i in range(k):
            reach = h + pad - i * dilation
            if reach % stride == 0 and 0 <= reach // stride < out_size:
                taps.append((i, reach // stride))
        start.append(len(taps))
    return np.array(taps, np.int64).reshape(-1, 2), np.array(start, np.int64)


_KERNELS: dict = {}


def conv_input_grad_lanes(dy, weight, dx, work, geometry) -> bool:
    """``dx`` (overwritten) for float32 ``dy``, ``weight`` without groups, through ``work`` (flat
    float32); False, with nothing written, where ``work`` holds less than ``VL`` samples of
    ``dyT``."""
    samples, outputs, out_h, out_w = dy.shape
    channels, height, width = dx.shape[1:]
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
    per_sample = outputs * out_h * out_w
    chunk = min(-(-samples // VL) * VL, work.size // per_sample // VL * VL)
    if chunk < VL:
        return False
    block = min(channels, BLOCK)
    key = (block, channels % block, VL)
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = _lanes_kernel(*key)
    row_taps, row_start = valid_taps(height, out_h, kh, sh, ph, dh)
    col_taps, col_start = valid_taps(width, out_w, kw, sw, pw, dw)
    wT = np.ascontiguousarray(weight.transpose(2, 3, 0, 1)).reshape(kh * kw, outputs, channels)
    dy3 = dy.reshape(samples, outputs, out_h * out_w)
    for n0 in range(0, samples, chunk):
        n1 = min(samples, n0 + chunk)
        dyT = work[:outputs * out_h * out_w * chunk].reshape(out_h * out_w, outputs, chunk)
        _samples_last(dy3[n0:n1], dyT)
        kernel(dyT, wT, dx[n0:n1], row_taps, row_start, col_taps, col_start, out_w, kw)
    return True
