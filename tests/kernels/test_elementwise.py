"""Elementwise kernels: CPU against numpy, CUDA (simulator or GPU) against CPU, ReLU against
torch."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.kernels import elementwise as ew

DTYPES = [np.float32, np.float64]


def on_cuda(launcher, *args, **kwargs):
    """Run ``launcher`` on device copies of the array arguments; return every argument afterwards
    (arrays copied back to the host)."""
    from numba import cuda
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    launcher(*dev, **kwargs)
    return [d.copy_to_host() if hasattr(d, "copy_to_host") else d for d in dev]


def special(dtype, n=64, seed=0):
    """Random values with the awkward ones in front: exact zeros of both signs, infinities."""
    x = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    x[:5] = [0.0, -0.0, np.inf, -np.inf, 1e-30]
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_forward_backward_cpu(dtype):
    x = special(dtype).reshape(4, 16)
    x[0, 5] = np.nan
    y = np.empty_like(x)
    ew.relu_forward(x, y)
    want = np.where(x > 0, x, 0).astype(dtype)
    want[0, 5] = np.nan                                 # NaN passes through, as in PyTorch
    np.testing.assert_array_equal(y, want)
    assert not np.signbit(y[0, 1])                      # relu(-0.0) is +0

    dy = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    dx = np.empty_like(x)
    ew.relu_backward(y, dy, dx)
    np.testing.assert_array_equal(dx, np.where(y <= 0, 0, dy))   # NaN passes dy, as in PyTorch
    assert dx[0, 0] == 0 and dx[0, 1] == 0              # gradient at exactly 0 is 0
    ew.relu_backward(x, dy, dx)                         # the input works as well as the output
    np.testing.assert_array_equal(dx, np.where(x <= 0, 0, dy))

    ew.relu_forward(x, x)                               # in place
    np.testing.assert_array_equal(x, want)


def test_relu_backward_numerical():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(50)
    x = x[np.abs(x) > 1e-3]                             # away from the kink
    dy = rng.standard_normal(x.size)
    dx = np.empty_like(x)
    y = np.empty_like(x)
    ew.relu_forward(x, y)
    ew.relu_backward(y, dy, dx)
    h = 1e-6
    yp, ym = np.empty_like(x), np.empty_like(x)
    ew.relu_forward(x + h, yp)
    ew.relu_forward(x - h, ym)
    np.testing.assert_allclose(dx, dy * (yp - ym) / (2 * h), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpby_scale_fill_accumulate_cpu(dtype):
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal((3, 5)).astype(dtype) for _ in range(2))
    out = np.empty_like(x)
    ew.axpby(2.5, x, -0.5, y, out)
    np.testing.assert_allclose(out, dtype(2.5) * x + dtype(-0.5) * y, rtol=1e-6)
    assert out.dtype == dtype
    xc = x.copy()
    ew.axpby(2.5, xc, -0.5, y, xc)                      # out is x
    np.testing.assert_array_equal(xc, out)

    ew.scale(x, 3.0, out)
    np.testing.assert_array_equal(out, dtype(3.0) * x)
    ew.fill(out, 7.25)
    assert np.all(out == 7.25)

    dst = x.copy()
    ew.accumulate(dst, y)
    np.testing.assert_array_equal(dst, x + y)


@settings(max_examples=25)
@given(n_inputs=st.integers(1, 4), size=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_eltwise_sum_cpu(n_inputs, size, seed):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(size) for _ in range(n_inputs)]
    coeffs = rng.standard_normal(n_inputs)
    out = np.empty(size)
    ew.eltwise_sum(xs, out, coeffs)
    np.testing.assert_allclose(out, sum(c * x for c, x in zip(coeffs, xs)), rtol=1e-12, atol=1e-12)
    if n_inputs >= 2:                                   # out may be the first input
        first = xs[0].copy()
        ew.eltwise_sum(xs, xs[0], coeffs)
        np.testing.assert_array_equal(xs[0], out)
        xs[0] = first
    ew.eltwise_sum(xs, out)                             # coefficients default to 1
    np.testing.assert_allclose(out, sum(xs), rtol=1e-12, atol=1e-12)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def fused_and_parts(xp, x, y, dy):
    """The fused kernels and the kernels they replace, on ``xp``'s arrays (numpy or device)."""
    def run(launcher, *args):
        return on_cuda(launcher, *args) if xp == "cuda" else (launcher(*args) or args)
    _, _, _, _, fused = run(ew.axpby_relu, 1.5, x, -2.0, y, np.empty_like(x))
    _, _, _, _, summed = run(ew.axpby, 1.5, x, -2.0, y, np.empty_like(x))
    (parts,) = run(ew.relu_forward, summed, summed)[1:]
    _, _, grad = run(ew.relu_backward, parts, dy, np.empty_like(x))
    out = []
    for a in (1.0, -0.5):
        out.append(run(ew.scale, grad, a, np.empty_like(x))[2])
    pair = run(ew.relu_backward_scale, parts, dy, 1.0, np.empty_like(x), -0.5, np.empty_like(x))
    single = run(ew.relu_backward_scale, parts, dy, -0.5, np.empty_like(x))
    return (fused, parts), (pair[3], out[0]), (pair[5], out[1]), (single[3], out[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_fused_relu_kernels_give_the_unfused_bits(dtype):
    """``axpby_relu`` is ``axpby`` then ``relu_forward``, and ``relu_backward_scale`` is
    ``relu_backward`` then ``scale`` (one or two outputs), bit for bit: zeros of both signs, NaN,
    infinities, and a negative coefficient (whose product with a masked 0 is -0)."""
    rng = np.random.default_rng(11)
    x, y, dy = special(dtype, 257, 1), special(dtype, 257, 2), special(dtype, 257, 3)
    x[6:9], y[6:9], dy[6:9] = [np.nan, 1.0, -1.0], [0.0, np.nan, 0.5], [np.nan, -0.0, np.inf]
    rng.shuffle(x)
    for got, want in fused_and_parts("cpu", x, y, dy):
        np.testing.assert_array_equal(bits(got), bits(want))
    assert np.signbit(fused_and_parts("cpu", x, y, dy)[2][0]).any()    # -0.5 * masked 0 is -0


@pytest.mark.cuda
def test_the_fused_relu_kernels_give_the_unfused_bits_on_cuda():
    """The same on the device: both sides are CUDA kernels of the same expressions."""
    x, y, dy = special(np.float32, 300, 4), special(np.float32, 300, 5), special(np.float32, 300, 6)
    for got, want in fused_and_parts("cuda", x, y, dy):
        np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("inputs", [1, 2, 3, 4])
def test_eltwise_sum_with_relu_is_the_sum_then_relu(inputs):
    rng = np.random.default_rng(inputs)
    xs = [rng.standard_normal(200).astype(np.float32) for _ in range(inputs)]
    coeffs = [1.0, -2.0, 0.5, 3.0][:inputs]
    want, got = np.empty_like(xs[0]), np.empty_like(xs[0])
    ew.eltwise_sum(xs, want, coeffs)
    ew.relu_forward(want, want)
    ew.eltwise_sum(xs, got, coeffs, relu=True)
    np.testing.assert_array_equal(bits(got), bits(want))
    assert (got == 0).any() and (got > 0).any()


def test_eltwise_sum_rejects_mismatches():
    a = np.zeros(3)
    with pytest.raises(ValueError):
        ew.eltwise_sum([a, a], a, [1.0])
    with pytest.raises(ValueError):
        ew.axpby(1.0, a, 1.0, np.zeros(4), a)
    with pytest.raises(ValueError):                     # a strided view cannot be written flat
        ew.fill(np.zeros((4, 4))[:, ::2], 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_cpu(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((20, 50)).astype(dtype)
    p = 0.3
    mask = ew.dropout_mask(np.random.default_rng(5), x.shape, p)
    assert mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1}
    assert abs(mask.mean() - (1 - p)) < 0.05
    np.testing.assert_array_equal(mask, ew.dropout_mask(np.random.default_rng(5), x.shape, p))

    out = np.empty_like(x)
    ew.dropout_forward(x, mask, p, out)
    np.testing.assert_allclose(out, x * mask * dtype(1 / (1 - p)), rtol=1e-6)
    assert np.all(out[mask == 0] == 0)
    dy = rng.standard_normal(x.shape).astype(dtype)
    dx = np.empty_like(x)
    ew.dropout_backward(dy, mask, p, dx)                # the map is linear: backward = forward
    np.testing.assert_allclose(dx, dy * mask * dtype(1 / (1 - p)), rtol=1e-6)

    ew.dropout_forward(x, np.ones_like(mask), 0.0, out)
    np.testing.assert_array_equal(out, x)
    ew.dropout_forward(x, ew.dropout_mask(rng, x.shape, 1.0), 1.0, out)
    assert np.all(out == 0)
    with pytest.raises(ValueError):
        ew.dropout_forward(x, mask, 1.5, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, c, inner, channels, offset", [
    (2, 3, 5, 7, 2),          # a few elements a sample
    (3, 5, 4000, 9, 4),       # 20,000 a sample: two pieces (SLICE_PIECE), the last one short
    (1, 6, 1, 8, 1),          # one element a channel (Convolution's bands: [M, L] as [M, L, 1])
    (4, 2, ew.SLICE_PIECE, 2, 0)])  # the whole, pieces that end where the samples do
def test_slice_copy_cpu_moves_the_channels_and_nothing_else(dtype, n, c, inner, channels, offset):
    """Into ``whole`` (the rest of it untouched) and out of it, against numpy's slicing."""
    rng = np.random.default_rng(inner)
    part = rng.standard_normal((n, c, inner)).astype(dtype)
    whole = rng.standard_normal((n, channels, inner)).astype(dtype)
    want = whole.copy()
    want[:, offset:offset + c] = part
    ew.slice_copy(part, whole, offset, True)
    np.testing.assert_array_equal(whole, want)
    whole[:, offset:offset + c] += 1
    out = np.full_like(part, np.nan)
    ew.slice_copy(out, whole, offset, False)
    np.testing.assert_array_equal(out, part + 1)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1, 256, 257])  # one element, one full block, one thread more
def test_elementwise_cuda_matches_cpu(n):
    rng = np.random.default_rng(n)
    x = special(np.float32, n) if n >= 5 else rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    mask = ew.dropout_mask(rng, n, 0.4)
    cases = [
        (ew.relu_forward, (x, np.empty_like(x)), {}),
        (ew.relu_backward, (x, y, np.empty_like(x)), {}),
        (ew.axpby, (1.5, x, -2.0, y, np.empty_like(x)), {}),
        (ew.scale, (x, -3.0, np.empty_like(x)), {}),
        (ew.fill, (np.empty_like(x), 0.5), {}),
        (ew.dropout_forward, (x, mask, 0.4, np.empty_like(x)), {}),
        (ew.accumulate, (x.copy(), y), {}),
    ]
    # axpby: a compiled GPU kernel may contract a * x + b * y into one FMA (one rounding less),
    # so where the two terms cancel the relative error is unbounded: bound the difference by
    # float32 rounding of the terms' sizes instead (an ulp of |a x| + |b y| per element, twice).
    terms = np.abs(1.5 * x.astype(np.float64)) + np.abs(2.0 * y.astype(np.float64))
    bound = {ew.axpby: 2 * np.finfo(np.float32).eps * terms}
    for launcher, args, kw in cases:
        cpu = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        launcher(*cpu, **kw)
        gpu = on_cuda(launcher, *args, **kw)
        for c, g in zip(cpu, gpu):
            if not isinstance(c, np.ndarray):
                continue
            if launcher in bound:
                finite = np.isfinite(c)
                np.testing.assert_array_equal(g[~finite], c[~finite], launcher.__name__)
                assert np.all(np.abs(g[finite].astype(np.float64) - c[finite])
                              <= bound[launcher][finite]), launcher.__name__
            else:
                np.testing.assert_allclose(g, c, rtol=1e-6, err_msg=launcher.__name__)


@pytest.mark.cuda
def test_eltwise_sum_cuda_with_stream():
    from numba import cuda
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal(300).astype(np.float32) for _ in range(3)]
    want = np.empty_like(xs[0])
    ew.eltwise_sum(xs, want, [1.0, 2.0, -1.0])
    stream = cuda.stream()
    dev = [cuda.to_device(x) for x in xs]
    out = cuda.device_array_like(xs[0])
    ew.eltwise_sum(dev, out, [1.0, 2.0, -1.0], stream=stream)
    stream.synchronize()
    # a GPU may contract the weighted sum into FMAs (fewer roundings): allow an ulp per term
    terms = sum(abs(c * x) for c, x in zip([1.0, 2.0, -1.0], xs))
    assert np.all(np.abs(out.copy_to_host() - want) <= 3 * np.finfo(np.float32).eps * terms)


def test_relu_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 8)).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 1e-30]
    dy = rng.standard_normal(x.shape).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.relu(xt)
    yt.backward(torch.tensor(dy))
    y, dx = np.empty_like(x), np.empty_like(x)
    ew.relu_forward(x, y)
    ew.relu_backward(y, dy, dx)
    np.testing.assert_array_equal(y, yt.detach().numpy())
    np.testing.assert_array_equal(dx, xt.grad.numpy())
