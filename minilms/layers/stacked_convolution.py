"""StackedConvolution: sibling 1x1 convolutions of one input run as one, their weights stacked.

The net makes it; a config never lists it (``minilms.fusion.stack_siblings``). Where two or more
Convolution layers read the same blob with a 1x1 kernel, stride 1, no padding, dilation or
groups, and the same bias setting (GoogLeNet's inception blocks: the 1x1 branch and the 3x3 and
5x5 branches' reductions), one convolution with their outputs stacked reads the input once and
runs products as tall as all of them together (horizontal fusion, as TensorRT's). Forward, a
chunk of samples at a time::

    weight = [W_1; W_2; ...]                [O_1 + O_2 + ..., C, 1, 1]   (copied in: workspace)
    y = conv1x1(x[n0:n1], weight)            [k, O, H, W]   (a Convolution layer, its engine)
    top_i[n0:n1] = y[:, rows of member i] + bias_i

Backward gathers the members' top gradients into ``y``'s place the same way, runs the stacked
convolution's backward on the chunk (dx, overwritten or added into as the net asks, and the
stacked weight's gradient), and hands each member its rows of that gradient and the sums of its
``dy`` for its bias: written by the first chunk, added by the others. The chunk is as many
samples as the members' ``max_workspace`` holds of ``y`` (the whole batch at 224x224).

The members' parameters stay theirs: the same blobs (``param_blob``: ``<member>.weight``), the
same initial values (the net draws them in the order of its layers before stacking), the same
checkpoints. The numbers are the members' up to float32 rounding: each output is the same dot
product, but BLAS may take another kernel for a taller product, and dx sums every member's part in
one product where the members' layers added theirs one after another
(``tests/layers/test_stacked_convolution.py``). Runs on the ``cpu`` device only, where it was
measured to pay (docs/benchmarks.md, session 54): set up for it, or for either (None: float64,
the gradient checks, through the reference engine); never split along the batch.
"""
from dataclasses import replace

import numpy as np

from ..kernels import families, on_cpu
from .base import BufferSpec, Layer, StepIO
from .convolution import Convolution
from .recompute import Recompute

# numba's: imported with the first kernel that runs (``kernels.families``)
(elementwise,) = families("elementwise")


class StackedConvolution(Layer):
    type = "StackedConvolution"
    backward_reads = frozenset({"bottom"})
    recompute = Recompute.rerun("the stacked convolution's calls, the same for the same shapes, "
                                "and the same copies, run again")

    def __init__(self, members: list[Convolution]):
        self.tops = len(members)
        super().__init__("+".join(m.name for m in members), members[0].bottom,
                         [m.top[0] for m in members])
        self.members = list(members)
        self.rows, start = [], 0
        for member in self.members:
            self.rows.append((start, start + member.num_output))
            start += member.num_output
        self.outputs = start

    def infer(self, bottom_shapes):
        if self.device_kind not in ("cpu", None):
            raise ValueError(f"StackedConvolution {self.name}: set up for the cpu device only, "
                             f"found {self.device_kind!r}")
        tops = [member.setup(bottom_shapes, self.device_kind)[0] for member in self.members]
        samples, channels, height, width = bottom_shapes[0]
        plane = height * width
        self.chunk = max(1, min(samples, self.members[0].max_workspace // (4 * self.outputs
                                                                           * plane)))
        self.conv = Convolution(self.name, self.bottom, ["stacked"], num_output=self.outputs,
                                kernel_size=1, bias=False,
                                max_workspace=self.members[0].max_workspace)
        self.conv.setup([(self.chunk, channels, height, width)], self.device_kind)
        self.adds_bottom_grad = self.conv.adds_bottom_grad
        return tops

    def params(self):
        return [replace(spec, name=f"{member.name}.{spec.name}")
                for member in self.members for spec in member.params()]

    def param_blob(self, name: str) -> str:
        return name      # the members' own: ``<member>.<parameter>``

    def workspace(self):
        (_, channels, height, width), k = self.bottom_shapes[0], self.chunk
        return [BufferSpec("weight", (self.outputs, channels, 1, 1)),
                BufferSpec("weight_grad", (self.outputs, channels, 1, 1)),
                BufferSpec("y", (k, self.outputs, height, width))] + [
            replace(spec, name=f"conv.{spec.name}") for spec in self.conv.workspace()]

    def flops(self) -> int:
        return sum(member.flops() for member in self.members)

    # -- the passes ------------------------------------------------------------------------------
    def _stacked_weight(self, io):
        weight = io.work["weight"]
        for member, (a, _) in zip(self.members, self.rows):
            elementwise.slice_copy(io.params[f"{member.name}.weight"][None], weight[None], a,
                                   True)
        return weight

    def _conv_work(self, io):
        return {spec.name: io.work[f"conv.{spec.name}"] for spec in self.conv.workspace()}

    def _chunks(self, samples):
        return [(n0, min(samples, n0 + self.chunk)) for n0 in range(0, samples, self.chunk)]

    def forward(self, io: StepIO) -> None:
        x = io.bottom[0]
        if not on_cpu(x):
            raise ValueError(f"StackedConvolution {self.name}: runs on the cpu device only")
        weight, work = self._stacked_weight(io), self._conv_work(io)
        for n0, n1 in self._chunks(x.shape[0]):
            y = io.work["y"][:n1 - n0]
            self.conv.forward(StepIO(bottom=[x[n0:n1]], top=[y], params={"weight": weight},
                                     work=work, train=io.train, stream=io.stream))
            for member, top, (a, b) in zip(self.members, io.top, self.rows):
                bias = io.params.get(f"{member.name}.bias")
                if bias is None:
                    elementwise.slice_copy(top[n0:n1], y, a, False)
                else:
                    np.add(y[:, a:b], bias.reshape(1, -1, 1, 1), out=top[n0:n1])

    def backward(self, io: StepIO) -> None:
        x, dx = io.bottom[0], io.bottom_grad[0]
        if not on_cpu(x):
            raise ValueError(f"StackedConvolution {self.name}: runs on the cpu device only")
        grads = [(io.param_grad.get(f"{m.name}.weight"), io.param_grad.get(f"{m.name}.bias"))
                 for m in self.members]
        wanted = any(g is not None for pair in grads for g in pair)
        if dx is None and not wanted:
            return
        weight, work = self._stacked_weight(io), self._conv_work(io)
        dweight = io.work["weight_grad"]
        for index, (n0, n1) in enumerate(self._chunks(x.shape[0])):
            dy = io.work["y"][:n1 - n0]
            for top_grad, (a, b) in zip(io.top_grad, self.rows):
                if top_grad is None:
                    dy[:, a:b] = 0
                else:
                    elementwise.slice_copy(top_grad[n0:n1], dy, a, True)
            self.conv.backward(StepIO(
                bottom=[x[n0:n1]], top=[None], params={"weight": weight}, work=work,
                top_grad=[dy], bottom_grad=[None if dx is None else dx[n0:n1]],
                param_grad={"weight": dweight} if wanted else {}, stream=io.stream,
                adds=io.adds if dx is not None else frozenset()))
            for (dw, db), (a, b) in zip(grads, self.rows):
                if dw is not None and index == 0:     # on every core, where numpy takes one
                    elementwise.slice_copy(dw[None], dweight[None], a, False)
                elif dw is not None:
                    dw += dweight[a:b]
                if db is not None:
                    _write_or_add(db, dy[:, a:b].sum(axis=(0, 2, 3)), index == 0)


def _write_or_add(out, value, write: bool) -> None:
    if write:
        out[...] = value
    else:
        out += value
