"""Accuracy layer: top-k hit rate against a naive count (ties in the label's favour) on both
devices, float tops from an int32 count, PyTorch's topk, declarations and errors."""
import numpy as np
import pytest

from minilms.layers import LAYERS, ShapeError
from minilms.layers.run import LayerRun

from ..devices import KINDS, new_device

MiB = 2**20


def make(**options):
    return LAYERS["Accuracy"]("acc", ["logits", "label"], ["accuracy"], **options)


def naive_rate(z, labels, k):
    z = z.reshape(len(z), -1)
    hits = 0
    for row, label in zip(z, labels):
        if 0 <= label < len(row):
            hits += sum(1 for v in row if v > row[label]) < k
    return hits / len(z)


def run_accuracy(device, z, labels, dtype=np.float32, **options):
    run = LayerRun(device, make(**options), [z.shape, labels.shape], dtype=dtype,
                   bottom_dtypes=[dtype, np.int32])
    return run.forward([z, labels])[0]


@pytest.mark.parametrize("kind", KINDS)
def test_against_naive(kind):
    rng = np.random.default_rng(0)
    z = rng.standard_normal((7, 5)).astype(np.float32)
    z[0] = 1.0                                     # a full tie: counts as a hit (Caffe's rule)
    labels = rng.integers(0, 5, 7).astype(np.int32)
    labels[1] = 5                                  # out of range: a miss
    labels[2] = np.argmax(z[2])                    # at least one top-1 hit
    with new_device(kind, MiB) as device:
        for k in ((1, 3) if kind == "cpu" else (2,)):
            top = run_accuracy(device, z, labels, top_k=k)
            assert top.shape == (1,) and top.dtype == np.float32
            assert top[0] == np.float32(naive_rate(z, labels, k))
            assert 0 < top[0] < 1
        top = run_accuracy(device, z.reshape(7, 5, 1, 1).astype(np.float64), labels, np.float64,
                           top_k=5)
        assert top.dtype == np.float64 and top[0] == 6 / 7    # all but the out-of-range label


def test_declarations():
    layer = make(top_k=2)
    assert layer.setup([(8, 10), (8,)]) == [(1,)]
    assert not layer.has_backward and layer.backward_reads == frozenset() and not layer.is_loss
    assert [(b.name, b.shape, b.dtype) for b in layer.workspace()] == [("count", (1,), np.int32)]
    assert layer.params() == [] and layer.saved() == []
    with pytest.raises(NotImplementedError):
        layer.backward(None)


def test_against_torch():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: comparison skipped")
    rng = np.random.default_rng(1)
    z = rng.standard_normal((20, 6)).astype(np.float32)        # continuous: no ties
    labels = rng.integers(0, 6, 20).astype(np.int32)
    with new_device("cpu", MiB) as device:
        for k in (1, 2, 6):
            top = run_accuracy(device, z, labels, top_k=k)
            idx = torch.topk(torch.tensor(z), k, dim=1).indices.numpy()
            want = np.mean([label in row for row, label in zip(idx, labels)])
            assert top[0] == np.float32(want)


def test_errors():
    prefix = r"^layer acc \(Accuracy\): "
    for options, message in [(dict(top_k=0), "top_k: expected an int >= 1, found 0$"),
                             (dict(top_k=1.5), "top_k: expected an int >= 1, found 1.5$")]:
        with pytest.raises(ShapeError, match=prefix + message):
            make(**options)
    for shapes, options, message in [
        ([(4, 3), (4,)], dict(top_k=4),
         "top_k: expected at most the 3 classes of bottom 0, found 4$"),
        ([(4, 3), (5,)], {}, r"bottom 1 \(label\): expected labels \[4\], found \(5,\)$"),
        ([(4, 3, 2), (4,)], {},
         r"bottom 0 \(logits\): expected a 2-d or 4-d shape, found \(4, 3, 2\)$"),
        ([(4, 3, 1, 2), (4,)], {}, r"bottom 0 \(logits\): expected \[N, K\] or \[N, K, 1, 1\]"),
        ([(0, 3), (0,)], {}, r"bottom 0 \(logits\): expected at least one sample and one class, "
                             r"found \(0, 3\)$"),
    ]:
        with pytest.raises(ShapeError, match=prefix + message):
            make(**options).setup(shapes)
    with new_device("cpu", MiB) as device:
        with pytest.raises(ShapeError, match=prefix + r"bottom 1 \(label\): expected int32 labels, "
                                                      r"found float32$"):
            LayerRun(device, make(), [(2, 3), (2,)]).forward([np.zeros((2, 3)), np.zeros(2)])
