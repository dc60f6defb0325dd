"""InnerProduct: forward against a naive loop, backward by the gradient checker on both devices,
the bias in chunks of rows, PyTorch's linear, the workspace, errors."""
import numpy as np
import pytest

import minilms.layers.inner_product as inner_product_module
from minilms.layers import ShapeError
from minilms.layers.gradcheck import check_gradients
from minilms.layers.inner_product import InnerProduct
from minilms.layers.run import LayerRun

from ..devices import GRADCHECK_SAMPLES, KINDS, new_device

MiB = 2**20
# Under the simulator, a GEMM tile that covers these small matrices in one block (conftest).
pytestmark = pytest.mark.usefixtures("small_gemm_tile")


def linear(num_output=3, **options):
    return InnerProduct("fc", ["x"], ["y"], num_output=num_output, **options)


def naive_linear(x, weight, bias):
    flat = x.reshape(x.shape[0], -1)
    y = np.zeros((x.shape[0], weight.shape[0]))
    for n in range(flat.shape[0]):
        for o in range(weight.shape[0]):
            y[n, o] = sum(weight[o, k] * flat[n, k] for k in range(flat.shape[1]))
            if bias is not None:
                y[n, o] += bias[o]
    return y


@pytest.mark.parametrize("shape", [(3, 5), (2, 2, 3), (2, 3, 2, 2)])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_matches_naive_loop(shape, bias):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    layer = linear(bias=bias)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, layer, [shape], dtype=np.float64)
        if bias:
            run.set_param("bias", rng.standard_normal(3))
        y = run.forward([x])[0]
        expected = naive_linear(x, run.param("weight"), run.param("bias") if bias else None)
    assert layer.top_shapes == [(shape[0], 3)]
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
def test_gradients_cpu_float64(bias):
    rng = np.random.default_rng(2)
    layer = linear(bias=bias)
    with new_device("cpu", MiB) as device:
        check_gradients(device, layer, [rng.standard_normal((4, 2, 3))],
                        samples=GRADCHECK_SAMPLES["cpu"],
                        params={"bias": rng.standard_normal(3)} if bias else None)


# Float32, as CUDA's GEMM is; the layer is linear in x, W and b, so central differences are exact
# but for float32 rounding of the top (see test_convolution for the numbers behind the tolerances).
FLOAT32 = dict(dtype=np.float32, eps=1e-2, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_float32(kind):
    rng = np.random.default_rng(3)
    layer = linear()
    with new_device(kind, MiB) as device:
        report = check_gradients(device, layer, [rng.standard_normal((2, 2, 3))],
                                 samples=GRADCHECK_SAMPLES[kind],
                                 params={"bias": rng.standard_normal(3)}, **FLOAT32)
    assert report.kinks == 0


def forward_backward(kind, layer, x, dy, params, dtype):
    with new_device(kind, MiB) as device:
        run = LayerRun(device, layer, [x.shape], dtype=dtype)
        for key, value in params.items():
            run.set_param(key, value)
        y = run.forward([x])[0]
        (dx,), grads = run.backward([dy])
    return y, dx, grads


@pytest.mark.parametrize("kind", KINDS)
def test_bias_in_chunks_of_rows(kind, monkeypatch):
    """With room for 2 ones (in either dtype), a batch of 5 takes 3 bias gemms each way, and gives
    what one gemm over the whole batch gives."""
    dtype = np.float64 if kind == "cpu" else np.float32
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 4)).astype(dtype)
    dy = rng.standard_normal((5, 3)).astype(dtype)
    params = {"weight": rng.standard_normal((3, 4)), "bias": rng.standard_normal(3)}
    whole = forward_backward(kind, linear(), x, dy, params, dtype)
    monkeypatch.setattr(inner_product_module, "ONES_ROWS", 2)
    layer = linear()
    chunked = forward_backward(kind, layer, x, dy, params, dtype)
    (ones,) = layer.workspace()
    assert ones.shape == (2,) and ones.dtype is None   # the run's float dtype
    close = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
    for a, b in zip(chunked[:2], whole[:2]):
        np.testing.assert_allclose(a, b, **close)
    for key in whole[2]:
        np.testing.assert_allclose(chunked[2][key], whole[2][key], **close)
    expected = naive_linear(x.astype(np.float64), params["weight"], params["bias"])
    np.testing.assert_allclose(chunked[0], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(chunked[2]["bias"], dy.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_backward_overwrites_gradients():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4))
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, linear(), [x.shape], dtype=np.float64)
        dy = rng.standard_normal(run.forward([x])[0].shape)
        first, second = run.backward([dy]), run.backward([dy])
    np.testing.assert_array_equal(first[0][0], second[0][0])
    for key in first[1]:
        np.testing.assert_array_equal(first[1][key], second[1][key])


def test_against_torch():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: comparison skipped")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 3, 2, 5)).astype(np.float32)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, linear(7), [x.shape])
        run.set_param("bias", rng.standard_normal(7).astype(np.float32))
        y = run.forward([x])[0]
        dy = rng.standard_normal(y.shape).astype(np.float32)
        (dx,), grads = run.backward([dy])
        weight, bias = run.param("weight"), run.param("bias")
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(weight, requires_grad=True)
    tb = torch.tensor(bias, requires_grad=True)
    ty = torch.nn.functional.linear(tx.flatten(1), tw, tb)
    ty.backward(torch.tensor(dy))
    close = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, ty.detach().numpy(), **close)
    np.testing.assert_allclose(dx, tx.grad.numpy(), **close)
    np.testing.assert_allclose(grads["weight"], tw.grad.numpy(), **close)
    np.testing.assert_allclose(grads["bias"], tb.grad.numpy(), **close)


def test_params_and_workspace():
    """PyTorch's Linear layout; the workspace (ones for the bias) is bounded whatever the batch."""
    layer = linear(10, weight_init="xavier")
    layer.setup([(8, 3, 4, 4)])
    weight, bias = layer.params()
    assert ((weight.shape, weight.init, weight.fan_in, weight.fan_out)
            == ((10, 48), "xavier", 48, 10))
    assert (bias.shape, bias.init) == ((10,), "zeros")
    sizes = {}
    for batch in (1, 3, 1024, 10**6):
        layer.setup([(batch, 48)])
        sizes[batch] = layer.workspace()[0].nbytes
    assert sizes == {1: 4, 3: 12, 1024: 4096, 10**6: 4096}  # float32 ones, at most ONES_ROWS
    no_bias = linear(bias=False)
    no_bias.setup([(10**6, 5)])
    assert [p.name for p in no_bias.params()] == ["weight"] and no_bias.workspace() == []


def test_errors():
    with pytest.raises(ShapeError, match=r"^layer fc \(InnerProduct\): bottom 0 \(x\): expected a "
                                         r"2-d or 3-d or 4-d or 5-d shape, found \(5,\)$"):
        linear().setup([(5,)])
    with pytest.raises(ShapeError, match=r"^layer fc \(InnerProduct\): bottom 0 \(x\): expected at "
                                         r"least one feature per sample, found \(2, 0\)$"):
        linear().setup([(2, 0)])
    with pytest.raises(ShapeError, match=r"^layer fc \(InnerProduct\): num_output: expected a "
                                         r"positive integer, found None$"):
        InnerProduct("fc", ["x"], ["y"])
    with pytest.raises(ShapeError, match=r"weight_init: expected 'he' or 'xavier', found 'lecun'"):
        linear(weight_init="lecun")
