"""Gradients a layer adds in itself (``Layer.adds_bottom_grad``, ``Step.adds``): where a blob
feeds two layers, the second backward to run adds its gradient into the first's instead of
writing a partial gradient that a separate pass then adds. A 1x1 convolution set up for the
``cpu`` device does (its GEMM's beta = 1); nothing else, and nothing on a net set up for another
device or for either.

The net has no partial gradient blob where a layer adds; training gives the weights that the
partial gradients give within float tolerance (adding inside the GEMM rounds its inner sums'
blocks into what is there); LMS on, in small pools, with steps split along the batch or not,
gives LMS off's weights of the same net (bit for bit unsplit); random nets with random splits
train as LMS off (and replay correctly: ``test_substeps``, on nets set up for the cpu device
too)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms import zoo
from minilms.device import make_device
from minilms.layers import LAYERS, StepIO
from minilms.lms import LmsExecutor, Policy, cost, least_pool
from minilms.lms.bounds import working_set_bytes
from minilms.lms.executor import ResidentExecutor
from minilms.lms.substeps import split_schedule
from minilms.net import Net
from minilms.solver import SGD

from .test_executor import batch
from .test_lms import assert_identical, train
from .test_substeps import assert_close, random_counts, random_nets, split_all

MiB = 2**20
RESNET50 = zoo.resnet(50, num_classes=4, width=16)


def net_for(layers, inputs, kind):
    return Net(layers, {k: (v.shape, v.dtype) for k, v in inputs.items()}, device_kind=kind)


def solver():
    return SGD(0.05, momentum=0.9, weight_decay=1e-4)


def resident(layers, batches, kind, iterations=2):
    with make_device("cpu", 256 * MiB) as device:
        return train(ResidentExecutor(net_for(layers, batches[0], kind), device, solver()),
                     batches, iterations)


def test_a_1x1_convolution_at_a_fork_adds_in_its_input_gradient():
    """ResNet-50's 16 block inputs each feed a 1x1 convolution second (in backward order): set
    up for the cpu device, those steps add into the gradient and no partial blob exists; set
    up for either device, each writes a partial that a pass adds."""
    inputs = batch(2, 3, 32, classes=4)
    on_cpu = net_for(RESNET50, inputs, "cpu")
    steps = on_cpu.schedule(("momentum",))
    adding = [s for s in steps if s.adds]
    assert len(adding) == 16 and not any(s.accumulate for s in steps)
    for step in adding:
        assert on_cpu.layer[step.layer].type == "Convolution"
        assert on_cpu.layer[step.layer].kernel_size == (1, 1)
        (grad,) = step.adds
        assert grad in step.updates and grad not in step.writes
    assert not any("@" in name for name in on_cpu.blobs)
    either = net_for(RESNET50, inputs, None)
    partials = [s for s in either.schedule(("momentum",)) if s.accumulate]
    assert [s.layer for s in partials] == [s.layer for s in adding]
    assert sum(1 for name in either.blobs if "@" in name) == 16


def test_adding_trains_as_the_partial_gradients_do():
    """An iteration of ResNet-50/16: the net whose convolutions add gives the weights of the
    one with partial gradients within float tolerance (not always the same bits: where the
    inner dimension is long, the GEMM adds its blocks' sums into what is there one by one)."""
    batches = [batch(2, 3, 32, classes=4, seed=s) for s in (0, 1)]
    assert_close(resident(RESNET50, batches, "cpu", 1), resident(RESNET50, batches, None, 1))


@pytest.mark.parametrize("policy, fraction", [(Policy(), 1.0), (Policy(prefetch=2), 1.3),
                                              (Policy(policy="auto"), 1.0)])
def test_lms_on_with_adds_is_lms_off_bit_for_bit(policy, fraction):
    """In the least pool (and a little more, prefetching), the gradients that are added into
    travel like any other: LMS on gives LMS off's losses and weights bit for bit."""
    batches = [batch(2, 3, 32, classes=4, seed=s) for s in (0, 1)]
    net = net_for(RESNET50, batches[0], "cpu")
    steps = net.schedule(("momentum",))
    capacity = int(least_pool(net, steps, policy) * fraction)
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(net, device, solver(), policy)
        assert any(a.copies for _, a in executor.plan.actions())
        got = train(executor, batches, 2)
    assert_identical(got, resident(RESNET50, batches, "cpu"))


def test_split_steps_add_their_chunks(monkeypatch):
    """Every step that can split in chunks of one sample, the adding convolutions' too: each
    chunk adds into its rows of the gradient, and one iteration gives LMS off's weights within
    the tolerance a split's regrouped sums allow."""
    def split_everything(net, steps, capacity, policy, plan, **weigh):
        return plan(split_all(net, steps, 2, any(s.kind == "backward" for s in steps)))
    monkeypatch.setattr(cost, "plan_split", split_everything)
    batches = [batch(2, 3, 32, classes=4, seed=s) for s in (0, 1)]
    net = net_for(RESNET50, batches[0], "cpu")
    split = split_all(net, net.schedule(("momentum",)), 2)
    assert any(s.adds and s.part is not None and s.part.chunk for s in split)
    capacity = max(working_set_bytes(net, s) for s in split) * 3
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(net_for(RESNET50, batches[0], "cpu"), device, solver(), Policy())
        assert executor.plan.chunks
        got = train(executor, batches, 1)
    assert_close(got, resident(RESNET50, batches, "cpu", 1))


def test_a_convolution_refuses_to_add_where_its_engine_cannot():
    """Adding needs the cpu engine's 1x1 path on float32: asked of a 3x3 (or of float64, the
    gradient checks' dtype), the layer says so instead of overwriting what is there."""
    conv = LAYERS["Convolution"]("c3", ["x"], ["y"], num_output=2, kernel_size=3, pad=1)
    conv.setup([(1, 2, 5, 5)], device_kind="cpu")
    assert not conv.adds_bottom_grad
    x, dy = np.ones((1, 2, 5, 5), np.float32), np.ones((1, 2, 5, 5), np.float32)
    params = {p.name: p.initial(np.random.default_rng(0)) for p in conv.params()}
    io = StepIO(bottom=[x], top=[None], params=params, top_grad=[dy],
                bottom_grad=[np.zeros_like(x)],
                param_grad={k: np.empty_like(v) for k, v in params.items()},
                work={b.name: np.empty(b.shape, b.dtype_in(np.float32))
                      for b in conv.workspace()}, adds=frozenset({0}))
    with pytest.raises(ValueError, match="c3: adding into the input gradient"):
        conv.backward(io)
    one = LAYERS["Convolution"]("c1", ["x"], ["y"], num_output=2, kernel_size=1)
    one.setup([(1, 2, 5, 5)], device_kind="cpu")
    assert one.adds_bottom_grad
    for kind in (None, "cuda"):
        one.setup([(1, 2, 5, 5)], device_kind=kind)
        assert not one.adds_bottom_grad


@settings(max_examples=25, deadline=None)
@given(spec=random_nets(), data=st.data())
def test_random_nets_that_add_train_as_lms_off(spec, data):
    """Random nets set up for the cpu device with random steps split: one iteration gives LMS
    off's loss and weights (the same net's) within ``assert_close``'s tolerance."""
    layers, n, c, size = spec
    inputs = batch(n, c, size, classes=3, seed=data.draw(st.integers(0, 99)))
    net = net_for(layers, inputs, "cpu")
    counts = random_counts(data, net, net.schedule(("momentum",)))

    def split_these(net, steps, capacity, policy, plan, **weigh):
        train_steps = any(s.kind == "backward" for s in steps)
        return plan(split_schedule(net, steps, counts if train_steps else {}, train_steps))
    with pytest.MonkeyPatch.context() as patch, make_device("cpu", 64 * MiB) as device:
        patch.setattr(cost, "plan_split", split_these)
        executor = LmsExecutor(net_for(layers, inputs, "cpu"), device, solver(), Policy())
        got = train(executor, [inputs], iterations=1)
    assert_close(got, resident(layers, [inputs], "cpu", 1))
