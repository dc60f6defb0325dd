"""The planner, without a device: every plan it makes passes the independent replay checker, for
random knobs and capacities on residual and inception nets; eviction is furthest-next-use; the
least pool is tight; errors name the step, the bytes and the capacity."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms import zoo
from minilms.device.pool import ALIGNMENT
from minilms.errors import ConfigError, PlanError
from minilms.lms.check import check_plan
from minilms.lms.planner import (
    Liveness,
    Policy,
    least_pool,
    make_plan,
    resident_bytes,
    working_set_bytes,
)
from minilms.net import Net

from .test_executor import RESIDUAL_INCEPTION


def build(layers, n=2, c=2, size=6, train=True, state=("momentum",)):
    net = Net(layers, {"data": ((n, c, size, size), np.float32), "label": ((n,), np.int32)})
    steps = net.schedule(state)
    return net, (steps if train else [s for s in steps if s.kind == "forward"])


NETS = {
    "residual+inception": lambda: build(RESIDUAL_INCEPTION),
    "resnet18/16": lambda: build(zoo.resnet(18, num_classes=4, width=16), 4, 3, 32),
    "googlenet/32": lambda: build(zoo.googlenet(num_classes=4, width=32), 2, 3, 64),
    "lenet eval": lambda: build(zoo.lenet(), 8, 1, 28, train=False),
    "resnet18/16 adam": lambda: build(zoo.resnet(18, num_classes=4, width=16), 2, 3, 32,
                                      state=("exp_avg", "exp_avg_sq")),
}
_built = {}


def net_named(name):
    if name not in _built:
        net, steps = NETS[name]()
        _built[name] = (net, steps, least_pool(net, steps), resident_bytes(net, steps))
    return _built[name]


policies = st.builds(
    Policy, enabled=st.booleans(), policy=st.just("manual"),
    min_swap_bytes=st.sampled_from([0, 0, 512, 4096, 65536]),
    limit=st.one_of(st.none(), st.integers(0, 4 << 20)),
    start_fraction=st.sampled_from([0.0, 0.0, 0.3, 1.0]), prefetch=st.integers(0, 5),
    keep_state=st.booleans())


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(NETS)), policy=policies, scale=st.floats(0.9, 1.6))
def test_every_plan_replays_correctly(name, policy, scale):
    """Random knobs and a capacity around the least pool: a plan either fits and passes the
    checker (nothing lost, nothing overlapping, working sets resident, the iteration cyclic), or
    the planner says it does not fit; it never hands back a broken plan."""
    net, steps, least, everything = net_named(name)
    capacity = int(least * scale) if policy.enabled else int(everything * scale)
    try:
        plan = make_plan(net, steps, capacity, policy)
    except PlanError as error:
        assert "out of device memory" in str(error) and "\n" not in str(error)
        return
    check_plan(plan)
    assert plan.peak <= plan.capacity
    if not policy.enabled:
        assert plan.bytes_moved("h2d") == sum(net.blobs[n].nbytes for n in plan.host_inputs)


@pytest.mark.parametrize("name", sorted(NETS))
def test_least_pool_is_tight(name):
    net, steps, least, everything = net_named(name)
    assert least % ALIGNMENT == 0
    assert max(working_set_bytes(net, s) for s in steps) <= least < everything
    check_plan(make_plan(net, steps, least))
    for smaller in (least - ALIGNMENT, int(least * 0.95)):
        with pytest.raises(PlanError, match=r"out of device memory at step \d+ \("):
            make_plan(net, steps, smaller)


def test_lazy_plan_moves_only_state_and_io():
    """With room for everything and no soft limit to honour, nothing is evicted mid-iteration:
    the copies are the inputs, the outputs, and the parameters and state (in, and home again)."""
    net, steps, _, everything = net_named("resnet18/16")
    plan = make_plan(net, steps, everything, Policy(limit=everything))
    check_plan(plan)
    mid = [a for s in plan.steps for a in s.release + s.demand if a.kind == "swap_out"]
    assert mid == []
    live = Liveness(net, steps)
    state = sum(net.blobs[n].nbytes for n in live.persistent)
    io = sum(net.blobs[n].nbytes for n in live.host_inputs)
    assert plan.bytes_moved("h2d") == state + io
    assert plan.bytes_moved("d2h") == state + sum(net.blobs[n].nbytes for n in live.outputs)
    kept = make_plan(net, steps, everything, Policy(limit=everything, keep_state=True))
    assert kept.bytes_moved("h2d") == io      # state pinned: loaded once, in the prologue


def test_default_keeps_only_what_the_next_step_needs():
    """Caffe's default (soft limit 0): after each step, every blob the next step does not use
    leaves the pool, so the pool in use never exceeds two consecutive working sets."""
    net, steps, _, everything = net_named("residual+inception")
    plan = make_plan(net, steps, everything, Policy())
    check_plan(plan)
    for index, step_plan in enumerate(plan.steps):
        here = set(step_plan.step.blobs)
        before = set(plan.steps[index - 1].step.blobs) if index else set()
        assert set(step_plan.resident) <= here | before


def test_eviction_takes_the_furthest_next_use():
    """Whenever the planner evicts to make room ("furthest next use"), no blob it left in the pool
    (other than the step's own) is needed later than the one it evicted. When the space is there
    but in pieces, it clears a contiguous window instead, and says so ("contiguous space")."""
    net, steps, _, _ = net_named("resnet18/16")
    live = Liveness(net, steps)
    lazy = Policy(limit=1 << 40)      # evictions only where the pool is full: the planner's choice
    plan = make_plan(net, steps, least_pool(net, steps, lazy), lazy)
    reasons = {}
    for index, step_plan in enumerate(plan.steps):
        mine = set(step_plan.step.blobs)
        for action in step_plan.demand:
            if action.frees:
                reasons[action.why] = reasons.get(action.why, 0) + 1
            if action.why == "furthest next use":
                gone = live.need_after(action.blob, index)
                kept = [live.need_after(n, index) for n in step_plan.resident if n not in mine]
                assert all(need <= gone for need in kept), (step_plan.step.name, action)
    assert reasons.get("furthest next use", 0) > 10
    assert set(reasons) <= {"furthest next use", "contiguous space", "relocation", "dead"}
    everything = [a.why for _, a in plan.actions() if a.frees]
    assert all(everything) and "end of iteration" in everything


def test_prefetch_loads_ahead_and_falls_back_when_it_cannot_fit():
    net, steps, least, everything = net_named("resnet18/16")
    roomy = make_plan(net, steps, everything, Policy(prefetch=3))
    ahead = [a for s in roomy.steps for a in s.prefetch if a.kind == "swap_in"]
    assert ahead and all(a.for_step is not None for a in ahead)
    assert roomy.notes == []
    tight = make_plan(net, steps, least, Policy(prefetch=4))
    check_plan(tight)
    assert tight.policy.prefetch < 4 and "planned with prefetch" in tight.notes[0]


def test_pinned_blobs_stay_put():
    net, steps, _, everything = net_named("googlenet/32")
    plan = make_plan(net, steps, everything, Policy(min_swap_bytes=4096))
    small = {n for n, info in Liveness(net, steps).blobs.items() if info.nbytes < 4096}
    assert set(plan.pinned) == small
    for step_plan in plan.steps:
        assert not {a.blob for a in step_plan.actions if a.frees} & small


def test_errors_name_step_bytes_capacity():
    net, steps, least, everything = net_named("residual+inception")
    with pytest.raises(PlanError, match=r"^out of device memory at step \d+ \(.*\): LMS off keeps "
                                        r"every blob resident, .* capacity 1.00 KiB: turn LMS on"):
        make_plan(net, steps, 1024, Policy(enabled=False))
    with pytest.raises(PlanError, match=r"^out of device memory before the first step: .* "
                                        r"lower lms.min_swap_bytes"):
        make_plan(net, steps, least, Policy(min_swap_bytes=10**9))
    for bad in (dict(policy="fast"), dict(start_fraction=2.0), dict(prefetch=-1)):
        with pytest.raises(ConfigError, match=r"^lms"):
            Policy(**bad)
