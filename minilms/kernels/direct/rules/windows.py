"""Where the row windows pay and the workspace they take (``direct.windows`` runs them)."""
from ...shapes import conv_out_size

__all__ = ["applies", "pays", "WINDOWS_PLANE", "WINDOWS_CHANNELS",
           "WINDOWS_CHANNELS_WIDE", "WINDOWS_WIDE_SAMPLES", "sizes", "MAX_SLOTS",
           "workspace_elements", "slot_count"]


def applies(weight_shape, geometry) -> bool:
    """A kernel of more than one tap (any stride, padding and dilation)."""
    (kh, kw), _, _, _ = geometry
    return kh * kw > 1 and len(weight_shape) == 4


# Measured (scripts/bench_windows.py; docs/benchmarks.md, session 36): the windows beat both
# im2col + GEMM and the direct kernels on output planes of at least WINDOWS_PLANE with at least
# WINDOWS_CHANNELS input channels: alone by 1.05-1.5x (ResNet-50's and GoogLeNet's 3x3s from
# 56x56 to 14x14, ResNet's stride-2 3x3 into 28x28); in the net by 1.02-1.10x an iteration, the
# 14x14 layers' share 0.97-1.06x (five A/Bs: even, within this VM's noise; the workspace is
# smaller). On 7x7 a sample's GEMMs are too short (im2col + GEMM wins by up to 1.6x).
# Kernels of more than 9 taps (GoogLeNet's 5x5s, 16-48 channels in) take them from
# WINDOWS_CHANNELS_WIDE channels and WINDOWS_WIDE_SAMPLES samples: in the net, batch 8, they ran
# 1.6x faster than the direct kernels and their input gradients (docs/benchmarks.md, "Why the
# code chose", session 67), where alone, hot, the direct kernels had looked even or better
# (session 36). The windows deal a layer out a sample a worker: one sample (2240x2240, batch 1)
# ran on one thread, 0.76x the direct kernels; two, even. A 3x3 of fewer channels keeps the
# direct kernels it was measured with (a small ResNet's).
WINDOWS_PLANE = 14 * 14
WINDOWS_CHANNELS = 48
WINDOWS_CHANNELS_WIDE = 16
WINDOWS_WIDE_SAMPLES = 2


def pays(weight_shape, geometry, out_plane: int, samples: int) -> bool:
    """Where the windows measured faster than the other paths (above); ``weight_shape`` ``[O,
    C, kh, kw]``, ``out_plane`` the output's ``OH * OW``, ``samples`` the layer's batch."""
    kh, kw = geometry[0]
    wide = kh * kw > 9
    least = WINDOWS_CHANNELS_WIDE if wide else WINDOWS_CHANNELS
    return applies(weight_shape, geometry) and out_plane >= WINDOWS_PLANE and \
        weight_shape[1] >= least and (not wide or samples >= WINDOWS_WIDE_SAMPLES)


def sizes(x_shape, weight_shape, geometry):
    """``(rows of a phase Q, out_h, out_w, a sample's xw elements, the weight's)``."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
    channels, height, width = x_shape[1:]
    out_h, out_w = conv_out_size(height, kh, sh, ph, dh), conv_out_size(width, kw, sw, pw, dw)
    rows = out_h + (kh - 1) * dh // sh      # the last tap row's window ends at the last row
    return (rows, out_h, out_w, channels * kw * sh * rows * out_w,
            weight_shape[0] * channels * kh * kw)


# At most this many workers (a slot each in the workspace). A fixed number, not the threads': the
# workspace, and so a plan, must not depend on the machine that makes it. More slots than
# threads stand empty (a sample's xw each).
MAX_SLOTS = 8


def workspace_elements(x_shape, weight_shape, geometry, slots: int) -> int:
    """Float32 elements for ``slots`` workers: the reordered weight and the weight gradient's
    ``[kh, O, C * kw]``, then a slot per worker for the ``xw`` of the sample it is on (``dxw``
    after it)."""
    _, _, _, copy, weight = sizes(x_shape, weight_shape, geometry)
    return 2 * weight + slots * copy


def slot_count(x_shape, weight_shape, geometry, elements: int) -> int:
    """The slots ``elements`` hold: at most ``MAX_SLOTS`` and the batch (0: not even one)."""
    _, _, _, copy, weight = sizes(x_shape, weight_shape, geometry)
    return max(0, min(x_shape[0], MAX_SLOTS, (elements - 2 * weight) // copy))
