"""The weight and bias gradients of a convolution on the ``cpu`` device, direct, float32.

im2col + GEMM computes ``dweight = dy [out, P] @ col^T [P, K]`` with a short ``out`` and a col
``kh * kw`` times the input: most of its time goes to writing and streaming col (measured on a
small ResNet layer). Here the input is read as the direct forward reads
it (``conv.layout``: every tap's inputs for ``VL`` consecutive outputs are consecutive, in
``x`` itself or a prepared copy; taps in the padding masked), and each weight's gradient is a dot
product over the output positions::

    dweight[o, c, t] = sum over n, output positions p of dy[n, o, p] * x[n, c, tap t of p]
    dbias[o]         = sum over n, p of dy[n, o, p]

The microkernel (``_weight_tile``) keeps ``block x taps`` vector accumulators in registers: per
``VL`` output positions it loads ``block`` vectors of ``dy`` and one vector of input per tap, each
used ``block`` times (``block`` and the kernel rows a call takes are chosen so that
accumulators, ``dy`` and one input fit the vector registers: AVX-512's 32, AVX2's 16). Row ends
and padding are masked loads: those lanes read nothing and add 0. Its loops are kept from
unrolling (``vector_ir``): unrolled, they spilled.
The lanes are added up in a fixed tree at the end, and each task owns its weights (one input
channel, a block of outputs, a group of taps), so results are the same whatever the threads do.
"""
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from ..registry import cpu_variant
from .conv import kernel_inputs, prepare_input
from .rules.weight_grad import DW_GEMM_PLANE, DW_GEMM_WEIGHTS, weight_grad_pays
from .vector_ir import I64, MASK_REGISTERS, REGISTERS, VL, Vectors, variant
from .weight_grad_outer import conv_weight_grad_outer, outer_pays

__all__ = ["DW_GEMM_WEIGHTS", "DW_GEMM_PLANE", "weight_grad_pays", "conv_weight_grad_direct",
           "bias_grad"]


@intrinsic
def _weight_tile(typingctx, block, rows, cols, vl, same_masks, x, dy, row_step, columns,
                 positions, position_count, position_step, first_tap, samples, x_sample,
                 dy_sample, dy_plane, dw, w_output, accumulate):
    """``dw[o * w_output + t] (+)= sum over samples and positions of dy . x`` for ``block``
    outputs and the ``rows x cols`` taps of ``rows`` kernel rows (integer literals, as are
    ``vl`` and ``same_masks``, 1 where every tap reads the lanes of ``dy``). Tap ``(i,
    j)`` reads ``x + i * row_step + columns[j]``: ``rows + cols`` integer registers address all
    taps, where a table of ``rows * cols`` offsets would spill. Addresses as integers, strides in
    elements: ``x`` at one channel's input of sample 0 at the group's first kernel row, ``dy``
    at ``dy[0, o0, 0]``, ``columns`` at ``cols`` int64 offsets, ``positions`` at
    ``position_count`` rows of ``position_step`` int64 (``conv.tile_table``'s: x offset,
    dy offset, the bits of the lanes of ``dy`` and of each tap's, the group's from
    ``first_tap``), ``dw`` at ``dweight[o0, c, first_tap]``. ``accumulate`` 0 overwrites
    ``dw``."""
    literals = (block, rows, cols, vl, same_masks)
    if not all(isinstance(t, types.IntegerLiteral) for t in literals):
        return None
    sig = types.void(*literals, *([types.intp] * 15))
    block, rows, cols, vl, same_masks = (t.literal_value for t in literals)
    taps = rows * cols

    def codegen(context, builder, signature, args):
        (x, dy, row_step, columns, positions, position_count, position_step, first_tap, samples,
         x_sample, dy_sample, dy_plane, dw, w_output, accumulate) = args[5:]
        v = Vectors(builder, vl)
        x, dy, dw = v.pointer(x), v.pointer(dy), v.pointer(dw)
        columns, positions = v.pointer(columns, I64), v.pointer(positions, I64)
        constant = v.constant
        column_at = [builder.load(v.at(columns, constant(j))) for j in range(cols)]
        dy_rows = [builder.mul(constant(o), dy_plane) for o in range(block)]
        accumulators = block * taps

        sample_loop, n, sample_acc = v.open_loop("sample", [v.zero] * accumulators)
        x_n = v.at(x, builder.mul(n, x_sample))
        dy_n = v.at(dy, builder.mul(n, dy_sample))
        position_loop, k, acc = v.open_loop("position", sample_acc)
        tile = v.at(positions, builder.mul(k, position_step))
        x_here = v.at(x_n, builder.load(tile))
        dy_here = v.at(dy_n, builder.load(v.at(tile, constant(1))))
        mask = v.mask_of_bits(builder.load(v.at(tile, constant(2))))
        grads = [v.masked_load(v.at(dy_here, dy_rows[o]), mask) for o in range(block)]
        reads = v.at(tile, builder.add(first_tap, constant(3)))
        current = list(acc)
        for i in range(rows):
            row = v.at(x_here, builder.mul(constant(i), row_step))
            for j in range(cols):
                inputs = v.masked_load(v.at(row, column_at[j]), mask if same_masks else
                                       v.mask_of_bits(builder.load(v.at(reads, constant(
                                           i * cols + j)))))
                for o in range(block):
                    t = o * taps + i * cols + j
                    current[t] = v.fma(grads[o], inputs, current[t])
        v.close_loop(position_loop, k, acc, current, position_count, "positions_done")
        v.close_loop(sample_loop, n, sample_acc, current, samples, "samples_done")
        adding = builder.icmp_signed("!=", accumulate, constant(0))
        for o in range(block):
            row = builder.mul(constant(o), w_output)
            for t in range(taps):
                where = v.at(dw, builder.add(row, constant(t)))
                total = v.horizontal_sum(current[o * taps + t])
                builder.store(builder.select(adding, builder.fadd(builder.load(where), total),
                                             total), where)
        return context.get_dummy_value()

    return sig, codegen


def _group_rows(kernel_size) -> int:
    """Kernel rows a call handles: all of them where 3 outputs' accumulators for every tap fit
    the registers (32: up to 3x3), else one (5x5: 5 taps, 7x7: 7). With fewer outputs a call,
    each input vector loaded feeds fewer FMAs, which ran slower (3x3 on AVX2; the figures in
    docs/benchmarks.md, "Why the code chose")."""
    return kernel_size[0] if _block(kernel_size[0] * kernel_size[1]) >= 3 else 1


def _block(taps: int) -> int:
    """Outputs a call handles: ``block * taps`` accumulators, ``block`` vectors of ``dy`` and
    one input vector in the registers, at most 4 (32 registers: 3x3 3, 5x5 rows 4, 7x7 rows 3;
    16: 3x3 rows 3, 5x5 rows 2)."""
    return max(1, min(4, (REGISTERS - 1) // (taps + 1)))


def _weight_grad_kernel(kh: int, kw: int, rows: int, block: int, vl: int, prepared: bool):
    same_masks = int(prepared)      # a prepared input's taps read the lanes of dy, no padding
    taps, groups = kh * kw, kh // rows

    def weight_grad(xs, dy, row_step, columns, positions, dw, x_channel, accumulate):
        """``xs [samples, size]`` input (``x`` or prepared), ``dy [samples, out, plane]``, ``dw
        [out, C * taps]``: each task one input channel, ``block`` outputs (fewer at the end) and
        ``rows`` kernel rows."""
        samples, out, plane = dy.shape
        channels = dw.shape[1] // taps
        w_output, blocks = dw.shape[1], (out + block - 1) // block
        xa, da, ca, pa, wa = (xs.ctypes.data, dy.ctypes.data, columns.ctypes.data,
                              positions.ctypes.data, dw.ctypes.data)
        count, row_length = positions.shape
        x_sample, dy_sample = xs.shape[1], out * plane
        for task in prange(channels * blocks * groups):
            c, rest = task // (blocks * groups), task % (blocks * groups)
            o0, i0 = (rest // groups) * block, (rest % groups) * rows
            x_at, t0 = xa + 4 * (c * x_channel + i0 * row_step), i0 * kw
            left = min(block, out - o0)    # the last block may be short: 2 or 1 at a time
            while left > 0:
                dy_at, dw_at = da + 4 * o0 * plane, wa + 4 * (o0 * w_output + c * taps + t0)
                if left == block:
                    _weight_tile(block, rows, kw, vl, same_masks, x_at, dy_at, row_step, ca, pa,
                                 count, row_length, t0, samples, x_sample, dy_sample, plane,
                                 dw_at, w_output, accumulate)
                    done = block
                elif left >= 2:
                    _weight_tile(2, rows, kw, vl, same_masks, x_at, dy_at, row_step, ca, pa,
                                 count, row_length, t0, samples, x_sample, dy_sample, plane,
                                 dw_at, w_output, accumulate)
                    done = 2
                else:
                    _weight_tile(1, rows, kw, vl, same_masks, x_at, dy_at, row_step, ca, pa,
                                 count, row_length, t0, samples, x_sample, dy_sample, plane,
                                 dw_at, w_output, accumulate)
                    done = 1
                o0, left = o0 + done, left - done
    return cpu_variant(weight_grad, variant(f"k{kh}x{kw}_rows{rows}_block{block}_vl{vl}_"
                                            f"{'prepared' if prepared else 'x'}"), True)


_KERNELS: dict = {}


@njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"})
def bias_grad(dy, dbias):
    """``dbias[o] = sum over n, p of dy[n, o, p]`` for ``dy [N, out, P]``, float64 sums over
    vector lanes."""
    samples, out, plane = dy.shape
    for o in prange(out):
        total = 0.0
        for n in range(samples):
            row = dy[n, o]
            for p in range(plane):
                total += row[p]
        dbias[o] = total


def conv_weight_grad_direct(x, dy, dweight, dbias, work, chunk, geometry) -> None:
    """``dweight`` and ``dbias`` (each overwritten, either may be None) of a float32 convolution
    without groups, ``chunk`` samples at a time through ``work`` (``conv.chunk_size``
    with ``max_step=1``). Without mask registers (AVX2), by outer products where they pay
    (``weight_grad_outer``: no workspace)."""
    samples, out, out_h, out_w = dy.shape
    dy3 = dy.reshape(samples, out, out_h * out_w)
    if dbias is not None:
        bias_grad(dy3, dbias)
    if dweight is None:
        return
    if not MASK_REGISTERS and outer_pays(dweight.shape):
        conv_weight_grad_outer(x, dy, dweight, geometry, VL)
        return
    (kh, kw) = geometry[0]
    # x at stride 2 is read from a prepared copy: picking its even lanes cost more here (3x3,
    # measured) than in the forward, whose inputs feed 16 FMAs
    lay, positions, offsets = kernel_inputs(x.shape, geometry, max_step=1)
    # tap (i, j) at i * row_step + columns[j]: the layout's offsets, factored
    row_step, columns = (offsets[kw] - offsets[0] if kh > 1 else 0), offsets[:kw].copy()
    rows = _group_rows((kh, kw))
    key = (kh, kw, rows, _block(rows * kw), lay.vl, lay.prepared)
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = _weight_grad_kernel(*key)
    dw = dweight.reshape(out, -1)
    if not lay.prepared:
        kernel(np.ascontiguousarray(x).reshape(samples, -1), dy3, row_step, columns, positions,
               dw, lay.x_channel, 0)
        return
    for n0 in range(0, samples, chunk):
        n1 = min(samples, n0 + chunk)
        xs = prepare_input(x[n0:n1], work, geometry, max_step=1)
        kernel(xs, dy3[n0:n1], row_step, columns, positions, dw, lay.x_channel, int(n0 > 0))
