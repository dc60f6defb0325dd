"""Layer fusion (``minilms.fusion``): which ReLUs fold into the layer before them, and that a fused
net trains bit for bit as the net written out, LMS off and on (swaps, recompute), on both devices;
a split step within the tolerance of its own regrouped sums."""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minilms import zoo
from minilms.commands.plan import report
from minilms.config import load_config
from minilms.config.build import build_net, fusions, planned_net
from minilms.device import make_device
from minilms.errors import ConfigError, PlanError
from minilms.fusion import first_that_plans, fusion_choice, fusions_for
from minilms.lms import LmsExecutor, Policy, ResidentExecutor, cost, least_pool
from minilms.lms.bounds import SUMMARY_PRECISION, least_split_pool
from minilms.lms.substeps import split_schedule
from minilms.net import Net
from minilms.sizes import format_bytes
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


def test_fusions_for_a_config_make_auto_all_with_lms_off_and_all_then_auto_with_lms_on():
    assert fusions_for("auto", False) == ("all",)
    assert fusions_for("auto", True) == ("all", "auto")
    for fuse in ("all", "none", True, False, None):
        assert fusions_for(fuse, False) == fusions_for(fuse, True) == (fusion_choice(fuse),)
    with pytest.raises(ValueError, match="fuse: expected one of"):
        fusions_for("some", False)


def test_first_that_plans_passes_a_plan_error_to_the_next_and_raises_the_last():
    tried = []

    def plan(net, policy):
        tried.append((net, policy.split))
        if net.startswith("all"):
            raise PlanError(f"{net}: no plan fits")
        return f"plan of {net}"
    policy = Policy(policy="auto")
    assert first_that_plans(("all", "auto"), lambda fuse: fuse + " net", plan, policy) == \
        ("auto net", "plan of auto net")
    assert tried == [("all net", "off"), ("auto net", "auto")]   # the first with steps unsplit
    assert first_that_plans(("none",), lambda fuse: fuse, plan, policy) == ("none",
                                                                            "plan of none")
    with pytest.raises(PlanError, match="all: no plan fits"):
        first_that_plans(("all",), lambda fuse: fuse, plan, policy)

    def broken(net, policy):     # anything but "no plan fits" is no reason to try another net
        raise ValueError("a bug")
    with pytest.raises(ValueError, match="a bug"):
        first_that_plans(("all", "auto"), lambda fuse: fuse, broken, policy)


def test_with_lms_on_auto_fuses_the_adds_relus_where_the_pool_holds_that_nets_plan(tmp_path):
    """A net whose largest step is a residual add: fused with its ReLU, the add's backward holds
    its top for the mask beside the three gradients, and the least pool grows. ``auto`` with LMS
    on takes the fused net in a pool that holds its plan with its steps unsplit, the add and ReLU
    as written in a pool between the two least pools (where the fused net would fit only split),
    and no pool under the smaller one (split steps or not); both train as LMS off."""
    config = tmp_path / "add.yaml"
    config.write_text(
        "model:\n  layers:\n"
        "    - {name: c1, type: Convolution, bottom: data, top: a, num_output: 16,"
        " kernel_size: 1}\n"
        "    - {name: c2, type: Convolution, bottom: data, top: b, num_output: 16,"
        " kernel_size: 1}\n"
        "    - {name: add, type: Eltwise, bottom: [a, b], top: s}\n"
        "    - {name: r, type: ReLU, bottom: s, top: s}\n"
        "    - {name: pool, type: Pooling, bottom: s, top: p, pool: AVE, global_pooling: true}\n"
        "    - {name: fc, type: InnerProduct, bottom: p, top: fc, num_output: 3}\n"
        "    - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}\n"
        "data: {image_size: 32, channels: 1, batch_size: 2, num_classes: 3}\n"
        "device: {kind: cpu}\n")
    path, config = config, load_config(config)
    assert fusions(config) == ("all", "auto")
    least = {}
    for fuse in fusions(config):
        net = build_net(config, fuse=fuse)
        least[fuse] = least_pool(net, net.schedule(("momentum",)),
                                 Policy(policy="auto", split="off"))
    assert least["auto"] < least["all"]
    rng = np.random.default_rng(3)
    inputs = {"data": rng.standard_normal((2, 1, 32, 32)).astype(np.float32),
              "label": np.array([0, 2], np.int32)}
    expected = train(ResidentExecutor(build_net(config, fuse="none"),
                                      make_device("cpu", 64 * MiB), solver()), [inputs])
    for pool, fused in ((least["all"], {"r": "add"}), (least["auto"], {})):
        net, executor = planned_net(config, lambda net, policy: LmsExecutor(
            net, make_device("cpu", pool), solver(), policy), Policy(policy="auto"))
        assert net.fused == fused and executor.net is net
        assert_identical(train(executor, [inputs]), expected)
    unfused = build_net(config, fuse="auto")   # the adds' ReLUs unfused: what the summary plans
    said = least_pool(unfused, unfused.schedule(("momentum",)),     # to the summary's precision
                      Policy(policy="auto", split="off"), SUMMARY_PRECISION)
    for pool, kept in ((least["all"], False), (least["auto"], True)):   # and minilms.plan says so
        out = report(load_config(path, [f"device.memory={pool}"]), summary=True)
        assert f"least pool for LMS   {format_bytes(said):>12}" in out, out
        assert ("note: model.fuse auto: the ReLUs after the adds stay layers of their own" in
                out) == kept, out
    # the least pool with steps split
    floor = least_split_pool(unfused, unfused.schedule(("momentum",)), Policy(policy="auto"))
    assert floor < least["auto"]
    with pytest.raises(PlanError):
        planned_net(config, lambda net, policy: LmsExecutor(net, make_device("cpu", floor - 256),
                                                            solver(), policy),
                    Policy(policy="auto"))


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
    # auto, LMS on: the adds' ReLUs too where the pool allows, the batch norms' 9 where not
    assert fusions(load_config(config)) == ("all", "auto")
    assert len(build_net(load_config(config)).fused) == 17
    fused = build_net(load_config(config), fuse="auto").fused
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


def resnet_case(in_place_adds=True):
    layers = zoo.resnet(18, num_classes=4, width=16, in_place_adds=in_place_adds)
    inputs = [batch(4, 3, 32, classes=4, seed=s) for s in (0, 1)]
    return layers, inputs


def test_a_fused_resnet_recomputes_its_adds_bit_for_bit():
    """Recompute re-runs a fused add with its ReLU (the top it rebuilds is rectified): an add
    with a top of its own (one in place re-runs only after the layer that wrote its blob:
    tests/test_in_place_adds.py)."""
    layers, inputs = resnet_case(in_place_adds=False)
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
@pytest.mark.simulator_slow
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
