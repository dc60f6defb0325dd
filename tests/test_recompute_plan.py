"""Recompute in the plan (issue 21): the schedule rewrite, its plans, and training that is bit for
bit LMS off's."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms import zoo
from minilms.config import load_config
from minilms.config.build import lms_policy
from minilms.device import make_device
from minilms.errors import ConfigError, PlanError
from minilms.lms import LmsExecutor, Policy, cost
from minilms.lms.bounds import working_set_bytes
from minilms.lms.check import check_plan
from minilms.lms.planner import make_plan
from minilms.lms.recompute import (
    RECOMPUTE,
    candidates,
    checkpointed,
    recompute_schedule,
    recomputed,
)
from minilms.solver import SGD

from .devices import new_device
from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)
from .test_executor import batch
from .test_lms import DAG, assert_identical, make_net, reference, train
from .test_plan import build
from .test_substeps import random_nets

ALL_TYPES = ("Convolution", "BatchNorm", "ReLU", "Dropout", "Pooling", "Eltwise", "Concat",
             "InnerProduct", "Flatten")


def test_recompute_steps_come_before_the_first_backward_read():
    net, steps = build(DAG, 4, 2, 6)
    chosen = ["c1", "pool"]    # c1: conv1's top through bn1 and the in-place relu1
    rewritten = recompute_schedule(net, steps, chosen)
    assert [s.index for s in rewritten] == list(range(len(rewritten)))
    kinds = [(s.kind, s.layer) for s in rewritten]
    for blob in chosen:
        first = next(i for i, s in enumerate(rewritten)
                     if s.kind == "backward" and blob in s.reads + s.updates)
        makers = [i for i, s in enumerate(rewritten) if s.kind == RECOMPUTE
                  and blob in s.writes + s.updates]
        assert makers and max(makers) < first
    # c1 is made by bn1 and updated in place by relu1: both run again, in that order
    assert kinds.index((RECOMPUTE, "bn1")) < kinds.index((RECOMPUTE, "relu1"))
    # the drop-out over pool is in place: rebuilding pool re-runs the pooling and the drop-out,
    # which reads its saved mask
    dropout = next(s for s in rewritten if s.kind == RECOMPUTE and s.layer == "drop")
    assert "drop.mask" in dropout.reads and "pool" in dropout.updates
    assert all(s.kind != RECOMPUTE for s in steps)


def test_candidates_are_activations_backward_reads():
    net, steps = build(DAG, 4, 2, 6)
    found = candidates(net, steps)
    assert "loss" not in found and "data" not in found and "fc" not in found  # fc: loss reads
    backward_reads = {n for s in steps if s.kind == "backward" for n in s.reads}
    assert found and set(found) <= backward_reads


def test_a_chain_rebuilds_a_bottom_first():
    """``sum`` is read by the branch convolution's backward; choosing it and ``c1`` (its
    bottom, through the residual add) rebuilds c1 before the add runs again."""
    net, steps = build(DAG, 4, 2, 6)
    rewritten = recompute_schedule(net, steps, ["sum", "c1", "c2"])
    order = [s.layer for s in rewritten if s.kind == RECOMPUTE]
    assert order.index("relu1") < order.index("add") and order.index("conv2") < order.index("add")
    plan = make_plan(net, rewritten, 1 << 22, Policy())
    check_plan(plan)


@settings(max_examples=120, deadline=None)
@given(spec=random_nets(), data=st.data(), prefetch=st.integers(0, 2),
       limit=st.sampled_from([None, 1 << 40]), scale=st.floats(1.0, 2.0))
def test_random_recomputes_replay_correctly(spec, data, prefetch, limit, scale):
    """Random nets, random blobs recomputed, random knobs and pools: every plan passes the
    replay checker (a re-run reads only valid data), or the planner says it does not fit."""
    layers, n, c, size = spec
    net, steps = build(layers, n, c, size)
    found = candidates(net, steps)
    chosen = [b for b in found if data.draw(st.booleans())]
    rewritten = recompute_schedule(net, steps, chosen)
    capacity = int(max(working_set_bytes(net, s) for s in rewritten) * scale) + 2048
    try:
        plan = make_plan(net, rewritten, capacity, Policy(prefetch=prefetch, limit=limit))
    except PlanError as error:
        assert "out of device memory" in str(error)
        return
    check_plan(plan)


@settings(max_examples=25, deadline=None)
@given(spec=random_nets(), data=st.data())
def test_random_recomputes_train_bit_for_bit(spec, data):
    """Random nets with random blobs recomputed: three iterations give LMS off's losses,
    weights and optimizer state bit for bit."""
    layers, n, c, size = spec
    inputs = [batch(n, c, size, classes=3, seed=s) for s in (0, 1)]
    net = make_net(layers, inputs[0])
    found = candidates(net, net.schedule(("momentum",)))
    types = tuple(data.draw(st.sets(st.sampled_from(ALL_TYPES), min_size=1)))
    solver = lambda: SGD(0.05, momentum=0.9)   # noqa: E731
    expected = reference(layers, inputs, solver)
    with make_device("cpu", 64 << 20) as device:
        executor = LmsExecutor(make_net(layers, inputs[0]), device, solver(),
                               Policy(recompute=types))
        check_plan(executor.plan)
        made = recomputed(executor.net, executor.plan)
        assert set(made) >= {b for b in found
                             if all(ly.type in types for ly in cost.producers(net, b))}
        assert_identical(train(executor, inputs), expected)


@pytest.mark.parametrize("layers, shape", [
    (DAG, (4, 2, 6, 3)),
    (zoo.resnet(18, num_classes=4, width=16), (4, 3, 32, 4)),
    (zoo.googlenet(num_classes=4, width=32), (2, 3, 64, 4)),
])
def test_recomputing_every_candidate_trains_bit_for_bit(layers, shape):
    """Residual and inception nets, with batch norm and dropout, every candidate recomputed, in
    a pool that makes the rest travel: LMS off's losses and weights, bit for bit."""
    solver = lambda: SGD(0.05, momentum=0.9, weight_decay=1e-4)   # noqa: E731
    batches = [batch(*shape, seed=s) for s in (0, 1)]
    expected = reference(layers, batches, solver)
    net = make_net(layers, batches[0])
    steps = net.schedule(("momentum",))
    rewritten = recompute_schedule(net, steps, candidates(net, steps))
    capacity = max(working_set_bytes(net, s) for s in rewritten) * 2
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(make_net(layers, batches[0]), device, solver(),
                               Policy(recompute=ALL_TYPES, prefetch=1))
        assert len(recomputed(executor.net, executor.plan)) == len(candidates(net, steps))
        assert "recompute" in executor.plan.notes[-1]
        assert_identical(train(executor, batches), expected)


@pytest.mark.cuda
@pytest.mark.simulator_slow
@pytest.mark.usefixtures("small_gemm_tile")
def test_cuda_recompute_trains_bit_for_bit():
    """The cuda device (the simulator without a GPU): the residual + inception net with batch
    norm and dropout, every candidate recomputed, one iteration: the resident executor's."""
    inputs = batch(2, 2, 6, classes=3)
    solver = lambda: SGD(0.1, momentum=0.9)   # noqa: E731
    expected = reference(DAG, [inputs], solver, "cuda", iterations=1)
    net = make_net(DAG, inputs)
    steps = net.schedule(("momentum",))
    rewritten = recompute_schedule(net, steps, candidates(net, steps))
    with new_device("cuda", max(working_set_bytes(net, s) for s in rewritten) * 2) as device:
        executor = LmsExecutor(make_net(DAG, inputs), device, solver(),
                               Policy(recompute=ALL_TYPES))
        assert recomputed(executor.net, executor.plan)
        assert_identical(train(executor, [inputs], iterations=1), expected)


def test_auto_recomputes_where_the_link_is_slow_and_not_where_it_is_free():
    """``auto`` keeps the plan the cost model predicts fastest: over a slow link (copies at
    1 MB/s, compute nearly free), in a pool 1.05 times the largest working set, it rebuilds
    memory-bound layers' outputs: dropped rather than swapped out, their space takes a load at
    once, where a swap-out's space makes the load wait for it (the copy streams run each way at
    once, so the time is not the bytes moved: this plan moves a few percent more, and is
    predicted a fifth faster). Over a link as fast as compute is slow, it recomputes nothing.
    Its plan is never predicted slower than the plan without recompute. (With the adds apart
    it recomputed in 1.1 times; in place their blobs are fewer, and there nothing is rebuilt.)"""
    net, steps = build(zoo.resnet(18, num_classes=4, width=16), 4, 3, 32)
    capacity = int(max(working_set_bytes(net, s) for s in steps) * 1.05)
    slow = cost.CostModel(1e15, 1e15, 1e6, "slow link")
    plan = cost.plan_for(net, steps, capacity, Policy(policy="auto", recompute="auto"), slow)
    check_plan(plan)
    without = cost.plan_for(net, steps, capacity, Policy(policy="auto"), slow)
    assert recomputed(net, plan)
    assert cost.simulate(plan, net, slow).seconds < 0.9 * cost.simulate(without, net, slow).seconds
    free = cost.CostModel(1e6, 1e15, 1e15, "free link")
    assert not recomputed(net, cost.plan_for(net, steps, capacity,
                                             Policy(policy="auto", recompute="auto"), free))


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("off", "off"), (False, "off"),
                                             ("[BatchNorm, ReLU]", ("BatchNorm", "ReLU"))])
def test_the_recompute_knob(tmp_path, value, expected):
    config = tmp_path / "run.yaml"
    text = value if isinstance(value, str) else str(value).lower()
    config.write_text(f"model: {{zoo: lenet}}\nlms: {{recompute: {text}}}\n")
    policy = lms_policy(load_config(config))
    assert policy.recompute == expected
    if expected != "off":
        assert "recompute" in policy.describe()


def test_a_bad_recompute_knob_names_the_key(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("model: {zoo: lenet}\nlms: {recompute: 3}\n")
    with pytest.raises(ConfigError, match=r"lms\.recompute.*auto, off, or a list of layer types"):
        load_config(config)
    with pytest.raises(ConfigError, match="lms.recompute"):
        Policy(recompute="sometimes")


def live_activation_peak(net, steps) -> int:
    """The most activation bytes live at once: a blob is live at each step that uses it and
    between two uses where the later one reads it (not where it is written afresh, as a
    recompute writes it): an independent walk of the schedule, no planner."""
    uses: dict = {}
    for position, step in enumerate(steps):
        for name in set(step.blobs):
            if net.blobs[name].role == "activation":
                uses.setdefault(name, []).append(position)
    live = [0] * len(steps)
    for name, positions in uses.items():
        spans = [(p, p) for p in positions]
        spans += [(a, b) for a, b in zip(positions, positions[1:])
                  if name in steps[b].reads + steps[b].updates]
        for position in {p for a, b in spans for p in range(a, b + 1)}:
            live[position] += net.blobs[name].nbytes
    return max(live)


def chain(depth):
    return build(zoo.chain(depth, channels=4), 2, 3, 8)


def test_sqrt_n_checkpoints_hold_sqrt_n_activations_for_one_extra_forward():
    """Chen et al.'s result on plain conv-BN-ReLU chains: with sqrt(N) segments the activations
    live at once grow as sqrt(N), not N (4x the depth: about 2x, not 4x, the bytes), for at
    most one extra forward; the planner's plan of the rewritten schedule holds what the naive
    walk says (and the two outputs it keeps to the end) and passes the replay checker."""
    peaks, keep = {}, {}
    for depth in (16, 64):
        net, steps = chain(depth)
        found = candidates(net, steps)
        blobs = checkpointed(net, found, round(len(found) ** 0.5))
        rewritten = recompute_schedule(net, steps, blobs)
        forward = sum(net.layer[s.layer].flops() for s in steps if s.kind == "forward")
        assert sum(net.layer[s.layer].flops() for s in rewritten if s.kind == RECOMPUTE) <= forward
        peaks[depth], keep[depth] = (live_activation_peak(net, rewritten),
                                     live_activation_peak(net, steps))
        plan = make_plan(net, rewritten, 1 << 26, Policy(limit=1 << 26, keep_state=True))
        check_plan(plan)
        held = max(sum(net.blobs[b].nbytes for b in s.resident
                       if net.blobs[b].role == "activation") for s in plan.steps)
        outputs = sum(net.blobs[b].nbytes for b in plan.outputs)    # loss, accuracy: kept
        assert peaks[depth] <= held <= peaks[depth] + outputs
    assert keep[64] / keep[16] > 3.5                  # keeping everything: linear in N
    assert peaks[64] / peaks[16] < 2.6                # checkpoints: about sqrt(4) = 2
    assert peaks[64] < keep[64] / 4


def test_checkpoints_end_runs_at_blobs_costly_to_make():
    """A run of the checkpoints ends at a convolution's output, never at a batch norm's: the
    cheap layers are the ones run again."""
    net, steps = chain(8)
    found = candidates(net, steps)
    counts = []
    for segments in (2, 3, 4, len(found)):
        kept = [b for b in found if b not in checkpointed(net, found, segments)]
        assert kept and all(net.layer[b].type == "Convolution" for b in kept)
        counts.append(len(kept))
    assert counts == sorted(counts) and counts[-1] == 8      # every convolution's output


def test_auto_reaches_the_checkpoints_where_no_copy_pays():
    """Over a link so slow that no swap pays, in a pool too small to keep every activation,
    ``auto`` finds the sqrt(N) checkpoints: its plan swaps no activation out."""
    net, steps = chain(36)
    found = candidates(net, steps)
    rewritten = recompute_schedule(net, steps, checkpointed(net, found,
                                                            round(len(found) ** 0.5)))
    capacity = int(1.2 * make_plan(net, rewritten, 1 << 26,
                                   Policy(limit=1 << 26, keep_state=True)).peak)
    slow = cost.CostModel(1e12, 1e12, 1e5, "a link no swap pays on")
    plan = cost.plan_for(net, steps, capacity, Policy(policy="auto", recompute="auto"), slow)
    check_plan(plan)
    assert len(recomputed(net, plan)) > len(found) // 2
    assert not [a for _, a in plan.actions() if a.kind == "swap_out"
                and net.blobs[a.blob].role == "activation" and a.blob not in plan.outputs]
    without = cost.plan_for(net, steps, capacity, Policy(policy="auto"), slow)
    assert cost.simulate(plan, net, slow).seconds < cost.simulate(without, net, slow).seconds / 2
