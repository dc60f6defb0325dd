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

The input is first copied, a chunk of samples at a time, into a layout where the ``VL`` inputs of
a tap are consecutive, for any stride and dilation:

* rows mode: padded and split into ``sw`` phases, ``xs[c, r, p, q] = x_padded[c, r, q * sw + p]``;
  output ``ow``'s tap ``j`` reads phase ``(j * dw) % sw`` at ``q = ow + (j * dw) // sw``, and rows
  take the vertical stride directly (``r = oh * sh + i * dh``);
* flat mode (vertical stride 1, rows that would leave lanes empty): ``kw`` width-shifted copies
  ``xw[c, j, r, ow] = x_padded[c, r, ow * sw + j * dw]`` with rows exactly ``OW`` long, so output
  ``p = oh * OW + ow`` reads ``xw[c, j].flat[p + i * dh * OW]``: one vector spans output rows.

Loads past the end feed only lanes that are not stored (the workspace has ``VL`` floats of slack).

Every output is a sum in the same order (channel, then tap), whatever the threads do: results are
deterministic, and equal to im2col + GEMM up to float32 rounding.
"""
from functools import lru_cache

import numpy as np
from numba import prange, types
from llvmlite import ir
from numba.extending import intrinsic

from .registry import cpu_variant
from .vector_ir import I32, I64, VL, Vectors

__all__ = ["VL", "lanes", "layout", "padded_size", "prepare_input", "supports", "conv_forward_direct",
           "transposed_geometry", "input_grad_pays", "conv_input_grad_direct"]

@intrinsic
def _tile(typingctx, block, taps, vl, x, w, bias, offsets, y, channels, x_channel, w_output,
          y_plane, count):
    """The microkernel for ``block`` output channels, ``taps`` taps and ``vl`` lanes (integer
    literals: each combination compiles its own unrolled code):
    ``_tile(block, taps, vl, x, w, bias, offsets, y, channels, x_channel, w_output, y_plane,
    count)``, addresses as integers, strides in elements. ``x`` points at channel 0's input for the
    tile's first output, ``w`` at ``w[o0, 0, 0, 0]``, ``bias`` at ``bias[o0]``, ``offsets`` at
    ``taps`` element offsets (int64), ``y`` at ``y[o0, oh, ow0]``; only the first ``count`` lanes
    are stored (a masked store at a row's end). A global, not a closure: Numba's disk cache keys
    a function on its closure's pickle, and an intrinsic pickles differently in every process."""
    if not all(isinstance(t, types.IntegerLiteral) for t in (block, taps, vl)):
        return None
    # The literals stay in the signature: the lowering looks the implementation up by it.
    sig = types.void(block, taps, vl, *([types.intp] * 10))
    block, taps, vl = block.literal_value, taps.literal_value, vl.literal_value

    def codegen(context, builder, signature, args):
        x, w, bias, offsets, y, channels, x_channel, w_output, y_plane, count = args[3:]
        v = Vectors(builder, vl)
        x, w, bias, y = v.pointer(x), v.pointer(w), v.pointer(bias), v.pointer(y)
        offsets = v.pointer(offsets, I64)
        constant = v.constant
        tap_at = [builder.load(v.at(offsets, constant(t))) for t in range(taps)]
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
            inputs = v.load(v.at(x_c, tap_at[t]))
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
        mask = v.lanes_below(count)
        for o in range(block):
            v.masked_store(current[o], v.at(y, builder.mul(constant(o), y_plane)), mask)
        return context.get_dummy_value()

    return sig, codegen


def _direct_kernel(taps: int, vl: int, flat: bool):
    """The whole forward for one tap count and vector width (literals for the microkernel), over
    rows of outputs, or (``flat``) over each output plane as one long row."""
    def conv_direct(xs, w, bias, offsets, y, sh, x_channel, x_row):
        samples, out, out_h, out_w = y.shape
        channels, plane_y = w.shape[1] // taps, out_h * out_w
        w_output = channels * taps
        per_row = (out_w + vl - 1) // vl
        tiles = (plane_y + vl - 1) // vl if flat else out_h * per_row
        xa, wa, ba, ta, ya = (xs.ctypes.data, w.ctypes.data, bias.ctypes.data,
                              offsets.ctypes.data, y.ctypes.data)
        for task in prange(samples * tiles):
            n, t = task // tiles, task % tiles
            if flat:
                at, count, x_at = t * vl, min(vl, plane_y - t * vl), t * vl
            else:
                oh, ow0 = t // per_row, (t % per_row) * vl
                at, count, x_at = oh * out_w + ow0, min(vl, out_w - ow0), oh * sh * x_row + ow0
            x_at = xa + 4 * (n * xs.shape[1] + x_at)
            o0 = 0
            # 16 output channels a call (16 vector accumulators fit the registers), the rest in
            # 8, 4, 2, 1; the block is a literal of the intrinsic, hence one call per size.
            while o0 < out:
                left = out - o0
                w_at, b_at = wa + 4 * o0 * w_output, ba + 4 * o0
                y_at = ya + 4 * ((n * out + o0) * plane_y + at)
                if left >= 16:
                    _tile(16, taps, vl, x_at, w_at, b_at, ta, y_at, channels, x_channel,
                          w_output, plane_y, count)
                    o0 += 16
                elif left >= 8:
                    _tile(8, taps, vl, x_at, w_at, b_at, ta, y_at, channels, x_channel,
                          w_output, plane_y, count)
                    o0 += 8
                elif left >= 4:
                    _tile(4, taps, vl, x_at, w_at, b_at, ta, y_at, channels, x_channel,
                          w_output, plane_y, count)
                    o0 += 4
                elif left >= 2:
                    _tile(2, taps, vl, x_at, w_at, b_at, ta, y_at, channels, x_channel,
                          w_output, plane_y, count)
                    o0 += 2
                else:
                    _tile(1, taps, vl, x_at, w_at, b_at, ta, y_at, channels, x_channel,
                          w_output, plane_y, count)
                    o0 += 1
    return cpu_variant(conv_direct, f"taps{taps}_vl{vl}_{'flat' if flat else 'rows'}", True)


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


@intrinsic
def _plane_copy(typingctx, vl, dst, src, count, shift, size, bits, period):
    """``dst[q] = src[q + shift]`` for ``q < count`` where ``0 <= q + shift < size`` and bit ``l``
    of ``bits[k % period]`` is set for ``q = k * vl + l``, else 0 (``vl`` an integer literal,
    addresses as integers): a flat mode width copy whose rows are as long as the input's, as
    one run with the columns outside the input masked by a periodic pattern."""
    if not isinstance(vl, types.IntegerLiteral):
        return None
    sig = types.void(vl, *([types.intp] * 7))
    vl = vl.literal_value

    def codegen(context, builder, signature, args):
        dst, src, count, shift, size, bits, period = args[1:]
        v = Vectors(builder, vl)
        dst, src, bits = v.pointer(dst), v.pointer(src), v.pointer(bits, I64)
        entry = builder.block
        loop, done = builder.append_basic_block("vector"), builder.append_basic_block("run_done")
        builder.cbranch(builder.icmp_signed(">", count, v.constant(0)), loop, done)
        builder.position_at_end(loop)
        q0, k = builder.phi(I64), builder.phi(I64)
        q0.add_incoming(v.constant(0), entry)
        k.add_incoming(v.constant(0), entry)
        at = builder.add(q0, shift)
        columns = v.mask_of_bits(builder.load(v.at(bits, k)))
        value = v.masked_load(v.at(src, at), builder.and_(columns, v.lanes_in_range(at, size)))
        v.masked_store(value, v.at(dst, q0), v.lanes_in_range(q0, count))
        following, k_next = builder.add(q0, v.constant(vl)), builder.add(k, v.constant(1))
        q0.add_incoming(following, builder.block)
        k.add_incoming(builder.select(builder.icmp_signed("<", k_next, period), k_next,
                                      v.constant(0)), builder.block)
        builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return sig, codegen


@lru_cache(maxsize=64)
def _column_bits(width: int, kw: int, dw: int, pw: int):
    """``bits[j, k]``: the lanes of vector ``k`` (mod the period, ``lcm(width, VL) / VL``
    vectors) of width copy ``j`` whose column ``(k * VL + l) % width`` shifted by ``j * dw - pw``
    stays inside a row."""
    period = np.lcm(width, VL) // VL
    bits = np.zeros((kw, period), np.int64)
    for j in range(kw):
        for k in range(period):
            bits[j, k] = sum(1 << lane for lane in range(VL)
                             if 0 <= (k * VL + lane) % width + j * dw - pw < width)
    return bits


def _prepare_kernel(stride: int, vl: int, flat: bool):
    """The copy into ``layout``'s prepared input for one horizontal stride (a literal of
    ``_row_copy``): rows mode, ``xs[n, c, r, p, q] = x_padded[n, c, r, q * sw + p]``; flat mode,
    ``xw[n, c, j, r, ow] = x_padded[n, c, r, ow * sw + j * dw]`` (``kw`` copies of rows exactly
    ``out_w`` long: with a vertical stride of 1 the input of output ``p = oh * out_w + ow`` at
    tap ``(i, j)`` is ``xw[n, c, j].flat[p + i * dh * out_w]``)."""
    def prepare(x, xs, dw, ph, pw, bits):
        samples, channels, height, width = x.shape
        copies, rows, length = xs.shape[2], xs.shape[3], xs.shape[4]
        if not flat:
            rows, copies = xs.shape[2], xs.shape[3]
        xa, sa, ba = x.ctypes.data, xs.ctypes.data, bits.ctypes.data
        plane, period = copies * rows * length, bits.shape[1]
        for task in prange(samples * channels):
            source = xa + 4 * task * height * width
            target = sa + 4 * task * plane
            if flat and stride == 1 and length == width:    # each copy one run
                for j in range(copies):
                    _plane_copy(vl, target + 4 * j * rows * length, source, rows * length,
                                j * dw - pw - ph * width, height * width, ba + 8 * j * period,
                                period)
                continue
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
    return cpu_variant(prepare, f"stride{stride}_vl{vl}_{'flat' if flat else 'rows'}", True)


_KERNELS: dict = {}
_PREPARE: dict = {}
_NO_BITS = np.zeros((1, 1), np.int64)     # the column masks of copies that are not one run


def layout(x_shape, kernel_size, stride, padding, dilation):
    """``(flat, vl, xs shape per sample, tap offsets, x_channel, x_row)`` for an input of
    ``x_shape``: offsets and strides in elements of one sample's prepared input. Flat (width copies)
    where the vertical stride is 1 and rows of ``out_w`` would leave vector lanes empty; else
    rows (padded, phase-split)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
    channels, height, width = x_shape[1], x_shape[2], x_shape[3]
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    rows = max(height + 2 * ph, (out_h - 1) * sh + dh * (kh - 1) + 1)
    if sh == 1 and out_w % VL:
        offsets = [j * rows * out_w + i * dh * out_w for i in range(kh) for j in range(kw)]
        return True, VL, (channels, kw, rows, out_w), offsets, kw * rows * out_w, out_w
    quarters = -(-max(width + 2 * pw, (out_w - 1) * sw + dw * (kw - 1) + 1) // sw)
    offsets = [i * dh * sw * quarters + ((j * dw) % sw) * quarters + (j * dw) // sw
               for i in range(kh) for j in range(kw)]
    return False, lanes(out_w), (channels, rows, sw, quarters), offsets, \
        rows * sw * quarters, sw * quarters


def lanes(out_w: int) -> int:
    """The vector width for rows of ``out_w`` outputs: ``VL``, or 8 where that takes as few
    vectors a row (an 8-wide row fills a ymm register and leaves no zmm half empty)."""
    return VL if -(-out_w // VL) < -(-out_w // 8) else 8


def padded_size(x_shape, kernel_size, stride, padding, dilation) -> int:
    """Float elements of one sample's prepared input (``xs`` or ``xw``)."""
    return int(np.prod(layout(x_shape, kernel_size, stride, padding, dilation)[2]))


def supports(dtype, groups: int) -> bool:
    """The direct path covers float32 without groups; the rest takes im2col + GEMM."""
    return np.dtype(dtype) == np.float32 and groups == 1


def conv_forward_direct(x, weight, bias, y, work, chunk, geometry):
    """``y = conv(x, weight) + bias`` (float32, one group), ``chunk`` samples at a time through
    ``work`` (flat float32, at least ``chunk * padded_size(...) + VL`` elements)."""
    (kh, kw), (sh, _) = geometry[:2]
    flat, vl, _, offsets, x_channel, x_row = layout(x.shape, *geometry)
    key = (kh * kw, vl, flat)
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = _direct_kernel(*key)
    offsets = np.array(offsets, np.int64)
    out = weight.shape[0]
    w = np.ascontiguousarray(weight).reshape(out, -1)
    b = np.zeros(out, np.float32) if bias is None else np.ascontiguousarray(bias)
    for n0 in range(0, x.shape[0], chunk):
        n1 = min(x.shape[0], n0 + chunk)
        xs = prepare_input(x[n0:n1], work, geometry)
        kernel(xs, w, b, offsets, y[n0:n1], sh, x_channel, x_row)


def prepare_input(x, work, geometry):
    """``x`` copied into the front of ``work`` in the layout of ``layout``; returns that copy as
    ``[samples, padded_size]``."""
    _, (_, sw), (ph, pw), (_, dw) = geometry
    flat, _, per_sample, _, _, _ = layout(x.shape, *geometry)
    xs = work[:x.shape[0] * int(np.prod(per_sample))].reshape((x.shape[0],) + per_sample)
    key = (sw, VL, flat)
    kernel = _PREPARE.get(key)
    if kernel is None:
        kernel = _PREPARE[key] = _prepare_kernel(*key)
    width = x.shape[3]
    same = flat and sw == 1 and per_sample[3] == width
    bits = _column_bits(width, per_sample[1], dw, pw) if same else _NO_BITS
    kernel(np.ascontiguousarray(x), xs, dw, ph, pw, bits)
    return xs.reshape(x.shape[0], -1)


def transposed_geometry(geometry):
    """The input gradient of a stride-1 convolution is a convolution of ``dy`` with the weights
    flipped and their two channel axes swapped, padded by ``dilation * (k - 1) - pad``:
    ``dx[c, h, w] = sum over o, i, j of weight[o, c, i, j] * dy[o, h + ph - i dh, w + pw - j dw]``.
    Returns that convolution's geometry, or None where it does not apply (stride > 1, or more
    padding than the kernel reaches)."""
    kernel_size, stride, padding, dilation = geometry
    pad = tuple(d * (k - 1) - p for k, p, d in zip(kernel_size, padding, dilation))
    if stride != (1, 1) or min(pad) < 0:
        return None
    return kernel_size, stride, pad, dilation


def input_grad_pays(weight_shape) -> bool:
    """Measured (``scripts/bench_kernels.py``): the direct input gradient beats col2im for a small
    ResNet's 3x3 layers (1.1-1.6x), and loses where ``dx`` has few channels (LeNet conv1's one:
    a single accumulator chain, 8x slower) or the taps are many (5x5: the ``kw`` copies of ``dy``
    cost more than they save, 2.3x slower; ``conv_input_grad``, samples in lanes, takes those)."""
    return weight_shape[1] >= 16 and weight_shape[2] * weight_shape[3] <= 9


def conv_input_grad_direct(dy, weight, dx, work, geometry) -> bool:
    """``dx`` (overwritten) of a stride-1 convolution as a direct convolution of ``dy``, through
    ``work``. False, with nothing written, where the direct path does not apply or ``work`` holds
    less than one sample."""
    transposed = transposed_geometry(geometry)
    if transposed is None or not supports(dy.dtype, 1):
        return False
    chunk = min(dy.shape[0], (work.size - VL) // padded_size(dy.shape, *transposed))
    if chunk < 1:
        return False
    flipped = np.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
    conv_forward_direct(dy, flipped, None, dx, work, chunk, transposed)
    return True
