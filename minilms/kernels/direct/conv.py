"""Direct convolution on the ``cpu`` device: register-blocked, no im2col, float32.

im2col + GEMM is weak where channels are few (LeNet, a small ResNet): the columns are ``kh * kw``
times the input, and a GEMM whose M is 16-64 output channels spends its time streaming them
(measured: OpenBLAS's GEMM alone took as long as PyTorch's whole convolution). Here each output
element is computed from the input where it lies, in registers, as oneDNN does.

The microkernel (``_tile``) is LLVM vector IR emitted through a Numba ``intrinsic``: Numba's own
loops neither keep accumulators in registers nor vectorise this nest. For one sample, output
row ``oh`` and ``OB`` consecutive output channels ``o0 ..``, it computes ``VL`` consecutive outputs
``ow0 .. ow0 + VL`` of each channel (``VL`` = the host's float vector: 16 with AVX-512, else 8)::

    acc[o] = bias[o0 + o]                                        (one vector per channel)
    for c in channels, for t = (i, j) in taps:                   (taps unrolled)
        v = xs[c, row + i * dh, phase(j), ow0 + shift(j) ...]   (one vector load)
        acc[o] += w[o0 + o, c, i, j] * v                         (broadcast, FMA; o unrolled)
    y[o0 + o, oh, ow0 ...] = acc[o]

Each tap's ``VL`` inputs must lie consecutively in memory, or every other element. With a
horizontal stride of 1 or 2 they do in ``x`` itself: the kernels read it directly (at stride 2,
two loads whose even lanes one permute picks), and a lane whose tap falls in the padding is
masked off (reads nothing, adds 0). ``tile_table`` lists each tile's offsets and, per tap, the lanes
that read. A tile is a row segment (rows mode) or, where rows of ``out_w`` would leave lanes
empty and the output is as wide as the input, ``VL`` consecutive outputs of the plane (flat
mode: ``x.flat[p + i * dh * W + j * dw - ph * W - pw]`` for output ``p``).

Otherwise the input is first copied, a chunk of samples at a time, into a layout where they do:

* rows mode: padded and split into ``sw`` phases, ``xs[c, r, p, q] = x_padded[c, r, q * sw + p]``;
  output ``ow``'s tap ``j`` reads phase ``(j * dw) % sw`` at ``q = ow + (j * dw) // sw``, and rows
  take the vertical stride directly (``r = oh * sh + i * dh``);
* flat mode (vertical stride 1, rows that would leave lanes empty): ``kw`` width-shifted copies
  ``xw[c, j, r, ow] = x_padded[c, r, ow * sw + j * dw]`` with rows exactly ``OW`` long, so output
  ``p = oh * OW + ow`` reads ``xw[c, j].flat[p + i * dh * OW]``: one vector spans output rows.

Reading ``x`` itself saves the copy and reads a smaller, unpadded input (measured faster).
Every output is a sum in the same order (channel, then tap), whatever the threads do: results are
deterministic, and equal to im2col + GEMM up to float32 rounding.
"""
from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ..registry import cpu_variant
from .rules.conv import (
    FWD_GEMM_PLANE,
    FWD_GEMM_WEIGHTS,
    Layout,
    forward_pays,
    lanes,
    layout,
    padded_size,
)
from .vector_ir import BLOCK, I32, I64, VL, Vectors, variant

__all__ = ["VL", "Layout", "lanes", "layout", "tile_table", "padded_size", "chunk_size",
           "kernel_inputs", "prepare_input", "supports", "conv_forward_direct",
           "FWD_GEMM_WEIGHTS", "FWD_GEMM_PLANE", "forward_pays"]

@intrinsic
def _tile(typingctx, block, taps, vl, step, x, w, bias, offsets, masks, y, channels, x_channel,
          w_output, y_plane):
    """The microkernel for ``block`` output channels, ``taps`` taps, ``vl`` lanes and inputs
    ``step`` elements apart (integer literals: each combination compiles its own unrolled code):
    ``_tile(block, taps, vl, step, x, w, bias, offsets, masks, y, channels, x_channel, w_output,
    y_plane)``, addresses as integers, strides in elements. ``x`` points at channel 0's input for
    the tile's first output, ``w`` at ``w[o0, 0, 0, 0]``, ``bias`` at ``bias[o0]``, ``offsets`` at
    ``taps`` element offsets (int64), ``masks`` at ``1 + taps`` bit masks (int64: the lanes
    stored, then the elements each tap reads, ``Vectors.spaced_load``'s; the others read nothing
    and add 0), ``y`` at ``y[o0, oh, ow0]``. A global, not a closure: Numba's disk cache keys a
    function on its closure's pickle, and an intrinsic pickles differently in every process."""
    if not all(isinstance(t, types.IntegerLiteral) for t in (block, taps, vl, step)):
        return None
    # The literals stay in the signature: the lowering looks the implementation up by it.
    sig = types.void(block, taps, vl, step, *([types.intp] * 10))
    block, taps, vl, step = (t.literal_value for t in (block, taps, vl, step))

    def codegen(context, builder, signature, args):
        x, w, bias, offsets, masks, y, channels, x_channel, w_output, y_plane = args[4:]
        v = Vectors(builder, vl)
        x, w, bias, y = v.pointer(x), v.pointer(w), v.pointer(bias), v.pointer(y)
        offsets, masks = v.pointer(offsets, I64), v.pointer(masks, I64)
        constant = v.constant
        tap_at = [builder.load(v.at(offsets, constant(t))) for t in range(taps)]
        reads = [builder.load(v.at(masks, constant(1 + t))) for t in range(taps)]
        w_rows = [builder.mul(constant(o), w_output) for o in range(block)]
        start = [v.splat(builder.load(v.at(bias, constant(o)))) for o in range(block)]
        entry = builder.block
        loop = builder.append_basic_block("channel")
        done = builder.append_basic_block("channels_done")
        builder.branch(loop)
        builder.position_at_end(loop)
        c = builder.phi(I64)
        c.add_incoming(constant(0), entry)
        acc = []
        for o in range(block):
            phi = builder.phi(v.type)
            phi.add_incoming(start[o], entry)
            acc.append(phi)
        current = list(acc)
        x_c = v.at(x, builder.mul(c, x_channel))
        w_c = v.at(w, builder.mul(c, constant(taps)))
        for t in range(taps):
            inputs = v.spaced_load(v.at(x_c, tap_at[t]), reads[t], step)
            for o in range(block):
                weight = builder.load(v.at(w_c, builder.add(w_rows[o], constant(t))))
                current[o] = v.fma(inputs, v.splat(weight), current[o])
        following = builder.add(c, constant(1))
        tail = builder.block
        c.add_incoming(following, tail)
        for o in range(block):
            acc[o].add_incoming(current[o], tail)
        builder.cbranch(builder.icmp_signed("<", following, channels), loop, done)
        builder.position_at_end(done)
        # a full tile (most of them) stores plainly: AVX2's masked stores are slow on AMD
        bits = builder.load(masks)
        full = builder.icmp_signed("==", bits, constant((1 << vl) - 1))
        with builder.if_else(full) as (plain, masked):
            with plain:
                for o in range(block):
                    v.store(current[o], v.at(y, builder.mul(constant(o), y_plane)))
            with masked:
                mask = v.mask_of_bits(bits)
                for o in range(block):
                    v.masked_store(current[o], v.at(y, builder.mul(constant(o), y_plane)), mask)
        return context.get_dummy_value()

    return sig, codegen


def _direct_kernel(taps: int, vl: int, step: int):
    """The whole forward for one tap count, vector width and input step (literals for the
    microkernel): a task per sample and tile of ``tile_table``."""
    widest = BLOCK

    def conv_direct(x, w, bias, offsets, table, y, x_channel):
        samples, out, out_h, out_w = y.shape
        channels, plane_y = w.shape[1] // taps, out_h * out_w
        w_output, (tiles, row) = channels * taps, table.shape
        xa, wa, ba, oa, ta, ya = (x.ctypes.data, w.ctypes.data, bias.ctypes.data,
                                  offsets.ctypes.data, table.ctypes.data, y.ctypes.data)
        for task in prange(samples * tiles):
            n, t = task // tiles, task % tiles
            x_at, masks = xa + 4 * (n * x.shape[1] + table[t, 0]), ta + 8 * (t * row + 2)
            o0 = 0
            # widest output channels a call (``BLOCK`` vector accumulators fit the registers),
            # the rest in 8, 4, 2, 1; the block is a literal of the intrinsic, hence one call
            # per size.
            while o0 < out:
                left = out - o0
                w_at, b_at = wa + 4 * o0 * w_output, ba + 4 * o0
                y_at = ya + 4 * ((n * out + o0) * plane_y + table[t, 1])
                if left >= widest:
                    _tile(widest, taps, vl, step, x_at, w_at, b_at, oa, masks, y_at, channels,
                          x_channel, w_output, plane_y)
                    o0 += widest
                elif left >= 8:
                    _tile(8, taps, vl, step, x_at, w_at, b_at, oa, masks, y_at, channels,
                          x_channel, w_output, plane_y)
                    o0 += 8
                elif left >= 4:
                    _tile(4, taps, vl, step, x_at, w_at, b_at, oa, masks, y_at, channels,
                          x_channel, w_output, plane_y)
                    o0 += 4
                elif left >= 2:
                    _tile(2, taps, vl, step, x_at, w_at, b_at, oa, masks, y_at, channels,
                          x_channel, w_output, plane_y)
                    o0 += 2
                else:
                    _tile(1, taps, vl, step, x_at, w_at, b_at, oa, masks, y_at, channels,
                          x_channel, w_output, plane_y)
                    o0 += 1
    return cpu_variant(conv_direct, variant(f"taps{taps}_vl{vl}_step{step}_block{widest}"),
                       True)


@intrinsic
def _row_copy(typingctx, stride, phases, vl, dst, phase_step, src, count, first, width):
    """``dst[p * phase_step + q] = src[first + p + q * stride]`` where that index is in ``0 ..
    width - 1``, else 0, for ``q < count`` and phases ``p < phases`` (1 or ``stride``; ``stride``,
    ``phases``, ``vl`` integer literals; addresses as integers): a padded, strided row of the
    prepared input. Lanes outside the row read nothing (masked loads). Stride 2 loads two
    vectors and keeps every other lane (both phases from the same loads); larger strides
    gather."""
    if not all(isinstance(t, types.IntegerLiteral) for t in (stride, phases, vl)):
        return None
    sig = types.void(stride, phases, vl, *([types.intp] * 6))
    stride, phases, vl = stride.literal_value, phases.literal_value, vl.literal_value

    def codegen(context, builder, signature, args):
        dst, phase_step, src, count, first, width = args[3:]
        v = Vectors(builder, vl)
        dst, src = v.pointer(dst), v.pointer(src)
        entry = builder.block
        loop, done = builder.append_basic_block("vector"), builder.append_basic_block("row_done")
        builder.cbranch(builder.icmp_signed(">", count, v.constant(0)), loop, done)
        builder.position_at_end(loop)
        q0 = builder.phi(I64)
        q0.add_incoming(v.constant(0), entry)
        store = v.lanes_in_range(q0, count)
        start = builder.add(first, builder.mul(q0, v.constant(stride)))
        if stride <= 2:        # ``stride`` consecutive vectors hold the lanes: masked loads
            parts = []
            for part in range(stride):
                at = builder.add(start, v.constant(part * vl))
                parts.append(v.masked_load(v.at(src, at), v.lanes_in_range(at, width)))
            values = parts if stride == 1 else [builder.shuffle_vector(
                parts[0], parts[1], ir.Constant(ir.VectorType(I32, vl),
                                                list(range(p, 2 * vl, 2)))) for p in range(phases)]
        else:
            wide = ir.VectorType(I64, vl)
            values = []
            for p in range(phases):
                index = builder.add(v.splat(builder.add(start, v.constant(p)), wide), ir.Constant(
                    wide, [stride * lane for lane in range(vl)]))
                inside = builder.and_(
                    builder.icmp_signed(">=", index, ir.Constant(wide, [0] * vl)),
                    builder.icmp_signed("<", index, v.splat(width, wide)))
                values.append(v.masked_gather(src, index, builder.and_(store, inside)))
        for p, value in enumerate(values):
            v.masked_store(value, v.at(dst, builder.add(builder.mul(v.constant(p), phase_step),
                                                        q0)), store)
        following = builder.add(q0, v.constant(vl))
        q0.add_incoming(following, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return sig, codegen


def _prepare_kernel(stride: int, vl: int, flat: bool):
    """The copy into ``layout``'s prepared input for one horizontal stride (a literal of
    ``_row_copy``): rows mode, ``xs[n, c, r, p, q] = x_padded[n, c, r, q * sw + p]``; flat mode,
    ``xw[n, c, j, r, ow] = x_padded[n, c, r, ow * sw + j * dw]`` (``kw`` copies of rows exactly
    ``out_w`` long: with a vertical stride of 1 the input of output ``p = oh * out_w + ow`` at
    tap ``(i, j)`` is ``xw[n, c, j].flat[p + i * dh * out_w]``)."""
    def prepare(x, xs, dw, ph, pw):
        samples, channels, height, width = x.shape
        copies, rows, length = xs.shape[2], xs.shape[3], xs.shape[4]
        if not flat:
            rows, copies = xs.shape[2], xs.shape[3]
        xa, sa, plane = x.ctypes.data, xs.ctypes.data, copies * rows * length
        for task in prange(samples * channels):
            source = xa + 4 * task * height * width
            target = sa + 4 * task * plane
            for r in range(rows):
                h = r - ph
                inside = 0 <= h < height
                row = source + 4 * h * width if inside else source
                if flat:
                    for j in range(copies):
                        _row_copy(stride, 1, vl, target + 4 * (j * rows + r) * length, 0, row,
                                  length, j * dw - pw, width if inside else 0)
                else:                         # all phases of a row at once
                    _row_copy(stride, stride, vl, target + 4 * r * copies * length, length, row,
                              length, -pw, width if inside else 0)
    return cpu_variant(prepare, variant(f"stride{stride}_vl{vl}_{'flat' if flat else 'rows'}"),
                       True)


_KERNELS: dict = {}
_PREPARE: dict = {}


def _bits(valid, positions):
    """Per row of ``valid [tiles, lanes]``, the int64 with bit ``positions[l]`` set where lane
    ``l`` is."""
    return (valid.astype(np.int64) << positions).sum(axis=1)


@lru_cache(maxsize=128)   # built in numpy: once per layer shape, not on every call
def tile_table(sample_shape, geometry, max_step: int = 2):
    """``[tiles, 3 + taps]`` int64, a row per tile of one sample's output (``VL`` or
    ``layout().vl`` consecutive outputs, in the order the kernels take them): its input offset
    in the layout, its output offset in the plane, the bits of the lanes stored, and per tap
    the bits of the elements it reads, ``Vectors.spaced_load``'s (in a prepared layout, the lanes
    stored; else bit ``l * step`` for lane ``l`` inside ``x``). ``geometry`` as nested tuples,
    ``sample_shape`` ``(C, H, W)``."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
    lay = layout((1,) + sample_shape, *geometry, max_step)
    height, width = sample_shape[1:]
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    lane = np.arange(lay.vl)
    if lay.flat:
        first = np.arange(0, out_h * out_w, lay.vl)
        p = first[:, None] + lane
        exists, oh, ow = p < out_h * out_w, p // out_w, p % out_w
        y_at = first
        x_at = first if lay.prepared else first - ph * width - pw
    else:
        oh = np.repeat(np.arange(out_h), -(-out_w // lay.vl))[:, None]
        ow = np.tile(np.arange(0, out_w, lay.vl), out_h)[:, None] + lane
        exists, y_at = ow < out_w, (oh * out_w + ow)[:, 0]
        x_at = (oh[:, 0] * sh * lay.x_row + ow[:, 0] if lay.prepared
                else (oh[:, 0] * sh - ph) * width + ow[:, 0] * sw - pw)
    store = _bits(exists, lane)
    reads = [store] * (kh * kw) if lay.prepared else [
        _bits(exists & (0 <= oh * sh - ph + i * dh) & (oh * sh - ph + i * dh < height)
              & (0 <= ow * sw - pw + j * dw) & (ow * sw - pw + j * dw < width), lane * sw)
        for i in range(kh) for j in range(kw)]
    return np.ascontiguousarray(np.column_stack([x_at, y_at, store] + reads), np.int64)


def chunk_size(x_shape, geometry, work_size: int, max_step: int = 2) -> int:
    """Samples of ``x`` a call takes at a time: all of them where the kernels read ``x`` itself,
    else as many as ``work_size`` floats hold prepared (0: not even one)."""
    per_sample = padded_size(x_shape, *geometry, max_step)
    return x_shape[0] if per_sample == 0 else min(x_shape[0], (work_size - VL) // per_sample)


def supports(dtype, groups: int) -> bool:
    """The direct path covers float32 without groups; the rest takes im2col + GEMM."""
    return np.dtype(dtype) == np.float32 and groups == 1


def kernel_inputs(x_shape, geometry, max_step: int = 2):
    """``(layout, tile_table, tap offsets)`` for an input of ``x_shape``, cached per shape (a
    call per convolution: none of it is rebuilt on the hot path). Read-only."""
    return _kernel_inputs(tuple(x_shape), tuple(map(tuple, geometry)), max_step)


@lru_cache(maxsize=128)
def _kernel_inputs(x_shape, geometry, max_step):
    lay = layout(x_shape, *geometry, max_step)
    return (lay, tile_table(x_shape[1:], geometry, max_step),
            np.array(lay.offsets, np.int64))


def conv_forward_direct(x, weight, bias, y, work, chunk, geometry):
    """``y = conv(x, weight) + bias`` (float32, one group), ``chunk`` samples at a time through
    ``work`` (flat float32, at least ``chunk * padded_size(...) + VL`` elements; none is used
    where ``padded_size`` is 0)."""
    lay, table, offsets = kernel_inputs(x.shape, geometry)
    key = (len(offsets), lay.vl, lay.step)
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = _direct_kernel(*key)
    out, samples = weight.shape[0], x.shape[0]
    w = np.ascontiguousarray(weight).reshape(out, -1)
    b = np.zeros(out, np.float32) if bias is None else np.ascontiguousarray(bias)
    if not lay.prepared:
        kernel(np.ascontiguousarray(x).reshape(samples, -1), w, b, offsets, table, y,
               lay.x_channel)
        return
    for n0 in range(0, samples, chunk):
        n1 = min(samples, n0 + chunk)
        xs = prepare_input(x[n0:n1], work, geometry)
        kernel(xs, w, b, offsets, table, y[n0:n1], lay.x_channel)


def prepare_input(x, work, geometry, max_step: int = 2):
    """``x`` copied into the front of ``work`` in the layout of ``layout`` (a prepared one);
    returns that copy as ``[samples, padded_size]``."""
    _, (_, sw), (ph, pw), (_, dw) = geometry
    lay = layout(x.shape, *geometry, max_step)
    if not lay.prepared:
        raise ValueError(f"prepare_input: the kernels read an input of {x.shape} with geometry "
                         f"{geometry} as it is; there is nothing to prepare")
    per_sample = lay.per_sample
    xs = work[:x.shape[0] * int(np.prod(per_sample))].reshape((x.shape[0],) + per_sample)
    key = (sw, VL, lay.flat)
    kernel = _PREPARE.get(key)
    if kernel is None:
        kernel = _PREPARE[key] = _prepare_kernel(*key)
    kernel(np.ascontiguousarray(x), xs, dw, ph, pw)
    return xs.reshape(x.shape[0], -1)
