"""The ``cpu`` device's fast convolution, as the engine ``layers.convolution`` asks first.

An engine answers three things for one layer shape: how much workspace it needs (``elements``,
float32 elements the layer's workspace must hold on top of its own needs), ``forward`` and
``backward``. It takes what it does faster than im2col + GEMM and leaves the rest to the layer:
``forward`` says whether it wrote ``y``; ``backward`` returns the gradients it did not compute
(None where it wrote them), which the layer then computes by im2col + GEMM. Which path is faster
was measured per kernel shape (``scripts/bench_kernels.py``, ``scripts/bench_windows.py``,
``scripts/bench_winograd.py``; ``docs/benchmarks.md``) and is written down in the ``pays`` rules
of ``winograd``, ``windows``, ``bands``, ``conv``, ``input_grad`` and ``weight_grad``. 1x1
convolutions go to ``pointwise``; then, where they pay, Winograd's (3x3, stride 1), the row
windows (many channels) or the bands (a stem's few) take a layer whole; what is left goes kernel
by kernel.

It covers float32 convolutions without groups on the ``cpu`` device; anything else (float64, the
gradient checks; groups; ``cuda``) is left whole to the reference.
"""
from .. import families
from ..registry import on_cpu
from ..shapes import conv_out_size, count
from . import rules
from .rules import SIZE_LANES

# The paths' kernels, imported with the first one that runs (``minilms.lazy``): what the engine
# decides as a layer is set up reads their rules alone (``rules``), and planning runs no kernel.
bands, conv, input_grad, pointwise, weight_grad, windows, winograd = families(
    "direct.bands", "direct.conv", "direct.input_grad", "direct.pointwise", "direct.weight_grad",
    "direct.windows", "direct.winograd")

__all__ = ["DirectConvolution"]


class DirectConvolution:
    """The direct kernels for one convolution shape: ``x_shape`` ``[N, C, H, W]``,
    ``weight_shape`` ``[out, C / groups, kh, kw]``, ``geometry`` ``(kernel, stride, pad,
    dilation)`` as ``(h, w)`` pairs. ``chunk`` is the samples the layer's workspace holds per
    im2col chunk; 0 where not even one sample's columns fit ``max_workspace`` (GoogLeNet at
    2240x2240): then the paths that size their own buffers within ``max_workspace`` still take
    the layer (Winograd's, the row windows, the bands, a 1x1 a sample at a time), and the direct
    kernels, sized per chunk, stand aside. ``cpu``: False for a layer set up for ``cuda``, which
    this engine never runs (it takes nothing). ``max_workspace`` also bounds the samples-in-lanes
    copy of ``dy``."""

    name = "direct"

    def __init__(self, x_shape, weight_shape, groups: int, geometry, chunk: int,
                 max_workspace: int, cpu: bool = True):
        self.geometry, self.groups, self.chunk = geometry, groups, chunk
        self.batch = x_shape[0]
        self.elements = 0
        self.pointwise = False
        self.window_slots = 0       # > 0: the row windows run it all, with this many workers
        self.winograd_slots = 0     # > 0: Winograd's F(2x2, 3x3) runs it all, likewise
        self.band_slots = 0         # > 0: im2col + GEMM in bands runs it all, likewise
        self.slots = 1              # pointwise: samples per product (``slotted.count``)
        # which input gradient runs here ("direct", "lanes", or None: im2col + GEMM's), and
        # whether the weight gradient does: the backward leaves the rest to the layer
        self.dx_path, self.dw_direct, self.forward_direct = None, False, False
        if not cpu:
            return
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
        samples, height, width = x_shape[0], x_shape[2], x_shape[3]
        out, out_h, out_w = (weight_shape[0], conv_out_size(height, kh, sh, ph, dh),
                             conv_out_size(width, kw, sw, pw, dw))
        if rules.pointwise.applies(weight_shape, geometry):
            per_call = chunk or 1       # without a chunk, a sample at a time where it fits
            slots = count(out_h * out_w, samples, per_call, out * x_shape[1])
            elements = rules.pointwise.workspace_elements(x_shape, out, out_h * out_w,
                                                          per_call, (sh, sw) != (1, 1), slots)
            if chunk or elements <= max_workspace // 4:
                self.pointwise, self.chunk, self.slots, self.elements = \
                    True, per_call, slots, elements
                return
        if rules.winograd.pays(weight_shape, geometry, out_h * out_w):
            self.winograd_slots = rules.winograd.slot_count(x_shape, weight_shape, ph,
                                                            max_workspace // 4)
        if self.winograd_slots:
            self.elements = rules.winograd.workspace_elements(x_shape, weight_shape, ph,
                                                              self.winograd_slots)
            return
        if rules.windows.pays(weight_shape, geometry, out_h * out_w, samples):
            self.window_slots = rules.windows.slot_count(x_shape, weight_shape, geometry,
                                                         max_workspace // 4)
        if self.window_slots:
            self.elements = rules.windows.workspace_elements(x_shape, weight_shape, geometry,
                                                             self.window_slots)
            return
        if rules.bands.pays(weight_shape, geometry, out_h * out_w):
            self.band_slots = rules.bands.slot_count(x_shape, weight_shape, geometry,
                                                     max_workspace // 4)
        if self.band_slots:
            self.elements = rules.bands.workspace_elements(x_shape, weight_shape, geometry,
                                                           self.band_slots)
            return
        if not chunk:
            return
        self.dw_direct = rules.weight_grad.weight_grad_pays(weight_shape, out_h * out_w)
        self.forward_direct = rules.conv.forward_pays(weight_shape, out_h * out_w)
        # the larger of the forward's and the weight gradient's prepared inputs (max_step 1),
        # and of dy's as the input of the transposed convolution where that path is taken
        # sized for SIZE_LANES whatever this host's vectors: the same workspace, and plan, on
        # every host, and room for the kernels at the host's width (never more)
        x_sample = rules.conv.padded_size(x_shape, *geometry, max_step=1, vl=SIZE_LANES)
        transposed = rules.input_grad.transposed_geometry(geometry)
        if transposed is not None and \
                rules.input_grad.input_grad_pays(weight_shape, out_h * out_w):
            self.dx_path = "direct"
        dy_sample = 0 if self.dx_path is None else \
            rules.conv.padded_size((samples, out, out_h, out_w), *transposed, vl=SIZE_LANES)
        self.elements = SIZE_LANES + chunk * max(x_sample, dy_sample)
        # dy with samples in lanes: a whole number of vectors of them, within max_workspace
        dy_lanes = -(-chunk // SIZE_LANES) * SIZE_LANES * out * out_h * out_w
        if self.dx_path is None and dy_lanes * 4 <= max_workspace and \
                rules.input_grad.sample_lanes_pay(x_shape, weight_shape, geometry):
            self.dx_path = "lanes"
            self.elements = max(self.elements, dy_lanes)

    @property
    def covers_all(self) -> bool:
        """Whether this engine runs every part of the forward and the backward here (float32,
        no groups, on the ``cpu`` device), so the layer needs no workspace of its own there."""
        return self.groups == 1 and (
            self.pointwise or self.window_slots > 0 or self.winograd_slots > 0 or
            self.band_slots > 0 or (self.chunk >= 1 and
                                    self.forward_direct and self.dx_path is not None and
                                    self.dw_direct))

    def adds_dx(self, dy) -> bool:
        """Whether ``backward`` can add ``dx`` into the gradient already there (``add_dx``): the
        1x1 path's GEMMs (beta = 1), on float32 ``cpu`` arrays."""
        return self.pointwise and self._applies(dy)

    def _applies(self, array) -> bool:
        return on_cpu(array) and conv.supports(array.dtype, self.groups)

    def forward(self, x, weight, bias, y, work, first: int = 0) -> bool:
        """``y = conv(x, weight) + bias`` through ``work``; False, with nothing written, where
        this engine does not apply or ``work`` holds less than one sample's prepared input.
        ``first``: the layer's index of ``x[0]`` (a split step's chunk starts there)."""
        if not self._applies(x):
            return False
        if self.pointwise:
            pointwise.forward(x, weight, bias, y, work, self.chunk, self.geometry, self.slots)
            return True
        if self.winograd_slots:
            winograd.forward(x, weight, bias, y, work, self.winograd_slots, self.geometry,
                             self.batch, first)
            return True
        if self.window_slots:
            windows.forward(x, weight, bias, y, work, self.window_slots, self.geometry)
            return True
        if self.band_slots:
            bands.forward(x, weight, bias, y, work, self.band_slots, self.geometry)
            return True
        chunk = conv.chunk_size(x.shape, self.geometry, work.size)
        if chunk < 1 or not self.forward_direct:
            return False
        conv.conv_forward_direct(x, weight, bias, y, work, chunk, self.geometry)
        return True

    def backward(self, x, dy, weight, dx, dweight, dbias, work, first: int = 0,
                 add_dx: bool = False):
        """Writes the gradients it computes faster (each overwritten) and returns ``(dx, dweight,
        dbias)`` with None in place of those: what is left for im2col + GEMM. ``first`` as for
        ``forward``; ``add_dx``: ``dx`` added into, where ``adds_dx`` holds (else refused)."""
        if add_dx and not self.adds_dx(dy):
            raise ValueError("DirectConvolution.backward: add_dx outside the 1x1 path")
        if not self._applies(dy):
            return dx, dweight, dbias
        if self.pointwise:
            pointwise.backward(x, dy, weight, dx, dweight, dbias, work, self.chunk,
                               self.geometry, self.slots, add_dx)
            return None, None, None
        if self.winograd_slots:
            winograd.backward(x, dy, weight, dx, dweight, dbias, work, self.winograd_slots,
                              self.geometry, self.batch, first)
            return None, None, None
        if self.window_slots:
            windows.backward(x, dy, weight, dx, dweight, dbias, work, self.window_slots,
                             self.geometry)
            return None, None, None
        if self.band_slots:
            bands.backward(x, dy, weight, dx, dweight, dbias, work, self.band_slots,
                           self.geometry)
            return None, None, None
        # The direct kernels run first: run after a GEMM, they would share the cores with
        # OpenBLAS's workers, which spin for a while after a call.
        done_dx = False
        if dx is not None and self.dx_path == "direct":
            done_dx = input_grad.conv_input_grad_direct(dy, weight, dx, work, self.geometry)
        elif dx is not None and self.dx_path == "lanes":
            done_dx = input_grad.conv_input_grad_lanes(dy, weight, dx, work, self.geometry)
        chunk = conv.chunk_size(x.shape, self.geometry, work.size, max_step=1)
        if chunk >= 1 and self.dw_direct:
            weight_grad.conv_weight_grad_direct(x, dy, dweight, dbias, work, chunk,
                                                self.geometry)
            dweight = dbias = None
        return (None if done_dx else dx), dweight, dbias
