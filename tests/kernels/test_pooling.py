"""Pooling kernels: CPU against naive loops and numerical gradients, CUDA against CPU, and torch."""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minilms.kernels import pooling as pl

# (H, W, kernel, stride, pad, ceil_mode): square and non-square, overlapping windows, padding,
# and ceil-mode shapes whose last window hangs over the padding
CONFIGS = [
    (6, 6, 2, 2, 0, False),
    (7, 5, 3, 2, 1, False),
    (5, 6, 3, 1, 1, False),
    (7, 8, (3, 2), (2, 1), (1, 0), False),
    (6, 7, 3, 2, 0, True),
    (8, 8, 3, 2, 1, True),
]


def on_cuda(launcher, *args, **kwargs):
    from numba import cuda
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    launcher(*dev, **kwargs)
    return [d.copy_to_host() if hasattr(d, "copy_to_host") else d for d in dev]


def pair(v):
    return (v, v) if isinstance(v, int) else v


def out_shape(x, k, s, p, ceil):
    return x.shape[:2] + tuple(pl.pool_output_size(x.shape[2 + a], pair(k)[a], pair(s)[a],
                                                   pair(p)[a], ceil) for a in (0, 1))


def naive_windows(h, w, ho, wo, k, s, p):
    """Yield (oh, ow, real (h, w) list, padded-window area clipped to [-p, size + p))."""
    (kh, kw), (sh, sw), (ph, pw) = pair(k), pair(s), pair(p)
    for oh in range(ho):
        for ow in range(wo):
            hs, ws = oh * sh - ph, ow * sw - pw
            area = (min(hs + kh, h + ph) - hs) * (min(ws + kw, w + pw) - ws)
            cells = [(i, j) for i in range(hs, hs + kh) for j in range(ws, ws + kw)
                     if 0 <= i < h and 0 <= j < w]
            yield oh, ow, cells, area


def naive_max(x, k, s, p, ceil):
    y = np.zeros(out_shape(x, k, s, p, ceil))
    arg = np.zeros(y.shape, np.int32)
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            for oh, ow, cells, _ in naive_windows(*x.shape[2:], *y.shape[2:], k, s, p):
                vals = [x[n, c, i, j] for i, j in cells]
                best = int(np.argmax(vals))             # numpy's argmax: first maximum
                y[n, c, oh, ow] = vals[best]
                arg[n, c, oh, ow] = cells[best][0] * x.shape[3] + cells[best][1]
    return y, arg


def naive_avg(x, k, s, p, ceil, include_pad):
    y = np.zeros(out_shape(x, k, s, p, ceil))
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            for oh, ow, cells, area in naive_windows(*x.shape[2:], *y.shape[2:], k, s, p):
                y[n, c, oh, ow] = sum(x[n, c, i, j] for i, j in cells) / (
                    area if include_pad else len(cells))
    return y


def numerical_grad(f, x, dy, h=1e-6):
    """d(sum(f(x) * dy))/dx by central differences."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = np.sum(f(x) * dy)
        x[i] = old - h
        down = np.sum(f(x) * dy)
        x[i] = old
        g[i] = (up - down) / (2 * h)
    return g


def test_output_size():
    assert pl.pool_output_size(7, 3, 2, 1) == 4
    assert pl.pool_output_size(6, 3, 2, 0) == 2
    assert pl.pool_output_size(6, 3, 2, 0, ceil_mode=True) == 3
    assert pl.pool_output_size(5, 2, 2, 1, ceil_mode=True) == 3   # last window would start in pad
    with pytest.raises(ValueError):
        pl.pool_output_size(5, 3, 1, 2)                            # pad > kernel // 2


@pytest.mark.parametrize("h, w, k, s, p, ceil", CONFIGS)
def test_max_and_avg_pool_cpu_against_naive(h, w, k, s, p, ceil):
    x = np.random.default_rng(h * w).standard_normal((2, 3, h, w))
    y = np.empty(out_shape(x, k, s, p, ceil))
    arg = np.empty(y.shape, np.int32)
    pl.max_pool_forward(x, y, arg, k, s, p)
    want_y, want_arg = naive_max(x, k, s, p, ceil)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(arg, want_arg)
    for include_pad in (True, False):
        pl.avg_pool_forward(x, y, k, s, p, include_pad)
        np.testing.assert_allclose(y, naive_avg(x, k, s, p, ceil, include_pad), rtol=1e-12)


@pytest.mark.parametrize("h, w, k, s, p, ceil", CONFIGS + [(28, 28, 3, 1, 1, False),
                                                        (56, 56, 3, 2, 1, True),
                                                        (14, 40, 3, 2, 1, False),
                                                        (9, 9, 5, 1, 2, False),   # the rows
                                                        (9, 10, 3, 3, 0, True)])  # one by one
def test_a_16_bit_argmax_holds_the_same_indices(h, w, k, s, p, ceil):
    """Every cpu path (the planes, the rows, stride 2's rows, one output at a time) writes the
    same indices into a uint16 argmax as into an int32 one, and backward scatters by them alike;
    a plane of more than 2^16 pixels refuses one."""
    x = np.random.default_rng(h * w + 1).standard_normal((2, 5, h, w)).astype(np.float32)
    shape = out_shape(x, k, s, p, ceil)
    dy = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    got = {}
    for dtype in (np.int32, np.uint16):
        y, arg, dx = np.empty(shape, np.float32), np.empty(shape, dtype), np.empty_like(x)
        pl.max_pool_forward(x, y, arg, k, s, p)
        pl.max_pool_backward(dy, arg, dx, k, s, p)
        got[dtype] = y, arg, dx
    np.testing.assert_array_equal(got[np.uint16][1], naive_max(x, k, s, p, ceil)[1])
    for a, b in zip(got[np.int32], got[np.uint16]):
        np.testing.assert_array_equal(a, b)
    big = np.zeros((1, 1, 257, 256), np.float32)
    with pytest.raises(ValueError, match="argmax must be int32"):
        pl.max_pool_forward(big, np.empty((1, 1, 128, 128), np.float32),
                            np.empty((1, 1, 128, 128), np.uint16), 2, 2, 0)


def test_max_pool_ties_go_to_first_and_nan_propagates():
    x = np.ones((1, 1, 4, 4), np.float32)
    y = np.empty((1, 1, 2, 2), np.float32)
    arg = np.empty(y.shape, np.int32)
    pl.max_pool_forward(x, y, arg, 2)
    np.testing.assert_array_equal(arg[0, 0], [[0, 2], [8, 10]])
    x[0, 0, 1, 1] = np.nan
    pl.max_pool_forward(x, y, arg, 2)
    assert np.isnan(y[0, 0, 0, 0]) and arg[0, 0, 0, 0] == 5


@pytest.mark.parametrize("h, w, k, s, p", [(5, 6, 3, 1, 1), (7, 8, (3, 2), (2, 1), (1, 0)),
                                            (9, 9, (2, 3), 1, (1, 1)), (4, 20, 3, (1, 1), 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_kernel_is_the_per_output_kernel_bit_for_bit(h, w, k, s, p, dtype, monkeypatch):
    """A horizontal stride of 1 takes the row-at-a-time forward: on inputs full of ties and with
    NaNs, its maxima and argmax equal the per-output kernel's (the reference rule) exactly."""
    rng = np.random.default_rng(h * w)
    x = rng.integers(0, 3, (2, 5, h, w)).astype(dtype)      # ties everywhere
    x[0, 0, 1, :] = np.nan
    x[1, 2, ::2, 1::3] = np.nan
    shape = out_shape(x, k, s, p, False)
    y, arg = np.empty(shape, dtype), np.empty(shape, np.int32)
    y_ref, arg_ref = np.empty_like(y), np.empty_like(arg)
    geom = pl._geometry(x, y, k, s, p)
    assert geom[3] == 1
    pl.max_pool_forward_cpu(x, y_ref, arg_ref, geom)
    monkeypatch.setattr(pl, "max_pool_forward_cpu", None)    # the rows kernel, or a failure
    monkeypatch.setattr(pl.pooling_planes, "applies", lambda *shapes: False)
    pl.max_pool_forward(x, y, arg, k, s, p)
    np.testing.assert_array_equal(arg, arg_ref)
    np.testing.assert_array_equal(y, y_ref)                   # NaN where NaN


@pytest.mark.parametrize("h, w, k, s, p, ceil", [(5, 40, 3, 2, 1, False),
                                                  (6, 41, 3, 2, 0, True),
                                                  (7, 45, (3, 2), (1, 2), (1, 1), False),
                                                  (4, 52, (2, 5), 2, (1, 2), True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stride2_rows_kernel_is_the_per_output_kernel_bit_for_bit(h, w, k, s, p, ceil, dtype,
                                                                  monkeypatch):
    """A horizontal stride of 2 on rows long enough (``stride2_rows_pay``) takes the stride-2 row
    kernel: on ties and NaNs (in its vectorised interior and at both edges) the per-output
    kernel's maxima and argmax exactly, and numpy's first maximum where no NaN is."""
    from minilms.kernels import pooling_rows
    rng = np.random.default_rng(h * w)
    x = rng.integers(0, 3, (2, 5, h, w)).astype(dtype)      # ties everywhere
    x[0, 0, 1, :] = np.nan
    x[1, 2, ::2, 1::3] = np.nan
    x[1, 3, :, :2] = x[1, 3, :, -2:] = np.nan                 # the rows' edges
    y, arg = np.empty(out_shape(x, k, s, p, ceil), dtype), np.empty(out_shape(x, k, s, p, ceil),
                                                                     np.int32)
    y_ref, arg_ref = np.empty_like(y), np.empty_like(arg)
    geom = pl._geometry(x, y, k, s, p)
    assert geom[3] == 2 and pooling_rows.stride2_rows_pay(w, y.shape[3], geom[1], geom[5])
    pl.max_pool_forward_cpu(x, y_ref, arg_ref, geom)
    monkeypatch.setattr(pl, "max_pool_forward_cpu", None)    # the stride-2 kernel, or a failure
    monkeypatch.setattr(pl.pooling_planes, "applies", lambda *shapes: False)
    assert_forward_is(x, y, arg, y_ref, arg_ref, k, s, p, ceil)


def assert_forward_is(x, y, arg, y_ref, arg_ref, k, s, p, ceil):
    """``max_pool_forward`` into ``y`` and ``arg``: the reference kernel's ``y_ref`` and
    ``arg_ref`` on ``x`` bit for bit (NaN where NaN), and the naive definition's where the NaNs
    are replaced."""
    pl.max_pool_forward(x, y, arg, k, s, p)
    np.testing.assert_array_equal(arg, arg_ref)
    np.testing.assert_array_equal(y, y_ref)
    clean = np.nan_to_num(x, nan=-1.0)
    y_naive, arg_naive = naive_max(clean, k, s, p, ceil)
    pl.max_pool_forward(clean, y, arg, k, s, p)
    np.testing.assert_array_equal(arg, arg_naive)
    np.testing.assert_array_equal(y, y_naive)


def test_stride2_rows_kernel_only_where_a_row_fills_a_vector():
    """Rows whose interior is shorter than a vector keep the per-output kernel (measured faster
    there): ResNet's 112-wide stem pool takes the row kernel, GoogLeNet's 28-wide does not."""
    from minilms.kernels import pooling_rows
    from minilms.kernels.direct.vector_ir import VL
    assert pooling_rows.stride2_rows_pay(112, 56, 3, 1)
    assert not pooling_rows.stride2_rows_pay(2 * VL - 2, VL - 1, 3, 0)
    inner, outer = pooling_rows.interior(112, 56, 3, 1)
    assert (inner, outer) == (1, 56)       # output 0's window starts in the padding


def planes_case(rng, h, w, k, s, p, ceil, dtype, planes=(2, 5)):
    """An input full of ties, with NaNs in rows, columns and at the rows' ends, and its output
    arrays; None where the two-pass kernel does not apply to the geometry."""
    x = rng.integers(0, 3, (*planes, h, w)).astype(dtype)
    x[0, 0, min(1, h - 1), :] = np.nan
    x[1, 2, ::2, 1::3] = np.nan
    x[1, 3, :, :1] = x[1, 4, :, -1:] = np.nan
    x[0, 1] = rng.standard_normal((h, w))                    # no ties: one maximum a window
    shape = out_shape(x, k, s, p, ceil)
    geom = pl._geometry(x, np.empty(shape), k, s, p)
    if not pl.pooling_planes.applies(geom, w, shape[3]):
        return None
    return x, geom, np.empty(shape, dtype), np.empty(shape, np.int32)


@pytest.mark.parametrize("h, w, k, s, p, ceil", [
    (28, 28, 3, 2, 0, True),       # GoogLeNet's pools between stages
    (14, 14, 3, 1, 1, False),      # its inception pools
    (7, 7, 3, 1, 1, False),
    (12, 16, 2, 2, 0, False),      # LeNet's
    (10, 8, 3, 2, 1, False),       # ResNet's stem pool's geometry
    (9, 8, (3, 2), (1, 2), (1, 0), True),
    (5, 6, (2, 3), (2, 1), (1, 1), False),
    (2, 6, 3, 1, 1, False), (1, 6, 3, 1, 1, False)])     # one and two rows of outputs
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_planes_kernel_is_the_per_output_kernel_bit_for_bit(h, w, k, s, p, ceil, dtype,
                                                            monkeypatch):
    """Where the two passes apply, ``max_pool_forward`` takes them: on ties and NaNs (inside the
    flattened loops and at the rows' clipped ends), the per-output kernel's maxima and argmax
    exactly, and the naive definition's where no NaN is."""
    case = planes_case(np.random.default_rng(h * w), h, w, k, s, p, ceil, dtype)
    assert case is not None, "the two passes should apply here"
    x, geom, y, arg = case
    y_ref, arg_ref = np.empty_like(y), np.empty_like(arg)
    pl.max_pool_forward_cpu(x, y_ref, arg_ref, geom)
    monkeypatch.setattr(pl, "max_pool_forward_cpu", None)    # the two passes, or a failure
    monkeypatch.setattr(pl, "max_pool_forward_rows_cpu", None)
    monkeypatch.setattr(pl, "max_pool_forward_stride2_cpu", None)
    assert_forward_is(x, y, arg, y_ref, arg_ref, k, s, p, ceil)


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 12), out_w=st.integers(1, 9), kh=st.integers(1, 3), kw=st.sampled_from(
    [2, 3]), sh=st.integers(1, 2), sw=st.sampled_from([1, 2]), ph=st.integers(0, 1),
    ceil=st.booleans(), seed=st.integers(0, 2**16), per=st.sampled_from([0, 1, 2, 7]))
def test_planes_kernel_on_random_geometries(h, out_w, kh, kw, sh, sw, ph, ceil, seed, per):
    """Any geometry the two passes take (the width made ``stride x out_w``, the horizontal
    padding one that gives ``out_w`` outputs), many planes (more than ``CHUNKS``, so chunks hold
    several), stacked ``per`` a block (0: ``block_planes``'s; 7 leaves a shorter last block): the
    per-output kernel's results bit for bit."""
    w, ph = sw * out_w, min(ph, kh // 2)
    pads = [pw for pw in range(kw // 2 + 1) if w + 2 * pw >= kw
            and pl.pool_output_size(w, kw, sw, pw, ceil) == out_w]
    assume(pads and h + 2 * ph >= kh)
    case = planes_case(np.random.default_rng(seed), h, w, (kh, kw), (sh, sw), (ph, pads[-1]),
                       ceil, np.float32, planes=(3, 30))
    assume(case is not None)
    x, geom, y, arg = case
    y_ref, arg_ref = np.empty_like(y), np.empty_like(arg)
    pl.max_pool_forward_cpu(x, y_ref, arg_ref, geom)
    pl.pooling_planes.max_pool_forward_planes_cpu(x, y, arg, geom, per)
    np.testing.assert_array_equal(arg, arg_ref)
    np.testing.assert_array_equal(y, y_ref)


def test_planes_stack_into_blocks_of_a_few_thousand_inputs():
    """Small planes are stacked (one flattened loop over a 7x7 plane is mostly its scalar
    remainder); a plane larger than a block is a block of its own."""
    from minilms.kernels.pooling_planes import BLOCK_ELEMENTS, block_planes
    assert block_planes(7, 7) == BLOCK_ELEMENTS // 49 > 1
    assert block_planes(112, 112) == 1 and block_planes(1, 1) == BLOCK_ELEMENTS


def test_planes_kernel_applies_to_the_zoos_pools_and_not_elsewhere():
    """GoogLeNet's and ResNet's 3x3 pools and LeNet's 2x2 take the two passes; an odd width
    that a stride of 2 does not step across, a 5-wide window or a stride of 3 do not."""
    def applies(h, w, k, s, p, ceil):
        out = pl.pool_output_size(w, k, s, p, ceil)
        geom = pl._geometry(np.empty((1, 1, h, w)), np.empty((1, 1, out, out)), k, s, p)
        return pl.pooling_planes.applies(geom, w, out)
    assert applies(112, 112, 3, 2, 0, True) and applies(28, 28, 3, 2, 0, True)
    assert applies(14, 14, 3, 1, 1, False) and applies(112, 112, 3, 2, 1, False)
    assert applies(24, 24, 2, 2, 0, False)
    assert not applies(7, 7, 3, 2, 0, True)          # 4 outputs do not step across 7 columns
    assert not applies(14, 14, 5, 1, 2, False) and not applies(15, 15, 3, 3, 0, False)


@pytest.mark.parametrize("h, w, k, s, p, ceil", [CONFIGS[1], CONFIGS[3], CONFIGS[5]])
def test_backward_against_numerical_gradient(h, w, k, s, p, ceil):
    rng = np.random.default_rng(h + w)
    x = rng.permutation(2 * h * w).reshape(1, 2, h, w) / 7.0  # distinct values: no ties to break
    shape = out_shape(x, k, s, p, ceil)
    dy = rng.standard_normal(shape)
    dx = np.empty_like(x)

    def max_fwd(v):
        y, arg = np.empty(shape), np.empty(shape, np.int32)
        pl.max_pool_forward(v, y, arg, k, s, p)
        return y
    arg = np.empty(shape, np.int32)
    pl.max_pool_forward(x, np.empty(shape), arg, k, s, p)
    pl.max_pool_backward(dy, arg, dx, k, s, p)
    np.testing.assert_allclose(dx, numerical_grad(max_fwd, x, dy), atol=1e-7)

    for include_pad in (True, False):
        def avg_fwd(v):
            y = np.empty(shape)
            pl.avg_pool_forward(v, y, k, s, p, include_pad)
            return y
        pl.avg_pool_backward(dy, dx, k, s, p, include_pad)
        np.testing.assert_allclose(dx, numerical_grad(avg_fwd, x, dy), atol=1e-7)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 64, 64, 64)])   # serial, then parallel
def test_global_avg_pool_cpu(shape):
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape)
    assert (x.size >= pl.GLOBAL_PARALLEL_MIN) == (shape[0] == 4)
    y = np.empty(shape[:2] + (1, 1))
    pl.global_avg_pool_forward(x, y)
    np.testing.assert_allclose(y[:, :, 0, 0], x.mean(axis=(2, 3)), rtol=1e-12, atol=1e-15)
    y32 = np.empty(y.shape, np.float32)
    pl.global_avg_pool_forward(x.astype(np.float32), y32)
    np.testing.assert_allclose(y32, y, rtol=1e-5, atol=1e-6)
    dy = rng.standard_normal(shape[:2])
    dx = np.empty_like(x)
    pl.global_avg_pool_backward(dy, dx)
    want = np.broadcast_to(dy[:, :, None, None] / (shape[2] * shape[3]), x.shape)
    np.testing.assert_allclose(dx, want, rtol=1e-12)


@pytest.mark.cuda
@pytest.mark.parametrize("h, w, k, s, p, ceil", [
    (7, 9, 2, 1, 0, False),   # y has 2*3*6*8 = 288 elements: one block of 256 and a partial one
    (7, 9, 3, 2, 1, True),    # x has 378 elements, dx straddles a block edge
])
def test_pooling_cuda_matches_cpu(h, w, k, s, p, ceil):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, h, w)).astype(np.float32)
    x[0, 0, :2, :2] = 1.0                                  # a tie
    shape = out_shape(x, k, s, p, ceil)
    dy = rng.standard_normal(shape).astype(np.float32)
    y, arg, dx = np.empty(shape, np.float32), np.empty(shape, np.int32), np.empty_like(x)
    pl.max_pool_forward(x, y, arg, k, s, p)
    gy, garg = on_cuda(pl.max_pool_forward, x, y, arg, k, s, p)[1:3]
    np.testing.assert_array_equal(gy, y)
    np.testing.assert_array_equal(garg, arg)
    pl.max_pool_backward(dy, arg, dx, k, s, p)
    np.testing.assert_allclose(on_cuda(pl.max_pool_backward, dy, arg, dx, k, s, p)[2], dx,
                               rtol=1e-6)
    pl.avg_pool_forward(x, y, k, s, p, count_include_pad=ceil)
    np.testing.assert_allclose(on_cuda(pl.avg_pool_forward, x, y, k, s, p,
                                       count_include_pad=ceil)[1],
                               y, rtol=1e-6)
    pl.avg_pool_backward(dy, dx, k, s, p, count_include_pad=ceil)
    np.testing.assert_allclose(on_cuda(pl.avg_pool_backward, dy, dx, k, s, p,
                                       count_include_pad=ceil)[1],
                               dx, rtol=1e-6)


@pytest.mark.cuda
def test_global_avg_pool_cuda_matches_cpu():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 3, 10, 13)).astype(np.float32)  # 130 per plane: 128 threads + 2
    y = np.empty((1, 3), np.float32)
    pl.global_avg_pool_forward(x, y)
    np.testing.assert_allclose(on_cuda(pl.global_avg_pool_forward, x, y)[1], y, rtol=1e-5)
    dx = np.empty_like(x)
    pl.global_avg_pool_backward(y, dx)
    np.testing.assert_allclose(on_cuda(pl.global_avg_pool_backward, y, dx)[1], dx, rtol=1e-6)


@pytest.mark.parametrize("h, w, k, s, p, ceil", CONFIGS)
def test_against_torch(h, w, k, s, p, ceil):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, h, w))
    shape = out_shape(x, k, s, p, ceil)
    dy = rng.standard_normal(shape)
    y, arg, dx = np.empty(shape), np.empty(shape, np.int32), np.empty_like(x)

    xt = torch.tensor(x, requires_grad=True)
    yt, it = F.max_pool2d(xt, k, s, p, ceil_mode=ceil, return_indices=True)
    yt.backward(torch.tensor(dy))
    pl.max_pool_forward(x, y, arg, k, s, p)
    pl.max_pool_backward(dy, arg, dx, k, s, p)
    np.testing.assert_array_equal(y, yt.detach().numpy())
    np.testing.assert_array_equal(arg, it.numpy())
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12)

    for include_pad in (True, False):
        xt = torch.tensor(x, requires_grad=True)
        yt = F.avg_pool2d(xt, k, s, p, ceil_mode=ceil, count_include_pad=include_pad)
        yt.backward(torch.tensor(dy))
        pl.avg_pool_forward(x, y, k, s, p, include_pad)
        pl.avg_pool_backward(dy, dx, k, s, p, include_pad)
        np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-15)

    xt = torch.tensor(x, requires_grad=True)
    yt = F.adaptive_avg_pool2d(xt, 1)
    yt.backward(torch.tensor(dy[:, :, :1, :1]))
    g = np.empty((2, 3))
    pl.global_avg_pool_forward(x, g)
    pl.global_avg_pool_backward(dy[:, :, 0, 0].copy(), dx)
    np.testing.assert_allclose(g, yt.detach().numpy()[:, :, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12)
