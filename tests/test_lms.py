"""The LMS executor: training under a plan gives exactly the weights of LMS off, in a pool that LMS
off cannot use; the copies it makes are the plan's, none redundant; plans are cached per shape."""
import numpy as np
import pytest

from minilms import events, zoo
from minilms.device import make_device
from minilms.errors import OutOfDeviceMemory, PlanError
from minilms.lms import LmsExecutor, Policy, least_pool, resident_bytes
from minilms.lms.executor import ResidentExecutor
from minilms.net import Net
from minilms.solver import SGD, Adam

from .devices import new_device
from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)
from .test_executor import RESIDUAL_INCEPTION, batch

MiB = 2**20

# The residual + inception net with BatchNorm (running statistics: state updated in forward) and
# Dropout (the host RNG: LMS must not change the order of draws).
DAG = ([dict(RESIDUAL_INCEPTION[0], top="c0"),
        {"name": "bn1", "type": "BatchNorm", "bottom": "c0", "top": "c1"}]
       + RESIDUAL_INCEPTION[1:7]
       + [{"name": "drop", "type": "Dropout", "bottom": "pool", "top": "pool", "ratio": 0.3}]
       + RESIDUAL_INCEPTION[7:])


# convolution, ReLU, pooling, inner product: small enough for the cuda simulator to train
TINY = [
    {"name": "conv", "type": "Convolution", "bottom": "data", "top": "c", "num_output": 2,
     "kernel_size": 3, "pad": 1},
    {"name": "relu", "type": "ReLU", "bottom": "c", "top": "c"},
    {"name": "pool", "type": "Pooling", "bottom": "c", "top": "p", "pool": "max",
     "kernel_size": 2},
    {"name": "fc", "type": "InnerProduct", "bottom": "p", "top": "fc", "num_output": 3},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"},
]


def make_net(layers, inputs):
    return Net(layers, {k: (v.shape, v.dtype) for k, v in inputs.items()})


def train(executor, batches, iterations=3):
    losses = [executor.iterate(batches[i % len(batches)])["loss"] for i in range(iterations)]
    if isinstance(executor, LmsExecutor):
        executor.sync_state()
        blobs = executor.shared
    else:
        blobs = executor.blobs
    return losses, {name: b.host_data().copy() for name, b in blobs.items()
                    if b.role in ("param", "optimizer_state")}


def reference(layers, batches, solver, kind="cpu", iterations=3):
    with new_device(kind, 64 * MiB) as device:
        return train(ResidentExecutor(make_net(layers, batches[0]), device, solver()), batches,
                     iterations)


def assert_identical(got, expected):
    assert np.isfinite(expected[0]).all()
    assert got[0] == expected[0]                      # losses, bit for bit
    assert got[1].keys() == expected[1].keys()
    for name, value in expected[1].items():
        np.testing.assert_array_equal(got[1][name], value, err_msg=name)


POLICIES = {
    "default": Policy(),
    "prefetch 2": Policy(prefetch=2),
    "tuned": Policy(limit=1 << 40, min_swap_bytes=1024, prefetch=1),
    "keep state": Policy(limit=1 << 40, keep_state=True, prefetch=3),
    "soft limit": Policy(start_fraction=0.5, prefetch=1),
    "auto": Policy(policy="auto"),
    "off": Policy(enabled=False),
}


@pytest.mark.parametrize("net_name, layers, shape", [
    ("residual+inception", DAG, (2, 2, 6, 3)),
    ("resnet18/16", zoo.resnet(18, num_classes=4, width=16), (4, 3, 32, 4)),
    ("googlenet/32", zoo.googlenet(num_classes=4, width=32), (2, 3, 64, 4)),
])
@pytest.mark.parametrize("solver_name", ["sgd", "adam"])
def test_lms_gives_the_weights_of_lms_off(net_name, layers, shape, solver_name):
    """Three iterations on two alternating batches under every knob setting, each in the least
    pool its policy needs: weights, optimizer state and losses are
    bit-identical to the resident executor's."""
    solver = (lambda: SGD(0.05, momentum=0.9, weight_decay=1e-4)) if solver_name == "sgd" \
        else (lambda: Adam(1e-3))
    batches = [batch(*shape, seed=s) for s in (0, 1)]
    assert all(np.isfinite(reference(layers, batches, solver, iterations=1)[0]))
    expected = reference(layers, batches, solver)
    net = make_net(layers, batches[0])
    steps = net.schedule(tuple(solver().state_names))
    for label, policy in POLICIES.items():
        if not policy.enabled:
            capacity = resident_bytes(net, steps)
        elif policy.policy == "auto":
            capacity = int(1.5 * least_pool(net, steps))
        else:
            capacity = least_pool(net, steps, policy)
        with make_device("cpu", capacity) as device:
            executor = LmsExecutor(make_net(layers, batches[0]), device, solver(), policy)
            got = train(executor, batches)
        assert_identical(got, expected)


def test_capacity_32x_the_batch_of_lms_off():
    """Caffe's scenarios at this machine's size: a deep ResNet (ResNet-50 at 1/8 width, 32x32
    images; the convolution workspace scaled down with it, 64 KiB). In a 6.5 MiB pool LMS off
    trains batch 2 and runs out at batch 4 with an error naming the step; LMS on trains batch 64
    in the same pool, with the weights LMS off gets from a pool large enough for it."""
    layers = zoo.resnet(50, num_classes=4, width=8)
    for layer in layers:
        if layer["type"] == "Convolution":
            layer["max_workspace"] = 64 * 1024
    capacity = int(6.5 * MiB)
    small, large = batch(2, 3, 32, classes=4), batch(64, 3, 32, classes=4)
    with make_device("cpu", capacity) as device:
        LmsExecutor(make_net(layers, small), device, SGD(0.01, momentum=0.9),
                    Policy(enabled=False)).iterate(small)
    with make_device("cpu", capacity) as device:
        with pytest.raises(PlanError, match=r"out of device memory at step \d+ \((forward|backward"
                                            r"|update) \w+\): LMS off keeps every blob resident"):
            LmsExecutor(make_net(layers, batch(4, 3, 32)), device, SGD(0.01, momentum=0.9),
                        Policy(enabled=False))
        with pytest.raises(OutOfDeviceMemory, match="LMS off needs every blob resident"):
            ResidentExecutor(make_net(layers, batch(4, 3, 32)), device, SGD(0.01, momentum=0.9))
    expected = reference(layers, [large], lambda: SGD(0.01, momentum=0.9), iterations=2)
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(make_net(layers, large), device, SGD(0.01, momentum=0.9),
                               Policy(policy="auto"))
        assert executor.plan.peak <= capacity
        assert_identical(train(executor, [large], iterations=2), expected)


def test_least_pool_is_enough_and_five_percent_less_is_not_unless_steps_split():
    layers = zoo.resnet(18, num_classes=4, width=16)
    inputs = batch(8, 3, 32, classes=4)
    net = make_net(layers, inputs)
    least = least_pool(net, net.schedule(("momentum",)))
    with make_device("cpu", least) as device:
        executor = LmsExecutor(make_net(layers, inputs), device, SGD(0.01, momentum=0.9))
        losses = [executor.iterate(inputs)["loss"] for _ in range(2)]
        assert device.pool.peak <= least and np.isfinite(losses).all()
    with make_device("cpu", int(least * 0.95)) as device:
        with pytest.raises(PlanError, match=r"^out of device memory at step \d+ \(.+\): its "
                                            r"working set needs .*, capacity .*: raise device"):
            LmsExecutor(make_net(layers, inputs), device, SGD(0.01, momentum=0.9),
                        Policy(split="off"))
        # unless a step may run in chunks of samples (lms.split: auto, the default)
        executor = LmsExecutor(make_net(layers, inputs), device, SGD(0.01, momentum=0.9))
        assert "split along the batch" in executor.plan.notes[-1]


@pytest.mark.parametrize("policy", [Policy(), Policy(prefetch=3), Policy(policy="auto")],
                         ids=["default", "prefetch", "auto"])
def test_copies_are_the_plans_and_none_is_redundant(policy):
    """From the event stream of a second iteration (the prologue is done): bytes H2D and D2H equal
    the plan's; no D2H of a blob whose host copy is still current (no device write since it was
    last copied home), no H2D into a device copy that is still valid."""
    layers = zoo.resnet(18, num_classes=4, width=16)
    inputs = batch(4, 3, 32, classes=4)
    net = make_net(layers, inputs)
    capacity = int(1.3 * least_pool(net, net.schedule(("momentum",))))
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(make_net(layers, inputs), device, SGD(0.01, momentum=0.9), policy)
        executor.iterate(inputs)
        host_current = set(executor.blobs)        # the start of an iteration: homes are current
        with events.listen() as got:
            executor.iterate(inputs)
        plan = executor.plan
    moved = {"h2d": 0, "d2h": 0}
    on_device = set(plan.pinned) - set(plan.host_inputs)
    for event in got:
        who = event.who
        if event.kind == "h2d":
            assert who not in on_device, f"{who} loaded while valid on the device"
            on_device.add(who)
        elif event.kind == "d2h":
            assert who not in host_current, f"{who} copied home with no device write since"
            host_current.add(who)
        elif event.kind == "state" and event.detail["after"] == "device":
            on_device.add(who)
            host_current.discard(who)
        elif event.kind in ("free", "drop"):
            on_device.discard(who)
        if event.kind in moved:
            moved[event.kind] += event.nbytes
    assert moved == {"h2d": plan.bytes_moved("h2d"), "d2h": plan.bytes_moved("d2h")}
    assert moved["h2d"] > 0


def test_a_smaller_last_batch_gets_its_own_plan():
    """Batches of 4, 4, 3, 4, then an evaluation: three plans (the two training shapes and the
    forward-only one), and the numbers of LMS off, which switches between shapes the same way."""
    layers = zoo.resnet(18, num_classes=4, width=16)
    batches = [batch(4, 3, 32, 4, 0), batch(4, 3, 32, 4, 1), batch(3, 3, 32, 4, 2),
               batch(4, 3, 32, 4, 3)]
    results = {}
    net = make_net(layers, batches[0])
    tight = least_pool(net, net.schedule(("momentum",)))
    for label, capacity, policy in (("off", 64 * MiB, Policy(enabled=False)),
                                    ("lms", tight, Policy(prefetch=1))):
        with make_device("cpu", capacity) as device:
            executor = LmsExecutor(make_net(layers, batches[0]), device, SGD(0.05, momentum=0.9),
                                   policy)
            losses = [executor.iterate(b)["loss"] for b in batches]
            evaluation = executor.iterate(batches[0], train=False)
            assert len(executor.programs) == 3 and set(evaluation) == {"loss", "accuracy"}
            results[label] = train(executor, batches[:1], iterations=1), losses, evaluation
    assert results["lms"][1] == results["off"][1] and results["lms"][2] == results["off"][2]
    assert_identical(results["lms"][0], results["off"][0])
    with make_device("cpu", 64 * MiB) as device:   # the first two agree with the reference too
        resident = ResidentExecutor(make_net(layers, batches[0]), device, SGD(0.05, momentum=0.9))
        assert [resident.iterate(b)["loss"] for b in batches[:2]] == results["lms"][1][:2]


@pytest.mark.cuda
@pytest.mark.usefixtures("small_gemm_tile")
def test_cuda_lms_gives_the_weights_of_lms_off():
    """A tiny net on the cuda device (the simulator without a GPU), in its least pool, with
    prefetch: two iterations give the resident executor's weights exactly."""
    layers = TINY
    inputs = batch(1, 1, 4, classes=3)
    expected = reference(layers, [inputs], lambda: SGD(0.1, momentum=0.9), "cuda", iterations=2)
    net = make_net(layers, inputs)
    capacity = least_pool(net, net.schedule(("momentum",)), Policy(prefetch=1))
    with new_device("cuda", capacity) as device:
        executor = LmsExecutor(make_net(layers, inputs), device, SGD(0.1, momentum=0.9),
                               Policy(prefetch=1))
        assert any(a.copies for _, a in executor.plan.actions())
        assert_identical(train(executor, [inputs], iterations=2), expected)


@pytest.mark.limit_device_memory("673 KiB")
def test_default_lms_uses_the_least_pool_even_in_a_large_one():
    """Caffe's default favours reuse over allocation: in a 64 MiB pool, ResNet-18/16 at batch 4
    trains with the device never holding more than the least pool (673 KiB, which
    ``least_pool`` reports for this net), as the trace of the whole test shows (the marker)."""
    layers = zoo.resnet(18, num_classes=4, width=16)
    inputs = batch(4, 3, 32, classes=4)
    with make_device("cpu", 64 * MiB) as device:
        executor = LmsExecutor(make_net(layers, inputs), device, SGD(0.01, momentum=0.9))
        net = make_net(layers, inputs)
        assert executor.plan.peak == least_pool(net, net.schedule(("momentum",)))
        for _ in range(2):
            executor.iterate(inputs)


def test_a_step_waits_for_a_prefetch_still_landing_in_space_it_reuses():
    """A prefetch whose blob is evicted before its step comes may still be copying when its
    space is given to another blob: the step that writes there must wait for that copy, and a
    step that writes elsewhere must not. (Found by the quickstart on a loaded machine: the copy
    thread fell behind and a late prefetch overwrote a fresh activation, and the loss became
    NaN.)"""
    from minilms.lms.plan import Action, Plan, StepPlan
    from minilms.lms.replay import Program
    from minilms.net import Step

    def program(offset):
        prefetch = Action.make("swap_in", "x", 64, 0, 256, for_step=2)
        steps = [StepPlan(Step(0, "forward", "a"), [], [], [prefetch]),
                 StepPlan(Step(1, "forward", "b", writes=("y",)),
                          [Action.make("drop", "x", 64, 0, 256)],
                          [Action.make("alloc", "y", 64, offset, 256)], [])]
        made = Program(None, Plan(Policy(), 4096, {}, {}, [], steps, []), {}, True)
        return made, made.sequence_of[id(prefetch)]
    reused, copy = program(0)
    assert copy == ("h2d", 1) and reused.copying[1][2] == (copy,)
    elsewhere, _ = program(1024)
    assert elsewhere.copying[1][2] == ()
