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


class _Copy:
    """A fake copy's event: done when the test says the device got there."""

    def __init__(self, log):
        self.log, self.done = log, False

    def record(self, stream):
        self.done = False

    def query(self):
        return self.done

    def synchronize(self):
        self.log.append("wait")
        self.done = True


class _Device:
    """A fake device array: keeps what each copy brought."""

    def __init__(self):
        self.copies = []

    def copy_to_device(self, host, stream=0):
        self.copies.append(np.array(host))


def _staging():
    from minilms.layers.dropout import MaskStaging
    log, events = [], []

    def event():
        events.append(_Copy(log))
        return events[-1]

    return MaskStaging(pinned=lambda size: np.zeros(size, np.uint8), event=event), log, events


def test_mask_staging_adds_a_buffer_rather_than_wait_for_a_pending_copy():
    """The host draws masks ahead of the device (the next iteration issued before this one ran,
    a chunk's mask after another's): no buffer whose copy is pending is redrawn, and the host
    waits only when every one of ``MAX_BUFFERS`` is still pending, for the oldest."""
    staging, log, events = _staging()
    dst = _Device()
    taken = []
    for value in range(staging.MAX_BUFFERS):
        host = staging.take((2, 3))
        host[...] = value
        staging.copy(host, dst)
        taken.append(host)
    assert log == [] and len(staging.buffers) == staging.MAX_BUFFERS
    assert len({h.__array_interface__["data"][0] for h in taken}) == staging.MAX_BUFFERS
    assert [int(c[0, 0]) for c in dst.copies] == list(range(staging.MAX_BUFFERS))
    # all pending: the next take waits for the oldest copy and reuses that buffer
    again = staging.take((2, 3))
    assert log == ["wait"] and staging.waits == 1 and events[0].done
    assert again.__array_interface__["data"][0] == taken[0].__array_interface__["data"][0]
    staging.copy(again, dst)
    # the device catches up: buffers are reused in turn, none added, no wait
    for event in events:
        event.done = True
    for _ in range(2 * staging.MAX_BUFFERS):
        staging.copy(staging.take((2, 3)), dst)
        events[(staging.current) % len(events)].done = True
    assert log == ["wait"] and len(staging.buffers) == staging.MAX_BUFFERS


def test_mask_staging_keeps_the_order_of_the_pending_copies():
    """A buffer added while the oldest is pending goes before it: the oldest stays next."""
    staging, log, events = _staging()
    dst = _Device()
    first = staging.take((4,))
    staging.copy(first, dst)
    second = staging.take((4,))            # first pending: a second buffer
    staging.copy(second, dst)
    events[0].done = True                  # the first copy is done, the second is not
    third = staging.take((4,))
    assert third.__array_interface__["data"][0] == first.__array_interface__["data"][0]
    staging.copy(third, dst)
    fourth = staging.take((4,))            # second and third pending: a third buffer
    assert len(staging.buffers) == 3 and log == []
    assert fourth.__array_interface__["data"][0] not in {
        a.__array_interface__["data"][0] for a in (second, third)}


def test_mask_staging_waits_for_every_copy_before_growing():
    """A larger mask takes new buffers; the copies pending from the old ones finish first."""
    staging, log, _ = _staging()
    dst = _Device()
    for _ in range(3):
        staging.copy(staging.take((2, 2)), dst)
    big = staging.take((3, 3))
    assert log == ["wait"] * 3 and big.shape == (3, 3) and len(staging.buffers) == 1
