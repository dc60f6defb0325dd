"""Batch norm: CPU against numpy, backward against numerical gradients, CUDA against CPU, torch."""
import numpy as np
import pytest

from minilms.kernels import batchnorm as bn


def on_cuda(launcher, *args, **kwargs):
    """``launcher`` on device copies of the arrays, with a ``stats`` workspace for ``args[0]``
    where it takes one; every positional argument afterwards, arrays copied back."""
    from numba import cuda
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    if launcher in (bn.batchnorm_forward_train, bn.batchnorm_backward):
        kwargs["stats"] = cuda.to_device(stats_for(args[0]))
    launcher(*dev, **kwargs)
    return [d.copy_to_host() if hasattr(d, "copy_to_host") else d for d in dev]


def stats_for(x):
    n, c = x.shape[:2]
    return np.full(bn.stats_shape(c, n, x.size // (n * c)), np.nan)


def params(c, dtype, seed=0):
    rng = np.random.default_rng(seed)
    gamma = (1 + 0.3 * rng.standard_normal(c)).astype(dtype)
    beta = (0.2 * rng.standard_normal(c)).astype(dtype)
    rmean = (0.1 * rng.standard_normal(c)).astype(dtype)
    rvar = (1 + 0.2 * rng.random(c)).astype(dtype)
    return gamma, beta, rmean, rvar


def train(x, gamma, beta, rmean, rvar, momentum=0.1, eps=1e-5):
    """Forward in training mode on copies; returns y, mean, invstd, running mean and var."""
    c = x.shape[1]
    y, mean, invstd = np.empty_like(x), np.empty(c, x.dtype), np.empty(c, x.dtype)
    rmean, rvar = rmean.copy(), rvar.copy()
    bn.batchnorm_forward_train(x, gamma, beta, y, mean, invstd, rmean, rvar, momentum, eps)
    return y, mean, invstd, rmean, rvar


def channels_last(x):
    """[N, C, ...] -> [C, N*...]: each channel's values in a row."""
    return np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (7, 5)])
def test_forward_cpu_against_numpy(shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * 3 + 10          # an offset: the two-pass variance keeps it
    gamma, beta, rmean, rvar = params(shape[1], np.float64)
    y, mean, invstd, new_rmean, new_rvar = train(x, gamma, beta, rmean, rvar, momentum=0.2)
    rows = channels_last(x)
    m = rows.shape[1]
    mu, var = rows.mean(axis=1), rows.var(axis=1)
    bshape = (1, -1) + (1,) * (len(shape) - 2)
    want = (x - mu.reshape(bshape)) / np.sqrt(var.reshape(bshape) + 1e-5) * gamma.reshape(bshape) \
        + beta.reshape(bshape)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(mean, mu, rtol=1e-12)
    np.testing.assert_allclose(invstd, 1 / np.sqrt(var + 1e-5), rtol=1e-12)
    np.testing.assert_allclose(new_rmean, 0.8 * rmean + 0.2 * mu, rtol=1e-12)
    np.testing.assert_allclose(new_rvar, 0.8 * rvar + 0.2 * var * m / (m - 1), rtol=1e-12)

    y2 = np.empty_like(x)
    bn.batchnorm_forward_inference(x, gamma, beta, rmean, rvar, y2)
    want = (x - rmean.reshape(bshape)) / np.sqrt(rvar.reshape(bshape) + 1e-5) \
        * gamma.reshape(bshape) + beta.reshape(bshape)
    np.testing.assert_allclose(y2, want, rtol=1e-10, atol=1e-12)


def test_training_needs_two_values_per_channel():
    x = np.zeros((1, 3))
    with pytest.raises(ValueError):
        train(x, *params(3, np.float64))


@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (5, 3)])
def test_backward_against_numerical_gradient(shape):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape)
    gamma, beta, rmean, rvar = params(shape[1], np.float64, seed=3)
    r = rng.standard_normal(shape)                   # loss = sum(y * r)
    _, mean, invstd, _, _ = train(x, gamma, beta, rmean, rvar)
    dx, dgamma, dbeta = np.empty_like(x), np.empty_like(gamma), np.empty_like(beta)
    bn.batchnorm_backward(x, r, gamma, mean, invstd, dx, dgamma, dbeta)

    def loss(x_, g_, b_):
        return np.sum(train(x_, g_, b_, rmean, rvar)[0] * r)

    def num(arr, f, h=1e-6):
        g = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + h
            up = f()
            arr[i] = old - h
            down = f()
            arr[i] = old
            g[i] = (up - down) / (2 * h)
        return g

    f = lambda: loss(x, gamma, beta)                 # noqa: E731
    np.testing.assert_allclose(dx, num(x, f), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(dgamma, num(gamma, f), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dbeta, num(beta, f), rtol=1e-6, atol=1e-8)

    dy = r.copy()                                    # dx may overwrite dy
    bn.batchnorm_backward(x, dy, gamma, mean, invstd, dy, dgamma, dbeta)
    np.testing.assert_array_equal(dy, dx)



@pytest.mark.parametrize("offset", [0.0, 300.0])
def test_float32_backward_against_float64_formula(offset):
    """The CPU sums are vectorised one-pass float64 sums: float32 keeps to its own rounding, on a
    channel whose mean dwarfs its spread too."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((16, 3, 40, 40)) * 2 + offset).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    gamma, beta, rmean, rvar = params(3, np.float32, seed=5)
    _, mean, invstd, _, _ = train(x, gamma, beta, rmean, rvar)
    dx, dgamma, dbeta = np.empty_like(x), np.empty_like(gamma), np.empty_like(beta)
    bn.batchnorm_backward(x, dy, gamma, mean, invstd, dx, dgamma, dbeta)

    x64, dy64 = channels_last(x).astype(np.float64), channels_last(dy).astype(np.float64)
    xhat = (x64 - mean[:, None].astype(np.float64)) * invstd[:, None].astype(np.float64)
    want_dbeta, want_dgamma = dy64.sum(axis=1), (dy64 * xhat).sum(axis=1)
    m = x64.shape[1]
    want_dx = gamma[:, None] * invstd[:, None].astype(np.float64) * (
        dy64 - want_dbeta[:, None] / m - xhat * want_dgamma[:, None] / m)
    np.testing.assert_allclose(dbeta, want_dbeta, rtol=1e-6)
    np.testing.assert_allclose(dgamma, want_dgamma, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(channels_last(dx), want_dx, rtol=1e-5, atol=1e-6)

@pytest.mark.cuda
def test_cuda_matches_cpu():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((2, 2, 11, 13)) * 2 + 1).astype(np.float32)  # 286 per channel
    gamma, beta, rmean, rvar = params(2, np.float32, seed=5)
    c = x.shape[1]
    y, mean, invstd, new_rmean, new_rvar = train(x, gamma, beta, rmean, rvar)
    out = on_cuda(bn.batchnorm_forward_train, x, gamma, beta, np.empty_like(x),
                  np.empty(c, np.float32), np.empty(c, np.float32), rmean.copy(), rvar.copy(),
                  0.1, 1e-5)
    for got, want in zip(out[3:8], (y, mean, invstd, new_rmean, new_rvar)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)

    dy = rng.standard_normal(x.shape).astype(np.float32)
    grads = [np.empty_like(x), np.empty(c, np.float32), np.empty(c, np.float32)]
    bn.batchnorm_backward(x, dy, gamma, mean, invstd, *grads)
    out = on_cuda(bn.batchnorm_backward, x, dy, gamma, mean, invstd, *[g.copy() for g in grads])
    for got, want in zip(out[5:8], grads):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)

    bn.batchnorm_forward_inference(x, gamma, beta, rmean, rvar, y)
    out = on_cuda(bn.batchnorm_forward_inference, x, gamma, beta, rmean, rvar, np.empty_like(x))
    np.testing.assert_allclose(out[5], y, rtol=1e-5, atol=1e-6)


def test_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((4, 3, 5, 5)) * 2 + 0.5).astype(np.float32)
    gamma, beta, rmean, rvar = params(3, np.float32, seed=7)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    layer = torch.nn.BatchNorm2d(3, eps=1e-5, momentum=0.1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(gamma))
        layer.bias.copy_(torch.tensor(beta))
        layer.running_mean.copy_(torch.tensor(rmean))
        layer.running_var.copy_(torch.tensor(rvar))
    xt = torch.tensor(x, requires_grad=True)
    yt = layer(xt)
    yt.backward(torch.tensor(dy))

    y, mean, invstd, new_rmean, new_rvar = train(x, gamma, beta, rmean, rvar)
    dx, dgamma, dbeta = np.empty_like(x), np.empty_like(gamma), np.empty_like(beta)
    bn.batchnorm_backward(x, dy, gamma, mean, invstd, dx, dgamma, dbeta)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new_rmean, layer.running_mean.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(new_rvar, layer.running_var.numpy(), rtol=1e-6)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dgamma, layer.weight.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dbeta, layer.bias.grad.numpy(), rtol=1e-5, atol=1e-5)

    layer.eval()
    y2 = np.empty_like(x)
    bn.batchnorm_forward_inference(x, gamma, beta, new_rmean, new_rvar, y2)
    np.testing.assert_allclose(y2, layer(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_cuda_statistics_agree_with_cpu_where_float32_sums_drift():
    """A large channel far from zero: 2**14 values around 30000, where float32 sums lose
    digits (a running float32 sum of these misses the mean by 48 ulps; a 2240x2240 image's
    channel is larger still). Both devices sum in float64, so the saved mean and invstd agree
    to within one float32 ulp (float32 sums on cuda: 2 ulps), and so does the sum of dy. (2**14,
    not more: the simulator runs a thread at a time, 2**16 took it two and a half minutes.)"""
    rng = np.random.default_rng(8)
    x = (30000 + rng.standard_normal((4, 1, 64, 64))).astype(np.float32)
    gamma, beta, rmean, rvar = params(1, np.float32, seed=9)
    _, mean, invstd, _, _ = train(x, gamma, beta, rmean, rvar)
    out = on_cuda(bn.batchnorm_forward_train, x, gamma, beta, np.empty_like(x),
                  np.empty(1, np.float32), np.empty(1, np.float32), rmean.copy(), rvar.copy(),
                  0.1, 1e-5)
    np.testing.assert_array_max_ulp(out[4], mean, maxulp=1)
    np.testing.assert_array_max_ulp(out[5], invstd, maxulp=1)
    dy = (5 + rng.standard_normal(x.shape)).astype(np.float32)
    grads = [np.empty_like(x), np.empty(1, np.float32), np.empty(1, np.float32)]
    bn.batchnorm_backward(x, dy, gamma, mean, invstd, *grads)
    out = on_cuda(bn.batchnorm_backward, x, dy, gamma, mean, invstd, *[g.copy() for g in grads])
    np.testing.assert_array_max_ulp(out[7], grads[2], maxulp=1)        # dbeta = sum(dy)
    np.testing.assert_allclose(out[6], grads[1], rtol=1e-4)           # dgamma: other formula


# -- the CUDA sums' two stages (kernels.batchnorm_sums) -----------------------------------------
def sum_in_order(values) -> float:
    total = 0.0
    for v in values:
        total += float(v)
    return total


def tree(slots: list) -> float:
    """``common.block_sum`` / ``warp_sums``'s fixed tree over a power-of-two list."""
    s = len(slots) // 2
    while s:
        for i in range(s):
            slots[i] += slots[i + s]
        s //= 2
    return slots[0]


def reference_channel_sums(x3):
    """Each channel's sum in the order the CUDA kernels add: per piece of a row, 32 lanes in
    order and their tree; then per channel, 256 threads over the pieces and their tree."""
    from minilms.kernels.batchnorm_sums import PIECE, THREADS, pieces
    n_, c_, hw = x3.shape
    p_ = pieces(hw)
    sums = np.empty((c_, n_ * p_))
    for n in range(n_):
        for c in range(c_):
            for p in range(p_):
                piece = x3[n, c, p * PIECE:(p + 1) * PIECE]
                sums[c, n * p_ + p] = tree([sum_in_order(piece[lane::32]) for lane in range(32)])
    return sums, [tree([sum_in_order(row[t::THREADS]) for t in range(THREADS)]) for row in sums]


@pytest.mark.cuda
def test_cuda_sums_are_the_reference_order_bit_for_bit():
    """Rows of two and a half pieces: every piece sum and each channel's float64 mean are those
    of a plain-Python loop adding in the documented order, bit for bit; so is a grid too small
    for the pieces (one block going round the grid-stride loop). The values span 13 decades, so
    float64 sums round and another order gives other bits (a sequential sum differs by 1e-8)."""
    from numba import cuda

    from minilms.kernels import batchnorm_sums as sums
    rng = np.random.default_rng(11)
    hw = 2 * sums.PIECE + sums.PIECE // 2
    x = (rng.standard_normal((2, 2, hw)) * np.exp(rng.uniform(-15, 15, (2, 2, hw)))).astype(
        np.float32)
    pieces, totals = reference_channel_sums(x)
    assert totals != [sum_in_order(x[:, c].ravel()) for c in range(2)]
    m = x.size // 2
    for blocks in (None, 1):
        stats = cuda.to_device(stats_for(x))
        mean = cuda.to_device(np.empty(2, np.float32))
        if blocks is None:
            sums.cuda_sums(cuda.to_device(x), 0, stats, False)
        else:
            sums.piece_sums_cuda[blocks, sums.THREADS](cuda.to_device(x), np.int64(0),
                                                       np.int64(3), stats, False)
        sums.cuda_mean(stats, m, mean)
        got = stats.copy_to_host()
        np.testing.assert_array_equal(got[0, :, :-1], pieces)
        np.testing.assert_array_equal(got[0, :, -1], np.array(totals) / m)
        np.testing.assert_array_equal(mean.copy_to_host(),
                                      (np.array(totals) / m).astype(np.float32))


@pytest.mark.cuda
def test_cuda_split_is_the_whole_batch_bit_for_bit_across_pieces():
    """Rows longer than a piece, in chunks of 1 and 2 samples: forward (y, mean, invstd, running
    statistics) and backward (dx, dgamma, dbeta) of the split kernels are the whole batch's."""
    from numba import cuda

    from minilms.kernels import batchnorm_split as split
    from minilms.kernels.batchnorm_sums import PIECE
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((3, 1, PIECE + 1)) * 2 + 5).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    gamma, beta, rmean, rvar = params(1, np.float32, seed=13)
    m = x.size

    def dev(a):
        return cuda.to_device(np.ascontiguousarray(a))
    whole = on_cuda(bn.batchnorm_forward_train, x, gamma, beta, np.empty_like(x),
                    np.empty(1, np.float32), np.empty(1, np.float32), rmean.copy(), rvar.copy(),
                    0.1, 1e-5)
    y, mean, invstd, run_mean, run_var = whole[3:8]
    grads = on_cuda(bn.batchnorm_backward, x, dy, gamma, mean, invstd, np.empty_like(x),
                    np.empty(1, np.float32), np.empty(1, np.float32))[5:8]

    stats = dev(stats_for(x))
    g, b = dev(gamma), dev(beta)
    s_mean, s_inv, s_rm, s_rv = (dev(a) for a in (np.empty(1, np.float32),
                                                  np.empty(1, np.float32), rmean, rvar))
    chunks = [(0, 1), (1, 3)]
    for centered in (False, True):
        for n0, n1 in chunks:
            split.batchnorm_split_sums(dev(x[n0:n1]), n0, m, s_mean, stats, centered)
        if not centered:
            split.batchnorm_split_mean(stats, m, s_mean)
    split.batchnorm_split_invstd(stats, m, s_mean, s_inv, s_rm, s_rv)
    ys = []
    for n0, n1 in chunks:
        out = dev(np.empty_like(x[n0:n1]))
        bn.batchnorm_normalize(dev(x[n0:n1]), g, b, s_mean, s_inv, out)
        ys.append(out.copy_to_host())
    for got, want in [(np.concatenate(ys), y), (s_mean, mean), (s_inv, invstd), (s_rm, run_mean),
                      (s_rv, run_var)]:
        got = got if isinstance(got, np.ndarray) else got.copy_to_host()
        np.testing.assert_array_equal(got, want)

    dgamma, dbeta = dev(np.empty(1, np.float32)), dev(np.empty(1, np.float32))
    for n0, n1 in chunks:
        split.batchnorm_split_grad_sums(dev(x[n0:n1]), dev(dy[n0:n1]), n0, s_mean, s_inv, stats)
    split.batchnorm_split_param_grads(stats, s_mean, s_inv, dgamma, dbeta)
    dxs = []
    for n0, n1 in chunks:
        dx = dev(np.empty_like(x[n0:n1]))
        split.batchnorm_split_input_grad(dev(x[n0:n1]), dev(dy[n0:n1]), g, s_mean, s_inv, stats,
                                         dgamma, dbeta, m, dx)
        dxs.append(dx.copy_to_host())
    np.testing.assert_array_equal(np.concatenate(dxs), grads[0])
    np.testing.assert_array_equal(dgamma.copy_to_host(), grads[1])
    np.testing.assert_array_equal(dbeta.copy_to_host(), grads[2])


@pytest.mark.cuda
def test_cuda_needs_its_stats_workspace():
    """Without ``stats`` (a layer set up for the cpu alone), or with one too small for the
    samples, a clear error rather than a write out of bounds."""
    from numba import cuda
    x = cuda.to_device(np.ones((2, 3, 4), np.float32))
    c = [cuda.to_device(np.ones(3, np.float32)) for _ in range(6)]
    with pytest.raises(ValueError, match=r"float64 stats workspace, shape \(2, 3, 3\)"):
        bn.batchnorm_forward_train(x, c[0], c[1], x, c[2], c[3], c[4], c[5])
    small = cuda.to_device(np.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match=r"stats of shape \(2, 3, 2\) for samples 0..2"):
        bn.batchnorm_forward_train(x, c[0], c[1], x, c[2], c[3], c[4], c[5], stats=small)
