"""GEMM: ``c = alpha * op(a) @ op(b) + beta * c`` for 2-D arrays, and batched over a leading axis.

``op(x)`` is ``x`` or ``x.T`` (``trans_a`` / ``trans_b``), so with ``op(a)`` of shape ``[M, K]`` and
``op(b)`` of shape ``[K, N]``, ``c`` is ``[M, N]``. As in BLAS, ``beta == 0`` means ``c`` is not
read (NaN or garbage in ``c`` does not leak into the result).

CPU: numpy's matmul, which is BLAS (``sgemm``/``dgemm``) for float32/float64; transposes are passed
to BLAS as views, never copied. CUDA: a tiled kernel per transpose combination (``gemm_nn``,
``gemm_nt``, ``gemm_tn``, ``gemm_tt``, as BLAS names them), float32, C-contiguous arrays.

The CUDA kernel tiles ``c`` into ``BM x BN`` blocks. For each ``BK``-deep slice of K, the block's
``THREADS`` threads stage an ``op(a)`` tile and an ``op(b)`` tile in shared memory; then every
thread accumulates a ``TM x TN`` register tile of outputs (register blocking: each value read from
shared memory feeds ``TM`` or ``TN`` FMAs instead of one). A thread's outputs are strided by
``TY``/``TX`` rather than adjacent, so a warp's shared-memory reads hit distinct banks (or
broadcast) and its global stores of ``c`` are coalesced. Bounds are checked only where tiles are
loaded and ``c`` is stored, so any M, N, K work (K = 0 included: ``c = beta * c``).

Batched (``gemm_batched``): ``a``, ``b``, ``c`` are 3-D, ``[batch, rows, cols]``. An operand with
a batch of 1 is broadcast (a convolution's weight against a chunk of samples' columns). ``c``
either has the batch too (one product per sample: the batch is the grid's z axis) or a batch of
1, and then the products are *summed* (a weight gradient over a chunk: each block loops over the
samples around its K loop, so the sum's order is fixed and no atomics are needed). A convolution
over a chunk of samples is then one launch, whatever the chunk's size. The 2-D ``gemm`` is the
batch of one, through the same four kernels.
"""
import numpy as np
from numba import cuda, float32

from .common import launch, view
from .registry import cuda_kernel, on_cpu

__all__ = ["gemm", "gemm_batched", "GEMM_KERNELS", "BM", "BN", "BK", "TM", "TN", "THREADS"]

# The tile shape. Module constants, so the kernel sees them as compile-time constants (loops over
# TM/TN unroll and `acc` lives in registers); the simulator reads them at run time, which lets the
# tests shrink the tile to keep simulated runs fast. BK = 8 keeps every variant at <= 64 registers
# (50% occupancy); BK = 16 costs 72-92 registers for the extra load addresses kept live.
BM, BN, BK = 64, 64, 8      # block tile of c, and the K slice staged per iteration
TM, TN = 4, 4               # outputs per thread


def derived_constants(bm, bn, bk, tm, tn):
    """``(TY, TX, THREADS, A_ROW, B_ROW)`` for a tile shape, after checking the kernel can use it.

    Shared rows are padded so that the non-transposed loads, whose warp spans ``bk`` values of k and
    ``32 // bk`` of m (or n), store to distinct banks: a row stride of ``32 // bk`` (mod 32) puts
    element ``[k, m]`` in bank ``k * (32 // bk) + m``; unpadded, those stores conflict ``bk``-way.
    """
    ty, tx = bm // tm, bn // tn
    threads = ty * tx
    # Each load pass covers whole rows of a tile, and every thread makes the same number of passes.
    if bm % tm or bn % tn or any(threads % x for x in (bm, bn, bk)) \
            or (bm * bk) % threads or (bk * bn) % threads:
        raise ValueError(f"gemm tile {bm}x{bn}x{bk} / {tm}x{tn} per thread does not divide evenly")
    return ty, tx, threads, bm + 32 // bk, bn + 32 // bk


# Numba needs shared shapes as plain constants, hence names rather than inline sums.
TY, TX, THREADS, A_ROW, B_ROW = derived_constants(BM, BN, BK, TM, TN)


def _gemm_kernel(trans_a, trans_b):
    """The kernel for one transpose combination, registered as ``gemm.gemm_<nn|nt|tn|tt>``.

    The flags are closure constants, so each kernel is compiled with only its own index math: with
    runtime flags both load paths' addresses stay live across the K loop (85-92 registers, not 64).
    """
    def kernel(a, b, c, alpha, beta):
        """One ``BM x BN`` tile of ``c[z]`` per block, ``THREADS`` threads (1-D) per block.

        Grid: ``(ceil(N / BN), ceil(M / BM), c.shape[0])``. ``a[s]`` is ``[M, K]`` (``[K, M]``
        if ``trans_a``), ``b[s]`` is ``[K, N]`` (``[N, K]`` if ``trans_b``); both tiles are
        stored k-major: ``a_tile[k, m]``, ``b_tile[k, n]``. Block z sums the samples
        ``s = z * per .. z * per + per - 1`` (``per`` is 1 unless ``c`` has a batch of 1); an
        operand with a batch of 1 is the same for every sample.
        """
        a_tile = cuda.shared.array((BK, A_ROW), float32)
        b_tile = cuda.shared.array((BK, B_ROW), float32)
        acc = cuda.local.array((TM, TN), float32)
        a_frag = cuda.local.array(TM, float32)
        b_frag = cuda.local.array(TN, float32)

        m_size = c.shape[1]
        n_size = c.shape[2]
        k_size = a.shape[1] if trans_a else a.shape[2]
        samples = max(a.shape[0], b.shape[0])
        per = samples // c.shape[0]            # samples summed into this block's c
        z = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        zero = float32(0.0)
        # Where this thread loads from: consecutive threads take consecutive elements along the
        # axis that is contiguous in memory (coalescing), whichever axis of the tile that is; the
        # other axis steps by THREADS // (tile extent) per load. Out-of-range elements are staged
        # as zeros, so the compute loop needs no bounds checks.
        a_fast = tid % (BM if trans_a else BK)
        a_slow = tid // (BM if trans_a else BK)
        b_fast = tid % (BK if trans_b else BN)
        b_slow = tid // (BK if trans_b else BN)

        for i in range(TM):
            for j in range(TN):
                acc[i, j] = zero

        for s in range(z * per, z * per + per):
            sa = s if a.shape[0] > 1 else 0     # an operand of one sample serves every sample
            sb = s if b.shape[0] > 1 else 0
            for k0 in range(0, k_size, BK):
                for load in range(BM * BK // THREADS):
                    if trans_a:
                        mm = a_fast
                        kk = a_slow + load * (THREADS // BM)
                    else:
                        kk = a_fast
                        mm = a_slow + load * (THREADS // BK)
                    m = m0 + mm
                    k = k0 + kk
                    value = zero
                    if m < m_size and k < k_size:
                        value = a[sa, k, m] if trans_a else a[sa, m, k]
                    a_tile[kk, mm] = value
                for load in range(BK * BN // THREADS):
                    if trans_b:
                        kk = b_fast
                        nn = b_slow + load * (THREADS // BK)
                    else:
                        nn = b_fast
                        kk = b_slow + load * (THREADS // BN)
                    n = n0 + nn
                    k = k0 + kk
                    value = zero
                    if n < n_size and k < k_size:
                        value = b[sb, n, k] if trans_b else b[sb, k, n]
                    b_tile[kk, nn] = value
                cuda.syncthreads()

                for kk in range(BK):
                    for i in range(TM):
                        a_frag[i] = a_tile[kk, ty + i * TY]
                    for j in range(TN):
                        b_frag[j] = b_tile[kk, tx + j * TX]
                    for i in range(TM):
                        for j in range(TN):
                            acc[i, j] += a_frag[i] * b_frag[j]
                # The next iteration overwrites the tiles: everyone must be done reading them.
                cuda.syncthreads()

        for i in range(TM):
            m = m0 + ty + i * TY
            if m < m_size:
                for j in range(TN):
                    n = n0 + tx + j * TX
                    if n < n_size:
                        if beta == zero:
                            c[z, m, n] = alpha * acc[i, j]
                        else:
                            c[z, m, n] = alpha * acc[i, j] + beta * c[z, m, n]

    kernel.__name__ = kernel.__qualname__ = "gemm_" + "nt"[trans_a] + "nt"[trans_b]
    return cuda_kernel("void(float32[:, :, ::1], float32[:, :, ::1], float32[:, :, ::1], float32, "
                       "float32)", block=THREADS)(kernel)


# Indexed by (trans_a, trans_b), as BLAS does it: one kernel per transpose combination.
GEMM_KERNELS = {(ta, tb): _gemm_kernel(ta, tb) for ta in (False, True) for tb in (False, True)}


def gemm(a, b, c, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, stream=None):
    """``c[M, N] = alpha * op(a)[M, K] @ op(b)[K, N] + beta * c``, in place; returns ``c``.

    ``a``, ``b``, ``c`` are 2-D, of one dtype, all numpy (the ``cpu`` device: float32 or float64)
    or all CUDA device arrays (float32, C-contiguous: express a transpose with
    ``trans_a``/``trans_b``, not with a ``.T`` view). ``c`` must not overlap ``a`` or ``b`` on CUDA.
    ``stream`` is the CUDA stream to launch on (default stream when None; ignored on the CPU).
    """
    m, n, k = _check_shapes(a, b, c, trans_a, trans_b)
    if _placed(a, b, c):
        _gemm_cpu(a, b, c, trans_a, trans_b, alpha, beta)
        return c
    if m and n:
        _launch(*(view(x, 1, *x.shape) for x in (a, b, c)), m, n, trans_a, trans_b, alpha,
                beta, stream)
    return c


def gemm_batched(a, b, c, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, stream=None):
    """``c[z] = alpha * sum_s op(a[s]) @ op(b[s]) + beta * c[z]`` over 3-D ``[batch, rows, cols]``
    arrays, in place; returns ``c``.

    An operand with a batch of 1 serves every sample. ``c``'s batch is the samples' (one product
    each) or 1 (their sum: ``s`` runs over the whole batch). Otherwise as ``gemm``.
    """
    if a.ndim != 3 or b.ndim != 3 or c.ndim != 3:
        raise ValueError(f"gemm_batched needs 3-D arrays, got {a.ndim}-D, {b.ndim}-D, {c.ndim}-D")
    samples = max(a.shape[0], b.shape[0])
    if any(x.shape[0] not in (1, samples) for x in (a, b)) or c.shape[0] not in (1, samples):
        raise ValueError(f"gemm_batched batches do not match: a {a.shape[0]}, b {b.shape[0]}, "
                         f"c {c.shape[0]} (each the batch, or 1)")
    m, n, k = _check_shapes(a[0], b[0], c[0], trans_a, trans_b)
    if _placed(a, b, c):
        op_a = a.transpose(0, 2, 1) if trans_a else a
        op_b = b.transpose(0, 2, 1) if trans_b else b
        product = np.matmul(op_a, op_b)
        if c.shape[0] == 1 and samples > 1:
            product = product.sum(axis=0, keepdims=True, dtype=c.dtype)
        c[...] = alpha * product + (beta * c if beta else 0)
        return c
    if m and n:
        _launch(a, b, c, m, n, trans_a, trans_b, alpha, beta, stream)
    return c


def _placed(a, b, c) -> bool:
    """True for numpy arrays (the cpu device), False for CUDA arrays checked for the kernel."""
    cpu = [on_cpu(x) for x in (a, b, c)]
    if any(cpu) != all(cpu):
        raise TypeError("gemm: a, b and c must all be numpy arrays or all CUDA device arrays")
    if all(cpu):
        return True
    if c.dtype != np.float32:
        raise TypeError(f"gemm on CUDA supports float32 only, got {c.dtype}")
    for name, x in (("a", a), ("b", b), ("c", c)):
        if not x.is_c_contiguous():
            raise ValueError(f"gemm on CUDA needs C-contiguous arrays ({name} is not): "
                             "use trans_a/trans_b instead of transposed views")
    return False


def _launch(a, b, c, m, n, trans_a, trans_b, alpha, beta, stream):
    grid = ((n + BN - 1) // BN, (m + BM - 1) // BM, c.shape[0])
    if grid[1] > 65535 or grid[2] > 65535:  # CUDA's limits on gridDim.y and z
        raise ValueError(f"gemm on CUDA: M = {m} needs {grid[1]} row tiles of {BM} and "
                         f"{grid[2]} batches (at most 65535 each)")
    # Scalars are cast to the registered signature's types, so what runs is what the PTX report
    # compiled (a Python float would be typed float64 and compile a second, unreported variant).
    kernel = GEMM_KERNELS[bool(trans_a), bool(trans_b)]
    launch(kernel, grid, THREADS, stream)(a, b, c, np.float32(alpha), np.float32(beta))


def _check_shapes(a, b, c, trans_a, trans_b):
    if a.ndim != 2 or b.ndim != 2 or c.ndim != 2:
        raise ValueError(f"gemm needs 2-D arrays, got {a.ndim}-D, {b.ndim}-D, {c.ndim}-D")
    if not a.dtype == b.dtype == c.dtype:
        raise TypeError(f"gemm needs one dtype, got {a.dtype}, {b.dtype}, {c.dtype}")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != kb or tuple(c.shape) != (m, n):
        raise ValueError(f"gemm shapes do not match: op(a) {m}x{k}, op(b) {kb}x{n}, c {c.shape}")
    return m, n, k


def _gemm_cpu(a, b, c, trans_a, trans_b, alpha, beta):
    if c.dtype not in (np.float32, np.float64):
        raise TypeError(f"gemm on the CPU supports float32 and float64, got {c.dtype}")
    op_a = a.T if trans_a else a
    op_b = b.T if trans_b else b
    if beta == 0:
        # BLAS writes straight into c: no temporary, and c's old contents are never read.
        np.matmul(op_a, op_b, out=c)
        if alpha != 1:
            c *= alpha
        return
    # numpy has no beta: one temporary the size of c is the price.
    product = np.matmul(op_a, op_b)
    if alpha != 1:
        product *= alpha
    if beta != 1:
        c *= beta
    c += product
