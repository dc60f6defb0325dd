"""Steps split along the batch (minilms.layers.split): every registered layer type declares how its
steps split, and a split step gives the unsplit step's results: bit for bit, except the outputs
its rule says are regrouped, which agree within a float tolerance; one chunk is always bit for
bit. Random shapes, chunk counts 1, 2, 3 and N and unequal chunk sizes, float32 and float64,
forward, test-mode forward and backward; BatchNorm's running statistics are updated once, and a
split Dropout draws the unsplit mask. A layer registered without a case here fails."""
import numpy as np
import pytest

from minilms.device import CpuDevice
from minilms.errors import ShapeError
from minilms.layers import LAYERS, Layer
from minilms.layers.run import LayerRun, SplitRun
from minilms.layers.split import (
    ACCUMULATE,
    KINDS,
    ONCE,
    STATISTICS,
    Pass,
    Phase,
    SplitRule,
    chunk_bounds,
    run_split,
    split_buffers,
)

from ..blas_bits import assert_bits_or_rounding
from ..devices import new_device

MiB = 2**20
SEEDS = range(3)
DTYPES = (np.float32, np.float64)
# Regrouped float sums (weight and bias gradients over the chunks), relative to the largest value:
# a handful of roundings of terms no larger than the sum's largest partial.
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-13}
NEVER_SPLIT: dict[str, str] = {}   # type -> why it declares no split (none today)

# Under the simulator, a GEMM tile that covers these small matrices in one block (conftest).
pytestmark = pytest.mark.usefixtures("small_gemm_tile")


def make(type_name, bottoms=("x",), tops=("y",), **options):
    return LAYERS[type_name]("l", list(bottoms), list(tops), **options)


def logits_and_labels(rng, n, dtype, classes=5, image=False):
    z = rng.standard_normal((n, classes, 1, 1) if image else (n, classes)).astype(dtype)
    labels = rng.integers(0, classes, n).astype(np.int32)
    return [z, labels]


def batch(rng, dtype, *shape):
    return rng.standard_normal(shape).astype(dtype)


def spread(rng, dtype, *shape):
    """Values of magnitudes 1e-3 to 1e3 around 1: their sums round differently in almost any other
    order, so a bitwise comparison sees a regrouped sum."""
    return (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape) + 1).astype(dtype)


# type -> cases: each case(rng, n, dtype) -> (layer, bottoms, propagate_down or None)
CASES = {
    "ReLU": [lambda rng, n, dt: (make("ReLU"), [batch(rng, dt, n, 3, 4, 5)], None)],
    "Eltwise": [lambda rng, n, dt: (make("Eltwise", ("a", "b", "c"), coeffs=[1.0, -2.0, 0.5]),
                                    [batch(rng, dt, n, 2, 3) for _ in range(3)], None)],
    "Flatten": [lambda rng, n, dt: (make("Flatten"), [batch(rng, dt, n, 2, 3, 4)], None)],
    "Concat": [lambda rng, n, dt: (make("Concat", ("a", "b")),
                                   [batch(rng, dt, n, 2, 3, 3), batch(rng, dt, n, 3, 3, 3)],
                                   [True, False])],
    "Dropout": [lambda rng, n, dt: (make("Dropout", ratio=0.3), [batch(rng, dt, n, 3, 7)], None)],
    "Pooling": [
        lambda rng, n, dt: (make("Pooling", pool="max", kernel_size=3, stride=2, pad=1,
                                 ceil_mode=True), [batch(rng, dt, n, 2, 7, 6)], None),
        lambda rng, n, dt: (make("Pooling", pool="ave", kernel_size=2, stride=1, pad=1,
                                 count_include_pad=False), [batch(rng, dt, n, 2, 5, 5)], None),
        lambda rng, n, dt: (make("Pooling", pool="ave", global_pooling=True),
                            [batch(rng, dt, n, 3, 4, 5)], None),
        lambda rng, n, dt: (make("Pooling", pool="max", global_pooling=True),
                            [batch(rng, dt, n, 3, 4, 5)], None)],
    "Convolution": [
        lambda rng, n, dt: (make("Convolution", num_output=4, kernel_size=3, pad=1),
                            [batch(rng, dt, n, 3, 6, 5)], None),
        lambda rng, n, dt: (make("Convolution", num_output=4, kernel_size=[3, 2], stride=2,
                                 groups=2, bias=False, engine="reference"),
                            [batch(rng, dt, n, 4, 7, 6)], None),
        lambda rng, n, dt: (make("Convolution", num_output=2, kernel_size=1),   # pointwise
                            [batch(rng, dt, n, 3, 4, 4)], None),
        # a workspace for less than one sample: one sample at a time, in bands of rows
        lambda rng, n, dt: (make("Convolution", num_output=3, kernel_size=3, pad=1,
                                 max_workspace=1200), [batch(rng, dt, n, 2, 8, 8)], None),
        # short planes with large weights: the forward (and the 1x1's dx) in slots
        lambda rng, n, dt: (make("Convolution", num_output=256, kernel_size=3, pad=1),
                            [batch(rng, dt, n, 256, 7, 7)], None),
        lambda rng, n, dt: (make("Convolution", num_output=512, kernel_size=1, stride=2),
                            [batch(rng, dt, n, 1024, 7, 7)], None),
        # a 3x3 into 14x14 with 48 channels: Winograd's (kernels/direct/winograd.py)
        lambda rng, n, dt: (make("Convolution", num_output=48, kernel_size=3, pad=1),
                            [batch(rng, dt, n, 48, 14, 14)], None)],
    "InnerProduct": [
        lambda rng, n, dt: (make("InnerProduct", num_output=5), [batch(rng, dt, n, 3, 2, 2)],
                            None),
        lambda rng, n, dt: (make("InnerProduct", num_output=3, bias=False),
                            [batch(rng, dt, n, 7)], None)],
    "BatchNorm": [
        lambda rng, n, dt: (make("BatchNorm"), [spread(rng, dt, n, 3, 4, 5)], None),
        lambda rng, n, dt: (make("BatchNorm", affine=False, momentum=0.3),
                            [spread(rng, dt, n, 4)], None),
        # no dx wanted: the parameter gradients alone (a BatchNorm fed by the data)
        lambda rng, n, dt: (make("BatchNorm"), [spread(rng, dt, n, 2, 9)], [False]),
        # a fused ReLU (minilms.fusion): the mask is taken a chunk at a time before the sums
        lambda rng, n, dt: (make("BatchNorm", relu=True), [spread(rng, dt, n, 3, 4, 5)], None),
        lambda rng, n, dt: (make("BatchNorm", relu=True), [spread(rng, dt, n, 2, 9)], [False])],
    "SoftmaxWithLoss": [
        lambda rng, n, dt: (make("SoftmaxWithLoss", ("z", "label"), ("loss",)),
                            logits_and_labels(rng, n, dt), [True, True]),
        lambda rng, n, dt: (make("SoftmaxWithLoss", ("z", "label"), ("loss",), loss_weight=0.5),
                            logits_and_labels(rng, n, dt, image=True), [True, False])],
    "Accuracy": [
        lambda rng, n, dt: (make("Accuracy", ("z", "label"), ("acc",)),
                            logits_and_labels(rng, n, dt), None),
        lambda rng, n, dt: (make("Accuracy", ("z", "label"), ("acc",), top_k=2),
                            logits_and_labels(rng, n, dt, classes=3), None)],
}


def chunkings(rng, n):
    """Chunk counts 1, 2, 3 and N (those <= N), and random unequal sizes."""
    counts = sorted({k for k in (1, 2, 3, n) if k <= n})
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(2, n - 1), replace=False))
    sizes = [int(s) for s in np.diff([0, *cuts, n])]
    return counts + [sizes]


def run_steps(run, bottoms, rng_seed, propagate_down, train=True):
    """Forward (and backward after a training forward): every output by name, as host arrays."""
    layer = run.layer
    out = {f"top{i}": t for i, t in enumerate(run.forward(bottoms, train=train))}
    if train:
        out.update({f"saved.{k}": b.host_data().copy() for k, b in run.saved.items()})
    out.update({f"param.{k}": run.param(k) for k in run.params})
    if train and layer.has_backward:
        grads_rng = np.random.default_rng(rng_seed)
        top_grads = [np.array([0.75]) if layer.is_loss else spread(grads_rng, np.float64, *s) - 1
                     for s in layer.top_shapes]
        dx, dparams = run.backward(top_grads, propagate_down)
        out.update({f"bottom_grad.{i}": g for i, g in enumerate(dx) if g is not None})
        out.update({f"param_grad.{k}": g for k, g in dparams.items()})
    return out


def fresh(layer_case, rng_seed, n, dtype):
    """The same layer and inputs again (a layer object is set up for one run)."""
    return layer_case(np.random.default_rng(rng_seed), n, dtype)


def set_params(run, seed):
    """Non-trivial affine parameters and running statistics, the same for every run."""
    rng = np.random.default_rng(seed)
    for name, spec in run.specs.items():
        value = rng.standard_normal(spec.shape)
        run.set_param(name, np.abs(value) + 0.5 if name == "running_var" else value)


def output(key):
    """An output's name as rules write it: ``top0`` -> ``top``, ``bottom_grad.1`` ->
    ``bottom_grad``, the rest as they are (``param_grad.weight``)."""
    if key.startswith("top"):
        return "top"
    return "bottom_grad" if key.startswith("bottom_grad.") else key


def compare(split, whole, layer, k, dtype, train, where):
    """Bitwise, except the outputs the rule says are regrouped (and only with k > 1): within
    ``TOLERANCE`` of the largest value."""
    rule = type(layer).split
    regrouped = set()
    for phase_name in ("forward", "backward") if train else ("inference",):
        phase = rule.phase(phase_name)
        if phase is not None and k != 1:
            regrouped |= set(phase.regrouped)
    assert split.keys() == whole.keys(), where
    for name, want in whole.items():
        got = split[name]
        if output(name) in regrouped:
            tol = TOLERANCE[np.dtype(dtype)]
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(),
                                       err_msg=f"{where}: {name} (regrouped)")
        elif layer.type == "Convolution":
            # its forward's BLAS products: bitwise where the library keeps a product's bits
            # whatever its shape (blas_threads.bits_fixed), else to rounding (docs/lms.md)
            assert_bits_or_rounding(got, want, f"{where}: {name}", small=None)
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{where}: {name} (bitwise)")


def test_every_registered_layer_has_a_case_and_a_declaration():
    """A new layer type fails here until it declares how it splits (or says why it never does,
    in NEVER_SPLIT) and has a case above."""
    assert sorted(CASES) == sorted(LAYERS), "add the new layer type to CASES"
    for name, cls in LAYERS.items():
        rule = cls.split
        if name in NEVER_SPLIT:
            assert rule is None, name
            continue
        assert isinstance(rule, SplitRule), f"{name} declares no split (Layer.split)"
        assert (rule.backward is None) == (not cls.has_backward), name
        for phase_name in ("forward", "backward", "inference"):
            phase = rule.phase(phase_name)
            if phase is None:
                continue
            assert phase.kind in KINDS
            for step in phase.passes:
                assert callable(getattr(cls, step.method, None)), f"{name}.{step.method}"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("type_name", sorted(LAYERS))
def test_split_equals_unsplit(type_name, dtype, seed):
    rng = np.random.default_rng(100 * seed + 7)
    for index, case in enumerate(CASES[type_name]):
        n = int(rng.integers(2, 8))
        case_seed = int(rng.integers(1 << 30))
        for train in (True, False):
            layer, bottoms, down = fresh(case, case_seed, n, dtype)
            with CpuDevice(256 * MiB) as device:
                shapes, types = [b.shape for b in bottoms], [b.dtype for b in bottoms]
                whole_run = LayerRun(device, layer, shapes, dtype, seed=seed, bottom_dtypes=types)
                set_params(whole_run, case_seed)
                whole = run_steps(whole_run, bottoms, case_seed, down, train)
                for chunks in chunkings(rng, n):
                    layer, bottoms, down = fresh(case, case_seed, n, dtype)
                    run = SplitRun(device, layer, shapes, dtype, seed=seed, bottom_dtypes=types,
                                   chunks=chunks)
                    set_params(run, case_seed)
                    split = run_steps(run, bottoms, case_seed, down, train)
                    k = chunks if isinstance(chunks, int) else len(chunks)
                    compare(split, whole, layer, k, dtype, train,
                            f"{type_name} case {index} N={n} chunks={chunks} train={train}")


def test_batch_saved_buffers_are_sample_major():
    """The saved buffers a rule slices have the batch as their first axis (at a batch size no
    other axis has); BatchNorm's statistics are shared."""
    rng = np.random.default_rng(0)
    for type_name, cases in CASES.items():
        for case in cases:
            layer, bottoms, _ = case(rng, 11, np.float32)
            layer.setup([b.shape for b in bottoms])
            sample_major = {b.name for b in layer.saved() if b.shape[0] == 11}
            rule = type(layer).split
            assert rule.batch_saved >= sample_major, type_name
            assert (layer.top_shapes[0] != (1,)) == rule.batch_tops, type_name


def test_batch_norm_running_statistics_updated_once():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 2, 3, 3)) * 2 + 1).astype(np.float32)
    stats = []
    with CpuDevice(MiB) as device:
        for chunks in (1, [2, 3], 5):
            run = SplitRun(device, make("BatchNorm", momentum=0.5), [x.shape], chunks=chunks)
            run.forward([x])
            stats.append((run.param("running_mean"), run.param("running_var")))
    mean = x.mean(axis=(0, 2, 3), dtype=np.float64)
    var = x.var(axis=(0, 2, 3), ddof=1, dtype=np.float64)
    for running_mean, running_var in stats:   # one update from (0, 1) with momentum 0.5
        np.testing.assert_allclose(running_mean, 0.5 * mean, rtol=1e-5)
        np.testing.assert_allclose(running_var, 0.5 + 0.5 * var, rtol=1e-5)
        np.testing.assert_array_equal(running_mean, stats[0][0])
        np.testing.assert_array_equal(running_var, stats[0][1])


def test_dropout_split_draws_the_unsplit_mask():
    x = np.ones((6, 40), np.float32)
    with CpuDevice(MiB) as device:
        masks = []
        for chunks in (1, [1, 2, 3], 6):
            run = SplitRun(device, make("Dropout", ratio=0.5), [x.shape], seed=11, chunks=chunks)
            run.forward([x])
            masks.append(run.saved["mask"].host_data().copy())
    keep = np.random.default_rng(11).random(x.shape) >= 0.5
    for mask in masks:
        np.testing.assert_array_equal(mask, keep.astype(np.uint8))


class Unsplittable(Layer):
    type = "Unsplittable"   # not registered

    def infer(self, bottom_shapes):
        return [bottom_shapes[0]]

    def forward(self, io):
        io.top[0][...] = io.bottom[0]


def test_a_layer_without_a_declaration_is_never_split():
    x = np.ones((4, 3), np.float32)
    layer = Unsplittable("odd", ["x"], ["y"])
    with CpuDevice(MiB) as device:
        run = SplitRun(device, layer, [x.shape], chunks=2)
        with pytest.raises(ShapeError, match=r"^layer odd \(Unsplittable\): split \(forward\): "
                                             r"expected a layer that declares how its step "
                                             r"splits along the batch \(Layer\.split\), found "
                                             r"none: this layer is never split$"):
            run.forward([x])
        np.testing.assert_array_equal(LayerRun(device, Unsplittable("odd", ["x"], ["y"]),
                                               [x.shape]).forward([x])[0], x)
        accuracy = make("Accuracy", ("z", "label"), ("acc",))
        accuracy.setup([(4, 3), (4,)])
        with pytest.raises(ShapeError, match=r"split \(backward\): expected a layer"):
            split_buffers(accuracy, "backward")


def test_split_buffers_name_the_extra_memory():
    conv = make("Convolution", num_output=4, kernel_size=3)
    conv.setup([(4, 2, 5, 5)])
    assert [(b.name, b.shape, b.dtype) for b in split_buffers(conv, "backward")] == [
        ("param_grad.weight", (4, 2, 3, 3), None), ("param_grad.bias", (4,), None)]
    assert split_buffers(conv, "forward") == []
    bn = make("BatchNorm")
    bn.setup([(4, 3, 2, 2)], "cpu")     # the cpu's sums carried per channel
    (carry,) = split_buffers(bn, "forward")
    assert (carry.name, carry.shape, carry.dtype) == ("stats", (2, 3, 1), np.float64)
    assert "stats" not in [b.name for b in bn.workspace()]
    assert split_buffers(bn, "inference") == []
    for kind in ("cuda", None):  # the cuda sums' stats of the whole batch, carried
        bn.setup([(4, 3, 2, 2)], kind)
        (carry,) = split_buffers(bn, "forward")
        assert (carry.name, carry.shape, carry.dtype) == ("stats", (2, 3, 4 * 1 + 1), np.float64)
        assert split_buffers(bn, "backward") == [carry]
        assert carry in bn.workspace()              # the unsplit step's, as scratch
    acc = make("Accuracy", ("z", "label"), ("acc",))
    acc.setup([(4, 3), (4,)])
    assert [(b.name, b.shape, b.dtype) for b in split_buffers(acc, "forward")] == [
        ("work.count", (1,), np.int32)]


def test_run_split_checks_its_arguments():
    relu = make("ReLU")
    relu.setup([(3, 2)])
    x = np.ones((3, 2), np.float32)
    from minilms.layers import StepIO
    forward = StepIO(bottom=[x], top=[np.empty_like(x)])
    with pytest.raises(ValueError, match="a forward StepIO for the backward phase"):
        run_split(relu, forward, 2, "backward")
    bn = make("BatchNorm")
    bn.setup([(3, 2)], "cpu")
    with pytest.raises(ValueError, match=r"temporaries \['stats'\] not given"):
        run_split(bn, StepIO(bottom=[x], top=[np.empty_like(x)]), 2, "forward")


def test_chunk_bounds_and_rule_checks():
    assert chunk_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert chunk_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert chunk_bounds(5, [1, 4]) == [(0, 1), (1, 5)]
    for bad in (0, 8, [3, 3], [0, 7], []):
        with pytest.raises(ValueError, match="split: "):
            chunk_bounds(7, bad)
    with pytest.raises(ValueError, match="split kind"):
        Phase("whatever", (Pass("forward"),))
    with pytest.raises(ValueError, match="at least one pass over the chunks"):
        Phase(ACCUMULATE, (Pass("rate", ONCE),))
    with pytest.raises(ValueError, match="'<role>.<name>'"):
        Phase(ACCUMULATE, (Pass("backward"),), sums=("weight",))
    with pytest.raises(ValueError, match="sums belong to the 'accumulate' kind"):
        Phase(STATISTICS, (Pass("backward"),), sums=("param_grad.weight",))
    with pytest.raises(ValueError, match="over must be"):
        Pass("forward", "twice")
    with pytest.raises(ValueError, match="regrouped output 'dx'"):
        Phase(STATISTICS, (Pass("forward"),), regrouped=("dx",))
    assert Phase(STATISTICS, (Pass("forward"),)).exact
    assert not Phase(STATISTICS, (Pass("forward"),), regrouped=("saved.mean",)).exact


@pytest.mark.cuda
def test_convolution_and_batch_norm_split_on_cuda():
    """On the cuda device (the simulator without a GPU), tiny: a convolution (forward and dx
    bitwise, weight and bias gradients regrouped) and a batch norm whose channels hold more values
    than a block has threads, so each thread's carried sum spans both chunks (bitwise)."""
    rng = np.random.default_rng(5)
    cases = [(lambda: make("Convolution", num_output=1, kernel_size=3, pad=1),
              batch(rng, np.float32, 3, 2, 4, 4)),
             (lambda: make("BatchNorm"), spread(rng, np.float32, 3, 1, 10, 13))]
    with new_device("cuda", MiB) as device:
        for make_layer, x in cases:
            outs = []
            for runner, options in ((LayerRun, {}), (SplitRun, {"chunks": [1, 2]})):
                run = runner(device, make_layer(), [x.shape], **options)
                set_params(run, 9)
                outs.append(run_steps(run, [x], 9, None))
            compare(outs[1], outs[0], run.layer, 2, np.float32, True, run.layer.type)



@pytest.mark.parametrize("chunks", [[3, 5], [1, 6, 1], 8])
@pytest.mark.parametrize("channels, out, plane, m", [(48, 48, 14, 2), (50, 70, 9, 2)])
def test_winograd_groups_give_a_split_step_the_whole_steps_bits(monkeypatch, chunks, channels,
                                                                 out, plane, m):
    """3x3 convolutions at batch 8 on small planes: Winograd's samples go in the layer's groups
    of two (``kernels/direct/winograd.py``), and a chunk that starts inside a group (sample 3,
    7) leaves its first place empty, so each sample's rows sit where the whole step puts them:
    the outputs and the input gradient bit for bit on any BLAS, the weight gradient to rounding.
    The second shape (the rule widened to take it) is one where OpenBLAS gave a row other bits at
    the other place of its group: the layer must hand the chunk's first sample down to the
    kernels."""
    from minilms.kernels.direct.rules import winograd
    monkeypatch.setattr(winograd, "WINOGRAD_PLANE", 1)
    monkeypatch.setattr(winograd, "WINOGRAD_CHANNELS", 1)
    monkeypatch.setattr(winograd, "tile_size", lambda *args: m)
    n = 8

    def case(rng, n, dt):
        return (make("Convolution", num_output=out, kernel_size=3, pad=1, bias=False),
                [batch(rng, dt, n, channels, plane, plane)], None)
    results = []
    for split in (None, chunks):
        layer, bottoms, down = fresh(case, 5, n, np.float32)
        with CpuDevice(256 * MiB) as device:
            shapes = [b.shape for b in bottoms]
            run = LayerRun(device, layer, shapes, np.float32, seed=0) if split is None else \
                SplitRun(device, layer, shapes, np.float32, seed=0, chunks=split)
            assert layer.fast.winograd_slots and winograd.layouts_of(
                shapes[0], (out, channels, 3, 3), 1)[0].group == 2
            set_params(run, 5)
            results.append(run_steps(run, bottoms, 5, down))
    whole, split = results
    for name in ("top0", "bottom_grad.0"):
        np.testing.assert_array_equal(split[name], whole[name], err_msg=name)
    np.testing.assert_allclose(split["param_grad.weight"], whole["param_grad.weight"],
                               rtol=1e-4, atol=1e-4 * np.abs(whole["param_grad.weight"]).max())
