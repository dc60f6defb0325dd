"""``numpy.matmul`` on the ``cpu`` device with its work dealt out to one thread per core, each
thread calling BLAS on one thread of its own.

BLAS splits a GEMM over its own threads, and on a convolution's products (a sample's
``[O, C] @ [C, P]``, a few milliseconds each) the join at the end of every call and the thin
slices it gives each thread cost it: two Python threads that each take half of a batch of such
products and call single-threaded BLAS ran ResNet-50's 1x1 convolutions faster than BLAS's two
threads (docs/benchmarks.md, "Why the code chose"). numpy releases the GIL for the call, so the
threads run side by side.

How the work is dealt out (``parts``): a batch of at least as many products as threads, by products
(contiguous runs of them); anything else, by blocks of rows of ``out`` (of each product), or of
columns where there are more of them. Either way every element of ``out`` is one BLAS dot product
over the whole inner dimension, and the same shapes and thread count deal it out the same way every
time: a run's bits do not change from call to call. They may depend on the thread count: a library
may take another kernel for a piece's shape than for the whole's. MKL did (half the columns of
``[64, 3136] @ [3136, 256]`` came out with other bits); OpenBLAS did on an AMD EPYC (Zen 3) and not
on an AVX-512 Xeon, where a piece's bits were those of the whole product on one thread in every
case tested (never those of OpenBLAS's own threads, which may cut the inner dimension).

The threads are Numba's count (``numba.get_num_threads``: the cores the ``cpu`` device's kernels
use). Below ``MIN_FLOPS`` (a thread's wake-up costs more than it saves), with one thread, or where
``threadpoolctl`` finds no BLAS library to hold to one thread, it is one call on the calling thread.

Which threads: Numba's own (``NUMBA_THREADS``, the default): the pieces are written down as
``cblas_sgemm`` calls (``blas_calls``) and run in one ``prange``, so that the products and every
other kernel share one pool of threads, which need no GIL and, spinning briefly after a kernel
(``GOMP_SPINCOUNT``, set in ``minilms/__init__.py``), no wake-up either. Where a product cannot be
written so (float64, a strided output), and for ``run_workers``' pipelines that run Python between
their products, helper threads of this module's own take the pieces.

Each product runs on the library ``kernels.mkl`` chose: Intel MKL where the ``mkl`` wheel is
installed (faster on the convolutions' short products), numpy's OpenBLAS otherwise. The choice is
the same for a piece as for the whole call, so the thread count never changes the library.
"""
import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from . import blas_calls, mkl

__all__ = ["MIN_FLOPS", "NUMBA_THREADS", "bits_fixed", "libraries", "matmul", "one_blas_thread",
           "parts", "run_products", "run_workers", "sample_runs"]

MIN_FLOPS = 2e7     # about 0.1 ms of BLAS work: smaller products stay in one call
NUMBA_THREADS = True    # pieces on Numba's threads (``blas_calls``); False: on the helper threads

_shared = {"pool": None, "workers": 0, "libraries": None, "active": 0, "before": [],
           "bits_fixed": {}}
_lock = threading.Lock()


def _forget_threads() -> None:
    """In a forked child: the parent's helper threads do not exist there (a new pool is made)."""
    global _lock
    _lock = threading.Lock()
    _shared.update(pool=None, workers=0, active=0)


os.register_at_fork(after_in_child=_forget_threads)


def libraries():
    """The BLAS libraries' thread controls (threadpoolctl's), found once; [] without any."""
    if _shared["libraries"] is None:
        try:
            from threadpoolctl import ThreadpoolController
            found = ThreadpoolController().select(user_api="blas").lib_controllers
        except Exception:   # not installed, or no library it knows: plain numpy.matmul
            found = []
        _shared["libraries"] = found
    return _shared["libraries"]


def _pool(workers: int) -> ThreadPoolExecutor:
    """The helper threads (the calling thread takes a piece too), made once per count."""
    with _lock:
        if _shared["workers"] < workers:
            if _shared["pool"] is not None:
                _shared["pool"].shutdown(wait=True)
            _shared["pool"] = ThreadPoolExecutor(workers, "minilms-blas")
            _shared["workers"] = workers
        return _shared["pool"]


def parts(out_shape, threads: int, by_rows: bool = False) -> list:
    """How ``out`` (and ``a``, ``b``) are cut, one piece per thread: a list of ``(axis, start,
    stop)`` with axis 0 the products of a batch, -2 the rows of ``out``, -1 its columns.
    ``by_rows``: by rows (of each product) whatever the shape."""
    if by_rows:
        axis, size = -2, out_shape[-2]
    elif len(out_shape) == 3 and out_shape[0] >= threads:
        axis, size = 0, out_shape[0]
    elif out_shape[-2] >= out_shape[-1]:
        axis, size = -2, out_shape[-2]
    else:
        axis, size = -1, out_shape[-1]
    count = min(threads, size)
    bounds = [size * i // count for i in range(count + 1)]
    return [(axis, bounds[i], bounds[i + 1]) for i in range(count)]


def _piece(a, b, out, axis, start, stop):
    """The operands and output of one piece."""
    if axis == 0:   # an operand of one product (or 2-D) goes with every piece
        return (a[start:stop] if a.ndim == 3 and a.shape[0] > 1 else a,
                b[start:stop] if b.ndim == 3 and b.shape[0] > 1 else b, out[start:stop])
    if axis == -2:
        return a[..., start:stop, :], b, out[..., start:stop, :]
    return a, b[..., start:stop], out[..., start:stop]


def matmul(a, b, out=None, accumulate: bool = False, by_rows: bool = False):
    """``a @ b`` into ``out`` (made where None; 2-D or 3-D as ``numpy.matmul``); returns it.
    ``accumulate``: ``out += a @ b`` (``out`` given). ``by_rows``: cut by rows of ``out`` only,
    so that every piece holds all of its columns (``kernels.slotted``: a column's bits must not
    depend on where it sits)."""
    if out is None:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        out = np.empty(batch + (a.shape[-2], b.shape[-1]), np.result_type(a, b))
    threads = numba.get_num_threads()
    controls = libraries()
    extra = (True,) if accumulate else ()
    if (threads < 2 or not controls or out.ndim not in (2, 3)
            or 2.0 * out.size * a.shape[-1] < MIN_FLOPS):
        _product(a, b, out, mkl.library_for(a, out), *extra)
        return out
    library = mkl.library_for(a, out)       # the whole call's: every piece runs where it would
    pieces = [_piece(a, b, out, *p) for p in parts(out.shape, threads, by_rows)]
    if len(pieces) < 2:
        _product(a, b, out, library, *extra)
        return out
    _hold_blas(controls)
    try:
        calls = _pieces_as_calls(pieces, library, accumulate)
        if calls is None or not calls.run():
            pending = [_pool(len(pieces) - 1).submit(_product, *piece, library, *extra)
                       for piece in pieces[1:]]
            _product(*pieces[0], library, *extra)
            for job in pending:
                job.result()
    finally:
        _release_blas(controls)
    return out


def _pieces_as_calls(pieces, library: str, accumulate: bool):
    """The pieces ``(a, b, out)`` as ``blas_calls.Calls``, a thread each, or None where
    ``NUMBA_THREADS`` is off or a product cannot go so (the helper threads take them)."""
    if not NUMBA_THREADS:
        return None
    calls = blas_calls.Calls(library)
    for piece in pieces:
        if not calls.products(*piece, accumulate=accumulate):
            return None
        calls.end_thread()
    return calls


def run_products(write, count: int, library: str) -> None:
    """``run_workers`` for workers that only make products and sums: ``write(i, ops)`` makes
    worker ``i``'s through ``ops.gemm(a, b, out, accumulate, library)`` and ``ops.add(dst,
    src)``, and returns False where ``ops`` refused one. Where ``NUMBA_THREADS`` holds, each
    worker's are written down (``blas_calls.Calls`` on ``library``) and run on Numba's threads;
    where any cannot go so, or it is off, each worker makes them at once on a helper thread
    (``blas_calls.Now``)."""
    calls = blas_calls.Calls(library) if NUMBA_THREADS else None
    for i in range(count if calls is not None else 0):
        if not write(i, calls):
            calls = None
            break
        calls.end_thread()
    with one_blas_thread():
        if calls is not None and calls.run():
            return
    now = blas_calls.Now(library)
    run_workers(lambda i: write(i, now), count)


@contextlib.contextmanager
def one_blas_thread():
    """BLAS held to one thread within (``run_workers``' hold): for a Numba kernel whose
    threads each call BLAS (``kernels.cblas``)."""
    controls = libraries()
    _hold_blas(controls)
    try:
        yield
    finally:
        _release_blas(controls)


def sample_runs(samples: int, slots: int) -> list:
    """For ``run_workers``: each worker's run of samples ``(first, stop)``, contiguous, a worker
    per thread and at most one per slot (a worker uses its own slot of the workspace for every
    sample it takes)."""
    workers = max(1, min(numba.get_num_threads(), slots, samples))
    return [(samples * t // workers, samples * (t + 1) // workers) for t in range(workers)]


def run_workers(work, count: int) -> None:
    """``work(i)`` for ``i`` in ``0 .. count - 1``, one call per thread (the calling thread takes
    ``work(0)``), BLAS held to one thread meanwhile: for a caller that deals out whole pipelines
    of its own (a sample's copy, GEMMs and gather, each worker in its own core's cache). ``work``
    must release the GIL for its heavy parts (numpy, BLAS, ``nogil`` kernels) and call no
    parallel Numba kernel (one threading layer does not take calls from two threads at once)."""
    if count < 1:
        return
    controls = libraries()
    _hold_blas(controls)
    try:
        pending = [_pool(count - 1).submit(work, i) for i in range(1, count)] if count > 1 else []
        work(0)
        for job in pending:
            job.result()
    finally:
        _release_blas(controls)


def _hold_blas(libraries) -> None:
    """BLAS to one thread; the first of calls that overlap (two nets in two threads) keeps the
    counts the last one puts back."""
    with _lock:
        if _shared["active"] == 0:
            _shared["before"] = [library.num_threads for library in libraries]
            for library in libraries:
                library.set_num_threads(1)
        _shared["active"] += 1


def _release_blas(libraries) -> None:
    with _lock:
        _shared["active"] -= 1
        if _shared["active"] == 0:
            for library, count in zip(libraries, _shared["before"]):
                library.set_num_threads(count)


def _product(a, b, out, library, accumulate=False):
    mkl.product(a, b, out, library, accumulate)


# ``bits_fixed``'s products, (rows, inner, columns): a convolution's (a 7x7 plane's 1x1, a 3x3's
# columns), or, ``small``, a Winograd block's few channels (each four times as wide)
_PROBES = {False: ((512, 2048, 49), (64, 576, 196)), True: ((96, 48, 8), (64, 8, 8))}


def bits_fixed(library: str | None = None, small: bool = False, dtype=np.float32) -> bool:
    """Whether ``library`` (``mkl`` or ``openblas``; default the chosen one) gives each element of
    a product the same bits whatever the product's shape and the element's place in it: blocks of
    rows and of columns of a product computed alone, on one thread, against the same blocks of
    the whole. Where it does, a product cut by ``parts`` or set beside others in slots gives each
    column the bits of its own product, and a step split along the batch the unsplit step's
    forward bit for bit (docs/lms.md). OpenBLAS did on an AVX-512 Xeon; OpenBLAS 0.3.31's Haswell
    kernels on an AMD EPYC (Zen 3) did not (a split step's forward then equals the unsplit one's
    to float32 rounding). ``small``: on products of a few channels (``direct.winograd``'s
    blocks), where MKL kept the bits on the Xeon and not on the EPYC, and OpenBLAS on neither.
    ``dtype``: the products' (float64 runs numpy's DGEMM whatever ``library`` is: OpenBLAS's
    SkylakeX kernels on an AMD EPYC (Zen 4) moved its bits with the shape too). Checked once per
    library, kind and dtype, in milliseconds."""
    library = library or mkl.chosen()
    known = _shared["bits_fixed"]
    if library == "mkl" and not mkl.available():     # loads it where it is there
        raise ValueError("bits_fixed('mkl'): MKL is not installed here")
    key = (library, small, np.dtype(dtype).name)
    if key not in known:
        rng = np.random.default_rng(0)
        controls = libraries()
        _hold_blas(controls)
        try:
            known[key] = all(_same_in_parts(rng, shape, library, np.dtype(dtype))
                             for shape in _PROBES[small])
        finally:
            _release_blas(controls)
    return known[key]


def _same_in_parts(rng, shape, library, dtype) -> bool:
    m, k, n = shape
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, 4 * n)).astype(dtype)
    whole = np.empty((m, 4 * n), dtype)
    mkl.product(a, b, whole, library)
    for rows, columns in ((slice(0, m), slice(0, n)), (slice(0, m), slice(n, 2 * n)),
                          (slice(0, m // 2), slice(0, 4 * n)), (slice(5, 21), slice(0, 4 * n))):
        part = np.empty(whole[rows, columns].shape, dtype)
        mkl.product(np.ascontiguousarray(a[rows]), np.ascontiguousarray(b[:, columns]), part,
                    library)
        if not np.array_equal(part, whole[rows, columns]):
            return False
    return True
