"""ReLU, Eltwise, Flatten and Concat: forward against numpy, backward by the gradient checker, on
both devices, and against PyTorch where it is installed."""
import numpy as np
import pytest

from minilms.layers import LAYERS, ShapeError
from minilms.layers.gradcheck import check_gradients
from minilms.layers.run import LayerRun

from ..devices import GRADCHECK_SAMPLES, KINDS, new_device

MiB = 2**20


def make(type_name, bottoms=("x",), **options):
    return LAYERS[type_name]("l", list(bottoms), ["y"], **options)


def away_from_zero(rng, shape, margin=0.05):
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < margin, margin, x)


@pytest.mark.parametrize("kind", KINDS)
def test_relu(kind):
    rng = np.random.default_rng(1)
    x = away_from_zero(rng, (2, 3, 5, 7))
    with new_device(kind, MiB) as device:
        run = LayerRun(device, make("ReLU"), [x.shape], dtype=np.float64)
        np.testing.assert_array_equal(run.forward([x])[0], np.maximum(x, 0))
        check_gradients(device, make("ReLU"), [x], samples=GRADCHECK_SAMPLES[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_relu_kink_guard_skips_elements_at_zero(kind):
    x = np.zeros((4, 4))
    x[0, :2] = [1.0, -1.0]
    with new_device(kind, MiB) as device:
        report = check_gradients(device, make("ReLU"), [x], samples=16, max_kink_fraction=1.0)
    assert report.kinks == 14 and report.checked == 2


@pytest.mark.parametrize("kind", KINDS)
def test_eltwise_sum_with_coefficients(kind):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((3, 4, 5)) for _ in range(3)]
    layer = make("Eltwise", ("a", "b", "c"), coeffs=[1.0, -2.0, 0.5])
    with new_device(kind, MiB) as device:
        run = LayerRun(device, layer, [x.shape for x in xs], dtype=np.float64)
        np.testing.assert_allclose(run.forward(xs)[0], xs[0] - 2 * xs[1] + 0.5 * xs[2])
        check_gradients(device, layer, xs, samples=GRADCHECK_SAMPLES[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_eltwise_with_a_fused_relu(kind):
    rng = np.random.default_rng(5)
    xs = [away_from_zero(rng, (3, 4, 5)) for _ in range(3)]
    layer = make("Eltwise", ("a", "b", "c"), coeffs=[1.0, -2.0, 0.5], relu=True)
    assert layer.backward_reads == {"top"}     # the mask: the ReLU's own backward reads it too
    with new_device(kind, MiB) as device:
        run = LayerRun(device, layer, [x.shape for x in xs], dtype=np.float64)
        np.testing.assert_allclose(run.forward(xs)[0],
                                   np.maximum(xs[0] - 2 * xs[1] + 0.5 * xs[2], 0))
        report = check_gradients(device, layer, xs, samples=GRADCHECK_SAMPLES[kind])
    assert report.checked > 0


def test_eltwise_errors():
    with pytest.raises(ShapeError, match=r"layer l \(Eltwise\): coeffs: expected 2 coefficients"):
        make("Eltwise", ("a", "b"), coeffs=[1.0])
    for bad in (["a", "b"], [1.0, float("nan")], "1, 2", [True, 1.0]):
        with pytest.raises(ShapeError, match="coeffs: expected a list of finite numbers"):
            make("Eltwise", ("a", "b"), coeffs=bad)
    with pytest.raises(ShapeError, match="operation: expected 'sum'"):
        make("Eltwise", ("a", "b"), operation="prod")
    with pytest.raises(ShapeError, match=r"bottom 1 \(b\): expected the shape of bottom 0"):
        make("Eltwise", ("a", "b")).setup([(2, 3), (3, 2)])
    with pytest.raises(ShapeError, match="bottoms: expected 2 to 64 bottom blob"):
        make("Eltwise", ("a",))
    with pytest.raises(ShapeError, match="relu: expected true or false, found 'yes'"):
        make("Eltwise", ("a", "b"), relu="yes")
    with pytest.raises(ShapeError, match="top: expected a blob of its own, or bottom 0 or 1"):
        LAYERS["Eltwise"]("l", ["a", "b", "c"], ["c"])
    # in place with its ReLU is allowed: backward reads the top, which nothing changes after
    assert LAYERS["Eltwise"]("l", ["a", "b"], ["a"], relu=True).backward_reads == {"top"}


@pytest.mark.parametrize("kind", KINDS)
def test_flatten(kind):
    x = np.random.default_rng(3).standard_normal((2, 3, 4, 5))
    with new_device(kind, MiB) as device:
        run = LayerRun(device, make("Flatten"), [x.shape], dtype=np.float64)
        np.testing.assert_array_equal(run.forward([x])[0], x.reshape(2, 60))
        check_gradients(device, make("Flatten"), [x], samples=GRADCHECK_SAMPLES[kind])
    with pytest.raises(ShapeError, match=r"bottom 0 \(x\): expected a 2-d or 3-d"):
        make("Flatten").setup([(5,)])


@pytest.mark.parametrize("kind", KINDS)
def test_concat(kind):
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((2, c, 3, 3)) for c in (1, 4, 2)]
    layer = make("Concat", ("a", "b", "c"))
    with new_device(kind, MiB) as device:
        run = LayerRun(device, layer, [x.shape for x in xs], dtype=np.float64)
        np.testing.assert_array_equal(run.forward(xs)[0], np.concatenate(xs, axis=1))
        check_gradients(device, layer, xs, samples=GRADCHECK_SAMPLES[kind])


def test_concat_shape_error_names_the_bottom():
    with pytest.raises(ShapeError, match=r"Concat\): bottom 1 \(b\): expected \[2, C, 3, 3\], "
                                         r"found \(2, 1, 4, 3\)"):
        make("Concat", ("a", "b")).setup([(2, 1, 3, 3), (2, 1, 4, 3)])


def test_against_torch():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: comparison skipped")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, make("ReLU"), [x.shape])
        y = run.forward([x])[0]
        (dx,), _ = run.backward([dy])
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.relu(tx)
    ty.backward(torch.tensor(dy))
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_array_equal(dx, tx.grad.numpy())
