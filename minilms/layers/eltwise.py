"""Eltwise: ``top = sum_i coeff_i * bottom_i`` over two or more bottoms of one shape (residual
adds), and with ``relu: true``, ``top = max(sum, 0)``: a residual add and the ReLU after it in one
layer (``minilms.fusion`` makes it from the two; oneDNN and cuDNN fuse the same pair).

Backward: ``dbottom_i = coeff_i * dtop``; with the ReLU, ``coeff_i * dtop * (top > 0)``. Without
it backward reads no forward blob at all, so LMS keeps nothing for it; with it, it reads the top,
as the ReLU's own backward would. Fused, the layer gives the two layers' numbers bit for bit in
one pass over memory each way fewer (``kernels.elementwise.axpby_relu``, ``relu_backward_scale``).
Only ``operation: sum`` exists: product and max are not used by the nets minilms builds.

In place (the top one of the first two bottoms, as the zoo's ResNets add the shortcut into the
branch, torchvision's ``out += identity``): the sum overwrites that bottom, and backward writes
that bottom's gradient over the top's last, after the others have read it.
"""
import math

from ..kernels import families
from .base import Layer, ShapeError, register
from .recompute import DETERMINISTIC, Recompute
from .split import SAMPLE_WISE

# numba's: imported with the first kernel that runs (``kernels.families``)
(elementwise,) = families("elementwise")


@register
class Eltwise(Layer):
    type = "Eltwise"
    bottoms = (2, 64)
    backward_reads = frozenset()
    split = SAMPLE_WISE
    recompute = Recompute.rerun(DETERMINISTIC)

    def __init__(self, name, bottom, top, operation: str = "sum", coeffs=None,
                 relu: bool = False):
        super().__init__(name, bottom, top)
        if operation != "sum":
            raise ShapeError(self, "operation", "'sum'", repr(operation))
        if coeffs is not None and (not isinstance(coeffs, (list, tuple)) or not all(
                isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)
                for c in coeffs)):
            raise ShapeError(self, "coeffs", "a list of finite numbers, one per bottom",
                             repr(coeffs))
        if not isinstance(relu, bool):
            raise ShapeError(self, "relu", "true or false", repr(relu))
        self.coeffs = [1.0] * len(self.bottom) if coeffs is None else [float(c) for c in coeffs]
        if len(self.coeffs) != len(self.bottom):
            raise ShapeError(self, "coeffs", f"{len(self.bottom)} coefficients", len(self.coeffs))
        self.relu = relu
        if self.top[0] in self.bottom[2:]:
            raise ShapeError(self, "top", "a blob of its own, or bottom 0 or 1 (the sum "
                             "writes its top before it reads bottom 2 on)", repr(self.top[0]))
        if relu:
            self.backward_reads = frozenset({"top"})

    def with_relu(self) -> "Eltwise":
        """This layer with the in-place ReLU after it fused in (``minilms.fusion``)."""
        return Eltwise(self.name, self.bottom, self.top, coeffs=self.coeffs, relu=True)

    def infer(self, bottom_shapes):
        for i, shape in enumerate(bottom_shapes[1:], 1):
            if shape != bottom_shapes[0]:
                raise ShapeError(self, f"bottom {i} ({self.bottom[i]})",
                                 f"the shape of bottom 0 {bottom_shapes[0]}", shape)
        return [bottom_shapes[0]]

    def forward(self, io):
        elementwise.eltwise_sum(io.bottom, io.top[0], self.coeffs, io.stream, relu=self.relu)

    def backward(self, io):
        wanted = [(grad, coeff) for blob, grad, coeff in sorted(
            zip(self.bottom, io.bottom_grad, self.coeffs), key=lambda b: b[0] == self.top[0])
            if grad is not None]    # a bottom the top overwrote last: its gradient is the top's
        if not self.relu:
            for grad, coeff in wanted:
                elementwise.scale(io.top_grad[0], coeff, grad, io.stream)
            return
        while wanted:       # two gradients a pass: the top and its gradient read once for both
            (grad_a, a), (grad_b, b) = wanted[0], wanted[1] if len(wanted) > 1 else (None, 0.0)
            elementwise.relu_backward_scale(io.top[0], io.top_grad[0], a, grad_a, b, grad_b,
                                            io.stream)
            wanted = wanted[2:]
