"""The weight gradient by outer products (``weight_grad_outer``: output channels in the lanes,
inputs broadcast; the direct weight gradient on hosts without mask registers) against the
float64 reference of ``test_conv_weight_grad``, over random geometries: every channel tail (6,
4, 2, 1 a call), outputs that leave lanes empty, bands of rows that split a plane, taps that
fall wholly in the padding. It reads nothing outside ``x`` (NaN around it), and its result is
the same bit for bit whatever the threads."""
from contextlib import contextmanager

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.kernels.direct import weight_grad, weight_grad_outer

from .conv_geometry import amid_nans, geometries
from .test_conv_weight_grad import reference


@contextmanager
def threads(count):
    before = numba.get_num_threads()
    numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(before)


def outer(x, dy, geometry, vl=8, thread_count=2):
    dweight = np.full((dy.shape[1], x.shape[1]) + geometry[0], np.nan, np.float32)
    with threads(thread_count):
        weight_grad_outer.conv_weight_grad_outer(amid_nans(x), dy, dweight, geometry, vl)
    return dweight


def check(dweight, x, dy, geometry):
    want, _ = reference(x, dy, *geometry)
    # each weight a float32 sum of `terms` products in one chain (lanes are output channels):
    # its rounding grows with the chain's length, not with its square root
    terms = dy.shape[0] * dy.shape[2] * dy.shape[3]
    np.testing.assert_allclose(dweight, want, rtol=1e-5, atol=1e-6 * np.sqrt(terms) +
                               1e-7 * terms)


def data(n, c, o, out_h, out_w, height, width, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, c, height, width)).astype(np.float32),
            rng.standard_normal((n, o, out_h, out_w)).astype(np.float32))


@settings(max_examples=60, deadline=None)
@given(geometries((1, 3), (1, 15), (1, 40), (1, 5), (1, 5), (1, 3), (1, 12), (1, 24)),
       st.integers(0, 2**31 - 1), st.sampled_from([1, 2]))
def test_matches_reference(geometry, seed, thread_count):
    if not geometry.has_output:
        return
    x, dy = data(geometry.n, geometry.c, geometry.o, geometry.out_h, geometry.out_w,
                 geometry.height, geometry.width, seed)
    check(outer(x, dy, geometry.args, thread_count=thread_count), x, dy, geometry.args)


@pytest.mark.parametrize("vl", [8, 16])
def test_a_plane_in_several_bands_with_every_channel_tail(vl, monkeypatch):
    """13 channels (6 + 6 + 1, or 4 + 2 + 1 in groups), 21 outputs (a block part empty), a
    plane of 30 rows cut into bands of 4: both vector widths."""
    monkeypatch.setattr(weight_grad_outer, "BAND_POSITIONS", 4 * 30)
    geometry = ((3, 5), (1, 1), (1, 2), (1, 1))
    x, dy = data(2, 13, 21, 30, 30, 30, 30, seed=vl)
    for thread_count in (1, 2):
        check(outer(x, dy, geometry, vl, thread_count), x, dy, geometry)


def test_the_result_does_not_depend_on_the_threads():
    geometry = ((5, 5), (1, 1), (2, 2), (1, 1))
    x, dy = data(3, 20, 50, 12, 12, 12, 12, seed=5)
    results = [outer(x, dy, geometry, thread_count=t) for t in (1, 2)]
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


@pytest.mark.parametrize("thread_count", [1, 2, 16])
@pytest.mark.parametrize("shape", [(32, 16, 16, 16), (8, 32, 28, 96), (2, 13, 5, 21),
                                   (1, 64, 8, 256), (64, 20, 12, 50), (3, 7, 4, 8)])
def test_tasks_cover_every_channel_and_sample_in_whole_calls(shape, thread_count):
    """Channel groups of whole calls, none empty, enough for the threads where the channels
    allow; samples split only by the shape (``SAMPLE_TASKS``), never by the threads."""
    samples, channels, _, out = shape
    groups, sample_groups = weight_grad_outer.task_split(shape, out, 8, thread_count)
    blocks, cb = -(-out // 16), weight_grad_outer.CB
    per_group = -(-(-(-channels // groups)) // cb) * cb      # as the kernel deals them out
    assert (groups - 1) * per_group < channels <= groups * per_group   # no group left empty
    assert groups >= weight_grad_outer.task_split(shape, out, 8, 1)[0]     # more threads
    assert groups == 1 or blocks < 2 * thread_count               # split only to feed them
    assert sample_groups == weight_grad_outer.task_split(shape, out, 8, 1)[1]
    assert 1 <= sample_groups <= samples
    assert blocks * -(-channels // cb) * sample_groups >= min(weight_grad_outer.SAMPLE_TASKS,
                                                             blocks * -(-channels // cb) *
                                                             samples)


def test_sample_groups_sum_like_one(monkeypatch):
    """A small layer's samples split into groups (whose sums are added after) gives what one
    group gives, up to the regrouped sums' rounding."""
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    x, dy = data(8, 6, 16, 10, 10, 10, 10, seed=3)
    split = outer(x, dy, geometry)
    assert weight_grad_outer.task_split(x.shape, 16, 8, 2)[1] > 1
    monkeypatch.setattr(weight_grad_outer, "SAMPLE_TASKS", 1)
    assert weight_grad_outer.task_split(x.shape, 16, 8, 2)[1] == 1
    whole = outer(x, dy, geometry)
    np.testing.assert_allclose(split, whole, rtol=1e-5, atol=1e-4)
    check(split, x, dy, geometry)


def test_it_pays_from_a_whole_call_of_channels_and_a_kernel_wider_than_one():
    assert weight_grad_outer.outer_pays((16, 6, 3, 3))
    assert weight_grad_outer.outer_pays((50, 20, 5, 5))            # LeNet conv2
    assert not weight_grad_outer.outer_pays((20, 1, 5, 5))         # LeNet conv1
    assert not weight_grad_outer.outer_pays((64, 64, 1, 1))


@pytest.mark.parametrize("mask_registers", [True, False])
def test_the_direct_weight_gradient_takes_it_where_no_mask_registers(mask_registers,
                                                                      monkeypatch):
    """``conv_weight_grad_direct`` goes to outer products on AVX2 hosts only (AVX-512 keeps the
    kernel measured there), and is right either way."""
    taken = []
    real = weight_grad.conv_weight_grad_outer
    monkeypatch.setattr(weight_grad, "MASK_REGISTERS", mask_registers)
    monkeypatch.setattr(weight_grad, "conv_weight_grad_outer",
                        lambda *args: taken.append(1) or real(*args))
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    x, dy = data(2, 8, 16, 9, 9, 9, 9, seed=1)
    dweight = np.full((16, 8, 3, 3), np.nan, np.float32)
    dbias = np.full(16, np.nan, np.float32)
    work = np.full(16 + 2 * 8 * 16 * 16, np.nan, np.float32)
    weight_grad.conv_weight_grad_direct(x, dy, dweight, dbias, work, 2, geometry)
    assert bool(taken) is not mask_registers
    check(dweight, x, dy, geometry)
    np.testing.assert_allclose(dbias, dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5)
