"""The cpu's direct convolution (register-blocked LLVM microkernel) against a float64 reference
built tap by tap from strided views, over random geometries; masked row ends write nothing past
the output; results do not depend on the chunk size."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.kernels.direct import conv as conv_direct
from minilms.kernels.direct import input_grad as conv_input_grad

from .conv_geometry import amid_nans, geometries


def reference(x, weight, bias, stride, pad, dilation):
    """``y[n, o] = bias[o] + sum over c, i, j of weight[o, c, i, j] * x_padded[n, c, taps]``, one
    einsum per tap over a strided view of the padded input: no shared code with the kernel."""
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    kh, kw = weight.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out_h = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    out_w = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((x.shape[0], weight.shape[0], out_h, out_w))
    for i in range(kh):
        for j in range(kw):
            view = xp[:, :, i * dh:i * dh + sh * (out_h - 1) + 1:sh,
                      j * dw:j * dw + sw * (out_w - 1) + 1:sw]
            y += np.einsum("oc,nchw->nohw", weight[:, :, i, j].astype(np.float64), view)
    return y + bias.astype(np.float64)[None, :, None, None]


def run(x, weight, bias, geometry, chunk, margin=64):
    """The kernel's output, written into the middle of a NaN-filled buffer: what lies around it
    must stay NaN. The workspace is NaN too, and so is what lies around ``x``: every value the
    kernel stores must come from x, read in place or prepared."""
    out_h = (x.shape[2] + 2 * geometry[2][0] - geometry[3][0] * (weight.shape[2] - 1) - 1) \
        // geometry[1][0] + 1
    out_w = (x.shape[3] + 2 * geometry[2][1] - geometry[3][1] * (weight.shape[3] - 1) - 1) \
        // geometry[1][1] + 1
    shape = (x.shape[0], weight.shape[0], out_h, out_w)
    buffer = np.full(int(np.prod(shape)) + 2 * margin, np.nan, np.float32)
    y = buffer[margin:margin + int(np.prod(shape))].reshape(shape)
    per_sample = conv_direct.padded_size(x.shape, *geometry)
    work = np.full(chunk * per_sample + conv_direct.VL, np.nan, np.float32)
    conv_direct.conv_forward_direct(amid_nans(x), weight, bias, y, work, chunk, geometry)
    assert np.isnan(buffer[:margin]).all() and np.isnan(buffer[-margin:]).all()
    return y


@settings(max_examples=60, deadline=None)
@given(geometries((1, 3), (1, 6), (1, 21), (1, 3), (1, 3), (1, 2), (1, 12), (1, 40)),
       st.integers(0, 2**31 - 1))
def test_matches_reference(geometry, seed):
    if not geometry.has_output:
        return                                      # no output: the layer rejects it at setup
    n, c, o, (kh, kw), _, _, _, height, width = geometry
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    weight = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    g = geometry.args
    y = run(x, weight, bias, g, chunk=1 + seed % n)
    expected = reference(x, weight, bias, g[1], g[2], g[3])
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5 * c * kh * kw)


@pytest.mark.parametrize("shape, out, k, stride, pad", [
    ((4, 16, 32, 32), 16, 3, 1, 1),     # full 16-lane rows, blocks of 16 channels
    ((3, 20, 12, 12), 50, 5, 1, 0),     # LeNet conv2: 8-lane rows, blocks 16, 16, 16, 2
    ((2, 3, 29, 29), 33, 7, 2, 3),      # a ResNet stem: stride 2, masked row ends
])
def test_model_shapes_and_chunks_agree_bit_for_bit(shape, out, k, stride, pad):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    weight = rng.standard_normal((out, shape[1], k, k)).astype(np.float32)
    bias = rng.standard_normal(out).astype(np.float32)
    g = ((k, k), (stride, stride), (pad, pad), (1, 1))
    whole = run(x, weight, bias, g, chunk=shape[0])
    np.testing.assert_allclose(whole, reference(x, weight, bias, *g[1:]), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(run(x, weight, bias, g, chunk=1), whole)
    np.testing.assert_array_equal(run(x, weight, bias, g, chunk=shape[0]), whole)


def test_no_bias_and_lane_choice():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    weight = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    g = ((3, 3), (1, 1), (1, 1), (1, 1))
    y = run(x, weight, None, g, chunk=2)
    np.testing.assert_allclose(y, reference(x, weight, np.zeros(5), *g[1:]), rtol=1e-5, atol=1e-4)
    assert conv_direct.lanes(8) == 8 and conv_direct.lanes(24) == conv_direct.VL
    assert conv_direct.lanes(32) == conv_direct.VL


def test_input_grad_pays_where_measured():
    assert (conv_input_grad.input_grad_pays((16, 16, 3, 3), 32 * 32)
            and conv_input_grad.input_grad_pays((8, 64, 3, 3), 4 * 4))
    assert not conv_input_grad.input_grad_pays((20, 1, 5, 5), 24 * 24)  # LeNet conv1: one channel
    assert not conv_input_grad.input_grad_pays((50, 20, 5, 5), 8 * 8)   # LeNet conv2: 25 taps
    # many channels on a small plane: im2col + GEMM (ResNet-50's last two stages); the same
    # weights on a larger plane, or fewer channels on the same plane, stay direct
    assert not conv_input_grad.input_grad_pays((512, 512, 3, 3), 7 * 7)
    assert not conv_input_grad.input_grad_pays((256, 256, 3, 3), 14 * 14)
    assert conv_input_grad.input_grad_pays((256, 256, 3, 3), 28 * 28)
    assert conv_input_grad.input_grad_pays((128, 128, 3, 3), 7 * 7)


def test_supports_float32_without_groups_only():
    assert conv_direct.supports(np.float32, 1)
    assert not conv_direct.supports(np.float64, 1) and not conv_direct.supports(np.float32, 2)


def reference_input_grad(dy, weight, x_shape, stride, pad, dilation):
    """The adjoint of ``reference``: each tap adds ``weight[:, :, i, j]^T dy`` back onto the strided
    view of the padded input it read."""
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    kh, kw = weight.shape[2:]
    n, c, height, width = x_shape
    dxp = np.zeros((n, c, height + 2 * ph, width + 2 * pw))
    out_h, out_w = dy.shape[2:]
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i * dh:i * dh + sh * (out_h - 1) + 1:sh,
                j * dw:j * dw + sw * (out_w - 1) + 1:sw] += np.einsum(
                    "oc,nohw->nchw", weight[:, :, i, j].astype(np.float64), dy)
    return dxp[:, :, ph:ph + height, pw:pw + width]


@settings(max_examples=40, deadline=None)
@given(geometries((1, 3), (1, 6), (1, 21), (1, 3), (1, 3), (1, 1), (1, 12), (1, 40))
       .map(lambda g: g._replace(stride=(1, 1))), st.integers(0, 2**31 - 1))
def test_input_grad_matches_adjoint(geometry, seed):
    if not geometry.has_output:
        return
    n, c, o, (kh, kw), _, (ph, pw), (dh, dw), height, width = geometry
    g = geometry.args
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
    dy = rng.standard_normal((n, o, geometry.out_h, geometry.out_w)).astype(np.float32)
    dx = np.full((n, c, height, width), np.nan, np.float32)
    work = np.full(10**5, np.nan, np.float32)
    applies = conv_input_grad.conv_input_grad_direct(dy, weight, dx, work, g)
    assert applies == (ph <= dh * (kh - 1) and pw <= dw * (kw - 1))
    if applies:
        np.testing.assert_allclose(dx, reference_input_grad(dy, weight, dx.shape, *g[1:]),
                                   rtol=1e-5, atol=1e-5 * o * kh * kw)
    else:
        assert np.isnan(dx).all()                   # declined: nothing written


def test_input_grad_declines_strides():
    weight = np.ones((2, 2, 3, 3), np.float32)
    dy, dx = np.ones((1, 2, 3, 3), np.float32), np.full((1, 2, 6, 6), np.nan, np.float32)
    assert not conv_input_grad.conv_input_grad_direct(dy, weight, dx, np.empty(10**4, np.float32),
                                                  ((3, 3), (2, 2), (1, 1), (1, 1)))
    assert np.isnan(dx).all()


@pytest.mark.parametrize("vertical", [1, 2])         # 2 forces rows mode
@pytest.mark.parametrize("stride", [1, 2, 3, 4])      # 1, 2: masked loads; 3, 4: gathers
@pytest.mark.parametrize("size, kernel, pad, dilation", [
    ((5, 32), 3, 1, 1), ((9, 8), 3, 0, 1), ((7, 17), 5, 2, 2), ((7, 17), 5, 4, 2),
    ((6, 3), 2, 4, 1)])
def test_prepared_input_is_the_padded_strided_input(vertical, stride, size, kernel, pad,
                                                    dilation):
    """``prepare_input`` against numpy's pad and strided slices, in rows and flat mode (the
    layout decides), from a NaN workspace: every element written, the padding zero. Where the
    kernels read ``x`` itself (stride 1 or 2, rows lined up), there is nothing to prepare."""
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((2, 3) + size).astype(np.float32)
    g = ((kernel, kernel), (vertical, stride), (pad, pad), (dilation, dilation))
    lay = conv_direct.layout(x.shape, *g)
    flat, prepared, per_sample = lay.flat, lay.prepared, lay.per_sample
    out_w = (size[1] + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    assert prepared == (stride > 2 or (flat and (stride == 2 or out_w != size[1])))
    if not prepared:
        assert conv_direct.padded_size(x.shape, *g) == 0
        with pytest.raises(ValueError, match="nothing to prepare"):
            conv_direct.prepare_input(x, np.empty(10**4, np.float32), g)
        return
    work = np.full(2 * int(np.prod(per_sample)) + conv_direct.VL, np.nan, np.float32)
    got = conv_direct.prepare_input(x, work, g).reshape((2,) + per_sample)
    # flat: [C, kw copies, rows, out_w]; rows mode: [C, rows, stride phases, quarters]
    rows, length = per_sample[2:] if flat else (per_sample[1], per_sample[3])
    padded = np.zeros((2, 3, rows, length * stride + kernel * dilation + 2 * pad + size[1]))
    padded[:, :, pad:pad + size[0], pad:pad + size[1]] = x
    if flat:        # copy j: the columns of tap j, one per output
        want = np.stack([padded[:, :, :, j * dilation:j * dilation + stride * length:stride]
                         for j in range(kernel)], axis=2)
    else:           # phase p: every stride-th column from p
        want = np.stack([padded[:, :, :, p:p + stride * length:stride]
                         for p in range(stride)], axis=3)
    np.testing.assert_array_equal(got, want.astype(np.float32))
