"""im2col + GEMM in bands (``kernels.direct.bands``) against float64 references that share no
code with it (one einsum per tap): forward, input, weight and bias gradients on random geometries
(strides, padding, dilation; bands of one row to the whole plane), workers and slots; garbage in
the workspace must not leak; every result, the weight gradient included, the same bits whatever
the thread count, and a sample's whatever the batch around it; where the engine takes it, and the
layer's ``auto`` engine against ``reference`` at a ResNet stem."""
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.kernels import conv_cpu
from minilms.kernels.direct import DirectConvolution, bands
from minilms.kernels.direct.rules import bands as bands_rules
from minilms.layers.convolution import Convolution

from ..layers.test_convolution_engines import run as run_layer
from .conv_geometry import geometries
from .test_conv_direct import reference_input_grad
from .test_conv_weight_grad import reference as reference_weight_grad
from .test_conv_windows import assert_matches_the_definition, assert_slots_fixed
from .test_conv_windows import run as run_path

MiB = 2**20
STEM = ((7, 7), (2, 2), (3, 3), (1, 1))


def run(x, weight, bias, dy, geometry, slots):
    return run_path(x, weight, bias, dy, geometry, slots, bands)


@settings(max_examples=40, deadline=None)
@given(geometries((1, 5), (1, 4), (1, 6), (1, 7), (1, 7), (1, 3), (1, 30), (1, 30)),
       st.integers(1, 3), st.booleans(), st.sampled_from([1, 7, 40, 10_000]),
       st.integers(0, 2**31 - 1))
def test_matches_the_definition(g, slots, with_bias, columns, seed):
    if not g.has_output or not bands.applies((g.o, g.c) + g.kernel, g.args):
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bands_rules, "BAND_COLUMNS", columns)    # bands of a row up to the plane
        assert_matches_the_definition(bands, g, slots, with_bias, seed)


def test_gradients_it_is_not_asked_for_stay_untouched():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 3, 30, 30)).astype(np.float32)
    weight = rng.standard_normal((5, 3, 7, 7)).astype(np.float32)
    dy = rng.standard_normal((3, 5, 15, 15)).astype(np.float32)
    work = np.empty(bands.workspace_elements(x.shape, weight.shape, STEM, 2), np.float32)
    dx, dw = np.full_like(x, 7.0), np.full_like(weight, 7.0)
    bands.backward(x, dy, weight, None, dw, None, work, 2, STEM)
    assert np.all(dx == 7.0)
    bands.backward(x, dy, weight, dx, None, None, work, 2, STEM)
    np.testing.assert_allclose(dw, reference_weight_grad(x, dy, *STEM)[0], rtol=1e-5,
                               atol=1e-3)
    np.testing.assert_allclose(dx, reference_input_grad(dy, weight, x.shape, *STEM[1:]),
                               rtol=1e-5, atol=1e-4)


def test_its_bits_do_not_depend_on_the_threads_or_the_batch(monkeypatch):
    """Every result, the weight gradient too (the samples' parts added in sample order), with
    one thread or several; a step split along the batch gives the whole step's forward and input
    gradient bit for bit, and its weight gradient as the sum of the chunks'."""
    monkeypatch.setattr(bands_rules, "BAND_COLUMNS", 100)     # several bands a sample
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 3, 56, 56)).astype(np.float32)
    weight = rng.standard_normal((16, 3, 7, 7)).astype(np.float32)
    dy = rng.standard_normal((6, 16, 28, 28)).astype(np.float32)
    slots = bands.slot_count(x.shape, weight.shape, STEM, 2**30)
    whole = run(x, weight, None, dy, STEM, slots)
    threads = numba.get_num_threads()
    try:
        for k, count in ((6, 1), (1, threads), (2, 1), (4, threads)):
            numba.set_num_threads(count)
            parts = [run(x[n0:n0 + k], weight, None, dy[n0:n0 + k], STEM, slots)
                     for n0 in range(0, 6, k)]
            for i, what in ((0, "forward"), (1, "input gradient")):
                np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), whole[i],
                                              err_msg=f"{what}, chunks of {k}, {count} threads")
            if k == 6:
                np.testing.assert_array_equal(parts[0][2], whole[2], err_msg="weight gradient")
            np.testing.assert_allclose(sum(p[2] for p in parts), whole[2], rtol=1e-5,
                                       atol=1e-3)
    finally:
        numba.set_num_threads(threads)


def test_the_workspace_does_not_depend_on_the_threads():
    """The plan knows the workspace before the run: slots are fixed, not the thread count."""
    assert_slots_fixed(bands, (16, 3, 224, 224), (64, 3, 7, 7), STEM)


def test_a_band_is_about_band_columns_wide():
    assert bands.band_rows(112, 112) == -(-bands_rules.BAND_COLUMNS // 112)
    assert bands.band_rows(1120, 1120) == 1      # GoogLeNet's stem at 2240x2240: a row
    assert bands.band_rows(8, 3) == 3            # never past the plane


def test_where_the_bands_pay():
    """Measured: a stem (an image's channels, 7x7 stride 2, to 112x112 and more, 32 outputs or
    more); not a 16-output stem, few taps (a 3x3 or 5x5 over 1-3 channels), many channels (the
    windows' and Winograd's), a small plane (LeNet, the small ResNets), or a 1x1 kernel."""
    assert bands.pays((64, 3, 7, 7), STEM, 112 * 112)
    assert bands.pays((64, 3, 7, 7), STEM, 1120 * 1120)
    assert bands.pays((32, 3, 7, 7), STEM, 112 * 112)
    assert not bands.pays((16, 3, 7, 7), STEM, 112 * 112)
    assert not bands.pays((64, 3, 7, 7), STEM, 16 * 16)
    assert not bands.pays((64, 3, 3, 3), ((3, 3), (1, 1), (1, 1), (1, 1)), 112 * 112)
    assert not bands.pays((32, 1, 5, 5), ((5, 5), (1, 1), (0, 0), (1, 1)), 56 * 56)
    assert not bands.pays((20, 1, 5, 5), ((5, 5), (1, 1), (0, 0), (1, 1)), 24 * 24)   # LeNet
    assert not bands.pays((64, 64, 3, 3), ((3, 3), (1, 1), (1, 1), (1, 1)), 56 * 56)
    assert not bands.applies((64, 3, 1, 1), ((1, 1), (1, 1), (0, 0), (1, 1)))


def test_the_engine_takes_a_stem_whole_and_needs_no_columns():
    engine = DirectConvolution((8, 3, 224, 224), (64, 3, 7, 7), 1, STEM, chunk=6,
                               max_workspace=64 * MiB)
    assert engine.band_slots == 8 and engine.covers_all
    assert engine.elements == bands.workspace_elements((8, 3, 224, 224), (64, 3, 7, 7), STEM, 8)
    # a workspace too small for one slot: the other paths
    tight = DirectConvolution((8, 3, 224, 224), (64, 3, 7, 7), 1, STEM, chunk=6,
                              max_workspace=4 * bands.workspace_elements(
                                  (8, 3, 224, 224), (64, 3, 7, 7), STEM, 1) - 4)
    assert tight.band_slots == 0


@pytest.mark.parametrize("bias", [False, True])
def test_the_layer_runs_it_and_agrees_with_the_reference_engine(monkeypatch, bias):
    """``engine: auto`` on a stem (3 channels, 7x7 stride 2, 112x112 to 56x56) runs the bands
    (im2col + GEMM broken here), in a far smaller workspace, and agrees with ``engine:
    reference`` to float32 rounding."""
    rng = np.random.default_rng(5)
    shape, out = (3, 3, 112, 112), 32
    x = rng.standard_normal(shape).astype(np.float32)
    params = {"weight": rng.standard_normal((out, 3, 7, 7)).astype(np.float32)}
    if bias:
        params["bias"] = rng.standard_normal(out).astype(np.float32)
    dy = rng.standard_normal((3, out, 56, 56)).astype(np.float32)
    results, sizes = {}, {}
    for engine in ("reference", "auto"):
        conv = Convolution("conv", ["x"], ["y"], num_output=out, kernel_size=7, pad=3,
                           stride=2, bias=bias, engine=engine)
        conv.setup([shape], device_kind="cpu")
        sizes[engine] = conv.elements
        with monkeypatch.context() as patch:
            if engine == "auto":
                assert conv.fast.band_slots and conv.engine_only
                patch.setattr(conv_cpu, "conv_forward", None)
                patch.setattr(conv_cpu, "conv_backward", None)
            results[engine] = run_layer(conv, x, dy, params)
    assert sizes["auto"] < sizes["reference"] / 2
    got, want = results["auto"], results["reference"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)
    for key in params:
        np.testing.assert_allclose(got[2][key], want[2][key], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("stride, pad", [((1, 1), (0, 0)), ((2, 2), (3, 3)), ((3, 2), (1, 2)),
                                         ((2, 4), (0, 3))])
def test_a_bands_input_rows_are_the_padded_inputs(stride, pad):
    """``_band_copy`` against the padded input by definition: every row of the band, phase and
    column, those in the padding (left, right, above and below the input) zero; bands from the
    top, inside and past the bottom, columns short of the row, the whole row and past it."""
    (sh, sw), (ph, pw) = stride, pad
    rng = np.random.default_rng(sw * 10 + pw)
    for height, width in [(5, 1), (8, 9), (13, 16)]:
        x = rng.standard_normal((2, height, width)).astype(np.float32)
        padded = np.zeros((2, height + 2 * ph + 8, width + 2 * pw + 8 * sw), np.float32)
        padded[:, ph:ph + height, pw:pw + width] = x
        for rows, cols, top in [(1, 1, 0), (3, 5, 2), (2, (width + 2 * pw) // sw + 1, height),
                                (3, (width + 2 * pw) // sw + 3, 1)]:
            xp = np.full((2, rows, sw + 1, cols), np.nan, np.float32)
            bands._band_copy(x, xp, top, sh, sw, ph, pw)
            r, f, q = np.meshgrid(np.arange(rows), np.arange(sw + 1), np.arange(cols),
                                  indexing="ij")
            np.testing.assert_array_equal(xp, padded[:, top + r, q * sw + f])
