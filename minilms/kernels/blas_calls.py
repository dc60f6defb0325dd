"""BLAS products dealt out to Numba's threads as lists of ``cblas_sgemm`` calls, one list a
thread, each run in order inside one ``prange``.

Why: ``blas_threads`` cuts a product into one piece per core. Handed to a Python helper thread, a
piece waits for two wake-ups: the helper's, for the call, and then the GIL's, which the caller
holds until its own piece starts; the caller, done first, sleeps until the helper wakes it. On a
VM whose idle vCPUs halt at once, each wake-up cost 50-130 us, about a tenth of a 1x1
convolution's product at 14x14 (docs/benchmarks.md, session 57). Numba's OpenMP threads need no
GIL: the pieces, written down as the calls they make, run where each thread calls BLAS itself
(``kernels.cblas``: the library's own ``cblas_sgemm``, the function ``mkl.product`` calls).

A list (``Calls``) holds GEMMs, ``c = a @ b`` or ``c += a @ b`` (the GEMM's ``beta = 1``, as
``mkl.product(accumulate=True)``), and adds, ``dst += src`` over contiguous float32 (the sums a
caller makes between products). ``end_thread`` closes a thread's list. The calls are those a
Python caller would make one by one, with the same arguments, so the bits are the same; where a
product cannot be written as CBLAS arguments (an output that is not row-contiguous, float64, a
vector's product, which numpy gives to GEMV), ``gemm`` returns False and the caller takes its
Python path for the whole call. The arrays must stay alive until ``run`` returns: the list holds
their addresses (and keeps references to them).
"""
import numpy as np
from numba import carray, njit, prange, types
from numba.extending import intrinsic

from . import cblas, mkl

__all__ = ["Calls", "Now", "GEMM", "ADD"]

GEMM, ADD = 0, 1
# a call's fields: what, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta (0 or 1), c, ldc
_FIELDS = 13


class Now:
    """``Calls``' methods made at once on the calling thread (``mkl.product``, ``numpy.add``):
    a worker written against either runs its products now or writes them down."""

    def __init__(self, library: str):
        self.library = library

    def gemm(self, a, b, out, accumulate: bool = False, library: str | None = None) -> bool:
        mkl.product(a, b, out, library or self.library, accumulate)
        return True

    def add(self, dst, src) -> None:
        np.add(dst, src, out=dst)


class Calls:
    """GEMMs and adds for ``run``, a list per thread, on ``library``'s (``mkl`` or
    ``openblas``) ``cblas_sgemm`` (module docstring)."""

    def __init__(self, library: str):
        self.library = library
        self._rows, self._bounds, self._alive = [], [0], []

    def gemm(self, a, b, out, accumulate: bool = False, library: str | None = None) -> bool:
        """``out = a @ b`` (``+=`` with ``accumulate``) for 2-D float32 views; False, with
        nothing added, where CBLAS cannot take them in place or ``library`` is another."""
        if (out.dtype != np.float32 or out.ndim != 2 or a.ndim != 2 or b.ndim != 2
                or library not in (None, self.library)):
            return False
        arguments = mkl.gemm_arguments(a, b, out)
        if arguments is None or 1 in arguments[2:4] or a.ctypes.data == b.ctypes.data:
            return False    # numpy gives a vector's product to GEMV, a @ a.T to SYRK
        trans_a, trans_b, m, n, k, lda, ldb, ldc = arguments
        blocks = mkl.row_blocks(arguments, out.itemsize) if self.library == "mkl" else [(m, 0, 0)]
        for rows, a_at, out_at in blocks:
            self._rows.append((GEMM, trans_a, trans_b, rows, n, k, a.ctypes.data + a_at, lda,
                               b.ctypes.data, ldb, int(accumulate), out.ctypes.data + out_at,
                               ldc))
        self._alive += (a, b, out)
        return True

    def products(self, a, b, out, accumulate: bool = False) -> bool:
        """``mkl.product``'s operands (2-D, or 3-D with a 2-D one going with every product):
        a GEMM per product; False, with nothing added, where any cannot go."""
        mark = len(self._rows)
        if out.ndim == 2:
            pairs = [(a, b, out)]
        else:
            pairs = [(a if a.ndim == 2 else a[i if a.shape[0] > 1 else 0],
                      b if b.ndim == 2 else b[i if b.shape[0] > 1 else 0], out[i])
                     for i in range(out.shape[0])]
        for pair in pairs:
            if not self.gemm(*pair, accumulate=accumulate):
                del self._rows[mark:]
                return False
        return True

    def add(self, dst, src) -> None:
        """``dst += src``, both contiguous float32 of one size."""
        if not (dst.dtype == src.dtype == np.float32 and dst.size == src.size
                and dst.flags.c_contiguous and src.flags.c_contiguous):
            raise ValueError(f"Calls.add: contiguous float32 of one size, found {dst.dtype} "
                             f"{dst.shape} and {src.dtype} {src.shape}")
        self._rows.append((ADD, 0, 0, dst.size, 0, 0, src.ctypes.data, 0, 0, 0, 0,
                           dst.ctypes.data, 0))
        self._alive += (dst, src)

    def end_thread(self) -> None:
        """The calls so far that no thread has go to the next thread."""
        self._bounds.append(len(self._rows))

    @property
    def threads(self) -> int:
        return len(self._bounds) - 1

    def run(self) -> bool:
        """Each thread's list on a thread of Numba's; False, with nothing run, where the
        library has no ``cblas_sgemm``. The caller holds BLAS to one thread (``blas_threads``),
        and Numba has at least ``threads``."""
        gemm = cblas.sgemm(self.library)
        if gemm is None:
            return False
        if self._rows:
            _run(gemm, np.array(self._rows, np.int64).reshape(-1, _FIELDS),
                 np.array(self._bounds, np.int64))
        return True


@intrinsic
def _floats_at(typingctx, address):
    """The address as a float32 pointer, for ``carray``."""
    signature = types.CPointer(types.float32)(types.intp)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return signature, codegen


@njit(nogil=True, cache=True)
def _add(dst_address, src_address, size):
    dst, src = carray(_floats_at(dst_address), size), carray(_floats_at(src_address), size)
    for i in range(size):
        dst[i] += src[i]


@njit(parallel=True, nogil=True, cache=True)
def _run(gemm, calls, bounds):
    for thread in prange(bounds.size - 1):
        for i in range(bounds[thread], bounds[thread + 1]):
            c = calls[i]
            if c[0] == GEMM:
                gemm(cblas.ROW_MAJOR, c[1], c[2], c[3], c[4], c[5], np.float32(1.0), c[6], c[7],
                     c[8], c[9], np.float32(c[10]), c[11], c[12])
            else:
                _add(c[11], c[6], c[3])
