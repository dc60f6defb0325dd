"""The planner's two eviction choices (``minilms.lms.victims``) against brute force."""
import math

from hypothesis import given
from hypothesis import strategies as st

from minilms.lms.victims import Victims, cheapest_window

UNMOVABLE = math.inf

blocks = st.lists(st.tuples(st.integers(1, 64),
                            st.one_of(st.just(UNMOVABLE), st.just(0.0),
                                      st.floats(0.0, 100.0, allow_nan=False))),
                  min_size=0, max_size=12)


def brute_force(lengths, costs, size):
    """Every run of consecutive movable blocks covering ``size`` whose first block is needed
    (without it the rest would not cover): the cheapest, the lowest among equals."""
    best = None
    for first in range(len(lengths)):
        for last in range(first, len(lengths)):
            run = range(first, last + 1)
            if any(costs[i] == UNMOVABLE for i in run):
                break
            covered = sum(lengths[i] for i in run)
            if covered < size or covered - lengths[first] >= size:
                continue
            cost = sum(costs[i] for i in run)
            if best is None or cost < best[0] - 1e-9:
                best = (cost, first, last)
    return best


@given(blocks, st.integers(1, 200))
def test_the_cheapest_window_is_the_cheapest_run_that_covers(found_blocks, size):
    lengths = [length for length, _ in found_blocks]
    costs = [cost for _, cost in found_blocks]
    window = cheapest_window(lengths, costs, size, UNMOVABLE)
    expected = brute_force(lengths, costs, size)
    if expected is None:
        assert window is None
        return
    first, last = window
    run = range(first, last + 1)
    assert all(costs[i] != UNMOVABLE for i in run)
    assert sum(lengths[i] for i in run) >= size
    assert math.isclose(sum(costs[i] for i in run), expected[0], abs_tol=1e-6)


def test_a_window_never_spans_an_unmovable_block():
    assert cheapest_window([4, 4, 4], [0.0, UNMOVABLE, 0.0], 8, UNMOVABLE) is None
    assert cheapest_window([4, 4, 4, 4], [0.0, UNMOVABLE, 1.0, 2.0], 8, UNMOVABLE) == (2, 3)
    # ties go to the lowest run
    assert cheapest_window([4, 4, 4], [0.0, 0.0, 0.0], 4, UNMOVABLE) == (0, 0)


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 9), st.integers(1, 4)),
                min_size=1, max_size=30), st.sets(st.sampled_from("abcdef")))
def test_victims_come_furthest_need_first_and_skip_the_protected(keys, protect):
    victims, latest = Victims(), {}
    for name, need, nbytes in keys:          # re-keying replaces a blob's entry
        victims.key(name, float(need), nbytes)
        latest[name] = (need, nbytes)
    order = sorted(latest, key=lambda n: (-latest[n][0], -latest[n][1], n))
    skipped, popped = [], []
    while (name := victims.next(protect, -1, skipped)) is not None:
        popped.append(name)
        victims.discard(name)
    assert popped == [n for n in order if n not in protect]
    victims.restore(skipped)                 # the protected come back, in order
    again = []
    while (name := victims.next(set(), -1, [])) is not None:
        again.append(name)
        victims.discard(name)
    assert again == [n for n in order if n in protect]


def test_victims_needed_too_soon_are_not_taken():
    victims = Victims()
    victims.key("soon", 3.0, 1)
    victims.key("later", 9.0, 1)
    assert victims.next(set(), 9.0, []) is None      # none needed after step 9
    assert victims.next(set(), 3.0, []) == "later"
