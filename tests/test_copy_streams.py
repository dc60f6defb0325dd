"""Two copy streams, one each way: a load waits for the swap-outs still reading its space or
writing its home, a step for the copies of either stream it depends on, and nothing else waits;
training with a slow d2h stream still gives LMS off's weights, bit for bit (and would not, were
the loads not ordered after the swap-outs)."""
import threading
import time

import numpy as np
import pytest

from minilms.device import cpu_streams, make_device
from minilms.lms import LmsExecutor, Policy, least_pool
from minilms.lms.plan import Action, Plan, StepPlan
from minilms.lms.replay import Program
from minilms.net import Step
from minilms.solver import SGD

from .test_executor import batch
from .test_lms import DAG, assert_identical, make_net, reference, train


@pytest.fixture(autouse=True)
def copies_on_their_threads(monkeypatch):
    """The copy streams' threads whatever cores this machine has (``cpu_streams.copy_threads``
    keeps copies where issued where every core computes): what these tests are about; a test
    of copies where issued sets the switch itself."""
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", True)


def program(steps, chunks=None):
    plan = Plan(Policy(), 4096, {}, {}, [], steps, [])
    if chunks:
        plan.chunks.update(chunks)
    return Program(None, plan, {}, True)


def swap_out_then_load(load_blob, load_offset, chunks=None):
    """Step 0 swaps ``x`` out of ``[0, 256)``; step 1 loads ``load_blob`` at ``load_offset``."""
    out = Action.make("swap_out", "x", 64, 0, 256)
    load = Action.make("swap_in", load_blob, 64, load_offset, 256)
    steps = [StepPlan(Step(0, "forward", "a"), [out], [], []),
             StepPlan(Step(1, "forward", "b", reads=(load_blob,)), [], [load], [])]
    return program(steps, chunks), out, load


def test_directions_have_their_own_numbering():
    made, out, load = swap_out_then_load("y", 1024)
    assert made.sequence_of[id(out)] == ("d2h", 1)
    assert made.sequence_of[id(load)] == ("h2d", 1)
    assert [sorted(streams) for _, streams, _ in made.copying] == [["d2h"], ["h2d"]]


def test_a_load_waits_for_a_swap_out_still_reading_its_space():
    made, _, load = swap_out_then_load("y", 0)
    assert made.load_waits == {id(load): 1} and ("d2h", 1) in made.marks
    assert made.copying[1][2] == (("h2d", 1),)          # the step waits for its own load only
    elsewhere, _, _ = swap_out_then_load("y", 1024)
    assert elsewhere.load_waits == {}


def test_a_load_waits_for_the_swap_out_writing_its_home():
    """``x`` swapped out of one place and loaded into another: the load reads the home the
    swap-out writes. The same for a chunk of a split step, whose home is rows of its parent's."""
    made, _, load = swap_out_then_load("x", 1024)
    assert made.load_waits == {id(load): 1}
    chunked, _, load = swap_out_then_load("whole", 1024, chunks={"x": ("whole", 0, 2)})
    assert chunked.load_waits == {id(load): 1}


def test_a_step_writing_space_a_swap_out_still_reads_waits_for_it():
    out = Action.make("swap_out", "x", 64, 0, 256)
    for offset, waits in ((0, (("d2h", 1),)), (1024, ())):
        steps = [StepPlan(Step(0, "forward", "a"), [out], [], []),
                 StepPlan(Step(1, "forward", "b", writes=("y",)), [],
                          [Action.make("alloc", "y", 64, offset, 256)], [])]
        assert program(steps).copying[1][2] == waits


def test_one_wait_covers_what_came_before_it_on_its_stream():
    """Two swap-outs from the same space, then two loads into it: the first load waits for the
    second swap-out (which covers the first); the second load waits for nothing more."""
    actions = [Action.make("swap_out", "p", 64, 0, 256), Action.make("swap_out", "q", 64, 0, 256)]
    loads = [Action.make("swap_in", "r", 64, 0, 256), Action.make("swap_in", "s", 64, 0, 256)]
    steps = [StepPlan(Step(0, "forward", "a"), actions, [], []),
             StepPlan(Step(1, "forward", "b", reads=("r", "s")), [], loads, [])]
    made = program(steps)
    assert made.load_waits == {id(loads[0]): 2}
    assert made.copying[1][2] == (("h2d", 2),)


def slow_d2h(device, seconds):
    """Each swap-out starts ``seconds`` late on the d2h stream: a load not ordered after it would
    overwrite the space it has not read yet."""
    d2h = device.d2h

    def late(dst, src, stream=None, label=""):
        if stream is not None:
            stream.submit(lambda: time.sleep(seconds))
        d2h(dst, src, stream, label)
    device.d2h = late


def run_lms(layers, batches, solver, capacity, disable_load_waits=False):
    with make_device("cpu", capacity) as device:
        slow_d2h(device, 0.003)
        executor = LmsExecutor(make_net(layers, batches[0]), device, solver(), Policy(prefetch=2))
        waits = sum(len(p.load_waits) for p in executor.programs.values())
        if disable_load_waits:
            for made in executor.programs.values():
                made.load_waits.clear()
                made.issue = made.issue_lists()
        return waits, train(executor, batches, iterations=2)


def solver():
    return SGD(0.05, momentum=0.9)


def lms_off_and_least_pool():
    """The DAG's two batches, LMS off's loss and weights after two iterations, its least pool."""
    batches = [batch(2, 2, 6, 3, seed=s) for s in (0, 1)]
    net = make_net(DAG, batches[0])
    return (batches, reference(DAG, batches, solver, iterations=2),
            least_pool(net, net.schedule(("momentum",)), Policy(prefetch=2)))


def test_slow_swap_outs_still_give_the_weights_of_lms_off():
    layers = DAG
    batches, expected, capacity = lms_off_and_least_pool()
    waits, got = run_lms(layers, batches, solver, capacity)
    assert waits > 0               # the plan has loads into space or homes of swap-outs
    assert_identical(got, expected)
    # the same run with those loads unordered: they overtake the late swap-outs
    with np.errstate(all="ignore"):    # overwritten data computes garbage: overflow, NaN
        _, broken = run_lms(layers, batches, solver, capacity, disable_load_waits=True)
    assert broken[0] != expected[0] or any(
        not np.array_equal(broken[1][k], v) for k, v in expected[1].items())


def test_copies_in_pieces_that_a_waiting_thread_shares_give_the_weights_of_lms_off(monkeypatch):
    """Every copy in pieces of 16 bytes (``cpu_streams.SPLIT``), the compute thread copying
    pieces while it waits, swap-outs late: LMS off's weights, bit for bit."""
    from minilms.device import cpu_streams
    monkeypatch.setattr(cpu_streams, "SPLIT", 16)
    split = []
    real_init = cpu_streams.SplitCopy.__init__

    def counted(self, *args):
        real_init(self, *args)
        split.append(self.pieces)
    monkeypatch.setattr(cpu_streams.SplitCopy, "__init__", counted)
    batches, expected, capacity = lms_off_and_least_pool()
    _, got = run_lms(DAG, batches, solver, capacity)
    assert len(split) > 10 and max(split) > 1
    assert_identical(got, expected)


def test_copies_run_where_issued_give_the_weights_of_lms_off(monkeypatch):
    """``cpu_streams.COPY_THREADS`` off: every copy runs in the thread that issues it (none on a
    copy stream's thread, none in pieces), each free to share itself out to the kernels' threads
    (``parallel``), and training gives LMS off's weights, bit for bit."""
    from minilms.device import cpu_streams, streaming
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", False)
    monkeypatch.setattr(streaming, "PARALLEL_MIN", 1 << 10)     # this small net's copies too
    threads, shared, real_copy = set(), set(), streaming.copy

    def copy(dst, src, parallel=False, cached=False):
        threads.add(threading.current_thread().name)
        shared.add(parallel)
        real_copy(dst, src, parallel, cached)
    monkeypatch.setattr(streaming, "copy", copy)
    monkeypatch.setattr(cpu_streams, "SplitCopy", None)     # a copy in pieces would fail here
    batches, expected, capacity = lms_off_and_least_pool()
    _, got = run_lms(DAG, batches, solver, capacity)
    assert threads == {threading.current_thread().name} and shared == {True}
    assert_identical(got, expected)
