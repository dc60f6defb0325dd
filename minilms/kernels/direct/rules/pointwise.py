"""Where the 1x1 path applies and the workspace it takes (``direct.pointwise`` runs it)."""
from ...shapes import width

__all__ = ["SHORT_PLANE", "applies", "workspace_elements", "columns_held"]

# A sample's columns per GEMM below which dW's GEMMs run over a chunk's columns side by side:
# a GEMM with a short inner dimension is far from the machine's rate (docs/benchmarks.md). Only
# dW, a sum over the samples (regrouped when a step is split): the forward and the input gradient
# are a sample's own, and must not depend on how many samples share a call. One GEMM over several
# samples' columns does (BLAS picks its kernel by the width): session 32 ran the 7x7 planes'
# forward and input gradient so, and a step split into chunks of 1-2 samples then gave other bits
# (tests/kernels/test_conv_pointwise.py checks it above ``blas_threads.MIN_FLOPS``). On the
# shortest planes they now go side by side in ``kernels.slotted``'s fixed-width products.
SHORT_PLANE = 256


def applies(weight_shape, geometry) -> bool:
    """A 1x1 kernel with no padding (any stride; dilation means nothing at 1x1)."""
    (kh, kw), _, (ph, pw), _ = geometry
    return (kh, kw) == (1, 1) and (ph, pw) == (0, 0) and len(weight_shape) == 4


def workspace_elements(x_shape, out: int, out_plane: int, chunk: int, strided: bool,
                       slots: int = 1) -> int:
    """Float elements the workspace must hold for ``chunk`` samples (``slots`` per product of
    the forward and the input gradient): the side-by-side columns of ``dy`` and ``x`` where a
    plane is short, a gathered sub-grid of ``x`` (or of ``dx``) where the convolution is
    strided, nothing otherwise."""
    channels = x_shape[1]
    if out_plane < SHORT_PLANE:
        return (channels + out) * columns_held(chunk, out_plane, slots)
    return chunk * channels * out_plane if strided else 0


def columns_held(chunk: int, plane: int, slots: int) -> int:
    """Columns per row the short-plane workspace holds: a chunk's, or a slotted product's."""
    return max(chunk * plane, width(slots, plane) if slots > 1 else 0)
