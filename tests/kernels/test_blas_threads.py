"""``kernels.blas_threads.matmul``: numpy's matmul with the work dealt out to threads that each run
single-threaded BLAS. Against a float64 product on every shape the convolutions use (batched,
one product, tall, wide, transposed and strided operands, a slice of a larger ``out``); the
pieces cover ``out`` once; every piece runs with BLAS held to one thread and the counts come
back; results are the same from call to call."""
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from minilms.kernels import blas_threads

THREADS = 3   # more than this machine may have: the dealing does not depend on it


@pytest.fixture
def three_threads(monkeypatch):
    """Deal out to THREADS pieces, and record each piece's thread and BLAS thread counts: on the
    helper threads (``NUMBA_THREADS`` off; ``test_blas_calls.py`` has Numba's)."""
    monkeypatch.setattr(blas_threads, "NUMBA_THREADS", False)
    monkeypatch.setattr(blas_threads.numba, "get_num_threads", lambda: THREADS)
    monkeypatch.setattr(blas_threads, "MIN_FLOPS", 0)
    seen = []
    product = blas_threads._product

    def recording(a, b, out, library):
        seen.append((threading.get_ident(), out.shape,
                     [lib.num_threads for lib in blas_threads.libraries()]))
        product(a, b, out, library)

    monkeypatch.setattr(blas_threads, "_product", recording)
    return seen


def _operands(rng, shape_a, shape_b, dtype=np.float32):
    return (rng.standard_normal(shape_a).astype(dtype), rng.standard_normal(shape_b).astype(dtype))


CASES = [   # a, b, the axis the pieces cut
    ((8, 16, 12), (8, 12, 30), 0),      # a batch of products: by products
    ((16, 12), (5, 12, 30), 0),         # one weight, a batch of inputs (a 1x1 forward)
    ((1, 40, 12), (1, 12, 30), -2),     # one product of a batch: by rows
    ((40, 12), (12, 30), -2),           # tall: by rows
    ((10, 12), (12, 70), -1),           # wide: by columns
]


@pytest.mark.parametrize("shape_a, shape_b, axis", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_is_the_product_dealt_out(three_threads, shape_a, shape_b, axis, dtype):
    rng = np.random.default_rng(len(shape_a) * 7 + shape_b[-1])
    a, b = _operands(rng, shape_a, shape_b, dtype)
    out = np.full(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]),
                  np.nan, dtype)
    assert blas_threads.matmul(a, b, out=out) is out
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)
    pieces = blas_threads.parts(out.shape, THREADS)
    assert len(three_threads) == len(pieces) == THREADS
    assert {p[0] for p in pieces} == {axis}
    assert blas_threads.libraries()    # numpy's OpenBLAS: each piece on one BLAS thread
    assert all(counts == [1] * len(counts) for _, _, counts in three_threads)
    idents = [ident for ident, _, _ in three_threads]   # one piece the caller's, two helpers'
    assert idents.count(threading.get_ident()) == 1
    again = np.empty_like(out)
    blas_threads.matmul(a, b, out=again)
    np.testing.assert_array_equal(again, out)       # the same bits every call


def test_by_rows_keeps_every_column_in_every_piece(three_threads):
    """``by_rows``: a wide product (which is cut by columns otherwise) cut by its rows only, each
    piece all of ``out``'s columns (``kernels.slotted`` needs a column's place to be fixed)."""
    rng = np.random.default_rng(3)
    a, b = _operands(rng, (10, 12), (12, 70))
    assert {p[0] for p in blas_threads.parts((10, 70), THREADS)} == {-1}
    assert {p[0] for p in blas_threads.parts((10, 70), THREADS, by_rows=True)} == {-2}
    out = blas_threads.matmul(a, b, out=np.full((10, 70), np.nan, np.float32), by_rows=True)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert sorted(shape for _, shape, _ in three_threads) == [(3, 70), (3, 70), (4, 70)]


def test_transposed_operands_and_a_slice_of_out(three_threads):
    """``gemm``'s ``a.T @ b`` and ``a @ b.T``, and a convolution's ``out`` that is one group's
    rows of a larger array (strided, not contiguous)."""
    rng = np.random.default_rng(3)
    a, b = _operands(rng, (12, 40), (30, 12))
    top = np.full((2, 3, 40, 30), np.nan, np.float32)
    blas_threads.matmul(a.T, b.T, out=top[1, 2])
    np.testing.assert_allclose(top[1, 2], a.T.astype(np.float64) @ b.T, rtol=1e-5, atol=1e-5)
    assert np.isnan(top[0]).all() and np.isnan(top[1, :2]).all()
    w, x = _operands(rng, (6, 12), (5, 12, 30))
    out = np.full((5, 2, 6, 30), np.nan, np.float32)
    blas_threads.matmul(w, x, out=out[:, 1])
    np.testing.assert_allclose(out[:, 1], np.matmul(w.astype(np.float64), x), rtol=1e-5,
                               atol=1e-5)
    assert np.isnan(out[:, 0]).all()


def test_out_made_when_none(three_threads):
    rng = np.random.default_rng(4)
    a, b = _operands(rng, (4, 9, 7), (7, 11))
    got = blas_threads.matmul(a, b)
    assert got.shape == (4, 9, 11) and got.dtype == np.float32
    np.testing.assert_allclose(got, np.matmul(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (7, 1), (2, 3, 3), (9, 2, 50), (5, 100, 3)])
@pytest.mark.parametrize("threads", [2, 3, 8])
def test_pieces_cover_out_once(shape, threads):
    covered = np.zeros(shape, int)
    for axis, start, stop in blas_threads.parts(shape, threads):
        assert start < stop
        index = [slice(None)] * len(shape)
        index[axis] = slice(start, stop)
        covered[tuple(index)] += 1
    assert (covered == 1).all()
    assert len(blas_threads.parts(shape, threads)) <= threads


def test_small_products_and_one_thread_are_one_call(monkeypatch):
    """Not dealt out: one product on the calling thread, on the library every piece would use."""
    calls = []
    product = blas_threads._product
    monkeypatch.setattr(blas_threads, "_product",
                        lambda a, b, out, library: calls.append(out.shape)
                        or product(a, b, out, library))
    rng = np.random.default_rng(5)
    a, b = _operands(rng, (8, 8), (8, 8))
    out = np.empty((8, 8), np.float32)
    blas_threads.matmul(a, b, out=out)               # 1 kFLOP: below MIN_FLOPS
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(blas_threads, "MIN_FLOPS", 0)
    monkeypatch.setattr(blas_threads.numba, "get_num_threads", lambda: 1)
    blas_threads.matmul(a, b, out=out)
    assert calls == [(8, 8), (8, 8)]


def test_blas_thread_counts_come_back(three_threads):
    libraries = blas_threads.libraries()
    before = [lib.num_threads for lib in libraries]
    rng = np.random.default_rng(6)
    a, b = _operands(rng, (6, 20, 10), (6, 10, 20))
    blas_threads.matmul(a, b, out=np.empty((6, 20, 20), np.float32))
    assert [lib.num_threads for lib in libraries] == before
    assert blas_threads._shared["active"] == 0


def test_a_forked_child_deals_out_with_threads_of_its_own(three_threads):
    """The pool's threads are the parent's: a child made by fork gets a new pool, not a hang."""
    import os
    rng = np.random.default_rng(7)
    a, b = _operands(rng, (6, 20, 10), (6, 10, 20))
    out = np.empty((6, 20, 20), np.float32)
    blas_threads.matmul(a, b, out=out)             # the parent's pool exists now
    child = os.fork()
    if child == 0:                                 # the child: exit 0 only if the product is right
        mine = np.empty_like(out)
        blas_threads.matmul(a, b, out=mine)
        os._exit(0 if np.array_equal(mine, out) else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_run_workers_runs_each_worker_once_with_blas_on_one_thread(three_threads):
    """Each index once, on as many threads as workers (the caller takes 0), BLAS held to one
    thread meanwhile and given back after; a worker's error reaches the caller."""
    import threading
    libraries = blas_threads.libraries()
    before = [lib.num_threads for lib in libraries]
    seen, lock = [], threading.Lock()
    together = threading.Barrier(3, timeout=10)     # all three at once, or it breaks

    def work(i):
        with lock:
            seen.append((i, threading.get_ident(), [lib.num_threads for lib in libraries]))
        if together is not None:
            together.wait()
    blas_threads.run_workers(work, 3)
    assert sorted(i for i, _, _ in seen) == [0, 1, 2]
    assert len({thread for _, thread, _ in seen}) == 3
    assert dict((i, t) for i, t, _ in seen)[0] == threading.get_ident()
    assert all(counts == [1] * len(libraries) for _, _, counts in seen)
    assert [lib.num_threads for lib in libraries] == before

    def broken(i):
        if i == 1:
            raise ValueError("worker 1")
    with pytest.raises(ValueError, match="worker 1"):
        blas_threads.run_workers(broken, 2)
    assert [lib.num_threads for lib in libraries] == before
    assert blas_threads._shared["active"] == 0
    seen.clear()
    together = None
    blas_threads.run_workers(work, 1)
    assert [i for i, _, _ in seen] == [0]


@pytest.mark.parametrize("small", [False, True])
def test_bits_fixed_tells_a_library_whose_bits_move_with_the_shape(monkeypatch, small):
    """The probe says yes for a product whose elements never depend on the shape (exact sums of
    small integers), no for one whose last bits do (a term that grows with the columns), and is
    asked once per library, kind and dtype: a float64 probe is asked anew, in float64."""
    calls = []

    dtypes = set()

    def exact(a, b, out, library=None, accumulate=False):
        calls.append(out.shape)
        dtypes.update((a.dtype, b.dtype, out.dtype))
        out[...] = np.round(a) @ np.round(b)

    def moving(a, b, out, library=None, accumulate=False):
        out[...] = a @ b + np.float32(1e-3) * out.shape[1]

    monkeypatch.setitem(blas_threads._shared, "bits_fixed", {})
    monkeypatch.setattr(blas_threads.mkl, "product", exact)
    assert blas_threads.bits_fixed("openblas", small)
    asked = len(calls)
    assert asked > 1 and blas_threads.bits_fixed("openblas", small) and len(calls) == asked
    dtypes.clear()
    assert blas_threads.bits_fixed("openblas", small, np.float64) and len(calls) == 2 * asked
    assert dtypes == {np.dtype(np.float64)}
    monkeypatch.setattr(blas_threads.mkl, "product", moving)
    monkeypatch.setitem(blas_threads._shared, "bits_fixed", {})
    assert not blas_threads.bits_fixed("openblas", small)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bits_fixed_of_the_real_libraries_is_what_their_products_show(dtype):
    """Against a direct look: the chosen library's product of a 7x7 plane's 1x1, its first
    plane's columns alone; where they differ the probe must say no."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((512, 2048)).astype(dtype)
    b = rng.standard_normal((2048, 196)).astype(dtype)
    whole, part = np.empty((512, 196), dtype), np.empty((512, 49), dtype)
    with threadpool_limits(1, user_api="blas"):
        blas_threads.mkl.product(a, b, whole)
        blas_threads.mkl.product(a, np.ascontiguousarray(b[:, :49]), part)
    assert blas_threads.bits_fixed(dtype=dtype) in (
        (False,) if not np.array_equal(part, whole[:, :49]) else (True, False))
