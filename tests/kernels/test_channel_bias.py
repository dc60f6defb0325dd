"""A bias per channel over a chunk of samples, and its gradient, against numpy and on CUDA."""
import numpy as np
import pytest

from minilms.kernels.channel_bias import add_channel_bias, channel_sums


def data(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 4, 5, 6), (1, 1, 1, 1), (2, 300, 1, 1)])
def test_cpu_matches_numpy(shape, dtype):
    y, bias, dy = data(shape, dtype), data(shape[1], dtype, 1), data(shape, dtype, 2)
    expected = y + bias[None, :, None, None]
    assert add_channel_bias(y, bias) is y
    np.testing.assert_array_equal(y, expected)
    out = np.full(shape[1], np.nan, dtype)
    channel_sums(dy, out)                          # beta 0: out is not read
    np.testing.assert_allclose(out, dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5,
                               atol=1e-5)
    channel_sums(dy, out, beta=1.0)                # and adds
    np.testing.assert_allclose(out, 2 * dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5,
                               atol=1e-5)


def test_rejects_a_bias_of_another_size():
    with pytest.raises(ValueError, match="for 4 channels"):
        add_channel_bias(data((2, 4, 3, 3)), data(3))
    with pytest.raises(ValueError, match="for 4 channels"):
        channel_sums(data((2, 4, 3, 3)), data(5))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_matches_cpu(dtype):
    """One launch each for the chunk; the sum over more values than a block has threads."""
    from numba import cuda
    shape = (3, 5, 9, 11)
    y, bias, dy = data(shape, dtype), data(shape[1], dtype, 1), data(shape, dtype, 2)
    d_y = cuda.to_device(y)
    add_channel_bias(d_y, cuda.to_device(bias))
    np.testing.assert_array_equal(d_y.copy_to_host(), add_channel_bias(y, bias))
    expected = channel_sums(dy, np.zeros(shape[1], dtype))
    d_out = cuda.to_device(np.full(shape[1], np.nan, dtype))
    channel_sums(cuda.to_device(dy), d_out)
    np.testing.assert_allclose(d_out.copy_to_host(), expected, rtol=1e-5, atol=1e-5)
    channel_sums(cuda.to_device(dy), d_out, beta=1.0)
    np.testing.assert_allclose(d_out.copy_to_host(), 2 * expected, rtol=1e-5, atol=1e-5)


def test_grid_planes_covers_every_plane_and_element():
    from minilms.kernels.common import grid_planes
    assert grid_planes(6, 40) == ((1, 6), 64)              # whole warps for a short plane
    assert grid_planes(2, 10_000) == ((40, 2), 256)
    assert grid_planes(100_000, 49) == ((1, 65535), 64)    # planes past 65535 by the y stride


@pytest.mark.cuda
def test_cuda_add_strides_over_planes_and_elements_a_small_grid_leaves():
    """The kernel launched on fewer blocks than planes and elements (as past 65535 planes): its
    grid-stride loops cover every element once."""
    from numba import cuda

    from minilms.kernels.channel_bias import add_channel_bias_cuda
    y, bias = data((2, 3, 40)), data(3, seed=1)
    dev = cuda.to_device(y)
    add_channel_bias_cuda[(1, 2), 32](dev, cuda.to_device(bias))
    np.testing.assert_array_equal(dev.copy_to_host(), y + bias[None, :, None])
