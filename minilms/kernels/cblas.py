"""``cblas_sgemm`` as a C function that Numba kernels call from inside a ``nogil`` loop.

Why: a kernel that runs many short products per sample (``direct.winograd``: 16 or 36 per block
of tiles) spent more time in Python, in ``mkl.product``'s checks and ctypes' argument conversion
(tens of microseconds a call, under the GIL, so two workers wait for each other), than in the
products. Numba calls a ctypes function pointer directly, for a fraction of a microsecond
(docs/benchmarks.md, session 38).

Which: ``sgemm(library)`` for ``mkl`` (``libmkl_rt``'s, 32-bit integers) or ``openblas``
(numpy's own, found through threadpoolctl; numpy's wheels name it ``scipy_cblas_sgemm64_``, with
64-bit integers). Each is checked once on a small product against numpy; None where there is
none that passes, and the caller takes another path.

The signature is CBLAS's, row major: ``(layout, trans_a, trans_b, m, n, k, alpha, a, lda, b,
ldb, beta, c, ldc)``, the matrices as addresses (``array.ctypes.data``).
"""
import ctypes

import numpy as np

from . import mkl

__all__ = ["ROW_MAJOR", "NO_TRANS", "TRANS", "sgemm", "chosen_sgemm"]

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
_NAMES = (("scipy_cblas_sgemm64_", ctypes.c_int64), ("cblas_sgemm64_", ctypes.c_int64),
          ("scipy_cblas_sgemm", ctypes.c_int), ("cblas_sgemm", ctypes.c_int))
_found = {}


def _prototype(integer):
    address = ctypes.c_size_t       # the same as a pointer in the x86-64 and AArch64 ABIs
    return ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, integer, integer,
                            integer, ctypes.c_float, address, integer, address, integer,
                            ctypes.c_float, address, integer)


def _bind(library, name, integer):
    """``library``'s ``name`` as a Numba-callable function, or None where it gives another
    product than numpy's on a small one (another integer width, say)."""
    try:
        symbol = getattr(library, name)
    except AttributeError:
        return None
    function = _prototype(integer)(ctypes.cast(symbol, ctypes.c_void_p).value)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 5), np.float32), rng.standard_normal((5, 2), np.float32)
    out = np.zeros((3, 2), np.float32)
    function(ROW_MAJOR, NO_TRANS, NO_TRANS, 3, 2, 5, 1.0, a.ctypes.data, 5, b.ctypes.data, 2,
             0.0, out.ctypes.data, 2)
    return function if np.allclose(out, a @ b, rtol=1e-5, atol=1e-6) else None


def _find(library: str):
    if library == "mkl":
        handle = mkl._state["library"] if mkl.available() else None
        return _bind(handle, "cblas_sgemm", ctypes.c_int) if handle is not None else None
    if library != "openblas":
        return None
    from . import blas_threads  # here: blas_threads runs its pieces through this module
    for controller in blas_threads.libraries():
        if controller.internal_api != "openblas":
            continue
        handle = ctypes.CDLL(controller.filepath)
        for name, integer in _NAMES:
            function = _bind(handle, name, integer)
            if function is not None:
                return function
    return None


def sgemm(library: str):
    """``library``'s (``mkl`` or ``openblas``) ``cblas_sgemm`` for Numba, or None."""
    if library not in _found:
        _found[library] = _find(library)
    return _found[library]


def chosen_sgemm():
    """``(cblas_sgemm, library)``: the chosen library's (``mkl.chosen``), or the other's where
    that one has none. Raises RuntimeError where neither has one."""
    chosen = mkl.chosen()
    for library in (chosen, "openblas" if chosen == "mkl" else "mkl"):
        function = sgemm(library)
        if function is not None:
            return function, library
    raise RuntimeError("no cblas_sgemm found in MKL or numpy's OpenBLAS for the kernels that "
                       "call it from Numba (minilms.kernels.cblas)")
