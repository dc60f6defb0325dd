"""InnerProduct (linear): ``[N, ...]`` flattened to ``[N, K]`` -> ``[N, num_output]``.

Options: ``num_output``, ``bias`` (True), ``weight_init`` ("he" or "xavier"). Parameters in
PyTorch's ``Linear`` layout: ``weight [out, K]``, ``bias [out]`` (zeros).

    forward    y = x W^T (+ ones b^T)        gemm(x, W, y, trans_b=True); the bias as a rank-1 gemm
    backward   dW = dy^T x,  db = dy^T ones,  dx = dy W

The bias uses Caffe's bias multiplier, a vector of ones in the workspace (in the run's float
dtype), which is never proportional to the batch: at most ``ONES_ROWS`` ones, the batch walked in
chunks of that many rows.
"""
import numpy as np

from ..kernels import families
from .base import BufferSpec, Layer, ParamSpec, ShapeError, register
from .recompute import Recompute
from .split import ACCUMULATE, SAMPLES, Pass, Phase, SplitRule

# numba's: imported with the first kernel that runs (``kernels.families``)
elementwise, gemm = families("elementwise", "gemm")

ONES_ROWS = 1024  # the most rows one bias gemm covers: bounds the workspace, whatever the batch


@register
class InnerProduct(Layer):
    type = "InnerProduct"
    backward_reads = frozenset({"bottom"})
    # Split: forward and dx per sample, dweight and dbias sums over the samples (per chunk, added
    # up). Nothing is promised bitwise on cpu: each is one BLAS call over the chunk's rows, and
    # BLAS picks its kernel by the shape (a one-row chunk goes to gemv, which orders a row's dot
    # product differently). The cuda GEMM computes a row the same way whatever the rows.
    split = SplitRule(Phase(SAMPLES, (Pass("forward"),), regrouped=("top",)), Phase(
        ACCUMULATE, (Pass("backward"),), sums=("param_grad.weight", "param_grad.bias"),
        regrouped=("bottom_grad", "param_grad.weight", "param_grad.bias")))
    recompute = Recompute.rerun("GEMMs (BLAS on cpu, the tiled kernel on cuda) in a fixed "
                                "order: run again")

    def __init__(self, name, bottom, top, num_output=None, bias: bool = True,
                 weight_init: str = "he"):
        super().__init__(name, bottom, top)
        if isinstance(num_output, bool) or not isinstance(num_output, (int, np.integer)) \
                or num_output < 1:
            raise ShapeError(self, "num_output", "a positive integer", repr(num_output))
        if weight_init not in ("he", "xavier"):
            raise ShapeError(self, "weight_init", "'he' or 'xavier'", repr(weight_init))
        self.num_output, self.bias, self.weight_init = int(num_output), bool(bias), weight_init

    def infer(self, bottom_shapes):
        shape = bottom_shapes[0]
        self.expect_rank(0, shape, (2, 3, 4, 5))
        self.k = int(np.prod(shape[1:], dtype=np.int64))
        if self.k < 1:
            raise ShapeError(self, f"bottom 0 ({self.bottom[0]})",
                             "at least one feature per sample",
                             shape)
        self.ones_rows = min(shape[0], ONES_ROWS)
        return [(shape[0], self.num_output)]

    def flops(self) -> int:
        return 2 * self.bottom_shapes[0][0] * self.num_output * self.k

    def params(self):
        if not self.bottom_shapes:
            raise RuntimeError(f"layer {self.name} ({self.type}): params() needs setup() first")
        specs = [ParamSpec("weight", (self.num_output, self.k), self.weight_init,
                           fan_in=self.k, fan_out=self.num_output)]
        if self.bias:
            specs.append(ParamSpec("bias", (self.num_output,), "zeros"))
        return specs

    def workspace(self):
        return [BufferSpec("ones", (self.ones_rows,))] if self.bias else []

    def _ones(self, io):
        """The ones vector (filled), and how many rows one bias gemm covers."""
        ones = io.work["ones"]
        elementwise.fill(ones, 1.0, io.stream)
        return ones, ones.size

    def forward(self, io):
        x, y = io.bottom[0], io.top[0]
        n = x.shape[0]
        gemm.gemm(x.reshape(n, self.k), io.params["weight"], y, trans_b=True, stream=io.stream)
        if self.bias:
            ones, rows = self._ones(io)
            bias = io.params["bias"].reshape(1, self.num_output)
            for n0 in range(0, n, rows):
                n1 = min(n, n0 + rows)
                gemm.gemm(ones[:n1 - n0].reshape(-1, 1), bias, y[n0:n1], beta=1.0, stream=io.stream)

    def backward(self, io):
        dy, dx = io.top_grad[0], io.bottom_grad[0]
        n = dy.shape[0]
        dweight = io.param_grad.get("weight")
        dbias = io.param_grad.get("bias") if self.bias else None
        if dweight is not None:
            gemm.gemm(dy, io.bottom[0].reshape(n, self.k), dweight, trans_a=True, stream=io.stream)
        if dbias is not None:
            ones, rows = self._ones(io)
            column = dbias.reshape(self.num_output, 1)
            for n0 in range(0, n, rows):
                n1 = min(n, n0 + rows)
                gemm.gemm(dy[n0:n1], ones[:n1 - n0].reshape(-1, 1), column, trans_a=True,
                          beta=0.0 if n0 == 0 else 1.0, stream=io.stream)
        if dx is not None:
            gemm.gemm(dy, io.params["weight"], dx.reshape(n, self.k), stream=io.stream)
