"""``kernels.mkl``: MKL's GEMM for the cpu device's products. Against a float64 product on the
shapes and views the convolutions pass (batched, broadcast, transposed, strided, a slice of a
larger ``out``); the same bits from call to call, at any alignment and however ``blas_threads``
deals the work out (what LMS on equals LMS off rests on); numpy's matmul wherever MKL cannot or
should not run; ``MINILMS_BLAS`` read and checked. The MKL cases need the ``mkl`` wheel, which
the ``test`` extra installs."""
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from minilms.errors import ConfigError
from minilms.kernels import blas_threads, mkl

needs_mkl = pytest.mark.skipif(not mkl.available(), reason="no libmkl_rt here: pip install mkl "
                                                           "(the test extra brings it)")


@pytest.fixture
def on_mkl(monkeypatch):
    """MKL chosen, every product large enough for it, and its GEMM calls counted."""
    monkeypatch.setitem(mkl._state, "chosen", "mkl")
    monkeypatch.setattr(mkl, "MIN_FLOPS", 0)
    calls = []
    gemm = mkl._gemm

    def counting(a, b, out):
        done = gemm(a, b, out)
        calls.append(done)
        return done

    monkeypatch.setattr(mkl, "_gemm", counting)
    return calls


def _random(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _views(rng):
    """``(a, b, out)`` triples as the kernels pass them: plain, transposed operands (``gemm``'s
    ``a.T @ b``, a weight gradient's ``dy @ x^T``), rows of a larger array, one group's slice of
    a convolution's output, batched with a shared weight."""
    a, b = _random(rng, (40, 24)), _random(rng, (24, 30))
    yield a, b, np.empty((40, 30), np.float32)
    yield _random(rng, (24, 40)).T, _random(rng, (30, 24)).T, np.empty((40, 30), np.float32)
    big = _random(rng, (50, 64))
    yield big[3:43, 5:29], b, np.empty((40, 30), np.float32)
    top = np.full((2, 3, 40, 30), np.nan, np.float32)
    yield a, b, top[1, 2]
    yield _random(rng, (16, 24)), _random(rng, (5, 24, 30)), np.empty((5, 16, 30), np.float32)
    yield _random(rng, (5, 16, 24)), _random(rng, (5, 24, 30)), np.empty((5, 16, 30), np.float32)
    yield _random(rng, (1, 16, 24)), _random(rng, (5, 24, 30)), np.empty((5, 16, 30), np.float32)


@needs_mkl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_equal_the_float64_product(on_mkl, dtype):
    rng = np.random.default_rng(0)
    for a, b, out in _views(rng):
        a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
        out = out if out.dtype == dtype else np.empty(out.shape, dtype)
        on_mkl.clear()
        mkl.product(a, b, out)
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol)
        assert on_mkl and all(on_mkl)       # every product went to MKL, none fell back


@needs_mkl
def test_only_the_output_is_written(on_mkl):
    rng = np.random.default_rng(1)
    a, b = _random(rng, (40, 24)), _random(rng, (24, 30))
    top = np.full((2, 3, 40, 30), np.nan, np.float32)
    mkl.product(a, b, top[1, 2])
    assert np.isfinite(top[1, 2]).all()
    assert np.isnan(top[0]).all() and np.isnan(top[1, :2]).all()


def _aligned_copy(array, offset: int):
    """``array``'s values at ``offset`` floats past a 64-byte boundary."""
    buffer = np.empty(array.size + 32, np.float32)
    start = (-(buffer.ctypes.data // 4)) % 16 + offset
    copy = buffer[start:start + array.size].reshape(array.shape)
    copy[...] = array
    return copy


@needs_mkl
@pytest.mark.parametrize("m, k, n", [(64, 256, 3136 // 4), (256, 64, 784), (37, 300, 53)])
def test_the_same_bits_at_every_alignment_and_every_call(on_mkl, m, k, n):
    """LMS on puts a blob at another pool offset than LMS off does: the bits must not move."""
    rng = np.random.default_rng(m)
    a, b = _random(rng, (m, k)), _random(rng, (k, n))
    want = np.empty((m, n), np.float32)
    mkl.product(a, b, want)
    for offset in (1, 3, 8):
        got = _aligned_copy(np.zeros((m, n), np.float32), offset)
        mkl.product(_aligned_copy(a, offset), _aligned_copy(b, (offset * 5) % 16), got)
        np.testing.assert_array_equal(got, want)
    again = np.empty_like(want)
    mkl.product(a, b, again)
    np.testing.assert_array_equal(again, want)


@pytest.mark.parametrize("library", ["mkl", "openblas"])
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape_a, shape_b", [((64, 256), (8, 256, 196)), ((96, 128), (128, 300)),
                                              ((40, 128), (128, 900)), ((64, 700), (700, 256))])
def test_dealt_out_products_are_right_and_the_same_every_call(monkeypatch, library, threads,
                                                              shape_a, shape_b):
    """By products, rows or columns: right, the same bits on every call (what LMS on equals LMS
    off rests on), and each piece exactly its own one-thread product, as ``parts`` deals it. Not
    necessarily the whole call's bits on one thread: either library may take another kernel for
    a piece's shape (OpenBLAS's did on an AMD EPYC, not on an AVX-512 Xeon; blas_threads'
    docstring)."""
    if library == "mkl" and not mkl.available():
        pytest.skip("no libmkl_rt here: pip install mkl (the test extra brings it)")
    monkeypatch.setitem(mkl._state, "chosen", library)
    monkeypatch.setattr(mkl, "MIN_FLOPS", 0)
    rng = np.random.default_rng(threads)
    a, b = _random(rng, shape_a), _random(rng, shape_b)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    pieces = np.empty(shape, np.float32)
    with threadpool_limits(1, user_api="blas"):       # as each piece runs
        for part in blas_threads.parts(shape, threads):
            a_part, b_part, out_part = blas_threads._piece(a, b, pieces, *part)
            alone = np.empty(out_part.shape, np.float32)
            mkl.product(a_part, b_part, alone)
            out_part[...] = alone
    monkeypatch.setattr(blas_threads.numba, "get_num_threads", lambda: threads)
    monkeypatch.setattr(blas_threads, "MIN_FLOPS", 0)
    dealt, again = np.empty(shape, np.float32), np.empty(shape, np.float32)
    blas_threads.matmul(a, b, out=dealt)
    blas_threads.matmul(a, b, out=again)
    np.testing.assert_array_equal(again, dealt)
    np.testing.assert_allclose(dealt, np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(dealt, pieces)


@needs_mkl
def test_pieces_run_where_the_whole_call_would(on_mkl, monkeypatch):
    """A call just over ``MIN_FLOPS`` cut in two: each piece is under it, yet runs on MKL, as
    the whole would; one just under it stays on numpy's matmul in every piece (on the helper
    threads, where ``mkl.product`` runs them; ``test_blas_calls.py`` has Numba's)."""
    monkeypatch.setattr(blas_threads, "NUMBA_THREADS", False)
    monkeypatch.setattr(blas_threads.numba, "get_num_threads", lambda: 2)
    monkeypatch.setattr(blas_threads, "MIN_FLOPS", 0)
    rng = np.random.default_rng(5)
    a, b = _random(rng, (64, 64)), _random(rng, (64, 300))
    out = np.empty((64, 300), np.float32)
    for least, on in ((2.0 * a.size * 300 - 1, True), (2.0 * a.size * 300 + 1, False)):
        monkeypatch.setattr(mkl, "MIN_FLOPS", least)
        on_mkl.clear()
        blas_threads.matmul(a, b, out=out)
        assert on_mkl == ([True, True] if on else [])
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@needs_mkl
def test_what_mkl_cannot_take_is_numpys(on_mkl):
    """A view without a unit stride, an empty product, integers: numpy's matmul, right."""
    rng = np.random.default_rng(2)
    a, b = _random(rng, (20, 24)), _random(rng, (24, 60))
    out = np.empty((20, 30), np.float32)
    mkl.product(a, b[:, ::2], out)
    np.testing.assert_allclose(out, a @ b[:, ::2], rtol=1e-5, atol=1e-5)
    empty = np.full((20, 30), np.nan, np.float32)
    mkl.product(np.empty((20, 0), np.float32), np.empty((0, 30), np.float32), empty)
    assert (empty == 0).all()
    ints = np.empty((3, 3), np.int64)
    mkl.product(np.eye(3, dtype=np.int64), np.arange(9).reshape(3, 3), ints)
    np.testing.assert_array_equal(ints, np.arange(9).reshape(3, 3))
    assert on_mkl == [False, False]     # the float32 ones were offered and declined


def test_small_products_and_openblas_are_numpys(monkeypatch):
    calls = []
    monkeypatch.setattr(mkl, "_gemm", lambda *args: calls.append(args) or True)
    monkeypatch.setitem(mkl._state, "chosen", "mkl")
    rng = np.random.default_rng(3)
    a, b = _random(rng, (8, 8)), _random(rng, (8, 8))
    out = np.empty((8, 8), np.float32)
    mkl.product(a, b, out)                        # 1 kFLOP: below MIN_FLOPS
    np.testing.assert_array_equal(out, np.matmul(a, b))
    monkeypatch.setattr(mkl, "MIN_FLOPS", 0)
    monkeypatch.setitem(mkl._state, "chosen", "openblas")
    mkl.product(a, b, out)
    assert calls == []
    monkeypatch.setitem(mkl._state, "chosen", "mkl")
    mkl.product(a, b, out)
    assert len(calls) == 1


@pytest.mark.parametrize("value, chosen", [("openblas", "openblas"), (" MKL ", "mkl"),
                                           ("", None)])
def test_minilms_blas_chooses(monkeypatch, value, chosen):
    monkeypatch.setitem(mkl._state, "chosen", None)
    monkeypatch.setenv("MINILMS_BLAS", value)
    if chosen == "mkl" and not mkl.available():
        with pytest.raises(ConfigError, match="pip install mkl"):
            mkl.chosen()
        return
    default = "mkl" if mkl.available() and mkl.cpu_vendor() in ("GenuineIntel", "") else "openblas"
    assert mkl.chosen() == (chosen or default)


@pytest.mark.parametrize("vendor, default", [("GenuineIntel", "mkl"), ("", "mkl"),
                                             ("AuthenticAMD", "openblas"),
                                             ("HygonGenuine", "openblas")])
def test_unset_the_cpus_vendor_chooses(monkeypatch, vendor, default):
    """MKL on Intel's CPUs (and where the vendor cannot be read), OpenBLAS on others', where MKL
    measured slower; MINILMS_BLAS still wins on any vendor."""
    monkeypatch.setattr(mkl, "cpu_vendor", lambda: vendor)
    monkeypatch.setitem(mkl._state, "searched", True)
    monkeypatch.setitem(mkl._state, "library", object())    # as if MKL had loaded
    monkeypatch.delenv("MINILMS_BLAS", raising=False)
    monkeypatch.setitem(mkl._state, "chosen", None)
    assert mkl.chosen() == default
    monkeypatch.setenv("MINILMS_BLAS", "mkl")
    monkeypatch.setitem(mkl._state, "chosen", None)
    assert mkl.chosen() == "mkl"
    monkeypatch.setitem(mkl._state, "library", None)         # without the wheel: OpenBLAS
    monkeypatch.delenv("MINILMS_BLAS")
    monkeypatch.setitem(mkl._state, "chosen", None)
    assert mkl.chosen() == "openblas"


def test_cpu_vendor_reads_proc_cpuinfo():
    vendor = mkl.cpu_vendor()
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith("vendor_id")]
    except OSError:
        lines = []
    assert vendor == (lines[0].split(":")[1].strip() if lines else "")


def test_a_bad_or_missing_library_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(mkl._state, "chosen", None)
    monkeypatch.setenv("MINILMS_BLAS", "mlk")
    with pytest.raises(ConfigError, match=r"^environment: MINILMS_BLAS: expected mkl or openblas, "
                                          r"found 'mlk'"):
        mkl.chosen()
    monkeypatch.setitem(mkl._state, "searched", True)
    monkeypatch.setitem(mkl._state, "library", None)       # as on a machine without the wheel
    assert not mkl.available()
    with pytest.raises(ConfigError, match="MINILMS_BLAS: expected a library that loads here"):
        mkl.use("mkl")


def test_the_first_products_from_two_threads_agree(monkeypatch):
    """The first products of a process may come from blas_threads' threads at once: the one
    that arrives while the other is still loading the library waits for it instead of finding
    "searched, nothing there" (which made MINILMS_BLAS=mkl fail in a benchmark)."""
    import threading
    import time
    loading = threading.Event()

    def slow_open():
        loading.set()
        time.sleep(0.2)
        return "a library"

    monkeypatch.setattr(mkl, "_state", {"library": None, "searched": False, "chosen": None})
    monkeypatch.setattr(mkl, "_open", slow_open)
    seen = []
    first = threading.Thread(target=lambda: seen.append(mkl.available()))
    first.start()
    loading.wait()
    seen.append(mkl.available())
    first.join()
    assert seen == [True, True]


@pytest.mark.parametrize("shape, strides, want", [
    ((4, 6), (24, 4), (mkl._NO_TRANS, 6)),      # C-contiguous
    ((4, 6), (4, 16), (mkl._TRANS, 4)),         # a transposed C array
    ((4, 6), (40, 4), (mkl._NO_TRANS, 10)),     # rows of a wider array
    ((1, 6), (400, 4), (mkl._NO_TRANS, 6)),     # one row: its stride means nothing
    ((4, 6), (48, 8), None),                    # every other column
    ((4, 6), (24, -4), None),                   # reversed
    ((4, 6), (26, 4), None),                    # not a whole number of floats apart
])
def test_which_views_go_in_as_they_are(shape, strides, want):
    base = np.zeros(1000, np.float32)
    view = np.lib.stride_tricks.as_strided(base[100:], shape, strides)
    assert mkl._operand(view, 4) == want


def test_numba_keeps_openmp_where_the_wheel_brings_tbb():
    """The ``mkl`` wheel installs ``tbb``, which Numba prefers by default; importing minilms first
    keeps its parallel loops on OpenMP (what the cpu kernels were tuned for), in a process of
    its own since the layer is chosen once."""
    import subprocess
    import sys
    program = ("import minilms, numba, numpy as np\n"
               "@numba.njit(parallel=True)\n"
               "def bump(a):\n"
               "    for i in numba.prange(a.size):\n"
               "        a[i] += 1\n"
               "bump(np.zeros(4))\n"
               "print(numba.threading_layer())\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY")}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    try:
        import numba.np.ufunc.omppool  # noqa: F401  (Numba's OpenMP layer loads here)
    except ImportError:
        pytest.skip("Numba's OpenMP layer does not load on this machine")
    assert done.stdout.split() == ["omp"]


@needs_mkl
@pytest.mark.parametrize("blas, loaded", [("mkl", "True"), ("openblas", "False"),
                                          ("", str(mkl.cpu_vendor() in ("GenuineIntel", "")))])
def test_mkl_loads_with_the_import_unless_openblas_is_asked_for(blas, loaded):
    """Loaded (and its CPU kernels opened by a small product) while minilms is imported, so the
    library's pages are part of the import, not of a run's memory; not at all where OpenBLAS
    will run the products (MINILMS_BLAS=openblas, or unset on a CPU not Intel's). A process of
    its own: it happens once."""
    import os
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", "import minilms.kernels.mkl as m; "
                           "print(m._state['searched'])"], capture_output=True, text=True,
                          env={**os.environ, "MINILMS_BLAS": blas}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [loaded]


@pytest.mark.parametrize("library", ["mkl", "openblas"])
def test_accumulate_adds_the_product_to_out(monkeypatch, library):
    """``accumulate``: ``out += a @ b`` (MKL's beta of 1, numpy's through a temporary), for a 2-D
    product into a window of a larger array (the row windows' way) and a batch."""
    if library == "mkl" and not mkl.available():
        pytest.skip("no libmkl_rt here: pip install mkl (the test extra brings it)")
    monkeypatch.setitem(mkl._state, "chosen", library)
    monkeypatch.setattr(mkl, "MIN_FLOPS", 0)
    rng = np.random.default_rng(11)
    a, b = _random(rng, (12, 20)), _random(rng, (20, 40))
    room = _random(rng, (12, 50))
    window = room[:, 7:47]
    want = window.astype(np.float64) + a.astype(np.float64) @ b
    outside = room[:, :7].copy(), room[:, 47:].copy()
    mkl.product(a, b, window, accumulate=True)
    np.testing.assert_allclose(window, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(room[:, :7], outside[0])
    np.testing.assert_array_equal(room[:, 47:], outside[1])
    batch_a, batch_b = _random(rng, (3, 12, 20)), _random(rng, (3, 20, 8))
    out = _random(rng, (3, 12, 8))
    want = out.astype(np.float64) + np.matmul(batch_a.astype(np.float64), batch_b)
    mkl.product(batch_a, batch_b, out, accumulate=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.fixture
def small_blocks(monkeypatch):
    """``row_blocks``' rule scaled down to test-sized products: an inner dimension of 8 to 39,
    40 rows or more, 8 columns or more, blocks of 16 rows."""
    monkeypatch.setattr(mkl, "BLOCK_INNER", range(8, 40))
    monkeypatch.setattr(mkl, "BLOCK_MIN_ROWS", 40)
    monkeypatch.setattr(mkl, "BLOCK_MIN_COLUMNS", 8)
    monkeypatch.setattr(mkl, "BLOCK_ROWS", 16)


def test_row_blocks_cut_only_the_shapes_the_rule_names(small_blocks):
    item = 4
    # a [50, 24] @ [24, 30] into rows of 30 (ldc 30): blocks of 16 rows, the last of 2
    blocks = mkl.row_blocks((mkl._NO_TRANS, mkl._NO_TRANS, 50, 30, 24, 24, 30, 30), item)
    assert blocks == [(16, 0, 0), (16, 16 * 24 * item, 16 * 30 * item),
                      (16, 32 * 24 * item, 32 * 30 * item), (2, 48 * 24 * item, 48 * 30 * item)]
    # a transposed: a row of a is a column of its storage, one element on
    blocks = mkl.row_blocks((mkl._TRANS, mkl._NO_TRANS, 50, 30, 24, 64, 30, 40), item)
    assert [at for _, at, _ in blocks] == [0, 16 * item, 32 * item, 48 * item]
    assert [at for _, _, at in blocks] == [r * 40 * item for r in (0, 16, 32, 48)]
    for inner, rows, columns in ((7, 50, 30), (40, 50, 30), (24, 39, 30), (24, 50, 7)):
        arguments = (mkl._NO_TRANS, mkl._NO_TRANS, rows, columns, inner, inner, columns, columns)
        assert mkl.row_blocks(arguments, item) == [(rows, 0, 0)]


@needs_mkl
@pytest.mark.parametrize("accumulate", [False, True])
def test_products_in_row_blocks_are_right(small_blocks, monkeypatch, accumulate):
    """Every view ``_views`` passes, and the input gradient's transposed weight, cut in blocks of
    rows where the rule says: the float64 product, and the output outside the product left
    alone (a block written at a wrong offset would show in either)."""
    monkeypatch.setitem(mkl._state, "chosen", "mkl")
    monkeypatch.setattr(mkl, "MIN_FLOPS", 0)
    rng = np.random.default_rng(5)
    big = _random(rng, (60, 70))
    cases = list(_views(rng)) + [
        (_random(rng, (24, 50)).T, _random(rng, (24, 30)), np.empty((50, 30), np.float32)),
        (big[2:52, 3:27], _random(rng, (24, 30)), np.empty((50, 30), np.float32)),
        (_random(rng, (50, 24)), _random(rng, (4, 24, 30)), np.empty((4, 50, 30), np.float32))]
    cut = 0
    for a, b, out in cases:
        room = _random(rng, out.shape[:-1] + (out.shape[-1] + 9,))
        window = room[..., 4:4 + out.shape[-1]]
        before = room.copy()
        want = (window.astype(np.float64) if accumulate else 0) + np.matmul(
            a.astype(np.float64), b)
        mkl.product(a, b, window, "mkl", accumulate)
        np.testing.assert_allclose(window, want, rtol=1e-4, atol=1e-4)
        end = 4 + out.shape[-1]
        np.testing.assert_array_equal(room[..., :4], before[..., :4])
        np.testing.assert_array_equal(room[..., end:], before[..., end:])
        cut += a.shape[-2] >= mkl.BLOCK_MIN_ROWS
    assert cut >= 3


@needs_mkl
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("accumulate", [False, True])
def test_row_blocks_keep_the_whole_products_bits(monkeypatch, transposed, accumulate):
    """At the rule's own sizes (ResNet-50's 64 to 256 channels at 56x56, and that weight
    transposed for the input gradient) the blocks give each element the bits of one call over
    all rows: LMS on and off, and runs before this rule, agree bit for bit."""
    monkeypatch.setitem(mkl._state, "chosen", "mkl")
    rng = np.random.default_rng(9)
    m, k, n = 256, 64, 3136
    arguments = mkl.gemm_arguments(np.empty((m, k), np.float32), np.empty((k, n), np.float32),
                                   np.empty((m, n), np.float32))
    assert len(mkl.row_blocks(arguments, 4)) == 2
    a = _random(rng, (k, m)).T if transposed else _random(rng, (m, k))
    b, start = _random(rng, (k, n)), _random(rng, (m, n))
    blocked, whole = start.copy(), start.copy()
    mkl.product(a, b, blocked, "mkl", accumulate)
    monkeypatch.setattr(mkl, "ROW_BLOCKS", False)
    mkl.product(a, b, whole, "mkl", accumulate)
    np.testing.assert_array_equal(blocked, whole)
