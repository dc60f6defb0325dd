"""The weight gradient of a convolution on the ``cpu`` device by outer products, float32: the
direct weight gradient where vectors have no mask registers (AVX2).

``weight_grad``'s microkernel puts output positions in the lanes: every tap's input vector is a
masked load, and its accumulators are summed across lanes at the end. Without AVX-512 it has 16
registers for them and no mask registers, and it ran far below the FMA rate. Here
the lanes hold output channels instead, as a GEMM's microkernel does::

    dweight[o, c, t] = sum over n, output positions p of dyT[p, o] * x[n, c, tap t of p]

``OB = 2 * vl`` output channels (two vectors) and ``CB = 6`` input channels take 12 vector
accumulators; per output position the microkernel (``_outer_tile``) loads two vectors of ``dyT``
and broadcasts six inputs, 12 FMAs. No lane is masked: a tap's valid positions are a rectangle of
rows and columns, and only those are visited. ``dyT`` is ``dy`` transposed, a band of output rows
of one sample at a time, into a buffer the task owns (``OB`` floats a position; a few KiB),
the accumulators of a task's channels live in another (``taps x channels x OB`` floats) between
bands, and nothing else is needed: the input is read where it lies, no workspace.

Each task owns its weights (a block of outputs, a group of input channels) for a group of
samples and adds its positions in one order (samples, bands, rows, columns); where the samples
are split (small layers: ``task_split``), the groups' sums are added in order after. The
grouping follows from the shape: the bits are the same whatever the threads.
"""
import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from ..registry import cpu_variant
from .vector_ir import Vectors, variant

__all__ = ["CB", "BAND_POSITIONS", "SAMPLE_TASKS", "outer_pays", "channels_per_group",
           "task_split", "conv_weight_grad_outer"]

CB = 6                  # input channels a microkernel call broadcasts (12 accumulators + 3)
BAND_POSITIONS = 256    # output positions of dyT a task transposes at a time (at least a row)
SAMPLE_TASKS = 4        # tasks below which a small layer's samples are split (task_split)


@intrinsic
def _outer_tile(typingctx, channels, vl, x, x_channel, x_row, x_column, dyt, dyt_row, rows,
                columns, acc, acc_channel):
    """``acc[c, 0 .. 2 vl] += sum over rows r and columns q of dyt[r * dyt_row + q * 2 vl ..]
    * x[c * x_channel + r * x_row + q * x_column]`` for ``c < channels`` (``channels``, ``vl``
    integer literals; addresses as integers, strides in elements; ``acc`` rows ``acc_channel``
    apart). ``rows, columns >= 1``."""
    if not all(isinstance(t, types.IntegerLiteral) for t in (channels, vl)):
        return None
    sig = types.void(channels, vl, *([types.intp] * 10))
    channels, vl = channels.literal_value, vl.literal_value

    def codegen(context, builder, signature, args):
        x, x_channel, x_row, x_column, dyt, dyt_row, rows, columns, acc, acc_channel = args[2:]
        v = Vectors(builder, vl)
        x, dyt, acc = v.pointer(x), v.pointer(dyt), v.pointer(acc)
        constant = v.constant
        halves = [v.at(acc, builder.add(builder.mul(constant(c), acc_channel), constant(h * vl)))
                  for c in range(channels) for h in range(2)]
        start = [v.load(where) for where in halves]
        x_at = [builder.mul(constant(c), x_channel) for c in range(channels)]
        row_body, r, row_acc = v.open_loop("row", start)
        x_r = v.at(x, builder.mul(r, x_row))
        dyt_r = v.at(dyt, builder.mul(r, dyt_row))
        column_body, q, current = v.open_loop("column", row_acc)
        x_q = v.at(x_r, builder.mul(q, x_column))
        dyt_q = v.at(dyt_r, builder.mul(q, constant(2 * vl)))
        grads = [v.load(dyt_q), v.load(v.at(dyt_q, constant(vl)))]
        summed = list(current)
        for c in range(channels):
            inputs = v.splat(builder.load(v.at(x_q, x_at[c])))
            for h in range(2):
                summed[2 * c + h] = v.fma(grads[h], inputs, summed[2 * c + h])
        v.close_loop(column_body, q, current, summed, columns, "columns_done")
        v.close_loop(row_body, r, row_acc, summed, rows, "rows_done")
        for where, value in zip(halves, summed):
            v.store(value, where)
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always", cache=True)
def _inside(first, last, step, offset, size):
    """The outputs ``first <= o < last`` whose tap ``o * step + offset`` lies in ``0 ..
    size - 1``: a range ``(low, high)``, empty where ``low >= high`` (floor divisions)."""
    return max(first, -(offset // step)), min(last, (size - 1 - offset) // step + 1)


def _outer_kernel(vl: int):
    ob = 2 * vl

    def weight_grad_outer(x, dy, dw, geometry, band_rows, groups, per_group, sample_groups):
        """``dw [sample_groups, out, C, kh, kw]`` (overwritten: each group of samples' sums)
        from ``x [N, C, H, W]`` and ``dy [N, out, OH, OW]``; ``geometry`` ``[kh, kw, sh, sw,
        ph, pw, dh, dw]`` (int64); tasks: blocks of ``OB`` outputs x ``groups`` groups of
        ``per_group`` input channels (the last may have fewer) x ``sample_groups``."""
        samples, channels, height, width = x.shape
        out, out_h, out_w = dy.shape[1], dy.shape[2], dy.shape[3]
        kh, kw, sh, sw, ph, pw, dh, dwl = (geometry[0], geometry[1], geometry[2], geometry[3],
                                           geometry[4], geometry[5], geometry[6], geometry[7])
        taps, blocks = kh * kw, (out + ob - 1) // ob
        x_sample, x_channel = channels * height * width, height * width
        xa = x.ctypes.data
        per_samples = (samples + sample_groups - 1) // sample_groups
        for task in prange(blocks * groups * sample_groups):
            block, rest = task // (groups * sample_groups), task % (groups * sample_groups)
            group, sample_group = rest // sample_groups, rest % sample_groups
            n0, n1 = sample_group * per_samples, min(samples, (sample_group + 1) * per_samples)
            o0, c0 = block * ob, group * per_group
            outputs, c1 = min(ob, out - o0), min(channels, c0 + per_group)
            if c0 >= c1:
                continue
            acc = np.zeros((taps, c1 - c0, ob), np.float32)
            dyt = np.zeros((band_rows * out_w, ob), np.float32)   # lanes past out stay 0
            aa, da = acc.ctypes.data, dyt.ctypes.data
            for n in range(n0, n1):
                for b0 in range(0, out_h, band_rows):
                    b1 = min(out_h, b0 + band_rows)
                    for o in range(outputs):
                        for r in range(b0, b1):
                            row, first = dy[n, o0 + o, r], (r - b0) * out_w
                            for q in range(out_w):
                                dyt[first + q, o] = row[q]
                    for i in range(kh):
                        r0, r1 = _inside(b0, b1, sh, i * dh - ph, height)
                        if r0 >= r1:
                            continue
                        for j in range(kw):
                            q0, q1 = _inside(0, out_w, sw, j * dwl - pw, width)
                            if q0 >= q1:
                                continue
                            x_at = xa + 4 * (n * x_sample + (r0 * sh + i * dh - ph) * width +
                                             q0 * sw + j * dwl - pw)
                            dyt_at = da + 4 * ((r0 - b0) * out_w + q0) * ob
                            acc_at = aa + 4 * (i * kw + j) * (c1 - c0) * ob
                            # CB channels a call, the group's last 1-5 in 4, 2, 1
                            rows, columns, c = r1 - r0, q1 - q0, c0
                            while c < c1:
                                x_c, acc_c = x_at + 4 * c * x_channel, acc_at + 4 * (c - c0) * ob
                                if c + 6 <= c1:
                                    _outer_tile(6, vl, x_c, x_channel, sh * width, sw, dyt_at,
                                                out_w * ob, rows, columns, acc_c, ob)
                                    c += 6
                                elif c + 4 <= c1:
                                    _outer_tile(4, vl, x_c, x_channel, sh * width, sw, dyt_at,
                                                out_w * ob, rows, columns, acc_c, ob)
                                    c += 4
                                elif c + 2 <= c1:
                                    _outer_tile(2, vl, x_c, x_channel, sh * width, sw, dyt_at,
                                                out_w * ob, rows, columns, acc_c, ob)
                                    c += 2
                                else:
                                    _outer_tile(1, vl, x_c, x_channel, sh * width, sw, dyt_at,
                                                out_w * ob, rows, columns, acc_c, ob)
                                    c += 1
            for o in range(outputs):
                for c in range(c0, c1):
                    for t in range(taps):
                        dw[sample_group, o0 + o, c, t // kw, t % kw] = acc[t, c - c0, o]
    return cpu_variant(weight_grad_outer, variant(f"vl{vl}"), True)


_KERNELS: dict = {}


def outer_pays(weight_shape) -> bool:
    """Where outer products beat ``weight_grad``'s kernel on a host without mask registers:
    every kernel larger than 1x1 with at least ``CB`` input channels (measured on AVX2:
    GoogLeNet's 5x5s, LeNet conv2, ResNet-18/4's 3x3s); with fewer, most of a call's
    broadcasts would go to waste (LeNet conv1 has one channel)."""
    return weight_shape[1] >= CB and weight_shape[2] * weight_shape[3] > 1


def channels_per_group(channels: int, groups: int) -> int:
    """Input channels a group takes: a whole number of calls of ``CB``."""
    return -(-(-(-channels // groups)) // CB) * CB


def task_split(x_shape, out: int, vl: int, threads: int):
    """``(groups of input channels, groups of samples)``. Channels are split (whole calls of
    ``CB`` a group) where the blocks of outputs are fewer than twice the threads: no weight's
    sum changes. Samples are split only where even a call's channels a task would leave fewer
    than ``SAMPLE_TASKS`` tasks, from the shape alone: their sums are added after, so the
    bits depend on the split, and not on the threads. More tasks ran slower: their extra
    transposes of ``dy`` cost more than the balance gained (docs/benchmarks.md)."""
    samples, channels = x_shape[0], x_shape[1]
    blocks, calls = -(-out // (2 * vl)), -(-channels // CB)
    groups = max(1, min(calls, -(-2 * threads // blocks)))
    groups = -(-channels // channels_per_group(channels, groups))
    return groups, max(1, min(samples, -(-SAMPLE_TASKS // (blocks * calls))))


def conv_weight_grad_outer(x, dy, dweight, geometry, vl: int) -> None:
    """``dweight`` (overwritten) of a float32 convolution without groups. Groups of samples
    (``task_split``) sum apart, then in their order."""
    samples, out, out_h, out_w = dy.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
    kernel = _KERNELS.get(vl)
    if kernel is None:
        kernel = _KERNELS[vl] = _outer_kernel(vl)
    groups, sample_groups = task_split(x.shape, out, vl, numba.get_num_threads())
    band_rows = max(1, min(out_h, BAND_POSITIONS // out_w))
    sums = dweight[None] if sample_groups == 1 else \
        np.empty((sample_groups,) + dweight.shape, np.float32)
    kernel(np.ascontiguousarray(x), np.ascontiguousarray(dy), sums,
           np.array([kh, kw, sh, sw, ph, pw, dh, dw], np.int64), band_rows, groups,
           channels_per_group(x.shape[1], groups), sample_groups)
    if sample_groups > 1:
        np.add.reduce(sums, axis=0, out=dweight)      # the groups in order, lane by lane
