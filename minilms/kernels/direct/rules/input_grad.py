"""Where the two direct input gradients pay: the transposed convolution's and the one with
samples in vector lanes (``direct.input_grad`` runs them)."""
import numpy as np

from . import SIZE_LANES, host_lanes

__all__ = ["transposed_geometry", "DX_GEMM_WEIGHTS", "DX_GEMM_PLANE", "input_grad_pays",
           "LANES_MIN_SIZE", "LANES_MIN_SIZE_8", "GEMM_CHANNELS", "sample_lanes_pay"]

LANES_MIN_SIZE = 1 << 17    # elements of dx below which a GEMM is faster (sample_lanes_pay)
# The same for kernels of more than 9 taps on a host of 8 lanes, where a batch of 8 fills every
# lane: GoogLeNet's 14x14 5x5s (25k-50k elements) are faster so, its 7x7 ones (12k-19k) even.
LANES_MIN_SIZE_8 = 20_000
GEMM_CHANNELS = 128          # input channels from which the GEMM is faster (sample_lanes_pay)


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


# Weights (output x input channels) from which im2col + GEMM makes an input gradient faster than
# the transposed direct convolution, on output planes of at most DX_GEMM_PLANE positions (measured).
DX_GEMM_WEIGHTS = 1 << 15
DX_GEMM_PLANE = 14 * 14


def input_grad_pays(weight_shape, out_plane: int) -> bool:
    """Measured (``scripts/bench_kernels.py``; the figures in docs/benchmarks.md): the direct
    input gradient beats col2im for a small ResNet's 3x3 layers, and loses where ``dx`` has few
    channels (LeNet conv1's one: a single accumulator chain) or the taps are many (5x5: the ``kw``
    copies of ``dy`` cost more than they save; ``input_grad``, samples in lanes, takes those), or
    where many channels meet a small plane (``DX_GEMM_WEIGHTS``, ``DX_GEMM_PLANE``)."""
    out, channels, kh, kw = weight_shape
    return channels >= 16 and kh * kw <= 9 and not (
        out * channels >= DX_GEMM_WEIGHTS and out_plane <= DX_GEMM_PLANE)


def sample_lanes_pay(x_shape, weight_shape, geometry, lanes: int | None = None) -> bool:
    """Where samples in lanes beat the other input gradients (measured, ``bench_kernels.py`` and
    ResNet-18/4's layers; the figures in docs/benchmarks.md): strides above 1 and kernels above
    3x3, with 16 or more input channels, a batch that fills at least half of each vector and a
    ``dx`` of at least ``LANES_MIN_SIZE`` elements (below it, as in ResNet-18/4's 8x8
    downsampling, two launches and a transpose cost more than the work; ``LANES_MIN_SIZE_8``
    for kernels above 3x3 on a host of 8 ``lanes``, ``host_lanes()`` where None), and fewer than
    ``GEMM_CHANNELS`` input channels (from there, full-size ResNets' downsampling layers, the
    GEMM ``weight^T @ dy`` has ``C * kh * kw`` rows and runs near BLAS's rate). Not 1x1
    kernels: their col is ``dy``-sized and col2im cheap."""
    lanes = host_lanes() if lanes is None else lanes
    samples = x_shape[0]
    kernel_size, stride = geometry[0], geometry[1]
    taps = kernel_size[0] * kernel_size[1]
    lanes_used = samples / (-(-samples // SIZE_LANES) * SIZE_LANES)    # the same on every host
    size = int(np.prod(x_shape))
    least = LANES_MIN_SIZE_8 if lanes == 8 and taps > 9 else LANES_MIN_SIZE
    return lanes_used >= 0.5 and 16 <= weight_shape[1] < GEMM_CHANNELS and taps > 1 and \
        size >= least and (stride != (1, 1) or taps > 9)
