"""Split-K (``minilms.kernels.split_k``): how many partial sums a summed product gets (over its
samples first, then over each sample's K), and their ordered sum on both devices against a
loop. The GEMM's side, blocks that sum a span of K, is tested in test_gemm.py."""
import math

import numpy as np
import pytest


def test_split_k_fills_a_gpu_only_where_the_tiles_do_not():
    from minilms.kernels import gemm
    from minilms.kernels import split_k as g
    groups, parts = g.split_k(64, 576, 32, 3136)           # 5 tiles of 128x128: split
    assert groups > 1 and parts == 1                       # the samples are enough
    assert groups * parts * 5 <= 2 * g.SPLIT_K_BLOCKS
    assert g.split_k(512, 4608, 32, 196) == (1, 1)         # 144 tiles: enough already
    assert g.split_k(64, 576, 1, 196) == (1, 1)            # one shallow sample: nothing to split
    for samples in (7, 9, 12, 32):                         # always a divisor of the samples
        groups, parts = g.split_k(64, 576, samples, 196)
        assert samples % groups == 0 and groups <= samples and parts == 1
    assert math.prod(g.split_k(64, 576, 32, 3136, most=3)) <= 3
    # a 7x7 convolution of 3 channels (64x147: 2 tiles) over a chunk of 9 images of 112x112
    # outputs: the 9 samples alone give 18 blocks, so each one's K is split as well, into spans
    # no shallower than MIN_K_SPAN
    groups, parts = g.split_k(64, 147, 9, 112 * 112)
    assert groups == 9 and parts > 1 and 2 * groups * parts <= 2 * g.SPLIT_K_BLOCKS
    assert gemm.k_span(112 * 112, parts) >= g.MIN_K_SPAN
    assert g.split_k(64, 147, 9, 112 * 112, most=20) == (9, 2)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_sum_splits_cpu_sums_in_order(beta):
    from minilms.kernels.split_k import sum_splits
    rng = np.random.default_rng(3)
    parts = rng.standard_normal((5, 3, 4)).astype(np.float32)
    out = rng.standard_normal((3, 4)).astype(np.float32)
    expected = parts[0].copy()
    for z in range(1, 5):
        expected += parts[z]
    if beta:
        expected += out
    else:
        out[...] = np.nan                                   # beta 0: out is not read
    sum_splits(parts, out, beta)
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(ValueError, match="are not 5 of out"):
        sum_splits(parts, out[:2], beta)


@pytest.mark.cuda
@pytest.mark.parametrize("size", [1, 256, 257])
def test_sum_splits_cuda_matches_cpu(size):
    from numba import cuda

    from minilms.kernels.split_k import sum_splits
    rng = np.random.default_rng(size)
    parts = rng.standard_normal((3, size)).astype(np.float32)
    for beta in (0.0, 1.0):
        out = rng.standard_normal(size).astype(np.float32)
        d_out = cuda.to_device(np.full(size, np.nan, np.float32) if not beta else out)
        sum_splits(cuda.to_device(parts), d_out, beta)
        sum_splits(parts, out, beta)
        np.testing.assert_allclose(d_out.copy_to_host(), out, rtol=1e-6, atol=1e-6)
