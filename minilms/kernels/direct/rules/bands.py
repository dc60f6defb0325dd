"""Where the bands pay and the workspace they take (``direct.bands`` runs them)."""
from ...shapes import conv_out_size

__all__ = ["applies", "pays", "BANDS_CHANNELS", "BANDS_TAPS", "BANDS_OUTPUTS", "BANDS_PLANE",
           "BAND_COLUMNS", "MAX_SLOTS", "band_rows", "Sizes", "workspace_elements", "slot_count"]


def applies(weight_shape, geometry) -> bool:
    """A kernel of more than one tap (any stride, padding and dilation)."""
    (kh, kw), _, _, _ = geometry
    return kh * kw > 1 and len(weight_shape) == 4


# Measured (scripts/bench_bands.py; docs/benchmarks.md, session 41): on ResNet's and GoogLeNet's
# stems (3 channels, 7x7, stride 2, to 112x112, 64 outputs) the bands beat the direct kernels
# 1.4-1.7x, forward and weight gradient; with 32 outputs 1.04-1.2x, with 16 0.7-0.8x (a GEMM of
# 16 rows). With fewer taps (a 3x3 or 5x5 over 1-3 channels: K of 25-27) the direct kernels win
# by up to 1.6x. So: up to BANDS_CHANNELS input channels (an image's), at least BANDS_TAPS taps
# (C * kh * kw) and BANDS_OUTPUTS outputs, on output planes of at least BANDS_PLANE; LeNet's and
# the small ResNets' first layers keep the direct kernels they were measured with.
BANDS_CHANNELS = 4
BANDS_TAPS = 64
BANDS_OUTPUTS = 32
BANDS_PLANE = 56 * 56
# Columns per band at least: a GEMM about as wide as the core's cache holds K rows of.
BAND_COLUMNS = 896
# At most this many workers (a slot each): a fixed number, so that the workspace, and so a plan,
# does not depend on the machine's threads (as windows.MAX_SLOTS).
MAX_SLOTS = 8


def pays(weight_shape, geometry, out_plane: int) -> bool:
    """Where the bands measured faster than the other paths (above)."""
    out, channels, kh, kw = weight_shape if len(weight_shape) == 4 else (0, 0, 0, 0)
    return applies(weight_shape, geometry) and channels <= BANDS_CHANNELS and \
        channels * kh * kw >= BANDS_TAPS and out >= BANDS_OUTPUTS and out_plane >= BANDS_PLANE


def band_rows(out_w: int, out_h: int) -> int:
    """Output rows per band: ``BAND_COLUMNS`` columns or more, at most the plane."""
    return max(1, min(out_h, -(-BAND_COLUMNS // out_w)))


class Sizes:
    """One layer shape's band and slot sizes, in float32 elements."""

    def __init__(self, x_shape, weight_shape, geometry):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
        samples, channels, height, width = x_shape
        self.out, self.taps = weight_shape[0], channels * kh * kw
        self.out_h = conv_out_size(height, kh, sh, ph, dh)
        self.out_w = conv_out_size(width, kw, sw, pw, dw)
        self.rows = band_rows(self.out_w, self.out_h)
        # the band's input rows, and each phase's columns (the last tap's run ends at the last)
        self.in_rows = (self.rows - 1) * sh + (kh - 1) * dh + 1
        self.phase_cols = self.out_w + (kw - 1) * dw // sw
        self.copy = channels * self.in_rows * sw * self.phase_cols
        self.columns = self.taps * self.rows * self.out_w
        self.slot = self.copy + self.columns
        self.parts = samples * self.out * self.taps     # the samples' weight gradients


def workspace_elements(x_shape, weight_shape, geometry, slots: int) -> int:
    """Float32 elements for ``slots`` workers: the samples' weight gradients ``[N, O, K]``, then
    a slot per worker (the band's input rows by phase, and its columns)."""
    sizes = Sizes(x_shape, weight_shape, geometry)
    return sizes.parts + slots * sizes.slot


def slot_count(x_shape, weight_shape, geometry, elements: int) -> int:
    """The slots ``elements`` hold: at most ``MAX_SLOTS`` and the batch (0: not even one)."""
    sizes = Sizes(x_shape, weight_shape, geometry)
    return max(0, min(x_shape[0], MAX_SLOTS, (elements - sizes.parts) // sizes.slot))
