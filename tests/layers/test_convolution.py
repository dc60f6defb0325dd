"""Convolution: forward against naive loops, backward by the gradient checker on both devices, the
banded (bounded-workspace) path against the whole-image path, PyTorch, workspace sizes, errors."""
import numpy as np
import pytest

from minilms.layers import ShapeError
from minilms.layers.convolution import Convolution
from minilms.layers.gradcheck import check_gradients
from minilms.layers.run import LayerRun

from ..devices import GRADCHECK_SAMPLES, KINDS, new_device

MiB = 2**20


# Under the simulator, a GEMM tile that covers these small matrices in one block (conftest).
pytestmark = pytest.mark.usefixtures("small_gemm_tile")


def conv(num_output=4, kernel_size=3, **options):
    return Convolution("conv", ["x"], ["y"], num_output=num_output, kernel_size=kernel_size,
                       **options)


def pair(v):
    return (v, v) if np.isscalar(v) else tuple(v)


def naive_conv(x, weight, bias, stride=1, pad=0, dilation=1, groups=1):
    """Straight from the definition: every output is a sum over its group's channels and taps."""
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(pad), pair(dilation)
    n, channels, height, width = x.shape
    out, in_group, kh, kw = weight.shape
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, out, out_h, out_w))
    for s in range(n):
        for o in range(out):
            g = o // (out // groups)
            for oh in range(out_h):
                for ow in range(out_w):
                    total = 0.0 if bias is None else bias[o]
                    for c in range(in_group):
                        for i in range(kh):
                            for j in range(kw):
                                h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                                if 0 <= h < height and 0 <= w < width:
                                    total += weight[o, c, i, j] * x[s, g * in_group + c, h, w]
                    y[s, o, oh, ow] = total
    return y


# name: (options, bottom shape)
VARIANTS = {
    "plain": (dict(), (2, 3, 5, 5)),
    "stride and pad": (dict(stride=2, pad=1), (2, 2, 6, 5)),
    "dilation, non-square": (dict(kernel_size=[2, 3], dilation=[2, 1], pad=[0, 1]), (2, 2, 6, 5)),
    "groups": (dict(num_output=6, groups=3, stride=[1, 2]), (2, 3, 5, 6)),
    "no bias": (dict(bias=False, pad=2), (2, 2, 3, 4)),
    # Bands of 2 output rows (the last one shorter).
    "banded": (dict(pad=1, groups=2, max_workspace=560), (2, 2, 5, 4)),
    # A 1x1 output.
    "kernel = image": (dict(kernel_size=[3, 4]), (2, 2, 3, 4)),
}


def variant(name):
    options, shape = VARIANTS[name]
    return conv(**options), shape


def random_bias(layer, rng):
    return {"bias": rng.standard_normal(layer.num_output)} if layer.bias else {}


@pytest.mark.parametrize("name", VARIANTS)
def test_forward_matches_naive_loops(name):
    layer, shape = variant(name)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, layer, [shape], dtype=np.float64)
        for key, value in random_bias(layer, rng).items():
            run.set_param(key, value)
        y = run.forward([x])[0]
        weight, bias = run.param("weight"), run.param("bias") if layer.bias else None
    assert y.shape == layer.top_shapes[0]
    np.testing.assert_allclose(y, naive_conv(x, weight, bias, layer.stride, layer.pad,
                                             layer.dilation, layer.groups), rtol=1e-12, atol=1e-12)


def test_banded_variant_really_bands():
    layer, shape = variant("banded")
    layer.setup([shape])
    assert layer.staged and layer.band_rows == 2 and layer.out_h == 5
    assert layer.workspace()[0].nbytes <= layer.max_workspace


def test_workspace_plans():
    """The three ways through, chosen from max_workspace (float32 bytes) by setup: chunks of whole
    samples (cpu), one sample at a time, bands of output rows. Workspace elements as documented."""
    shape = (5, 2, 5, 4)                       # 3x3, pad 1: a 5x4 output, K = 18, plane 20
    per_sample = (18 + 4) * 20                 # col and dyT of one sample in a chunk
    for max_workspace, chunk in ((64 * MiB, 5), (3 * per_sample * 4, 3), (per_sample * 4, 1)):
        layer = conv(pad=1, max_workspace=max_workspace)
        layer.setup([shape])
        assert (layer.chunk, layer.staged, layer.band_rows) == (chunk, False, 5)
        assert layer.slots == 1                    # a small weight: a product per sample
        assert layer.elements == chunk * per_sample
    one_sample = conv(pad=1, max_workspace=per_sample * 4 - 4)   # no chunk, one sample's col fits
    one_sample.setup([shape])
    assert (one_sample.chunk, one_sample.staged) == (0, False)
    assert one_sample.elements == (18 + 1) * 20                  # col [18, 20] and 20 ones
    banded = conv(pad=1, max_workspace=3 * (18 + 4 + 1) * 4 * 4)  # 3 rows' worth
    banded.setup([shape])
    assert banded.chunk == 0 and banded.staged and banded.band_rows == 3
    assert banded.elements == 3 * (18 + 4 + 1) * 4             # col, staging, ones per band row


@pytest.mark.parametrize("name", VARIANTS)
def test_gradients_cpu_float64(name):
    layer, shape = variant(name)
    rng = np.random.default_rng(2)
    with new_device("cpu", MiB) as device:
        report = check_gradients(device, layer, [rng.standard_normal(shape)],
                                 samples=GRADCHECK_SAMPLES["cpu"], params=random_bias(layer, rng))
    assert report.kinks == 0


# Float32 on cuda (its GEMM is float32 only). The convolution is linear in x, in the weight and in
# the bias, so central differences carry no truncation error at any eps: what is left is the float32
# rounding of the top (~6e-8 relative per element; the checker sums the objective in float64),
# divided by 2 eps. With eps = 1e-2 that is ~1e-5 absolute. Over 15 seeds of this test on cpu the
# worst element used 0.27 of (rtol 1e-3, atol 1e-4); twice that leaves a margin of ~7x, and is still
# 10x tighter than the usual float32 (2e-2, 1e-3), so a real error (a missed tap, a dropped sample,
# a wrong sign) cannot hide in it.
CUDA_TOLERANCE = dict(dtype=np.float32, eps=1e-2, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_float32(kind):
    """The cuda gradient check, on a shape small enough for the simulator (every kernel launch
    costs it a Python thread per CUDA thread). The banded path on cuda is checked against the
    whole-image path below, and three more variants against cpu. The same float32 check on cpu shows
    that the tolerances are not what makes it pass."""
    layer = conv(num_output=3)
    rng = np.random.default_rng(3)
    with new_device(kind, MiB) as device:
        report = check_gradients(device, layer, [rng.standard_normal((2, 2, 4, 4))],
                                 samples=GRADCHECK_SAMPLES[kind], params=random_bias(layer, rng),
                                 **CUDA_TOLERANCE)
    assert report.kinks == 0


def forward_backward(kind, layer, x, dy, params, device_kind=None):
    with new_device(kind, 16 * MiB) as device:
        run = LayerRun(device, layer, [x.shape], dtype=x.dtype, device_kind=device_kind)
        for key, value in params.items():
            run.set_param(key, value)
        y = run.forward([x])[0]
        (dx,), grads = run.backward([dy])
    return y, dx, grads


# (options, max_workspace, output rows per band) for a [2, 2, 5, 4] input, 5x2 output: bands of 2
# and of 3 rows (the last one shorter), and of 1 row without bias or groups.
BANDS = [(dict(groups=2), 200, 2), (dict(groups=2), 300, 3), (dict(bias=False), 200, 1)]


@pytest.mark.parametrize("kind, case, batch", [("cpu", 0, 2), ("cpu", 1, 2), ("cpu", 2, 2),
                                               pytest.param("cuda", 1, 1, marks=pytest.mark.cuda)])
def test_banded_path_equals_whole_image_path(kind, case, batch):
    """On cuda one sample (the simulator is slow): two groups of two bands each, 3 rows and 2."""
    options, max_workspace, band_rows = BANDS[case]
    options = dict(options, pad=1, stride=[1, 2], num_output=4)
    rng = np.random.default_rng(4)
    shape = (batch, 2, 5, 4)
    x = rng.standard_normal(shape).astype(np.float32)
    whole, banded = conv(**options), conv(**options, max_workspace=max_workspace)
    whole.setup([shape])
    banded.setup([shape])
    assert not whole.staged and whole.band_rows == 5
    assert banded.staged and banded.band_rows == band_rows
    dy = rng.standard_normal(whole.top_shapes[0]).astype(np.float32)
    params = {"weight": rng.standard_normal((4, shape[1] // whole.groups, 3, 3))}
    if whole.bias:
        params["bias"] = rng.standard_normal(4)
    expected = forward_backward(kind, whole, x, dy, params)
    got = forward_backward(kind, banded, x, dy, params)
    for a, b in zip(got[:2], expected[:2]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert got[2].keys() == expected[2].keys()
    for key in expected[2]:
        np.testing.assert_allclose(got[2][key], expected[2][key], rtol=1e-5, atol=1e-5)


DIRECT_CASES = {name: VARIANTS[name] for name in VARIANTS if name not in ("groups", "banded")}
DIRECT_CASES["16 channels"] = (dict(num_output=5, pad=1), (2, 16, 5, 6))   # a direct input grad
# Samples in vector lanes: a strided input gradient, half a vector of samples or more.
DIRECT_CASES["stride 2, 16 channels"] = (dict(num_output=3, stride=2, pad=1), (9, 16, 30, 32))
# Many channels on a small plane: the forward and both gradients by im2col + GEMM
# (conv.FWD_GEMM_WEIGHTS, weight_grad.DW_GEMM_WEIGHTS).
DIRECT_CASES["many channels, small plane"] = (dict(num_output=256, pad=1), (2, 128, 4, 4))


@pytest.mark.parametrize("name", DIRECT_CASES)
def test_float32_cpu_takes_the_direct_path(name, monkeypatch):
    """float32 without groups: the forward is the direct convolution wherever it pays (not many
    channels on a small plane), and so is the input gradient (stride 1, or samples in lanes),
    and the weight and bias gradients wherever the kernel is larger than 1x1 (im2col + GEMM
    would fail here, elsewhere); all match float64 references (the naive loops; the float64
    layer's gradients)."""
    from minilms.kernels import conv_cpu
    from minilms.kernels.direct import conv as conv_direct
    from minilms.kernels.direct import input_grad as conv_input_grad
    from minilms.kernels.direct import weight_grad as conv_weight_grad
    options, shape = DIRECT_CASES[name]
    layer = conv(**options)
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape)
    layer.setup([shape])
    params = {"weight": rng.standard_normal(layer.params()[0].shape), **random_bias(layer, rng)}
    dy = rng.standard_normal(layer.top_shapes[0])
    _, dx64, grads64 = forward_backward("cpu", conv(**options), x, dy, params)
    plane = layer.top_shapes[0][2] * layer.top_shapes[0][3]
    im2col_dx = (layer.stride != (1, 1) or not conv_input_grad.input_grad_pays(
        params["weight"].shape, plane)) and not conv_input_grad.sample_lanes_pay(
        shape, params["weight"].shape, layer._geometry())
    real_backward = conv_cpu.conv_backward

    im2col_dw = not conv_weight_grad.weight_grad_pays(params["weight"].shape, plane)
    im2col_forward = not conv_direct.forward_pays(params["weight"].shape, plane)
    assert (im2col_dx and im2col_dw) == im2col_forward == (name == "many channels, small plane")
    real_forward = conv_cpu.conv_forward

    def forward_if_it_pays(*args):
        assert im2col_forward, "the forward should have been direct"
        return real_forward(*args)

    def no_im2col_input_grad(x_, dy_, weight, dx, dweight, dbias, *rest):
        assert dx is None or im2col_dx, "the input gradient should have been direct"
        assert (dweight is None and dbias is None) or im2col_dw, "dweight should have been direct"
        return real_backward(x_, dy_, weight, dx, dweight, dbias, *rest)
    monkeypatch.setattr(conv_cpu, "conv_forward", forward_if_it_pays)
    monkeypatch.setattr(conv_cpu, "conv_backward", no_im2col_input_grad)
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    y, dx, grads = forward_backward("cpu", layer, x.astype(np.float32), dy.astype(np.float32), p32)
    expected = naive_conv(x, params["weight"], params.get("bias"), layer.stride, layer.pad,
                          layer.dilation)
    assert conv_direct.supports(y.dtype, layer.groups)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, dx64, rtol=1e-4, atol=1e-4)
    for key in grads64:
        np.testing.assert_allclose(grads[key], grads64[key], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("options", [dict(groups=2), dict(bias=False, dilation=2, pad=2)])
def test_chunked_path_equals_per_sample_path(options):
    """cpu: chunks of 2 samples (the last one short) and of all 5 give what one sample at a time
    gives, forward and backward; the first chunk writes the parameter gradients, later ones add."""
    rng = np.random.default_rng(8)
    shape = (5, 2, 5, 4)
    x = rng.standard_normal(shape)
    options = dict(options, pad=options.get("pad", 1), num_output=4)
    probe = conv(**options)
    probe.setup([shape])
    per_sample = (probe.groups * probe.k + 4) * probe.out_h * probe.out_w * 4
    layers = [conv(**options, max_workspace=m) for m in (per_sample - 4, 2 * per_sample, 64 * MiB)]
    params = {"weight": rng.standard_normal((4, shape[1] // probe.groups, 3, 3))}
    if probe.bias:
        params["bias"] = rng.standard_normal(4)
    dy = rng.standard_normal(probe.top_shapes[0])
    results = []
    for layer in layers:
        results.append(forward_backward("cpu", layer, x, dy, params))
    assert [layer.chunk for layer in layers] == [0, 2, 5]
    expected = results[0]
    for got in results[1:]:
        for a, b in zip(got[:2], expected[:2]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        for key in expected[2]:
            np.testing.assert_allclose(got[2][key], expected[2][key], rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    """Variants' forward and backward, on cuda and on cpu, float32: the same numbers. One sample
    each, for the simulator's sake: the sum over samples is the gradient check's to show."""
    rng = np.random.default_rng(5)
    for name in ("dilation, non-square", "groups", "no bias"):
        layer, shape = variant(name)
        shape = (1,) + shape[1:]
        layer.setup([shape])
        x = rng.standard_normal(shape).astype(np.float32)
        dy = rng.standard_normal(layer.top_shapes[0]).astype(np.float32)
        params = random_bias(layer, rng)
        cpu = forward_backward("cpu", variant(name)[0], x, dy, params)
        cuda = forward_backward("cuda", variant(name)[0], x, dy, params)
        for a, b in zip(cuda[:2], cpu[:2]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
        for key in cpu[2]:
            np.testing.assert_allclose(cuda[2][key], cpu[2][key], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} {key}")


def test_backward_overwrites_gradients():
    """Two backward passes give the same gradients: nothing accumulates into stale values."""
    layer, shape = variant("banded")
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, layer, [shape], dtype=np.float64)
        y = run.forward([x])[0]
        dy = rng.standard_normal(y.shape)
        first = run.backward([dy])
        second = run.backward([dy])
    np.testing.assert_array_equal(first[0][0], second[0][0])
    for key in first[1]:
        np.testing.assert_array_equal(first[1][key], second[1][key])


def test_against_torch():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: comparison skipped")
    rng = np.random.default_rng(7)
    options = dict(num_output=6, kernel_size=[3, 2], stride=[2, 1], pad=[1, 0], dilation=[1, 2],
                   groups=2)
    x = rng.standard_normal((3, 4, 9, 8)).astype(np.float32)
    for max_workspace in (64 * MiB, 1000):  # whole image, and bands of 2 rows
        layer = conv(**options, max_workspace=max_workspace)
        with new_device("cpu", 4 * MiB) as device:
            run = LayerRun(device, layer, [x.shape])
            run.set_param("bias", rng.standard_normal(6).astype(np.float32))
            y = run.forward([x])[0]
            dy = rng.standard_normal(y.shape).astype(np.float32)
            (dx,), grads = run.backward([dy])
            weight, bias = run.param("weight"), run.param("bias")
        assert layer.staged == (max_workspace == 1000)
        tx = torch.tensor(x, requires_grad=True)
        tw = torch.tensor(weight, requires_grad=True)
        tb = torch.tensor(bias, requires_grad=True)
        ty = torch.nn.functional.conv2d(tx, tw, tb, stride=(2, 1), padding=(1, 0),
                                        dilation=(1, 2), groups=2)
        ty.backward(torch.tensor(dy))
        close = dict(rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(y, ty.detach().numpy(), **close)
        np.testing.assert_allclose(dx, tx.grad.numpy(), **close)
        np.testing.assert_allclose(grads["weight"], tw.grad.numpy(), **close)
        np.testing.assert_allclose(grads["bias"], tb.grad.numpy(), **close)


def test_params_in_pytorch_layout():
    layer = conv(num_output=8, kernel_size=[3, 2], groups=2, weight_init="xavier")
    layer.setup([(1, 6, 7, 7)])
    weight, bias = layer.params()
    assert (weight.name, weight.shape, weight.init) == ("weight", (8, 3, 3, 2), "xavier")
    assert (weight.fan_in, weight.fan_out) == (3 * 3 * 2, 8 * 3 * 2)
    assert (bias.name, bias.shape, bias.init) == ("bias", (8,), "zeros")
    no_bias = conv(bias=False)
    no_bias.setup([(1, 1, 3, 3)])
    assert [p.name for p in no_bias.params()] == ["weight"]
    assert no_bias.top_shapes == [(1, 4, 1, 1)]


def test_workspace_is_bounded():
    """Setup only: no compute. The workspace grows with the batch only while whole samples' chunks
    fit in max_workspace, then stays; for a 2240x2240 input it is one band of rows, the same for
    every batch, and under max_workspace."""
    def workspace(batch, size, **options):
        layer = conv(num_output=64, pad=1, **options)
        layer.setup([(batch, 3, size, size)])
        (spec,) = layer.workspace()
        assert spec.dtype is None          # the run's float dtype
        return layer, spec.nbytes

    per_sample = (27 + 64) * 32 * 32 * 4  # col and dyT of one 32x32 sample, float32
    cap = 64 * MiB // per_sample
    small = {batch: workspace(batch, 32)[1] for batch in (1, 8, cap, 4 * cap)}
    assert small == {1: per_sample, 8: 8 * per_sample, cap: cap * per_sample,
                     4 * cap: cap * per_sample}
    assert max(small.values()) <= 64 * MiB
    for max_workspace in (64 * MiB, MiB):
        sizes = set()
        for batch in (1, 32, 1024):
            layer, nbytes = workspace(batch, 2240, max_workspace=max_workspace)
            assert layer.staged and 1 <= layer.band_rows < 2240 and layer.chunk == 0
            assert nbytes <= max_workspace
            sizes.add(nbytes)
        assert len(sizes) == 1
        # col, staging and ones for one band: [27 + 64 + 1, rows * 2240] float32
        assert sizes == {(27 + 64 + 1) * layer.band_rows * 2240 * 4}
    assert workspace(1, 2240)[0].band_rows == 64 * MiB // ((27 + 64 + 1) * 2240 * 4)


def test_workspace_of_another_dtype_says_so():
    """The workspace must come in the data's dtype; a runner that allocates it otherwise is told."""
    layer = conv(pad=1)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, layer, [(1, 1, 5, 5)], dtype=np.float32, bottom_dtypes=[np.float64])
        with pytest.raises(ValueError, match=r"conv \(Convolution\): workspace col is \d+ float32, "
                                             r"expected \d+ float64 \(the data's dtype"):
            run.forward([np.zeros((1, 1, 5, 5))])


@pytest.mark.parametrize("options, shape, message", [
    (dict(groups=2), (1, 3, 5, 5),
     r"^layer conv \(Convolution\): bottom 0 \(x\): expected channels divisible by groups \(2\), "
     r"found \(1, 3, 5, 5\)$"),
    (dict(kernel_size=4, pad=1, dilation=2), (1, 1, 4, 9),
     r"^layer conv \(Convolution\): bottom 0 \(x\): expected an input of at least 7x7 with pad "
     r"1x1 \(kernel 4x4, dilation 2x2\), found \(1, 1, 4, 9\)$"),
    (dict(kernel_size=[1, 5]), (1, 1, 8, 4), r"expected an input of at least 1x5 with pad 0x0"),
    (dict(), (1, 3, 5), r"^layer conv \(Convolution\): bottom 0 \(x\): expected a 4-d shape, "
                        r"found \(1, 3, 5\)$"),
    (dict(max_workspace=100), (1, 1, 5, 5),
     r"^layer conv \(Convolution\): max_workspace: expected at least 168 bytes \(one output row "
     r"of col for input \(1, 1, 5, 5\)\), found 100$"),
])
def test_shape_errors(options, shape, message):
    layer = conv(**options)
    with pytest.raises(ShapeError, match=message) as error:
        layer.setup([shape])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("options, message", [
    (dict(num_output=6, groups=4), r"num_output: expected a multiple of groups \(4\), found 6"),
    (dict(num_output=0), "num_output: expected a positive integer, found 0"),
    (dict(kernel_size=None), r"kernel_size: expected an integer >= 1 or a pair \[h, w\] of them, "
                             "found None"),
    (dict(kernel_size=[3, 3, 3]), r"kernel_size: expected .* found \[3, 3, 3\]"),
    (dict(stride=0), r"stride: expected an integer >= 1"),
    (dict(pad=-1), r"pad: expected an integer >= 0"),
    (dict(dilation=[1, 0]), r"dilation: expected an integer >= 1"),
    (dict(weight_init="uniform"), r"weight_init: expected 'he' or 'xavier', found 'uniform'"),
    (dict(max_workspace=0), r"max_workspace: expected a positive integer"),
])
def test_option_errors(options, message):
    with pytest.raises(ShapeError, match=r"^layer conv \(Convolution\): " + message):
        conv(**options)


@pytest.mark.cuda
def test_cuda_chunks_of_samples_equal_one_sample_at_a_time(monkeypatch):
    """cuda, groups of one: chunks of 2 samples (the last one short) and of all 3 per launch give
    what one sample at a time gives (the per-sample path), forward bit for bit (each sample's
    outputs are the same sums whatever the chunk), the gradients within float32 rounding (the
    sums over samples are regrouped)."""
    rng = np.random.default_rng(9)
    shape = (3, 2, 5, 4)
    x = rng.standard_normal(shape).astype(np.float32)
    probe = conv(num_output=4, pad=1)
    probe.setup([shape], "cuda")
    col = probe.k * probe.out_h * probe.out_w * 4
    dy = rng.standard_normal(probe.top_shapes[0]).astype(np.float32)
    params = random_bias(probe, rng)
    results = {}
    partials = 2 * probe.num_output * probe.k * 4     # the weight gradient's split-K sums
    for name, workspace, chunk in (("one sample", 64 * MiB, 0),
                                   ("chunks of 2", 2 * col + partials, 2),
                                   ("all 3", 64 * MiB, 3)):
        layer = conv(num_output=4, pad=1, max_workspace=workspace)
        if chunk == 0:
            monkeypatch.setattr(layer, "_batch_chunk", lambda n: 0)
        results[name] = forward_backward("cuda", layer, x, dy, params, device_kind="cuda")
        assert layer._batch_chunk(shape[0]) == chunk
        if chunk:   # 4x18 weights are one tile: each sample's share summed apart, then in order
            assert layer._dw_splits(chunk) == (chunk, 1) and layer._dw_splits(1) == (1, 1)
    expected = results["one sample"]
    for name in ("chunks of 2", "all 3"):
        got = results[name]
        np.testing.assert_array_equal(got[0], expected[0], err_msg=name)
        np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-5, err_msg=name)
        for key in expected[2]:
            np.testing.assert_allclose(got[2][key], expected[2][key], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} {key}")


@pytest.mark.cuda
def test_cuda_weight_gradient_splits_each_samples_plane_where_the_samples_are_few(monkeypatch):
    """Where a chunk's samples alone give the weight gradient too few blocks (a few large
    images), each sample's plane is split into spans as well (``shapes.split_k``'s ``k_parts``,
    here with spans of 16 outputs instead of 512): forward and dx bit for bit the unsplit
    layer's, the weight and bias gradients within float32 rounding (regrouped sums), and the
    partials taken from the workspace."""
    from minilms.kernels import shapes
    rng = np.random.default_rng(12)
    shape = (2, 2, 8, 8)                        # planes of 64 outputs: 4 spans of 16
    x = rng.standard_normal(shape).astype(np.float32)
    results = {}
    for name, least_span in (("split", 16), ("whole", 10**9)):
        monkeypatch.setattr(shapes, "MIN_K_SPAN", least_span)
        layer = conv(num_output=4, pad=1)
        layer.setup([shape], "cuda")
        groups, parts = layer._dw_splits(layer._batch_chunk(shape[0]))
        assert (groups, parts > 1) == (2, name == "split"), (groups, parts)
        assert layer.partials == groups * parts * layer.num_output * layer.k
        if name == "split":
            dy = rng.standard_normal(layer.top_shapes[0]).astype(np.float32)
            params = random_bias(layer, rng)
        results[name] = forward_backward("cuda", conv(num_output=4, pad=1), x, dy, params,
                                         device_kind="cuda")
    split, whole = results["split"], results["whole"]
    np.testing.assert_array_equal(split[0], whole[0])
    np.testing.assert_array_equal(split[1], whole[1])
    for key in whole[2]:
        np.testing.assert_allclose(split[2][key], whole[2][key], rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_cuda_pointwise_reads_its_input_as_the_columns():
    """A 1x1 convolution of stride 1 set up for cuda: no columns in its workspace (only the
    weight gradient's split-K sums), no im2col, col2im or zeroing launched, and the results of
    the same layer run as im2col + GEMM (set up for either device): forward and dx bit for bit
    (each output is one dot product in the same order), the gradients within float32 rounding."""
    from minilms.kernels.common import counting_launches
    rng = np.random.default_rng(10)
    shape = (3, 5, 4, 3)
    x = rng.standard_normal(shape).astype(np.float32)
    probe = conv(num_output=6, kernel_size=1)
    probe.setup([shape], "cuda")
    assert probe.pointwise_cuda and probe.elements == max(1, probe.partials)
    assert probe._batch_chunk(shape[0]) == 3
    dy = rng.standard_normal(probe.top_shapes[0]).astype(np.float32)
    params = random_bias(probe, rng)
    with counting_launches() as launches:
        got = forward_backward("cuda", conv(num_output=6, kernel_size=1), x, dy, params,
                               device_kind="cuda")
    assert not {"im2col_batch_kernel", "col2im_batch_kernel", "fill_cuda"} & set(launches)
    expected = forward_backward("cuda", conv(num_output=6, kernel_size=1), x, dy, params)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    for key in expected[2]:
        np.testing.assert_allclose(got[2][key], expected[2][key], rtol=1e-5, atol=1e-5)
    for stride_or_pad in (dict(stride=2), dict(pad=1)):   # these still need their columns
        other = conv(num_output=6, kernel_size=1, **stride_or_pad)
        other.setup([shape], "cuda")
        assert not other.pointwise_cuda
