"""Convolution's engines against each other: ``engine: auto`` (the cpu device's direct kernels
where they pay) and ``engine: reference`` (im2col + GEMM) on random geometries, float32 on the
cpu device, forward and every gradient; and the option itself."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minilms.kernels import conv_cpu
from minilms.layers import ShapeError
from minilms.layers.convolution import Convolution
from minilms.layers.run import LayerRun

from ..devices import new_device
from ..kernels.conv_geometry import Geometry, geometries

MiB = 2**20
# 16 channels, 3x3, stride 1, pad 1 on 8x8: every direct path of the engine applies
SAME_3X3 = Geometry(2, 16, 8, (3, 3), (1, 1), (1, 1), (1, 1), 8, 8)


def layer(g, engine, bias=True, max_workspace=64 * MiB):
    conv = Convolution("conv", ["x"], ["y"], num_output=g.o, kernel_size=list(g.kernel),
                       stride=list(g.stride), pad=list(g.pad), dilation=list(g.dilation),
                       bias=bias, engine=engine, max_workspace=max_workspace)
    conv.setup([(g.n, g.c, g.height, g.width)])
    return conv


def run(conv, x, dy, params):
    with new_device("cpu", 64 * MiB) as device:
        runner = LayerRun(device, conv, [x.shape], dtype=x.dtype)
        for key, value in params.items():
            runner.set_param(key, value)
        y = runner.forward([x])[0].copy()
        (dx,), grads = runner.backward([dy])
        return y, dx.copy(), {k: v.copy() for k, v in grads.items()}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=geometries(samples=(1, 20), channels=(1, 24), outputs=(1, 20), kernel_h=(1, 5),
                    kernel_w=(1, 5), stride_h=(1, 3), height=(1, 14), width=(1, 14)),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_auto_engine_equals_reference_engine(g, bias, seed):
    """The same layer with each engine: outputs and gradients agree to float32 rounding (sums in
    another order), on geometries that take every direct path (transposed input gradient,
    samples in lanes, prepared or in-place input) and many that take none."""
    if not g.has_output:
        return
    rng = np.random.default_rng(seed)
    auto, reference = layer(g, "auto", bias), layer(g, "reference", bias)
    assert reference.fast is None and auto.fast is not None
    assert auto.elements >= reference.elements     # room for the engine, never less
    x = rng.standard_normal((g.n, g.c, g.height, g.width)).astype(np.float32)
    dy = rng.standard_normal(auto.top_shapes[0]).astype(np.float32)
    params = {"weight": rng.standard_normal(auto.params()[0].shape).astype(np.float32)}
    if bias:
        params["bias"] = rng.standard_normal(g.o).astype(np.float32)
    got, want = run(auto, x, dy, params), run(reference, x, dy, params)
    scale = np.sqrt(g.c * g.kernel[0] * g.kernel[1])   # sums of that many unit-variance terms
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)
    assert got[2].keys() == want[2].keys()
    for key in want[2]:
        np.testing.assert_allclose(got[2][key], want[2][key], rtol=1e-4,
                                   atol=1e-5 * scale * np.sqrt(g.n * auto.out_h * auto.out_w))


def test_reference_engine_runs_im2col_and_gemm_only(monkeypatch):
    """``engine: reference`` never calls the direct kernels: with them broken, it still runs."""
    from minilms.kernels.direct import engine as direct_engine
    g = SAME_3X3
    conv = layer(g, "reference")

    def broken(*args, **kwargs):
        raise AssertionError("the direct engine ran")
    monkeypatch.setattr(direct_engine.DirectConvolution, "forward", broken)
    monkeypatch.setattr(direct_engine.DirectConvolution, "backward", broken)
    calls = []
    real = conv_cpu.conv_forward
    monkeypatch.setattr(conv_cpu, "conv_forward", lambda *a: calls.append(1) or real(*a))
    x = np.ones((g.n, g.c, g.height, g.width), np.float32)
    params = {"weight": np.ones(conv.params()[0].shape, np.float32),
              "bias": np.zeros(g.o, np.float32)}
    y, _, _ = run(conv, x, np.ones(conv.top_shapes[0], np.float32), params)
    assert calls and y[0, 0, 4, 4] == g.c * 9          # an inside pixel: every tap reads a one


def test_auto_engine_takes_the_forward():
    """``engine: auto`` on a float32 cpu layer: the direct forward runs, im2col does not."""
    g = SAME_3X3
    conv = layer(g, "auto")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conv_cpu, "conv_forward", None)   # would fail if called
        x = np.ones((g.n, g.c, g.height, g.width), np.float32)
        params = {"weight": np.ones(conv.params()[0].shape, np.float32),
                  "bias": np.zeros(g.o, np.float32)}
        y, _, _ = run(conv, x, np.ones(conv.top_shapes[0], np.float32), params)
    assert y[0, 0, 4, 4] == g.c * 9


def test_unknown_engine_is_a_shape_error_naming_the_option():
    with pytest.raises(ShapeError, match="engine"):
        Convolution("conv", ["x"], ["y"], num_output=2, kernel_size=3, engine="fast")


# -- workspace sized for the device the layer runs on ---------------------------------------------
def sized(g, device_kind, max_workspace=64 * MiB):
    conv = Convolution("conv", ["x"], ["y"], num_output=g.o, kernel_size=list(g.kernel),
                       stride=list(g.stride), pad=list(g.pad), bias=False,
                       max_workspace=max_workspace)
    conv.setup([(g.n, g.c, g.height, g.width)], device_kind)
    return conv


POINTWISE_LONG = Geometry(4, 16, 24, (1, 1), (1, 1), (0, 0), (1, 1), 16, 16)     # plane 256
POINTWISE_SHORT = Geometry(4, 16, 24, (1, 1), (1, 1), (0, 0), (1, 1), 7, 7)
THREE_BY_THREE = Geometry(4, 16, 16, (3, 3), (1, 1), (1, 1), (1, 1), 12, 12)
FEW_CHANNELS = Geometry(4, 3, 8, (7, 7), (2, 2), (3, 3), (1, 1), 20, 20)     # a first layer


def test_cpu_workspace_is_the_engines_where_it_runs_everything():
    """Set up for ``cpu``: no im2col columns where the engine runs the whole step (a 1x1
    convolution over long planes needs none at all; short planes, their side-by-side columns;
    3x3 the direct kernels' prepared input), the reference's where it does not (a first layer's
    input gradient would be im2col's). ``None`` sizes for every path, as before; ``cuda`` for
    one sample at a time, no chunks."""
    for g in (POINTWISE_LONG, POINTWISE_SHORT, THREE_BY_THREE):
        cpu, either = sized(g, "cpu"), sized(g, None)
        assert cpu.engine_only and not either.engine_only
        assert cpu.elements <= either.elements, g   # equal for short planes: the same columns
        assert cpu.elements == max(cpu.fast.elements, 1)
    for g in (POINTWISE_LONG, THREE_BY_THREE):
        assert sized(g, "cpu").elements < sized(g, None).elements
    assert sized(POINTWISE_LONG, "cpu").elements == 1
    short = sized(POINTWISE_SHORT, "cpu")   # a small weight: no slots, the chunk's columns
    assert short.fast.slots == 1
    assert short.elements == short.chunk * (16 + 24) * 49
    first = sized(FEW_CHANNELS, "cpu")
    assert not first.engine_only and first.elements == sized(FEW_CHANNELS, None).elements
    pointwise = sized(POINTWISE_LONG, "cuda")    # its input is its columns: split-K sums only
    assert pointwise.pointwise_cuda and pointwise.chunk == 0
    assert pointwise.elements == pointwise.partials == POINTWISE_LONG.n * 24 * 16
    assert pointwise._batch_chunk(POINTWISE_LONG.n) == POINTWISE_LONG.n
    for g in (THREE_BY_THREE, FEW_CHANNELS):
        cuda = sized(g, "cuda")
        assert cuda.chunk == 0 and not cuda.fast.pointwise and not cuda.pointwise_cuda
        plane = cuda.out_h * cuda.out_w
        # the whole batch's columns (no bias: no ones), the batched path's chunk of samples, and
        # the weight gradient's split-K partial sums (one tile of weights: one per sample)
        weights = cuda.num_output * cuda.k
        assert cuda.partials == g.n * weights
        assert cuda.elements == g.n * cuda.k * plane + cuda.partials
        assert cuda._batch_chunk(g.n) == g.n
        room = 2 * cuda.k * plane + 2 * weights                 # for two samples and their sums
        tight = sized(g, "cuda", max_workspace=4 * room)
        assert tight.elements == room and tight._batch_chunk(g.n) == 2
        one = sized(g, "cuda", max_workspace=4 * cuda.k * plane)    # one sample, no room to split
        assert one.partials == 0 and one._batch_chunk(g.n) == 1 and one._dw_splits(1) == (1, 1)


@pytest.mark.parametrize("g", [POINTWISE_LONG, POINTWISE_SHORT, THREE_BY_THREE],
                         ids=["1x1 long", "1x1 short", "3x3"])
def test_cpu_sized_layer_computes_what_the_layer_sized_for_either_does(g):
    """The same engine paths: the forward bit for bit (every output computed alone), the
    gradients to float32 rounding (a smaller workspace may take the samples in more calls)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((g.n, g.c, g.height, g.width)).astype(np.float32)
    results = []
    for kind in ("cpu", None):
        conv = sized(g, kind)
        dy = np.random.default_rng(8).standard_normal(conv.top_shapes[0]).astype(np.float32)
        params = {"weight": np.random.default_rng(9).standard_normal(
            conv.params()[0].shape).astype(np.float32)}
        with new_device("cpu", 64 * MiB) as device:
            runner = LayerRun(device, conv, [x.shape], device_kind=kind)
            runner.set_param("weight", params["weight"])
            y = runner.forward([x])[0].copy()
            (dx,), grads = runner.backward([dy])
            results.append((y, dx.copy(), grads["weight"].copy()))
    (y1, dx1, dw1), (y2, dx2, dw2) = results
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_allclose(dx1, dx2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw1, dw2, rtol=1e-5, atol=1e-4)


def test_a_layer_sized_for_the_cpu_engine_refuses_the_reference_path():
    """Float64 data (the engine takes float32 only) on a layer sized for the engine alone: one
    clear error naming the workspace, not an overrun."""
    conv = sized(THREE_BY_THREE, "cpu")
    with new_device("cpu", 64 * MiB) as device:
        runner = LayerRun(device, conv, [(4, 16, 12, 12)], dtype=np.float64, device_kind="cpu")
        with pytest.raises(ShapeError, match="workspace.*sized for the cpu device's float32 "
                                             "engine.*float64 data on cpu"):
            runner.forward([np.ones((4, 16, 12, 12))])


@pytest.mark.cuda
def test_a_layer_sized_for_cuda_runs_there_one_sample_at_a_time():
    """Set up for ``cuda`` (no chunks, one sample's columns): the simulator's forward and
    backward equal the cpu's (sized for either) to float32 rounding."""
    g = Geometry(2, 3, 4, (3, 3), (2, 2), (1, 1), (1, 1), 5, 5)
    rng = np.random.default_rng(10)
    x = rng.standard_normal((g.n, g.c, g.height, g.width)).astype(np.float32)
    weight = rng.standard_normal((g.o, g.c, 3, 3)).astype(np.float32)
    results = []
    for kind, sized_for in (("cuda", "cuda"), ("cpu", None)):
        conv = sized(g, sized_for)
        dy = np.random.default_rng(11).standard_normal(conv.top_shapes[0]).astype(np.float32)
        with new_device(kind, 16 * MiB) as device:
            runner = LayerRun(device, conv, [x.shape], device_kind=sized_for)
            runner.set_param("weight", weight)
            y = runner.forward([x])[0].copy()
            (dx,), grads = runner.backward([dy])
            results.append((y, dx.copy(), grads["weight"].copy()))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# (name, geometry, the engine's flag that must take it): layers whose one sample's im2col columns
# exceed the workspace given (GoogLeNet at 2240x2240), which a path sized on its own still takes
NO_CHUNK = [
    ("1x1", Geometry(2, 16, 16, (1, 1), (1, 1), (0, 0), (1, 1), 16, 16), "pointwise"),
    ("1x1 stride 2", Geometry(2, 16, 8, (1, 1), (2, 2), (0, 0), (1, 1), 32, 32), "pointwise"),
    ("3x3 stride 2, 48 channels", Geometry(2, 48, 16, (3, 3), (2, 2), (1, 1), (1, 1), 28, 28),
     "window_slots"),
    ("a stem", Geometry(2, 3, 32, (7, 7), (2, 2), (3, 3), (1, 1), 112, 112), "band_slots"),
]


@pytest.mark.parametrize("name, g, path", NO_CHUNK, ids=[case[0] for case in NO_CHUNK])
def test_the_engine_takes_a_layer_whose_columns_do_not_fit_a_sample(name, g, path):
    """With ``max_workspace`` below one sample's columns (``chunk`` 0, im2col + GEMM in bands of
    rows), the engine's paths that size their own buffers still run the layer whole, in less
    workspace than the bands of columns, with the reference engine's results; a layer set up for
    cuda takes none of them."""
    def columns_per_sample(conv):
        return (conv.k + conv.num_output) * conv.out_h * conv.out_w * 4

    probe = layer(g, "reference")
    budget = columns_per_sample(probe) - 4096       # not one sample's columns
    auto = Convolution("conv", ["x"], ["y"], num_output=g.o, kernel_size=list(g.kernel),
                       stride=list(g.stride), pad=list(g.pad), max_workspace=budget)
    auto.setup([(g.n, g.c, g.height, g.width)], device_kind="cpu")
    assert auto.chunk == 0 and auto.engine_only and getattr(auto.fast, path), (name, path)
    reference = layer(g, "reference", max_workspace=budget)
    assert auto.elements < reference.elements
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal((g.n, g.c, g.height, g.width)).astype(np.float32)
    dy = rng.standard_normal(auto.top_shapes[0]).astype(np.float32)
    params = {"weight": rng.standard_normal(auto.params()[0].shape).astype(np.float32),
              "bias": rng.standard_normal(g.o).astype(np.float32)}
    got, want = run(auto, x, dy, params), run(reference, x, dy, params)
    for a, b in zip((got[0], got[1], *got[2].values()), (want[0], want[1], *want[2].values())):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))
    on_cuda = Convolution("conv", ["x"], ["y"], num_output=g.o, kernel_size=list(g.kernel),
                          stride=list(g.stride), pad=list(g.pad), max_workspace=budget)
    on_cuda.setup([(g.n, g.c, g.height, g.width)], device_kind="cuda")
    assert not (on_cuda.fast.pointwise or on_cuda.fast.window_slots or on_cuda.fast.band_slots
                or on_cuda.fast.winograd_slots or on_cuda.engine_only)


# The direct paths' inputs as either vector width lays them out: rows mode, flat mode (rows of
# 20 outputs leave lanes empty at 8 and at 16), rows of 24 outputs (flat and a prepared copy at
# 16 lanes, x itself in rows at 8), stride 2, dx with samples in lanes (stride 2, 16+ channels,
# half a vector of samples or more).
WIDTH_CASES = [Geometry(3, 16, 8, (3, 3), (1, 1), (1, 1), (1, 1), 16, 16),
               Geometry(2, 4, 6, (5, 5), (1, 1), (2, 2), (1, 1), 12, 20),
               Geometry(2, 4, 6, (3, 3), (1, 1), (0, 0), (1, 1), 10, 26),
               Geometry(2, 3, 5, (3, 3), (2, 2), (1, 0), (1, 1), 11, 13),
               Geometry(10, 16, 4, (3, 3), (2, 2), (1, 1), (1, 1), 30, 32)]


@pytest.mark.parametrize("g", WIDTH_CASES)
def test_either_vector_width_runs_in_the_workspace_sized_for_the_widest(g, monkeypatch):
    """Workspaces are sized for ``SIZE_LANES`` (16) whatever the host's ``VL``: a layer's, and
    so a plan's, figures are the same on an AVX2 and an AVX-512 host. The kernels at either
    width run in that workspace and equal the reference engine."""
    from minilms.kernels.direct import conv as direct_conv
    from minilms.kernels.direct import input_grad, vector_ir
    rng = np.random.default_rng(5)
    x = rng.standard_normal((g.n, g.c, g.height, g.width)).astype(np.float32)
    reference = layer(g, "reference")
    dy = rng.standard_normal(reference.top_shapes[0]).astype(np.float32)
    params = {"weight": rng.standard_normal(reference.params()[0].shape).astype(np.float32),
              "bias": rng.standard_normal(g.o).astype(np.float32)}
    want = run(reference, x, dy, params)
    elements = set()
    for lanes in (8, 16):
        monkeypatch.setattr(direct_conv, "VL", lanes)
        monkeypatch.setattr(input_grad, "VL", lanes)
        monkeypatch.setattr(vector_ir, "VL", lanes)     # the rules' host_lanes()
        direct_conv._kernel_inputs.cache_clear()    # layouts cached per shape, at one width
        direct_conv.tile_table.cache_clear()
        try:
            auto = layer(g, "auto")
            elements.add(auto.elements)
            for step in (1, 2):
                assert direct_conv.padded_size(x.shape, *auto._geometry(), max_step=step) <= \
                    direct_conv.padded_size(x.shape, *auto._geometry(), max_step=step, vl=16)
            got = run(auto, x, dy, params)
        finally:
            monkeypatch.undo()
            direct_conv._kernel_inputs.cache_clear()
            direct_conv.tile_table.cache_clear()
        for a, b in zip(got[:2], want[:2]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        for key in want[2]:
            np.testing.assert_allclose(got[2][key], want[2][key], rtol=1e-4, atol=1e-3)
    assert len(elements) == 1


@settings(max_examples=200, deadline=None)
@given(g=geometries(samples=(1, 40), channels=(1, 64), outputs=(1, 64), kernel_h=(1, 7),
                    kernel_w=(1, 7), stride_h=(1, 3), height=(1, 40), width=(1, 40)))
def test_a_prepared_input_at_8_lanes_never_needs_more_room_than_at_16(g):
    """What lets the workspace be sized for 16 lanes on every host (``SIZE_LANES``): 8 lanes
    prepare a copy only where 16 do, and never a larger one (forward, weight gradient, and
    ``dy`` as the transposed convolution's input)."""
    from minilms.kernels.direct import conv as direct_conv
    from minilms.kernels.direct import input_grad
    if not g.has_output:
        return
    geometry = (g.kernel, g.stride, g.pad, g.dilation)
    shapes = [((g.n, g.c, g.height, g.width), geometry)]
    transposed = input_grad.transposed_geometry(geometry)
    if transposed is not None:
        shapes.append(((g.n, g.o, g.out_h, g.out_w), transposed))
    for shape, geo in shapes:
        for step in (1, 2):
            assert direct_conv.padded_size(shape, *geo, max_step=step, vl=8) <= \
                direct_conv.padded_size(shape, *geo, max_step=step, vl=16)
