"""BatchNorm: per-channel normalisation of ``[N, C, H, W]`` (or ``[N, C]``, ``[N, C, L]``,
``[N, C, D, H, W]``) to the same shape, PyTorch's ``BatchNorm1d/2d/3d``.

Parameters, in PyTorch's names and layouts so a state dict loads as ``<layer>.<param>``:
``weight`` (gamma, ``[C]``, ones) and ``bias`` (beta, ``[C]``, zeros) when ``affine``;
``running_mean`` (``[C]``, zeros) and ``running_var`` (``[C]``, ones), kept but not learned.
Options: ``momentum=0.1``, ``eps=1e-5``, ``affine=True``.

Training forward (``io.train``), per channel over its ``M = N*H*W`` values::

    mean   = sum(x) / M,   var = sum((x - mean)^2) / M,   invstd = 1 / sqrt(var + eps)
    y      = (x - mean) * invstd * gamma + beta
    running_mean = (1 - momentum) * running_mean + momentum * mean
    running_var  = (1 - momentum) * running_var  + momentum * var * M / (M - 1)

With ``relu: true`` (``minilms.fusion`` makes it from a BatchNorm and the in-place ReLU after
it; oneDNN's ``fuse_norm_relu``), ``top = max(y, 0)`` and backward first masks the top's gradient
where ``y <= 0``, ``y`` made again from ``x`` with the forward's own expression (so backward
still reads no top): the two layers' numbers bit for bit, on the ``cpu`` device a channel at a
time while it is in cache.

``mean`` and ``invstd`` (``[C]``) are saved for backward. A recompute (``io.recompute``, issue 21)
in training applies those saved statistics (``kernels.batchnorm.batchnorm_normalize``): the
same ``y`` bit for bit, and the running statistics are not updated a second time. Test forward:
``y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta``, nothing saved or updated
(a recompute in test mode is the same). Backward (training mode only),
with ``xhat = (x - mean) * invstd``::

    dbeta = sum(dy),   dgamma = sum(dy * xhat),
    dx    = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M)

Backward reads the bottom ``x`` (and the saved ``mean``/``invstd``). Without ``affine``, gamma = 1
and beta = 0 live in a ``[C]`` workspace. The saved and workspace buffers are declared in the run's
float dtype (``BufferSpec(dtype=None)``), which is the data's, but for ``stats``: the float64
sums of the CUDA kernels' two stages (``kernels.batchnorm_sums``), declared unless the layer is
set up for the ``cpu`` device only, whose kernels sum per channel without it. A step split along
the batch carries its sums from chunk to chunk in a split workspace ``stats``: ``[2, C, 1]`` on the
``cpu`` device, the CUDA ``stats`` of the whole batch elsewhere. The kernels are in
``minilms.kernels.batchnorm``.
"""
import numbers

import numpy as np

from ..kernels import families, shapes
from .base import BufferSpec, Layer, ParamSpec, ShapeError, register
from .recompute import Recompute
from .split import ONCE, STATISTICS, Pass, Phase, SplitRule, samples

# numba's: imported with the first kernel that runs (``kernels.families``)
batchnorm, batchnorm_split, elementwise = families("batchnorm", "batchnorm_split", "elementwise")


@register
class BatchNorm(Layer):
    type = "BatchNorm"
    backward_reads = frozenset({"bottom"})
    # Split: the statistics over every chunk first, then normalisation per chunk; backward the
    # same with its two sums. The sums are carried from chunk to chunk in the whole-batch
    # kernels' order (kernels.batchnorm_split), so a split step is bitwise the unsplit one.
    split = SplitRule(
        Phase(STATISTICS, (Pass("sum_x"), Pass("finish_mean", ONCE), Pass("sum_squares"),
                           Pass("finish_invstd", ONCE), Pass("normalize"))),
        Phase(STATISTICS, (Pass("sum_grads"), Pass("finish_grads", ONCE), Pass("input_grad"))),
        inference=samples("forward"))
    recompute = Recompute.rerun(
        "training: normalises with the saved batch statistics, as the first forward did; test "
        "mode: the running statistics, read only", saved_reads={"mean", "invstd"},
        untouched=("running_mean", "running_var"))

    def __init__(self, name, bottom, top, momentum: float = 0.1, eps: float = 1e-5,
                 affine: bool = True, relu: bool = False):
        super().__init__(name, bottom, top)
        if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) \
                or not 0.0 <= momentum <= 1.0:
            raise ShapeError(self, "momentum", "a number in [0, 1]", repr(momentum))
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps > 0.0:
            raise ShapeError(self, "eps", "a number > 0", repr(eps))
        if not isinstance(affine, bool):
            raise ShapeError(self, "affine", "true or false", repr(affine))
        if not isinstance(relu, bool):
            raise ShapeError(self, "relu", "true or false", repr(relu))
        self.momentum, self.eps, self.affine, self.relu = float(momentum), float(eps), affine, relu
        if relu:
            # backward makes the mask again from the bottom (kernels.batchnorm_relu_mask): it
            # reads what it read before, no top. It may mask the top's gradient in place, as the
            # ReLU's own in-place backward did (a split step does, a chunk at a time)
            self.backward_rewrites_top_grad = True

    def with_relu(self) -> "BatchNorm":
        """This layer with the in-place ReLU after it fused in (``minilms.fusion``)."""
        return BatchNorm(self.name, self.bottom, self.top, self.momentum, self.eps, self.affine,
                         relu=True)

    def infer(self, bottom_shapes):
        shape = bottom_shapes[0]
        self.expect_rank(0, shape, (2, 3, 4, 5))
        if shape[1] < 1:
            raise ShapeError(self, f"bottom 0 ({self.bottom[0]})", "at least one channel", shape)
        return [shape]

    @property
    def channels(self) -> int:
        return self.bottom_shapes[0][1]

    def params(self):
        c = (self.channels,)
        affine = [ParamSpec("weight", c, "ones"), ParamSpec("bias", c, "zeros")] if self.affine \
            else []
        return affine + [ParamSpec("running_mean", c, "zeros", learnable=False),
                         ParamSpec("running_var", c, "ones", learnable=False)]

    def saved(self):
        return [BufferSpec("mean", (self.channels,)), BufferSpec("invstd", (self.channels,))]

    def workspace(self):
        # dweight/dbias: where parameter gradients go when none are wanted (no affine, or frozen)
        names = ("dweight", "dbias") if self.affine else ("weight", "bias", "dweight", "dbias")
        specs = [BufferSpec(name, (self.channels,)) for name in names]
        if self.device_kind != "cpu":   # the CUDA sums' two stages meet in it
            specs.append(self._stats())
        return specs

    def split_workspace(self, phase):
        """The sums carried from chunk to chunk, ``stats`` (it overrides the workspace's, which a
        sub-step may not keep: ``minilms.lms.substeps`` carries split workspace, not workspace):
        on the ``cpu`` device float64 ``[2, C, 1]``, elsewhere the CUDA sums' ``stats`` of the
        whole batch."""
        if phase == "inference":
            return []
        if self.device_kind == "cpu":
            return [BufferSpec("stats", shapes.cpu_stats_shape(self.channels),
                               np.dtype(np.float64))]
        return [self._stats()]

    def _stats(self) -> BufferSpec:
        n = self.bottom_shapes[0][0]
        return BufferSpec("stats", shapes.stats_shape(self.channels, n, self._values() // n),
                          np.dtype(np.float64))

    @staticmethod
    def _float_buffers(io) -> dict:
        """The saved and workspace buffers in the data's dtype (the float64 ``stats`` is not)."""
        return {k: v for k, v in {**io.saved, **io.work}.items() if k != "stats"}

    def _check_dtype(self, x, buffers) -> None:
        """The buffers come in the run's dtype: data of another dtype would reach the kernels
        mixed (and compile, or fail, far from here)."""
        for key, array in buffers.items():
            if array.dtype != x.dtype:
                raise ShapeError(self, f"dtype of {key}", f"the data's {x.dtype}", array.dtype)

    def _gamma_beta(self, io):
        if self.affine:
            return io.params["weight"], io.params["bias"]
        gamma, beta = io.work["weight"], io.work["bias"]
        elementwise.fill(gamma, 1.0, io.stream)
        elementwise.fill(beta, 0.0, io.stream)
        return gamma, beta

    def forward(self, io):
        x, y = io.bottom[0], io.top[0]
        self._check_dtype(x, self._float_buffers(io))
        gamma, beta = self._gamma_beta(io)
        rm, rv = io.params["running_mean"], io.params["running_var"]
        if io.train and io.recompute:
            batchnorm.batchnorm_normalize(x, gamma, beta, io.saved["mean"], io.saved["invstd"],
                                          y, io.stream, self.relu)
        elif io.train:
            if x.size // self.channels < 2:
                raise ShapeError(self, f"bottom 0 ({self.bottom[0]})",
                                 "more than one value per channel in training", tuple(x.shape))
            batchnorm.batchnorm_forward_train(x, gamma, beta, y, io.saved["mean"],
                                              io.saved["invstd"], rm, rv, self.momentum,
                                              self.eps, io.stream, io.work.get("stats"),
                                              self.relu)
        else:
            batchnorm.batchnorm_forward_inference(x, gamma, beta, rm, rv, y, self.eps,
                                                  io.stream, self.relu)

    def backward(self, io):
        if not io.train:
            raise ShapeError(self, "backward", "a training-mode step (batch statistics)",
                             "a test-mode step")
        x, dy, dx = io.bottom[0], io.top_grad[0], io.bottom_grad[0]
        mean, invstd = io.saved["mean"], io.saved["invstd"]
        dgamma, dbeta = io.param_grad.get("weight"), io.param_grad.get("bias")
        wanted = dgamma is not None
        if not wanted:
            dgamma, dbeta = io.work["dweight"], io.work["dbias"]
        gamma, beta = self._gamma_beta(io)
        if dx is None:
            if wanted:
                if self.relu:
                    self._mask(io, gamma, beta)
                batchnorm.batchnorm_param_grads(x, dy, mean, invstd, dgamma, dbeta, io.stream,
                                                io.work.get("stats"))
            return
        batchnorm.batchnorm_backward(x, dy, gamma, mean, invstd, dx, dgamma, dbeta, io.stream,
                                     io.work.get("stats"), beta if self.relu else None)

    @staticmethod
    def _mask(io, gamma, beta) -> None:
        """A fused ReLU's mask: the top's gradient (or its chunk) masked in place."""
        batchnorm.batchnorm_relu_mask(io.bottom[0], gamma, beta, io.saved["mean"],
                                      io.saved["invstd"], io.top_grad[0], io.top_grad[0],
                                      io.stream)


    # -- a training step split along the batch (minilms.layers.split) ----------------------------
    def _values(self) -> int:
        """``M``: the values per channel in the whole batch."""
        shape = self.bottom_shapes[0]
        return int(np.prod(shape, dtype=np.int64)) // shape[1]

    def sum_x(self, io):
        x = io.bottom[0]
        self._check_dtype(x, self._float_buffers(io))
        if self._values() < 2:
            raise ShapeError(self, f"bottom 0 ({self.bottom[0]})",
                             "more than one value per channel in training", self.bottom_shapes[0])
        batchnorm_split.batchnorm_split_sums(x, io.chunk[0], self._values(), io.saved["mean"],
                                             io.work.get("stats"), False, io.stream)

    def finish_mean(self, io):
        batchnorm_split.batchnorm_split_mean(io.work.get("stats"), self._values(),
                                             io.saved["mean"], io.stream)

    def sum_squares(self, io):
        batchnorm_split.batchnorm_split_sums(io.bottom[0], io.chunk[0], self._values(),
                                             io.saved["mean"], io.work.get("stats"), True,
                                             io.stream)

    def finish_invstd(self, io):
        batchnorm_split.batchnorm_split_invstd(io.work.get("stats"), self._values(),
                                               io.saved["mean"], io.saved["invstd"],
                                               io.params["running_mean"],
                                               io.params["running_var"], self.momentum, self.eps,
                                               io.stream)

    def normalize(self, io):
        gamma, beta = self._gamma_beta(io)
        batchnorm.batchnorm_normalize(io.bottom[0], gamma, beta, io.saved["mean"],
                                      io.saved["invstd"], io.top[0], io.stream, self.relu)

    def _grads(self, io):
        """(dgamma, dbeta, whether anything is wanted): the parameter gradients, or where they go
        when none are wanted, as ``backward`` has them."""
        dgamma, dbeta = io.param_grad.get("weight"), io.param_grad.get("bias")
        wanted = dgamma is not None
        if not wanted:
            dgamma, dbeta = io.work["dweight"], io.work["dbias"]
        return dgamma, dbeta, wanted or io.bottom_grad[0] is not None

    def sum_grads(self, io):
        if not io.train:
            raise ShapeError(self, "backward", "a training-mode step (batch statistics)",
                             "a test-mode step")
        if self._grads(io)[2]:
            if self.relu:
                self._mask(io, *self._gamma_beta(io))
            batchnorm_split.batchnorm_split_grad_sums(io.bottom[0], io.top_grad[0], io.chunk[0],
                                                      io.saved["mean"], io.saved["invstd"],
                                                      io.work.get("stats"),
                                                      io.bottom_grad[0] is not None, io.stream)

    def finish_grads(self, io):
        dgamma, dbeta, any_wanted = self._grads(io)
        if any_wanted:
            batchnorm_split.batchnorm_split_param_grads(io.work.get("stats"), io.saved["mean"],
                                                        io.saved["invstd"], dgamma, dbeta,
                                                        io.bottom_grad[0] is not None, io.stream)

    def input_grad(self, io):
        dx = io.bottom_grad[0]
        if dx is None:
            return
        dgamma, dbeta, _ = self._grads(io)
        gamma = io.params["weight"] if self.affine else io.work["weight"]
        if not self.affine:
            elementwise.fill(gamma, 1.0, io.stream)
        batchnorm_split.batchnorm_split_input_grad(io.bottom[0], io.top_grad[0], gamma,
                                                   io.saved["mean"], io.saved["invstd"],
                                                   io.work.get("stats"), dgamma, dbeta,
                                                   self._values(), dx, io.stream)
