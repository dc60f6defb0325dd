"""Intel MKL's GEMM for the ``cpu`` device's products, where the ``mkl`` wheel is installed.

Why: the convolutions' products are short in one dimension (64 rows, an inner dimension of
64-256, a 7x7 plane's 49 columns), and there MKL's SGEMM runs on one thread 1.1-1.5x faster than
numpy's OpenBLAS on an AVX-512 Xeon; on the largest squares the two are equal (docs/benchmarks.md,
"Why the code chose"). PyTorch's CPU build runs its GEMMs on MKL too.

How: ``ctypes`` and ``libmkl_rt``, found in the environment's ``lib/`` (where ``pip install mkl``
puts it) or on the loader's path, with its *sequential* threading layer: ``blas_threads`` deals the
work out to threads of its own, and MKL's OpenMP would fight Numba's for the same cores. Each 2-D
product is one ``cblas_sgemm`` (``dgemm`` for float64) on the numpy views as they are: an
operand whose rows are not contiguous but whose columns are (a ``.T`` view) goes in transposed, so
nothing is copied. Anything MKL cannot take that way (no unit stride, a zero-sized dimension,
another dtype) is numpy's ``matmul``; so is everything when MKL is not there or not chosen.

Which library: ``MINILMS_BLAS`` in the environment, ``mkl`` or ``openblas`` (numpy's own), read
when this module first loads; unset, MKL wherever it is found on an Intel CPU (or one whose vendor
cannot be read), OpenBLAS on any other: on an AMD EPYC (Zen 3, AVX2) MKL ran the same products
0.78-1.10x OpenBLAS's rate, median 0.93x, and ResNet-50's training 0.88x (docs/benchmarks.md, "Why
the code chose"). ``use(name)`` switches in a running process (tests, benchmarks).

Deterministic: sequential MKL gives the same bits for the same shapes from call to call and
whatever the operands' alignment (tests/kernels/test_mkl.py checks both), so LMS on (blobs at
other pool offsets) equals LMS off bit for bit. Its bits are not OpenBLAS's, and may depend on
how ``blas_threads`` cuts a product (MKL picks its kernel by the piece's shape), so on the thread
count.
"""
import ctypes
import ctypes.util
import glob
import os
import sys
import threading

import numpy as np

from ..errors import ConfigError

__all__ = ["CHOICES", "MIN_FLOPS", "available", "chosen", "cpu_vendor", "use", "library_for",
           "gemm_arguments", "row_blocks", "product"]

CHOICES = ("mkl", "openblas")
# A product's FLOPs below which numpy's matmul runs it even where MKL is chosen: a call through
# ctypes costs microseconds, and MKL was slower than OpenBLAS on small products (measured).
MIN_FLOPS = 4e6
# MKL's SGEMM on a product with a short inner dimension (48 to 111) and at least 192 rows, over
# 392 columns or more, wrote an output that was not in cache at about half the rate of the same
# product made as calls of 128 rows each (ResNet-50's 1x1 convolutions from 64 channels to 256 at
# 56x56, and their input gradients: docs/benchmarks.md, session 68); each element's bits are the
# whole product's either way (tests/kernels/test_mkl.py). Below 48 or from 112 on, or on fewer
# rows or columns, the whole call was as fast or faster. ``ROW_BLOCKS`` False: whole calls (the
# benchmark's A/B).
ROW_BLOCKS = True
BLOCK_INNER = range(48, 112)
BLOCK_MIN_ROWS, BLOCK_MIN_COLUMNS, BLOCK_ROWS = 192, 392, 128
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_SEQUENTIAL = 1     # MKL_THREADING_SEQUENTIAL

_state = {"library": None, "searched": False, "chosen": None}
_lock = threading.Lock()


def _find():
    """``libmkl_rt``'s path, or None: the environment's ``lib/`` first (the wheel's place), then
    the loader's search path."""
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        found = sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
        if found:
            return found[0]
    return ctypes.util.find_library("mkl_rt")


def _load():
    """The library with its GEMMs' signatures set, or None where there is none that loads. Under
    a lock: the first products of a process may come from ``blas_threads``' threads at once, and
    one must not see "searched, nothing found" while another is still loading it."""
    with _lock:
        if not _state["searched"]:
            _state["library"] = _open()
            _state["searched"] = True
    return _state["library"]


def _open():
    """``libmkl_rt`` loaded and set up, or None."""
    path = _find()
    try:
        library = ctypes.CDLL(path) if path else None
    except OSError:         # a broken install: numpy's BLAS, as without one
        library = None
    if library is not None:
        library.MKL_Set_Threading_Layer(_SEQUENTIAL)    # before any other MKL call
        pointer, integer = ctypes.c_void_p, ctypes.c_int
        for name, scalar in (("cblas_sgemm", ctypes.c_float), ("cblas_dgemm", ctypes.c_double)):
            function = getattr(library, name)
            function.restype = None
            function.argtypes = [integer] * 6 + [scalar, pointer, integer, pointer, integer,
                                                 scalar, pointer, integer]
    return library


def available() -> bool:
    """Whether MKL is installed where this module looks, and loads."""
    return _load() is not None


def use(name: str) -> None:
    """Run the products on ``mkl`` or ``openblas`` from now on; ``mkl`` where it is missing is
    an error (``ConfigError``, naming ``MINILMS_BLAS``), not a silent fall-back."""
    if name not in CHOICES:
        raise ConfigError("MINILMS_BLAS", " or ".join(CHOICES), name, source="environment")
    if name == "mkl" and not available():
        raise ConfigError("MINILMS_BLAS", "a library that loads here (pip install mkl, or "
                          "openblas)", name, source="environment")
    _state["chosen"] = name


def cpu_vendor() -> str:
    """The CPU's vendor as Linux's ``/proc/cpuinfo`` names it (``GenuineIntel``,
    ``AuthenticAMD``), "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def _wanted() -> str:
    """What ``MINILMS_BLAS`` asks for, or, where it is unset, the CPU's library: ``mkl`` on an
    Intel CPU (or an unknown one: MKL is Intel's, and the wheel installs only on x86-64 Linux),
    ``openblas`` on another vendor's, where MKL runs slower (the module docstring)."""
    wanted = os.environ.get("MINILMS_BLAS", "").strip().lower()
    if wanted:
        return wanted
    return "mkl" if cpu_vendor() in ("GenuineIntel", "") else "openblas"


def chosen() -> str:
    """The library the products run on: ``mkl`` or ``openblas`` (``MINILMS_BLAS`` read on the
    first call; unset, ``mkl`` where it is found on an Intel CPU)."""
    if _state["chosen"] is None:
        if os.environ.get("MINILMS_BLAS", "").strip():
            use(_wanted())
        else:
            _state["chosen"] = "mkl" if _wanted() == "mkl" and available() else "openblas"
    return _state["chosen"]


def _operand(matrix, itemsize):
    """``(transpose flag, leading dimension)`` for a 2-D view MKL can read in place, or None."""
    rows, cols = matrix.shape
    s0, s1 = matrix.strides
    if s0 % itemsize or s1 % itemsize or s0 < 0 or s1 < 0:
        return None
    s0, s1 = s0 // itemsize, s1 // itemsize
    if s1 == 1 or cols == 1:
        lead = s0 if rows > 1 else cols
        if lead >= cols:
            return _NO_TRANS, lead
    if s0 == 1 or rows == 1:
        lead = s1 if cols > 1 else rows
        if lead >= rows:
            return _TRANS, lead
    return None


def gemm_arguments(a, b, out):
    """CBLAS's row-major GEMM arguments for ``out = a @ b`` of 2-D views read in place:
    ``(trans_a, trans_b, m, n, k, lda, ldb, ldc)``; None where a view cannot be passed so
    (``out`` transposed or strided, an empty product, mixed dtypes)."""
    m, k = a.shape
    n = b.shape[1]
    if min(m, n, k) == 0 or not a.dtype == b.dtype == out.dtype:
        return None
    itemsize = out.itemsize
    op_a, op_b, op_out = _operand(a, itemsize), _operand(b, itemsize), _operand(out, itemsize)
    if op_a is None or op_b is None or op_out is None or op_out[0] != _NO_TRANS:
        return None
    return op_a[0], op_b[0], m, n, k, op_a[1], op_b[1], op_out[1]


def row_blocks(arguments, itemsize: int) -> list:
    """``gemm_arguments``' product as the MKL calls that make it: ``(rows, a's byte offset,
    out's byte offset)`` for each, one call of all rows unless the shape is one MKL writes
    faster in blocks of ``BLOCK_ROWS`` rows (the comment on ``ROW_BLOCKS``)."""
    trans_a, _, m, n, k, lda, _, ldc = arguments
    if not (ROW_BLOCKS and k in BLOCK_INNER and m >= BLOCK_MIN_ROWS and n >= BLOCK_MIN_COLUMNS):
        return [(m, 0, 0)]
    a_row = (lda if trans_a == _NO_TRANS else 1) * itemsize     # a transposed: rows are columns
    return [(min(BLOCK_ROWS, m - r), r * a_row, r * ldc * itemsize)
            for r in range(0, m, BLOCK_ROWS)]


def _gemm(a, b, out, beta: float = 0.0, function=None) -> bool:
    """``out = a @ b + beta * out`` for 2-D views by MKL, or by ``function`` (a ``cblas_sgemm``
    of ``kernels.cblas``, float32 only); False (nothing written) where it cannot."""
    arguments = gemm_arguments(a, b, out)
    if arguments is None:
        return False
    trans_a, trans_b, m, n, k, lda, ldb, ldc = arguments
    blocks = [(m, 0, 0)]
    if function is None:
        library = _state["library"]     # loaded: MKL is chosen
        if out.dtype == np.float32:
            function, blocks = library.cblas_sgemm, row_blocks(arguments, out.itemsize)
        else:
            function = library.cblas_dgemm
    elif out.dtype != np.float32:
        return False
    for rows, a_at, out_at in blocks:
        function(_ROW_MAJOR, trans_a, trans_b, rows, n, k, 1.0, a.ctypes.data + a_at, lda,
                 b.ctypes.data, ldb, beta, out.ctypes.data + out_at, ldc)
    return True


def library_for(a, out) -> str:
    """The library that runs ``out = a @ b``: ``mkl`` where it is chosen and each product of the
    call reaches ``MIN_FLOPS`` (float32 or float64, 2-D or 3-D), else ``openblas``. A caller that
    cuts a call into pieces asks once, for the whole, so every piece runs where the whole would."""
    if (chosen() != "mkl" or out.dtype not in (np.float32, np.float64) or out.ndim not in (2, 3)
            or 2.0 * out.shape[-2] * out.shape[-1] * a.shape[-1] < MIN_FLOPS):
        return "openblas"
    return "mkl"


def product(a, b, out, library: str | None = None, accumulate: bool = False) -> None:
    """``numpy.matmul(a, b, out=out)`` for 2-D or 3-D operands (a 2-D one goes with every product
    of a batch), on ``library`` (default ``library_for`` this call): a ``cblas_?gemm`` per
    product on MKL. ``accumulate``: ``out += a @ b`` instead, by the GEMM's ``beta = 1`` (on
    OpenBLAS through numpy's own ``cblas_sgemm``, ``kernels.cblas``; through a temporary where
    there is none, or for float64)."""
    function = None
    if (library or library_for(a, out)) != "mkl":
        function = _openblas_sgemm() if accumulate else None
        if function is None:
            _numpy_product(a, b, out, accumulate)
            return
    extra = ((1.0,) if accumulate else ()) + ((function,) if function is not None else ())
    if out.ndim == 2:
        if a.ndim != 2 or b.ndim != 2 or not _gemm(a, b, out, *extra):
            _numpy_product(a, b, out, accumulate)
        return
    for i in range(out.shape[0]):
        a_i = a if a.ndim == 2 else a[i if a.shape[0] > 1 else 0]
        b_i = b if b.ndim == 2 else b[i if b.shape[0] > 1 else 0]
        if not _gemm(a_i, b_i, out[i], *extra):
            _numpy_product(a_i, b_i, out[i], accumulate)


def _openblas_sgemm():
    """numpy's OpenBLAS ``cblas_sgemm`` (``kernels.cblas``, imported here: it imports this
    module), or None where it has none."""
    from . import cblas
    return cblas.sgemm("openblas")


def _numpy_product(a, b, out, accumulate: bool) -> None:
    if accumulate:
        out += np.matmul(a, b)
    else:
        np.matmul(a, b, out=out)


def _prime() -> None:
    """MKL loaded now, at import, with a small product of each transpose the kernels use, so
    that ``libmkl_rt`` also opens the kernels of this CPU (``libmkl_avx512`` and the like, which
    it opens at its first call): loading the BLAS library is part of what importing costs, as
    numpy's OpenBLAS loads when numpy does, not part of a run's memory, which ``lms.host``
    states (about 12 MiB and 7 ms here). Skipped where OpenBLAS will be chosen (``MINILMS_BLAS``
    asks for it, or the CPU is not Intel's); a bad value is left for ``chosen`` to report."""
    if _wanted() == "openblas" or not available():
        return
    n = 64
    tiny, out = np.ones((n, n), np.float32), np.empty((n, n), np.float32)
    for trans_a, trans_b in ((_NO_TRANS, _NO_TRANS), (_NO_TRANS, _TRANS), (_TRANS, _NO_TRANS)):
        _state["library"].cblas_sgemm(_ROW_MAJOR, trans_a, trans_b, n, n, n, 1.0, tiny.ctypes.data,
                                      n, tiny.ctypes.data, n, 0.0, out.ctypes.data, n)


_prime()
