"""The cpu's direct weight and bias gradients (register-blocked LLVM microkernel) against a float64
reference built tap by tap from strided views, over random geometries; masked row ends and
padding read nothing (the workspace, and the memory around the input, are NaN); results do not
depend on the chunk size."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.kernels.direct import conv as conv_direct
from minilms.kernels.direct import weight_grad as conv_weight_grad
from minilms.kernels.im2col import conv_out_size

from .conv_geometry import amid_nans, geometries


def reference(x, dy, kernel_size, stride, pad, dilation):
    """``dweight[o, c, i, j] = sum over n, h, w of dy[n, o, h, w] * x_padded[n, c, tap (i, j) of
    (h, w)]``, one einsum per tap: no shared code with the kernel."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, pad, dilation
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out_h, out_w = dy.shape[2:]
    dweight = np.zeros((dy.shape[1], x.shape[1], kh, kw))
    for i in range(kh):
        for j in range(kw):
            view = xp[:, :, i * dh:i * dh + sh * (out_h - 1) + 1:sh,
                      j * dw:j * dw + sw * (out_w - 1) + 1:sw]
            dweight[:, :, i, j] = np.einsum("nohw,nchw->oc", dy.astype(np.float64), view)
    return dweight, dy.astype(np.float64).sum(axis=(0, 2, 3))


def run(x, dy, geometry, chunk):
    """The kernel's gradients, from a NaN-filled workspace and NaN-filled outputs, with NaN
    around ``x`` (read in place where the layout allows)."""
    o, c = dy.shape[1], x.shape[1]
    dweight = np.full((o, c) + geometry[0], np.nan, np.float32)
    dbias = np.full(o, np.nan, np.float32)
    per_sample = conv_direct.padded_size(x.shape, *geometry, max_step=1)
    work = np.full(chunk * per_sample + conv_direct.VL, np.nan, np.float32)
    conv_weight_grad.conv_weight_grad_direct(amid_nans(x), dy, dweight, dbias, work, chunk,
                                             geometry)
    return dweight, dbias


@settings(max_examples=60, deadline=None)
@given(geometries((1, 3), (1, 5), (1, 9), (1, 5), (1, 3), (1, 2), (1, 12), (1, 40)),
       st.integers(0, 2**31 - 1))
def test_matches_reference(geometry, seed):
    if not geometry.has_output:
        return                                      # no output: the layer rejects it at setup
    n, c, o, _, _, _, _, height, width = geometry
    out_h, out_w = geometry.out_h, geometry.out_w
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    dy = rng.standard_normal((n, o, out_h, out_w)).astype(np.float32)
    g = geometry.args
    dweight, dbias = run(x, dy, g, chunk=1 + seed % n)
    want_dweight, want_dbias = reference(x, dy, *g)
    scale = np.sqrt(n * out_h * out_w)              # float32 sums of that many products
    np.testing.assert_allclose(dweight, want_dweight, rtol=1e-5, atol=1e-6 * scale)
    np.testing.assert_allclose(dbias, want_dbias, rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize("shape, out, k, stride, pad", [
    ((4, 16, 32, 32), 16, 3, 1, 1),     # rows mode, 16 lanes: blocks of 3 outputs and one of 1
    ((3, 20, 12, 12), 50, 5, 1, 0),     # LeNet conv2: flat mode, one kernel row per call
    ((2, 3, 29, 29), 7, 7, 2, 3),       # a ResNet stem: stride 2, 7x7, masked row ends
])
def test_model_shapes_and_chunks_agree_bit_for_bit(shape, out, k, stride, pad):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    g = ((k, k), (stride, stride), (pad, pad), (1, 1))
    out_h = conv_out_size(shape[2], k, stride, pad, 1)
    dy = rng.standard_normal((shape[0], out, out_h, out_h)).astype(np.float32)
    whole = run(x, dy, g, chunk=shape[0])
    want = reference(x, dy, *g)
    np.testing.assert_allclose(whole[0], want[0], rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(whole[1], want[1], rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(run(x, dy, g, chunk=shape[0])[0], whole[0])   # deterministic
    by_one = run(x, dy, g, chunk=1)[0]       # chunks add partial sums: rounding may differ
    np.testing.assert_allclose(by_one, whole[0], rtol=1e-5, atol=1e-4)


def test_either_gradient_alone():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    dy = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    g = ((3, 3), (1, 1), (1, 1), (1, 1))
    per_sample = conv_direct.padded_size(x.shape, *g, max_step=1)
    work = np.full(2 * per_sample + conv_direct.VL, np.nan, np.float32)
    dbias = np.full(4, np.nan, np.float32)
    conv_weight_grad.conv_weight_grad_direct(x, dy, None, dbias, work, 2, g)
    np.testing.assert_allclose(dbias, reference(x, dy, *g)[1], rtol=1e-5)
    assert np.isnan(work).all()                     # no weight gradient: the input not prepared
    dweight = np.full((4, 3, 3, 3), np.nan, np.float32)
    conv_weight_grad.conv_weight_grad_direct(x, dy, dweight, None, work, 2, g)
    np.testing.assert_allclose(dweight, reference(x, dy, *g)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("registers, rows_3x3", [(32, 3), (16, 1)])   # AVX-512, AVX2
def test_register_blocks_fit_and_one_by_one_declines(monkeypatch, registers, rows_3x3):
    monkeypatch.setattr(conv_weight_grad, "REGISTERS", registers)
    for rows, cols in ((3, 3), (1, 3), (1, 5), (1, 7), (1, 11), (2, 2), (1, 1)):
        block = conv_weight_grad._block(rows * cols)
        assert block >= 1 and block * rows * cols + block + 1 <= registers
    # 3x3 whole where 3 outputs' 9 taps fit (32 registers), else by rows (3 outputs x 3 taps)
    assert conv_weight_grad._group_rows((3, 3)) == rows_3x3
    assert conv_weight_grad._block(3 * rows_3x3) == 3
    assert conv_weight_grad._group_rows((5, 5)) == 1
    assert conv_weight_grad.weight_grad_pays((16, 16, 3, 3), 32 * 32)
    assert conv_weight_grad.weight_grad_pays((20, 1, 5, 5), 24 * 24)          # LeNet conv1
    assert conv_weight_grad.weight_grad_pays((50, 20, 5, 5), 8 * 8)           # LeNet conv2
    assert not conv_weight_grad.weight_grad_pays((64, 16, 1, 1), 32 * 32)
    # many channels on a small plane: im2col + GEMM (ResNet-50's last two stages); the same
    # weights on ResNet-50's first stage's plane, or few channels, stay direct
    assert not conv_weight_grad.weight_grad_pays((256, 256, 3, 3), 14 * 14)
    assert not conv_weight_grad.weight_grad_pays((128, 128, 3, 3), 28 * 28)
    assert conv_weight_grad.weight_grad_pays((256, 256, 3, 3), 56 * 56)
    assert conv_weight_grad.weight_grad_pays((64, 64, 3, 3), 7 * 7)
