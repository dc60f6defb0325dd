"""Winograd's F(m x m, 3 x 3) convolution (``kernels.direct.winograd``) against float64
references that share no code with it (one einsum per tap), for m = 2 and 4: the written-out
transforms against the matrices, the matrices against the direct correlation, forward, input,
weight and bias gradients on random shapes (tiles in blocks of a sample, or samples in groups),
garbage in the workspace, a sample's outputs whatever the chunk around it, the library and the
threads; where the engine takes it, and the layer's ``auto`` engine against ``reference``."""
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms.kernels import cblas, mkl
from minilms.kernels.direct import DirectConvolution, winograd, winograd_tiles
from minilms.kernels.direct.rules import winograd as winograd_rules
from minilms.layers.convolution import Convolution

from ..layers.test_convolution_engines import run as run_layer
from .test_conv_direct import reference, reference_input_grad
from .test_conv_weight_grad import reference as reference_weight_grad

MiB = 2**20
LIBRARIES = [name for name in mkl.CHOICES if cblas.sgemm(name) is not None]
# F(4, 3)'s transforms have entries up to 8 and 1/24: about ten times F(2, 3)'s rounding
TOLERANCE = {2: 1e-5, 4: 1e-4}


@pytest.fixture
def tiles(monkeypatch):
    """``tiles(m)``: the layers built after it take F(m, 3) (the rule picks it by the plane)."""
    return lambda m: monkeypatch.setattr(winograd_rules, "tile_size", lambda *args: m)


def geometry(pad):
    return (3, 3), (1, 1), (pad, pad), (1, 1)


def run(x, weight, bias, dy, pad, slots, batch=None, first=0):
    """Forward and backward through a NaN-filled workspace into NaN-filled outputs, so that
    anything read before it is written, or left unwritten, shows; ``x`` the layer's samples
    from ``first`` on, of ``batch``."""
    batch = x.shape[0] if batch is None else batch
    work = np.full(winograd.workspace_elements((batch,) + x.shape[1:], weight.shape, pad, slots),
                   np.nan, np.float32)
    y = np.full(dy.shape, np.nan, np.float32)
    dx, dw = np.full_like(x, np.nan), np.full_like(weight, np.nan)
    db = None if bias is None else np.full(weight.shape[0], np.nan, np.float32)
    winograd.forward(x, weight, bias, y, work, slots, geometry(pad), batch, first)
    work[:] = np.nan
    winograd.backward(x, dy, weight, dx, dw, db, work, slots, geometry(pad), batch, first)
    return y, dx, dw, db


def correlate(d, g):
    """The valid 3x3 correlation of a square patch ``d`` with ``g``, float64, by loops."""
    size = d.shape[0] - 2
    return np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(size)]
                     for i in range(size)])


@pytest.mark.parametrize("m", [2, 4])
def test_the_matrices_compute_the_correlation(m):
    """``A^T [(G g G^T) * (B^T d B)] A`` is the correlation of ``d`` with ``g``: the
    matrices themselves, in float64."""
    bt, g, at = winograd_tiles.matrices(m, np.float64)
    rng = np.random.default_rng(m)
    for _ in range(5):
        d, kernel = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
        tile = at @ ((g @ kernel @ g.T) * (bt @ d @ bt.T)) @ at.T
        np.testing.assert_allclose(tile, correlate(d, kernel), rtol=1e-12, atol=1e-12)
    k = winograd.kernel_matrix(m).astype(np.float64)
    np.testing.assert_allclose(k @ kernel.ravel(), (g @ kernel @ g.T).ravel(), rtol=1e-6)
    np.testing.assert_allclose(winograd.kernel_matrix(m, turned=True) @ kernel.ravel(),
                               (g @ kernel[::-1, ::-1] @ g.T).ravel(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("grad", [False, True])
def test_the_written_out_transforms_are_the_matrices(m, grad):
    """``turn_tiles`` (``B^T d B``, or ``A e A^T`` for ``dy``'s tiles) and ``untile`` (``A^T M
    A``) against the matrices of ``matrices``, tile by tile, on tiles that cross a row of
    tiles, at an offset into the block."""
    bt, _, at = winograd_tiles.matrices(m, np.float64)
    turn = at.T if grad else bt
    window, alpha, channels, tiles_w, rows_of_tiles = turn.shape[1], m + 2, 5, 3, 2
    rng = np.random.default_rng(10 * m + grad)
    src = rng.standard_normal((m * rows_of_tiles + 2, m * tiles_w + 2, channels)).astype(
        np.float32)
    first, count, at_column = 1, 4, 2
    v = np.full((alpha * alpha, at_column + count + 1, channels), np.nan, np.float32)
    winograd_tiles.turn_tiles(src, first, count, tiles_w, m, grad, v, at_column)
    mm = rng.standard_normal(v.shape).astype(np.float32)
    yt = np.full((m * rows_of_tiles, m * tiles_w, channels), np.nan, np.float32)
    winograd_tiles.untile(mm, at_column, first, count, tiles_w, m, yt)
    for k in range(count):
        r, s = divmod(first + k, tiles_w)
        d = src[m * r:m * r + window, m * s:m * s + window].astype(np.float64)
        want = np.einsum("ia,abc,jb->ijc", turn, d, turn).reshape(alpha * alpha, channels)
        np.testing.assert_allclose(v[:, at_column + k], want, rtol=1e-5, atol=1e-5)
        tile = np.einsum("pi,ijc,qj->pqc", at, mm[:, at_column + k].astype(np.float64).reshape(
            alpha, alpha, channels), at)
        np.testing.assert_allclose(yt[m * r:m * r + m, m * s:m * s + m], tile, rtol=1e-5,
                                   atol=1e-4)
    assert np.isnan(v[:, :at_column]).all() and np.isnan(v[:, at_column + count:]).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 9), st.integers(1, 9), st.integers(1, 19),
       st.integers(1, 19), st.integers(0, 2), st.sampled_from([2, 4]), st.integers(1, 3),
       st.booleans(), st.integers(0, 2**31 - 1))
def test_matches_the_definition(n, c, o, height, width, pad, m, slots, with_bias, seed):
    if height + 2 * pad < 3 or width + 2 * pad < 3:
        return
    winograd_tile = winograd_rules.tile_size
    winograd_rules.tile_size = lambda *args: m
    try:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((n, c, height, width)).astype(np.float32)
        weight = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
        bias = rng.standard_normal(o).astype(np.float32) if with_bias else None
        out_h, out_w = height + 2 * pad - 2, width + 2 * pad - 2
        dy = rng.standard_normal((n, o, out_h, out_w)).astype(np.float32)
        y, dx, dw, db = run(x, weight, bias, dy, pad, slots)
    finally:
        winograd_rules.tile_size = winograd_tile
    tol, args = TOLERANCE[m], geometry(pad)
    want_y = reference(x, weight, np.zeros(o) if bias is None else bias, *args[1:])
    np.testing.assert_allclose(y, want_y, rtol=tol, atol=tol * np.sqrt(9 * c))
    want_dx = reference_input_grad(dy, weight, x.shape, *args[1:])
    np.testing.assert_allclose(dx, want_dx, rtol=tol, atol=tol * np.sqrt(9 * o))
    want_dw, want_db = reference_weight_grad(x, dy, *args)
    terms = np.sqrt(n * out_h * out_w)
    np.testing.assert_allclose(dw, want_dw, rtol=tol, atol=tol * terms)
    if with_bias:
        np.testing.assert_allclose(db, want_db, rtol=1e-5, atol=1e-5 * terms)


@pytest.mark.parametrize("m", [2, 4])
def test_the_forwards_kernel_either_way_round(tiles, monkeypatch, m):
    """The forward with its transformed kernel kept ``[C, O]`` (``V @ U``, from the weights
    with their channels swapped) and ``[O, C]`` (``V @ U^T``): each against the definition, the
    two kernels each other's transpose; the rule keeps F(4, 3)'s ``[C, O]``."""
    tiles(m)
    rng = np.random.default_rng(m)
    x = rng.standard_normal((3, 5, 9, 9)).astype(np.float32)
    weight = rng.standard_normal((7, 5, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(7).astype(np.float32)
    want = reference(x, weight, bias, *geometry(1)[1:])
    ys, kernels = [], []
    for swapped in (False, True):
        monkeypatch.setattr(winograd, "kernel_untransposed", lambda m, swapped=swapped: swapped)
        work = np.full(winograd.workspace_elements(x.shape, weight.shape, 1, 2), np.nan,
                       np.float32)
        y = np.full(want.shape, np.nan, np.float32)
        winograd.forward(x, weight, bias, y, work, 2, geometry(1), 3)
        np.testing.assert_allclose(y, want, rtol=TOLERANCE[m], atol=TOLERANCE[m] * np.sqrt(45))
        ys.append(y)
        u = winograd._kernel(np.empty(winograd.kernel_size(weight.shape, m), np.float32),
                             weight, m, swapped)
        winograd.transform_weights(weight, u, m, False, 2, swapped)
        kernels.append(u)
    assert kernels[0].shape == (m * m + 4 * m + 4, 7, 5) and kernels[1].shape[1:] == (5, 7)
    np.testing.assert_allclose(kernels[1], kernels[0].transpose(0, 2, 1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ys[1], ys[0], rtol=1e-5, atol=1e-5)
    assert winograd_rules.kernel_untransposed(4) and not winograd_rules.kernel_untransposed(2)


def assert_split_is_whole(x, weight, dy, library, splits, dw_atol=1e-3):
    """The step split at each ``(cuts, threads)`` of ``splits`` (``threads`` None: all of
    them) against the whole step on ``library``: forward and input gradient bit for bit (a
    sample's rows at the same place of the same products: even a library whose rows' bits move
    with their place keeps them), the weight gradient within ``dw_atol``."""
    chosen, threads = mkl.chosen(), numba.get_num_threads()
    try:
        mkl.use(library)
        whole = run(x, weight, None, dy, 1, 3)
        for cuts, count in splits:
            numba.set_num_threads(count or threads)
            parts = [run(x[a:b], weight, None, dy[a:b], 1, 3, batch=x.shape[0], first=a)
                     for a, b in zip(cuts, cuts[1:])]
            for i, what in ((0, "forward"), (1, "input gradient")):
                np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), whole[i],
                                              f"{what}, cuts {cuts}, {count} threads")
            np.testing.assert_allclose(sum(p[2] for p in parts), whole[2], rtol=1e-3,
                                       atol=dw_atol)
    finally:
        numba.set_num_threads(threads)
        mkl.use(chosen)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(5, 22),
       st.integers(1, 19), st.integers(0, 2), st.sampled_from([2, 4]), st.integers(1, 3),
       st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_bands_of_tile_rows_match_the_definition(n, c, o, height, width, pad, m, slots,
                                                 band_rows, seed):
    """A worker over ``BAND_WORKER`` turns a sample in bands of tile rows (GoogLeNet's planes at
    2240x2240), each band a unit of work, the last one short where the rows do not divide:
    forward and gradients still the definition's, through NaN-filled buffers. (Small planes
    stand in for large ones: ``GROUP_TILES`` 1, so that none goes in groups.)"""
    if width + 2 * pad < 3:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, height, width)).astype(np.float32)
    weight = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    out_h, out_w = height + 2 * pad - 2, width + 2 * pad - 2
    dy = rng.standard_normal((n, o, out_h, out_w)).astype(np.float32)
    saved = winograd_rules.tile_size, winograd_rules.BAND_WORKER, winograd_rules.GROUP_TILES
    winograd_rules.tile_size, winograd_rules.GROUP_TILES = (lambda *args: m), 1
    try:
        forward = winograd_rules.layouts_of(x.shape, weight.shape, pad)[0]
        winograd_rules.BAND_WORKER = forward._size(band_rows)     # bands of band_rows tile rows
        forward = winograd_rules.layouts_of(x.shape, weight.shape, pad)[0]
        assert forward.band_rows == min(band_rows, forward.tiles_h)
        assert forward.bands == -(-forward.tiles_h // forward.band_rows)
        y, dx, dw, _ = run(x, weight, None, dy, pad, slots)
    finally:
        winograd_rules.tile_size, winograd_rules.BAND_WORKER, winograd_rules.GROUP_TILES = saved
    tol, args = TOLERANCE[m], geometry(pad)
    np.testing.assert_allclose(y, reference(x, weight, np.zeros(o), *args[1:]), rtol=tol,
                               atol=tol * np.sqrt(9 * c))
    np.testing.assert_allclose(dx, reference_input_grad(dy, weight, x.shape, *args[1:]),
                               rtol=tol, atol=tol * np.sqrt(9 * o))
    np.testing.assert_allclose(dw, reference_weight_grad(x, dy, *args)[0], rtol=tol,
                               atol=tol * np.sqrt(n * out_h * out_w))


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_samples_bands_do_not_depend_on_the_chunk_or_the_threads(tiles, library,
                                                                   monkeypatch):
    """In bands, as whole: a step split along the batch gives the whole step's forward and input
    gradient (bit for bit where the library keeps a row's bits, else to rounding), with one
    thread or several; the weight gradient to rounding. The bands' blocks are the layer's."""
    tiles(4)
    monkeypatch.setattr(winograd_rules, "BAND_WORKER", 1)         # a tile row a band
    rng = np.random.default_rng(11)
    n, c, o, h = 5, 12, 10, 22
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    weight = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((n, o, h, h)).astype(np.float32)
    layout = winograd_rules.layouts_of(x.shape, weight.shape, 1)[0]
    assert (layout.band_rows, layout.bands, layout.group) == (1, 6, 1)
    assert_split_is_whole(x, weight, dy, library, (((0, 1, 5), None), ((0, 2, 3, 5), 1)),
                          dw_atol=1e-3 * np.abs(run(x, weight, None, dy, 1, 3)[2]).max())


def test_a_plane_too_large_for_one_worker_goes_in_bands():
    """GoogLeNet's conv3 at 2240x2240 (64 channels in, 192 out, 560x560): whole, a worker would
    hold 83M elements; in bands it fits ``BAND_WORKER``, so the engine takes it within the
    layer's 64 MiB; at 224x224 the same layer's planes stay whole."""
    weight = (192, 64, 3, 3)
    big = winograd_rules.layouts_of((1, 64, 560, 560), weight, 1)
    assert all(layout.bands > 1 and layout.worker <= winograd_rules.BAND_WORKER for layout in big)
    assert big[0].bands * big[0].band_rows >= big[0].tiles_h > (big[0].bands - 1) * \
        big[0].band_rows
    assert winograd.slot_count((1, 64, 560, 560), weight, 1, 64 * MiB // 4) >= 2
    small = winograd_rules.layouts_of((8, 64, 56, 56), weight, 1)
    assert all(layout.bands == 1 and layout.band_rows == layout.tiles_h for layout in small)


@pytest.mark.parametrize("m", [2, 4])
def test_blocks_of_a_large_plane(tiles, m):
    """A plane of more than ``MAX_BLOCK`` tiles, in blocks of a sample's tiles."""
    tiles(m)
    rng = np.random.default_rng(m)
    x = rng.standard_normal((2, 6, 66, 70)).astype(np.float32)
    weight = rng.standard_normal((7, 6, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 7, 66, 70)).astype(np.float32)
    layout = winograd_rules.layouts_of(x.shape, weight.shape, 1)[0]
    assert layout.group == 1 and layout.block < layout.tiles
    y, dx, dw, _ = run(x, weight, None, dy, 1, 2)
    tol, args = TOLERANCE[m], geometry(1)
    np.testing.assert_allclose(y, reference(x, weight, np.zeros(7), *args[1:]), rtol=tol,
                               atol=tol * 8)
    np.testing.assert_allclose(dx, reference_input_grad(dy, weight, x.shape, *args[1:]),
                               rtol=tol, atol=tol * 8)
    np.testing.assert_allclose(dw, reference_weight_grad(x, dy, *args)[0], rtol=tol,
                               atol=tol * 40)


def test_gradients_it_is_not_asked_for_stay_untouched():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 6, 6)).astype(np.float32)
    weight = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((3, 5, 6, 6)).astype(np.float32)
    work = np.empty(winograd.workspace_elements(x.shape, weight.shape, 1, 2), np.float32)
    dx, dw = np.full_like(x, 7.0), np.full_like(weight, 7.0)
    winograd.backward(x, dy, weight, None, dw, None, work, 2, geometry(1), 3)
    assert np.all(dx == 7.0)
    winograd.backward(x, dy, weight, dx, None, None, work, 2, geometry(1), 3)
    np.testing.assert_allclose(dw, reference_weight_grad(x, dy, *geometry(1))[0], rtol=1e-4,
                               atol=1e-3)
    np.testing.assert_allclose(dx, reference_input_grad(dy, weight, x.shape, (1, 1), (1, 1),
                                                        (1, 1)), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("c, o, h, m", [(13, 23, 14, 2), (8, 8, 28, 4), (48, 16, 7, 4),
                                        (8, 8, 40, 2), (37, 29, 9, 4), (50, 70, 9, 2)])
def test_a_samples_results_do_not_depend_on_the_chunk_or_the_threads(tiles, library, c, o, h,
                                                                    m):
    """A step split along the batch gives the whole step's outputs and input gradient bit for
    bit, in groups of samples (the layer's groups: a chunk that starts inside one leaves its
    first places' rows zero, as a short group its last) and in blocks of a sample, with one
    thread or several, on either library; the weight gradient only to rounding (summed per
    worker). Odd channel counts: the kernel's transform cut into parts of 16 columns. (50, 70,
    9): a shape where OpenBLAS gave a row of a group's product other bits at its other place."""
    tiles(m)
    rng = np.random.default_rng(c + h)
    n = 9       # groups of 2 on the small planes, the last one short
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    weight = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((n, o, h, h)).astype(np.float32)
    assert_split_is_whole(x, weight, dy, library,
                          (((0, 1, 4, 9), None), ((0, 3, 5, 9), 1), ((0, 8, 9), None)))


def test_groups_and_blocks():
    """A plane of fewer than ``GROUP_TILES`` tiles goes in groups of samples, evened out over
    the batch: F(2, 3)'s shared by the workers, of about ``SHARED_TILES`` tiles; F(4, 3)'s
    leaving a group for each of ``MAX_SLOTS`` workers; a larger plane in equal blocks of at
    most ``MAX_BLOCK`` tiles. None depends on the chunk: the layouts are the layer's
    (``batch``)."""
    weight = (256, 256, 3, 3)
    layout = winograd_rules.layouts_of((8, 256, 14, 14), weight, 1)[0]      # F(2, 3): 49 tiles
    assert (layout.m, layout.group, layout.block, layout.shared) == (2, 8, 392, True)
    assert layout.rooms(4) == 1
    assert winograd_rules.layouts_of((3, 256, 14, 14), weight, 1, batch=8)[0].group == 8
    assert winograd_rules.layouts_of((64, 256, 14, 14), weight, 1)[0].group == 8  # 400 // 49
    assert winograd_rules.layouts_of((9, 256, 14, 14), weight, 1)[0].group == 5   # evened
    assert winograd_rules.layouts_of((3, 256, 14, 14), weight, 1)[0].group == 3
    small = winograd_rules.layouts_of((8, 128, 28, 28), (128, 128, 3, 3), 1)[0]  # F(4, 3): 49
    assert (small.m, small.group, small.block, small.shared) == (4, 2, 98, False)
    assert small.rooms(4) == 4
    big = winograd_rules.layouts_of((8, 64, 56, 56), (64, 64, 3, 3), 1)[0]   # F(4, 3): 196 tiles
    assert (big.m, big.group, big.block, big.shared) == (4, 1, 196, False)
    huge = winograd_rules.layouts_of((1, 8, 224, 224), (8, 8, 3, 3), 1)[0]   # 3136 tiles
    blocks = -(-huge.tiles // huge.block)
    assert blocks == -(-huge.tiles // winograd_rules.MAX_BLOCK)
    assert (blocks - 1) * huge.block < huge.tiles <= blocks * huge.block
    assert winograd._deal(7, 4, 2) in ([(0, 4), (4, 7)], [(0, 7)],
                                       [(0, 2), (2, 4), (4, 6), (6, 7)])
    # a chunk from the layer's sample 5, groups of 2: sample 5 alone in its group, then pairs
    assert winograd._places(5, 2, 1) == 1 and winograd._places(4, 2, 1) == 0
    assert winograd._places(5, 2, 3) == 0          # bands: a sample a unit
    threads = numba.get_num_threads()
    for count in range(1, numba.config.NUMBA_NUM_THREADS + 1):
        numba.set_num_threads(count)
        runs = winograd._deal(4, 4, 2, lead=1)      # the chunk's samples 0..3: places 1..4
        numba.set_num_threads(threads)
        assert runs[0][0] == 0 and runs[-1][1] == 4
        assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
        assert all((first + 1) % 2 == 0 for first, _ in runs[1:])   # whole groups after the first


@pytest.mark.parametrize("library", LIBRARIES)
def test_shared_groups_bits_do_not_depend_on_the_threads(monkeypatch, library):
    """Where the workers share a group (F(2, 3) on a small plane; ``SHARED_CHANNELS`` lowered
    here), every gradient's bits are the same with one thread or all, the weight gradient's too
    (a position's sum is one thread's); a split step's forward and input gradient are the whole
    step's; its workspace is one room whatever the slots."""
    monkeypatch.setattr(winograd_rules, "SHARED_CHANNELS", 16)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 24, 14, 14)).astype(np.float32)
    weight = rng.standard_normal((20, 24, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((5, 20, 14, 14)).astype(np.float32)
    assert all(layout.shared for layout in winograd_rules.layouts_of(x.shape, weight.shape, 1))
    threads = numba.get_num_threads()
    found = []
    try:
        for count in sorted({1, threads}):
            numba.set_num_threads(count)
            found.append(run(x, weight, None, dy, 1, winograd.MAX_SLOTS))
    finally:
        numba.set_num_threads(threads)
    for got in found[1:]:
        for a, b in zip(got[:3], found[0][:3]):
            assert np.array_equal(a, b)
    assert winograd.workspace_elements(x.shape, weight.shape, 1, 1) == \
        winograd.workspace_elements(x.shape, weight.shape, 1, winograd.MAX_SLOTS)
    y, dx, dw, _ = found[0]
    np.testing.assert_allclose(y, reference(x, weight, np.zeros(20), *geometry(1)[1:]),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, reference_weight_grad(x, dy, *geometry(1))[0], rtol=1e-4,
                               atol=1e-3)
    assert_split_is_whole(x, weight, dy, library, (((0, 1, 4, 5), None), ((0, 2, 5), 1)))
    monkeypatch.setattr(winograd_rules, "SHARED_CHANNELS", 25)        # 20 out: not shared
    assert not winograd_rules.layouts_of(x.shape, weight.shape, 1)[0].shared


def test_the_workspace_does_not_depend_on_the_threads():
    """The plan knows the workspace before the run: slots are fixed, not the thread count."""
    shape, weight = (16, 64, 28, 28), (64, 64, 3, 3)
    threads = numba.get_num_threads()
    try:
        counts = set()
        for count in (1, threads):
            numba.set_num_threads(count)
            counts.add(winograd.slot_count(shape, weight, 1, 2**30))
    finally:
        numba.set_num_threads(threads)
    assert counts == {winograd.MAX_SLOTS}
    assert winograd.slot_count((3,) + shape[1:], weight, 1, 2**30) == 3
    one = winograd.workspace_elements(shape, weight, 1, 1)
    assert winograd.slot_count(shape, weight, 1, one) == 1
    assert winograd.slot_count(shape, weight, 1, one - 1) == 0


def test_where_it_pays_and_which_tiles():
    """3x3 stride 1 on planes of 14x14 and more with 48 channels or more in and out; F(4, 3)
    where 4x4 tiles cover the plane as closely as 2x2 ones."""
    assert winograd.pays((64, 64, 3, 3), geometry(1), 56 * 56)
    assert winograd.pays((256, 256, 3, 3), geometry(1), 14 * 14)
    assert not winograd.pays((512, 512, 3, 3), geometry(1), 7 * 7)
    assert not winograd.pays((32, 64, 3, 3), geometry(1), 28 * 28)
    assert not winograd.pays((64, 16, 3, 3), geometry(1), 28 * 28)
    assert not winograd.applies((64, 64, 3, 3), ((3, 3), (2, 2), (1, 1), (1, 1)))
    assert not winograd.applies((64, 64, 5, 5), ((5, 5), (1, 1), (2, 2), (1, 1)))
    assert not winograd.applies((64, 64, 3, 3), ((3, 3), (1, 1), (1, 1), (2, 2)))
    assert not winograd.applies((64, 64, 3, 3), ((3, 3), (1, 1), (1, 0), (1, 1)))
    assert not winograd.applies((64, 64, 3, 3), ((3, 3), (1, 1), (3, 3), (1, 1)))
    assert winograd_rules.tile_size((64, 64, 3, 3), (56, 56)) == 4
    assert winograd_rules.tile_size((64, 64, 3, 3), (28, 28)) == 4
    assert winograd_rules.tile_size((64, 64, 3, 3), (14, 14)) == 2
    assert winograd_rules.tile_size((512, 512, 3, 3), (7, 7)) == 2      # 4 tiles of 4x4: too few


def test_the_engine_takes_it_where_it_pays_and_needs_no_columns():
    engine = DirectConvolution((8, 64, 28, 28), (64, 64, 3, 3), 1, geometry(1), chunk=8,
                               max_workspace=64 * MiB)
    assert engine.winograd_slots == winograd.MAX_SLOTS and engine.covers_all
    assert engine.window_slots == 0
    assert engine.elements == winograd.workspace_elements((8, 64, 28, 28), (64, 64, 3, 3), 1,
                                                          winograd.MAX_SLOTS)
    small = DirectConvolution((8, 16, 28, 28), (16, 16, 3, 3), 1, geometry(1), chunk=8,
                              max_workspace=64 * MiB)
    assert small.winograd_slots == 0
    # a workspace too small for one slot: the other paths (here the row windows)
    tight = DirectConvolution((8, 64, 28, 28), (64, 64, 3, 3), 1, geometry(1), chunk=8,
                              max_workspace=4 * 64 * 64 * 9 * 2 + 2**20)
    assert tight.winograd_slots == 0 and tight.window_slots > 0


def test_the_layer_runs_it_and_agrees_with_the_reference_engine(monkeypatch):
    """``engine: auto`` on a ResNet-like 3x3 (64 channels in, 48 out, 28x28, bias) runs
    Winograd's (im2col + GEMM and the row windows broken here) and agrees with ``engine:
    reference`` to float32 rounding."""
    from minilms.kernels import conv_cpu
    from minilms.kernels.direct import windows
    rng = np.random.default_rng(5)
    shape, out = (3, 64, 28, 28), 48
    x = rng.standard_normal(shape).astype(np.float32)
    params = {"weight": rng.standard_normal((out, 64, 3, 3)).astype(np.float32),
              "bias": rng.standard_normal(out).astype(np.float32)}
    dy = rng.standard_normal((3, out, 28, 28)).astype(np.float32)
    results = {}
    for engine in ("reference", "auto"):
        conv = Convolution("conv", ["x"], ["y"], num_output=out, kernel_size=3, pad=1,
                           engine=engine)
        conv.setup([shape], device_kind="cpu")
        with monkeypatch.context() as patch:
            if engine == "auto":
                assert conv.fast.winograd_slots and conv.engine_only
                for module, name in ((conv_cpu, "conv_forward"), (conv_cpu, "conv_backward"),
                                     (windows, "forward"), (windows, "backward")):
                    patch.setattr(module, name, None)
            results[engine] = run_layer(conv, x, dy, params)
    got, want = results["auto"], results["reference"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-3, atol=1e-3)
    for key in ("weight", "bias"):
        np.testing.assert_allclose(got[2][key], want[2][key], rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("library", LIBRARIES)
def test_cblas_sgemm_is_the_product(library):
    """``cblas.sgemm``'s function, called from a Numba kernel, gives numpy's product (both
    transposes); an unknown library has none."""
    from numba import njit

    @njit
    def product(gemm, a, b, out, trans_b):
        k = a.shape[1]
        gemm(cblas.ROW_MAJOR, cblas.NO_TRANS, cblas.TRANS if trans_b else cblas.NO_TRANS,
             a.shape[0], out.shape[1], k, 1.0, a.ctypes.data, k, b.ctypes.data, b.shape[1],
             0.0, out.ctypes.data, out.shape[1])

    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 19)).astype(np.float32)
    b = rng.standard_normal((19, 23)).astype(np.float32)
    out = np.empty((37, 23), np.float32)
    product(cblas.sgemm(library), a, b, out, False)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    bt = np.ascontiguousarray(b.T)
    product(cblas.sgemm(library), a, bt, out, True)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    assert cblas.sgemm("no such library") is None
