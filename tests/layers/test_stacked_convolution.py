"""StackedConvolution (sibling 1x1 convolutions as one) against its members run one by one, and
the net's stacking (``fusion.stack_siblings``): which groups it stacks, that parameters keep their
names and initial values, and that a stacked net trains as the net written out (float32
rounding), LMS on as LMS off bit for bit."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms import zoo
from minilms.device import make_device
from minilms.fusion import sibling_groups, stack_siblings
from minilms.layers.convolution import Convolution
from minilms.layers.gradcheck import check_gradients
from minilms.layers.run import LayerRun
from minilms.layers.stacked_convolution import StackedConvolution
from minilms.lms import LmsExecutor, Policy, ResidentExecutor, least_pool
from minilms.lms.check import check_plan
from minilms.net import Net
from minilms.solver import SGD

from ..test_executor import batch
from ..test_lms import assert_identical, train

MiB = 2**20


def members(outputs, bias, max_workspace=64 * MiB):
    return [Convolution(f"m{i}", ["x"], [f"y{i}"], num_output=o, kernel_size=1, bias=bias,
                        max_workspace=max_workspace) for i, o in enumerate(outputs)]


def kind(dtype):
    """The device kind a layer is set up for: float64 (the gradient checks') needs the reference
    engine, which a layer set up for either device (None) keeps."""
    return "cpu" if dtype == np.float32 else None


def one_by_one(layers, x, dys, params, dtype):
    """Each member forward and backward on its own (LayerRun, the cpu engine): tops, dx summed in
    member order, parameter gradients by the stacked layer's names."""
    tops, dx, grads = [], np.zeros(x.shape, dtype), {}
    with make_device("cpu", 64 * MiB) as device:
        for layer, dy in zip(layers, dys):
            run = LayerRun(device, layer, [x.shape], dtype=dtype, device_kind=kind(dtype))
            for spec in layer.params():
                run.set_param(spec.name, params[f"{layer.name}.{spec.name}"])
            tops.append(run.forward([x])[0].copy())
            (part,), own = run.backward([dy])
            dx += part
            grads.update({f"{layer.name}.{k}": v.copy() for k, v in own.items()})
    return tops, dx, grads


def stacked_run(layer, x, dys, params, dtype):
    with make_device("cpu", 64 * MiB) as device:
        run = LayerRun(device, layer, [x.shape], dtype=dtype, device_kind=kind(dtype))
        for name, value in params.items():
            run.set_param(name, value)
        tops = [t.copy() for t in run.forward([x])]
        (dx,), grads = run.backward(dys)
        return tops, dx.copy(), {k: v.copy() for k, v in grads.items()}


@settings(max_examples=15, deadline=None)
@given(outputs=st.lists(st.integers(1, 24), min_size=2, max_size=4), channels=st.integers(1, 32),
       n=st.integers(1, 5), size=st.sampled_from([3, 7, 14]), bias=st.booleans(),
       small=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]))
def test_the_stacked_convolution_gives_its_members_results(outputs, channels, n, size, bias,
                                                          small, dtype):
    """Tops, dx (the members' summed) and every parameter gradient as the members give them one
    by one: to float32 rounding (the float64 gradient-check dtype: the reference engine, to
    float64's); ``small``: a workspace of one sample's stacked output, so the batch goes in
    chunks, the last one short where the batch is odd."""
    plane = size * size
    bound = 4 * sum(outputs) * plane if small else 64 * MiB
    layers = members(outputs, bias, bound)
    stacked = StackedConvolution(layers)
    stacked.setup([(n, channels, size, size)], kind(dtype))
    rng = np.random.default_rng(n * 100 + channels)
    x = rng.standard_normal((n, channels, size, size)).astype(dtype)
    dys = [rng.standard_normal((n, o, size, size)).astype(dtype) for o in outputs]
    params = {f"{layer.name}.{spec.name}": rng.standard_normal(spec.shape).astype(dtype)
              for layer in layers for spec in layer.params()}
    expected = one_by_one(layers, x, dys, params, dtype)
    got = stacked_run(stacked, x, dys, params, dtype)
    if small:
        assert stacked.chunk == max(1, min(n, bound // (4 * sum(outputs) * plane)))
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-11,
                                                                            atol=1e-11)
    for top, want in zip(got[0], expected[0]):
        np.testing.assert_allclose(top, want, **tolerance)
    np.testing.assert_allclose(got[1], expected[1], **tolerance)
    assert got[2].keys() == expected[2].keys() == set(params)
    for name, want in expected[2].items():
        np.testing.assert_allclose(got[2][name], want, err_msg=name, **tolerance)


@pytest.mark.parametrize("bias", [False, True])
def test_the_stacked_convolution_passes_the_gradient_check(bias):
    """Central differences in float64 against its backward: the input, and every member's
    weight and bias (a workspace of one sample: two chunks)."""
    layers = members([3, 2, 4], bias, max_workspace=4 * 9 * 5 * 5)
    with make_device("cpu", 64 * MiB) as device:
        report = check_gradients(device, StackedConvolution(layers),
                                 [np.random.default_rng(1).standard_normal((2, 4, 5, 5))])
    assert report.checked > 0 and report.worst <= 1


def test_the_stacked_layer_keeps_its_members_parameter_blobs_and_is_cpu_only():
    layers = members([4, 6], bias=True)
    stacked = StackedConvolution(layers)
    assert stacked.name == "m0+m1" and stacked.top == ["y0", "y1"]
    with pytest.raises(ValueError, match="set up for the cpu device only, found 'cuda'"):
        stacked.setup([(2, 3, 5, 5)], "cuda")
    stacked.setup([(2, 3, 5, 5)], "cpu")
    names = [spec.name for spec in stacked.params()]
    assert names == ["m0.weight", "m0.bias", "m1.weight", "m1.bias"]
    assert [stacked.param_blob(name) for name in names] == names
    assert stacked.flops() == sum(layer.flops() for layer in layers)


def googlenet(width, size, n, device_kind="cpu", fuse="all"):
    return Net(zoo.googlenet(num_classes=4, width=width),
               {"data": ((n, 3, size, size), np.float32), "label": ((n,), np.int32)},
               device_kind=device_kind, fuse=fuse)


def test_googlenet_stacks_the_groups_whose_outputs_are_no_wider_than_their_input():
    """Each inception block's three 1x1s form a group; all but ``inc3b`` (128 + 128 + 32 outputs
    on 256 channels) are stacked, and only with ``all`` on the cpu device. ResNet-50's ``res2a``
    pair (256 + 64 outputs on 64 channels) stays apart."""
    net = googlenet(1, 224, 1)
    stacked = [layer for layer in net.layers if layer.type == "StackedConvolution"]
    blocks = ["3a", "4a", "4b", "4c", "4d", "4e", "5a", "5b"]
    assert [layer.name for layer in stacked] == [
        f"inc{b}_1x1+inc{b}_3x3r+inc{b}_5x5r" for b in blocks]
    assert "inc3b_1x1" in net.layer and "inc3b_1x1" not in net.stacked
    assert len(sibling_groups(googlenet(1, 224, 1, fuse="none").layers)) == 9
    assert not googlenet(1, 224, 1, device_kind=None).stacked
    assert not googlenet(1, 224, 1, fuse="auto").stacked
    # at 2240x2240 one sample of inc3a's stacked output (176 x 280 x 280) is 52.6 MiB: within
    # the default 64 MiB workspace bound, and not within 48 MiB
    big = googlenet(1, 2240, 1)
    assert "inc3a_1x1" in big.stacked and big.layer[big.stacked["inc3a_1x1"]].chunk == 1
    tight = [dict(spec, max_workspace=48 * MiB) if spec.get("type") == "Convolution" else spec
             for spec in zoo.googlenet(num_classes=4)]
    small = Net(tight, {"data": ((1, 3, 2240, 2240), np.float32), "label": ((1,), np.int32)},
                device_kind="cpu", fuse="all")
    assert "inc3a_1x1" not in small.stacked and "inc4a_1x1" in small.stacked
    resnet = Net(zoo.resnet(50), {"data": ((1, 3, 224, 224), np.float32),
                                  "label": ((1,), np.int32)}, device_kind="cpu", fuse="all")
    assert not resnet.stacked
    assert [[m.name for m in g] for g in sibling_groups(resnet.layers)] == [
        ["res2a_proj", "res2a_1"]]


def test_siblings_with_a_write_of_their_input_between_them_are_not_a_group():
    """An in-place layer writing the shared blob between two 1x1s: the second reads another
    value (a net refuses it where the first needs the blob for backward; the rule does not lean
    on that)."""
    from minilms.net import build_layer

    def conv(name, bottom, out, kernel=1):
        return {"name": name, "type": "Convolution", "bottom": bottom, "top": name,
                "num_output": out, "kernel_size": kernel}
    specs = [conv("a", "x", 2), {"name": "r", "type": "ReLU", "bottom": "x", "top": "x"},
             conv("b", "x", 2), conv("c", "x", 2), conv("d", "x", 2, kernel=3)]
    layers = [build_layer(spec, spec["name"]) for spec in specs]
    assert sibling_groups(layers) == []
    assert [[m.name for m in g] for g in sibling_groups(layers[2:])] == [["b", "c"]]
    net = Net([conv("c0", "data", 4, 3)] + [dict(s, bottom="c0") for s in specs[2:]],
              {"data": ((1, 3, 6, 6), np.float32)}, device_kind="cpu", fuse="all")
    assert net.stacked == {"b": "b+c", "c": "b+c"}
    kept, stacked = stack_siblings(net.layers, net.blobs, "all", "cpu")
    assert not stacked and kept == net.layers       # stacked already: no group is left


def test_a_stacked_googlenet_starts_from_the_same_weights_and_computes_the_same_gradients():
    """The same initial parameters by name (drawn in the listed layers' order); then one
    iteration: the same loss and every parameter gradient within float32 rounding of the net
    written out, relative to each gradient's largest magnitude (batch norm over two samples
    amplifies the rounding of regrouped sums: a few steps of training apart drift further)."""
    inputs = batch(2, 3, 64, classes=4, seed=0)
    stacked, plain = googlenet(8, 64, 2), googlenet(8, 64, 2, fuse="auto")
    assert stacked.stacked and not plain.stacked
    grads = []
    with make_device("cpu", 256 * MiB) as device:
        a = ResidentExecutor(stacked, device, SGD(0.0))
        b = ResidentExecutor(plain, device, SGD(0.0))
        params = {n for n, blob in b.blobs.items() if blob.role == "param"}
        assert params == {n for n, blob in a.blobs.items() if blob.role == "param"}
        for name in params:
            np.testing.assert_array_equal(a.blobs[name].host_data(), b.blobs[name].host_data(),
                                          err_msg=name)
        losses = [executor.iterate(inputs)["loss"] for executor in (a, b)]
        for executor in (a, b):
            grads.append({n: blob.host_data().copy() for n, blob in executor.blobs.items()
                          if blob.role == "param_grad"})
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
    assert grads[0].keys() == grads[1].keys() and "inc4a_5x5r.weight.grad" in grads[0]
    for name, want in grads[1].items():
        error = np.abs(grads[0][name] - want).max() / np.abs(want).max()
        assert error < 2e-3, (name, error)


@pytest.mark.parametrize("policy", [Policy(), Policy(prefetch=2), Policy(recompute="auto"),
                                    Policy(recompute=("StackedConvolution",))])
def test_a_stacked_googlenet_trains_lms_on_as_lms_off_bit_for_bit(policy):
    """In a pool just above the least, every plan checked by the replay checker; the last policy
    rebuilds every stacked top by re-running its layer (which writes its other tops again, the
    same values)."""
    inputs = [batch(2, 3, 64, classes=4, seed=s) for s in (0, 1)]
    net = googlenet(8, 64, 2)
    with make_device("cpu", 256 * MiB) as device:
        expected = train(ResidentExecutor(net, device, SGD(0.05, momentum=0.9)), inputs)
    steps = net.schedule(("momentum",))
    with make_device("cpu", least_pool(net, steps, policy) + 4096) as device:
        executor = LmsExecutor(googlenet(8, 64, 2), device, SGD(0.05, momentum=0.9), policy)
        check_plan(executor.plan)
        assert any(s.step.layer.startswith("inc4a_1x1+") for s in executor.plan.steps)
        if policy.recompute == ("StackedConvolution",):
            assert sum(s.step.kind == "recompute" for s in executor.plan.steps) == 24
        assert_identical(train(executor, inputs), expected)
