"""ReLU: ``top = max(bottom, 0)``, any shape to the same shape.

Backward: ``dbottom = dtop * (top > 0)``. It reads the *output*, so an in-place ReLU (top named as
its bottom) needs nothing else kept: the planner drops the input.
"""
from ..kernels import families
from .base import Layer, register
from .recompute import DETERMINISTIC, Recompute
from .split import SAMPLE_WISE

# numba's: imported with the first kernel that runs (``kernels.families``)
(elementwise,) = families("elementwise")


@register
class ReLU(Layer):
    type = "ReLU"
    backward_reads = frozenset({"top"})
    split = SAMPLE_WISE
    recompute = Recompute.rerun(DETERMINISTIC)

    def infer(self, bottom_shapes):
        return [bottom_shapes[0]]

    def forward(self, io):
        elementwise.relu_forward(io.bottom[0], io.top[0], io.stream)

    def backward(self, io):
        if io.bottom_grad[0] is not None:
            elementwise.relu_backward(io.top[0], io.top_grad[0], io.bottom_grad[0], io.stream)
