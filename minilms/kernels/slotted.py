"""A short plane's products over a fixed number of samples' columns side by side ("slots").

On a short plane a sample's product is far from the machine's rate: ResNet-50's res5 forward is
``[2048, 512] @ [512, 49]`` per sample (a 1x1) or ``[512, 4608] @ [4608, 49]`` (a 3x3's columns),
so the weight (up to 9 MiB) is read whole, from beyond the core's cache, for 49 columns. One
product over a chunk's columns side by side reads it once. But such a product's bits changed with
the number of samples in it (BLAS picks its kernel by the shape), and so a step split into chunks
gave other forwards than the whole step (session 34 took that path out). Here the width is fixed
per layer: ``slots`` samples' columns, ``[K, slots * P]``, where a chunk leaves slots empty they are
zero, and every product of the layer has its one shape. A column's result is then a function of
its own data and that shape only, wherever it sits, provided the width is a whole number of
``ALIGN`` columns: OpenBLAS's SGEMM computes a last part narrower than its kernel's 16 columns
with other bits (MKL did not; ``tests/kernels/test_slotted.py`` checks both). Threads cut the
product by its rows only (``blas_threads.matmul(by_rows=True)``), so every piece holds every
column. A sample's outputs are the same whatever the chunk::

    columns  [K, width]           the caller's copy (im2col, ``side_by_side``, a strided gather);
                                  width = ``width(slots, P)``, slot ``n`` at column ``n * P``
    clear_unused(columns, k, P)   the columns past the chunk's ``k`` samples: zero
    product(weight, columns, out) out = weight @ columns, [O, width]
    from_side_by_side(out, y)     y[n] = out's slot n, for the chunk's samples
"""
from numba import njit, prange

from .blas_threads import matmul
from .shapes import ALIGN, MIN_PLANE, MIN_WEIGHT, SHORT_PLANE, SLOT_COLUMNS, count, width

__all__ = ["SHORT_PLANE", "MIN_PLANE", "MIN_WEIGHT", "SLOT_COLUMNS", "ALIGN", "count", "width",
           "clear_unused", "product", "side_by_side", "from_side_by_side"]

def clear_unused(columns, filled: int, plane: int) -> None:
    """Zero the columns of ``columns [K, width]`` past the first ``filled`` slots."""
    columns[:, filled * plane:] = 0


def product(weight, columns, out) -> None:
    """``out = weight @ columns``, cut by rows across threads (each piece every column)."""
    matmul(weight, columns, out=out, by_rows=True)


@njit(parallel=True, cache=True, nogil=True)
def side_by_side(src, dst):
    """``dst[r, n * P + p] = src[n, r, p]`` for ``src [k, R, P]`` and ``dst [R, >= k * P]``."""
    samples, rows, plane = src.shape
    for task in prange(rows * samples):
        r, n = task // samples, task % samples
        out = dst[r, n * plane:(n + 1) * plane]
        row = src[n, r]
        for p in range(plane):
            out[p] = row[p]


@njit(parallel=True, cache=True, nogil=True)
def from_side_by_side(src, dst, add=False):
    """``dst[n, r, p] = src[r, n * P + p]`` for ``dst [k, R, P]``: ``side_by_side``'s inverse;
    ``add``: ``+=`` (a gradient added into the one there)."""
    samples, rows, plane = dst.shape
    for task in prange(samples * rows):
        n, r = task // rows, task % rows
        row = src[r, n * plane:(n + 1) * plane]
        out = dst[n, r]
        if add:
            for p in range(plane):
                out[p] += row[p]
        else:
            for p in range(plane):
                out[p] = row[p]
