"""Layer fusion (``minilms.fusion``): which ReLUs fold into the layer before them, and that a fused
net trains bit for bit as the net written out, LMS off and on (swaps, recompute), on both devices;
a split step within the tolerance of its own regrouped sums."""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minilms import zoo
from minilms.config import load_config
from minilms.config.build import build_net
from minilms.device import make_device
from minilms.errors import ConfigError
from minilms.fusion import fusion_choice, fusion_for
from minilms.lms import LmsExecutor, Policy, ResidentExecutor, cost, least_pool
from minilms.lms.substeps import split_schedule
from minilms.net import Net
from minilms.solver import SGD

from .devices import new_device
from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)
from .test_executor import batch
from .test_lms import POLICIES, assert_identical, train
from .test_substeps import assert_close, random_nets

MiB = 2**20


def shapes(inputs):
    return {k: (v.shape, v.dtype) for k, v in inputs.items()}


def solver():
    return SGD(0.05, momentum=0.9)


def relu(name, blob):
    return {"name": name, "type": "ReLU", "bottom": blob, "top": blob}


def test_every_relu_of_a_resnet_folds_into_its_add_or_its_batch_norm():
    layers = zoo.resnet(50, num_classes=4, width=16)
    inputs = {"data": ((2, 3, 32, 32), np.float32), "label": ((2,), np.int32)}
    plain, fused = Net(layers, inputs), Net(layers, inputs, fuse=True)
    relus = [layer for layer in plain.layers if layer.type == "ReLU"]
    assert len(relus) == 49
    makers = {layer.top[0]: layer for layer in plain.layers if layer.type != "ReLU"}
    assert fused.fused == {relu.name: makers[relu.bottom[0]].name for relu in relus}
    assert sorted({plain.layer[name].type for name in fused.fused.values()}) == \
        ["BatchNorm", "Eltwise"]
    assert all(fused.layer[name].relu for name in fused.fused.values())
    assert not any(layer.type == "ReLU" for layer in fused.layers)
    bns = [layer for layer in fused.layers if layer.type == "BatchNorm"]
    assert sum(not bn.relu for bn in bns) == 16 + 4    # the third of each block, the projections
    # one forward and one backward step fewer for each
    assert len(plain.schedule()) - len(fused.schedule()) == 2 * 49
    assert plain.blobs.keys() == fused.blobs.keys()
    # the fused batch norm's backward may mask the top's gradient in place, and makes the mask
    # again from its bottom: it reads no top, as before
    step = next(s for s in fused.schedule() if s.kind == "backward" and s.layer == "conv1_bn")
    assert "conv1_bn.grad" in step.updates and "conv1" in step.reads
    assert "conv1_bn" not in step.reads + step.updates


def test_auto_folds_only_where_no_step_then_holds_more():
    """``auto``: a batch norm's backward makes the mask again from its input (it reads what it
    read before), a residual add's would read its top as well: only the former folds."""
    layers = zoo.resnet(50, num_classes=4, width=16)
    inputs = {"data": ((2, 3, 32, 32), np.float32), "label": ((2,), np.int32)}
    auto, every = Net(layers, inputs, fuse="auto"), Net(layers, inputs, fuse="all")
    assert {auto.layer[name].type for name in auto.fused.values()} == {"BatchNorm"}
    assert len(auto.fused) == 33 and set(auto.fused) < set(every.fused)
    for name in auto.fused.values():
        assert auto.layer[name].backward_reads == Net(layers, inputs).layer[name].backward_reads
    assert Net(layers, inputs, fuse=False).fused == {} and Net(layers, inputs, fuse=True).fused
    with pytest.raises(ValueError, match="fuse: expected one of auto, all, none"):
        Net(layers, inputs, fuse="some")


def test_fusion_for_a_config_makes_auto_all_with_lms_off_only():
    assert [fusion_for("auto", lms) for lms in (True, False)] == ["auto", "all"]
    for fuse in ("all", "none", True, False, None):
        assert fusion_for(fuse, False) == fusion_for(fuse, True) == fusion_choice(fuse)
    with pytest.raises(ValueError, match="fuse: expected one of"):
        fusion_for("some", False)


def test_a_relu_folds_only_in_place_and_right_after_the_layer_that_made_its_blob():
    base = [{"name": "c1", "type": "Convolution", "bottom": "data", "top": "a", "num_output": 2,
             "kernel_size": 1},
            {"name": "c2", "type": "Convolution", "bottom": "data", "top": "b", "num_output": 2,
             "kernel_size": 1},
            {"name": "add", "type": "Eltwise", "bottom": ["a", "b"], "top": "s"}]
    tail = [{"name": "fc", "type": "InnerProduct", "bottom": "s", "top": "fc", "num_output": 3},
            {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"],
             "top": "loss"}]
    inputs = {"data": ((2, 1, 4, 4), np.float32), "label": ((2,), np.int32)}

    def fused(middle, end=tail):
        return Net(base + middle + end, inputs, fuse=True).fused
    assert fused([relu("r", "s")]) == {"r": "add"}
    # a second ReLU finds the add fused already
    assert fused([relu("r", "s"), relu("r2", "s")]) == {"r": "add"}
    # a ReLU of its own top keeps the sum readable: not folded
    not_in_place = {"name": "r", "type": "ReLU", "bottom": "s", "top": "t"}
    assert fused([not_in_place], [dict(tail[0], bottom="t"), tail[1]]) == {}
    # a layer reads the sum before the ReLU: it must see it unrectified
    reader = {"name": "peek", "type": "ReLU", "bottom": "s", "top": "p"}
    assert fused([reader, relu("r", "s")]) == {}
    # a ReLU after a layer that cannot take it (a convolution) stays
    assert fused([relu("r", "a")]) == {}
    bn = {"name": "bn", "type": "BatchNorm", "bottom": "s", "top": "n"}
    assert fused([bn, relu("r", "n")], [dict(tail[0], bottom="n"), tail[1]]) == {"r": "bn"}
    assert Net(base + [relu("r", "s")] + tail, inputs).fused == {}     # fuse=False: as written


def test_model_fuse_in_a_config_and_errors_name_the_listed_layer(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {zoo: resnet18, options: {width: 16}}\ndata: {image_size: 32}\n")
    fused = build_net(load_config(config)).fused             # auto: the batch norms' 9 ReLUs
    assert len(fused) == 9 and all(name.endswith("_bn") for name in fused.values())
    assert len(build_net(load_config(config, ["model.fuse=all"])).fused) == 17   # and 8 adds'
    assert build_net(load_config(config, ["model.fuse=none"])).fused == {}
    # with LMS off every blob stays resident: auto folds the adds' ReLUs too
    assert len(build_net(load_config(config, ["lms.enabled=false"])).fused) == 17
    assert build_net(load_config(config, ["lms.enabled=false", "model.fuse=none"])).fused == {}
    listed = tmp_path / "listed.yaml"
    listed.write_text(
        "model:\n  layers:\n"
        "    - {name: c1, type: Convolution, bottom: data, top: a, num_output: 2, kernel_size: 1}\n"
        "    - {name: add, type: Eltwise, bottom: [a, a], top: s}\n"
        "    - {name: r, type: ReLU, bottom: s, top: s}\n"
        "    - {name: p, type: Pooling, bottom: s, top: p, kernel_size: 64}\n"
        "data: {image_size: 8}\n")
    with pytest.raises(ConfigError, match=r"model\.layers\[3\] \(p\)"):
        build_net(load_config(listed))


def fused_twins(layers, inputs):
    return Net(layers, shapes(inputs)), Net(layers, shapes(inputs), fuse=True)


def with_relu_after_adds(layers, data):
    """``layers`` with an in-place ReLU after each residual add and batch norm (drawn: some keep
    none)."""
    out = []
    for layer in layers:
        out.append(layer)
        if layer["type"] in ("Eltwise", "BatchNorm") and data.draw(st.integers(0, 3)):
            out.append(relu(layer["name"] + "_relu", layer["top"]))
    return out


@settings(max_examples=25, deadline=None)
@given(spec=random_nets(), data=st.data())
def test_random_fused_nets_train_bit_for_bit(spec, data):
    """Random nets (residual adds, in-place ReLUs among them): the fused net gives the written
    net's losses, weights and optimizer state bit for bit, LMS off and on under a random policy
    in a pool just above the least."""
    layers, n, c, size = spec
    layers = with_relu_after_adds(layers, data)
    inputs = [batch(n, c, size, classes=3, seed=s) for s in (0, 1)]
    plain, fused = fused_twins(layers, inputs[0])
    assume(fused.fused)
    with make_device("cpu", 64 * MiB) as device:
        expected = train(ResidentExecutor(plain, device, solver()), inputs)
    with make_device("cpu", 64 * MiB) as device:
        assert_identical(train(ResidentExecutor(fused, device, solver()), inputs), expected)
    policy = POLICIES[data.draw(st.sampled_from(sorted(POLICIES)))]
    steps = fused.schedule(("momentum",))
    with make_device("cpu", least_pool(fused, steps, policy) + 4096) as device:
        executor = LmsExecutor(Net(layers, shapes(inputs[0]), fuse=True), device, solver(),
                               policy)
        assert_identical(train(executor, inputs), expected)


def resnet_case():
    layers = zoo.resnet(18, num_classes=4, width=16)
    inputs = [batch(4, 3, 32, classes=4, seed=s) for s in (0, 1)]
    return layers, inputs


def test_a_fused_resnet_recomputes_its_adds_bit_for_bit():
    """Recompute re-runs a fused add with its ReLU (the top it rebuilds is rectified)."""
    layers, inputs = resnet_case()
    plain, fused = fused_twins(layers, inputs[0])
    with make_device("cpu", 64 * MiB) as device:
        expected = train(ResidentExecutor(plain, device, solver()), inputs)
    with make_device("cpu", 64 * MiB) as device:
        executor = LmsExecutor(fused, device, solver(), Policy(recompute=("Eltwise",)))
        assert any(s.step.kind == "recompute" and s.step.layer.startswith("res")
                   for s in executor.plan.steps)
        assert_identical(train(executor, inputs), expected)


def test_a_fused_resnet_with_its_fused_steps_split_trains_as_lms_off():
    """Every step of a fused add or batch norm split in two or three chunks (the fused batch
    norm masks its top's gradient a chunk at a time before its sums): LMS off's weights within
    the tolerance of a split step's regrouped sums."""
    layers, inputs = resnet_case()
    plain, fused = fused_twins(layers, inputs[0])
    with make_device("cpu", 64 * MiB) as device:
        expected = train(ResidentExecutor(plain, device, solver()), inputs, iterations=1)

    def split_fused(net, steps, capacity, policy, plan, **weigh):
        train_steps = any(s.kind == "backward" for s in steps)
        counts = {i: 2 + i % 2 for i, s in enumerate(steps)
                  if s.layer in fused.fused.values() and s.kind in ("forward", "backward")}
        return plan(split_schedule(net, steps, counts if train_steps else {}, train_steps))
    with pytest.MonkeyPatch.context() as patch, make_device("cpu", 64 * MiB) as device:
        patch.setattr(cost, "plan_split", split_fused)
        executor = LmsExecutor(Net(layers, shapes(inputs[0]), fuse=True), device, solver(),
                               Policy())
        split = {(s.step.kind, fused.layer[s.step.layer].type) for s in executor.plan.steps
                 if s.step.part is not None}
        assert split == {(k, t) for k in ("forward", "backward") for t in ("BatchNorm", "Eltwise")}
        assert_close(train(executor, inputs, iterations=1), expected)


@pytest.mark.cuda
@pytest.mark.usefixtures("small_gemm_tile")
def test_a_fused_net_trains_bit_for_bit_on_cuda():
    layers = [
        {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "c1", "num_output": 3,
         "kernel_size": 3, "pad": 1},
        relu("relu1", "c1"),
        {"name": "conv2", "type": "Convolution", "bottom": "c1", "top": "c2", "num_output": 3,
         "kernel_size": 3, "pad": 1},
        {"name": "add", "type": "Eltwise", "bottom": ["c1", "c2"], "top": "sum",
         "coeffs": [1.0, -0.5]},
        relu("relu2", "sum"),
        {"name": "fc", "type": "InnerProduct", "bottom": "sum", "top": "fc", "num_output": 3},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"}]
    inputs = [batch(2, 2, 5, classes=3, seed=s) for s in (0, 1)]
    plain, fused = fused_twins(layers, inputs[0])
    assert fused.fused == {"relu2": "add"}
    with new_device("cuda", 4 * MiB) as device:
        expected = train(ResidentExecutor(plain, device, solver()), inputs, iterations=2)
    with new_device("cuda", 4 * MiB) as device:
        got = train(ResidentExecutor(fused, device, solver()), inputs, iterations=2)
    assert_identical(got, expected)
