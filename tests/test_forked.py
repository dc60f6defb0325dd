"""``lms.forked``: work shared with a forked child (each item taken by whichever process is
free), the results in order, the child's failure made good here, one least number both see;
work started in a child and its value taken later; and ``policy: auto`` choosing the same plan
with the child as without it."""
import os
import threading
import time

import pytest

from minilms.lms import forked
from minilms.lms.auto import auto_plan
from minilms.lms.check import check_plan
from minilms.lms.cost import CostModel

from .test_plan import AUTO_DECISIONS, net_named, plan_digest

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")


def test_without_a_child_everything_runs_here_in_order():
    here = os.getpid()
    out = forked.map_forked(lambda x: (os.getpid(), x * x), list(range(7)), fork=False)
    assert out == [(here, x * x) for x in range(7)]


@needs_fork
def test_both_processes_take_items_and_the_results_come_back_in_order():
    here = os.getpid()

    def work(x):
        time.sleep(0.05)     # long enough that the child starts before the queue is empty
        return [os.getpid(), x, x / 3]
    out = forked.map_forked(work, list(range(10)), fork=True)
    assert [x for _, x, _ in out] == list(range(10))
    assert [third for _, _, third in out] == [x / 3 for x in range(10)]   # floats exact via JSON
    pids = {pid for pid, _, _ in out}
    assert here in pids and len(pids) == 2


@needs_fork
def test_a_slow_item_does_not_hold_back_the_rest():
    """Items are taken as processes come free: while one process works on the slow first item,
    the other takes every other one."""
    def work(x):
        time.sleep(0.6 if x == 0 else 0.01)
        return os.getpid()
    out = forked.map_forked(work, list(range(12)), fork=True)
    assert all(pid != out[0] for pid in out[1:])


@needs_fork
def test_a_failed_child_is_made_good_here():
    here = os.getpid()

    def work(x):
        if os.getpid() != here:
            raise RuntimeError("a planted failure in the child")
        time.sleep(0.01)
        return x + 1
    assert forked.map_forked(work, list(range(6)), fork=True) == list(range(1, 7))


@needs_fork
def test_a_result_that_is_not_json_is_made_good_here():
    here = os.getpid()

    def work(x):
        time.sleep(0.01)
        return object() if os.getpid() != here else x
    assert forked.map_forked(work, [1, 2, 3, 4], fork=True) == [1, 2, 3, 4]


@needs_fork
def test_a_failure_here_is_raised_and_the_child_reaped():
    here = os.getpid()

    def work(x):
        if os.getpid() == here:
            raise ValueError("here")
        return "x" * 100_000                       # more than a pipe's buffer, all told
    with pytest.raises(ValueError, match="here"):
        forked.map_forked(work, list(range(50)), fork=True)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)                # no child left behind


@needs_fork
def test_the_least_offered_is_seen_by_both_processes():
    least = forked.SharedLeast()
    assert least.value() == float("inf")
    least.offer(5.0)
    least.offer(7.0)                              # not less: no change
    here = os.getpid()

    def work(x):
        if os.getpid() != here:
            least.offer(2.0)                      # the child's offer, seen here
        time.sleep(0.05)
        return least.value()
    forked.map_forked(work, list(range(10)), fork=True)
    assert least.value() == 2.0


@needs_fork
def test_started_work_runs_in_a_child_beside_this_process():
    """``started``: the work runs in a child while this process goes on (both sleep at once:
    the two together take about one sleep, not two), and its JSON value comes back."""
    here = os.getpid()
    begun = time.perf_counter()
    result = forked.started(lambda: (time.sleep(0.3), [os.getpid(), 1 / 3])[1], fork=True)
    time.sleep(0.3)
    pid, third = result()
    assert pid != here and third == 1 / 3
    assert time.perf_counter() - begun < 0.55
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)                # reaped


def test_started_work_without_a_child_runs_here_when_asked_for():
    here = os.getpid()
    calls = []
    result = forked.started(lambda: calls.append(os.getpid()) or len(calls), fork=False)
    assert calls == []                            # not yet: when its value is asked for
    assert result() == 1 and calls == [here]


@needs_fork
@pytest.mark.parametrize("failure", ["raises", "not json"])
def test_started_work_that_fails_in_the_child_is_done_here(failure):
    here = os.getpid()

    def work():
        if os.getpid() != here:
            if failure == "raises":
                raise RuntimeError("a planted failure in the child")
            return object()
        return "here"
    assert forked.started(work, fork=True)() == "here"


def test_more_items_than_the_queue_holds_run_here():
    here = os.getpid()
    count = forked._QUEUE_LIMIT + 1
    assert forked.map_forked(lambda x: os.getpid(), list(range(count)), fork=True) == [here] * count


def test_no_child_while_another_thread_runs():
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not forked.can_fork()
    finally:
        stop.set()
        other.join()


@needs_fork
@pytest.mark.parametrize("case", sorted(AUTO_DECISIONS))
def test_auto_chooses_the_same_plan_with_a_child_as_without(case, monkeypatch):
    """The choice is the first of the fastest in the candidates' order whichever process weighs
    them: the same plan, action for action, as the one process's (and as before: the digests of
    tests/test_plan.py); every candidate weighed or cut short once."""
    name, scale = case.split("|")
    net, steps, least, _ = net_named(name)
    plans = {}
    for fork in (False, True):
        monkeypatch.setattr(forked, "can_fork", lambda fork=fork: fork)
        plans[fork] = auto_plan(net, steps, int(least * float(scale)),
                                CostModel.for_device("cpu"))
        check_plan(plans[fork])
        # seen once under CI's load (session 45): another digest, which of the two runs unknown
        assert plan_digest(plans[fork]) == AUTO_DECISIONS[case], (
            f"fork={fork}: chose {plans[fork].policy}; weighed {plans[fork].candidates}; cut "
            f"short {plans[fork].cut_short}")
    alone, halves = plans[False], plans[True]
    assert alone.policy == halves.policy

    def every(plan):
        return sorted(repr(p) for p, _ in plan.candidates + plan.cut_short)
    assert every(alone) == every(halves)
    weighed = dict((repr(p), s) for p, s in alone.candidates)
    for policy, seconds in halves.candidates:    # what both planned in full, they timed alike
        if repr(policy) in weighed:
            assert seconds == weighed[repr(policy)]
