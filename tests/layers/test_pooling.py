"""Pooling layer: forward and backward against a naive loop reference, the gradient checker on both
devices, PyTorch's max_pool2d / avg_pool2d / adaptive pooling, and the option and shape errors."""
import math

import numpy as np
import pytest

from minilms.layers import LAYERS, ShapeError
from minilms.layers.gradcheck import check_gradients
from minilms.layers.run import LayerRun

from ..devices import GRADCHECK_SAMPLES, KINDS, new_device

MiB = 2**20


def make(**options):
    return LAYERS["Pooling"]("pool", ["x"], ["y"], **options)


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def out_len(size, k, s, p, ceil):
    """PyTorch's formula, written out: floor or ceil, then drop a window starting in the padding."""
    out = (math.ceil if ceil else math.floor)((size + 2 * p - k) / s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def naive_pool(x, pool, kernel, stride=None, pad=0, ceil=False, include_pad=True, dy=None):
    """(y, argmax, dx) by explicit loops over every output window; dx only when dy is given."""
    (kh, kw), (sh, sw), (ph, pw) = pair(kernel), pair(stride or kernel), pair(pad)
    n_, c_, h_, w_ = x.shape
    ho, wo = out_len(h_, kh, sh, ph, ceil), out_len(w_, kw, sw, pw, ceil)
    y, arg = np.zeros((n_, c_, ho, wo)), np.zeros((n_, c_, ho, wo), np.int64)
    dx = np.zeros(x.shape)
    for n in range(n_):
        for c in range(c_):
            for oh in range(ho):
                for ow in range(wo):
                    hs, ws = oh * sh - ph, ow * sw - pw
                    he, we = min(hs + kh, h_ + ph), min(ws + kw, w_ + pw)
                    cells = [(h, w) for h in range(max(hs, 0), min(he, h_))
                             for w in range(max(ws, 0), min(we, w_))]
                    if pool == "max":
                        best = max(cells, key=lambda hw: (x[n, c][hw], -hw[0] * w_ - hw[1]))
                        y[n, c, oh, ow], arg[n, c, oh, ow] = x[n, c][best], best[0] * w_ + best[1]
                        if dy is not None:
                            dx[n, c][best] += dy[n, c, oh, ow]
                    else:
                        div = (he - hs) * (we - ws) if include_pad else len(cells)
                        y[n, c, oh, ow] = sum(x[n, c][hw] for hw in cells) / div
                        if dy is not None:
                            for hw in cells:
                                dx[n, c][hw] += dy[n, c, oh, ow] / div
    return y, arg, dx


# (options, input H, W): padding, ceil mode (incl. a last window that would start in the padding),
# overlapping and rectangular windows, count_include_pad both ways
CONFIGS = [
    (dict(kernel_size=2), 4, 6),
    (dict(kernel_size=3, stride=2, pad=1), 7, 5),
    (dict(kernel_size=3, stride=2, ceil_mode=True), 6, 7),
    (dict(kernel_size=2, stride=2, pad=1, ceil_mode=True), 5, 5),
    (dict(kernel_size=(3, 2), stride=(1, 2), pad=(1, 0)), 4, 5),
    (dict(kernel_size=3, stride=2, pad=1, ceil_mode=True, count_include_pad=False), 6, 6),
]


def distinct(rng, shape):
    """Values with no ties, so no max-pool window has two maxima."""
    return rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0 - 3.0


@pytest.mark.parametrize("pool", ["max", "ave"])
@pytest.mark.parametrize("options, h, w", CONFIGS)
def test_forward_and_backward_against_naive(pool, options, h, w):
    rng = np.random.default_rng(h * w)
    x = rng.standard_normal((2, 3, h, w))
    layer = make(pool=pool, **options)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, layer, [x.shape], dtype=np.float64)
        y = run.forward([x])[0]
        dy = rng.standard_normal(y.shape)
        (dx,), params = run.backward([dy])
        want_y, want_arg, want_dx = naive_pool(
            x, pool, options["kernel_size"], options.get("stride"), options.get("pad", 0),
            options.get("ceil_mode", False), options.get("count_include_pad", True), dy)
        np.testing.assert_allclose(y, want_y, rtol=1e-13)
        np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-15)
        assert params == {}
        if pool == "max":
            np.testing.assert_array_equal(run.saved["argmax"].host_data(), want_arg)


@pytest.mark.parametrize("pool", ["max", "ave"])
def test_global_pooling(pool):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5))
    dy = rng.standard_normal((2, 3, 1, 1))
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, make(pool=pool, global_pooling=True), [x.shape], dtype=np.float64)
        y = run.forward([x])[0]
        (dx,), _ = run.backward([dy])
    want_y, _, want_dx = naive_pool(x, pool, (4, 5), dy=dy)
    assert y.shape == (2, 3, 1, 1)
    np.testing.assert_allclose(y, want_y, rtol=1e-13)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-13)
    np.testing.assert_allclose(y[:, :, 0, 0], x.max((2, 3)) if pool == "max" else x.mean((2, 3)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pool", ["max", "ave"])
def test_gradients(kind, pool):
    """Backward against central differences on both devices. ``backward_reads`` is empty, so
    LayerRun withholds the bottom from backward: passing proves nothing undeclared is read."""
    rng = np.random.default_rng(2)
    configs = CONFIGS[1:4] if kind == "cpu" else CONFIGS[2:4]
    for options, h, w in configs:
        x = distinct(rng, (1, 2, h, w))
        with new_device(kind, MiB) as device:
            report = check_gradients(device, make(pool=pool, **options), [x],
                                     samples=GRADCHECK_SAMPLES[kind])
        assert report.kinks == 0 and report.worst <= 1


@pytest.mark.parametrize("kind", KINDS)
def test_global_gradients(kind):
    x = distinct(np.random.default_rng(3), (1, 1, 3, 4))   # one plane: a 128-thread block on cuda
    with new_device(kind, MiB) as device:
        for pool in ("max", "ave"):
            check_gradients(device, make(pool=pool, global_pooling=True), [x],
                            samples=GRADCHECK_SAMPLES[kind] if kind == "cpu" else 2)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    """Every element of forward, argmax and backward, both devices, float32."""
    rng = np.random.default_rng(4)
    cases = [(dict(pool="max", **CONFIGS[3][0]), 5, 5), (dict(pool="ave", **CONFIGS[5][0]), 6, 6),
             (dict(pool="max", global_pooling=True), 3, 3)]
    for options, h, w in cases:
        x = rng.standard_normal((1, 2, h, w)).astype(np.float32)
        x[0, 0, :2, :2] = 1.0                                      # a tie: first maximum wins
        results = []
        for kind in ("cpu", "cuda"):
            with new_device(kind, MiB) as device:
                run = LayerRun(device, make(**options), [x.shape])
                y = run.forward([x])[0]
                dy = np.random.default_rng(5).standard_normal(y.shape).astype(np.float32)
                (dx,), _ = run.backward([dy])
                saved = {k: b.host_data().copy() for k, b in run.saved.items()}
                results.append((y, dx, saved))
        (y0, dx0, s0), (y1, dx1, s1) = results
        np.testing.assert_array_equal(y1, y0)
        np.testing.assert_allclose(dx1, dx0, rtol=1e-6)
        for key in s0:
            np.testing.assert_array_equal(s1[key], s0[key])


def test_declarations():
    layer = make(pool="max", kernel_size=3, stride=2, pad=1, ceil_mode=True)
    assert layer.setup([(2, 3, 6, 6)]) == [(2, 3, 4, 4)]
    assert layer.backward_reads == frozenset() and layer.has_backward and not layer.is_loss
    (argmax,) = layer.saved()
    assert (argmax.name, argmax.shape, argmax.dtype) == ("argmax", (2, 3, 4, 4), np.int32)
    assert layer.params() == [] and layer.workspace() == []
    ave = make(pool="AVE", kernel_size=2)
    assert ave.setup([(2, 3, 5, 5)]) == [(2, 3, 2, 2)] and ave.saved() == []
    assert (make(pool="avg", kernel_size=2).pool == "ave"
            and make(pool="MAX", kernel_size=2).pool == "max")
    glob = make(pool="ave", global_pooling=True)
    assert glob.setup([(2, 3, 7, 5)]) == [(2, 3, 1, 1)] and glob.saved() == []
    assert make(kernel_size=(3, 2)).stride == (3, 2)                  # stride defaults to kernel


def test_the_argmax_is_16_bits_on_the_cpu_where_a_plane_fits():
    """``shapes.argmax_dtype``: uint16 for the cpu up to 2^16 pixels a plane (half the bytes to
    write and read), int32 beyond, on CUDA and for either device (its kernels' signatures)."""
    def dtype(kind, h, w):
        layer = make(pool="max", kernel_size=3, stride=2, pad=1)
        layer.setup([(1, 2, h, w)], kind)
        return layer.saved()[0].dtype
    assert dtype("cpu", 224, 224) == np.uint16 and dtype("cpu", 256, 256) == np.uint16
    assert dtype("cpu", 257, 256) == np.int32 and dtype("cpu", 2240, 2240) == np.int32
    assert dtype("cuda", 224, 224) == np.int32 and dtype(None, 224, 224) == np.int32


def test_against_torch():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: comparison skipped")
    F = torch.nn.functional
    rng = np.random.default_rng(6)
    with new_device("cpu", MiB) as device:
        for options, h, w in CONFIGS:
            k, s, p = options["kernel_size"], options.get("stride"), options.get("pad", 0)
            ceil, include = options.get("ceil_mode", False), options.get("count_include_pad", True)
            x = rng.standard_normal((2, 3, h, w)).astype(np.float32)
            for pool in ("max", "ave"):
                run = LayerRun(device, make(pool=pool, **options), [x.shape])
                y = run.forward([x])[0]
                dy = rng.standard_normal(y.shape).astype(np.float32)
                (dx,), _ = run.backward([dy])
                xt = torch.tensor(x, requires_grad=True)
                if pool == "max":
                    yt, it = F.max_pool2d(xt, k, s, p, ceil_mode=ceil, return_indices=True)
                    np.testing.assert_array_equal(run.saved["argmax"].host_data(), it.numpy())
                else:
                    yt = F.avg_pool2d(xt, k, s, p, ceil_mode=ceil, count_include_pad=include)
                yt.backward(torch.tensor(dy))
                np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-6, atol=1e-7)
                np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-6, atol=1e-7)
        x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
        for pool, fn in (("max", F.adaptive_max_pool2d), ("ave", F.adaptive_avg_pool2d)):
            run = LayerRun(device, make(pool=pool, global_pooling=True), [x.shape])
            y = run.forward([x])[0]
            dy = rng.standard_normal(y.shape).astype(np.float32)
            (dx,), _ = run.backward([dy])
            xt = torch.tensor(x, requires_grad=True)
            yt = fn(xt, 1)
            yt.backward(torch.tensor(dy))
            np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-6)
            np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-6)


def test_option_errors():
    prefix = r"^layer pool \(Pooling\): "
    cases = [
        (dict(pool="stochastic", kernel_size=2),
         "pool: expected 'max' or 'ave' \\(or 'avg'\\), found 'stochastic'"),
        (dict(), "kernel_size: expected an int or an \\(h, w\\) pair, found None"),
        (dict(kernel_size=0),
         "kernel_size: expected an int >= 1 or an \\(h, w\\) pair of them, found 0"),
        (dict(kernel_size=(2, 2, 2)), "kernel_size: expected an int >= 1 .*found \\(2, 2, 2\\)"),
        (dict(kernel_size=2, stride=0), "stride: expected an int >= 1"),
        (dict(kernel_size=2, pad=-1), "pad: expected an int >= 0"),
        (dict(kernel_size=3, pad=2), "pad: expected at most kernel_size // 2 = 1 \\(h\\), found 2"),
        (dict(kernel_size=(3, 2), pad=(1, 2)),
         "pad: expected at most kernel_size // 2 = 1 \\(w\\)"),
        (dict(global_pooling=True, kernel_size=2),
         "kernel_size: expected none with global_pooling, found 2"),
        (dict(global_pooling=True, pad=1), "pad: expected none with global_pooling, found 1"),
        (dict(kernel_size=2, ceil_mode="yes"), "ceil_mode: expected true or false, found 'yes'$"),
    ]
    for options, message in cases:
        with pytest.raises(ShapeError, match=prefix + message) as info:
            make(**options)
        assert "\n" not in str(info.value)


def test_shape_errors():
    with pytest.raises(ShapeError, match=r"^layer pool \(Pooling\): bottom 0 \(x\): expected a 4-d "
                                         r"shape, found \(2, 3, 4\)$"):
        make(kernel_size=2).setup([(2, 3, 4)])
    with pytest.raises(ShapeError, match=r"bottom 0 \(x\): expected W \+ 2\*pad >= kernel_size 3, "
                                         r"found \(1, 1, 5, 2\)$"):
        make(kernel_size=3).setup([(1, 1, 5, 2)])
    with pytest.raises(ShapeError, match=r"bottom 0 \(x\): expected a non-empty H x W plane"):
        make(global_pooling=True).setup([(1, 1, 0, 2)])
    with pytest.raises(ShapeError, match=r"bottoms: expected 1 bottom blob\(s\), found 2"):
        LAYERS["Pooling"]("pool", ["a", "b"], ["y"], kernel_size=2)
    assert make(kernel_size=3, pad=1).setup([(1, 1, 1, 1)]) == [(1, 1, 1, 1)]  # padding makes room
