"""The row-window convolution (``kernels.direct.windows``) against float64 references that share
no code with it (one einsum per tap): forward, input, weight and bias gradients on random
geometries (vertical strides 1-3: the copy's rows in phases), workers and slots; garbage in the
workspace must not leak; a sample's outputs and input gradient whatever the batch around it and
the thread count; where the engine takes it, and the layer's ``auto`` engine against
``reference`` at a ResNet shape."""
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.kernels import conv_cpu
from minilms.kernels.direct import DirectConvolution, windows
from minilms.layers.convolution import Convolution

from ..blas_bits import assert_bits_or_rounding
from ..layers.test_convolution_engines import run as run_layer
from .conv_geometry import geometries
from .test_conv_direct import reference, reference_input_grad
from .test_conv_weight_grad import reference as reference_weight_grad

MiB = 2**20


def run(x, weight, bias, dy, geometry, slots, path=windows):
    """Forward and backward through a NaN-filled workspace; NaN-filled outputs, so anything
    left unwritten shows. ``path``: a module with the windows' interface (``bands`` too)."""
    work = np.full(path.workspace_elements(x.shape, weight.shape, geometry, slots), np.nan,
                   np.float32)
    y = np.full(dy.shape, np.nan, np.float32)
    dx, dw = np.full_like(x, np.nan), np.full_like(weight, np.nan)
    db = None if bias is None else np.full(weight.shape[0], np.nan, np.float32)
    path.forward(x, weight, bias, y, work, slots, geometry)
    work[:] = np.nan
    path.backward(x, dy, weight, dx, dw, db, work, slots, geometry)
    return y, dx, dw, db


@settings(max_examples=40, deadline=None)
@given(geometries((1, 6), (1, 8), (1, 9), (1, 5), (1, 5), (1, 3), (1, 12), (1, 14)),
       st.integers(1, 3), st.booleans(), st.integers(0, 2**31 - 1))
def test_matches_the_definition(g, slots, with_bias, seed):
    if g.has_output and windows.applies((g.o, g.c) + g.kernel, g.args):
        assert_matches_the_definition(windows, g, slots, with_bias, seed)


def assert_matches_the_definition(path, g, slots, with_bias, seed):
    """``path``'s (the windows', the bands') forward and gradients on geometry ``g`` against
    the float64 references."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((g.n, g.c, g.height, g.width)).astype(np.float32)
    weight = rng.standard_normal((g.o, g.c) + g.kernel).astype(np.float32)
    bias = rng.standard_normal(g.o).astype(np.float32) if with_bias else None
    dy = rng.standard_normal((g.n, g.o, g.out_h, g.out_w)).astype(np.float32)
    y, dx, dw, db = run(x, weight, bias, dy, g.args, slots, path)
    taps = g.c * g.kernel[0] * g.kernel[1]
    want_y = reference(x, weight, np.zeros(g.o) if bias is None else bias, *g.args[1:])
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5 * np.sqrt(taps))
    want_dx = reference_input_grad(dy, weight, x.shape, *g.args[1:])
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5 * np.sqrt(g.o * taps))
    want_dw, want_db = reference_weight_grad(x, dy, *g.args)
    terms = np.sqrt(g.n * g.out_h * g.out_w)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-5 * terms)
    if with_bias:
        np.testing.assert_allclose(db, want_db, rtol=1e-5, atol=1e-5 * terms)


def test_gradients_it_is_not_asked_for_stay_untouched():
    rng = np.random.default_rng(3)
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    x = rng.standard_normal((3, 4, 6, 6)).astype(np.float32)
    weight = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((3, 5, 6, 6)).astype(np.float32)
    work = np.empty(windows.workspace_elements(x.shape, weight.shape, geometry, 2), np.float32)
    dx, dw = np.full_like(x, 7.0), np.full_like(weight, 7.0)
    windows.backward(x, dy, weight, None, dw, None, work, 2, geometry)
    assert np.all(dx == 7.0)
    windows.backward(x, dy, weight, dx, None, None, work, 2, geometry)
    np.testing.assert_allclose(dw, reference_weight_grad(x, dy, *geometry)[0], rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_allclose(dx, reference_input_grad(dy, weight, x.shape, *geometry[1:]),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("c, o, h", [(64, 64, 28), (256, 256, 14)])    # ResNet-50's 3x3s
def test_a_samples_results_do_not_depend_on_the_batch_or_the_threads(c, o, h):
    """A step split along the batch gives the whole step's outputs and input gradient bit for
    bit (each sample's GEMMs have its own shapes), with one thread or several; the weight
    gradient only to rounding (summed per worker)."""
    rng = np.random.default_rng(c)
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1))
    x = rng.standard_normal((6, c, h, h)).astype(np.float32)
    weight = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((6, o, h, h)).astype(np.float32)
    slots = windows.slot_count(x.shape, weight.shape, geometry, 2**30)
    whole = run(x, weight, None, dy, geometry, slots)
    threads = numba.get_num_threads()
    try:
        for k, count in ((1, threads), (2, 1), (4, threads)):
            numba.set_num_threads(count)
            parts = [run(x[n0:n0 + k], weight, None, dy[n0:n0 + k], geometry, slots)
                     for n0 in range(0, 6, k)]
            for i, what in ((0, "forward"), (1, "input gradient")):
                assert_bits_or_rounding(np.concatenate([p[i] for p in parts]), whole[i],
                                        f"{what}, chunks of {k}, {count} threads")
            np.testing.assert_allclose(sum(p[2] for p in parts), whole[2], rtol=1e-4,
                                       atol=1e-3)
    finally:
        numba.set_num_threads(threads)


def assert_slots_fixed(path, shape, weight, geometry):
    """``path``'s slots (the windows', the bands'): ``MAX_SLOTS`` whatever the threads, at most
    the batch, and as many as the workspace holds."""
    threads = numba.get_num_threads()
    try:
        counts = set()
        for count in (1, threads):
            numba.set_num_threads(count)
            counts.add(path.slot_count(shape, weight, geometry, 2**30))
    finally:
        numba.set_num_threads(threads)
    assert counts == {path.MAX_SLOTS}
    assert path.slot_count((3,) + shape[1:], weight, geometry, 2**30) == 3
    one = path.workspace_elements(shape, weight, geometry, 1)
    assert path.slot_count(shape, weight, geometry, one) == 1
    assert path.slot_count(shape, weight, geometry, one - 1) == 0


def test_the_workspace_does_not_depend_on_the_threads():
    """The plan knows the workspace before the run: slots are fixed, not the thread count."""
    assert_slots_fixed(windows, (16, 64, 14, 14), (64, 64, 3, 3),
                       ((3, 3), (1, 1), (1, 1), (1, 1)))


def test_where_the_windows_pay():
    """Measured: output planes of 14x14 and more with 48 channels or more (ResNet-50's and
    GoogLeNet's 3x3s there, strided ones too), 16 or more for kernels over 9 taps (GoogLeNet's
    5x5s) of two samples or more; not a 7x7 plane, few channels, or a 1x1 kernel."""
    same = ((3, 3), (1, 1), (1, 1), (1, 1))
    assert windows.pays((128, 128, 3, 3), same, 28 * 28, 8)
    assert windows.pays((64, 64, 3, 3), same, 56 * 56, 8)
    assert windows.pays((256, 256, 3, 3), same, 14 * 14, 8)
    assert not windows.pays((512, 512, 3, 3), same, 7 * 7, 8)
    five = ((5, 5), (1, 1), (2, 2), (1, 1))
    assert windows.pays((32, 16, 5, 5), five, 28 * 28, 8)
    assert windows.pays((96, 32, 5, 5), five, 14 * 14, 8)
    assert not windows.pays((32, 16 - 1, 5, 5), five, 28 * 28, 8)
    assert not windows.pays((128, 48, 5, 5), five, 7 * 7, 8)
    assert not windows.pays((32, 16, 3, 3), same, 32 * 32, 8)      # a small ResNet's 3x3
    assert not windows.pays((32, 16, 5, 5), five, 280 * 280, 1)    # one sample, one worker
    assert windows.pays((128, 128, 3, 3), same, 28 * 28, 1)
    assert windows.pays((128, 128, 3, 3), ((3, 3), (2, 2), (1, 1), (1, 1)), 28 * 28, 8)
    assert not windows.pays((512, 512, 3, 3), ((3, 3), (2, 2), (1, 1), (1, 1)), 7 * 7, 8)
    assert not windows.pays((256, 48 - 1, 3, 3), same, 28 * 28, 8)
    assert not windows.applies((64, 64, 1, 1), ((1, 1), (1, 1), (0, 0), (1, 1)))
    assert windows.applies((64, 64, 1, 3), ((1, 3), (1, 2), (0, 1), (1, 1)))


def test_the_engine_takes_it_where_it_pays_and_needs_no_columns():
    """A strided 3x3 (a stride-1 one of these shapes goes to Winograd's, ahead of the
    windows)."""
    geometry = ((3, 3), (2, 2), (1, 1), (1, 1))
    engine = DirectConvolution((8, 64, 56, 56), (64, 64, 3, 3), 1, geometry, chunk=8,
                               max_workspace=64 * MiB)
    assert engine.window_slots == 8 and engine.covers_all and engine.winograd_slots == 0
    assert engine.elements == windows.workspace_elements((8, 64, 56, 56), (64, 64, 3, 3),
                                                         geometry, 8)
    small = DirectConvolution((8, 16, 56, 56), (16, 16, 3, 3), 1, geometry, chunk=8,
                              max_workspace=64 * MiB)
    assert small.window_slots == 0
    # a workspace too small for one slot: the other paths
    tight = DirectConvolution((8, 64, 56, 56), (64, 64, 3, 3), 1, geometry, chunk=8,
                              max_workspace=4 * 64 * 64 * 9 * 2)
    assert tight.window_slots == 0


def test_the_layer_runs_it_and_agrees_with_the_reference_engine(monkeypatch):
    """``engine: auto`` on a ResNet-like strided 3x3 (64 channels, 56x56 to 28x28, bias) runs
    the windows (im2col + GEMM broken here), with a smaller workspace, and agrees with ``engine:
    reference`` to float32 rounding."""
    rng = np.random.default_rng(5)
    shape, out = (3, 64, 56, 56), 48
    x = rng.standard_normal(shape).astype(np.float32)
    params = {"weight": rng.standard_normal((out, 64, 3, 3)).astype(np.float32),
              "bias": rng.standard_normal(out).astype(np.float32)}
    dy = rng.standard_normal((3, out, 28, 28)).astype(np.float32)
    results, sizes = {}, {}
    for engine in ("reference", "auto"):
        conv = Convolution("conv", ["x"], ["y"], num_output=out, kernel_size=3, pad=1,
                           stride=2, engine=engine)
        conv.setup([shape], device_kind="cpu")
        sizes[engine] = conv.elements
        with monkeypatch.context() as patch:
            if engine == "auto":
                assert conv.fast.window_slots and conv.engine_only
                patch.setattr(conv_cpu, "conv_forward", None)
                patch.setattr(conv_cpu, "conv_backward", None)
            results[engine] = run_layer(conv, x, dy, params)
    assert sizes["auto"] < sizes["reference"]
    got, want = results["auto"], results["reference"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)
    for key in ("weight", "bias"):
        np.testing.assert_allclose(got[2][key], want[2][key], rtol=1e-4, atol=1e-3)
