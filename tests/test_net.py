"""The net: building from layer configs, shapes, config errors, and the schedule's dataflow."""
import copy

import numpy as np
import pytest

from minilms.errors import ConfigError
from minilms.net import Net

INPUTS = {"data": ((2, 3, 8, 8), np.float32), "label": ((2,), np.int32)}


def conv(name, bottom, top, out, k=3, pad=1, **extra):
    return {"name": name, "type": "Convolution", "bottom": bottom, "top": top, "num_output": out,
            "kernel_size": k, "pad": pad, **extra}


def head(bottom):
    return [{"name": "pool", "type": "Pooling", "bottom": bottom, "top": "pool",
             "global_pooling": True, "pool": "ave"},
            {"name": "fc", "type": "InnerProduct", "bottom": "pool", "top": "fc", "num_output": 5},
            {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"},
            {"name": "acc", "type": "Accuracy", "bottom": ["fc", "label"], "top": "acc"}]


RESIDUAL = [conv("conv1", "data", "c1", 4),
            {"name": "bn1", "type": "BatchNorm", "bottom": "c1", "top": "b1"},
            {"name": "relu1", "type": "ReLU", "bottom": "b1", "top": "b1"},
            conv("conv2", "b1", "c2", 4),
            {"name": "add", "type": "Eltwise", "bottom": ["b1", "c2"], "top": "sum"},
            {"name": "relu2", "type": "ReLU", "bottom": "sum", "top": "sum"}] + head("sum")

INCEPTION = [conv("stem", "data", "s", 4),
             conv("b1x1", "s", "a", 2, k=1, pad=0),
             conv("b3x3", "s", "b", 3),
             {"name": "bpool", "type": "Pooling", "bottom": "s", "top": "c", "pool": "max",
              "kernel_size": 3, "stride": 1, "pad": 1},
             {"name": "cat", "type": "Concat", "bottom": ["a", "b", "c"], "top": "cat"}
             ] + head("cat")


def test_shapes_are_inferred():
    net = Net(INCEPTION, INPUTS)
    assert net.blobs["cat"].shape == (2, 9, 8, 8)
    assert net.blobs["fc"].shape == (2, 5) and net.blobs["loss"].shape == (1,)


@pytest.mark.parametrize("layers", [RESIDUAL, INCEPTION], ids=["residual", "inception"])
def test_every_read_is_written_earlier(layers):
    """Def-use over one iteration: a step reads only inputs, parameters, solver state, the loss
    seed, or what an earlier step produced."""
    net = Net(layers, INPUTS)
    steps = net.schedule(("momentum",))
    available = set(net.inputs) | {f"{loss}.grad" for loss in net.loss_blobs}
    available |= {b.name for b in net.blobs.values() if b.role in ("param", "optimizer_state")}
    for step in steps:
        missing = [b for b in step.reads + step.updates if b not in available]
        assert not missing, f"{step.name} reads {missing} before anything wrote them"
        available.update(step.writes + step.updates)
        assert set(step.blobs) <= set(net.blobs), f"{step.name} uses undeclared blobs"


def test_residual_gradient_is_accumulated_where_a_blob_feeds_two_layers():
    net = Net(RESIDUAL, INPUTS)
    steps = {s.name: s for s in net.schedule()}
    add, conv2 = steps["backward add"], steps["backward conv2"]
    assert "b1.grad" in add.writes  # the first writer in backward order overwrites
    assert conv2.accumulate == (("b1.grad@conv2", "b1.grad"),)
    assert "b1.grad" in conv2.updates
    assert "b1.grad" in steps["backward relu1"].updates  # in place: dx overwrites dy


def test_schedule_order_and_which_layers_run_backward():
    net = Net(RESIDUAL, INPUTS)
    names = [s.name for s in net.schedule()]
    assert names[:len(RESIDUAL)] == [f"forward {layer['name']}" for layer in RESIDUAL]
    assert "backward acc" not in names  # no backward, and it feeds no loss
    for layer in ("conv1", "conv2", "bn1", "fc"):
        assert names.index(f"update {layer}") == names.index(f"backward {layer}") + 1
    backward = [n for n in names if n.startswith("backward")]
    assert backward[0] == "backward loss" and backward[-1] == "backward conv1"


def test_nothing_runs_backward_into_the_data():
    steps = Net(RESIDUAL, INPUTS).schedule()
    assert not any("data.grad" in s.blobs for s in steps)
    assert not any("label.grad" in s.blobs for s in steps)


def test_optimizer_state_blobs():
    net = Net(RESIDUAL, INPUTS)
    steps = {s.name: s for s in net.schedule(("exp_avg", "exp_avg_sq"))}
    assert "conv1.weight.exp_avg_sq" in steps["update conv1"].updates
    assert net.blobs["conv1.weight.exp_avg"].role == "optimizer_state"
    assert "bn1.running_mean" in steps["forward bn1"].updates  # state, not learned


def mutated(change):
    layers = copy.deepcopy(RESIDUAL)
    change(layers)
    return layers


@pytest.mark.parametrize("change, message", [
    (lambda layers: layers[3].update(bottom="b_1"),
     "model.layers[3] (conv2).bottom: expected a blob made by a layer or an input, found 'b_1'; "
     "did you mean 'b1'?"),
    (lambda layers: layers[0].update(type="Convolutoin"), "did you mean 'Convolution'?"),
    (lambda layers: layers[0].update(kernal_size=3),
     "model.layers[0] (conv1).kernal_size: expected an option of Convolution"),
    (lambda layers: layers.insert(0, layers.pop(3)),
     "model.layers[0] (conv2).bottom: expected a blob from an "
     "earlier layer: list bn1 (at 2) before conv2, found 'b1'"),
    (lambda layers: layers[0].update(bottom="sum"),
     "expected a blob from an earlier layer, not a cycle (conv1 -> bn1 -> "),
    (lambda layers: layers[3].update(top="c1"),
     "model.layers[3] (conv2).top: expected a blob no other layer makes (also made by conv1)"),
    (lambda layers: layers[1].update(name="conv1"),
     "model.layers[1].name: expected a layer name used once"),
    (lambda layers: layers[0].update(top="data"),
     "expected a name that is not an input, found 'data'"),
    (lambda layers: layers.__setitem__(0, {"type": "ReLU"}),
     "model.layers[0]: expected a layer with a name"),
])
def test_config_errors_are_one_line(change, message):
    with pytest.raises(ConfigError) as error:
        Net(mutated(change), INPUTS)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_in_place_after_a_reader_that_needs_the_old_value_is_refused():
    layers = [conv("conv1", "data", "c1", 4), conv("conv2", "c1", "c2", 4),
              {"name": "relu", "type": "ReLU", "bottom": "c1", "top": "c1"}] + head("c2")
    with pytest.raises(ConfigError, match="conv2 needs c1 unchanged for its backward"):
        Net(layers, INPUTS)


@pytest.mark.parametrize("layer, message", [
    (conv("conv2", "c1", "c1", 4), "model.layers[1] (conv2).top: expected a new blob name: "
     "Convolution reads its bottom in backward, so it cannot work in place, found 'c1'"),
    ({"name": "bn", "type": "BatchNorm", "bottom": "c1", "top": "c1"},
     "model.layers[1] (bn).top: expected a new blob name: BatchNorm reads its bottom"),
    ({"name": "shrink", "type": "Pooling", "bottom": "c1", "top": "c1", "pool": "max",
      "kernel_size": 2},
     "Pooling changes the shape (2, 4, 8, 8) -> (2, 4, 4, 4), so it cannot work in place"),
])
def test_in_place_is_refused_where_it_would_be_wrong(layer, message):
    with pytest.raises(ConfigError) as error:
        Net([conv("conv1", "data", "c1", 4), layer] + head("c1"), INPUTS)
    assert message in str(error.value)


def test_blob_sizes_are_computed_once():
    """The planner asks a blob's size millions of times per plan search: it is computed on first
    use and kept (it was a numpy product each time), and it is still the bytes of the shape."""
    net = Net(RESIDUAL, INPUTS)
    info = net.blobs["c1"]
    assert info.nbytes == 2 * 4 * 8 * 8 * 4 == info.__dict__["nbytes"]
    assert net.blobs["label"].nbytes == 2 * np.dtype(np.int32).itemsize
    assert info == copy.deepcopy(info) and "nbytes" not in repr(info)


def test_resnet_1001_is_he_et_al_2016s():
    """The pre-activation ResNet-1001 of "Identity Mappings in Deep Residual Networks": 1,001
    weighted layers (a 3x3 convolution, 3 stages of 111 bottleneck units of three, the
    classifier), 10.2M convolution weights as the paper counts them, outputs 64, 128 and 256
    channels at 32x32, 16x16 and 8x8, and every unit in BN-ReLU-conv order."""
    from minilms import zoo
    net = Net(zoo.preact_resnet(1001, num_classes=10),
              {"data": ((2, 3, 32, 32), np.float32), "label": ((2,), np.int32)})
    convs = [ly for ly in net.layers if ly.type == "Convolution"]
    fc = [ly for ly in net.layers if ly.type == "InnerProduct"]
    shortcuts = [ly for ly in convs if ly.name.endswith("_proj")]
    assert len(convs) - len(shortcuts) + len(fc) == 1001 and len(shortcuts) == 3
    weights = sum(int(np.prod(p.shape)) for ly in convs for p in ly.params())
    assert round(weights / 1e6, 1) == 10.2
    learnable = sum(int(np.prod(p.shape)) for ly in net.layers for p in ly.params() if p.learnable)
    assert 10.2e6 < learnable < 10.4e6          # with BN's scale and shift and the classifier
    for unit, shape in (("res2_111", (2, 64, 32, 32)), ("res3_111", (2, 128, 16, 16)),
                        ("res4_111", (2, 256, 8, 8))):
        assert net.blobs[unit].shape == shape
    order = [ly.type for ly in net.layers if ly.name.startswith("res3_5_")]
    assert order == ["BatchNorm", "ReLU", "Convolution"] * 3
    assert zoo.MODELS["resnet1001"](num_classes=4, width=16)[-1]["type"] == "Accuracy"
    with pytest.raises(ValueError, match="9n"):
        zoo.preact_resnet(1000)
