"""The cpu's input gradient with samples in vector lanes against a float64 reference that adds each
tap's products into strided views of a padded ``dx``, over random geometries (strides larger
than the kernel's reach included); outputs start as NaN, so every element must be written; the
result does not depend on how many samples a chunk holds."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.kernels.direct import input_grad as conv_input_grad
from minilms.kernels.direct.vector_ir import VL
from minilms.kernels.im2col import conv_out_size

from .conv_geometry import geometries


def reference(dy, weight, input_size, kernel_size, stride, pad, dilation):
    """``dx_padded[n, c, oh * sh + i * dh, ow * sw + j * dw] += weight[o, c, i, j] * dy[n, o,
    oh, ow]``, one einsum per tap, then the padding cropped: no shared code with the kernel."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, pad, dilation
    samples, _, out_h, out_w = dy.shape
    height, width = input_size
    rows = max(height + 2 * ph, (out_h - 1) * sh + dh * (kh - 1) + 1)
    cols = max(width + 2 * pw, (out_w - 1) * sw + dw * (kw - 1) + 1)
    padded = np.zeros((samples, weight.shape[1], rows, cols))
    for i in range(kh):
        for j in range(kw):
            view = padded[:, :, i * dh:i * dh + sh * (out_h - 1) + 1:sh,
                          j * dw:j * dw + sw * (out_w - 1) + 1:sw]
            view += np.einsum("nohw,oc->nchw", dy.astype(np.float64),
                              weight[:, :, i, j].astype(np.float64))
    return padded[:, :, ph:ph + height, pw:pw + width]


def run(dy, weight, input_size, geometry, work_samples):
    """The kernel's ``dx`` from NaN: a NaN-filled ``dx`` and a workspace of ``work_samples``."""
    dx = np.full((dy.shape[0], weight.shape[1]) + input_size, np.nan, np.float32)
    work = np.full(work_samples * int(np.prod(dy.shape[1:])), np.nan, np.float32)
    assert conv_input_grad.conv_input_grad_lanes(dy, weight, dx, work, geometry)
    return dx


@settings(max_examples=60, deadline=None)
@given(geometries((1, 2 * VL + 3), (1, 20), (1, 6), (1, 5), (1, 4), (1, 3), (1, 11), (1, 11)),
       st.integers(0, 2**31 - 1))
def test_matches_reference(geometry, seed):
    if not geometry.has_output:
        return                                      # no output: the layer rejects it at setup
    n, c, o, (kh, kw), _, _, _, height, width = geometry
    out_h, out_w = geometry.out_h, geometry.out_w
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal((n, o, out_h, out_w)).astype(np.float32)
    weight = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
    g = geometry.args
    dx = run(dy, weight, (height, width), g, work_samples=VL * (1 + seed % 3))
    want = reference(dy, weight, (height, width), *g)
    np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-5 * np.sqrt(o * kh * kw))


@pytest.mark.parametrize("shape, out, k, stride, pad", [
    ((64, 20, 12, 12), 50, 5, 1, 0),    # LeNet conv2: 4 vectors of samples, 16 + 4 channels
    ((2 * VL + 5, 16, 16, 16), 32, 3, 2, 1),   # a ResNet downsampling, a short last vector
])
def test_model_shapes_and_chunks_agree_bit_for_bit(shape, out, k, stride, pad):
    """Every element of dx sums its taps in one order whatever the chunk: chunks of one vector
    of samples give exactly what one chunk of all of them gives."""
    rng = np.random.default_rng(4)
    g = ((k, k), (stride, stride), (pad, pad), (1, 1))
    out_h = conv_out_size(shape[2], k, stride, pad, 1)
    dy = rng.standard_normal((shape[0], out, out_h, out_h)).astype(np.float32)
    weight = rng.standard_normal((out, shape[1], k, k)).astype(np.float32)
    whole = run(dy, weight, shape[2:], g, work_samples=-(-shape[0] // VL) * VL)
    np.testing.assert_allclose(whole, reference(dy, weight, shape[2:], *g), rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_array_equal(run(dy, weight, shape[2:], g, work_samples=VL), whole)
    np.testing.assert_array_equal(run(dy, weight, shape[2:], g, work_samples=VL), whole)


def test_declines_a_workspace_below_one_vector_of_samples():
    dy = np.ones((3, 2, 4, 4), np.float32)
    dx = np.full((3, 16, 4, 4), np.nan, np.float32)
    work = np.empty((VL - 1) * 2 * 4 * 4, np.float32)
    g = ((3, 3), (1, 1), (1, 1), (1, 1))
    assert not conv_input_grad.conv_input_grad_lanes(dy, np.ones((2, 16, 3, 3), np.float32), dx,
                                                     work, g)
    assert np.isnan(dx).all()


def test_valid_taps_and_where_it_pays():
    taps, start = conv_input_grad.valid_taps(5, 3, 3, 2, 1, 1)    # 5 inputs, 3x3 stride 2 pad 1
    reached = [taps[start[h]:start[h + 1]].tolist() for h in range(5)]
    assert reached == [[[1, 0]], [[0, 1], [2, 0]], [[1, 1]], [[0, 2], [2, 1]], [[1, 2]]]
    downsampling = ((3, 3), (2, 2), (1, 1), (1, 1))
    lenet2 = ((5, 5), (1, 1), (0, 0), (1, 1))
    pays = conv_input_grad.sample_lanes_pay
    assert pays((32, 16, 32, 32), (32, 16, 3, 3), downsampling)       # 512k elements of dx
    assert pays((64, 20, 12, 12), (50, 20, 5, 5), lenet2)             # 184k
    assert not pays((32, 16, 8, 8), (32, 16, 3, 3), downsampling)     # 32k: the GEMM is faster
    assert not pays((64, 1, 28, 28), (20, 1, 5, 5), lenet2)           # one channel
    assert not pays((2, 16, 128, 128), (32, 16, 3, 3), downsampling)  # two samples in 16 lanes
    assert not pays((32, 16, 32, 32), (32, 16, 1, 1), ((1, 1), (2, 2), (0, 0), (1, 1)))
    assert not pays((64, 16, 32, 32), (16, 16, 3, 3), ((3, 3), (1, 1), (1, 1), (1, 1)))
    # on 8 lanes, a batch of 8 fills them: kernels above 3x3 from LANES_MIN_SIZE_8
    googlenet = ((5, 5), (1, 1), (2, 2), (1, 1))
    for lanes, wanted in ((8, True), (16, False)):
        assert pays((8, 16, 14, 14), (48, 16, 5, 5), googlenet, lanes=lanes) == wanted  # 25k
        assert not pays((8, 32, 7, 7), (128, 32, 5, 5), googlenet, lanes=lanes)         # 12.5k
        assert not pays((32, 16, 8, 8), (32, 16, 3, 3), downsampling, lanes=lanes)      # 3x3
