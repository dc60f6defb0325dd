"""Early write-back (``lms.write_back: early``): each swap-out's copy issued as a ``sync`` after
the blob's last write, its eviction a ``drop``; plans the replay checker accepts, the same bytes
and pool use as the lazy plan, training bit for bit LMS off's; ``auto`` weighs it on cuda only."""
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms import zoo
from minilms.config import load_config
from minilms.config.build import lms_policy
from minilms.device import make_device
from minilms.errors import ConfigError, PlanError
from minilms.lms import LmsExecutor, Policy, least_pool, simulate
from minilms.lms.auto import auto_plan
from minilms.lms.bounds import working_set_bytes
from minilms.lms.check import check_plan
from minilms.lms.cost import CostModel
from minilms.lms.planner import make_plan
from minilms.solver import SGD

from .devices import new_device
from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)
from .test_executor import batch
from .test_lms import DAG, TINY, assert_identical, make_net, reference, train
from .test_plan import build
from .test_substeps import random_nets


def lazy_and_early(net, steps, capacity, **knobs):
    return (make_plan(net, steps, capacity, Policy(**knobs)),
            make_plan(net, steps, capacity, Policy(write_back="early", **knobs)))


def assert_written_back(lazy, early):
    """``early`` is ``lazy`` with swap-outs turned into a sync after the blob's last write and a
    drop where the swap-out was: the same placements, pool use, bytes each way."""
    assert [s.in_use for s in early.steps] == [s.in_use for s in lazy.steps]
    for direction in ("h2d", "d2h"):
        assert early.bytes_moved(direction) == lazy.bytes_moved(direction)
    last_write, synced = {}, {}
    turned = 0
    for index, (a, b) in enumerate(zip(lazy.steps, early.steps)):
        for mine, theirs in ((a.release, b.release), (a.demand, b.demand)):
            assert len(mine) == len(theirs)
            for x, y in zip(mine, theirs):
                if x.kind == "swap_out" and y.kind == "drop":
                    assert (x.blob, x.offset, x.size, x.why) == (y.blob, y.offset, y.size, y.why)
                    written = last_write[x.blob]
                    assert synced.pop(x.blob) == written + 1 < index   # synced after the write
                    turned += 1
                else:
                    assert x == y
        extra = b.prefetch[len(a.prefetch):]
        assert b.prefetch[:len(a.prefetch)] == a.prefetch
        for action in extra:
            assert action.kind == "sync" and action.blob not in synced
            synced[action.blob] = index
        for name in b.step.writes + b.step.updates + b.step.workspace:
            last_write[name] = index
    assert not synced                                       # every sync has its drop
    assert early.epilogue == lazy.epilogue
    return turned


@settings(max_examples=120, deadline=None)
@given(spec=random_nets(), prefetch=st.integers(0, 2), limit=st.sampled_from([None, 1 << 40]),
       keep_state=st.booleans(), scale=st.floats(1.0, 2.5))
def test_random_plans_written_back_early_replay_correctly(spec, prefetch, limit, keep_state,
                                                          scale):
    """Random nets, knobs and pools (steps split where they do not fit): the plan written back
    early passes the replay checker and differs from the lazy one only as it should."""
    layers, n, c, size = spec
    net, steps = build(layers, n, c, size)
    capacity = int(max(working_set_bytes(net, s) for s in steps) * scale) + 2048
    try:
        lazy, early = lazy_and_early(net, steps, capacity, prefetch=prefetch, limit=limit,
                                     keep_state=keep_state)
    except PlanError as error:
        assert "out of device memory" in str(error) or "does not fit" in str(error)
        return
    check_plan(early)
    assert_written_back(lazy, early)


def test_resnet_swap_outs_are_written_back_and_the_model_predicts_less_stall():
    net, steps = build(zoo.resnet(18, num_classes=4, width=16), 4, 3, 32)
    capacity = least_pool(net, steps, Policy(prefetch=1, keep_state=True))
    lazy, early = lazy_and_early(net, steps, capacity, prefetch=1, keep_state=True)
    check_plan(early)
    assert assert_written_back(lazy, early) >= 10
    assert any("early write-back" in note for note in early.notes)
    model = CostModel.for_device("cuda")
    assert simulate(early, net, model).stall_seconds < simulate(lazy, net, model).stall_seconds


@settings(max_examples=20, deadline=None)
@given(spec=random_nets())
def test_random_nets_written_back_early_train_bit_for_bit(spec):
    """Three iterations in the least pool with early write-back: LMS off's losses, weights and
    optimizer state, bit for bit."""
    layers, n, c, size = spec
    inputs = [batch(n, c, size, classes=3, seed=s) for s in (0, 1)]
    solver = lambda: SGD(0.05, momentum=0.9)   # noqa: E731
    expected = reference(layers, inputs, solver)
    net = make_net(layers, inputs[0])
    policy = Policy(prefetch=1, write_back="early")
    with make_device("cpu", least_pool(net, net.schedule(("momentum",)), policy)) as device:
        executor = LmsExecutor(net, device, solver(), policy)
        check_plan(executor.plan)
        assert_identical(train(executor, inputs), expected)


@pytest.mark.parametrize("layers, shape", [
    (DAG, (4, 2, 6, 3)),
    (zoo.resnet(18, num_classes=4, width=16), (4, 3, 32, 4)),
])
def test_residual_nets_written_back_early_train_bit_for_bit(layers, shape):
    n, c, size, classes = shape
    inputs = [batch(n, c, size, classes=classes, seed=s) for s in (0, 1)]
    solver = lambda: SGD(0.05, momentum=0.9)   # noqa: E731
    expected = reference(layers, inputs, solver)
    net = make_net(layers, inputs[0])
    policy = Policy(prefetch=2, keep_state=True, write_back="early")
    with make_device("cpu", least_pool(net, net.schedule(("momentum",)), policy)) as device:
        executor = LmsExecutor(net, device, solver(), policy)
        assert sum(a.kind == "sync" for _, a in executor.plan.actions()) >= 3
        assert_identical(train(executor, inputs), expected)


def test_auto_weighs_early_write_back_on_cuda_and_not_on_the_cpu_device():
    """On a GPU the copy engines run beside the kernels: ``auto`` takes early write-back where
    the model predicts it faster. On ``cpu`` the copies share the kernels' cores (measured no
    faster): it stays lazy."""
    net, steps = build(zoo.resnet(18, num_classes=4, width=16), 4, 3, 32)
    capacity = least_pool(net, steps, Policy())
    # a GPU whose copies matter on this small net: its kernels at 200 GFLOP/s, a link of
    # 1 GB/s, next to no host time a step (the default's 106 us would hide every copy)
    model = replace(CostModel.for_device("cuda"), flops_per_second=2e11,
                    copy_bytes_per_second=1e9, step_seconds_fixed=1e-6)
    on_gpu = auto_plan(net, steps, capacity, model)
    check_plan(on_gpu)
    assert on_gpu.policy.write_back == "early"
    lazy = make_plan(net, steps, capacity, replace(on_gpu.policy, policy="manual",
                                                  write_back="lazy"))
    assert simulate(on_gpu, net, model).seconds < simulate(lazy, net, model).seconds
    weighed = [p for p, _ in on_gpu.candidates + on_gpu.cut_short]
    assert sum(p.write_back == "early" for p in weighed) == 1
    on_cpu = auto_plan(net, steps, capacity, CostModel.for_device("cpu"))
    assert on_cpu.policy.write_back == "lazy"
    assert all(p.write_back == "lazy" for p, _ in on_cpu.candidates + on_cpu.cut_short)


@pytest.mark.parametrize("value", ["lazy", "early"])
def test_the_write_back_knob(tmp_path, value):
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{zoo: lenet}}\nlms: {{write_back: {value}}}\n")
    policy = lms_policy(load_config(config))
    assert policy.write_back == value
    assert ("write_back early" in policy.describe()) == (value == "early")


def test_a_bad_write_back_knob_names_the_key(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("model: {zoo: lenet}\nlms: {write_back: sometimes}\n")
    with pytest.raises(ConfigError, match=r"lms\.write_back.*lazy or early"):
        load_config(config)
    with pytest.raises(ConfigError, match="lms.write_back"):
        Policy(write_back="sometimes")


@pytest.mark.cuda
@pytest.mark.usefixtures("small_gemm_tile")
def test_cuda_written_back_early_trains_bit_for_bit():
    """The cuda device (the simulator without a GPU): its copy streams and events order the
    early syncs and the drops as the cpu device's do; a tiny net in its least pool, one
    iteration: the resident executor's weights."""
    layers = TINY
    inputs = batch(1, 1, 4, classes=3)
    solver = lambda: SGD(0.1, momentum=0.9)   # noqa: E731
    expected = reference(layers, [inputs], solver, "cuda", iterations=1)
    net = make_net(layers, inputs)
    policy = Policy(prefetch=1, write_back="early")
    with new_device("cuda", least_pool(net, net.schedule(("momentum",)), policy)) as device:
        executor = LmsExecutor(make_net(layers, inputs), device, solver(), policy)
        assert sum(a.kind == "sync" for _, a in executor.plan.actions()) >= 2
        assert_identical(train(executor, [inputs], iterations=1), expected)
