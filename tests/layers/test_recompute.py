"""Recompute (issue 21): every registered layer type declares whether its forward can be run again
to rebuild its tops bit for bit; those that can do so, at random shapes and options.

For each type: forward, backward; then the tops are poisoned and rebuilt by ``rerun_forward`` from
the same bottoms, parameters and saved buffers, and must be bitwise the first forward's, with the
parameters (batch norm's running statistics), the saved buffers and the RNG stream unchanged; the
backward after the recompute must give bitwise the gradients of the first (so training is
unchanged). A rebuild into other pool memory must agree too (nothing depends on the addresses).
Layers that cannot be recomputed refuse with an error that says why. A type without a declaration
of its own, or without a case here, fails ``test_every_type_declares_a_rule_and_has_a_case``."""
import numpy as np
import pytest

from minilms.blob import Blob
from minilms.errors import ShapeError
from minilms.layers import LAYERS, StepIO
from minilms.layers.recompute import (
    NOT_DECLARED,
    Recompute,
    check_recomputable,
    recompute_reads,
    recompute_writes,
    rerun_forward,
)
from minilms.layers.run import LayerRun

from ..devices import new_device

MiB = 2**20
SEEDS = range(4)
# Types run under the CUDA simulator too (tiny shapes, no GEMM: the simulator runs those slowly and
# the GEMM kernel's determinism is the kernel tests' and the LMS tests' business).
CUDA_TYPES = ("BatchNorm", "Dropout", "ReLU", "Flatten", "Eltwise", "Concat", "Pooling")


# -- one random case per layer type ------------------------------------------------------------
def floats(rng, shape, ties=False):
    x = rng.standard_normal(shape)
    if ties:   # repeated values: max pooling's first-maximum rule must pick the same index again
        x = np.round(x * 2) / 2
    return x.astype(np.float32)


def labels(rng, n, k):
    return rng.integers(0, k, n).astype(np.int32)


def spatial(rng, low=1, high=7):
    return int(rng.integers(low, high + 1)), int(rng.integers(low, high + 1))


def convolution(rng):
    n, c = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    h, w = int(rng.integers(kh, kh + 6)), int(rng.integers(kw, kw + 6))
    groups = int(rng.choice([g for g in (1, 2, 3) if c % g == 0]))
    options = dict(num_output=groups * int(rng.integers(1, 4)), kernel_size=[kh, kw],
                   stride=int(rng.integers(1, 3)), pad=[int(rng.integers(0, kh)) // 2,
                                                        int(rng.integers(0, kw)) // 2],
                   bias=bool(rng.integers(2)), groups=groups,
                   engine=str(rng.choice(["auto", "reference"])),
                   # small workspaces walk one sample, or bands of rows, at a time
                   max_workspace=int(rng.choice([64 * MiB, 2048, 512])))
    shape = (n, c, h, w)
    try:
        LAYERS["Convolution"]("layer", ["b0"], ["t0"], **options).setup([shape])
    except ShapeError:              # too small a workspace for one row: the default then
        options["max_workspace"] = 64 * MiB
    return options, [floats(rng, shape)]


def inner_product(rng):
    n = int(rng.integers(1, 5))
    shape = (n, int(rng.integers(1, 9))) if rng.integers(2) else (n, 2, *spatial(rng, 1, 3))
    return dict(num_output=int(rng.integers(1, 7)), bias=bool(rng.integers(2))), \
        [floats(rng, shape)]


def batch_norm(rng):
    rank = int(rng.integers(2, 6))
    shape = (int(rng.integers(2, 5)), int(rng.integers(1, 5)),
             *(int(rng.integers(1, 5)) for _ in range(rank - 2)))
    return dict(momentum=float(rng.uniform(0.05, 0.5)), affine=bool(rng.integers(2))), \
        [floats(rng, shape) * 3 + 2]


def dropout(rng):
    return dict(ratio=float(rng.choice([0.0, 0.2, 0.5, 0.9, 1.0]))), \
        [floats(rng, (int(rng.integers(1, 4)), *spatial(rng)))]


def any_shape(rng):
    return (int(rng.integers(1, 4)), int(rng.integers(1, 4)), *spatial(rng, 1, 5))


def eltwise(rng):
    count, shape = int(rng.integers(2, 4)), any_shape(rng)
    coeffs = None if rng.integers(2) else [float(c) for c in rng.uniform(-2, 2, count)]
    return dict(coeffs=coeffs), [floats(rng, shape) for _ in range(count)]


def concat(rng):
    n, (h, w) = int(rng.integers(1, 4)), spatial(rng, 1, 4)
    return {}, [floats(rng, (n, int(rng.integers(1, 4)), h, w))
                for _ in range(int(rng.integers(1, 4)))]


def pooling(rng):
    n, c, (h, w) = int(rng.integers(1, 3)), int(rng.integers(1, 4)), spatial(rng, 2, 7)
    pool = str(rng.choice(["max", "ave"]))
    x = floats(rng, (n, c, h, w), ties=pool == "max")
    if rng.integers(4) == 0:
        return dict(pool=pool, global_pooling=True), [x]
    k = int(rng.integers(1, min(h, w) + 1))
    return dict(pool=pool, kernel_size=k, stride=int(rng.integers(1, 3)),
                pad=int(rng.integers(0, k // 2 + 1)), ceil_mode=bool(rng.integers(2)),
                count_include_pad=bool(rng.integers(2))), [x]


def classifier(rng):
    n, k = int(rng.integers(1, 5)), int(rng.integers(2, 6))
    return (n, k), [floats(rng, (n, k)), labels(rng, n, k)]


def softmax_with_loss(rng):
    _, inputs = classifier(rng)
    return dict(loss_weight=float(rng.uniform(0.5, 2))), inputs


def accuracy(rng):
    (_, k), inputs = classifier(rng)
    return dict(top_k=int(rng.integers(1, k + 1))), inputs


CASES = {
    "Convolution": convolution, "InnerProduct": inner_product, "BatchNorm": batch_norm,
    "Dropout": dropout, "ReLU": lambda rng: ({}, [floats(rng, any_shape(rng))]),
    "Flatten": lambda rng: ({}, [floats(rng, any_shape(rng))]), "Eltwise": eltwise,
    "Concat": concat, "Pooling": pooling, "SoftmaxWithLoss": softmax_with_loss,
    "Accuracy": accuracy,
}


def make_case(type_name, seed):
    rng = np.random.default_rng([seed, sorted(LAYERS).index(type_name)])
    options, inputs = CASES[type_name](rng)
    layer = LAYERS[type_name]("layer", [f"b{i}" for i in range(len(inputs))], ["t0"], **options)
    return layer, inputs, rng


# -- running a layer's steps by hand --------------------------------------------------------------
def bits(array) -> bytes:
    """The bytes of ``array``: bitwise equality (``-0.0`` is not ``0.0``, a NaN is itself)."""
    return np.ascontiguousarray(array).tobytes()


def snapshot(blobs: dict) -> dict:
    return {name: (blob.host_data().dtype, bits(blob.host_data())) for name, blob in blobs.items()}


def poison(blob) -> None:
    """Garbage in the blob's device copy: a rebuild must write every element."""
    host = blob.mutable_host_data()
    host[...] = np.nan if np.issubdtype(host.dtype, np.floating) else -7
    blob.device_data()


def stream(device):
    return device.compute_stream if device.kind == "cuda" else None


def recompute_io(run: LayerRun, tops, rng, train=True, bottoms=None) -> StepIO:
    """A re-run's StepIO: the bottoms, parameters and saved buffers as the first forward left them
    (read in place, not overwritten), fresh workspace, the tops to rebuild."""
    return StepIO(bottom=bottoms or [b.device_data() for b in run.bottom], top=tops,
                  params={k: b.mutable_device_data() for k, b in run.params.items()},
                  saved={k: b.mutable_device_data() for k, b in run.saved.items()},
                  work={k: b.mutable_device_data(overwrite=True) for k, b in run.work.items()},
                  train=train, rng=rng, stream=stream(run.device))


def top_grads(layer, rng):
    return [rng.standard_normal(shape).astype(np.float32) for shape in layer.top_shapes]


def gradients_bits(grads) -> list:
    bottom, params = grads
    return [None if g is None else bits(g) for g in bottom] + \
        [(k, bits(v)) for k, v in sorted(params.items())]


# -- the declarations ----------------------------------------------------------------------------
def test_every_type_declares_a_rule_and_has_a_case():
    for name, cls in LAYERS.items():
        assert isinstance(cls.__dict__.get("recompute"), Recompute), \
            f"layer type {name} declares no recompute rule of its own (minilms/layers/recompute.py)"
        assert cls.recompute is not NOT_DECLARED and cls.recompute.why
        assert name in CASES, f"layer type {name}: add a random case to tests/layers/" \
                              "test_recompute.py"


def test_what_the_rules_say():
    assert not LAYERS["SoftmaxWithLoss"].recompute.possible
    assert not LAYERS["Accuracy"].recompute.possible
    bn = LAYERS["BatchNorm"].recompute
    assert bn.saved_reads == {"mean", "invstd"} and set(bn.untouched) == {"running_mean",
                                                                           "running_var"}
    drop = LAYERS["Dropout"].recompute
    assert drop.saved_reads == {"mask"} and drop.untouched == ("rng",)
    assert LAYERS["Pooling"].recompute.saved_rewrites == {"argmax"}


def test_reads_and_writes_of_a_rerun():
    bn = LAYERS["BatchNorm"]("bn", ["x"], ["y"])
    bn.setup([(2, 3, 4, 4)])
    assert recompute_reads(bn) == {"bottom": ["x"], "params": ["weight", "bias"],
                                   "saved": ["invstd", "mean"],
                                   "workspace": ["dweight", "dbias", "stats"]}
    assert recompute_writes(bn) == {"top": ["y"], "saved": []}
    for pool, saved in (("max", ["argmax"]), ("ave", [])):
        layer = LAYERS["Pooling"]("p", ["x"], ["y"], pool=pool, kernel_size=2)
        layer.setup([(1, 1, 4, 4)])
        assert recompute_writes(layer)["saved"] == saved
        assert recompute_reads(layer)["saved"] == []


@pytest.mark.parametrize("type_name", ["SoftmaxWithLoss", "Accuracy"])
def test_a_layer_that_cannot_recompute_says_why(type_name):
    layer, inputs, rng = make_case(type_name, 0)
    with new_device("cpu", 8 * MiB) as device:
        run = LayerRun(device, layer, [x.shape for x in inputs],
                       bottom_dtypes=[x.dtype for x in inputs])
        run.forward(inputs)
        before = snapshot({**run.saved, "top": run.top[0]})
        with pytest.raises(ShapeError, match=f"layer layer \\({type_name}\\): recompute: .*not "
                                             f"recomputable: {layer.recompute.why}"):
            rerun_forward(layer, recompute_io(run, [t.mutable_device_data() for t in run.top],
                                              rng))
        assert snapshot({**run.saved, "top": run.top[0]}) == before   # nothing ran
    for ask in (recompute_reads, recompute_writes, check_recomputable):
        with pytest.raises(ShapeError, match="not recomputable"):
            ask(layer)


# -- recomputing every type ------------------------------------------------------------------------
def recompute_cases():
    """Every recomputable type (the others: ``test_a_layer_that_cannot_recompute_says_why``)."""
    for name in sorted(t for t in CASES if LAYERS[t].recompute.possible):
        for seed in SEEDS:
            yield pytest.param("cpu", name, seed)
        if name in CUDA_TYPES:
            yield pytest.param("cuda", name, 0, marks=pytest.mark.cuda)


@pytest.mark.parametrize("kind, type_name, seed", list(recompute_cases()))
def test_recompute_rebuilds_the_tops_bitwise(kind, type_name, seed):
    layer, inputs, rng = make_case(type_name, seed)
    with new_device(kind, 16 * MiB) as device:
        run = LayerRun(device, layer, [x.shape for x in inputs],
                       bottom_dtypes=[x.dtype for x in inputs], seed=seed)
        tops = run.forward(inputs)
        grads = top_grads(layer, rng)
        first = gradients_bits(run.backward(grads))
        params, saved = snapshot(run.params), snapshot(run.saved)

        # into other memory of the pool: nothing depends on where the tops are
        others = [Blob(device, f"other{i}", t.shape, t.dtype, "activation")
                  for i, t in enumerate(run.top)]
        for blob in others:
            poison(blob)
        generator = np.random.default_rng(99)
        state = generator.bit_generator.state
        rerun_forward(layer, recompute_io(run, [b.mutable_device_data() for b in others],
                                          generator))
        device.synchronize()
        assert [bits(b.host_data()) for b in others] == [bits(t) for t in tops]
        assert snapshot(run.params) == params, "the re-run changed a parameter or statistic"
        assert snapshot(run.saved) == saved, "the re-run changed a saved buffer"
        assert generator.bit_generator.state == state, "the re-run drew from the RNG"

        # into the tops themselves, then backward again: the same gradients, bit for bit
        for blob in run.top:
            poison(blob)
        rewrites = recompute_writes(layer)["saved"]
        for name in rewrites:       # max pooling's argmax is written again: the same indices
            poison(run.saved[name])
        rerun_forward(layer, recompute_io(run, [t.mutable_device_data() for t in run.top],
                                          generator))
        device.synchronize()
        assert [bits(t.host_data()) for t in run.top] == [bits(t) for t in tops]
        assert snapshot(run.saved) == saved
        assert gradients_bits(run.backward(grads)) == first
        assert snapshot(run.params) == params


@pytest.mark.parametrize("type_name", sorted(t for t in CASES if LAYERS[t].recompute.possible))
def test_recompute_in_test_mode(type_name):
    """A test-mode forward saves nothing: its re-run is the same forward, and changes nothing."""
    layer, inputs, rng = make_case(type_name, 7)
    with new_device("cpu", 16 * MiB) as device:
        run = LayerRun(device, layer, [x.shape for x in inputs], seed=1)
        tops = run.forward(inputs, train=False)
        params = snapshot(run.params)
        for blob in run.top:
            poison(blob)
        rerun_forward(layer, recompute_io(run, [t.mutable_device_data() for t in run.top], None,
                                          train=False))
        assert [bits(t.host_data()) for t in run.top] == [bits(t) for t in tops]
        assert snapshot(run.params) == params


# -- batch norm and dropout: what the re-run must not touch ---------------------------------------
@pytest.mark.parametrize("kind", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_batch_norm_recompute_leaves_the_running_statistics(kind):
    rng = np.random.default_rng(3)
    x = floats(rng, (3, 2, 3, 2)) * 2 + 1
    layer = LAYERS["BatchNorm"]("bn", ["x"], ["y"], momentum=0.3)
    with new_device(kind, MiB) as device:
        run = LayerRun(device, layer, [x.shape])
        y = run.forward([x])[0]
        stats = snapshot({k: run.params[k] for k in ("running_mean", "running_var")})
        rerun_forward(layer, recompute_io(run, [run.top[0].mutable_device_data()], None))
        assert bits(run.top[0].host_data()) == bits(y)
        assert snapshot({k: run.params[k] for k in ("running_mean", "running_var")}) == stats
        run.forward([x])       # a training forward proper updates them
        after = snapshot({k: run.params[k] for k in ("running_mean", "running_var")})
        assert all(after[k] != stats[k] for k in stats)


def test_dropout_recompute_draws_nothing():
    rng = np.random.default_rng(5)
    x = floats(rng, (4, 50))
    layer = LAYERS["Dropout"]("drop", ["x"], ["y"], ratio=0.4)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, layer, [x.shape], seed=11)
        y = run.forward([x])[0]
        generator = np.random.default_rng(11)
        state = generator.bit_generator.state
        rerun_forward(layer, recompute_io(run, [run.top[0].mutable_device_data()], generator))
        assert generator.bit_generator.state == state
        assert bits(run.top[0].host_data()) == bits(y)
        # without an RNG at all, too; and a normal training forward does draw
        rerun_forward(layer, recompute_io(run, [run.top[0].mutable_device_data()], None))
        assert bits(run.top[0].host_data()) == bits(y)
        io = recompute_io(run, [run.top[0].mutable_device_data()], generator)
        io.recompute = False
        layer.forward(io)
        assert generator.bit_generator.state != state


@pytest.mark.parametrize("type_name, options", [("ReLU", {}), ("BatchNorm", {"momentum": 0.2}),
                                                ("Dropout", {"ratio": 0.3})])
def test_in_place_rerun_from_the_rebuilt_input(type_name, options):
    """An in-place layer overwrote its input: once the input is rebuilt (here: written back), the
    re-run in place gives the top again."""
    rng = np.random.default_rng(8)
    x = floats(rng, (2, 3, 4)) + 0.5
    layer = LAYERS[type_name]("inplace", ["x"], ["x"], **options)
    with new_device("cpu", MiB) as device:
        run = LayerRun(device, layer, [x.shape], seed=2)
        run.bottom[0].mutable_host_data()[...] = x
        data = run.bottom[0].mutable_device_data()
        io = recompute_io(run, [data], np.random.default_rng(2), bottoms=[data])
        io.saved = {k: b.mutable_device_data(overwrite=True) for k, b in run.saved.items()}
        layer.forward(io)
        y = bits(data)
        stats = snapshot(run.params)
        run.bottom[0].mutable_host_data()[...] = x           # the input, rebuilt
        data = run.bottom[0].mutable_device_data()
        rerun_forward(layer, recompute_io(run, [data], None, bottoms=[data]))
        assert bits(data) == y
        assert snapshot(run.params) == stats


# -- the CUDA twin of the saved-statistics kernel -----------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(3, 2, 5), (2, 3, 2, 2), (5, 1)])
def test_saved_statistics_kernel_cuda_against_cpu(shape):
    """``batchnorm_normalize`` with the saved statistics on cuda gives the cuda training
    forward's ``y`` bitwise, and the cpu twin's up to rounding (the cpu may contract
    ``(x - mean) * g + beta`` into an FMA, the simulator does not)."""
    from numba import cuda

    from minilms.kernels import batchnorm as bn
    rng = np.random.default_rng(9)
    c = shape[1]
    x = floats(rng, shape) * 2 + 3
    gamma, beta = floats(rng, c) + 1, floats(rng, c)

    def on(device_kind):
        ys = {}
        arrays = dict(x=x, gamma=gamma, beta=beta, y=np.empty_like(x), mean=np.empty(c, x.dtype),
                      invstd=np.empty(c, x.dtype), rm=np.zeros(c, x.dtype),
                      rv=np.ones(c, x.dtype), again=np.full_like(x, np.nan))
        if device_kind == "cuda":
            arrays = {k: cuda.to_device(v) for k, v in arrays.items()}
        a = arrays
        n = shape[0]
        sums = np.empty(bn.stats_shape(c, n, x.size // (n * c)))
        bn.batchnorm_forward_train(a["x"], a["gamma"], a["beta"], a["y"], a["mean"],
                                   a["invstd"], a["rm"], a["rv"], 0.1, 1e-5,
                                   stats=sums if device_kind == "cpu" else cuda.to_device(sums))
        stats = {k: bits(a[k] if device_kind == "cpu" else a[k].copy_to_host())
                 for k in ("rm", "rv")}
        bn.batchnorm_normalize(a["x"], a["gamma"], a["beta"], a["mean"], a["invstd"],
                                   a["again"])
        for k in ("y", "again", "rm", "rv"):
            ys[k] = a[k] if device_kind == "cpu" else a[k].copy_to_host()
        assert {k: bits(ys[k]) for k in ("rm", "rv")} == stats
        return ys

    on_cpu, on_cuda = on("cpu"), on("cuda")
    assert bits(on_cpu["again"]) == bits(on_cpu["y"])
    assert bits(on_cuda["again"]) == bits(on_cuda["y"])
    np.testing.assert_allclose(on_cuda["again"], on_cpu["again"], rtol=1e-5, atol=1e-5)
