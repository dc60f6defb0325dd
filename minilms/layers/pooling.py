"""Pooling: ``[N, C, H, W] -> [N, C, Ho, Wo]``, max or average over windows of each plane.

Options (Caffe's names, PyTorch's semantics)::

    pool               "max" | "ave" (also "avg"; case-insensitive, so Caffe's MAX / AVE work)
    kernel_size        int or (kh, kw)
    stride             int or (sh, sw); default: kernel_size
    pad                int or (ph, pw), 0 <= pad <= kernel_size // 2; default 0
    ceil_mode          False: Ho = floor((H + 2*pad - kh) / sh) + 1; True: ceil, minus 1 if the
                       last window would start in the right padding (as PyTorch)
    count_include_pad  average only: True (default) divides by the window clipped to the padded
                       input, zero padding included; False by the number of real elements
    global_pooling     True: one window per plane, ``[N, C, 1, 1]`` (no kernel_size, stride or pad)

Max: ``y[n,c,oh,ow] = max over the window of x`` (padding never wins; ties go to the first maximum
in row-major order). Forward saves ``argmax`` (the shape of ``y``: ``h*W + w`` within the plane,
PyTorch's ``return_indices``; int32, or uint16 on the cpu where a plane has at most 2^16 pixels:
``shapes.argmax_dtype``); backward is ``dx[n,c,h,w] = sum of dy[n,c,oh,ow]`` over the
outputs whose argmax is ``(h, w)``.

Average: ``y = sum(window ∩ input) / divisor``; ``dx[n,c,h,w] = sum of dy / divisor`` over the
windows that hold ``(h, w)``. Global average: ``y[n,c] = mean over h, w``, ``dx = dy / (H*W)``.

Neither kind reads a forward blob in backward: max pooling keeps only its argmax, average pooling
needs nothing but the geometry. The kernels are in ``minilms.kernels.pooling``.
"""
import numpy as np

from ..kernels import families, shapes
from .base import BufferSpec, Layer, ShapeError, register
from .recompute import DETERMINISTIC, Recompute
from .split import SplitRule, samples

# numba's: imported with the first kernel that runs (``kernels.families``)
(pooling,) = families("pooling")

_KINDS = {"max": "max", "ave": "ave", "avg": "ave"}


@register
class Pooling(Layer):
    type = "Pooling"
    backward_reads = frozenset()
    # every window lies in one sample's planes (a global one too); the argmax is per sample
    split = SplitRule(samples("forward"), samples("backward"), batch_saved=frozenset({"argmax"}))
    # max pooling writes its argmax again: the same indices (ties go to the first maximum)
    recompute = Recompute.rerun(DETERMINISTIC, saved_rewrites={"argmax"})

    def __init__(self, name, bottom, top, pool: str = "max", kernel_size=None, stride=None,
                 pad=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 global_pooling: bool = False):
        super().__init__(name, bottom, top)
        kind = _KINDS.get(pool.lower()) if isinstance(pool, str) else None
        if kind is None:
            raise ShapeError(self, "pool", "'max' or 'ave' (or 'avg')", repr(pool))
        self.pool = kind
        for what, value in (("ceil_mode", ceil_mode), ("count_include_pad", count_include_pad),
                            ("global_pooling", global_pooling)):
            if not isinstance(value, (bool, np.bool_)):
                raise ShapeError(self, what, "true or false", repr(value))
        self.global_pooling = bool(global_pooling)
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        if self.global_pooling:
            for what, value, unset in (("kernel_size", kernel_size, None), ("stride", stride, None),
                                       ("pad", pad, 0)):
                if value is not unset and value != unset:
                    raise ShapeError(self, what, "none with global_pooling", value)
            self.kernel = self.stride = None
            self.pad = (0, 0)
            return
        if kernel_size is None:
            raise ShapeError(self, "kernel_size", "an int or an (h, w) pair", None)
        self.kernel = self._pair("kernel_size", kernel_size, 1)
        self.stride = self.kernel if stride is None else self._pair("stride", stride, 1)
        self.pad = self._pair("pad", pad, 0)
        for axis, k, p in (("h", self.kernel[0], self.pad[0]), ("w", self.kernel[1], self.pad[1])):
            if p > k // 2:
                raise ShapeError(self, "pad", f"at most kernel_size // 2 = {k // 2} ({axis})", p)

    def _pair(self, what, value, low) -> tuple[int, int]:
        """An int or a pair of ints, each >= ``low``, as ``(h, w)``."""
        pair = (value, value) if isinstance(value, (int, np.integer)) else value
        try:
            h, w = pair
            ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= low
                     for v in (h, w))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ShapeError(self, what, f"an int >= {low} or an (h, w) pair of them", value)
        return int(h), int(w)

    def infer(self, bottom_shapes):
        shape = bottom_shapes[0]
        self.expect_rank(0, shape, (4,))
        n, c, h, w = shape
        where = f"bottom 0 ({self.bottom[0]})"
        if h < 1 or w < 1:
            raise ShapeError(self, where, "a non-empty H x W plane", shape)
        if self.global_pooling:
            return [(n, c, 1, 1)]
        out = []
        for axis, size, k, s, p in (("H", h, self.kernel[0], self.stride[0], self.pad[0]),
                                    ("W", w, self.kernel[1], self.stride[1], self.pad[1])):
            if size + 2 * p < k:
                raise ShapeError(self, where, f"{axis} + 2*pad >= kernel_size {k}", shape)
            out.append(shapes.pool_output_size(size, k, s, p, self.ceil_mode))
        return [(n, c, *out)]

    def _geometry(self):
        """(kernel, stride, pad) for the kernels; a global window is the whole plane."""
        if self.global_pooling:
            plane = tuple(self.bottom_shapes[0][2:])
            return plane, plane, (0, 0)
        return self.kernel, self.stride, self.pad

    def saved(self):
        if self.pool == "max":
            plane = self.bottom_shapes[0][2] * self.bottom_shapes[0][3]
            return [BufferSpec("argmax", self.top_shapes[0],
                               np.dtype(shapes.argmax_dtype(self.device_kind, plane)))]
        return []

    def forward(self, io):
        x, y = io.bottom[0], io.top[0]
        kernel, stride, pad = self._geometry()
        if self.pool == "max":
            pooling.max_pool_forward(x, y, io.saved["argmax"], kernel, stride, pad, io.stream)
        elif self.global_pooling:
            pooling.global_avg_pool_forward(x, y, io.stream)
        else:
            pooling.avg_pool_forward(x, y, kernel, stride, pad, self.count_include_pad, io.stream)

    def backward(self, io):
        dx, dy = io.bottom_grad[0], io.top_grad[0]
        if dx is None:
            return
        kernel, stride, pad = self._geometry()
        if self.pool == "max":
            pooling.max_pool_backward(dy, io.saved["argmax"], dx, kernel, stride, pad, io.stream)
        elif self.global_pooling:
            pooling.global_avg_pool_backward(dy, dx, io.stream)
        else:
            pooling.avg_pool_backward(dy, dx, kernel, stride, pad, self.count_include_pad,
                                      io.stream)
