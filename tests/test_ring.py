"""Iterations issued ahead of their results (``LmsExecutor.submit``, ``minilms.lms.ring``): the host
writes the next iteration's inputs and issues it while the device may still copy the last one's
outputs home, and every value read late is the one ``iterate`` gives, the weights bit for bit.

On ``cpu`` the kernels run in the calling thread, so what runs behind the host there is the copy
streams' work (each a thread): the outputs' copies home, which the ring keeps apart per iteration.
On ``cuda`` (the simulator here; the same tests on a GPU) the kernels are behind the host too."""
import time

import numpy as np
import pytest

from minilms.device import CpuDevice, cpu_streams
from minilms.device.link import Link
from minilms.lms import LmsExecutor, Policy, least_pool, resident_bytes
from minilms.lms.ring import SLOTS
from minilms.solver import SGD

from .devices import new_device
from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)
from .test_executor import batch
from .test_lms import DAG, make_net

BATCHES = [batch(2, 2, 6, classes=3, seed=s) for s in range(3)]
POLICIES = {"off": Policy(enabled=False), "default": Policy(), "prefetch": Policy(prefetch=2)}
MLP = [  # small enough for the simulator, with both outputs (loss and accuracy)
    {"name": "fc1", "type": "InnerProduct", "bottom": "data", "top": "fc1", "num_output": 5},
    {"name": "relu", "type": "ReLU", "bottom": "fc1", "top": "fc1"},
    {"name": "fc2", "type": "InnerProduct", "bottom": "fc1", "top": "fc2", "num_output": 3},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc2", "label"], "top": "loss"},
    {"name": "accuracy", "type": "Accuracy", "bottom": ["fc2", "label"], "top": "accuracy"},
]


def capacity(policy, layers=DAG):
    net = make_net(layers, BATCHES[0])
    steps = net.schedule(("momentum",))
    return resident_bytes(net, steps) if not policy.enabled else least_pool(net, steps, policy)


def weights(executor):
    executor.sync_state()
    return {n: b.host_data().copy() for n, b in executor.shared.items()}


def run(device, policy, read, layers=DAG, iterations=5):
    """Training iterations and an evaluation; ``read(executor, batches)`` -> losses."""
    executor = LmsExecutor(make_net(layers, BATCHES[0]), device, SGD(0.05, momentum=0.9),
                           policy)
    values = read(executor, [BATCHES[i % len(BATCHES)] for i in range(iterations)])
    values.append(executor.submit(BATCHES[0], train=False).result())
    return values, weights(executor)


def one_by_one(executor, batches):
    return [executor.iterate(inputs) for inputs in batches]


def all_then_read(executor, batches):
    """Every iteration issued before any value is read, and the device idle before the first
    read: a slot reused without its outputs read out first would give a later iteration's."""
    pending = [executor.submit(inputs) for inputs in batches]
    executor.device.synchronize()
    return [p.result() for p in pending]


def each_after_the_next(executor, batches):
    """The training loop's order: iteration ``i`` read once ``i + 1`` is issued."""
    values, last = [], None
    for inputs in batches:
        pending = executor.submit(inputs)
        if last is not None:
            values.append(last.result())
        last = pending
    return values + [last.result()]


def assert_same_run(kind, policy, read, layers=DAG, iterations=5):
    with new_device(kind, capacity(policy, layers)) as device:
        expected = run(device, policy, one_by_one, layers, iterations)
    with new_device(kind, capacity(policy, layers)) as device:
        got = run(device, policy, read, layers, iterations)
    assert np.isfinite([v["loss"] for v in expected[0]]).all()
    assert len({v["loss"] for v in expected[0]}) > 1       # every iteration's loss its own
    assert got[0] == expected[0]
    for name, value in expected[1].items():
        np.testing.assert_array_equal(got[1][name], value, err_msg=name)


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("read", [all_then_read, each_after_the_next])
def test_values_read_late_are_those_read_at_once(policy, read):
    assert_same_run("cpu", policy, read)


@pytest.mark.cuda
@pytest.mark.usefixtures("small_gemm_tile")
@pytest.mark.parametrize("policy", [
    # LMS off's stream is every other CUDA test's; under the simulator the LMS one is enough
    pytest.param(POLICIES["off"], id="off", marks=pytest.mark.simulator_slow),
    pytest.param(POLICIES["default"], id="default")])
def test_values_read_late_are_those_read_at_once_on_cuda(policy):
    """On a GPU the kernels and copies of the iterations issued ahead run behind the host for
    real (the simulator runs them as they are issued). Three iterations: the third reuses the
    first's slot."""
    assert_same_run("cuda", policy, all_then_read, MLP, iterations=3)


class SlowLink(Link):
    """Every copy lasts ``seconds``, however small: a link far behind the host."""

    def __init__(self, seconds):
        super().__init__("slow", 1.0)
        self.seconds = seconds

    def hold(self, started, nbytes):
        time.sleep(max(0.0, started + self.seconds - time.perf_counter()))


def test_submit_returns_before_the_outputs_are_home_and_the_homes_alternate():
    """LMS off on a link whose copies last 0.2 s (once the parameters are in): ``submit``
    returns while the loss is still being copied home (``done()`` is False) and ``result()``
    waits for it; each iteration writes its inputs into the other of two homes (``SLOTS``), the
    third into the first's again."""
    policy = POLICIES["off"]
    link = SlowLink(0.0)
    with CpuDevice(capacity(policy), link=link) as device:
        executor = LmsExecutor(make_net(DAG, BATCHES[0]), device, SGD(0.05, momentum=0.9), policy)
        device.synchronize()
        link.seconds = 0.2
        homes, pending = [], []
        for inputs in BATCHES:
            pending.append(executor.submit(inputs))
            homes.append(executor.blobs["data"].host)
            if len(pending) == 1:
                assert not pending[0].done()
        values = [p.result() for p in pending]
        assert all(p.done() for p in pending)
    assert SLOTS == 2
    assert homes[0] is not homes[1] and homes[2] is homes[0]
    with CpuDevice(capacity(policy)) as device:
        expected = run(device, policy, one_by_one)[0][:3]
    assert values == expected


def test_a_program_switch_reads_out_what_is_pending():
    """Iterations issued on batches of 2, then one of 3 (a plan of its own, homes carved again
    from the same slots): the values issued before the switch are kept."""
    policy = Policy()
    small, large = BATCHES[0], batch(3, 2, 6, classes=3, seed=7)
    net = make_net(DAG, large)
    pool = least_pool(net, net.schedule(("momentum",)), policy)
    order = [small, small, large, small]

    def values(read):
        with CpuDevice(pool) as device:
            executor = LmsExecutor(make_net(DAG, small), device, SGD(0.05, momentum=0.9), policy)
            return read(executor, order)
    assert values(all_then_read) == values(one_by_one)


def test_an_iteration_issued_ahead_waits_on_the_device_for_the_last_ones_copies_home(monkeypatch):
    """Every copy home starts 20 ms late on the ``d2h`` stream. The next iteration, issued at
    once, must not overwrite the space those copies still read (the outputs a pinned blob's sync
    reads, the space of what the epilogue swaps out): its compute and loads wait, on the device,
    for the last iteration's last copy. Without that wait the same run reads other values. The
    copies on the copy streams' threads (``cpu_streams.copy_threads``: where issued, every copy
    is done before the next step, and nothing can overtake it)."""
    from .test_copy_streams import slow_d2h
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", True)

    def values(policy, unordered=False):
        with CpuDevice(capacity(policy)) as device:
            executor = LmsExecutor(make_net(DAG, BATCHES[0]), device, SGD(0.05, momentum=0.9),
                                   policy)
            slow_d2h(device, 0.02)
            submit = executor.submit

            def ahead(inputs, train=True):
                if unordered:
                    executor._ended = None      # forget the last iteration's copies
                return submit(inputs, train)
            executor.submit = ahead
            return [p.result()["loss"] for p in [ahead(b) for b in BATCHES * 2]], \
                weights(executor)

    for policy in (POLICIES["off"], POLICIES["default"]):
        with CpuDevice(capacity(policy)) as device:
            reference = run(device, policy, one_by_one, iterations=6)
        losses, got = values(policy)
        assert losses == [v["loss"] for v in reference[0][:6]]
        for name, value in reference[1].items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        with np.errstate(all="ignore"):     # overwritten data computes garbage: overflow, NaN
            broken, broken_weights = values(policy, unordered=True)
        assert broken != losses or any(
            not np.array_equal(broken_weights[k], v) for k, v in reference[1].items())


def test_the_training_loop_never_waits_for_the_whole_device():
    """Issuing the next iteration and then reading the last one's loss makes no
    ``device.synchronize``: the host waits only on events (the last iteration's outputs, the loads
    of two iterations ago). ``iterate`` synchronizes once an iteration."""
    policy = POLICIES["default"]
    with CpuDevice(capacity(policy)) as device:
        executor = LmsExecutor(make_net(DAG, BATCHES[0]), device, SGD(0.05, momentum=0.9), policy)
        synchronize, calls = device.synchronize, []

        def counted():
            calls.append(1)
            synchronize()
        device.synchronize = counted
        each_after_the_next(executor, BATCHES * 2)
        assert calls == []
        one_by_one(executor, BATCHES)
        assert len(calls) == len(BATCHES)
