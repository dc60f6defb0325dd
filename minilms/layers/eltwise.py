"""Eltwise: ``top = sum_i coeff_i * bottom_i`` over two or more bottoms of one shape (residual
adds).

Backward: ``dbottom_i = coeff_i * dtop``. It reads no forward blob at all, so LMS keeps nothing
for it.
Only ``operation: sum`` exists: product and max are not used by the nets minilms builds.
"""
import math

from ..kernels.elementwise import eltwise_sum, scale
from .base import Layer, ShapeError, register
from .recompute import DETERMINISTIC, Recompute
from .split import SAMPLE_WISE


@register
class Eltwise(Layer):
    type = "Eltwise"
    bottoms = (2, 64)
    backward_reads = frozenset()
    split = SAMPLE_WISE
    recompute = Recompute.rerun(DETERMINISTIC)

    def __init__(self, name, bottom, top, operation: str = "sum", coeffs=None):
        super().__init__(name, bottom, top)
        if operation != "sum":
            raise ShapeError(self, "operation", "'sum'", repr(operation))
        if coeffs is not None and (not isinstance(coeffs, (list, tuple)) or not all(
                isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)
                for c in coeffs)):
            raise ShapeError(self, "coeffs", "a list of finite numbers, one per bottom",
                             repr(coeffs))
        self.coeffs = [1.0] * len(self.bottom) if coeffs is None else [float(c) for c in coeffs]
        if len(self.coeffs) != len(self.bottom):
            raise ShapeError(self, "coeffs", f"{len(self.bottom)} coefficients", len(self.coeffs))

    def infer(self, bottom_shapes):
        for i, shape in enumerate(bottom_shapes[1:], 1):
            if shape != bottom_shapes[0]:
                raise ShapeError(self, f"bottom {i} ({self.bottom[i]})",
                                 f"the shape of bottom 0 {bottom_shapes[0]}", shape)
        return [bottom_shapes[0]]

    def forward(self, io):
        eltwise_sum(io.bottom, io.top[0], self.coeffs, io.stream)

    def backward(self, io):
        for grad, coeff in zip(io.bottom_grad, self.coeffs):
            if grad is not None:
                scale(io.top_grad[0], coeff, grad, io.stream)
