"""``kernels.blas_calls``: BLAS products written down as calls and run on Numba's threads, a list
a thread. Each GEMM gives the bits of the same product made by ``mkl.product`` (every transpose,
``beta = 1``, a batch); adds sum in order; what CBLAS cannot take in place is refused and leaves
the list as it was; and every caller that deals its products out this way (``blas_threads.matmul``,
``run_products``, the 1x1 path's two gradients, Winograd's, the bands' and the row windows'
workers) gives the bits its helper-thread path gives, and the product's value."""
import numba
import numpy as np
import pytest

from minilms.kernels import blas_calls, blas_threads, cblas, mkl
from minilms.kernels.direct import bands, pointwise, windows, winograd

from .test_conv_bands import STEM
from .test_conv_bands import run as run_bands
from .test_conv_windows import run as run_windows
from .test_conv_winograd import run as run_winograd
from .test_mkl import small_blocks  # noqa: F401  (a fixture: the row blocks' rule scaled down)

LIBRARIES = [name for name in mkl.CHOICES if cblas.sgemm(name) is not None]


def _random(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True),
                                              (True, True)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_a_gemm_is_mkl_products_bits(library, trans_a, trans_b, accumulate):
    rng = np.random.default_rng(7)
    m, k, n = 37, 129, 53
    a = _random(rng, (k, m)).T if trans_a else _random(rng, (m, k))
    b = _random(rng, (n, k)).T if trans_b else _random(rng, (k, n))
    start = _random(rng, (m, n))
    want, got = start.copy(), start.copy()
    mkl.product(a, b, want, library, accumulate)
    calls = blas_calls.Calls(library)
    assert calls.gemm(a, b, got, accumulate)
    calls.end_thread()
    assert calls.run()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, (start if accumulate else 0) + a.astype(np.float64) @ b,
                               rtol=1e-4, atol=1e-4)


def test_threads_lists_run_in_order_with_their_sums():
    """Two lists, each a run of products summed as it goes (the 1x1 path's dW): the bits of
    the same calls made one after the other, and the float64 sums."""
    rng = np.random.default_rng(3)
    a, b = _random(rng, (6, 40, 70)), _random(rng, (6, 70, 30))
    library = LIBRARIES[0]
    results = {}
    for ops in (blas_calls.Now(library), blas_calls.Calls(library)):
        sums, scratch = np.empty((2, 40, 30), np.float32), np.empty((2, 40, 30), np.float32)
        for thread in range(2):
            for i in range(3 * thread, 3 * thread + 3):
                first = i == 3 * thread
                assert ops.gemm(a[i], b[i], sums[thread] if first else scratch[thread])
                if not first:
                    ops.add(sums[thread], scratch[thread])
            if isinstance(ops, blas_calls.Calls):
                ops.end_thread()
        if isinstance(ops, blas_calls.Calls):
            assert ops.threads == 2 and ops.run()
        results[type(ops)] = sums
    np.testing.assert_array_equal(results[blas_calls.Calls], results[blas_calls.Now])
    want = np.matmul(a.astype(np.float64), b).reshape(2, 3, 40, 30).sum(axis=1)
    np.testing.assert_allclose(results[blas_calls.Calls], want, rtol=1e-4, atol=1e-4)


def test_what_cblas_cannot_take_in_place_is_refused():
    rng = np.random.default_rng(1)
    a, b, out = _random(rng, (8, 9)), _random(rng, (9, 10)), np.empty((8, 10), np.float32)
    calls = blas_calls.Calls(LIBRARIES[0])
    assert not calls.gemm(a.astype(np.float64), b.astype(np.float64), out.astype(np.float64))
    assert not calls.gemm(a, b, np.empty((8, 20), np.float32)[:, ::2])   # a strided out
    assert not calls.gemm(a, b, np.empty((10, 8), np.float32).T)     # a transposed out
    assert not calls.gemm(a[:1], b, out[:1])         # a vector's product: numpy's GEMV
    square = _random(rng, (9, 9))
    assert not calls.gemm(square, square.T, np.empty((9, 9), np.float32))   # numpy's SYRK
    other = "mkl" if LIBRARIES[0] == "openblas" else "openblas"
    assert not calls.gemm(a, b, out, library=other)
    assert calls.gemm(a, b, out)
    # a batch whose second product cannot go (its b is a): none of it goes
    base = _random(rng, (2 * 81,))
    first_a, item = base[:81].reshape(9, 9), base.itemsize
    both = np.lib.stride_tricks.as_strided(base[81:], (2, 9, 9), (-81 * item, 9 * item, item))
    assert both[1].ctypes.data == first_a.ctypes.data
    assert not calls.products(first_a, both, np.empty((2, 9, 9), np.float32))
    assert calls.products(a, np.stack([b, b]), np.empty((2, 8, 10), np.float32))
    calls.end_thread()
    assert calls.threads == 1 and len(calls._rows) == 3
    with pytest.raises(ValueError, match="contiguous float32 of one size"):
        calls.add(out, out[:, :5])


def test_matmul_falls_back_to_the_helpers_where_the_library_has_no_sgemm(monkeypatch):
    monkeypatch.setattr(blas_threads, "MIN_FLOPS", 0)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    rng = np.random.default_rng(2)
    w, x = _random(rng, (16, 24)), _random(rng, (4, 24, 50))
    want = blas_threads.matmul(w, x)
    monkeypatch.setattr(cblas, "sgemm", lambda library: None)
    assert not blas_calls.Calls("openblas").run()
    np.testing.assert_array_equal(blas_threads.matmul(w, x), want)


def _both_ways(monkeypatch, compute):
    """``compute()`` with the products on the helper threads, then on Numba's."""
    got = []
    for numba_threads in (False, True):
        monkeypatch.setattr(blas_threads, "NUMBA_THREADS", numba_threads)
        got.append(compute())
    return got


def _assert_same(helpers, numba_threads):
    for a, b in zip(helpers, numba_threads):
        if a is not None:
            np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("shape_a, shape_b, accumulate, by_rows", [
    ((8, 16, 12), (8, 12, 30), False, False), ((16, 12), (5, 12, 30), True, False),
    ((40, 12), (12, 30), False, False), ((10, 12), (12, 70), True, False),
    ((10, 12), (12, 70), False, True)])
def test_matmul_on_numba_threads_is_the_helpers_bit_for_bit(monkeypatch, shape_a, shape_b,
                                                              accumulate, by_rows):
    monkeypatch.setattr(blas_threads, "MIN_FLOPS", 0)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    rng = np.random.default_rng(len(shape_a) + shape_b[-1])
    a, b = _random(rng, shape_a), _random(rng, shape_b)
    start = _random(rng, np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
                    + (a.shape[-2], b.shape[-1]))

    def compute():
        out = start.copy()
        return (blas_threads.matmul(a, b, out=out, accumulate=accumulate, by_rows=by_rows),)
    helpers, on_numba = _both_ways(monkeypatch, compute)
    _assert_same(helpers, on_numba)
    np.testing.assert_allclose(on_numba[0], (start if accumulate else 0)
                               + np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("samples", [4, 3])
@pytest.mark.parametrize("add_dx", [False, True])
def test_the_1x1_gradients_by_sample_on_numba_threads(monkeypatch, samples, add_dx):
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    rng = np.random.default_rng(samples)
    c, o, h = 128, 96, 30
    x, weight = _random(rng, (samples, c, h, h)), _random(rng, (o, c, 1, 1))
    dy, dx0 = _random(rng, (samples, o, h, h)), _random(rng, (samples, c, h, h))
    geometry = ((1, 1), (1, 1), (0, 0), (1, 1))
    assert pointwise.by_sample(dy, weight, geometry, 1)

    def compute():
        dx, dw = dx0.copy(), np.full_like(weight, np.nan)
        pointwise.backward(x, dy, weight, dx, dw, None, np.empty(1, np.float32), samples,
                           geometry, add_dx=add_dx)
        return dx, dw
    helpers, on_numba = _both_ways(monkeypatch, compute)
    _assert_same(helpers, on_numba)
    w2 = weight.reshape(o, c).astype(np.float64)
    want_dx = (dx0 if add_dx else 0) + np.einsum("oc,nop->ncp", w2, dy.reshape(samples, o, -1)
                                                 ).reshape(x.shape)
    want_dw = np.einsum("nop,ncp->oc", dy.reshape(samples, o, -1).astype(np.float64),
                        x.reshape(samples, c, -1))
    np.testing.assert_allclose(on_numba[0], want_dx, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(on_numba[1].reshape(o, c), want_dw, rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.parametrize("pad", [0, 1])
def test_winograd_on_numba_threads_is_the_helpers_bit_for_bit(monkeypatch, slots, pad):
    rng = np.random.default_rng(slots + 2 * pad)
    x, weight = _random(rng, (3, 8, 12, 12)), _random(rng, (6, 8, 3, 3))
    bias = _random(rng, (6,))
    side = 12 + 2 * pad - 2
    dy = _random(rng, (3, 6, side, side))
    assert winograd.applies(weight.shape, ((3, 3), (1, 1), (pad, pad), (1, 1)))
    helpers, on_numba = _both_ways(monkeypatch,
                                   lambda: run_winograd(x, weight, bias, dy, pad, slots))
    _assert_same(helpers, on_numba)
    assert not any(np.isnan(array).any() for array in on_numba)


@pytest.mark.parametrize("slots", [1, 2])
def test_the_bands_on_numba_threads_are_the_helpers_bit_for_bit(monkeypatch, slots):
    rng = np.random.default_rng(slots)
    x, weight = _random(rng, (3, 3, 40, 40)), _random(rng, (8, 3, 7, 7))
    bias, dy = _random(rng, (8,)), _random(rng, (3, 8, 20, 20))
    assert bands.applies(weight.shape, STEM)
    helpers, on_numba = _both_ways(monkeypatch,
                                   lambda: run_bands(x, weight, bias, dy, STEM, slots))
    _assert_same(helpers, on_numba)
    assert not any(np.isnan(array).any() for array in on_numba if array is not None)



@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.parametrize("geometry", [((3, 3), (2, 2), (1, 1), (1, 1)),
                                      ((3, 3), (1, 1), (1, 1), (1, 1)),
                                      ((5, 3), (1, 2), (2, 0), (1, 2))])
def test_the_row_windows_on_numba_threads_are_the_helpers_bit_for_bit(monkeypatch, slots,
                                                                     geometry):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
    rng = np.random.default_rng(slots + sh)
    x, weight = _random(rng, (3, 6, 15, 13)), _random(rng, (5, 6, kh, kw))
    out_h = (15 + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (13 + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    bias, dy = _random(rng, (5,)), _random(rng, (3, 5, out_h, out_w))
    assert windows.applies(weight.shape, geometry)
    helpers, on_numba = _both_ways(monkeypatch,
                                   lambda: run_windows(x, weight, bias, dy, geometry, slots))
    _assert_same(helpers, on_numba)
    assert not any(np.isnan(array).any() for array in on_numba if array is not None)


_SPIN = """
import os, time
import minilms, numba, numpy as np
@numba.njit(parallel=True)
def bump(a):
    for i in numba.prange(a.size):
        a[i] += 1
a = np.zeros(64)
bump(a)
before = time.process_time()
for _ in range(50):
    bump(a)
    time.sleep(0.02)        # idle: a worker that waits spinning burns CPU meanwhile
print(os.environ["GOMP_SPINCOUNT"], (time.process_time() - before) / 50)
"""


def test_numbas_threads_spin_after_a_kernel_unless_told_not_to():
    """minilms sets ``GOMP_SPINCOUNT`` where the user has not: after a kernel the OpenMP workers
    wait for the next spinning (about 2 ms of CPU each time here), not asleep; with the user's 0
    they sleep at once. CPU time, not context switches, so that other processes on the cores (the
    suite's other workers) do not change the verdict."""
    import os
    import subprocess
    import sys
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one thread: no worker to spin or sleep")
    cpu = {}
    for value in (None, "0"):
        env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
        if value is not None:
            env["GOMP_SPINCOUNT"] = value
        done = subprocess.run([sys.executable, "-c", _SPIN], capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        setting, seconds = done.stdout.split()
        assert setting == (value or "50000")
        cpu[value] = float(seconds)
    assert cpu[None] > 4 * cpu["0"] and cpu[None] > 3e-4


@pytest.mark.usefixtures("small_blocks")
def test_a_gemm_in_row_blocks_is_written_as_mkl_makes_it():
    """A product ``mkl.row_blocks`` cuts (its rule scaled down: ``test_mkl.small_blocks``) is
    written down as the same calls, one per block, on MKL only: the bits of ``mkl.product``, and
    the float64 product."""
    if "mkl" not in LIBRARIES:
        pytest.skip("no libmkl_rt here: pip install mkl (the test extra brings it)")
    rng = np.random.default_rng(3)
    for a in (_random(rng, (50, 24)), _random(rng, (24, 50)).T):
        b = _random(rng, (24, 30))
        want, got = np.empty((50, 30), np.float32), np.empty((50, 30), np.float32)
        mkl.product(a, b, want, "mkl")
        for library, count in (("mkl", 4), ("openblas", 1)):
            calls = blas_calls.Calls(library)
            assert calls.gemm(a, b, got)
            assert len(calls._rows) == count
            calls.end_thread()
            assert calls.run()
            np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
            if library == "mkl":
                np.testing.assert_array_equal(got, want)
