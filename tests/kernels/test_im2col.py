"""im2col / col2im against naive loops, each other (adjointness), torch's unfold/fold, and CUDA."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilms.kernels.im2col import col2im, col_shape, conv_out_size, im2col, out_shape

# (image [C, H, W], kernel, stride, padding, dilation)
GEOMETRIES = {
    "1x1": ((1, 1, 1), 1, 1, 0, 1),
    "3x3 same": ((2, 5, 5), 3, 1, 1, 1),
    "rectangular": ((3, 7, 6), (3, 2), (2, 1), (1, 0), 1),
    "dilated": ((2, 9, 8), 3, 2, 1, 2),
    "kernel = image": ((1, 4, 4), 4, 1, 0, 1),
    "stride > kernel": ((2, 7, 7), 1, 3, 0, 1),
    "padding > kernel": ((1, 3, 4), 1, 1, 2, 1),
    "everything": ((2, 8, 9), (2, 3), (3, 2), (2, 1), (2, 3)),
}


def pair(x):
    return (x, x) if np.isscalar(x) else tuple(x)


def naive_im2col(img, kernel, stride, padding, dilation):
    """Straight from the definition in the module docstring."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(pair, (kernel, stride, padding, dilation))
    channels, height, width = img.shape
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    col = np.zeros((channels * kh * kw, out_h * out_w), img.dtype)
    for c in range(channels):
        for i in range(kh):
            for j in range(kw):
                for oh in range(out_h):
                    for ow in range(out_w):
                        h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                        if 0 <= h < height and 0 <= w < width:
                            col[(c * kh + i) * kw + j, oh * out_w + ow] = img[c, h, w]
    return col


def naive_col2im(col, img_shape, kernel, stride, padding, dilation):
    """The transpose of naive_im2col, as a scatter-add."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(pair, (kernel, stride, padding, dilation))
    channels, height, width = img_shape
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    img = np.zeros(img_shape, col.dtype)
    for row in range(col.shape[0]):
        c, i, j = row // (kh * kw), row // kw % kh, row % kw
        for column in range(col.shape[1]):
            h = column // out_w * sh - ph + i * dh
            w = column % out_w * sw - pw + j * dw
            if 0 <= h < height and 0 <= w < width:
                img[c, h, w] += col[row, column]
    return img


def random(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("name", GEOMETRIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_matches_naive_loops(name, dtype):
    shape, *geometry = GEOMETRIES[name]
    img = random(shape, dtype)
    col = np.full(col_shape(shape, *geometry), np.nan, dtype)  # every element must be written
    assert im2col(img, col, *geometry) is col
    np.testing.assert_array_equal(col, naive_im2col(img, *geometry))

    y = random(col.shape, dtype, seed=1)
    grad = np.ones(shape, dtype)  # col2im adds to what is there
    assert col2im(y, grad, *geometry) is grad
    np.testing.assert_allclose(grad, 1 + naive_col2im(y, shape, *geometry), rtol=1e-6, atol=1e-6)


@given(channels=st.integers(1, 3), height=st.integers(1, 9), width=st.integers(1, 9),
       kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3),
       ph=st.integers(0, 2), pw=st.integers(0, 2), dh=st.integers(1, 3), dw=st.integers(1, 3))
def test_col2im_is_the_adjoint_of_im2col(channels, height, width, kh, kw, sh, sw, ph, pw, dh, dw):
    geometry = ((kh, kw), (sh, sw), (ph, pw), (dh, dw))
    if conv_out_size(height, kh, sh, ph, dh) < 1 or conv_out_size(width, kw, sw, pw, dw) < 1:
        with pytest.raises(ValueError, match="does not fit"):
            col_shape((channels, height, width), *geometry)
        return
    x = random((channels, height, width), seed=height * 10 + width)
    y = random(col_shape(x.shape, *geometry), seed=kh * 10 + kw)
    col = np.empty_like(y)
    im2col(x, col, *geometry)
    back = np.zeros_like(x)
    col2im(y, back, *geometry)
    # <col2im(y), x> == <y, im2col(x)>
    assert np.vdot(back, x) == pytest.approx(np.vdot(y, col), rel=1e-12, abs=1e-12)


def test_groups_are_channel_slices():
    shape, *geometry = GEOMETRIES["everything"]
    img = random((4,) + shape[1:])
    full = np.empty(col_shape(img.shape, *geometry))
    im2col(img, full, *geometry)
    rows = full.shape[0] // 2  # two groups of two channels: each group's rows, in order
    for group in range(2):
        part = img[2 * group:2 * group + 2]
        col = np.empty(col_shape(part.shape, *geometry))
        im2col(part, col, *geometry)
        np.testing.assert_array_equal(col, full[group * rows:(group + 1) * rows])


def bands(out_h, size):
    """Output-row bands of ``size`` rows (the last one shorter) that cover ``0 .. out_h``."""
    return [(r0, min(out_h, r0 + size)) for r0 in range(0, out_h, size)]


@pytest.mark.parametrize("name", GEOMETRIES)
@pytest.mark.parametrize("size", [1, 2])
def test_bands_of_output_rows_are_column_slices(name, size):
    shape, *geometry = GEOMETRIES[name]
    img = random(shape)
    full = im2col(img, np.empty(col_shape(shape, *geometry)), *geometry)
    y = random(full.shape, seed=1)
    whole = col2im(y, np.zeros(shape), *geometry)
    out_h, out_w = out_shape(shape, *geometry)
    summed = np.zeros(shape)
    for r0, r1 in bands(out_h, size):
        columns = slice(r0 * out_w, r1 * out_w)
        col = np.full(col_shape(shape, *geometry, rows=(r0, r1)), np.nan)
        assert im2col(img, col, *geometry, rows=(r0, r1)) is col
        np.testing.assert_array_equal(col, full[:, columns])
        col2im(np.ascontiguousarray(y[:, columns]), summed, *geometry, rows=(r0, r1))
    np.testing.assert_allclose(summed, whole, rtol=1e-12, atol=1e-12)


def test_rejects_bad_bands():
    img = np.zeros((2, 5, 5), np.float32)  # 3x3 kernel: out 3x3
    for rows in [(0, 0), (2, 1), (-1, 2), (0, 4)]:
        with pytest.raises(ValueError, match="rows must be a band"):
            im2col(img, np.zeros((18, 3), np.float32), 3, rows=rows)
    with pytest.raises(ValueError, match="col has shape"):
        col2im(np.zeros((18, 9), np.float32), img, 3, rows=(1, 3))
    assert col_shape(img.shape, 3, rows=(1, 3)) == (18, 6)


@pytest.mark.parametrize("name", ["3x3 same", "everything"])
def test_matches_torch_unfold_and_fold(name):
    torch = pytest.importorskip("torch", reason="torch is not installed: no comparison with unfold")
    shape, kernel, stride, padding, dilation = GEOMETRIES[name]
    img = random(shape)
    col = np.empty(col_shape(shape, kernel, stride, padding, dilation))
    im2col(img, col, kernel, stride, padding, dilation)
    options = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation)
    unfolded = torch.nn.functional.unfold(torch.from_numpy(img)[None], **options)[0].numpy()
    np.testing.assert_array_equal(col, unfolded)

    y = random(col.shape, seed=3)
    grad = np.zeros(shape)
    col2im(y, grad, kernel, stride, padding, dilation)
    folded = torch.nn.functional.fold(torch.from_numpy(y)[None], output_size=shape[1:], **options)
    np.testing.assert_allclose(grad, folded[0].numpy(), rtol=1e-12, atol=1e-12)


def test_rejects_bad_geometry():
    img = np.zeros((2, 5, 5), np.float32)
    with pytest.raises(ValueError, match="col has shape"):
        im2col(img, np.zeros((18, 24), np.float32), 3)
    with pytest.raises(ValueError, match="does not fit"):
        im2col(img, np.zeros((2, 1), np.float32), 6)
    with pytest.raises(ValueError, match="one image"):
        im2col(img[None], np.zeros((18, 9), np.float32), 3)
    with pytest.raises(ValueError, match=">= 1"):
        col_shape(img.shape, 3, stride=0)
    with pytest.raises(TypeError, match="dtype"):
        im2col(img, np.zeros((18, 9), np.float64), 3)


@pytest.mark.cuda
@pytest.mark.parametrize("name, dtype", [("rectangular", np.float32), ("everything", np.float32),
                                         ("3x3 same", np.float64)])
def test_cuda_matches_cpu(name, dtype):
    from numba import cuda
    shape, *geometry = GEOMETRIES[name]
    img = random(shape, dtype)
    expected = np.empty(col_shape(shape, *geometry), dtype)
    im2col(img, expected, *geometry)
    d_col = cuda.to_device(np.full(expected.shape, np.nan, dtype))
    stream = cuda.stream()
    assert im2col(cuda.to_device(img), d_col, *geometry, stream=stream) is d_col
    stream.synchronize()
    np.testing.assert_array_equal(d_col.copy_to_host(), expected)

    y = random(expected.shape, dtype, seed=2)
    grad = np.full(shape, 0.5, dtype)
    col2im(y, grad, *geometry)
    d_grad = cuda.to_device(np.full(shape, 0.5, dtype))
    col2im(cuda.to_device(y), d_grad, *geometry)
    # A gather on CUDA, a scatter on the CPU: the same terms, summed in another order.
    np.testing.assert_allclose(d_grad.copy_to_host(), grad, rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows", [("everything", (1, 3)), ("padding > kernel", (0, 1)),
                                        ("dilated", (2, 4))])
def test_cuda_bands_match_cpu(name, rows):
    from numba import cuda
    shape, *geometry = GEOMETRIES[name]
    img = random(shape, np.float32)
    expected = im2col(img, np.empty(col_shape(shape, *geometry, rows=rows), np.float32), *geometry,
                      rows=rows)
    d_col = cuda.to_device(np.full(expected.shape, np.nan, np.float32))
    im2col(cuda.to_device(img), d_col, *geometry, rows=rows)
    np.testing.assert_array_equal(d_col.copy_to_host(), expected)

    y = random(expected.shape, np.float32, seed=2)
    grad = col2im(y, np.full(shape, 0.5, np.float32), *geometry, rows=rows)
    d_grad = cuda.to_device(np.full(shape, 0.5, np.float32))
    col2im(cuda.to_device(y), d_grad, *geometry, rows=rows)
    np.testing.assert_allclose(d_grad.copy_to_host(), grad, rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
def test_cuda_rejects_mixed_and_strided_arrays():
    from numba import cuda
    img = np.zeros((2, 5, 5), np.float32)
    col = np.zeros((18, 9), np.float32)
    with pytest.raises(TypeError, match="both be numpy"):
        im2col(cuda.to_device(img), col, 3)
    with pytest.raises(ValueError, match="C-contiguous"):
        im2col(cuda.to_device(np.zeros((2, 5, 10), np.float32))[:, :, ::2], cuda.to_device(col), 3)


@pytest.mark.parametrize("name", ["rectangular", "everything", "3x3 same"])
def test_a_batch_is_each_image(name):
    """``im2col_batch`` / ``col2im_batch`` give each image's ``im2col`` / ``col2im``."""
    from minilms.kernels.im2col import col2im_batch, im2col_batch
    shape, *geometry = GEOMETRIES[name]
    imgs = random((3,) + shape, np.float32)
    cols = np.full((3,) + col_shape(shape, *geometry), np.nan, np.float32)
    assert im2col_batch(imgs, cols, *geometry) is cols
    for img, col in zip(imgs, cols):
        np.testing.assert_array_equal(col, naive_im2col(img, *geometry))
    grads = np.full(imgs.shape, 0.5, np.float32)
    col2im_batch(cols, grads, *geometry)
    for img, col, grad in zip(imgs, cols, grads):
        np.testing.assert_allclose(grad, 0.5 + naive_col2im(col, shape, *geometry), rtol=1e-6,
                                   atol=1e-6)
    with pytest.raises(ValueError, match="one B"):
        im2col_batch(imgs[:2], cols, *geometry)


@pytest.mark.cuda
@pytest.mark.parametrize("name, dtype", [("rectangular", np.float32), ("everything", np.float32),
                                         ("3x3 same", np.float64)])
def test_cuda_batch_matches_cpu(name, dtype):
    """One launch for a chunk of images: each image as the CPU twin makes it."""
    from numba import cuda

    from minilms.kernels.im2col import col2im_batch, im2col_batch
    shape, *geometry = GEOMETRIES[name]
    imgs = random((3,) + shape, dtype)
    expected = np.empty((3,) + col_shape(shape, *geometry), dtype)
    im2col_batch(imgs, expected, *geometry)
    d_cols = cuda.to_device(np.full(expected.shape, np.nan, dtype))
    im2col_batch(cuda.to_device(imgs), d_cols, *geometry)
    np.testing.assert_array_equal(d_cols.copy_to_host(), expected)
    y = random(expected.shape, dtype, seed=2)
    grads = np.full(imgs.shape, 0.5, dtype)
    col2im_batch(y, grads, *geometry)
    d_grads = cuda.to_device(np.full(imgs.shape, 0.5, dtype))
    col2im_batch(cuda.to_device(y), d_grads, *geometry)
    np.testing.assert_allclose(d_grads.copy_to_host(), grads, rtol=1e-6, atol=1e-6)


@given(height=st.integers(1, 9), width=st.integers(1, 12), kh=st.integers(1, 3),
       kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3), ph=st.integers(0, 3),
       pw=st.integers(0, 3), dh=st.integers(1, 2), dw=st.integers(1, 2),
       parallel=st.booleans(), side_by_side=st.booleans())
def test_the_convolutions_batched_im2col_matches_naive_loops(height, width, kh, kw, sh, sw, ph,
                                                             pw, dh, dw, parallel, side_by_side):
    """``conv_cpu.im2col_batch``, serial and parallel, both layouts of its columns, on random
    geometries: at a horizontal stride of 2 the columns inside a row are copied without a test
    per element, the rest as at any other stride; every sample's columns are the definition's."""
    from minilms.kernels.conv_cpu import _IM2COL, _layout
    geometry = ((kh, kw), (sh, sw), (ph, pw), (dh, dw))
    if height + 2 * ph < dh * (kh - 1) + 1 or width + 2 * pw < dw * (kw - 1) + 1:
        return                      # no output: nothing to compare
    imgs = random((3, 2, height, width), np.float32, seed=height * width)
    rows, plane = col_shape((2, height, width), *geometry)
    cols = np.full((3, rows, plane) if not side_by_side else (rows, 3 * plane), np.nan,
                   np.float32)
    _, col3, params = _layout(imgs, cols, *geometry)
    _IM2COL[parallel][side_by_side](imgs, col3, *params)
    for n, img in enumerate(imgs):
        got = cols[:, n * plane:(n + 1) * plane] if side_by_side else cols[n]
        np.testing.assert_array_equal(got, naive_im2col(img, *geometry))
