"""The 1x1 convolution engine (``kernels.direct.pointwise``) against a float64 einsum: forward,
input gradient, weight and bias gradients, at stride 1 and 2, with short and long planes (the
ways dW's GEMMs run: side by side or per sample; the forward and input gradient per sample or in
``kernels.slotted``'s fixed-width products) and chunks smaller than the batch; a sample's outputs
whatever the chunking; both gradients sample by sample as the two passes give them; and the
layer's ``auto`` engine takes it for 1x1 convolutions."""
import numba
import numpy as np
import pytest

from minilms.kernels import blas_threads, conv_cpu, mkl, slotted
from minilms.kernels.direct import pointwise
from minilms.layers.convolution import Convolution
from minilms.layers.run import LayerRun

from ..blas_bits import assert_bits_or_rounding
from ..devices import new_device

MiB = 2**20


def reference(x, weight, bias, dy, stride):
    """Float64, by definition: a 1x1 convolution reads x's every ``stride``-th pixel."""
    xs = x[:, :, ::stride, ::stride].astype(np.float64)
    w = weight.reshape(weight.shape[0], -1).astype(np.float64)
    y = np.einsum("oc,nchw->nohw", w, xs)
    if bias is not None:
        y += bias.reshape(1, -1, 1, 1)
    dx = np.zeros(x.shape)
    dx[:, :, ::stride, ::stride] = np.einsum("oc,nohw->nchw", w, dy)
    dw = np.einsum("nohw,nchw->oc", dy, xs).reshape(weight.shape)
    return y, dx, dw, dy.sum(axis=(0, 2, 3))


CASES = [  # samples, channels, outputs, height, width, stride, chunk
    (3, 5, 7, 17, 16, 1, 3),     # plane 272: a GEMM per sample for dW
    (4, 6, 3, 5, 6, 1, 4),       # plane 30: columns side by side
    (5, 4, 6, 9, 7, 2, 2),       # strided, odd sizes, chunks of 2 (the last one short)
    (2, 3, 8, 33, 31, 2, 1),     # strided, plane 272, one sample a chunk
    (6, 8, 4, 4, 4, 1, 4),       # short plane, chunks of 4 (the second one short)
    (3, 4, 5, 12, 12, 1, 2),     # plane 144: dW side by side, the forward and dx batched
    (3, 5, 6, 23, 21, 2, 2),     # strided, plane 132, chunks of 2
]


@pytest.mark.parametrize("n, c, o, h, w, stride, chunk", CASES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("slotting", [False, True])
def test_pointwise_equals_the_definition(n, c, o, h, w, stride, chunk, with_bias, slotting):
    rng = np.random.default_rng(n * 100 + c)
    out_h, out_w = (h - 1) // stride + 1, (w - 1) // stride + 1
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    weight = rng.standard_normal((o, c, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32) if with_bias else None
    dy = rng.standard_normal((n, o, out_h, out_w)).astype(np.float32)
    geometry = ((1, 1), (stride, stride), (0, 0), (1, 1))
    assert pointwise.applies(weight.shape, geometry)
    slots = slotted.count(out_h * out_w, n, chunk, slotted.MIN_WEIGHT) if slotting else 1
    assert (slots > 1) == (slotting and chunk > 1 and
                           slotted.MIN_PLANE <= out_h * out_w < slotted.SHORT_PLANE)
    elements = pointwise.workspace_elements(x.shape, o, out_h * out_w, chunk, stride > 1, slots)
    work = np.full(elements, np.nan, np.float32)     # garbage in the workspace must not leak
    y = np.full((n, o, out_h, out_w), np.nan, np.float32)
    dx = np.full_like(x, np.nan)
    dw = np.full_like(weight, np.nan)
    db = np.full(o, np.nan, np.float32)
    pointwise.forward(x, weight, bias, y, work, chunk, geometry, slots)
    pointwise.input_grad(dy, weight, dx, work, chunk, geometry, slots)
    pointwise.weight_grad(x, dy, dw, db if with_bias else None, work, chunk, geometry)
    want_y, want_dx, want_dw, want_db = reference(x, weight, bias, dy, stride)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5 * np.sqrt(c))
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5 * np.sqrt(o))
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-5 * np.sqrt(n * out_h * out_w))
    if with_bias:
        np.testing.assert_allclose(db, want_db, rtol=1e-5, atol=1e-5 * np.sqrt(n * out_h * out_w))


@pytest.mark.parametrize("library", [name for name in mkl.CHOICES  # those this machine has
                                     if name != "mkl" or mkl.available()])
@pytest.mark.parametrize("c, o, h, stride", [(2048, 512, 7, 1), (512, 2048, 7, 1),
                                           (1024, 2048, 14, 2),      # ResNet-50's res5
                                           (5, 7, 9, 2), (6, 3, 7, 1)])  # one BLAS call
def test_a_samples_forward_and_input_gradient_do_not_depend_on_the_chunking(library, c, o, h,
                                                                            stride):
    """A step split along the batch must give the unsplit step's sample-wise outputs bit for bit
    (issue 20). The products per sample, and the slotted products of a 7x7 plane (a 7x7 plane
    once went side by side into one GEMM whose width was the chunk's, and its bits changed with
    the number of samples: 79% of ResNet-50's res5 forwards at chunks of 2). A split step
    passes the layer's own chunk and slots to every part; each part holds fewer samples."""
    rng = np.random.default_rng(c + o)
    out_h = (h - 1) // stride + 1
    x = rng.standard_normal((8, c, h, h)).astype(np.float32)
    weight = rng.standard_normal((o, c, 1, 1)).astype(np.float32)
    dy = rng.standard_normal((8, o, out_h, out_h)).astype(np.float32)
    geometry = ((1, 1), (stride, stride), (0, 0), (1, 1))
    slots = slotted.count(out_h * out_h, 8, 8, max(o * c, slotted.MIN_WEIGHT))
    assert slots == 8
    work = np.empty(pointwise.workspace_elements(x.shape, o, out_h * out_h, 8, stride > 1, slots),
                    np.float32)
    before = mkl.chosen()
    mkl.use(library)
    try:
        for slots in (1, slots):
            y, dx = np.empty_like(dy), np.empty_like(x)
            pointwise.forward(x, weight, None, y, work, 8, geometry, slots)
            pointwise.input_grad(dy, weight, dx, work, 8, geometry, slots)
            for k in (1, 2, 3):
                y_k, dx_k = np.empty_like(y), np.empty_like(dx)
                for n0 in range(0, 8, k):
                    n1 = min(8, n0 + k)
                    pointwise.forward(x[n0:n1], weight, None, y_k[n0:n1], work, 8, geometry,
                                      slots)
                    pointwise.input_grad(dy[n0:n1], weight, dx_k[n0:n1], work, 8, geometry,
                                         slots)
                assert_bits_or_rounding(y_k, y, f"forward, {slots} slots, {k}", library)
                assert_bits_or_rounding(dx_k, dx, f"dx, {slots} slots, {k}", library)
    finally:
        mkl.use(before)


@pytest.mark.parametrize("samples", [4, 3])      # runs of 2 and 2; of 1 and 2
def test_both_gradients_by_sample_are_the_two_passes_bit_for_bit(monkeypatch, samples):
    """``backward`` on a long unstrided plane takes a sample's two products one after the other
    (``both_by_sample``); the bits are those of ``input_grad`` then ``weight_grad`` (dW's of an
    odd batch where the BLAS keeps a product's bits in pieces), and the definition's to float32
    rounding. Two threads whatever the machine has, so the path is taken."""
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    rng = np.random.default_rng(samples)
    c, o, h = 128, 96, 30          # a product of 2 * 96 * 900 * 128 FLOPs: over MIN_FLOPS
    x = rng.standard_normal((samples, c, h, h)).astype(np.float32)
    weight = rng.standard_normal((o, c, 1, 1)).astype(np.float32)
    dy = rng.standard_normal((samples, o, h, h)).astype(np.float32)
    geometry = ((1, 1), (1, 1), (0, 0), (1, 1))
    assert 2.0 * o * h * h * c >= blas_threads.MIN_FLOPS
    assert pointwise.by_sample(dy, weight, geometry, 1)
    work = np.empty(1, np.float32)        # a long unstrided plane needs no workspace
    got = {}
    for by_sample in (True, False):
        monkeypatch.setattr(pointwise, "BY_SAMPLE", by_sample)
        dx, dw, db = np.full_like(x, np.nan), np.full_like(weight, np.nan), np.full(o, np.nan,
                                                                                   np.float32)
        pointwise.backward(x, dy, weight, dx, dw, db, work, samples, geometry)
        got[by_sample] = dx, dw, db
    np.testing.assert_array_equal(got[True][0], got[False][0])
    np.testing.assert_array_equal(got[True][2], got[False][2])
    if samples % 2 == 0:
        np.testing.assert_array_equal(got[True][1], got[False][1])
    else:     # the two passes cut the last sample's dW product in two (``blas_threads.parts``)
        assert_bits_or_rounding(got[True][1], got[False][1], "dW, an odd batch")
    _, want_dx, want_dw, want_db = reference(x, weight, None, dy, 1)
    dx, dw, db = got[True]
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5 * np.sqrt(o))
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-5 * np.sqrt(samples * h * h))
    np.testing.assert_allclose(db, want_db, rtol=1e-5, atol=1e-5 * np.sqrt(samples * h * h))


@pytest.mark.parametrize("samples, chunk", [(3, 3), (5, 2)])   # one chunk; three, the last short
def test_small_products_on_a_long_plane_sum_by_columns(monkeypatch, samples, chunk):
    """dW of a 1x1 whose per-sample products are below ``MIN_FLOPS`` on a long plane (GoogLeNet's
    32-output 1x1s at 28x28): each thread a block of dW's columns, the samples added by the GEMM
    (``sum_by_columns``); the definition's to float32 rounding, and the per-sample path's."""
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    rng = np.random.default_rng(samples)
    c, o, h = 24, 8, 17                 # plane 289: a product of 2 * 8 * 289 * 24 FLOPs
    x = rng.standard_normal((samples, c, h, h)).astype(np.float32)
    weight = rng.standard_normal((o, c, 1, 1)).astype(np.float32)
    dy = rng.standard_normal((samples, o, h, h)).astype(np.float32)
    geometry = ((1, 1), (1, 1), (0, 0), (1, 1))
    assert pointwise.by_columns(o, h * h, c)
    real, calls = pointwise.sum_by_columns, []

    def spy(*args, first):
        calls.append(first)
        real(*args, first=first)
    monkeypatch.setattr(pointwise, "sum_by_columns", spy)
    work = np.empty(1, np.float32)
    got = {}
    for columns in (True, False):
        monkeypatch.setattr(pointwise, "by_columns", lambda *a, on=columns: on)
        dw = np.full_like(weight, np.nan)
        pointwise.weight_grad(x, dy, dw, None, work, chunk, geometry)
        got[columns] = dw
    assert calls == [n0 == 0 for n0 in range(0, samples, chunk)]
    _, _, want_dw, _ = reference(x, weight, None, dy, 1)
    np.testing.assert_allclose(got[True], want_dw, rtol=1e-5, atol=1e-5 * np.sqrt(samples * h * h))
    np.testing.assert_allclose(got[True], got[False], rtol=1e-5, atol=1e-5)


def test_by_sample_only_where_the_two_passes_run_whole_products_per_thread(monkeypatch):
    """Stride 2, a short plane, slots, fewer samples than threads, or a small product: the two
    passes."""
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    weight = np.empty((96, 128, 1, 1), np.float32)
    one = ((1, 1), (1, 1), (0, 0), (1, 1))
    assert pointwise.by_sample(np.empty((2, 96, 30, 30), np.float32), weight, one, 1)
    assert not pointwise.by_sample(np.empty((2, 96, 30, 30), np.float32), weight,
                                    ((1, 1), (2, 2), (0, 0), (1, 1)), 1)
    assert not pointwise.by_sample(np.empty((2, 96, 15, 15), np.float32), weight, one, 1)
    assert not pointwise.by_sample(np.empty((2, 96, 30, 30), np.float32), weight, one, 2)
    assert not pointwise.by_sample(np.empty((1, 96, 30, 30), np.float32), weight, one, 1)
    assert not pointwise.by_sample(np.empty((2, 96, 30, 30), np.float32),
                                    np.empty((96, 8, 1, 1), np.float32), one, 1)


@pytest.mark.parametrize("h, w, sh, sw", [(9, 7, 2, 2), (8, 8, 2, 2), (10, 11, 3, 2),
                                           (5, 6, 1, 3)])
def test_strided_gather_and_scatter(h, w, sh, sw):
    """The sub-grid's copy out of ``x`` and back into a ``dx`` written whole (zeros between),
    against numpy's strided views; a view of fewer rows and columns than the grid has too."""
    rng = np.random.default_rng(h * w)
    x = rng.standard_normal((3, 4, h, w)).astype(np.float32)
    out_h, out_w = (h - 1) // sh + 1, (w - 1) // sw + 1
    sub = np.full((3, 4, out_h, out_w), np.nan, np.float32)
    pointwise.gather_strided(x, sub, sh, sw)
    np.testing.assert_array_equal(sub, x[:, :, ::sh, ::sw])
    dx = np.full_like(x, np.nan)
    pointwise.scatter_strided(sub, dx, sh, sw)
    want = np.zeros_like(x)
    want[:, :, ::sh, ::sw] = sub
    np.testing.assert_array_equal(dx, want)
    pointwise.scatter_strided(sub[:, :, :out_h - 1, :out_w - 1], dx, sh, sw)
    want[...] = 0
    want[:, :, :(out_h - 1) * sh:sh, :(out_w - 1) * sw:sw] = sub[:, :, :out_h - 1, :out_w - 1]
    np.testing.assert_array_equal(dx, want)


@pytest.mark.parametrize("n, c, o, h, w, stride, chunk", CASES)
@pytest.mark.parametrize("slotting", [False, True])
@pytest.mark.parametrize("by_sample", [False, True])
def test_adding_dx_adds_the_gradient_to_what_is_there(monkeypatch, n, c, o, h, w, stride, chunk,
                                                      slotting, by_sample):
    """``add_dx`` (a blob that feeds two layers: ``Layer.adds_bottom_grad``): ``dx`` ends as
    what was there plus the gradient that overwriting writes, on every path: a batched GEMM
    with beta = 1, both gradients sample by sample, the slots, the strided scatter; between the
    strided grid's pixels ``dx`` keeps its values; the weight gradient is unchanged."""
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    monkeypatch.setattr(blas_threads, "MIN_FLOPS", 0)   # the threaded and by-sample paths
    monkeypatch.setattr(pointwise, "BY_SAMPLE", by_sample)
    rng = np.random.default_rng(n * 10 + o)
    out_h, out_w = (h - 1) // stride + 1, (w - 1) // stride + 1
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    weight = rng.standard_normal((o, c, 1, 1)).astype(np.float32)
    dy = rng.standard_normal((n, o, out_h, out_w)).astype(np.float32)
    geometry = ((1, 1), (stride, stride), (0, 0), (1, 1))
    slots = slotted.count(out_h * out_w, n, chunk, slotted.MIN_WEIGHT) if slotting else 1
    work = np.full(pointwise.workspace_elements(x.shape, o, out_h * out_w, chunk, stride > 1,
                                                slots), np.nan, np.float32)
    there = rng.standard_normal(x.shape).astype(np.float32)
    dx, dw = np.full_like(x, np.nan), np.full_like(weight, np.nan)
    pointwise.backward(x, dy, weight, dx, dw, None, work, chunk, geometry, slots)
    added, dw_added = there.copy(), np.full_like(weight, np.nan)
    pointwise.backward(x, dy, weight, added, dw_added, None, work, chunk, geometry, slots,
                       add_dx=True)
    np.testing.assert_allclose(added, there + dx, rtol=1e-6, atol=1e-6 * np.sqrt(o))
    np.testing.assert_array_equal(dw_added, dw)
    if stride > 1:
        between = np.ones(x.shape, bool)
        between[:, :, ::stride, ::stride] = False
        np.testing.assert_array_equal(added[between], there[between])


def test_padding_or_a_larger_kernel_is_not_pointwise():
    assert not pointwise.applies((4, 3, 1, 1), ((1, 1), (1, 1), (1, 1), (1, 1)))
    assert not pointwise.applies((4, 3, 3, 3), ((3, 3), (1, 1), (0, 0), (1, 1)))
    assert pointwise.applies((4, 3, 1, 1), ((1, 1), (2, 2), (0, 0), (3, 3)))


@pytest.mark.parametrize("stride", [1, 2])
def test_the_layer_takes_pointwise_for_1x1_and_agrees_with_reference(monkeypatch, stride):
    """``engine: auto`` runs a 1x1 convolution without im2col (``conv_cpu`` broken here), and
    agrees with ``engine: reference`` to float32 rounding; chunks of 2 in a small workspace."""
    rng = np.random.default_rng(stride)
    shape, out = (5, 6, 9, 9), 7
    x = rng.standard_normal(shape).astype(np.float32)
    params = {"weight": rng.standard_normal((out, 6, 1, 1)).astype(np.float32),
              "bias": rng.standard_normal(out).astype(np.float32)}
    plane = ((9 - 1) // stride + 1) ** 2
    results = {}
    for engine in ("reference", "auto"):
        conv = Convolution("conv", ["x"], ["y"], num_output=out, kernel_size=1, stride=stride,
                           engine=engine, max_workspace=2 * (6 + out) * plane * 4)
        conv.setup([shape])
        assert conv.chunk == 2
        dy = np.random.default_rng(9).standard_normal(conv.top_shapes[0]).astype(np.float32)
        with monkeypatch.context() as patch:
            if engine == "auto":
                assert conv.fast.pointwise
                patch.setattr(conv_cpu, "conv_forward", None)
                patch.setattr(conv_cpu, "conv_backward", None)
            with new_device("cpu", 64 * MiB) as device:
                runner = LayerRun(device, conv, [shape])
                for key, value in params.items():
                    runner.set_param(key, value)
                y = runner.forward([x])[0].copy()
                (dx,), grads = runner.backward([dy])
                results[engine] = (y, dx.copy(), {k: v.copy() for k, v in grads.items()})
    for got, want in zip(results["auto"][:2], results["reference"][:2]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for key, want in results["reference"][2].items():
        np.testing.assert_allclose(results["auto"][2][key], want, rtol=1e-5, atol=1e-4)
