"""BatchNorm layer: train and test forward against a naive per-channel reference (running statistics
included), the gradient checker on both devices, PyTorch's batch_norm in train and eval mode, and
the option and shape errors."""
import numpy as np
import pytest

from minilms.layers import LAYERS, ShapeError
from minilms.layers.gradcheck import check_gradients
from minilms.layers.run import LayerRun

from ..devices import GRADCHECK_SAMPLES, KINDS, new_device

MiB = 2**20

# BatchNorm's CUDA kernels run one 256-thread block per channel: about a second per launch in the
# simulator. Its cuda gradient check uses one channel and few samples; test_cuda_matches_cpu
# compares every element of forward and backward with the cpu device instead.
CUDA_SAMPLES = 2


def make(**options):
    return LAYERS["BatchNorm"]("bn", ["x"], ["y"], **options)


def naive_bn(x, gamma, beta, rm, rv, momentum=0.1, eps=1e-5, train=True):
    """Channel by channel in float64: (y, mean, invstd, new running_mean, new running_var)."""
    c_ = x.shape[1]
    y = np.empty(x.shape)
    mean, invstd = np.empty(c_), np.empty(c_)
    rm, rv = rm.astype(np.float64).copy(), rv.astype(np.float64).copy()
    for c in range(c_):
        v = x[:, c].astype(np.float64).ravel()
        if train:
            mu = v.sum() / v.size
            var = ((v - mu) ** 2).sum() / v.size
            rm[c] = (1 - momentum) * rm[c] + momentum * mu
            rv[c] = (1 - momentum) * rv[c] + momentum * var * v.size / (v.size - 1)
        else:
            mu, var = rm[c], rv[c]
        mean[c], invstd[c] = mu, 1 / np.sqrt(var + eps)
        y[:, c] = (x[:, c] - mu) * invstd[c] * gamma[c] + beta[c]
    return y, mean, invstd, rm, rv


@pytest.mark.parametrize("shape", [(4, 3, 2, 5), (6, 3)])
def test_train_and_test_forward_against_naive(shape):
    rng = np.random.default_rng(0)
    gamma, beta = rng.standard_normal(3), rng.standard_normal(3)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, make(momentum=0.2, eps=1e-3), [shape], dtype=np.float64)
        run.set_param("weight", gamma)
        run.set_param("bias", beta)
        np.testing.assert_array_equal(run.param("running_mean"), 0)
        np.testing.assert_array_equal(run.param("running_var"), 1)
        rm, rv = np.zeros(3), np.ones(3)
        for step in range(2):                                # running stats accumulate
            x = rng.standard_normal(shape) * 3 + step
            y = run.forward([x])[0]
            want, mean, invstd, rm, rv = naive_bn(x, gamma, beta, rm, rv, 0.2, 1e-3)
            np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(run.saved["mean"].host_data(), mean, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(run.saved["invstd"].host_data(), invstd, rtol=1e-12)
            np.testing.assert_allclose(run.param("running_mean"), rm, rtol=1e-12)
            np.testing.assert_allclose(run.param("running_var"), rv, rtol=1e-12)
        # test mode: the running statistics, and nothing is updated
        x = rng.standard_normal(shape)
        y = run.forward([x], train=False)[0]
        np.testing.assert_allclose(y, naive_bn(x, gamma, beta, rm, rv, eps=1e-3, train=False)[0],
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(run.param("running_mean"), rm, rtol=1e-12)
        np.testing.assert_allclose(run.param("running_var"), rv, rtol=1e-12)
        # training output is normalised whatever the running statistics are
        y = run.forward([x * 5 - 2], train=True)[0]
        axes = (0,) + tuple(range(2, len(shape)))
        np.testing.assert_allclose(((y - beta.reshape((1, 3) + (1,) * (len(shape) - 2)))
                                    / gamma.reshape((1, 3) + (1,) * (len(shape) - 2))).mean(axes),
                                   0, atol=1e-12)


def test_without_affine():
    x = np.random.default_rng(1).standard_normal((5, 2, 3))
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, make(affine=False), [x.shape], dtype=np.float64)
        assert sorted(run.params) == ["running_mean", "running_var"] and run.param_grad == {}
        y = run.forward([x])[0]
        np.testing.assert_allclose(y, naive_bn(x, np.ones(2), np.zeros(2), np.zeros(2),
                                               np.ones(2))[0], rtol=1e-12, atol=1e-12)
        check_gradients(device, make(affine=False), [x])


@pytest.mark.parametrize("kind", KINDS)
def test_gradients(kind):
    """dx, dweight and dbias by central differences. Backward declares only the bottom, so LayerRun
    withholds the top: passing proves nothing else is read."""
    rng = np.random.default_rng(2)
    channels = 3 if kind == "cpu" else 1
    samples = GRADCHECK_SAMPLES[kind] if kind == "cpu" else CUDA_SAMPLES
    for shape in ([(3, channels, 2, 3), (5, channels)] if kind == "cpu" else [(3, channels, 2, 2)]):
        x = rng.standard_normal(shape) * 2 + 1
        params = {"weight": rng.standard_normal(channels), "bias": rng.standard_normal(channels)}
        with new_device(kind, MiB) as device:
            report = check_gradients(device, make(), [x], params=params,
                                     samples=samples)
        assert report.kinks == 0
        assert report.checked == min(samples, x.size) + 2 * min(samples, channels)


@pytest.mark.parametrize("kind", KINDS)
def test_parameter_gradients_without_input_gradient(kind):
    """A BatchNorm fed by the data: no dx wanted, dweight and dbias still exact (own kernel)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 2, 3)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    with new_device(kind, MiB) as device:
        run = LayerRun(device, make(), [x.shape])
        run.set_param("weight", [2.0, -0.5])
        run.forward([x])
        (dx,), full = run.backward([dy])
        (none,), only = run.backward([dy], propagate_down=[False])
    assert none is None and dx is not None
    for name in ("weight", "bias"):
        np.testing.assert_allclose(only[name], full[name], rtol=1e-6)
    xhat = (x - x.mean((0, 2), keepdims=True)) / np.sqrt(x.var((0, 2), keepdims=True) + 1e-5)
    np.testing.assert_allclose(full["bias"], dy.sum((0, 2)), rtol=1e-5)
    np.testing.assert_allclose(full["weight"], (dy * xhat).sum((0, 2)), rtol=1e-4, atol=1e-6)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_fused_relu_gives_batch_norm_then_relu_bit_for_bit(kind, dtype):
    """``relu: true`` against a BatchNorm and an in-place ReLU run one after the other: training
    forward, backward (with and without dx) and test forward, bit for bit. (Backward may mask the
    top's gradient in place, as the ReLU's in-place backward did: it is declared rewritten.)"""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 2, 4, 5)) * 2 + 0.3).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    dy[0, 0, 0, :2] = [np.nan, -0.0]
    relu = LAYERS["ReLU"]("relu", ["y"], ["y"])
    with new_device(kind, MiB) as device:
        fused, plain = (LayerRun(device, make(relu=r), [x.shape], dtype=dtype)
                        for r in (True, False))
        alone = LayerRun(device, relu, [x.shape], dtype=dtype)
        for run in (fused, plain):
            run.set_param("weight", [1.5, -0.5])
            run.set_param("bias", [0.25, -0.1])
        y = fused.forward([x])[0]
        want = alone.forward(plain.forward([x]))[0]
        assert (y == 0).any() and (y > 0).any()
        np.testing.assert_array_equal(bits(y), bits(want))
        for down in ([True], [False]):
            (dx,), grads = fused.backward([dy], down)
            (masked,), _ = alone.backward([dy])
            (dx_want,), grads_want = plain.backward([masked], down)
            assert (dx is None) == (dx_want is None) == (not down[0])
            if dx is not None:
                np.testing.assert_array_equal(bits(dx), bits(dx_want))
            for name in grads_want:
                np.testing.assert_array_equal(bits(grads[name]), bits(grads_want[name]))
        for k in ("running_mean", "running_var"):
            np.testing.assert_array_equal(fused.param(k), plain.param(k))
        test = fused.forward([x], train=False)[0]
        np.testing.assert_array_equal(bits(test),
                                      bits(alone.forward(plain.forward([x], train=False))[0]))
    assert make(relu=True).backward_reads == {"bottom"}     # the mask is made again from x
    assert make(relu=True).backward_rewrites_top_grad and not make().backward_rewrites_top_grad


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fused_relu_masks_with_the_forwards_own_y_at_zero(kind, dtype):
    """Backward makes the forward's ``y`` again from ``x`` to mask the gradient: it must round as
    the forward did. ``bias`` is set so that in each channel some ``y`` falls within an ulp or
    two of 0, where a product rounded before the add (or not, with an FMA) flips the sign:
    backward's mask must agree with the forward's output everywhere."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((4, 3, 5, 6)) * 3).astype(dtype)
    x[:, :, 0, :] = x[0, :, 0, 0][None, :, None]   # 24 values a channel at the edge of the mask
    dy = np.ones(x.shape, dtype)
    weight = np.array([1.3, -0.7, 2.1], dtype)
    with new_device(kind, MiB) as device:
        run = LayerRun(device, make(relu=True), [x.shape], dtype=dtype)
        run.set_param("weight", weight)
        run.forward([x])
        mean, invstd = (run.saved[k].host_data().copy() for k in ("mean", "invstd"))
        g = (weight * invstd).astype(dtype)
        # minus the rounded product (x - mean) * g of those values: their y is the product's
        # rounding error (an FMA) or 0 (none); either way at the edge of the mask
        bias = (-(x[0, :, 0, 0] - mean) * g).astype(dtype)
        run.set_param("bias", bias)
        y = run.forward([x])[0]
        (dx,), _ = run.backward([dy])
        masked = LayerRun(device, make(), [x.shape], dtype=dtype)
        masked.set_param("weight", weight)
        masked.set_param("bias", bias)
        masked.forward([x])
        (want,), _ = masked.backward([np.where(y <= 0, 0, dy).astype(dtype)])
    np.testing.assert_array_equal(bits(dx), bits(want))
    assert np.abs(y[:, :, 0, :]).max() <= 4 * np.finfo(dtype).eps * np.abs(x).max()


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_with_a_fused_relu(kind):
    rng = np.random.default_rng(8)
    channels = 2 if kind == "cpu" else 1
    x = rng.standard_normal((4, channels, 2, 3)) * 2 + 0.5
    params = {"weight": rng.standard_normal(channels), "bias": rng.standard_normal(channels)}
    with new_device(kind, MiB) as device:
        report = check_gradients(device, make(relu=True), [x], params=params,
                                 samples=GRADCHECK_SAMPLES[kind] if kind == "cpu" else CUDA_SAMPLES)
    assert report.checked > 0


@pytest.mark.cuda
def test_cuda_matches_cpu():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 3)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for kind in ("cpu", "cuda"):
        with new_device(kind, MiB) as device:
            run = LayerRun(device, make(), [x.shape])
            run.set_param("weight", [1.5, -0.5])
            run.set_param("bias", [0.25, 2.0])
            y = run.forward([x])[0]
            (dx,), grads = run.backward([dy])
            stats = [run.param(k) for k in ("running_mean", "running_var")]
            results.append((y, dx, grads, stats, run.forward([x], train=False)[0]))
    (y0, dx0, g0, s0, t0), (y1, dx1, g1, s1, t1) = results
    for a, b in [(y0, y1), (dx0, dx1), (g0["weight"], g1["weight"]), (g0["bias"], g1["bias"]),
                 (s0[0], s1[0]), (s0[1], s1[1]), (t0, t1)]:
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=1e-6)


def test_declarations():
    layer = make()
    assert layer.setup([(2, 4, 3, 3)]) == [(2, 4, 3, 3)]
    specs = {p.name: p for p in layer.params()}
    assert [(p.name, p.shape, p.init, p.learnable) for p in specs.values()] == [
        ("weight", (4,), "ones", True), ("bias", (4,), "zeros", True),
        ("running_mean", (4,), "zeros", False), ("running_var", (4,), "ones", False)]
    assert [(b.name, b.shape, b.dtype) for b in layer.saved()] == [
        ("mean", (4,), None), ("invstd", (4,), None)]              # None: the run's float dtype
    assert layer.backward_reads == frozenset({"bottom"}) and layer.has_backward
    *per_channel, stats = layer.workspace()
    assert all(b.shape == (4,) for b in per_channel)
    # the cuda sums' float64 stats: one per piece of PIECE values of a (sample, channel) row and
    # channel, and the mean: 1/512 of the batch's bytes at most, when rows are long
    assert (stats.name, stats.shape, stats.dtype) == ("stats", (2, 4, 2 + 1), np.float64)
    layer.setup([(2, 4, 300, 300)])
    assert layer.workspace()[-1].shape == (2, 4, 2 * 44 + 1)
    layer.setup([(2, 4, 3, 3)], "cpu")                             # the cpu sums per channel
    assert [b.shape for b in layer.workspace()] == [(4,), (4,)]
    plain = make(affine=False)
    plain.setup([(2, 4)], "cpu")
    assert [p.name for p in plain.params()] == ["running_mean", "running_var"]
    assert {b.dtype for b in plain.saved() + plain.workspace()} == {None}
    assert {b.dtype_in(np.float64) for b in plain.saved() + plain.workspace()} \
        == {np.dtype(np.float64)}


def test_against_torch():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: comparison skipped")
    rng = np.random.default_rng(5)
    for shape, module in (((4, 3, 5, 6), torch.nn.BatchNorm2d), ((8, 3), torch.nn.BatchNorm1d)):
        bn = module(3, momentum=0.3, eps=1e-4).double()
        with torch.no_grad():
            bn.weight.copy_(torch.tensor(rng.standard_normal(3)))
            bn.bias.copy_(torch.tensor(rng.standard_normal(3)))
            bn.running_mean.copy_(torch.tensor(rng.standard_normal(3)))
            bn.running_var.copy_(torch.tensor(rng.random(3) + 0.5))
        with new_device("cpu", MiB) as device:
            layer = make(momentum=0.3, eps=1e-4)
            run = LayerRun(device, layer, [shape], dtype=np.float64)
            state = bn.state_dict()     # PyTorch's names: the weights load as <layer>.<param>
            for spec in layer.params():
                assert tuple(state[spec.name].shape) == spec.shape
                run.set_param(spec.name, state[spec.name].numpy())
            bn.train()
            for step in range(2):       # two training steps: forward, backward, running stats
                x = rng.standard_normal(shape) * 2 + step
                dy = rng.standard_normal(shape)
                y = run.forward([x])[0]
                (dx,), grads = run.backward([dy])
                xt = torch.tensor(x, requires_grad=True)
                bn.weight.grad = bn.bias.grad = None
                yt = bn(xt)
                yt.backward(torch.tensor(dy))
                np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-12)
                np.testing.assert_allclose(grads["weight"], bn.weight.grad.numpy(), rtol=1e-10)
                np.testing.assert_allclose(grads["bias"], bn.bias.grad.numpy(), rtol=1e-10)
                for name in ("running_mean", "running_var"):
                    np.testing.assert_allclose(run.param(name), getattr(bn, name).numpy(),
                                               rtol=1e-12)
            bn.eval()
            x = rng.standard_normal(shape)
            np.testing.assert_allclose(run.forward([x], train=False)[0],
                                       bn(torch.tensor(x)).detach().numpy(), rtol=1e-10, atol=1e-12)
            for name in ("running_mean", "running_var"):   # eval updated nothing, in either
                np.testing.assert_allclose(run.param(name), getattr(bn, name).numpy(), rtol=1e-12)


def test_option_errors():
    prefix = r"^layer bn \(BatchNorm\): "
    for options, message in [
        (dict(momentum=1.5), "momentum: expected a number in \\[0, 1\\], found 1.5$"),
        (dict(momentum=None), "momentum: expected a number in \\[0, 1\\], found None$"),
        (dict(eps=0), "eps: expected a number > 0, found 0$"),
        (dict(affine="yes"), "affine: expected true or false, found 'yes'$"),
        (dict(relu=1), "relu: expected true or false, found 1$"),
    ]:
        with pytest.raises(ShapeError, match=prefix + message):
            make(**options)


def test_shape_and_mode_errors():
    with pytest.raises(ShapeError, match=r"^layer bn \(BatchNorm\): bottom 0 \(x\): expected a 2-d "
                                         r"or 3-d or 4-d or 5-d shape, found \(5,\)$"):
        make().setup([(5,)])
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, make(), [(1, 2)])
        with pytest.raises(ShapeError, match=r"bottom 0 \(x\): expected more than one value per "
                                             r"channel in training, found \(1, 2\)$"):
            run.forward([np.ones((1, 2))])
        assert run.forward([np.ones((1, 2))], train=False)[0].shape == (1, 2)   # fine in test
        run = LayerRun(device, make(), [(3, 2)], dtype=np.float32,    # float64 data, float32 saved
                       bottom_dtypes=[np.float64])
        with pytest.raises(ShapeError, match=r"dtype of mean: expected the data's float64, "
                                             r"found float32$"):
            run.forward([np.ones((3, 2))])
