"""Steps split along the batch (issue 20): the sub-steps, their plans and their training.

A split step's sub-steps name chunks of its batch blobs; the planner keeps a blob and its chunks
consistent and the replay checker checks it per sample; training with steps split gives LMS off's
weights within float tolerance (the sums over samples are regrouped), and the least pool falls
below the largest working set."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms import zoo
from minilms.config import load_config
from minilms.device import make_device
from minilms.device.pool import ALIGNMENT
from minilms.errors import ConfigError, PlanError
from minilms.lms import LmsExecutor, Policy, cost, least_pool
from minilms.lms.bounds import (
    SUMMARY_PRECISION,
    least_split_pool,
    split_floor,
    working_set_bytes,
)
from minilms.lms.check import check_plan
from minilms.lms.executor import ResidentExecutor
from minilms.lms.planner import make_plan
from minilms.lms.substeps import (
    chunk_name,
    split_counts,
    split_schedule,
    splittable,
)
from minilms.net import Net
from minilms.solver import SGD

from .devices import new_device
from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)
from .test_executor import batch
from .test_lms import DAG, make_net, reference, train
from .test_plan import build

NETS = {
    "dag": lambda n: build(DAG, n, 2, 6),
    "resnet18/16": lambda n: build(zoo.resnet(18, num_classes=4, width=16), n, 3, 32),
    "googlenet/32": lambda n: build(zoo.googlenet(num_classes=4, width=32), n, 3, 64),
}


def split_all(net, steps, chunks, train=True):
    counts = {i: chunks for i, s in enumerate(steps) if splittable(net, s, train)}
    return split_schedule(net, steps, counts, train)


def test_sub_steps_name_chunks_and_keep_the_order():
    net, steps = build(DAG, 4, 2, 6)
    split = split_all(net, steps, 2)
    assert [s.index for s in split] == list(range(len(split)))
    conv = [s for s in split if s.layer == "conv1" and s.kind == "forward"]
    assert [s.part.chunk for s in conv] == [(0, 2), (2, 4)]
    assert conv[0].reads[0] == chunk_name("data", 0, 2) and conv[1].writes[0] == "c0[2:4]"
    assert net.chunks["c0[2:4]"] == ("c0", 2, 4) and net.blobs["c0[2:4]"].shape[0] == 2
    # BatchNorm: five passes; only the last (normalize) writes the top's chunks
    bn = [s for s in split if s.layer == "bn1" and s.kind == "forward"]
    assert [s.part.method for s in bn] == ["sum_x", "sum_x", "finish_mean", "sum_squares",
                                           "sum_squares", "finish_invstd", "normalize",
                                           "normalize"]
    assert not any(n.startswith("c1[") for s in bn[:-2] for n in s.blobs)
    assert bn[-1].writes[0] == "c1[2:4]" and bn[2].part.chunk is None
    # the carried partial sums: written first, updated after
    assert "bn1.split.stats" in bn[0].writes and "bn1.split.stats" in bn[-1].updates
    # a weight gradient: written by the first chunk, summed into by the next through a temporary
    back = [s for s in split if s.layer == "conv2" and s.kind == "backward"]
    assert "conv2.weight.grad" in back[0].writes and "conv2.weight.grad" in back[1].updates
    assert "conv2.split.param_grad.weight" in back[1].workspace
    assert split_counts(split)["backward conv2"] == 2


def test_unsplittable_steps_stay_whole():
    net, steps = build(DAG, 4, 2, 6)
    train = True
    assert not any(splittable(net, s, train) for s in steps if s.kind == "update")
    net1, steps1 = build(DAG, 1, 2, 6)
    assert not any(splittable(net1, s, train) for s in steps1)      # one sample: nothing to split


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(sorted(NETS)), chunks=st.integers(2, 4), seed=st.integers(0, 10**6),
       prefetch=st.integers(0, 3), min_swap=st.sampled_from([0, 0, 1024]),
       limit=st.sampled_from([None, None, 1 << 40]), scale=st.floats(1.0, 1.6))
def test_split_plans_replay_correctly(name, chunks, seed, prefetch, min_swap, limit, scale):
    """Random steps split into random chunk counts, random knobs, pools from the least up: the
    replay checker (per sample) finds every read of a chunk valid, nothing lost, nothing
    overlapping; or the planner says it does not fit."""
    net, steps = NETS[name](4)
    rng = np.random.default_rng(seed)
    counts = {i: int(rng.integers(2, chunks + 1)) for i, s in enumerate(steps)
              if splittable(net, s, True) and rng.random() < 0.6}
    split = split_schedule(net, steps, counts, True)
    least = max(working_set_bytes(net, s) for s in split)
    policy = Policy(prefetch=prefetch, min_swap_bytes=min_swap, limit=limit)
    try:
        plan = make_plan(net, split, int(least * scale) + 4096, policy)
    except PlanError as error:
        assert "out of device memory" in str(error)
        return
    check_plan(plan)
    assert plan.chunks and plan.peak <= plan.capacity


def test_the_checker_finds_a_stale_chunk():
    """A plan whose chunk load is moved before the whole blob's swap-out reads stale samples:
    the checker must say so (it is not the planner's own bookkeeping)."""
    net, steps = build(DAG, 4, 2, 6)
    split = split_all(net, steps, 2)
    plan = make_plan(net, split, max(working_set_bytes(net, s) for s in split) + 8192, Policy())
    check_plan(plan)
    for step_plan in plan.steps:
        loads = [a for a in step_plan.demand if a.kind == "swap_in" and a.blob in plan.chunks]
        if loads:
            step_plan.demand.remove(loads[0])
            break
    else:
        pytest.fail("no chunk is loaded")
    with pytest.raises(AssertionError, match="not valid on device|not placed|resident"):
        check_plan(plan)


def test_least_pool_falls_below_the_largest_working_set():
    for name in ("dag", "resnet18/16"):
        net, steps = NETS[name](8)
        unsplit = least_pool(net, steps)
        split = least_split_pool(net, steps)
        assert split < unsplit, name
        assert split < max(working_set_bytes(net, s) for s in steps)
        plan = cost.plan_for(net, steps, split, Policy())
        check_plan(plan)
        assert "split along the batch" in plan.notes[-1]
        with pytest.raises(PlanError):
            cost.plan_for(net, steps, split, Policy(split="off"))
        with pytest.raises(PlanError):
            make_plan(net, steps, split, Policy())



def test_least_split_pool_to_a_precision_fits_and_is_near_the_exact_one():
    """The plan command's searched pool with steps split (``SUMMARY_PRECISION``) is one that
    splitting fits, at least the exact least and above it by no more than the precision asks
    (of the floor, the search's bound)."""
    for name in ("dag", "resnet18/16"):
        net, steps = NETS[name](8)
        exact = least_split_pool(net, steps)
        near = least_split_pool(net, steps, Policy(), SUMMARY_PRECISION)
        floor = split_floor(net, steps, Policy(split="auto"))[0]
        assert exact <= near <= exact + max(ALIGNMENT, int(floor * SUMMARY_PRECISION)), name
        check_plan(cost.plan_for(net, steps, near, Policy()))

def assert_close(got, expected, losses=1e-5):
    """Losses within ``losses`` relative, and every parameter and optimizer state within 1e-4
    of its largest magnitude (at least 1e-1: a bias before batch norm, or before linear layers
    that lead to one, has a zero gradient and holds rounding noise only; hypothesis found a
    1x1-convolution bias two layers before a batch norm whose noise was 5.4e-6 with LMS off and 0
    split), of LMS off's. A split step regroups sums over the samples
    (weight gradients; BLAS calls on fewer rows): one iteration shows that alone; over more,
    training amplifies the last bits as it does any regrouping (a net of two samples per batch
    norm most), so later losses are held to a looser bound."""
    np.testing.assert_allclose(got[0], expected[0], rtol=losses)
    assert got[1].keys() == expected[1].keys()
    for name, value in expected[1].items():
        scale = max(float(np.max(np.abs(value))), 1e-1)
        np.testing.assert_allclose(got[1][name], value, rtol=0, atol=1e-4 * scale,
                                   err_msg=name)


@pytest.mark.parametrize("layers, shape, chunks", [
    (DAG, (4, 2, 6, 3), 2),
    (DAG, (5, 2, 6, 3), 3),
    (zoo.resnet(18, num_classes=4, width=16), (4, 3, 32, 4), 2),
    (zoo.googlenet(num_classes=4, width=32), (2, 3, 64, 4), 2),
])
def test_training_with_every_step_split_is_lms_off_within_tolerance(monkeypatch, layers, shape,
                                                                    chunks):
    """Every step that can split is split (BatchNorm's statistics, Dropout's mask, the loss and
    the accuracy included), in a pool that makes the chunks travel: one iteration gives LMS
    off's loss and weights within float tolerance, three its losses within 1e-3, and two runs
    the same bits."""
    def split_everything(net, steps, capacity, policy, plan, **weigh):
        train_steps = any(s.kind == "backward" for s in steps)
        return plan(split_all(net, steps, chunks, train_steps))
    monkeypatch.setattr(cost, "plan_split", split_everything)
    solver = lambda: SGD(0.05, momentum=0.9, weight_decay=1e-4)   # noqa: E731
    batches = [batch(*shape, seed=s) for s in (0, 1)]
    net = make_net(layers, batches[0])
    split = split_all(net, net.schedule(("momentum",)), chunks)
    capacity = max(working_set_bytes(net, s) for s in split) * 3
    runs = []
    for iterations in (1, 3, 3):
        with make_device("cpu", capacity) as device:
            executor = LmsExecutor(make_net(layers, batches[0]), device, solver(), Policy())
            assert executor.plan.chunks and any(a.blob in executor.plan.chunks and a.copies
                                                for _, a in executor.plan.actions())
            runs.append(train(executor, batches, iterations))
            if iterations == 1:    # test mode too: batch norm's running statistics, per chunk
                evaluated = executor.iterate(batches[1], train=False)["loss"]
                assert executor.plan.chunks
    assert_close(runs[0], reference(layers, batches, solver, iterations=1))
    with make_device("cpu", 64 << 20) as device:
        resident = ResidentExecutor(make_net(layers, batches[0]), device, solver())
        resident.iterate(batches[0])
        np.testing.assert_allclose(evaluated, resident.iterate(batches[1], train=False)["loss"],
                                   rtol=1e-5)
    np.testing.assert_allclose(runs[1][0], reference(layers, batches, solver)[0], rtol=1e-3)
    assert runs[1][0] == runs[2][0]
    for name, value in runs[1][1].items():
        np.testing.assert_array_equal(runs[2][1][name], value, err_msg=name)


def test_split_auto_trains_where_a_step_does_not_fit():
    """``lms.split: auto`` in a pool below the largest working set: the planner splits the
    steps that do not fit, and training gives LMS off's weights within float tolerance; an
    evaluation forward runs in the same pool."""
    layers = zoo.resnet(18, num_classes=4, width=16)
    batches = [batch(8, 3, 32, classes=4, seed=s) for s in (0, 1)]
    solver = lambda: SGD(0.05, momentum=0.9)   # noqa: E731
    expected = reference(layers, batches, solver, iterations=1)
    net = make_net(layers, batches[0])
    steps = net.schedule(("momentum",))
    capacity = least_split_pool(net, steps)
    assert capacity < least_pool(net, steps)
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(make_net(layers, batches[0]), device, solver(), Policy())
        assert split_counts([s.step for s in executor.plan.steps])
        got = train(executor, batches, iterations=1)
        evaluated = executor.iterate(batches[0], train=False)
    assert_close(got, expected)
    assert np.isfinite(evaluated["loss"])


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("off", "off"), (False, "off"),
                                             (4, 4)])
def test_the_split_knob(tmp_path, value, expected):
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{zoo: lenet}}\nlms: {{split: {str(value).lower()}}}\n")
    from minilms.config.build import lms_policy
    assert lms_policy(load_config(config)).split == expected


def test_a_bad_split_knob_names_the_key(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("model: {zoo: lenet}\nlms: {split: 0}\n")
    with pytest.raises(ConfigError, match=r"lms\.split.*auto, off, or a chunk count >= 1"):
        load_config(config)
    with pytest.raises(ConfigError, match="lms.split"):
        Policy(split="sometimes")


@pytest.mark.cuda
@pytest.mark.simulator_slow
@pytest.mark.usefixtures("small_gemm_tile")
def test_cuda_training_with_every_step_split_is_lms_off_within_tolerance(monkeypatch):
    """The cuda device (the simulator without a GPU): the residual + inception net with batch
    norm and dropout, every step split in two, one iteration against the resident executor on
    cuda: its kernels' split sums (batch norm's piece sums carried in its split stats), the chunk
    blobs' copies."""
    def split_everything(net, steps, capacity, policy, plan, **weigh):
        return plan(split_all(net, steps, 2, any(s.kind == "backward" for s in steps)))
    monkeypatch.setattr(cost, "plan_split", split_everything)
    inputs = batch(2, 2, 6, classes=3)
    solver = lambda: SGD(0.1, momentum=0.9)   # noqa: E731
    expected = reference(DAG, [inputs], solver, "cuda", iterations=1)
    net = make_net(DAG, inputs)
    split = split_all(net, net.schedule(("momentum",)), 2)
    with new_device("cuda", max(working_set_bytes(net, s) for s in split) * 3) as device:
        executor = LmsExecutor(make_net(DAG, inputs), device, solver(), Policy(prefetch=1))
        assert executor.plan.chunks
        assert_close(train(executor, [inputs], iterations=1), expected)


def test_the_trace_says_which_steps_were_split():
    from minilms import trace
    layers = zoo.resnet(18, num_classes=4, width=16)
    inputs = batch(8, 3, 32, classes=4)
    net = make_net(layers, inputs)
    capacity = least_split_pool(net, net.schedule(("momentum",)))
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(make_net(layers, inputs), device, SGD(0.01, momentum=0.9))
        with trace.record(executor) as recorded:
            executor.iterate(inputs)
    counts = split_counts([s.step for s in executor.plan.steps])
    line = [ln for ln in recorded.summary().splitlines() if ln.startswith("split")]
    assert counts and line
    for name, chunks in counts.items():
        assert f"{name} in {chunks}" in line[0]


def test_more_chunks_are_kept_only_where_the_model_predicts_them_faster(monkeypatch):
    """``auto`` weighs twice as many chunks against the fewest that fit, by the cost model's
    predicted time: with a model that calls every copy slow and every step free, the plan that
    moves fewer bytes wins, whichever it is; and the plan kept is one of the two."""
    net, steps = NETS["resnet18/16"](8)
    capacity = least_split_pool(net, steps) * 5 // 4
    fewest = cost.plan_for(net, steps, capacity, Policy())
    model = cost.CostModel(1e30, 1e30, 1e6, "copies only")
    weighed = cost.plan_for(net, steps, capacity, Policy(), model)
    check_plan(weighed)
    moved = lambda p: p.bytes_moved("h2d") + p.bytes_moved("d2h")   # noqa: E731
    assert moved(weighed) <= moved(fewest)
    chunks = lambda p: sorted(split_counts([s.step for s in p.steps]).values())   # noqa: E731
    assert chunks(weighed) in (chunks(fewest), sorted(min(2 * k, 8) for k in chunks(fewest)))


@st.composite
def random_nets(draw):
    """A random small net of the layer types that split: convolutions, batch norm, ReLU and
    dropout (in place or not), max and average pooling, a residual sum, an inception-style
    concat; then an inner product, the loss and the accuracy. ``(layers, n, c, size)``."""
    channels, size = draw(st.integers(1, 3)), draw(st.sampled_from([4, 6, 8]))
    input_channels, layers, current = channels, [], "data"

    def conv(name, bottom, outputs, kernel):
        layers.append({"name": name, "type": "Convolution", "bottom": bottom, "top": name,
                       "num_output": outputs, "kernel_size": kernel, "pad": kernel // 2})
    for i in range(draw(st.integers(1, 6))):
        kind, name = draw(st.sampled_from(["conv", "relu", "bn", "pool", "sum", "concat",
                                           "dropout"])), f"l{i}"
        if kind == "conv":
            channels = draw(st.integers(1, 4))
            conv(name, current, channels, draw(st.sampled_from([1, 3])))
        elif kind in ("relu", "dropout"):
            top = current if current != "data" and draw(st.booleans()) else name
            layers.append({"name": name, "type": "ReLU" if kind == "relu" else "Dropout",
                           "bottom": current, "top": top, **({"ratio": 0.3}
                                                              if kind == "dropout" else {})})
        elif kind == "bn":
            layers.append({"name": name, "type": "BatchNorm", "bottom": current, "top": name})
        elif kind == "pool" and size >= 4:
            layers.append({"name": name, "type": "Pooling", "bottom": current, "top": name,
                           "pool": draw(st.sampled_from(["max", "ave"])), "kernel_size": 2,
                           "stride": 2})
            size //= 2
        elif kind == "sum":
            conv(f"{name}_b", current, channels, 3)
            layers.append({"name": name, "type": "Eltwise", "bottom": [current, f"{name}_b"],
                           "top": name})
        elif kind == "concat":
            extra = draw(st.integers(1, 3))
            conv(f"{name}_b", current, extra, 1)
            layers.append({"name": name, "type": "Concat", "bottom": [current, f"{name}_b"],
                           "top": name})
            channels += extra
        else:
            continue
        current = layers[-1]["top"]
    layers += [{"name": "fc", "type": "InnerProduct", "bottom": current, "top": "fc",
                "num_output": 3},
               {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"],
                "top": "loss"},
               {"name": "acc", "type": "Accuracy", "bottom": ["fc", "label"], "top": "acc"}]
    return layers, draw(st.integers(2, 5)), input_channels, size * (2 ** sum(
        1 for layer in layers if layer["type"] == "Pooling"))


def random_counts(data, net, steps, train=True):
    n = net.inputs["data"][0][0]
    return {i: data.draw(st.integers(2, n)) for i, s in enumerate(steps)
            if splittable(net, s, train) and data.draw(st.booleans())}


@settings(max_examples=150, deadline=None)
@given(spec=random_nets(), data=st.data(), prefetch=st.integers(0, 2),
       limit=st.sampled_from([None, 1 << 40]), scale=st.floats(1.0, 2.0),
       kind=st.sampled_from([None, "cpu"]))
def test_random_nets_with_random_splits_replay_correctly(spec, data, prefetch, limit, scale, kind):
    """Random nets, random steps split into random chunk counts, random knobs and pools: every
    plan passes the replay checker, or the planner says it does not fit. Set up for the cpu
    device, a 1x1 convolution beside a concat adds its input gradient in (``Step.adds``)."""
    layers, n, c, size = spec
    net = Net(layers, {"data": ((n, c, size, size), np.float32), "label": ((n,), np.int32)},
              device_kind=kind)
    steps = net.schedule(("momentum",))
    split = split_schedule(net, steps, random_counts(data, net, steps), True)
    capacity = int(max(working_set_bytes(net, s) for s in split) * scale) + 2048
    try:
        plan = make_plan(net, split, capacity, Policy(prefetch=prefetch, limit=limit))
    except PlanError as error:
        assert "out of device memory" in str(error)
        return
    check_plan(plan)


@settings(max_examples=30, deadline=None)
@given(spec=random_nets(), data=st.data())
def test_random_nets_with_random_splits_train_as_lms_off(spec, data):
    """Random nets with random steps split: one iteration gives LMS off's loss and weights
    within the tolerance of ``assert_close``, and evaluation the same loss."""
    layers, n, c, size = spec
    inputs = batch(n, c, size, classes=3, seed=data.draw(st.integers(0, 99)))
    net = make_net(layers, inputs)
    counts = random_counts(data, net, net.schedule(("momentum",)))

    def split_these(net, steps, capacity, policy, plan, **weigh):
        train_steps = any(s.kind == "backward" for s in steps)
        return plan(split_schedule(net, steps, counts if train_steps else {}, train_steps))
    solver = lambda: SGD(0.05, momentum=0.9)   # noqa: E731
    expected = reference(layers, [inputs], solver, iterations=1)
    with pytest.MonkeyPatch.context() as patch, make_device("cpu", 64 << 20) as device:
        patch.setattr(cost, "plan_split", split_these)
        executor = LmsExecutor(make_net(layers, inputs), device, solver(), Policy())
        assert bool(executor.plan.chunks) == bool(counts)
        assert_close(train(executor, [inputs], iterations=1), expected)
