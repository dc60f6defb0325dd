"""Batch norm: CPU against numpy, backward against numerical gradients, CUDA against CPU, torch."""
import numpy as np
import pytest

from minilms.kernels import batchnorm as bn


def on_cuda(launcher, *args, **kwargs):
    from numba import cuda
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    launcher(*dev, **kwargs)
    return [d.copy_to_host() if hasattr(d, "copy_to_host") else d for d in dev]


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
    """A large channel far from zero: 2**16 values around 30000, where float32 sums lose
    digits (a 2240x2240 image's channel is larger still). Both devices sum in float64, so the
    saved mean and invstd agree to within one float32 ulp (float32 sums on cuda: 2 ulps), and
    so does the sum of dy."""
    rng = np.random.default_rng(8)
    x = (30000 + rng.standard_normal((4, 1, 128, 128))).astype(np.float32)
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
