"""Softmax cross-entropy and accuracy: CPU against numpy, numerical gradients, CUDA, torch."""
import numpy as np
import pytest

from minilms.kernels import softmax as sm


def on_cuda(launcher, *args, **kwargs):
    from numba import cuda
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    launcher(*dev, **kwargs)
    return [d.copy_to_host() if hasattr(d, "copy_to_host") else d for d in dev]


def naive_xent(z, labels):
    """Row by row in float64 with Python's math: an independent reference."""
    import math
    prob, loss = np.zeros(z.shape), np.zeros(len(z))
    for n, row in enumerate(z.astype(np.float64)):
        m = max(row)
        e = [math.exp(v - m) for v in row]
        s = math.fsum(e)
        prob[n] = [v / s for v in e]
        loss[n] = math.log(s) - (row[labels[n]] - m)
    return prob, loss


def naive_topk_hits(z, labels, k):
    return sum(int(np.sum(row > row[lab]) < k) for row, lab in zip(z, labels))


def forward(z, labels):
    n, k = z.shape
    prob, loss, mean = np.empty_like(z), np.empty(n, z.dtype), np.empty(1, z.dtype)
    sm.softmax_xent_forward(z, labels, prob, loss, mean)
    return prob, loss, mean


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-6), (np.float64, 1e-13)])
def test_forward_cpu_against_naive(dtype, rtol):
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((6, 11)) * 4).astype(dtype)
    z[1] += 1000.0                                       # would overflow exp without the max
    z[2, :] = -1000.0                                    # all equal: uniform
    labels = rng.integers(0, 11, 6).astype(np.int32)
    prob, loss, mean = forward(z, labels)
    want_prob, want_loss = naive_xent(z, labels)
    np.testing.assert_allclose(prob, want_prob, rtol=rtol, atol=1e-30)
    np.testing.assert_allclose(loss, want_loss, rtol=rtol * 4)
    np.testing.assert_allclose(mean[0], want_loss.mean(), rtol=rtol * 4)
    np.testing.assert_allclose(prob[2], 1 / 11, rtol=rtol)
    assert np.all(np.isfinite(loss))


def test_far_off_label_keeps_a_finite_loss():
    z = np.array([[0.0, 200.0]], np.float32)             # prob of class 0 underflows to 0
    prob, loss, _ = forward(z, np.array([0], np.int32))
    assert prob[0, 0] == 0 and loss[0] == pytest.approx(200.0)


def test_bad_label_gives_nan():
    z = np.zeros((3, 4), np.float32)
    _, loss, mean = forward(z, np.array([0, 4, -1], np.int32))
    assert np.isfinite(loss[0]) and np.isnan(loss[1]) and np.isnan(loss[2]) and np.isnan(mean[0])


def test_labels_must_be_int32():
    with pytest.raises(ValueError):
        forward(np.zeros((2, 3), np.float32), np.array([0, 1], np.int64))


def test_backward_against_numerical_gradient():
    rng = np.random.default_rng(1)
    z = rng.standard_normal((4, 5)) * 2
    labels = np.array([0, 4, 2, 2], np.int32)
    w = 0.7
    prob, _, _ = forward(z, labels)
    dz = np.empty_like(z)
    sm.softmax_xent_backward(prob, labels, dz, loss_weight=w)
    num = np.zeros_like(z)
    h = 1e-6
    for i in np.ndindex(z.shape):
        zp, zm = z.copy(), z.copy()
        zp[i] += h
        zm[i] -= h
        num[i] = w * (forward(zp, labels)[2][0] - forward(zm, labels)[2][0]) / (2 * h)
    np.testing.assert_allclose(dz, num, rtol=1e-6, atol=1e-9)
    sm.softmax_xent_backward(prob, labels, prob, loss_weight=w)    # in place over prob
    np.testing.assert_array_equal(prob, dz)


def test_accuracy_cpu():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((40, 7)).astype(np.float32)
    z[0] = 0.0                                           # a full tie counts for the label
    labels = rng.integers(0, 7, 40).astype(np.int32)
    count = np.zeros(1, np.int32)
    for k in (1, 3, 7):
        sm.accuracy(z, labels, count, top_k=k)
        assert count[0] == naive_topk_hits(z, labels, k)
    assert count[0] == 40
    sm.accuracy(z, labels, count)
    assert count[0] == np.sum(np.argmax(z[1:], axis=1) == labels[1:]) + 1


@pytest.mark.cuda
def test_cuda_matches_cpu():
    rng = np.random.default_rng(3)
    z = (rng.standard_normal((3, 130)) * 3).astype(np.float32)  # a row is 128 threads + 2
    z[1, 129] = 50.0
    labels = np.array([0, 129, 64], np.int32)
    prob, loss, mean = forward(z, labels)
    _, _, gprob, gloss, gmean = on_cuda(sm.softmax_xent_forward, z, labels, *forward(z, labels))
    np.testing.assert_allclose(gprob, prob, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(gloss, loss, rtol=1e-5)
    np.testing.assert_allclose(gmean, mean, rtol=1e-5)

    dz = np.empty_like(z)                                # 390 elements: a block and a half
    sm.softmax_xent_backward(prob, labels, dz, loss_weight=2.0)
    np.testing.assert_allclose(on_cuda(sm.softmax_xent_backward, prob, labels, dz,
                                       loss_weight=2.0)[2],
                               dz, rtol=1e-6, atol=1e-12)

    count = np.zeros(1, np.int32)
    zz = rng.standard_normal((300, 4)).astype(np.float32)  # 300 rows: past the 256 threads
    ll = rng.integers(0, 4, 300).astype(np.int32)
    for k in (1, 2):
        sm.accuracy(zz, ll, count, top_k=k)
        assert on_cuda(sm.accuracy, zz, ll, count, top_k=k)[2][0] == count[0]


def test_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    z = (rng.standard_normal((8, 10)) * 3).astype(np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    zt = torch.tensor(z, requires_grad=True)
    lt = torch.nn.functional.cross_entropy(zt, torch.tensor(labels, dtype=torch.long))
    (1.5 * lt).backward()
    prob, loss, mean = forward(z, labels)
    dz = np.empty_like(z)
    sm.softmax_xent_backward(prob, labels, dz, loss_weight=1.5)
    np.testing.assert_allclose(mean[0], lt.item(), rtol=1e-6)
    np.testing.assert_allclose(prob, torch.softmax(torch.tensor(z), 1).numpy(),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dz, zt.grad.numpy(), rtol=1e-5, atol=1e-8)
    count = np.zeros(1, np.int32)
    for k in (1, 3):
        sm.accuracy(z, labels, count, top_k=k)
        top = torch.topk(torch.tensor(z), k, dim=1).indices.numpy()
        assert count[0] == np.sum(top == labels[:, None])
