"""Dropout layer: the mask and scaling against a reference drawn from the same seed, the same mask
on both devices, the gradient checker (which relies on LayerRun reseeding the RNG every forward),
test mode as the identity, and the option errors."""
import numpy as np
import pytest

from minilms.device import CpuDevice
from minilms.layers import LAYERS, ShapeError, StepIO
from minilms.layers.gradcheck import check_gradients
from minilms.layers.run import LayerRun

from ..devices import GRADCHECK_SAMPLES, KINDS, new_device

MiB = 2**20


def make(**options):
    return LAYERS["Dropout"]("drop", ["x"], ["y"], **options)


def reference(x, p, seed=0):
    """Inverted dropout with the keep mask ``U >= p`` of the seed's first uniforms."""
    keep = np.random.default_rng(seed).random(x.shape) >= p
    return np.where(keep, x / (1 - p), 0.0), keep


@pytest.mark.parametrize("kind", KINDS)
def test_train_forward_backward_against_reference(kind):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5))
    dy = rng.standard_normal(x.shape)
    with new_device(kind, MiB) as device:
        run = LayerRun(device, make(ratio=0.3), [x.shape], dtype=np.float64, seed=7)
        y = run.forward([x])[0]
        (dx,), params = run.backward([dy])
        mask = run.saved["mask"].host_data().copy()
    want, keep = reference(x, 0.3, seed=7)
    np.testing.assert_allclose(y, want, rtol=1e-15)
    np.testing.assert_array_equal(mask, keep.astype(np.uint8))
    np.testing.assert_allclose(dx, np.where(keep, dy / 0.7, 0.0), rtol=1e-15)
    assert params == {} and 0 < keep.sum() < keep.size


@pytest.mark.cuda
def test_both_devices_drop_the_same_elements():
    x = np.random.default_rng(2).standard_normal((2, 50)).astype(np.float32)
    outs = []
    for kind in ("cpu", "cuda"):
        with new_device(kind, MiB) as device:
            outs.append(LayerRun(device, make(), [x.shape], seed=3).forward([x])[0])
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("kind", KINDS)
def test_gradients(kind):
    """Central differences need every forward to drop the same elements: LayerRun reseeds the RNG
    for each forward, so the mask replays (checked first), and backward uses only the saved mask
    (backward_reads is empty: LayerRun withholds the bottom and the top)."""
    x = np.random.default_rng(4).standard_normal((4, 6))
    with new_device(kind, MiB) as device:
        run = LayerRun(device, make(p=0.4), [x.shape], dtype=np.float64)
        first = run.forward([x])[0]
        np.testing.assert_array_equal(run.forward([x])[0], first)
        report = check_gradients(device, make(p=0.4), [x], samples=GRADCHECK_SAMPLES[kind])
    assert report.kinks == 0


@pytest.mark.parametrize("kind", KINDS)
def test_test_mode_is_the_identity(kind):
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    with new_device(kind, MiB) as device:
        run = LayerRun(device, make(ratio=0.9), [x.shape])
        np.testing.assert_array_equal(run.forward([x], train=False)[0], x)
        assert not np.array_equal(run.forward([x], train=True)[0], x)


def test_test_mode_backward_and_in_place():
    """Backward after a test-mode forward is the identity too; an in-place step (top is the bottom)
    works in both modes."""
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    layer = make(ratio=0.5)
    layer.setup([x.shape])
    dx = np.full_like(x, np.nan)
    layer.backward(StepIO(bottom=[None], top=[None], top_grad=[x], bottom_grad=[dx], train=False))
    np.testing.assert_array_equal(dx, x)
    buf = x.copy()
    layer.forward(StepIO(bottom=[buf], top=[buf], train=False))
    np.testing.assert_array_equal(buf, x)
    mask = np.empty(x.shape, np.uint8)
    layer.forward(StepIO(bottom=[buf], top=[buf], saved={"mask": mask}, train=True,
                         rng=np.random.default_rng(0)))
    np.testing.assert_array_equal(buf, reference(x, 0.5)[0])


def test_ratio_extremes_and_rate():
    x = np.random.default_rng(6).standard_normal((100, 100)).astype(np.float32)
    with CpuDevice(MiB) as device:
        for p in (0.0, 1.0, 0.25):
            run = LayerRun(device, make(ratio=p), [x.shape])
            y = run.forward([x])[0]
            if p == 0.0:
                np.testing.assert_array_equal(y, x)
            elif p == 1.0:
                np.testing.assert_array_equal(y, 0)
            else:
                dropped = np.mean(y == 0)
                assert abs(dropped - p) < 0.02                   # 10,000 draws: 4.6 sigma
                np.testing.assert_allclose(y[y != 0], x[y != 0] / 0.75, rtol=1e-6)


def test_declarations():
    layer = make()
    assert layer.ratio == 0.5
    assert layer.setup([(2, 3, 4, 4)]) == [(2, 3, 4, 4)]
    (mask,) = layer.saved()
    assert (mask.name, mask.shape, mask.dtype) == ("mask", (2, 3, 4, 4), np.uint8)
    assert layer.backward_reads == frozenset() and layer.params() == [] and layer.workspace() == []
    assert make(p=0.2).ratio == 0.2


def test_option_errors():
    prefix = r"^layer drop \(Dropout\): "
    for options, message in [(dict(ratio=1.5), "ratio: expected a probability in \\[0, 1\\], "
                                                "found 1.5$"),
                             (dict(p=-0.1), "ratio: expected a probability in \\[0, 1\\], "
                                            "found -0.1$"),
                             (dict(ratio="half"), "ratio: expected a probability .*found 'half'$"),
                             (dict(ratio=0.1, p=0.2), "ratio: expected ratio or p, not both, found "
                                                      "ratio=0.1, p=0.2$")]:
        with pytest.raises(ShapeError, match=prefix + message):
            make(**options)
    with pytest.raises(ShapeError, match=prefix + r"bottom 0 \(x\): expected at least a 1-d shape"):
        make().setup([()])


@pytest.mark.cuda
def test_in_place_on_cuda():
    from numba import cuda
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    layer = make(ratio=0.5)
    layer.setup([x.shape])
    buf, mask = cuda.to_device(x), cuda.device_array(x.shape, np.uint8)
    layer.forward(StepIO(bottom=[buf], top=[buf], train=False))
    np.testing.assert_array_equal(buf.copy_to_host(), x)
    layer.forward(StepIO(bottom=[buf], top=[buf], saved={"mask": mask}, train=True,
                         rng=np.random.default_rng(0)))
    np.testing.assert_array_equal(buf.copy_to_host(), reference(x, 0.5)[0])
