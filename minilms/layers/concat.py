"""Concat: join bottoms ``[N, C_i, ...]`` along the channel axis into ``[N, sum C_i, ...]``
(inception blocks). All other dimensions must agree.

Forward copies each bottom into its channel slice; backward copies each slice of the gradient out.
Neither reads a forward blob. The copy kernel
(``kernels.elementwise.slice_copy``) sees every array as ``[N, C, inner]``.
"""
from ..kernels import families
from .base import Layer, ShapeError, register
from .recompute import DETERMINISTIC, Recompute
from .split import SAMPLE_WISE

# numba's: imported with the first kernel that runs (``kernels.families``)
(elementwise,) = families("elementwise")


@register
class Concat(Layer):
    type = "Concat"
    bottoms = (1, 64)
    backward_reads = frozenset()
    split = SAMPLE_WISE
    recompute = Recompute.rerun(DETERMINISTIC)

    def infer(self, bottom_shapes):
        first = bottom_shapes[0]
        self.expect_rank(0, first, (2, 3, 4, 5))
        for i, shape in enumerate(bottom_shapes[1:], 1):
            if len(shape) != len(first) or shape[0] != first[0] or shape[2:] != first[2:]:
                raise ShapeError(self, f"bottom {i} ({self.bottom[i]})",
                                 f"[{first[0]}, C, {', '.join(map(str, first[2:]))}]", shape)
        channels = sum(shape[1] for shape in bottom_shapes)
        return [(first[0], channels, *first[2:])]

    def forward(self, io):
        offset = 0
        for part in io.bottom:
            elementwise.slice_copy(part, io.top[0], offset, True, io.stream)
            offset += part.shape[1]

    def backward(self, io):
        offset = 0  # from the shapes, not io.bottom: backward reads no forward blob
        for part_grad, shape in zip(io.bottom_grad, self.bottom_shapes):
            if part_grad is not None:
                elementwise.slice_copy(part_grad, io.top_grad[0], offset, False, io.stream)
            offset += shape[1]
