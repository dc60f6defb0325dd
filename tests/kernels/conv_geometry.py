"""Random convolution geometries for the direct cpu kernels' hypothesis tests (``conv_direct``,
``conv_weight_grad``, ``conv_input_grad``): each test picks its own ranges. And ``amid_nans``:
the kernels read their input in place, with taps in the padding masked off."""
from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

from minilms.kernels.im2col import conv_out_size


class Geometry(NamedTuple):
    n: int
    c: int
    o: int
    kernel: tuple
    stride: tuple
    pad: tuple
    dilation: tuple
    height: int
    width: int

    @property
    def out_h(self) -> int:
        return conv_out_size(self.height, self.kernel[0], self.stride[0], self.pad[0],
                             self.dilation[0])

    @property
    def out_w(self) -> int:
        return conv_out_size(self.width, self.kernel[1], self.stride[1], self.pad[1],
                             self.dilation[1])

    @property
    def has_output(self) -> bool:
        """False where the layer would reject the shapes at setup."""
        return self.out_h >= 1 and self.out_w >= 1

    @property
    def args(self):
        """``(kernel_size, stride, padding, dilation)``, as the kernels take them."""
        return self.kernel, self.stride, self.pad, self.dilation


def geometries(samples, channels, outputs, kernel_h, kernel_w, stride_h, height, width):
    """Geometries whose sizes lie in the given ``(low, high)`` ranges; horizontal strides 1-3,
    padding 0-2 and dilation 1-2 on both axes."""
    def ints(bounds):
        return st.integers(*bounds)
    pairs = st.tuples
    return st.builds(Geometry, ints(samples), ints(channels), ints(outputs),
                     pairs(ints(kernel_h), ints(kernel_w)), pairs(ints(stride_h), ints((1, 3))),
                     pairs(ints((0, 2)), ints((0, 2))), pairs(ints((1, 2)), ints((1, 2))),
                     ints(height), ints(width))


def amid_nans(array, margin: int = 64):
    """A copy of ``array`` (contiguous) in the middle of a NaN-filled buffer: a kernel that
    reads past either end, where its masks should have kept it, computes NaN."""
    buffer = np.full(array.size + 2 * margin, np.nan, array.dtype)
    inside = buffer[margin:margin + array.size].reshape(array.shape)
    inside[...] = array
    return inside
