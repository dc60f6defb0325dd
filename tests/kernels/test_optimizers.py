"""SGD and Adam: CPU against a float64 reference, CUDA against CPU, several steps against
torch.optim."""
import math

import numpy as np
import pytest

from minilms.kernels import optimizers as opt

SGD_CASES = [  # (momentum, weight_decay, nesterov)
    (0.0, 0.0, False), (0.0, 0.01, False), (0.9, 0.0, False), (0.9, 5e-4, False), (0.9, 5e-4, True),
]
ADAM_CASES = [  # (lr, betas, eps, weight_decay)
    (1e-3, (0.9, 0.999), 1e-8, 0.0), (1e-2, (0.8, 0.99), 1e-6, 0.01),
]


def on_cuda(launcher, *args, **kwargs):
    from numba import cuda
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    launcher(*dev, **kwargs)
    return [d.copy_to_host() if hasattr(d, "copy_to_host") else d for d in dev]


def ref_sgd(p, g, buf, lr, momentum, wd, nesterov):
    """torch.optim.SGD's step, written out element by element in Python floats."""
    for i in range(p.size):
        d = g[i] + wd * p[i]
        if momentum:
            buf[i] = momentum * buf[i] + d
            d = d + momentum * buf[i] if nesterov else buf[i]
        p[i] -= lr * d


def ref_adam(p, g, m, v, step, lr, betas, eps, wd):
    """Adam as Kingma & Ba write it (PyTorch's form differs only in where it rounds)."""
    b1, b2 = betas
    for i in range(p.size):
        d = g[i] + wd * p[i]
        m[i] = b1 * m[i] + (1 - b1) * d
        v[i] = b2 * v[i] + (1 - b2) * d * d
        mhat = m[i] / (1 - b1 ** step)
        vhat = v[i] / (1 - b2 ** step)
        p[i] -= lr * mhat / (math.sqrt(vhat) + eps)


@pytest.fixture(params=["serial", "parallel"])
def cpu_path(request, monkeypatch):
    """Each CPU update both ways: on the calling thread (below ``SERIAL_BELOW``), and on Numba's
    workers (the threshold at 0)."""
    monkeypatch.setattr(opt, "SERIAL_BELOW", 1 << 30 if request.param == "serial" else 0)
    return request.param


def grads(n, steps, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(dtype) for _ in range(steps)]


@pytest.mark.parametrize("momentum, wd, nesterov", SGD_CASES)
def test_sgd_cpu_against_reference(momentum, wd, nesterov, cpu_path):
    p = np.random.default_rng(1).standard_normal((3, 7))
    buf = np.zeros_like(p)
    want_p, want_buf = p.copy().ravel(), buf.copy().ravel()
    for g in grads(p.size, 3):
        opt.sgd_step(p, g.reshape(p.shape), 0.1, buf, momentum, wd, nesterov)
        ref_sgd(want_p, g, want_buf, 0.1, momentum, wd, nesterov)
    np.testing.assert_allclose(p.ravel(), want_p, rtol=1e-14)
    np.testing.assert_allclose(buf.ravel(), want_buf, rtol=1e-14)


def test_sgd_argument_checks():
    p = np.zeros(3)
    with pytest.raises(ValueError):
        opt.sgd_step(p, p, 0.1, None, momentum=0.9)
    with pytest.raises(ValueError):
        opt.sgd_step(p, p, 0.1, p.copy(), momentum=0.0, nesterov=True)
    with pytest.raises(ValueError):
        opt.adam_step(p, p, p.copy(), p.copy(), step=0)
    with pytest.raises(ValueError):
        opt.sgd_step(p, np.zeros(4), 0.1)


@pytest.mark.parametrize("lr, betas, eps, wd", ADAM_CASES)
def test_adam_cpu_against_reference(lr, betas, eps, wd, cpu_path):
    p = np.random.default_rng(2).standard_normal(20)
    m, v = np.zeros_like(p), np.zeros_like(p)
    want = [p.copy(), m.copy(), v.copy()]
    for step, g in enumerate(grads(p.size, 4, seed=3), start=1):
        g_before = g.copy()
        opt.adam_step(p, g, m, v, step, lr, betas[0], betas[1], eps, wd)
        ref_adam(*want[:1], g, *want[1:], step, lr, betas, eps, wd)
        np.testing.assert_array_equal(g, g_before)              # grad is only read
    for got, ref in zip((p, m, v), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)


def test_serial_and_parallel_updates_agree_bit_for_bit(monkeypatch):
    """The two CPU paths compute each element alike (float32, every SGD case and Adam): the same
    bits, so a parameter's size (which picks the path) never changes a run's numbers."""
    rng = np.random.default_rng(6)
    p0 = rng.standard_normal(3001).astype(np.float32)
    gs = grads(p0.size, 3, seed=7, dtype=np.float32)
    results = {}
    for threshold in (1 << 30, 0):
        monkeypatch.setattr(opt, "SERIAL_BELOW", threshold)
        got = []
        for momentum, wd, nesterov in SGD_CASES:
            p, buf = p0.copy(), np.zeros_like(p0)
            for g in gs:
                opt.sgd_step(p, g, 0.1, buf, momentum, wd, nesterov)
            got += [p, buf]
        lr, (b1, b2), eps, wd = ADAM_CASES[1]
        p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
        for step, g in enumerate(gs, start=1):
            opt.adam_step(p, g, m, v, step, lr, b1, b2, eps, wd)
        results[threshold] = got + [p, m, v]
    for serial, parallel in zip(results[1 << 30], results[0]):
        np.testing.assert_array_equal(serial, parallel)


def test_the_path_follows_the_size():
    assert opt._on_cpu("parallel", "serial", opt.SERIAL_BELOW - 1) == "serial"
    assert opt._on_cpu("parallel", "serial", opt.SERIAL_BELOW) == "parallel"


@pytest.mark.cuda
def test_cuda_matches_cpu():
    n = 257                                                     # a block and one thread more
    p0 = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    gs = grads(n, 2, seed=5, dtype=np.float32)
    for momentum, wd, nesterov in (SGD_CASES[1], SGD_CASES[4]):
        p, buf = p0.copy(), np.zeros_like(p0)
        gp, gbuf = p0.copy(), np.zeros_like(p0)
        for g in gs:
            opt.sgd_step(p, g, 0.1, buf, momentum, wd, nesterov)
            gp, _, _, gbuf = on_cuda(opt.sgd_step, gp, g, 0.1, gbuf, momentum, wd, nesterov)[:4]
        np.testing.assert_allclose(gp, p, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(gbuf, buf, rtol=1e-6, atol=1e-7)
    lr, (b1, b2), eps, wd = ADAM_CASES[1]
    cpu = [p0.copy(), np.zeros_like(p0), np.zeros_like(p0)]
    gpu = [a.copy() for a in cpu]
    for step, g in enumerate(gs, start=1):
        opt.adam_step(cpu[0], g, cpu[1], cpu[2], step, lr, b1, b2, eps, wd)
        out = on_cuda(opt.adam_step, gpu[0], g, gpu[1], gpu[2], step, lr, b1, b2, eps, wd)
        gpu = [out[0], out[2], out[3]]
    for got, want in zip(gpu, cpu):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("momentum, wd, nesterov", SGD_CASES)
def test_sgd_against_torch(momentum, wd, nesterov):
    torch = pytest.importorskip("torch")
    p = np.random.default_rng(6).standard_normal(50).astype(np.float32)
    buf = np.zeros_like(p)
    tp = torch.nn.Parameter(torch.tensor(p))
    topt = torch.optim.SGD([tp], lr=0.05, momentum=momentum, weight_decay=wd, nesterov=nesterov)
    for g in grads(p.size, 5, seed=7, dtype=np.float32):
        tp.grad = torch.tensor(g)
        topt.step()
        opt.sgd_step(p, g, 0.05, buf, momentum, wd, nesterov)
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=1e-6, atol=1e-7)
    if momentum:
        np.testing.assert_allclose(buf, topt.state[tp]["momentum_buffer"].numpy(),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("lr, betas, eps, wd", ADAM_CASES)
def test_adam_against_torch(lr, betas, eps, wd):
    torch = pytest.importorskip("torch")
    p = np.random.default_rng(8).standard_normal(50).astype(np.float32)
    m, v = np.zeros_like(p), np.zeros_like(p)
    tp = torch.nn.Parameter(torch.tensor(p))
    topt = torch.optim.Adam([tp], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for step, g in enumerate(grads(p.size, 6, seed=9, dtype=np.float32), start=1):
        tp.grad = torch.tensor(g)
        topt.step()
        opt.adam_step(p, g, m, v, step, lr, betas[0], betas[1], eps, wd)
    state = topt.state[tp]
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(m, state["exp_avg"].numpy(), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(v, state["exp_avg_sq"].numpy(), rtol=1e-6, atol=1e-10)
