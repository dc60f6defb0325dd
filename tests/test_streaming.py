"""The ``cpu`` device's streaming-store copies (``minilms.device.streaming``): every byte of the
source and nothing outside the destination, whatever the sizes and the two arrays' alignments;
which copies stream; and that the device's copies, whole and in pieces, take them."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.device import cpu, cpu_streams, make_device, streaming

GUARD = 200     # bytes either side of the destination that must stay untouched


def copied(nbytes, dst_offset, src_offset, seed=0, near=False, around=True):
    """A copy of ``nbytes`` random bytes between arrays at the given byte offsets from a
    64-byte boundary (the source prefetched ``near`` or not, the lines stored ``around`` the
    caches or not); returns the destination's buffer (guards included) and the source."""
    rng = np.random.default_rng(seed)
    source = rng.integers(0, 256, nbytes + 2 * GUARD, dtype=np.uint8)
    target = np.zeros(nbytes + 2 * GUARD + 64, np.uint8)
    start = GUARD + (dst_offset - target.ctypes.data - GUARD) % 64
    src = source[src_offset:src_offset + nbytes]
    streaming._stream_bytes(target[start:start + nbytes], src, near, around)
    return target, start, src


@settings(max_examples=60, deadline=None)
@given(nbytes=st.integers(0, 5000), dst_offset=st.integers(0, 63), src_offset=st.integers(0, 63),
       near=st.booleans(), around=st.booleans())
def test_every_byte_lands_and_nothing_else_is_written(nbytes, dst_offset, src_offset, near,
                                                      around):
    """The streaming loop itself, on any size (the head before the first line, whole lines, the
    tail), any alignment of either array, either kind of prefetch of the source, and streaming
    or plain stores."""
    target, start, src = copied(nbytes, dst_offset, src_offset, seed=nbytes, near=near,
                                around=around)
    assert (target[start:start + nbytes] == src).all()
    assert not target[:start].any() and not target[start + nbytes:].any()


@pytest.mark.parametrize("nbytes", [streaming.STREAM_MIN, 3 << 20 | 37])
def test_large_copies_of_any_dtype_are_the_source(nbytes):
    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64, np.int32):
        count = nbytes // np.dtype(dtype).itemsize
        src = rng.standard_normal(count).astype(dtype).reshape(-1, 1)    # 2-D: reshaped flat
        dst = np.empty_like(src)
        assert streaming.streams(dst, src)
        streaming.copy(dst, src)
        np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("vendor, intel", [("GenuineIntel", True), ("AuthenticAMD", False),
                                           (None, False)])
def test_the_prefetch_kind_follows_the_processors_vendor(tmp_path, vendor, intel):
    """Intel's processors get the near prefetch (the non-temporal one halves the copies there);
    another vendor, or a host without ``/proc/cpuinfo``, the non-temporal one."""
    cpuinfo = tmp_path / "cpuinfo"
    if vendor is not None:
        cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 6\n")
    assert streaming.intel_cpu(str(cpuinfo)) is intel


def test_which_copies_stream(monkeypatch):
    """At least ``STREAM_MIN`` bytes, both contiguous, and only while ``ENABLED``; the rest go
    through numpy.copyto, strided ones included, with the same result."""
    big = np.ones(streaming.STREAM_MIN, np.uint8)
    assert streaming.streams(np.empty_like(big), big)
    assert not streaming.streams(big[:-1].copy(), big[:-1])
    strided = np.ones((2, streaming.STREAM_MIN), np.uint8)[:, ::2]
    assert not streaming.streams(np.empty_like(strided), strided)
    out = np.zeros_like(strided)
    streaming.copy(out, strided)
    assert out.all()
    monkeypatch.setattr(streaming, "ENABLED", False)
    assert not streaming.streams(np.empty_like(big), big)


def test_the_devices_copies_stream_whole_and_in_pieces(monkeypatch):
    """A copy stream's whole copy and a ``SplitCopy``'s pieces both go through ``streaming``,
    and the bytes arrive either way (on the copy streams' threads, where pieces are shared);
    the swap-in's pieces in plain stores where ``CACHED_SWAP_INS``, the swap-out streamed."""
    monkeypatch.setattr(cpu_streams, "COPY_THREADS", True)
    monkeypatch.setattr(cpu, "CACHED_SWAP_INS", True)
    calls, stores = [], []
    real = streaming._stream_bytes

    def counted(dst, src, near, around):
        assert near == streaming.PREFETCH_NEAR
        calls.append(dst.size)
        stores.append(around)
        real(dst, src, near, around)
    monkeypatch.setattr(streaming, "_stream_bytes", counted)
    monkeypatch.setattr(cpu_streams, "SPLIT", streaming.STREAM_MIN)
    nbytes = 4 * streaming.STREAM_MIN
    with make_device("cpu", 2 * nbytes) as device:
        slot = device.pool.allocate(nbytes, "x")
        view = device.view(slot, (nbytes // 4,), np.float32)
        host = np.arange(nbytes // 4, dtype=np.float32)
        device.h2d(view, host, stream=device.h2d_stream)           # in pieces
        device.synchronize()
        assert calls == [streaming.STREAM_MIN] * 4 and stores == [False] * 4
        np.testing.assert_array_equal(view, host)
        back = np.empty_like(host)
        monkeypatch.setattr(cpu_streams, "HELP_WHILE_WAITING", False)   # whole
        device.d2h(back, view, stream=device.d2h_stream)
        device.synchronize()
        assert calls[4:] == [nbytes] and stores[4:] == [True]
        np.testing.assert_array_equal(back, host)


@settings(max_examples=25, deadline=None)
@given(nbytes=st.integers(0, 20000), dst_offset=st.integers(0, 63), src_offset=st.integers(0, 63),
       parts=st.integers(1, 5))
def test_a_copy_shared_out_to_the_threads_lands_every_byte_and_nothing_else(nbytes, dst_offset,
                                                                            src_offset, parts):
    """``_stream_parallel``: a part a thread (the last one short, some empty on a small copy),
    each part's own head and tail, any alignment; the guards either side stay untouched."""
    rng = np.random.default_rng(nbytes)
    source = rng.integers(0, 256, nbytes + 64, dtype=np.uint8)[src_offset:src_offset + nbytes]
    target = np.zeros(nbytes + 2 * GUARD + 64, np.uint8)
    start = GUARD + (dst_offset - target.ctypes.data - GUARD) % 64
    streaming._stream_parallel(target[start:start + nbytes], source, streaming.PREFETCH_NEAR,
                               parts)
    assert (target[start:start + nbytes] == source).all()
    assert not target[:start].any() and not target[start + nbytes:].any()


def test_only_a_large_copy_told_it_may_share_goes_to_the_threads(monkeypatch):
    """``copy(..., parallel=True)`` of ``PARALLEL_MIN`` bytes and more goes to
    ``_stream_parallel`` (while ``PARALLEL``); a smaller one, or one not told, streams on the
    calling thread; the bytes arrive either way."""
    calls = []
    warm = np.ones(streaming.PARALLEL_MIN, np.uint8)      # compiled before the names are wrapped:
    streaming.copy(np.empty_like(warm), warm, parallel=True)  # a compile would meet the wrapper
    for name in ("_stream_parallel", "_stream_bytes"):
        real = getattr(streaming, name)
        monkeypatch.setattr(streaming, name,
                            lambda dst, src, near, *rest, real=real, name=name:
                            (calls.append((name, dst.size)), real(dst, src, near, *rest)))
    monkeypatch.setattr(streaming, "PARALLEL_MIN", 2 * streaming.STREAM_MIN)
    big = np.arange(streaming.PARALLEL_MIN // 4, dtype=np.float32)
    small = big[: streaming.STREAM_MIN // 4].copy()      # streams, but below PARALLEL_MIN
    for src, parallel, expected in ((big, True, "_stream_parallel"),
                                    (big, False, "_stream_bytes"),
                                    (small, True, "_stream_bytes")):
        calls.clear()
        dst = np.zeros_like(src)
        streaming.copy(dst, src, parallel=parallel)
        assert calls == [(expected, src.nbytes)]
        np.testing.assert_array_equal(dst, src)
    monkeypatch.setattr(streaming, "PARALLEL", False)
    calls.clear()
    streaming.copy(np.zeros_like(big), big, parallel=True)
    assert calls == [("_stream_bytes", big.nbytes)]


def test_swap_ins_stay_in_cache_where_the_pool_fits_in_it(tmp_path, monkeypatch):
    """``cpu.last_level_cache`` reads the last level's size from sysfs (0 without it); a device
    whose pool fits in it copies swap-ins (h2d) in plain stores, and streams swap-outs (d2h)
    whatever its size; ``CACHED_SWAP_INS`` overrides the rule."""
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "64K"),
                                                 (2, "Unified", "2048K"), (3, "Unified", "32M")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(f"{text}\n")
    assert cpu.last_level_cache(str(tmp_path)) == 32 << 20
    assert cpu.last_level_cache(str(tmp_path / "none")) == 0
    monkeypatch.setattr(cpu, "CACHES", str(tmp_path))
    seen = []
    real = streaming.copy
    monkeypatch.setattr(streaming, "copy", lambda dst, src, parallel=False, cached=False:
                        (seen.append(cached), real(dst, src, parallel, cached)))
    nbytes = streaming.STREAM_MIN
    host = np.arange(nbytes // 4, dtype=np.float32)
    for capacity, cached in ((16 << 20, True), (64 << 20, False)):
        with make_device("cpu", capacity) as device:
            assert device.pool_in_cache is cached
            view = device.view(device.pool.allocate(nbytes, "x"), host.shape, host.dtype)
            back = np.empty_like(host)
            seen.clear()
            device.h2d(view, host)
            device.d2h(back, view)
            assert seen == [cached, False]
            np.testing.assert_array_equal(back, host)
            for forced in (True, False):
                monkeypatch.setattr(cpu, "CACHED_SWAP_INS", forced)
                assert device.swap_ins_cached() is forced
            monkeypatch.setattr(cpu, "CACHED_SWAP_INS", None)
