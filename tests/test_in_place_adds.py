"""Residual adds in place (an Eltwise whose top is one of its bottoms, as the zoo's ResNets write
them): the same numbers as an add with a top of its own, one blob fewer each, LMS on = LMS off."""
import pytest

from minilms import zoo
from minilms.device import make_device
from minilms.lms import (
    LmsExecutor,
    Policy,
    ResidentExecutor,
    check_plan,
    least_pool,
    resident_bytes,
)
from minilms.net import Net
from minilms.solver import SGD

from .devices import new_device
from .test_executor import batch
from .test_lms import assert_identical, train

MiB = 2**20


def shapes(inputs):
    return {k: (v.shape, v.dtype) for k, v in inputs.items()}


def solver():
    return SGD(0.05, momentum=0.9)


def lms_off(layers, inputs, fuse, iterations=2, kind="cpu"):
    with new_device(kind, 64 * MiB) as device:
        net = Net(layers, shapes(inputs[0]), device_kind=kind, fuse=fuse)
        return train(ResidentExecutor(net, device, solver()), inputs, iterations)


def three_way_add(in_place: bool, relu: bool, coeffs=(1.0, -2.0, 0.5)) -> list:
    """Three convolutions summed with coefficients, the sum in place over the middle one (the
    gradient that shares the top's is then not the last one the layer writes in order)."""
    conv = {"type": "Convolution", "bottom": "data", "num_output": 3, "kernel_size": 3, "pad": 1}
    layers = [dict(conv, name=name, top=name) for name in ("a", "b", "c")]
    top = "b" if in_place else "sum"
    layers.append({"name": "sum", "type": "Eltwise", "bottom": ["a", "b", "c"], "top": top,
                   "coeffs": list(coeffs)})
    if relu:
        layers.append({"name": "sum_relu", "type": "ReLU", "bottom": top, "top": top})
    layers += [{"name": "fc", "type": "InnerProduct", "bottom": top, "top": "fc",
                "num_output": 4},
               {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"],
                "top": "loss"}]
    return layers


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("fuse", ["none", "all"])
def test_an_add_in_place_over_its_middle_bottom_trains_as_the_add_apart(relu, fuse):
    inputs = [batch(2, 2, 6, classes=4, seed=s) for s in (0, 1)]
    expected = lms_off(three_way_add(False, relu), inputs, fuse)
    in_place = Net(three_way_add(True, relu), shapes(inputs[0]), fuse=fuse)
    assert "sum" not in in_place.blobs
    assert in_place.layer["sum"].relu == (relu and fuse == "all")
    assert_identical(lms_off(three_way_add(True, relu), inputs, fuse), expected)


@pytest.mark.cuda
@pytest.mark.simulator_slow
def test_a_fused_add_in_place_trains_as_the_add_apart_on_cuda():
    """The CUDA kernels too: the sum over its own bottom, the gradient that shares the top's
    written last (under the simulator about 100 s: --runslow)."""
    inputs = [batch(2, 2, 6, classes=4, seed=s) for s in (0, 1)]
    expected = lms_off(three_way_add(False, True), inputs, "all", kind="cuda")
    assert_identical(lms_off(three_way_add(True, True), inputs, "all", kind="cuda"), expected)


def test_a_relu_after_an_add_in_place_folds_into_it():
    inputs = batch(2, 2, 6, classes=4)
    net = Net(three_way_add(True, relu=True), shapes(inputs), fuse="all")
    assert net.fused == {"sum_relu": "sum"}
    assert net.layer["sum"].relu and net.layer["sum"].backward_reads == {"top"}
    assert Net(three_way_add(True, relu=True), shapes(inputs), fuse="auto").fused == {}


@pytest.mark.parametrize("depth", [18, 50])
def test_a_resnet_with_its_adds_in_place_trains_as_with_adds_apart(depth):
    """Bit for bit, fused and not; one blob (and its gradient) fewer per block."""
    inputs = [batch(2, 3, 32, classes=4, seed=s) for s in (0, 1)]
    apart = zoo.resnet(depth, num_classes=4, width=16, in_place_adds=False)
    in_place = zoo.resnet(depth, num_classes=4, width=16)
    for fuse in ("none", "all"):
        assert_identical(lms_off(in_place, inputs, fuse), lms_off(apart, inputs, fuse))
    nets = [Net(layers, shapes(inputs[0]), fuse="all") for layers in (apart, in_place)]
    adds = [layer for layer in nets[0].layers if layer.type == "Eltwise"]
    assert len(nets[0].blobs) - len(nets[1].blobs) == len(adds)
    assert all(add.top[0] == add.bottom[1] for add in nets[1].layers if add.type == "Eltwise")
    saved = sum(nets[0].blobs[add.top[0]].nbytes for add in adds)
    resident = [resident_bytes(net, net.schedule(("momentum",))) for net in nets]
    assert resident[0] - resident[1] == 2 * saved        # each add's top and its gradient


def test_a_preact_resnet_with_its_adds_in_place_trains_as_with_adds_apart():
    inputs = [batch(2, 3, 16, classes=4, seed=s) for s in (0, 1)]
    apart = zoo.preact_resnet(20, num_classes=4, width=4, in_place_adds=False)
    in_place = zoo.preact_resnet(20, num_classes=4, width=4)
    assert_identical(lms_off(in_place, inputs, "all"), lms_off(apart, inputs, "all"))


@pytest.mark.parametrize("policy", [Policy(), Policy(prefetch=2), Policy(policy="auto"),
                                    Policy(recompute=("BatchNorm", "Eltwise")),
                                    Policy(recompute=("Convolution", "BatchNorm"), prefetch=1)],
                         ids=["default", "prefetch 2", "auto", "recompute bn+add",
                              "recompute conv+bn"])
def test_a_resnet_with_adds_in_place_under_lms_gives_lms_offs_weights(policy):
    """Swapped and recomputed around blobs the adds update in place, in the least pool the
    policy needs (``auto``: 1.5 times it). An add in place is re-run after the layer that wrote
    its blob, so ``recompute`` names both."""
    inputs = [batch(4, 3, 32, classes=4, seed=s) for s in (0, 1)]
    layers = zoo.resnet(18, num_classes=4, width=16)
    expected = lms_off(layers, inputs, "all", iterations=3)
    net = Net(layers, shapes(inputs[0]), fuse="all")
    steps = net.schedule(("momentum",))
    capacity = int(1.5 * least_pool(net, steps)) if policy.policy == "auto" else \
        least_pool(net, steps, policy)
    assert capacity < resident_bytes(net, steps)
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(Net(layers, shapes(inputs[0]), fuse="all"), device, solver(),
                               policy)
        check_plan(executor.plan)
        rerun = {executor.net.layer[s.step.layer].type for s in executor.plan.steps
                 if s.step.kind == "recompute"}
        if "Eltwise" in policy.recompute:   # re-run with the batch norm that wrote its blob
            assert rerun == {"BatchNorm", "Eltwise"}
        assert_identical(train(executor, inputs), expected)
