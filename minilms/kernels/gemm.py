"""GEMM: ``c = alpha * op(a) @ op(b) + beta * c`` for 2-D arrays, and batched over a leading axis.

``op(x)`` is ``x`` or ``x.T`` (``trans_a`` / ``trans_b``), so with ``op(a)`` of shape ``[M, K]`` and
``op(b)`` of shape ``[K, N]``, ``c`` is ``[M, N]``. As in BLAS, ``beta == 0`` means ``c`` is not
read (NaN or garbage in ``c`` does not leak into the result).

CPU: numpy's matmul, which is BLAS (``sgemm``/``dgemm``) for float32/float64; transposes are passed
to BLAS as views, never copied. CUDA: a tiled kernel per transpose combination (``gemm_nn``,
``gemm_nt``, ``gemm_tn``, ``gemm_tt``, as BLAS names them), float32, C-contiguous arrays.

The CUDA kernel tiles ``c`` into ``BM x BN = 128 x 128`` blocks of 256 threads. For each
``BK = 8``-deep slice of K, the threads stage an ``op(a)`` tile and an ``op(b)`` tile in shared
memory; then every thread accumulates a ``TM x TN = 8 x 8`` register tile of outputs (register
blocking: each value read from shared memory feeds 8 FMAs). A thread's rows (and columns) come
in groups of four adjacent ones, 64 apart, so that a step of k reads them as four 16-byte shared
loads, and the eight steps of a slice are unrolled: 512 FMAs against 32 shared loads per slice.
The tiles are double-buffered: the next slice's global loads are issued into registers before
this slice is computed and staged into the other buffer after it, one barrier a slice.
Indices are unsigned 32-bit, so the compiler drops numba's wrap-around of negative indices and
addresses each load as a base and a constant. Bounds are checked only where tiles are loaded and
``c`` is stored, so any M, N, K work (K = 0 included: ``c = beta * c``). docs/kernels.md has the
design and its SASS.

Batched (``gemm_batched``): ``a``, ``b``, ``c`` are 3-D, ``[batch, rows, cols]``. An operand with
a batch of 1 is broadcast (a convolution's weight against a chunk of samples' columns). ``c``
either has the batch too (one product per sample: the batch is the grid's z axis) or a batch of
1, and then the products are *summed* (a weight gradient over a chunk: each block loops over the
samples around its K loop, so the sum's order is fixed and no atomics are needed). A convolution
over a chunk of samples is then one launch, whatever the chunk's size. The 2-D ``gemm`` is the
batch of one, through the same four kernels.
"""
import numba
import numpy as np
from numba import float32, uint32

from ..lazy_cuda import cuda
from .blas_threads import matmul
from .common import launch, view
from .registry import cuda_kernel, on_cpu
from .shapes import GEMM_TILE, INNER_LOOP_FFMA_SHARE  # noqa: F401 (named here too)

__all__ = ["gemm", "gemm_batched", "k_span", "GEMM_KERNELS", "K_SPLIT_KERNELS", "BM", "BN", "BK",
           "TM", "TN", "THREADS"]

# The tile shape. Module constants, so the kernel sees them as compile-time constants (loops over
# TM/TN unroll and `acc` lives in registers); the simulator reads them at run time, which lets the
# tests shrink the tile to keep simulated runs fast. 128 x 128 x 8 with 8 x 8 per thread, double
# buffered, takes 106-127 registers on sm_90 (two blocks of 256 threads per SM), no spills.
(BM, BN), BK = GEMM_TILE, 8
TM, TN = 8, 8


DERIVED = ("TY", "TX", "THREADS", "A_ROW", "B_ROW", "VM", "VN", "A_LOADS", "B_LOADS")


def derived_constants(bm, bn, bk, tm, tn):
    """The ``DERIVED`` constants of a tile shape, after checking the kernel can use it.

    Shared rows are padded so that the non-transposed loads, whose warp spans ``bk`` values of k and
    ``32 // bk`` of m (or n), store to distinct banks: a row stride of ``32 // bk`` (mod 32) puts
    element ``[k, m]`` in bank ``k * (32 // bk) + m``; unpadded, those stores conflict ``bk``-way.
    With ``bk = 8`` the rows stay whole 16-byte groups (``VM``, ``VN``: below).
    """
    ty, tx = bm // tm, bn // tn
    threads = ty * tx
    # Each load pass covers whole rows of a tile, and every thread makes the same number of passes.
    if bm % tm or bn % tn or any(threads % x for x in (bm, bn, bk)) \
            or (bm * bk) % threads or (bk * bn) % threads \
            or bk % 8 or tm % min(4, tm) or tn % min(4, tn):   # k unrolled by 8; groups of 4
        raise ValueError(f"gemm tile {bm}x{bn}x{bk} / {tm}x{tn} per thread does not divide evenly")
    return (ty, tx, threads, bm + 32 // bk, bn + 32 // bk, min(4, tm), min(4, tn),
            bm * bk // threads, bk * bn // threads)


# Numba needs shared shapes as plain constants, hence names rather than inline sums.
# A thread's rows of the tile are VM adjacent ones, then VM more TY * VM further on, and so on
# (its columns likewise): each group is one 16-byte shared load (LDS.128), and a warp's loads of a
# group touch distinct banks or broadcast.
# A_LOADS, B_LOADS: the elements of a slice of a and of b each thread fetches.
TY, TX, THREADS, A_ROW, B_ROW, VM, VN, A_LOADS, B_LOADS = derived_constants(BM, BN, BK, TM, TN)


# Shared tiles are 16-byte aligned so that the compiler can prove the grouped loads aligned (the
# simulator takes no alignment).
SHARED_ALIGN = None if numba.config.ENABLE_CUDASIM else 16


@cuda.jit(device=True, inline="always")  # IR-inlined: compile_ptx needs no GPU
def _outer_product(a_tile, b_tile, kk, ty, tx, acc, a_frag, b_frag):
    """``acc += a_tile[kk, rows] (x) b_tile[kk, cols]``: the thread's ``TM x TN`` outputs take one
    step of k, ``TM + TN`` values loaded from shared memory (in groups of four) feeding
    ``TM * TN`` FMAs."""
    for i in range(TM):
        a_frag[i] = a_tile[kk, (i // VM) * (TY * VM) + ty * VM + i % VM]
    for j in range(TN):
        b_frag[j] = b_tile[kk, (j // VN) * (TX * VN) + tx * VN + j % VN]
    for i in range(TM):
        for j in range(TN):
            acc[i, j] += a_frag[i] * b_frag[j]


@cuda.jit(device=True, inline="always")  # IR-inlined: compile_ptx needs no GPU
def _spot(load, fast, slow, transposed, is_a):
    """Where load number ``load`` of this thread lands in its tile: ``(kk, index along m or n)``.
    Consecutive threads take consecutive elements along the axis that is contiguous in memory
    (coalescing), whichever axis of the tile that is; the other axis steps by ``THREADS // (tile
    extent)`` per load."""
    extent = BM if is_a else BN
    if transposed == is_a:          # a stored [K, M] (trans_a), b stored [K, N] (not trans_b)
        return slow + uint32(load * (THREADS // extent)), fast
    return fast, slow + uint32(load * (THREADS // BK))


@cuda.jit(device=True, inline="always")
def _fetch(x, at, k0, r0, fast, slow, r_size, k_size, k_end, transposed, is_a, into):
    """This thread's elements of the ``BK``-deep slice from ``k0`` of operand ``x`` (``a`` or
    ``b``, the sample from element ``at``) into registers; zeros outside the matrix or past
    ``k_end`` (the end of the block's span of K), so the compute needs no bounds checks. ``r`` is
    m for ``a``, n for ``b``; ``k_size`` is K, which strides the rows."""
    for load in range(into.size):
        kk, rr = _spot(load, fast, slow, transposed, is_a)
        r = uint32(r0 + rr)
        k = uint32(k0 + kk)
        value = float32(0.0)
        if r < r_size and k < k_end:
            # a: [M, K] or, transposed, [K, M]; b: [K, N] or, transposed, [N, K]
            if transposed == is_a:
                value = x[at + uint32(k * r_size + r)]
            else:
                value = x[at + uint32(r * k_size + k)]
        into[load] = value


@cuda.jit(device=True, inline="always")
def _stage(values, tile, fast, slow, transposed, is_a):
    """The fetched elements into a shared tile, k-major: ``tile[kk, m or n]``."""
    for load in range(values.size):
        kk, rr = _spot(load, fast, slow, transposed, is_a)
        tile[kk, rr] = values[load]


def _gemm_kernel(trans_a, trans_b, k_split=False):
    """The kernel for one transpose combination, registered as ``gemm.gemm_<nn|nt|tn|tt>``, and
    with ``k_split`` as ``gemm.gemm_<..>_k_split``: each block sums a span of K only.

    The flags are closure constants, so each kernel is compiled with only its own index math: with
    runtime flags both load paths' addresses stay live across the K loop. Without ``k_split`` the
    span is all of K, one value that both bounds K and strides the rows: a span bound apart
    from the stride slows the kernel on a GPU (docs/kernels.md, "Split-K"), so only the split-K
    weight gradients pay it.
    """
    def kernel(a, b, c, m_size, n_size, k_size, a_step, b_step, per, k_parts, k_span, alpha,
               beta):
        """One ``BM x BN`` tile of ``c[z]`` per block, ``THREADS`` threads (1-D) per block.

        Grid: ``(ceil(N / BN), ceil(M / BM), batch of c)``. The operands come flat (C order):
        sample ``s`` of ``a`` is ``[M, K]`` (``[K, M]`` if ``trans_a``) from element
        ``s * a_step``, of ``b`` ``[K, N]`` (``[N, K]`` if ``trans_b``) from ``s * b_step`` (a
        step of 0: one sample serves all). With ``z = g * k_parts + j``, block z sums the
        samples ``g * per`` to ``g * per + per - 1`` over the j-th ``k_span`` of K into ``c[z]``
        (one part, ``k_span >= K``: the whole of K). Both tiles are stored k-major:
        ``a_tile[k, m]``, ``b_tile[k, n]``.

        Indices are unsigned (the launcher checks that a sample's offsets fit 32 bits): the
        compiler then knows they are never negative, numba's wrap-around of negative indices
        folds away, and each shared load is one instruction at a constant offset from a base.
        """
        a_tiles = cuda.shared.array((2, BK, A_ROW), float32, alignment=SHARED_ALIGN)
        b_tiles = cuda.shared.array((2, BK, B_ROW), float32, alignment=SHARED_ALIGN)
        a_next = cuda.local.array(A_LOADS, float32)   # the next slice, in flight
        b_next = cuda.local.array(B_LOADS, float32)
        acc = cuda.local.array((TM, TN), float32)
        a_frag = cuda.local.array(TM, float32)
        b_frag = cuda.local.array(TN, float32)

        tid = uint32(cuda.threadIdx.x)
        ty = tid // uint32(TX)
        tx = tid % uint32(TX)
        m0 = uint32(cuda.blockIdx.y) * uint32(BM)
        n0 = uint32(cuda.blockIdx.x) * uint32(BN)
        z = uint32(cuda.blockIdx.z)
        if k_split:
            group = z // k_parts
            k_begin = (z % k_parts) * k_span
            k_end = min(k_size, k_begin + k_span)
        else:
            group = z
            k_begin = uint32(0)
            k_end = k_size
        zero = float32(0.0)
        # where this thread loads from (``_spot``)
        a_fast = tid % uint32(BM if trans_a else BK)
        a_slow = tid // uint32(BM if trans_a else BK)
        b_fast = tid % uint32(BK if trans_b else BN)
        b_slow = tid // uint32(BK if trans_b else BN)

        for i in range(TM):
            for j in range(TN):
                acc[i, j] = zero

        for s in range(group * per, group * per + per):
            a_at = s * a_step       # where this sample's operands start
            b_at = s * b_step
            # Double-buffered: the next slice is fetched into registers before this one is
            # computed (its global loads in flight under 512 FMAs), and staged into the other
            # shared buffer after: one barrier a slice. The span's first slice is staged first.
            _fetch(a, a_at, k_begin, m0, a_fast, a_slow, m_size, k_size, k_end, trans_a, True,
                   a_next)
            _fetch(b, b_at, k_begin, n0, b_fast, b_slow, n_size, k_size, k_end, trans_b, False,
                   b_next)
            _stage(a_next, a_tiles[0], a_fast, a_slow, trans_a, True)
            _stage(b_next, b_tiles[0], b_fast, b_slow, trans_b, False)
            cuda.syncthreads()
            cur = 0
            for k0 in range(k_begin, k_end, BK):
                k1 = uint32(k0 + BK)
                if k1 < k_end:
                    _fetch(a, a_at, k1, m0, a_fast, a_slow, m_size, k_size, k_end, trans_a, True,
                           a_next)
                    _fetch(b, b_at, k1, n0, b_fast, b_slow, n_size, k_size, k_end, trans_b,
                           False, b_next)
                a_tile, b_tile = a_tiles[cur], b_tiles[cur]
                # unrolled by hand, eight steps of k at a time: the compiler leaves a loop
                # whose body is 64 FMAs rolled, and its counter and addresses then cost a
                # third of the instructions
                for kk in range(0, BK, 8):
                    _outer_product(a_tile, b_tile, kk, ty, tx, acc, a_frag, b_frag)
                    _outer_product(a_tile, b_tile, kk + 1, ty, tx, acc, a_frag, b_frag)
                    _outer_product(a_tile, b_tile, kk + 2, ty, tx, acc, a_frag, b_frag)
                    _outer_product(a_tile, b_tile, kk + 3, ty, tx, acc, a_frag, b_frag)
                    _outer_product(a_tile, b_tile, kk + 4, ty, tx, acc, a_frag, b_frag)
                    _outer_product(a_tile, b_tile, kk + 5, ty, tx, acc, a_frag, b_frag)
                    _outer_product(a_tile, b_tile, kk + 6, ty, tx, acc, a_frag, b_frag)
                    _outer_product(a_tile, b_tile, kk + 7, ty, tx, acc, a_frag, b_frag)
                cur = 1 - cur
                if k1 < k_end:      # into the buffer everyone finished reading a slice ago
                    _stage(a_next, a_tiles[cur], a_fast, a_slow, trans_a, True)
                    _stage(b_next, b_tiles[cur], b_fast, b_slow, trans_b, False)
                cuda.syncthreads()

        c_at = z * m_size * n_size
        for i in range(TM):
            m = m0 + uint32((i // VM) * (TY * VM) + i % VM) + ty * uint32(VM)
            if m < m_size:
                for j in range(TN):
                    n = n0 + uint32((j // VN) * (TX * VN) + j % VN) + tx * uint32(VN)
                    if n < n_size:
                        at = c_at + m * n_size + n
                        if beta == zero:
                            c[at] = alpha * acc[i, j]
                        else:
                            c[at] = alpha * acc[i, j] + beta * c[at]

    kernel.__name__ = kernel.__qualname__ = \
        "gemm_" + "nt"[trans_a] + "nt"[trans_b] + ("_k_split" if k_split else "")
    return cuda_kernel("void(float32[::1], float32[::1], float32[::1], uint32, uint32, uint32, "
                       "uint32, uint32, uint32, uint32, uint32, float32, float32)",
                       block=THREADS)(kernel)


def source_digest() -> str:
    """A digest of what the CUDA kernels are compiled from (their source and tile constants):
    the golden record of their SASS (tests/golden/gemm_sass.json) names the digest it was made
    from, so a changed kernel with an old record fails its test."""
    from .sass import source_digest as digest
    return digest(_gemm_kernel, _outer_product, _spot, _fetch, _stage, (BM, BN, BK, TM, TN))


# Indexed by (trans_a, trans_b), as BLAS does it: one kernel per transpose combination.
GEMM_KERNELS = {(ta, tb): _gemm_kernel(ta, tb) for ta in (False, True) for tb in (False, True)}
# K split into spans: the weight gradients' ``grad @ cols^T`` (a convolution's, a 1x1's).
K_SPLIT_KERNELS = {(False, True): _gemm_kernel(False, True, k_split=True)}


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


def gemm_batched(a, b, c, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, stream=None,
                 k_parts=1):
    """``c[z] = alpha * sum_s op(a[s]) @ op(b[s]) + beta * c[z]`` over 3-D ``[batch, rows, cols]``
    arrays, in place; returns ``c``.

    An operand with a batch of 1 serves every sample. ``c``'s batch is the samples' (one product
    each), 1 (their sum: ``s`` runs over the whole batch), or a divisor of it (``c[z]`` sums
    samples ``z * per`` to ``z * per + per - 1``, ``per = samples / batch of c``: a split-K
    sum's partials, for ``split_k.sum_splits``). ``k_parts`` splits K too: ``c``'s batch is then
    ``groups * k_parts`` and ``c[g * k_parts + j]`` sums group ``g``'s samples over the j-th
    span of K (``k_span``: whole slices of ``BK``; a span past K sums nothing). Otherwise as
    ``gemm``.
    """
    if a.ndim != 3 or b.ndim != 3 or c.ndim != 3:
        raise ValueError(f"gemm_batched needs 3-D arrays, got {a.ndim}-D, {b.ndim}-D, {c.ndim}-D")
    samples = max(a.shape[0], b.shape[0])
    groups = c.shape[0] // k_parts if k_parts >= 1 and c.shape[0] % k_parts == 0 else 0
    if any(x.shape[0] not in (1, samples) for x in (a, b)) or not groups or samples % groups:
        raise ValueError(f"gemm_batched batches do not match: a {a.shape[0]}, b {b.shape[0]}, "
                         f"c {c.shape[0]}, k_parts {k_parts} (a and b: the batch, or 1; c: "
                         "k_parts times a divisor of it)")
    m, n, k = _check_shapes(a, b, c, trans_a, trans_b, batched=True)
    if _placed(a, b, c):
        op_a = a.transpose(0, 2, 1) if trans_a else a
        op_b = b.transpose(0, 2, 1) if trans_b else b
        span = k_span(k, k_parts)
        product = np.matmul(op_a, op_b)[:, None] if k_parts == 1 else np.stack(
            [np.matmul(op_a[:, :, j * span:(j + 1) * span], op_b[:, j * span:(j + 1) * span])
             for j in range(k_parts)], axis=1)         # [samples, k_parts, m, n]
        if groups < samples:        # each c[g * k_parts + j] sums samples / groups of them
            product = product.reshape(groups, -1, k_parts, m, n).sum(axis=1, dtype=c.dtype)
        c[...] = alpha * product.reshape(c.shape) + (beta * c if beta else 0)
        return c
    if m and n:
        _launch(a, b, c, m, n, trans_a, trans_b, alpha, beta, stream, k_parts)
    return c


def k_span(k: int, k_parts: int) -> int:
    """The depth of K each of ``k_parts`` parts sums: K shared out in whole slices of ``BK``."""
    if k_parts == 1:
        return max(k, 1)
    return -(-k // (k_parts * BK)) * BK


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


def _launch(a, b, c, m, n, trans_a, trans_b, alpha, beta, stream, k_parts=1):
    grid = ((n + BN - 1) // BN, (m + BM - 1) // BM, c.shape[0])
    if grid[1] > 65535 or grid[2] > 65535:  # CUDA's limits on gridDim.y and z
        raise ValueError(f"gemm on CUDA: M = {m} needs {grid[1]} row tiles of {BM} and "
                         f"{grid[2]} batches (at most 65535 each)")
    # Scalars are cast to the registered signature's types, so what runs is what the PTX report
    # compiled (a Python float would be typed float64 and compile a second, unreported variant).
    k = a.shape[1] if trans_a else a.shape[2]
    if max(m * k, k * n, m * n) >= 2**32:
        raise ValueError(f"gemm on CUDA: a {m}x{k} by {k}x{n} product has matrices of 2**32 "
                         "elements or more (its indices are 32-bit)")
    samples = max(a.shape[0], b.shape[0])
    steps = [x.shape[1] * x.shape[2] if x.shape[0] > 1 else 0 for x in (a, b)]
    kernels = K_SPLIT_KERNELS if k_parts > 1 else GEMM_KERNELS
    if (bool(trans_a), bool(trans_b)) not in kernels:
        raise ValueError("gemm on CUDA splits K for trans_b alone (a weight gradient's "
                         f"grad @ cols^T), not trans_a={trans_a}, trans_b={trans_b}")
    kernel = kernels[bool(trans_a), bool(trans_b)]
    launch(kernel, grid, THREADS, stream)(
        *(view(x, x.size) for x in (a, b, c)), np.uint32(m), np.uint32(n), np.uint32(k),
        *map(np.uint32, steps), np.uint32(samples * k_parts // c.shape[0]),
        np.uint32(k_parts), np.uint32(k_span(k, k_parts)), np.float32(alpha), np.float32(beta))


def _check_shapes(a, b, c, trans_a, trans_b, batched=False):
    """(m, n, k) of 2-D ``a``, ``b``, ``c``; ``batched``: of each sample of 3-D ones (read from
    the shapes: a CUDA array's ``a[0]`` would cost tens of microseconds of host time)."""
    sa, sb, sc = (tuple(x.shape[1:] if batched else x.shape) for x in (a, b, c))
    if len(sa) != 2 or len(sb) != 2 or len(sc) != 2:
        raise ValueError(f"gemm needs 2-D arrays, got {len(sa)}-D, {len(sb)}-D, {len(sc)}-D")
    if not a.dtype == b.dtype == c.dtype:
        raise TypeError(f"gemm needs one dtype, got {a.dtype}, {b.dtype}, {c.dtype}")
    m, k = (sa[1], sa[0]) if trans_a else sa
    kb, n = (sb[1], sb[0]) if trans_b else sb
    if k != kb or sc != (m, n):
        raise ValueError(f"gemm shapes do not match: op(a) {m}x{k}, op(b) {kb}x{n}, c {sc}")
    return m, n, k


def _gemm_cpu(a, b, c, trans_a, trans_b, alpha, beta):
    if c.dtype not in (np.float32, np.float64):
        raise TypeError(f"gemm on the CPU supports float32 and float64, got {c.dtype}")
    op_a = a.T if trans_a else a
    op_b = b.T if trans_b else b
    if beta == 0:
        # BLAS writes straight into c: no temporary, and c's old contents are never read.
        matmul(op_a, op_b, out=c)
        if alpha != 1:
            c *= alpha
        return
    # numpy has no beta: one temporary the size of c is the price.
    product = matmul(op_a, op_b)
    if alpha != 1:
        product *= alpha
    if beta != 1:
        c *= beta
    c += product
