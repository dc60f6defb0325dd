"""``lms.forked.map_halves``: half of the work in a forked child, the results in order, the
child's failure made good here; and ``policy: auto`` choosing the same plan with the child as
without it."""
import os
import threading

import pytest

from minilms.lms import forked
from minilms.lms.auto import auto_plan
from minilms.lms.check import check_plan
from minilms.lms.cost import CostModel

from .test_plan import AUTO_DECISIONS, net_named, plan_digest

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")


def test_without_a_child_everything_runs_here_in_order():
    here = os.getpid()
    out = forked.map_halves(lambda items: [(os.getpid(), x * x) for x in items], list(range(7)),
                            fork=False)
    assert out == [(here, x * x) for x in range(7)]


@needs_fork
def test_the_odd_items_run_in_a_child_and_come_back_in_order():
    here = os.getpid()
    out = forked.map_halves(lambda items: [[os.getpid(), x, x / 3] for x in items],
                            list(range(9)), fork=True)
    assert [x for _, x, _ in out] == list(range(9))
    assert [third for _, _, third in out] == [x / 3 for x in range(9)]   # floats exact via JSON
    assert {pid for pid, _, _ in out[0::2]} == {here}
    children = {pid for pid, _, _ in out[1::2]}
    assert len(children) == 1 and here not in children


@needs_fork
def test_a_failed_child_is_made_good_here():
    here = os.getpid()

    def work(items):
        if os.getpid() != here:
            raise RuntimeError("a planted failure in the child")
        return [x + 1 for x in items]
    assert forked.map_halves(work, list(range(6)), fork=True) == list(range(1, 7))


@needs_fork
def test_a_result_that_is_not_json_is_made_good_here():
    here = os.getpid()
    out = forked.map_halves(lambda items: [object() if os.getpid() != here else x
                                           for x in items], [1, 2, 3, 4], fork=True)
    assert out == [1, 2, 3, 4]


@needs_fork
def test_a_failure_here_is_raised_and_the_child_reaped():
    here = os.getpid()

    def work(items):
        if os.getpid() == here:
            raise ValueError("here")
        return list(items)
    with pytest.raises(ValueError, match="here"):
        forked.map_halves(work, list(range(200_000)), fork=True)   # more than a pipe's buffer
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)                # no child left behind


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
    """The choice is the first of the fastest in the candidates' order however they are dealt
    out: the same plan, action for action, as the one process's (and as before: the digests of
    tests/test_plan.py); every candidate weighed or cut short once, in the same order."""
    name, scale = case.split("|")
    net, steps, least, _ = net_named(name)
    plans = {}
    for fork in (False, True):
        monkeypatch.setattr(forked, "can_fork", lambda fork=fork: fork)
        plans[fork] = auto_plan(net, steps, int(least * float(scale)),
                                CostModel.for_device("cpu"))
        check_plan(plans[fork])
        assert plan_digest(plans[fork]) == AUTO_DECISIONS[case]
    alone, halves = plans[False], plans[True]
    assert alone.policy == halves.policy

    def every(plan):
        return sorted(repr(p) for p, _ in plan.candidates + plan.cut_short)
    assert every(alone) == every(halves)
    weighed = dict((repr(p), s) for p, s in alone.candidates)
    for policy, seconds in halves.candidates:    # what both planned in full, they timed alike
        if repr(policy) in weighed:
            assert seconds == weighed[repr(policy)]
