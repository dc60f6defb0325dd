"""GEMM: the CPU path against a naive triple loop and numpy; the CUDA kernels against the CPU path.

Under the simulator the CUDA tests shrink the tile (module constants, read at run time there) to
8x8x4 with 2x2 outputs per thread, so the real kernel code straddles its tile edges in well under
a second per case; one test keeps the real 64x64x8 tile. On a GPU every test uses the real tile.
"""
import tracemalloc

import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilms.kernels import gemm as gemm_module
from minilms.kernels import shapes
from minilms.kernels.gemm import gemm

SIMULATED = bool(numba.config.ENABLE_CUDASIM)
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


def operands(m, n, k, trans_a, trans_b, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    c = rng.standard_normal((m, n)).astype(dtype)
    return a, b, c


def naive_gemm(a, b, c, trans_a, trans_b, alpha, beta):
    """The definition, one scalar at a time, in float64."""
    op_a = a.T if trans_a else a
    op_b = b.T if trans_b else b
    m, k = op_a.shape
    n = op_b.shape[1]
    out = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            total = 0.0
            for p in range(k):
                total += float(op_a[i, p]) * float(op_b[p, j])
            out[i, j] = alpha * total + (beta * float(c[i, j]) if beta != 0 else 0.0)
    return out


# --- CPU ------------------------------------------------------------------------------------------

@given(m=st.integers(0, 6), n=st.integers(0, 6), k=st.integers(0, 6),
       trans=st.sampled_from(TRANSPOSES), alpha=st.sampled_from([1.0, -0.5, 2.0]),
       beta=st.sampled_from([0.0, 1.0, 0.25]), dtype=st.sampled_from([np.float32, np.float64]))
def test_cpu_matches_naive_loop(m, n, k, trans, alpha, beta, dtype):
    a, b, c = operands(m, n, k, *trans, dtype=dtype)
    expected = naive_gemm(a, b, c, *trans, alpha, beta)
    result = gemm(a, b, c, *trans, alpha=alpha, beta=beta)
    assert result is c and c.dtype == dtype
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
def test_cpu_matches_numpy(trans_a, trans_b):
    a, b, c = operands(67, 45, 33, trans_a, trans_b, dtype=np.float64)
    expected = 0.5 * (a.T if trans_a else a) @ (b.T if trans_b else b) - 2.0 * c
    gemm(a, b, c, trans_a, trans_b, alpha=0.5, beta=-2.0)
    np.testing.assert_allclose(c, expected, rtol=1e-12, atol=1e-12)


def test_cpu_beta_zero_ignores_c_and_allocates_nothing():
    a, b, _ = operands(256, 256, 64, True, False, dtype=np.float64)
    c = np.full((256, 256), np.nan)
    tracemalloc.start()
    gemm(a, b, c, trans_a=True, alpha=3.0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < c.nbytes // 8, (f"beta == 0 should write straight into c, but {peak} B were "
                                  "allocated")
    np.testing.assert_allclose(c, 3.0 * a.T @ b, rtol=1e-12, atol=1e-12)


def test_rejects_mismatched_arguments():
    a, b, c = operands(3, 4, 5, False, False)
    with pytest.raises(ValueError, match="shapes"):
        gemm(a, b, c, trans_a=True)
    with pytest.raises(ValueError, match="2-D"):
        gemm(a[0], b, c)
    with pytest.raises(TypeError, match="one dtype"):
        gemm(a.astype(np.float64), b, c)
    with pytest.raises(TypeError, match="float32 and float64"):
        gemm(a.astype(np.int32), b.astype(np.int32), c.astype(np.int32))


# --- CUDA -----------------------------------------------------------------------------------------

@pytest.fixture
def tile(monkeypatch):
    """The gemm module, with its tile shrunk to 8x8x8 / 2x2 per thread under the simulator.

    Only there: a real GPU compiles the constants into the kernel at its first launch, so patching
    them would leave a kernel and a launcher that disagree for the rest of the session.
    """
    if SIMULATED:
        shape = dict(BM=8, BN=8, BK=8, TM=2, TN=2)
        derived = dict(zip(gemm_module.DERIVED,
                           gemm_module.derived_constants(*shape.values())))
        for name, value in {**shape, **derived}.items():
            monkeypatch.setattr(gemm_module, name, value)
        monkeypatch.setattr(shapes, "GEMM_TILE", (shape["BM"], shape["BN"]))  # split-K's
    return gemm_module


def run_cuda(m, n, k, trans_a, trans_b, alpha, beta, c_fill=None, stream=None):
    from numba import cuda
    a, b, c = operands(m, n, k, trans_a, trans_b, seed=m * 10007 + n * 101 + k)
    if c_fill is not None:
        c[...] = c_fill
    expected = c.copy()
    gemm(a, b, expected, trans_a, trans_b, alpha, beta)
    d_a, d_b, d_c = cuda.to_device(a), cuda.to_device(b), cuda.to_device(c)
    assert gemm(d_a, d_b, d_c, trans_a, trans_b, alpha, beta, stream=stream) is d_c
    if stream is not None:
        stream.synchronize()
    np.testing.assert_allclose(d_c.copy_to_host(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
def test_cuda_transposes_straddling_tiles(tile, trans_a, trans_b):
    # One partial tile on every axis: M = BM + 1, N = 2 BN + 1, K = 2 BK + 1.
    run_cuda(tile.BM + 1, 2 * tile.BN + 1, 2 * tile.BK + 1, trans_a, trans_b, alpha=0.5, beta=2.0)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", ["1x1x1", "tile", "narrow", "k=0"])
def test_cuda_edge_shapes_beta_zero_ignores_c(tile, shape):
    m, n, k = {"1x1x1": (1, 1, 1), "tile": (tile.BM, tile.BN, tile.BK),
               "narrow": (3, tile.BN + 1, tile.BK - 1), "k=0": (2, 3, 0)}[shape]
    run_cuda(m, n, k, False, False, alpha=1.5, beta=0.0, c_fill=np.nan)


@pytest.mark.cuda
@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
def test_cuda_real_tile(trans_a, trans_b):
    # The shipped 64x64x8 tile, on two blocks (the simulator runs 256 threads per block slowly):
    # a partial tile along M for some transposes, along N for the others, and along K for all.
    from numba import cuda
    bm, bn, bk = gemm_module.BM, gemm_module.BN, gemm_module.BK
    m, n, k = (bm + 1, 2, bk + 1) if trans_a == trans_b else (2, bn + 1, 2 * bk + 1)
    run_cuda(m, n, k, trans_a, trans_b, alpha=-1.0, beta=1.0, stream=cuda.stream())


@pytest.mark.cuda
def test_cuda_rejects_what_it_cannot_run():
    from numba import cuda
    a, b, c = operands(4, 4, 4, False, False)
    with pytest.raises(ValueError, match="C-contiguous"):
        gemm(cuda.to_device(a)[:, :2], cuda.to_device(b)[:2], cuda.to_device(c))
    with pytest.raises(TypeError, match="float32 only"):
        gemm(*(cuda.to_device(x.astype(np.float64)) for x in (a, b, c)))
    with pytest.raises(TypeError, match="must all be numpy"):
        gemm(a, cuda.to_device(b), c)


# --- batched --------------------------------------------------------------------------------------

def batched_operands(batches, m, n, k, trans_a, trans_b, seed=0):
    rng = np.random.default_rng(seed)
    ba, bb, bc = batches
    a = rng.standard_normal((ba,) + ((k, m) if trans_a else (m, k))).astype(np.float32)
    b = rng.standard_normal((bb,) + ((n, k) if trans_b else (k, n))).astype(np.float32)
    c = rng.standard_normal((bc, m, n)).astype(np.float32)
    return a, b, c


def naive_batched(a, b, c, trans_a, trans_b, alpha, beta, k_parts=1, span=None):
    """Sample by sample with the 2-D ``gemm``: a product per sample, or their sum; with
    ``k_parts``, the product of each ``span`` of K apart (``c[g * k_parts + j]``: group g's
    samples over the j-th span), in float64 numpy."""
    samples = max(a.shape[0], b.shape[0])
    products = []
    for s in range(samples):
        a_s = a[min(s, a.shape[0] - 1)].astype(np.float64)
        b_s = b[min(s, b.shape[0] - 1)].astype(np.float64)
        if k_parts == 1:
            out = np.zeros(c.shape[1:], np.float64)
            gemm(a_s, b_s, out, trans_a, trans_b)
            products.append([out])
            continue
        op_a, op_b = (a_s.T if trans_a else a_s), (b_s.T if trans_b else b_s)
        products.append([op_a[:, j * span:(j + 1) * span] @ op_b[j * span:(j + 1) * span]
                         for j in range(k_parts)])
    groups = c.shape[0] // k_parts
    per = samples // groups        # c[g * k_parts + j] sums samples g * per .. g * per + per - 1
    total = np.stack([sum(products[s][j] for s in range(g * per, (g + 1) * per))
                      for g in range(groups) for j in range(k_parts)])
    return alpha * total + beta * c


# (a's batch, b's batch, c's batch): a product per sample (one operand broadcast or none), the
# sum over the samples (a weight gradient), or partial sums over shares of them (split-K)
BATCHES = [(1, 3, 3), (3, 1, 3), (3, 3, 3), (3, 3, 1), (1, 1, 1), (4, 4, 2), (1, 6, 3)]


@pytest.mark.parametrize("batches", BATCHES)
@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
def test_batched_cpu_matches_sample_by_sample(batches, trans_a, trans_b):
    a, b, c = batched_operands(batches, 5, 7, 6, trans_a, trans_b)
    expected = naive_batched(a, b, c, trans_a, trans_b, 0.5, 2.0)
    from minilms.kernels.gemm import gemm_batched
    assert gemm_batched(a, b, c, trans_a, trans_b, 0.5, 2.0) is c
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5)


# (a's batch, b's batch, sample groups, k_parts): each sample's K split too (split-K where the
# samples are too few); 4 parts of K = 2 * BK + 1 leave the last span past K, summing nothing
K_PARTS = [(3, 3, 1, 2), (4, 4, 2, 3), (1, 6, 3, 2), (3, 1, 3, 4)]


@pytest.mark.parametrize("a_batch, b_batch, groups, k_parts", K_PARTS)
@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
def test_batched_k_parts_cpu_match_the_spans_summed_apart(a_batch, b_batch, groups, k_parts,
                                                          trans_a, trans_b):
    from minilms.kernels.gemm import BK, gemm_batched, k_span
    k = 2 * BK + 1
    a, b, c = batched_operands((a_batch, b_batch, groups * k_parts), 5, 7, k, trans_a, trans_b)
    span = k_span(k, k_parts)
    assert span % BK == 0 and span * k_parts >= k > span * (k_parts - 2)   # they cover K
    expected = naive_batched(a, b, c, trans_a, trans_b, 0.5, 2.0, k_parts, span)
    gemm_batched(a, b, c, trans_a, trans_b, 0.5, 2.0, k_parts=k_parts)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5)
    # the parts add up to the whole product
    whole = naive_batched(a, b, np.zeros((groups, 5, 7), np.float32), trans_a, trans_b, 1.0, 0.0)
    parts = naive_batched(a, b, np.zeros_like(c), trans_a, trans_b, 1.0, 0.0, k_parts, span)
    np.testing.assert_allclose(parts.reshape(groups, k_parts, 5, 7).sum(1), whole, atol=1e-9)


def test_batched_rejects_mismatched_batches():
    from minilms.kernels.gemm import gemm_batched
    a, b, c = batched_operands((2, 3, 3), 2, 2, 2, False, False)
    with pytest.raises(ValueError, match="batches do not match"):
        gemm_batched(a, b, c)
    a, b, c = batched_operands((4, 4, 6), 2, 2, 2, False, False)
    with pytest.raises(ValueError, match="k_parts 4"):     # 6 is not 4 times a divisor of 4
        gemm_batched(a, b, c, k_parts=4)
    with pytest.raises(ValueError, match="3-D"):
        gemm_batched(a[0], b[0], c[0])


@pytest.mark.cuda
@pytest.mark.parametrize("batches", BATCHES)
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True)])
def test_batched_cuda_matches_sample_by_sample(tile, batches, trans_a, trans_b):
    """The batch in the grid (c with a batch) or summed inside each block (c of one), with
    tiles straddled; beta 0 never reads c."""
    from numba import cuda

    from minilms.kernels.gemm import gemm_batched
    m, n, k = tile.BM + 1, tile.BN + 1, 2 * tile.BK + 1
    for beta, fill in ((2.0, None), (0.0, np.nan)):
        a, b, c = batched_operands(batches, m, n, k, trans_a, trans_b, seed=7)
        if fill is not None:
            c[...] = fill
        expected = naive_batched(a, b, np.nan_to_num(c), trans_a, trans_b, 0.5, beta)
        d_c = cuda.to_device(c)
        gemm_batched(cuda.to_device(a), cuda.to_device(b), d_c, trans_a, trans_b, 0.5, beta)
        np.testing.assert_allclose(d_c.copy_to_host(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("a_batch, b_batch, groups, k_parts", K_PARTS)
def test_batched_k_parts_cuda_match_the_spans_summed_apart(tile, a_batch, b_batch, groups,
                                                           k_parts):
    """``gemm_nt_k_split`` (a weight gradient's ``grad @ cols^T``, the one product that splits K
    on cuda): block z of the grid sums its group's samples over its span of K only, tiles
    straddled, beta 0 never reads c, a span past K writes alpha * 0 (+ beta * c). The other
    transposes say they do not split K there."""
    from numba import cuda

    from minilms.kernels.gemm import gemm_batched, k_span
    trans_a, trans_b = False, True
    m, n, k = tile.BM + 1, tile.BN + 1, 2 * tile.BK + 1
    span = k_span(k, k_parts)
    for beta, fill in ((2.0, None), (0.0, np.nan)):
        a, b, c = batched_operands((a_batch, b_batch, groups * k_parts), m, n, k, trans_a,
                                   trans_b, seed=11)
        if fill is not None:
            c[...] = fill
        expected = naive_batched(a, b, np.nan_to_num(c), trans_a, trans_b, 0.5, beta, k_parts,
                                 span)
        d_c = cuda.to_device(c)
        gemm_batched(cuda.to_device(a), cuda.to_device(b), d_c, trans_a, trans_b, 0.5, beta,
                     k_parts=k_parts)
        np.testing.assert_allclose(d_c.copy_to_host(), expected, rtol=1e-5, atol=1e-5)
    for other in ((False, False), (True, False), (True, True)):
        a, b, c = batched_operands((a_batch, b_batch, groups * k_parts), m, n, k, *other)
        with pytest.raises(ValueError, match="splits K for trans_b alone"):
            gemm_batched(*map(cuda.to_device, (a, b, c)), *other, k_parts=k_parts)
