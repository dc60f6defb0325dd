"""Shared by the dataset tests: no test may leave a loader thread running."""
import time

import pytest

from .helpers import loader_threads


@pytest.fixture(autouse=True)
def no_leaked_loader_threads():
    # Only this test's threads: a failed test's traceback may keep its loader alive, and that
    # should not fail every test after it.
    before = set(loader_threads())

    def leaked():
        return set(loader_threads()) - before

    yield
    deadline = time.monotonic() + 2.0
    while leaked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not leaked(), "a BatchLoader thread outlived its test"
