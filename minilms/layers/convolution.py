"""Convolution: ``[N, C, H, W] -> [N, num_output, OH, OW]`` as im2col + GEMM.

Options: ``num_output``, ``kernel_size`` (an int or ``[h, w]``), ``stride`` (1), ``pad`` (0),
``dilation`` (1), ``bias`` (True), ``groups`` (1), ``weight_init`` ("he" or "xavier"),
``max_workspace`` (bytes, 64 MiB) and ``engine`` ("auto" or "reference"). ``stride``, ``pad`` and
``dilation`` may be pairs too. Parameters in PyTorch's layout: ``weight [out, C / groups, kh, kw]``,
``bias [out]`` (zeros).

Forward, for each sample ``n`` and group ``g`` (``K = C / groups * kh * kw``, ``P = OH * OW``)::

    col = im2col(x[n, channels of g])                        [K, P]
    top[n, outputs of g] = weight_g [out / groups, K] @ col  [out / groups, P]
    top[n, outputs of g] += bias_g [out / groups, 1] @ ones [1, P]   (Caffe's bias multiplier)

Backward recomputes ``col`` from the bottom (``backward_reads = {"bottom"}``) and *overwrites* the
gradients: ``dweight_g = sum_n dy_g[n] @ col^T`` (the first sample writes, the others add),
``dbias_g = sum_n dy_g[n] @ ones``, and ``dx[n]`` = col2im of ``weight_g^T @ dy_g[n]`` after ``dx``
is zeroed (col2im adds).

Anything faster is an *engine*'s: with ``engine: auto`` (the default) the layer first asks the
``cpu`` device's direct convolution (``minilms.kernels.direct``), which takes the float32
convolutions without groups where its kernels measured faster and hands the rest back;
``engine: reference`` runs only what is written here. Both give the same results up to float32
rounding (the tests compare them on random geometries).

Three ways through, chosen by the workspace (``col``, float elements in the run's dtype, sized in
``setup`` from ``max_workspace``, which counts float32 bytes: a float64 run, the gradient checks,
takes the same elements at twice the bytes):

* chunks (``cpu`` device only): while the columns of ``chunk >= 1`` whole samples fit, the workspace
  holds ``min(N, chunk)`` samples' ``col`` and transposed ``dy``, and ``minilms.kernels.conv_cpu``
  runs a chunk in a handful of calls (batched im2col, one GEMM per group, numpy for the bias).
  The workspace grows with the batch only up to ``max_workspace``. On a short plane (7x7) the
  forward runs a product per ``slots`` samples (``kernels.slotted``): the workspace then holds
  that product's ``col`` and output, up to ``ALIGN - 1`` columns wider than the chunk's.
* a chunk of samples per launch (``cuda``, groups of one): the workspace holds as many samples'
  ``col`` as fit ``max_workspace``, and each kernel takes the whole chunk, the batch in its grid
  (``im2col_batch``, ``gemm_batched`` with the weight broadcast, or summing the samples for the
  weight gradient, ``add_channel_bias``, ``channel_sums``, ``col2im_batch``): three launches a
  chunk forward, six backward, however many samples it holds. Each launch costs tens of
  microseconds of host time on a GPU; per sample they were most of an iteration's.
* one sample at a time (``cuda`` with groups; or the ``cpu`` when no whole sample's chunk fits):
  as written above, ``col`` and the ones in the workspace.
* bands: when even one sample's ``col`` exceeds ``max_workspace`` (a 2240x2240 input), the output
  is walked in bands of output rows: ``col`` holds one band's columns, and since a band of
  ``top[n]`` (or of ``dy[n]``) is not contiguous across channels, the GEMM goes through a staging
  buffer ``[out / groups, band]`` that a copy kernel (``slice_copy``) moves into place.

A 1x1 convolution of stride 1 without padding on ``cuda`` (``pointwise_cuda``: 33 of
ResNet-50's 53) needs no columns at all: its input, viewed ``[n, C, H*W]``, *is* its columns, so
forward is one batched GEMM over the whole batch, the weight gradient one GEMM that reads the
input, and ``dx`` one batched GEMM written straight into it (no im2col, col2im, or zeroing).

The device the layer is set up for (``Layer.setup(..., device_kind)``; a net built from a config
knows it) sizes the workspace for what runs there: ``cuda`` the columns of as many samples as
fit ``max_workspace`` (the batched path's, at least one sample's; none for ``pointwise_cuda``,
only the split-K partial sums), no cpu chunks;
``cpu`` where the engine runs every part of the step (``DirectConvolution.covers_all``) only the
engine's workspace; otherwise, and for a layer set up for either (None), enough for every path.
A layer run on a device it was not sized for fails with an error that says so, never silently.
"""
import math

import numpy as np

from ..kernels import families, on_cpu, shapes
from ..kernels.common import span, view
from .base import BufferSpec, Layer, ParamSpec, ShapeError, register
from .recompute import Recompute
from .split import ACCUMULATE, Pass, Phase, SplitRule, samples

# numba's: imported with the first kernel that runs (``kernels.families``)
channel_bias, conv_cpu, direct, elementwise, gemm, im2col, split_k = families(
    "channel_bias", "conv_cpu", "direct", "elementwise", "gemm", "im2col", "split_k")

MiB = 2**20
ENGINES = ("auto", "reference")


@register
class Convolution(Layer):
    type = "Convolution"
    backward_reads = frozenset({"bottom"})
    # Split: forward and dx per sample; dweight and dbias are sums over the samples, per chunk and
    # added up (regrouped). Forward is bitwise: every path computes a sample with GEMMs (or direct
    # kernels) of the same shapes whatever the batch. dx is not promised: on cpu its GEMM spans
    # the chunk's samples (BLAS picks kernels by shape) and the direct engine picks its path by
    # the batch (``input_grad.sample_lanes_pay``).
    split = SplitRule(samples("forward"), Phase(
        ACCUMULATE, (Pass("backward"),), sums=("param_grad.weight", "param_grad.bias"),
        regrouped=("bottom_grad", "param_grad.weight", "param_grad.bias")))
    recompute = Recompute.rerun("im2col + GEMM or the direct engine: for the same shapes the "
                                "same calls in the same summation order, run again")
    # cuda: a 1x1 convolution of stride 1 reads its input as its columns (off: as any other,
    # which scripts/launch_count.py's "before", the path until issue 19, needs)
    pointwise_on_cuda = True
    slots = 1   # the cpu forward's samples per product on a short plane (``kernels.slotted``)

    def __init__(self, name, bottom, top, num_output=None, kernel_size=None, stride=1, pad=0,
                 dilation=1, bias: bool = True, groups: int = 1, weight_init: str = "he",
                 max_workspace: int = 64 * MiB, engine: str = "auto"):
        super().__init__(name, bottom, top)
        self.num_output = self._positive("num_output", num_output)
        self.kernel_size = self._pair("kernel_size", kernel_size, 1)
        self.stride = self._pair("stride", stride, 1)
        self.pad = self._pair("pad", pad, 0)
        self.dilation = self._pair("dilation", dilation, 1)
        self.groups = self._positive("groups", groups)
        self.bias = bool(bias)
        self.max_workspace = self._positive("max_workspace", max_workspace)
        if weight_init not in ("he", "xavier"):
            raise ShapeError(self, "weight_init", "'he' or 'xavier'", repr(weight_init))
        self.weight_init = weight_init
        if engine not in ENGINES:
            raise ShapeError(self, "engine", "'auto' or 'reference'", repr(engine))
        self.engine = engine
        if self.num_output % self.groups:
            raise ShapeError(self, "num_output", f"a multiple of groups ({self.groups})",
                             self.num_output)

    def _positive(self, what, value):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ShapeError(self, what, "a positive integer", repr(value))
        return int(value)

    def _pair(self, what, value, least):
        pair = [value, value] if isinstance(value, (int, np.integer)) else value
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or any(
                isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least
                for v in pair):
            raise ShapeError(self, what, f"an integer >= {least} or a pair [h, w] of them",
                             repr(value))
        return int(pair[0]), int(pair[1])

    # -- shapes --------------------------------------------------------------------------------
    def infer(self, bottom_shapes):
        shape = bottom_shapes[0]
        self.expect_rank(0, shape, (4,))
        n, channels, height, width = shape
        bottom = f"bottom 0 ({self.bottom[0]})"
        if channels % self.groups:
            raise ShapeError(self, bottom, f"channels divisible by groups ({self.groups})", shape)
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (self.kernel_size, self.stride, self.pad,
                                                  self.dilation)
        out_h = shapes.conv_out_size(height, kh, sh, ph, dh)
        out_w = shapes.conv_out_size(width, kw, sw, pw, dw)
        if out_h < 1 or out_w < 1:
            reach = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
            raise ShapeError(self, bottom, f"an input of at least {reach[0]}x{reach[1]} with pad "
                             f"{ph}x{pw} (kernel {kh}x{kw}, dilation {dh}x{dw})", shape)
        self.in_group = channels // self.groups          # input channels per group
        self.out_group = self.num_output // self.groups  # outputs per group
        self.k = self.in_group * kh * kw                 # rows of col
        self.out_h, self.out_w = out_h, out_w
        self._size_workspace(shape, chunked=self.device_kind != "cuda")
        self.fast = None if self.engine == "reference" else direct.DirectConvolution(
            shape, (self.num_output, self.in_group) + self.kernel_size, self.groups,
            self._geometry(), self.chunk, self.max_workspace, cpu=self.device_kind != "cuda")
        engine = self.fast.elements if self.fast else 0
        self.engine_only = self.device_kind == "cpu" and self.fast and self.fast.covers_all
        self.adds_bottom_grad = bool(self.engine_only and self.fast.pointwise)
        if self.engine_only:
            self.elements = max(engine, 1)   # the engine runs it all: no im2col columns
        else:
            self.elements = max(self.elements, engine)
        return [(n, self.num_output, out_h, out_w)]

    def _size_workspace(self, shape, chunked: bool = True):
        """The plan, in float elements: ``chunk`` (samples per cpu chunk, 0: none fits, or not
        ``chunked``: a layer set up for ``cuda`` works one sample at a time), ``band_rows`` and
        ``staged`` (the per-sample plan), and the workspace's ``elements``."""
        budget = self.max_workspace // 4          # float32 elements
        plane, ones = self.out_h * self.out_w, int(self.bias)
        self.pointwise_cuda = self.pointwise_on_cuda and not chunked and self.groups == 1 \
            and self.kernel_size == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0)
        if self.pointwise_cuda:     # the input is the columns: room for split-K partials only
            self.chunk, self.band_rows, self.staged, self.partials = 0, self.out_h, False, 0
            splits = math.prod(shapes.split_k(self.num_output, self.k, shape[0], plane))
            if splits > 1 and splits * self.num_output * self.k <= budget:
                self.partials = splits * self.num_output * self.k
            self.elements = max(1, self.partials)
            return
        per_sample = (self.groups * self.k + self.num_output) * plane   # col and dyT of a chunk
        self.chunk = min(shape[0], budget // per_sample) if chunked else 0
        self.slots = shapes.count(plane, shape[0], self.chunk, self.num_output * self.k) \
            if self.groups == 1 else 1
        self.band_rows, self.staged, self.partials = self.out_h, False, 0
        if self.chunk >= 1:
            self.elements = self.chunk * per_sample   # holds one sample's col and ones as well
            if self.slots > 1:     # and the forward's slotted col and product
                self.elements = max(self.elements, (self.k + self.num_output) *
                                    shapes.width(self.slots, plane))
        elif (self.k + ones) * plane <= budget:
            self.elements = (self.k + ones) * plane
            if not chunked and self.groups == 1:   # cuda: as many samples' columns as fit
                self.elements = max(self.elements, self._cuda_columns(shape[0], budget))
        else:
            per_row = (self.k + self.out_group + ones) * self.out_w
            if budget < per_row:
                raise ShapeError(self, "max_workspace", f"at least {per_row * 4} bytes (one "
                                 f"output row of col for input {shape})", self.max_workspace)
            self.band_rows, self.staged = budget // per_row, True
            self.elements = self.band_rows * per_row

    def _cuda_columns(self, n_samples: int, budget: int) -> int:
        """Elements for as many samples' columns as fit the budget, and after them the weight
        gradient's split-K partial sums (``partials``) where its own tiles would leave a GPU idle
        (``shapes.split_k``): those come out of the columns' budget."""
        plane = self.out_h * self.out_w
        per = self.k * plane
        fit = min(n_samples, budget // per)
        splits = math.prod(shapes.split_k(self.num_output, self.k, fit, plane))
        partials = splits * self.num_output * self.k if splits > 1 else 0
        if (budget - partials) // per >= 1:
            self.partials = partials
            fit = min(n_samples, (budget - partials) // per)
        return fit * per + self.partials

    def _dw_splits(self, n_samples: int) -> tuple[int, int]:
        """The weight gradient's split-K for a chunk of ``n_samples``: ``(groups, k_parts)``,
        ``(1, 1)``: none."""
        if not self.partials:
            return 1, 1
        return shapes.split_k(self.num_output, self.k, n_samples, self.out_h * self.out_w,
                               most=self.partials // (self.num_output * self.k))

    # -- declarations --------------------------------------------------------------------------
    def flops(self) -> int:
        return 2 * self.bottom_shapes[0][0] * self.num_output * self.out_h * self.out_w * self.k

    def params(self):
        if not self.bottom_shapes:
            raise RuntimeError(f"layer {self.name} ({self.type}): params() needs setup() first")
        kh, kw = self.kernel_size
        # fan_out as PyTorch and Caffe count it: every output channel sees kh * kw taps.
        specs = [ParamSpec("weight", (self.num_output, self.in_group, kh, kw), self.weight_init,
                           fan_in=self.k, fan_out=self.num_output * kh * kw)]
        if self.bias:
            specs.append(ParamSpec("bias", (self.num_output,), "zeros"))
        return specs

    def workspace(self):
        return [BufferSpec("col", (self.elements,))]   # the run's float dtype

    # -- compute -------------------------------------------------------------------------------
    def _workspace(self, io, data):
        """The flat workspace, checked: it must come in the data's dtype
        (``dtype_in(run_dtype)``)."""
        work = io.work["col"]
        if work.dtype != data.dtype or work.size < self.elements:
            raise ValueError(f"layer {self.name} ({self.type}): workspace col is {work.size} "
                             f"{work.dtype}, expected {self.elements} {data.dtype} (the data's "
                             "dtype: allocate BufferSpec(dtype=None) with dtype_in(run dtype))")
        return work

    def _reference_allowed(self, data):
        """A layer whose workspace was sized for the ``cpu`` engine alone cannot run im2col +
        GEMM (float64 data, or another device): say so rather than overrun the workspace."""
        if self.engine_only:
            where = "cpu" if on_cpu(data) else "cuda"
            raise ShapeError(self, "workspace", "a layer set up for this run (Layer.setup's "
                             "device_kind): it was sized for the cpu device's float32 engine",
                             f"{data.dtype} data on {where}")

    def _views(self, flat, r0, r1):
        """``col [K, L]``, ``stage [out / groups, L]`` (None unstaged), ``ones [L]`` (None without
        bias) for the band ``r0 .. r1`` (``L = (r1 - r0) * OW``); each contiguous."""
        width = (r1 - r0) * self.out_w
        full = self.band_rows * self.out_w
        col = flat[:self.k * width].reshape(self.k, width)
        at = self.k * full
        stage = None
        if self.staged:
            stage = flat[at:at + self.out_group * width].reshape(self.out_group, width)
            at += self.out_group * full
        ones = flat[at:at + width] if self.bias else None
        return col, stage, ones

    def _geometry(self):
        return self.kernel_size, self.stride, self.pad, self.dilation

    def _batch_chunk(self, n_samples: int) -> int:
        """CUDA: how many samples' columns the workspace holds at once (0: the per-sample path,
        for groups, or an image whose columns alone exceed it)."""
        if self.pointwise_cuda:
            return n_samples
        if self.groups != 1 or self.staged:
            return 0
        return min(n_samples, (self.elements - self.partials) // (self.k * self.out_h * self.out_w))

    def _chunks(self, n_samples, chunk):
        for n0 in range(0, n_samples, chunk):
            yield n0, min(n_samples, n0 + chunk)


    def _forward_batched(self, x, y, weight, bias, flat, chunk, stream):
        """A chunk of samples per launch: im2col of the chunk, one GEMM with the weight
        broadcast over it, the bias added per channel. Three launches a chunk."""
        plane = self.out_h * self.out_w
        weight = view(weight, 1, self.num_output, self.k)
        for n0, n1 in self._chunks(x.shape[0], chunk):
            cols = self._columns(x, n0, n1, flat, stream)
            top = view(span(y, n0, n1), n1 - n0, self.num_output, plane)
            gemm.gemm_batched(weight, cols, top, stream=stream)
            if bias is not None:
                channel_bias.add_channel_bias(top, bias, stream)

    def _backward_batched(self, x, dy, weight, dx, dweight, dbias, flat, chunk, stream):
        """A chunk of samples per launch: the bias gradient by a reduction per channel, the
        weight gradient by one GEMM that sums the chunk's samples, the input gradient by one
        batched GEMM and a batched col2im; the first chunk writes the parameter gradients, the
        others add. At most six launches a chunk, and one to zero ``dx``."""
        plane = self.out_h * self.out_w
        if dx is not None and not self.pointwise_cuda:
            elementwise.fill(dx, 0.0, stream)   # col2im adds
        for n0, n1 in self._chunks(dy.shape[0], chunk):
            beta = 0.0 if n0 == 0 else 1.0
            grad = view(span(dy, n0, n1), n1 - n0, self.num_output, plane)
            if dbias is not None:
                channel_bias.channel_sums(grad, dbias, beta, stream)
            if dweight is not None:
                cols = self._columns(x, n0, n1, flat, stream)
                self._weight_grad(grad, cols, dweight, beta, flat, stream)
            if dx is not None:
                weight_t = view(weight, 1, self.num_output, self.k)
                if self.pointwise_cuda:     # dx is the columns' gradient: written, not added
                    gemm.gemm_batched(weight_t, grad,
                                      view(span(dx, n0, n1), n1 - n0, self.k, plane),
                                      trans_a=True, stream=stream)
                    continue
                cols = view(span(flat, 0, (n1 - n0) * self.k * plane), n1 - n0, self.k, plane)
                gemm.gemm_batched(weight_t, grad, cols, trans_a=True, stream=stream)
                im2col.col2im_batch(cols, span(dx, n0, n1), *self._geometry(), stream=stream)

    def _columns(self, x, n0, n1, flat, stream):
        """Samples ``n0 .. n1``'s columns ``[n, k, out_h * out_w]``: im2col into the workspace,
        or for ``pointwise_cuda`` the input itself, viewed so."""
        plane = self.out_h * self.out_w
        if self.pointwise_cuda:
            return view(span(x, n0, n1), n1 - n0, self.k, plane)
        cols = view(span(flat, 0, (n1 - n0) * self.k * plane), n1 - n0, self.k, plane)
        im2col.im2col_batch(span(x, n0, n1), cols, *self._geometry(), stream=stream)
        return cols

    def _weight_grad(self, grad, cols, dweight, beta, flat, stream):
        """``dweight (+)= sum over the chunk of grad[s] @ cols[s]^T``: one GEMM that sums the
        samples, or (``_dw_splits``) partial sums over shares of them and of each one's plane,
        then their ordered sum."""
        groups, k_parts = self._dw_splits(grad.shape[0])
        splits, size = groups * k_parts, self.num_output * self.k
        if splits == 1:
            gemm.gemm_batched(grad, cols, view(dweight, 1, self.num_output, self.k),
                              trans_b=True, beta=beta, stream=stream)
            return
        end = self.elements
        parts = view(span(flat, end - splits * size, end), splits, self.num_output, self.k)
        gemm.gemm_batched(grad, cols, parts, trans_b=True, stream=stream, k_parts=k_parts)
        split_k.sum_splits(parts, dweight, beta, stream)

    def forward(self, io):
        x, y = io.bottom[0], io.top[0]
        flat = self._workspace(io, x)
        if self.fast and self.fast.forward(x, io.params["weight"], io.params.get("bias"), y, flat,
                                           io.chunk[0] if io.chunk else 0):
            return
        self._reference_allowed(x)
        if self.chunk and on_cpu(x):
            conv_cpu.conv_forward(x, io.params["weight"], io.params.get("bias"), y, flat,
                                  self.chunk, self._geometry(), self.slots)
            return
        chunk = 0 if on_cpu(x) else self._batch_chunk(x.shape[0])
        if chunk:
            self._forward_batched(x, y, io.params["weight"], io.params.get("bias"), flat, chunk,
                                  io.stream)
            return
        n_samples, rows, staged = x.shape[0], self.band_rows, self.staged
        weight = io.params["weight"].reshape(self.groups, self.out_group, self.k)
        bias = io.params["bias"].reshape(self.groups, self.out_group, 1) if self.bias else None
        if self.bias:
            elementwise.fill(self._views(flat, 0, rows)[2], 1.0, io.stream)
        plane = self.out_h * self.out_w
        for n in range(n_samples):
            top = y[n].reshape(self.groups, self.out_group, plane)
            for g in range(self.groups):
                img = x[n][g * self.in_group:(g + 1) * self.in_group]
                for r0 in range(0, self.out_h, rows):
                    r1 = min(self.out_h, r0 + rows)
                    col, stage, ones = self._views(flat, r0, r1)
                    im2col.im2col(img, col, *self._geometry(), stream=io.stream, rows=(r0, r1))
                    out = stage if staged else top[g]
                    gemm.gemm(weight[g], col, out, stream=io.stream)
                    if self.bias:
                        gemm.gemm(bias[g], ones.reshape(1, -1), out, beta=1.0, stream=io.stream)
                    if staged:
                        elementwise.slice_copy(stage, top[g], r0 * self.out_w, True, io.stream)

    def backward(self, io):
        x, dy = io.bottom[0], io.top_grad[0]
        dx = io.bottom_grad[0]
        dweight = io.param_grad.get("weight")
        dbias = io.param_grad.get("bias") if self.bias else None
        if dx is None and dweight is None and dbias is None:
            return
        if io.adds and dx is not None and not (self.fast and self.fast.adds_dx(dy)):
            raise ValueError(f"Convolution {self.name}: adding into the input gradient needs the "
                             "cpu engine's 1x1 path (adds_bottom_grad), float32")
        flat = self._workspace(io, dy)
        if self.fast and on_cpu(dy):
            dx, dweight, dbias = self.fast.backward(x, dy, io.params["weight"], dx, dweight,
                                                    dbias, flat, io.chunk[0] if io.chunk else 0,
                                                    bool(io.adds) and dx is not None)
            if dx is None and dweight is None and dbias is None:
                return
        self._reference_allowed(dy)
        if self.chunk and on_cpu(dy):
            conv_cpu.conv_backward(x, dy, io.params["weight"], dx, dweight, dbias, flat,
                                   self.chunk, self._geometry())
            return
        chunk = 0 if on_cpu(dy) else self._batch_chunk(dy.shape[0])
        if chunk:
            self._backward_batched(x, dy, io.params["weight"], dx, dweight, dbias, flat, chunk,
                                   io.stream)
            return
        n_samples, rows, staged = dy.shape[0], self.band_rows, self.staged
        weight = io.params["weight"].reshape(self.groups, self.out_group, self.k)
        if dweight is not None:
            dweight = dweight.reshape(self.groups, self.out_group, self.k)
        if dbias is not None:
            dbias = dbias.reshape(self.groups, self.out_group, 1)
            elementwise.fill(self._views(flat, 0, rows)[2], 1.0, io.stream)
        if dx is not None:
            elementwise.fill(dx, 0.0, io.stream)  # col2im adds
        plane = self.out_h * self.out_w
        for n in range(n_samples):
            grad = dy[n].reshape(self.groups, self.out_group, plane)
            for g in range(self.groups):
                channels = slice(g * self.in_group, (g + 1) * self.in_group)
                for r0 in range(0, self.out_h, rows):
                    r1 = min(self.out_h, r0 + rows)
                    beta = 0.0 if n == 0 and r0 == 0 else 1.0  # overwrite, then accumulate
                    col, stage, ones = self._views(flat, r0, r1)
                    dout = grad[g]
                    if staged:
                        elementwise.slice_copy(stage, grad[g], r0 * self.out_w, False, io.stream)
                        dout = stage
                    if dbias is not None:
                        gemm.gemm(dout, ones.reshape(-1, 1), dbias[g], beta=beta, stream=io.stream)
                    if dweight is not None:
                        im2col.im2col(x[n][channels], col, *self._geometry(), stream=io.stream,
                                      rows=(r0, r1))
                        gemm.gemm(dout, col, dweight[g], trans_b=True, beta=beta, stream=io.stream)
                    if dx is not None:
                        gemm.gemm(weight[g], dout, col, trans_a=True, stream=io.stream)
                        im2col.col2im(col, dx[n][channels], *self._geometry(), stream=io.stream,
                                      rows=(r0, r1))
