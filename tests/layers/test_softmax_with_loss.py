"""SoftmaxWithLoss layer: forward against a row-by-row reference, backward (with loss_weight and an
upstream top gradient) against the formula and the gradient checker on both devices, PyTorch's
cross_entropy, and the shape and option errors."""
import math

import numpy as np
import pytest

from minilms.layers import LAYERS, ShapeError
from minilms.layers.gradcheck import check_gradients
from minilms.layers.run import LayerRun

from ..devices import GRADCHECK_SAMPLES, KINDS, new_device

MiB = 2**20

# The softmax kernels run a 128-thread block per row and a 256-thread block for the mean: about a
# second per forward in the CUDA simulator, so the cuda gradient check samples few logits;
# test_backward_formula compares every element on both devices.
CUDA_SAMPLES = 2


def make(**options):
    return LAYERS["SoftmaxWithLoss"]("loss", ["logits", "label"], ["loss"], **options)


def naive(z, labels):
    """(prob, per-sample loss) row by row with Python's math in float64."""
    rows = np.asarray(z, np.float64).reshape(len(z), -1)
    prob, loss = np.zeros(rows.shape), np.zeros(len(z))
    for n, row in enumerate(rows):
        m = max(row)
        s = math.fsum(math.exp(v - m) for v in row)
        prob[n] = [math.exp(v - m) / s for v in row]
        loss[n] = math.log(s) - (row[labels[n]] - m)
    return prob, loss


def new_run(device, z, weight=1.0, dtype=np.float64):
    layer = make(loss_weight=weight)
    return LayerRun(device, layer, [z.shape, (len(z),)], dtype=dtype,
                    bottom_dtypes=[dtype, np.int32])


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 1, 1)])
def test_forward_against_naive(shape):
    rng = np.random.default_rng(0)
    z = rng.standard_normal(shape) * 3
    z[1] += 500.0                                       # would overflow exp without the max
    labels = rng.integers(0, 7, 5).astype(np.int32)
    prob, loss = naive(z, labels)
    with new_device("cpu", MiB) as device:
        for weight in (1.0, 0.25):
            run = new_run(device, z, weight)
            (top,) = run.forward([z, labels])
            assert top.shape == (1,)
            np.testing.assert_allclose(top[0], weight * loss.mean(), rtol=1e-13)
            np.testing.assert_allclose(run.saved["prob"].host_data(), prob, rtol=1e-13, atol=1e-300)
            np.testing.assert_allclose(run.saved["loss"].host_data(), loss, rtol=1e-13)
            np.testing.assert_array_equal(run.saved["label"].host_data(), labels)
            (dz, _), _ = run.backward([np.ones(1)])
            want = weight * (prob - np.eye(7)[labels]) / 5
            np.testing.assert_allclose(dz, want.reshape(shape), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("kind", KINDS)
def test_backward_formula(kind):
    """dlogits = loss_weight * top_grad[0] * (prob - onehot) / N, every element, both devices; the
    labels' gradient, when asked for, is zero."""
    rng = np.random.default_rng(1)
    z = rng.standard_normal((3, 4)).astype(np.float32)
    labels = np.array([0, 3, 1], np.int32)
    prob, _ = naive(z, labels)
    onehot = np.eye(4)[labels]
    with new_device(kind, MiB) as device:
        run = new_run(device, z, 2.0, np.float32)
        loss = run.forward([z, labels])[0]
        (dz, dlabel), params = run.backward([np.array([-0.5], np.float32)], [True, True])
    np.testing.assert_allclose(loss[0], 2.0 * naive(z, labels)[1].mean(), rtol=1e-6)
    np.testing.assert_allclose(dz, 2.0 * -0.5 * (prob - onehot) / 3, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(dlabel, 0)
    assert params == {}


@pytest.mark.parametrize("kind", KINDS)
def test_gradients(kind):
    """Central differences on the logits only (wrt=[0]: the int32 labels are not differentiated),
    with loss_weight != 1: the top is the weighted loss, so backward is its exact gradient.
    backward_reads is empty (prob and a label copy are saved): LayerRun withholds both bottoms."""
    rng = np.random.default_rng(2)
    n, k = (4, 5) if kind == "cpu" else (1, 3)   # cuda: N = 1 keeps it to 384 threads a forward
    z = rng.standard_normal((n, k)) * 2
    labels = rng.integers(0, k, n).astype(np.int32)
    samples = GRADCHECK_SAMPLES[kind] if kind == "cpu" else CUDA_SAMPLES
    with new_device(kind, MiB) as device:
        report = check_gradients(device, make(loss_weight=2.5), [z, labels],
                                 wrt=[0], samples=samples)
    assert report.checked == min(samples, z.size) and report.kinks == 0


def test_declarations():
    layer = make()
    assert layer.is_loss and layer.has_backward and layer.backward_reads == frozenset()
    assert layer.setup([(6, 10, 1, 1), (6,)]) == [(1,)]
    assert [(b.name, b.shape, b.dtype) for b in layer.saved()] == [
        ("prob", (6, 10), None), ("loss", (6,), None), ("label", (6,), np.int32)]  # None: run's
    assert layer.params() == [] and layer.workspace() == []
    assert make(loss_weight=3).loss_weight == 3.0


def test_out_of_range_label_gives_nan():
    z = np.zeros((2, 3), np.float32)
    with new_device("cpu", MiB) as device:
        run = new_run(device, z, dtype=np.float32)
        assert np.isnan(run.forward([z, np.array([0, 3], np.int32)])[0][0])


def test_against_torch():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: comparison skipped")
    F = torch.nn.functional
    rng = np.random.default_rng(3)
    z = (rng.standard_normal((8, 10)) * 3).astype(np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    with new_device("cpu", MiB) as device:
        run = new_run(device, z, 0.5, np.float32)
        (loss,) = run.forward([z, labels])
        (dz, _), _ = run.backward([np.ones(1, np.float32)])
    zt = torch.tensor(z, requires_grad=True)
    lt = 0.5 * F.cross_entropy(zt, torch.tensor(labels, dtype=torch.long))
    lt.backward()
    np.testing.assert_allclose(loss[0], lt.item(), rtol=1e-6)
    np.testing.assert_allclose(dz, zt.grad.numpy(), rtol=1e-5, atol=1e-8)


def test_errors():
    prefix = r"^layer loss \(SoftmaxWithLoss\): "
    for shapes, message in [
        ([(4, 3), (3,)], r"bottom 1 \(label\): expected labels \[4\], found \(3,\)$"),
        ([(4, 3), (4, 1)], r"bottom 1 \(label\): expected labels \[4\], found \(4, 1\)$"),
        ([(4, 3, 2, 2), (4,)], r"bottom 0 \(logits\): expected \[N, K\] or \[N, K, 1, 1\], "
                               r"found \(4, 3, 2, 2\)$"),
        ([(4,), (4,)], r"bottom 0 \(logits\): expected a 2-d or 4-d shape, found \(4,\)$"),
    ]:
        with pytest.raises(ShapeError, match=prefix + message):
            make().setup(shapes)
    with pytest.raises(ShapeError, match=prefix + r"bottoms: expected 2 bottom blob\(s\), found 1"):
        LAYERS["SoftmaxWithLoss"]("loss", ["logits"], ["loss"])
    with pytest.raises(ShapeError,
                       match=prefix + "loss_weight: expected a finite number, found nan"):
        make(loss_weight=float("nan"))
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, make(), [(2, 3), (2,)])             # labels fed as float32
        with pytest.raises(ShapeError, match=prefix + r"bottom 1 \(label\): expected int32 labels, "
                                                      r"found float32$"):
            run.forward([np.zeros((2, 3)), np.zeros(2)])
        run = LayerRun(device, make(), [(2, 3), (2,)], bottom_dtypes=[np.float64, np.int32])
        with pytest.raises(ShapeError, match=prefix + r"dtype of prob: expected the logits' "
                                                      r"float64, found float32$"):
            run.forward([np.zeros((2, 3)), np.zeros(2, np.int32)])
