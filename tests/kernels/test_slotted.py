"""``kernels.slotted``: a short plane's products over a fixed number of samples side by side.

What it rests on, checked on both BLAS libraries: in a product of one shape whose width is a whole
number of ``ALIGN`` columns, a column's result does not depend on where it sits nor on the other
columns. Then: how many slots a layer takes, the copies in and out, and im2col + GEMM's slotted
forward (``conv_cpu.conv_forward``) against a float64 reference and against itself split into
chunks, bit for bit."""
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.kernels import blas_threads, conv_cpu, mkl, slotted
from minilms.layers.convolution import Convolution

from ..blas_bits import assert_bits_or_rounding

LIBRARIES = [name for name in mkl.CHOICES if name != "mkl" or mkl.available()]


@contextmanager
def using(library):
    before = mkl.chosen()
    mkl.use(library)
    try:
        yield
    finally:
        mkl.use(before)


@pytest.fixture(params=LIBRARIES)
def library(request):
    with using(request.param):
        yield request.param


@pytest.mark.parametrize("library_name", LIBRARIES)
@settings(max_examples=60, deadline=None)
@given(out=st.integers(1, 256), inner=st.integers(1, 640), plane=st.sampled_from(
    [1, 4, 7, 9, 16, 25, 30, 49, 64, 100]), slots=st.integers(2, 9), seed=st.integers(0, 2**16))
def test_a_columns_bits_do_not_depend_on_its_slot(library_name, out, inner, plane, slots, seed):
    """A sample's columns in each slot of the product, the other slots zero or another sample's:
    its outputs are the same bits in every slot. Dealt out to three threads whatever the size
    (cut by columns, a piece's width would not be whole ``ALIGN``s, nor a column's place fixed)."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((out, inner)).astype(np.float32)
    sample = rng.standard_normal((inner, plane)).astype(np.float32)
    width = slotted.width(slots, plane)
    assert width % slotted.ALIGN == 0 and width >= slots * plane
    seen = []
    for slot in range(slots):
        columns = rng.standard_normal((inner, width)).astype(np.float32)
        if slot % 2:    # the empty slots zero, as clear_unused leaves them
            slotted.clear_unused(columns, 0, plane)
        columns[:, slot * plane:(slot + 1) * plane] = sample
        product = np.empty((out, width), np.float32)
        with using(library_name), mock.patch.object(blas_threads, "MIN_FLOPS", 0), \
                mock.patch.object(blas_threads.numba, "get_num_threads", lambda: 3):
            slotted.product(weight, columns, product)
        seen.append(product[:, slot * plane:(slot + 1) * plane].copy())
    for slot, got in enumerate(seen):
        assert_bits_or_rounding(got, seen[0], f"slot {slot} of {slots}", library_name, None)
    np.testing.assert_allclose(seen[0], weight.astype(np.float64) @ sample, rtol=1e-4,
                               atol=1e-4 * np.sqrt(inner))


@settings(max_examples=200, deadline=None)
@given(plane=st.integers(1, 400), batch=st.integers(1, 300), chunk=st.integers(1, 300),
       weight=st.integers(1, 2**20))
def test_slot_count(plane, batch, chunk, weight):
    chunk = min(chunk, batch)
    slots = slotted.count(plane, batch, chunk, weight)
    if not slotted.MIN_PLANE <= plane < slotted.SHORT_PLANE or chunk < 2 or \
            weight < slotted.MIN_WEIGHT:
        assert slots == 1
        return
    want = min(chunk, -(-slotted.SLOT_COLUMNS // plane))
    assert 1 <= slots <= want
    assert -(-batch // slots) == -(-batch // want)  # as few products as the most slots, evened
    assert slotted.width(slots, plane) - slots * plane < slotted.ALIGN


def test_slot_count_of_the_nets_planes():
    res5 = 2048 * 512                                   # ResNet-50's res5 1x1 weights
    assert slotted.count(7 * 7, 8, 8, res5) == 8        # batch 8: one product
    assert slotted.count(7 * 7, 10, 10, res5) == 5      # two products of 5, not 8 and 2
    assert slotted.count(7 * 7, 256, 64, res5) == 8
    assert slotted.count(7 * 7, 8, 3, res5) == 3        # no more than the workspace's chunk
    assert slotted.count(14 * 14, 8, 8, res5) == 1      # 14x14: per sample
    assert slotted.count(7 * 7, 1, 1, res5) == 1
    assert slotted.count(2 * 2, 8, 8, res5) == 1        # rounding would be most of the width
    assert slotted.count(7 * 7, 8, 8, 24 * 16) == 1     # a small weight stays in cache


def test_side_by_side_and_back():
    src = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    dst = np.full((3, 11), np.nan, np.float32)      # wider than the two samples' columns
    slotted.side_by_side(src, dst)
    np.testing.assert_array_equal(dst[:, :8], np.concatenate([src[0], src[1]], axis=1))
    assert np.isnan(dst[:, 8:]).all()
    slotted.clear_unused(dst, 2, 4)
    assert not dst[:, 8:].any()
    back = np.empty_like(src)
    slotted.from_side_by_side(dst, back)
    np.testing.assert_array_equal(back, src)


def reference_forward(x, weight, bias, stride, pad):
    """Float64 by definition, a loop over the taps."""
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    y = np.zeros((n, o, oh, ow)) + bias.reshape(1, -1, 1, 1)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            y += np.einsum("oc,nchw->nohw", weight[:, :, i, j].astype(np.float64), patch)
    return y


@pytest.mark.parametrize("n, c, o, h, k, stride", [
    (8, 512, 512, 7, 3, 1),      # ResNet-50's res5b_2
    (8, 512, 512, 14, 3, 2),     # res5a_2, into 7x7
    (5, 6, 7, 7, 3, 1),          # small: one BLAS call; 5 samples of 8 slots
    (10, 4, 3, 8, 5, 1),         # two products of 5 samples
])
def test_im2col_forward_in_slots(library, n, c, o, h, k, stride):
    """The slotted forward equals the definition, and a split step's parts (each with the
    layer's chunk and slots, fewer samples) give its bits."""
    rng = np.random.default_rng(n * c + o)
    pad = k // 2
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    weight = rng.standard_normal((o, c, k, k)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    geometry = ((k, k), (stride, stride), (pad, pad), (1, 1))
    out_h = (h + 2 * pad - k) // stride + 1
    slots = slotted.count(out_h * out_h, n, n, max(o * c * k * k, slotted.MIN_WEIGHT))
    assert slots > 1
    work = np.full((c * k * k + o) * slotted.width(slots, out_h * out_h), np.nan, np.float32)
    y = np.full((n, o, out_h, out_h), np.nan, np.float32)
    conv_cpu.conv_forward(x, weight, bias, y, work, n, geometry, slots)
    np.testing.assert_allclose(y, reference_forward(x, weight, bias, stride, pad), rtol=1e-4,
                               atol=1e-4 * np.sqrt(c * k * k))
    for part in (1, 2, 3):
        split = np.full_like(y, np.nan)
        work[:] = np.nan
        for n0 in range(0, n, part):
            n1 = min(n, n0 + part)
            conv_cpu.conv_forward(x[n0:n1], weight, bias, split[n0:n1], work, n, geometry, slots)
        assert_bits_or_rounding(split, y, f"parts of {part}", library, None)


def test_the_layer_takes_slots_on_short_planes_and_sizes_its_workspace():
    conv = Convolution("c", ["x"], ["y"], num_output=512, kernel_size=3, pad=1)
    conv.setup([(8, 512, 7, 7)])
    assert conv.slots == 8 and conv.fast.slots == 1    # im2col + GEMM's forward, in slots
    assert conv.elements >= (conv.k + 512) * slotted.width(8, 49)
    pointwise = Convolution("p", ["x"], ["y"], num_output=2048, kernel_size=1)
    pointwise.setup([(8, 512, 7, 7)])
    assert pointwise.fast.pointwise and pointwise.fast.slots == 8
    wide = Convolution("w", ["x"], ["y"], num_output=64, kernel_size=1)
    wide.setup([(8, 64, 56, 56)])
    assert wide.fast.slots == 1 and wide.slots == 1
    grouped = Convolution("g", ["x"], ["y"], num_output=8, kernel_size=3, pad=1, groups=2)
    grouped.setup([(8, 8, 7, 7)])
    assert grouped.slots == 1
