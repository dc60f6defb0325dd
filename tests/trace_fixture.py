"""``@pytest.mark.limit_device_memory("64 MiB")``: fail a test whose device pool peaks above it.

Shaped like pytest-memray's ``limit_memory``, for the device pool instead of the host heap. An
autouse fixture records a trace (``minilms.trace``) around every test that carries the marker; when
the test body is done, the report of its call is turned into a failure if the traced peak exceeds
the limit, with a message that names the peak, the step running when it happened, and the biggest
blobs in the pool at that moment. Tests without the marker are not recorded (recording costs).

Load it from the root ``tests/conftest.py`` with ``pytest_plugins = ["tests.trace_fixture"]``
(or ``-p tests.trace_fixture``); the marker registers itself here.
"""
import pytest

from minilms.errors import ConfigError
from minilms.sizes import format_bytes, parse_size
from minilms.trace import record

MARKER = "limit_device_memory"
_TRACE = pytest.StashKey()


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MARKER}(limit): fail the test if the device pool's "
                                       "traced peak exceeds limit (a size like '64 MiB')")


def _limit(item) -> int | None:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    if len(marker.args) != 1 or marker.kwargs:
        pytest.fail(f"{MARKER} takes one size, like \"64 MiB\"", pytrace=False)
    try:
        return parse_size(marker.args[0], MARKER)
    except ConfigError as error:
        problem = str(error)
    pytest.fail(problem, pytrace=False)


@pytest.fixture(autouse=True)
def _device_memory_trace(request):
    """Record the test (its other fixtures' setup included, as they are set up after this one)."""
    limit = _limit(request.node)
    if limit is None:
        yield None
        return
    with record() as trace:
        request.node.stash[_TRACE] = (trace, limit)
        yield trace


def exceeded(trace, limit: int) -> str | None:
    """The failure message when ``trace`` peaked above ``limit``, else None."""
    if trace.peak <= limit:
        return None
    step = f"at step {trace.peak_step_index} ({trace.peak_step})" if trace.peak_step else \
        "outside any step"
    blobs = ", ".join(f"{name} {format_bytes(nbytes)} ({role})"
                      for name, nbytes, role in trace.biggest_at_peak(5))
    return (f"device memory peak {format_bytes(trace.peak)} exceeds the limit "
            f"{format_bytes(limit)} (by {format_bytes(trace.peak - limit)}), {step}; "
            f"biggest blobs then: {blobs or 'none'}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call" and report.passed and _TRACE in item.stash:
        message = exceeded(*item.stash[_TRACE])
        if message is not None:
            report.outcome = "failed"
            report.longrepr = message
    return report
