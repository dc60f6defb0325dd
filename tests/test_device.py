"""Both devices behind one interface: views, copies, streams and events, link model, set-up
errors."""
import time

import numpy as np
import pytest

from minilms.device import (
    AUTO_FRACTION,
    cpu_streams,
    make_device,
    parse_link,
    real_gpu_available,
    resolve_memory,
)
from minilms.device.cpu import host_memory_info
from minilms.errors import ConfigError

from .devices import KINDS, new_device


@pytest.mark.parametrize("kind", KINDS)
def test_views_share_the_pool_buffer(kind):
    with new_device(kind, 4096) as device:
        a = device.pool.allocate(64, "a")
        b = device.pool.allocate(64, "b")
        device.h2d(device.view(a, (4, 4), np.float32), np.ones((4, 4), np.float32))
        device.h2d(device.view(b, (16,), np.int32), np.arange(16, dtype=np.int32))
        np.testing.assert_array_equal(device.to_host(device.view(a, (16,), np.float32)), 1)
        np.testing.assert_array_equal(device.to_host(device.view(b, (4, 4), np.int32)).ravel(),
                                      np.arange(16))
        with pytest.raises(ValueError, match="do not fit"):
            device.view(a, (65,), np.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_zero_and_shape_checks(kind):
    with new_device(kind, 4096) as device:
        slot = device.pool.allocate(48, "x")
        view = device.view(slot, (3, 4), np.float32)
        host = device.alloc_host((3, 4), np.float32)
        host[...] = np.arange(12).reshape(3, 4)
        device.h2d(view, host)
        back = np.empty_like(host)
        device.d2h(back, view)
        np.testing.assert_array_equal(back, host)
        device.zero(view)
        np.testing.assert_array_equal(device.to_host(view), 0)
        with pytest.raises(ValueError, match="copy between"):
            device.h2d(view, np.zeros((4, 3), np.float32))
        with pytest.raises(ValueError, match="copy between"):
            device.d2h(np.zeros((3, 4), np.float64), view)


@pytest.mark.parametrize("kind", KINDS)
def test_copy_stream_then_event_orders_the_compute_stream(kind):
    with new_device(kind, 1 << 16) as device:
        slot = device.pool.allocate(4 * 1000, "x")
        view = device.view(slot, (1000,), np.float32)
        host = device.alloc_host((1000,), np.float32)
        for value in range(5):  # later copies must land after earlier ones: a stream is in order
            host_copy = device.alloc_host((1000,), np.float32)
            host_copy[...] = value
            device.h2d(view, host_copy, stream=device.h2d_stream)
        arrived = device.event()
        arrived.record(device.h2d_stream)
        arrived.wait(device.compute_stream)
        device.d2h(host, view, stream=device.compute_stream)
        device.synchronize()
        assert arrived.query()
        np.testing.assert_array_equal(host, 4)


def test_cpu_copy_stream_overlaps_with_the_caller():
    """With a 1 GB/s link, 16 MB take at least 16 ms; enqueueing them returns at once."""
    nbytes = 16 * 10**6
    with make_device("cpu", 2 * nbytes, link=1.0) as device:
        view = device.view(device.pool.allocate(nbytes, "x"), (nbytes,), np.uint8)
        host = np.ones(nbytes, np.uint8)
        start, done = device.event(timing=True), device.event(timing=True)
        start.record(device.h2d_stream)
        began = time.perf_counter()
        device.h2d(view, host, stream=device.h2d_stream)
        enqueued = time.perf_counter() - began
        done.record(device.h2d_stream)
        done.synchronize()
        assert start.elapsed_time(done) >= 16.0 * 0.999
        assert enqueued < 0.008
        assert view[-1] == 1


def test_cpu_copies_each_way_run_at_once():
    """A link holds each direction apart (full duplex): 8 MB in and 8 MB out over 0.25 GB/s, 32
    ms each, issued together on the two copy streams, end together, in about 32 ms, where one
    stream would take 64."""
    nbytes = 8 * 10**6
    with make_device("cpu", 2 * nbytes, link=0.25) as device:
        into = device.view(device.pool.allocate(nbytes, "in"), (nbytes,), np.uint8)
        out_of = device.view(device.pool.allocate(nbytes, "out"), (nbytes,), np.uint8)
        out_of[...] = 2
        host_in, host_out = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        began = time.perf_counter()
        device.h2d(into, host_in, stream=device.h2d_stream)
        device.d2h(host_out, out_of, stream=device.d2h_stream)
        device.synchronize()
        took = time.perf_counter() - began
        assert 0.032 <= took < 0.056        # both held their 32 ms, side by side
        assert into[-1] == 1 and host_out[-1] == 2


def test_cpu_link_model_slows_a_synchronous_copy_to_the_link():
    nbytes = 8 * 10**6
    with make_device("cpu", nbytes, link="pcie3") as device:
        view = device.view(device.pool.allocate(nbytes, "x"), (nbytes,), np.uint8)
        began = time.perf_counter()
        device.h2d(view, np.zeros(nbytes, np.uint8))
        assert time.perf_counter() - began >= nbytes / 16e9


def test_a_failed_copy_on_the_copy_stream_surfaces_on_synchronize(monkeypatch):
    """On the stream's thread (``cpu_streams.copy_threads``; where issued, a failure surfaces
    at once: ``tests/test_cpu_streams.py``)."""
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", True)
    with make_device("cpu", 4096) as device:
        view = device.view(device.pool.allocate(16, "x"), (4,), np.float32)
        device.h2d_stream.submit(lambda: 1 / 0)
        with pytest.raises(RuntimeError, match="h2d stream failed"):
            device.synchronize()
        device.h2d(view, np.ones(4, np.float32), stream=device.h2d_stream)  # stream still works
        device.synchronize()
        assert view[0] == 1


@pytest.mark.parametrize("value, name, gbps", [
    ("pcie3", "pcie3", 16), ("NVLink2", "nvlink2", 75), ("pcie4", "pcie4", 32),
    (12.5, "12.5GB/s", 12.5), ("40", "40GB/s", 40)])
def test_links(value, name, gbps):
    link = parse_link(value)
    assert (link.name, link.gbps) == (name, gbps)
    assert link.min_seconds(int(gbps * 1e9)) == pytest.approx(1.0)


def test_the_documents_link_ratio_is_kept():
    assert (parse_link("nvlink2").gbps / parse_link("pcie3").gbps
            == pytest.approx(150 / 32, rel=0.01))


@pytest.mark.parametrize("bad", ["pcie9", -3, 0, "fast", True])
def test_bad_links(bad):
    with pytest.raises(ConfigError, match=r"^device.link: expected one of pcie3"):
        parse_link(bad)
    assert parse_link(None) is None and parse_link("none") is None


def test_auto_picks_the_cpu_device_without_a_gpu():
    if real_gpu_available():
        pytest.fail("this test is for machines without a GPU; on a GPU see the next test")
    with make_device("auto", "1MiB") as device:
        assert device.kind == "cpu" and device.capacity == 2**20


@pytest.mark.cuda
def test_cuda_device_from_make_device():
    with make_device("cuda", "64KiB") as device:
        assert device.kind == "cuda" and device.capacity == 65536
        assert isinstance(device.alloc_host((2,), np.float32), np.ndarray)


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_auto_memory_takes_the_stated_fraction_of_what_is_free(kind):
    assert resolve_memory("auto", 10 * 2**30, kind) == int(AUTO_FRACTION[kind] * 10 * 2**30)
    assert resolve_memory("512MiB", 10 * 2**30, kind) == 2**29
    assert 0 < host_memory_info()[0] <= host_memory_info()[1]


@pytest.mark.parametrize("memory, expected", [
    ("-1", "a size like '512MiB' or '2GiB', or 'auto'"),
    ("3 parsecs", "a size like '512MiB' or '2GiB', or 'auto'"),
    ("100TiB", "(available host memory)"),
])
def test_bad_capacities_give_one_line(memory, expected):
    with pytest.raises(ConfigError) as error:
        make_device("cpu", memory)
    message = str(error.value)
    assert message.startswith("device.memory: expected") and expected in message
    assert f"found {memory!r}" in message and "\n" not in message


def test_bad_kind():
    with pytest.raises(ConfigError,
                       match=r"^device.kind: expected one of auto, cpu, cuda, found 'tpu'"):
        make_device("tpu", "1MiB")


def test_cpu_device_rejects_a_link_on_cuda():
    with pytest.raises(ConfigError, match="device.link"):
        make_device("cuda", "1MiB", link="pcie3")


def test_events_keep_time_only_when_asked():
    """As in CUDA, an event made without timing orders and waits but has no elapsed time; the
    executor's ordering events are made so, the trace's step timings with ``timing=True``."""
    with make_device("cpu", 4096) as device:
        untimed, timed = device.event(), device.event(timing=True)
        for event in (untimed, timed):
            event.record(device.h2d_stream)
            event.synchronize()
            assert event.query()
        with pytest.raises(RuntimeError, match="without timing"):
            untimed.elapsed_time(timed)
        assert timed.elapsed_time(timed) == 0.0
