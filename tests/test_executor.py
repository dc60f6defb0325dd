"""The resident executor (LMS off): whole nets train, and agree with PyTorch and with numerical
gradients, on both devices."""
import numpy as np
import pytest

from minilms import zoo
from minilms.device import make_device
from minilms.errors import OutOfDeviceMemory
from minilms.lms.executor import ResidentExecutor
from minilms.net import Net
from minilms.solver import SGD, Adam

from .devices import new_device
from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)


def batch(n, c, size, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return {"data": rng.standard_normal((n, c, size, size)).astype(np.float32),
            "label": rng.integers(0, classes, n).astype(np.int32)}


def build(layers, inputs):
    return Net(layers, {k: (v.shape, v.dtype) for k, v in inputs.items()})


def params_of(executor):
    return {name: blob.host_data().copy() for name, blob in executor.blobs.items()
            if blob.role == "param"}


def torch_lenet(torch, params):
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(),
                          nn.Linear(500, 10))
    names = ["conv1", None, "conv2", None, None, "ip1", None, "ip2"]
    with torch.no_grad():
        for module, name in zip(model, names):
            if name:
                module.weight.copy_(torch.tensor(params[f"{name}.weight"]))
                module.bias.copy_(torch.tensor(params[f"{name}.bias"]))
    return model, names


@pytest.mark.parametrize("solver_name", ["sgd", "adam"])
def test_lenet_trains_like_pytorch(solver_name):
    torch = pytest.importorskip("torch", reason="PyTorch not installed: comparison skipped")
    inputs = batch(8, 1, 28)
    solver = SGD(0.01, momentum=0.9) if solver_name == "sgd" else Adam(1e-3)
    with make_device("cpu", "32MiB") as device:
        executor = ResidentExecutor(build(zoo.lenet(), inputs), device, solver)
        model, names = torch_lenet(torch, params_of(executor))
        optimizer = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
                     if solver_name == "sgd" else torch.optim.Adam(model.parameters(), lr=1e-3))
        x, y = torch.tensor(inputs["data"]), torch.tensor(inputs["label"]).long()
        for _ in range(4):
            ours = executor.iterate(inputs)["loss"]
            optimizer.zero_grad()
            theirs = torch.nn.functional.cross_entropy(model(x), y)
            theirs.backward()
            optimizer.step()
            assert ours == pytest.approx(theirs.item(), rel=1e-4)
        got = params_of(executor)
    for module, name in zip(model, names):
        if name:
            np.testing.assert_allclose(got[f"{name}.weight"], module.weight.detach().numpy(),
                                       rtol=1e-3, atol=1e-5)


def numerical_check(executor, inputs, names, samples=4, eps=1e-3, seed=0):
    """Analytic gradients of whole-net loss against central differences (float32 blobs), with
    the gradient checker's kink guard: an element whose one-sided slopes disagree is skipped."""
    grads = {}

    class Catch:  # a solver that records gradients and changes nothing
        state_names = ()

        def begin_iteration(self, iteration):
            pass

        def update(self, param, grad, states, stream=None):
            grads[id(param)] = executor.device.to_host(grad)

    executor.solver = Catch()
    base = executor.iterate(inputs)["loss"]
    rng = np.random.default_rng(seed)
    checked = 0
    for name in names:
        blob = executor.blobs[name]
        analytic = grads[id(blob.device_data())]
        for index in rng.choice(blob.host_data().size, samples, replace=False):
            value = blob.host_data().copy()
            flat = value.reshape(-1)
            original = flat[index]
            losses = []
            for delta in (eps, -eps):
                flat[index] = original + delta
                blob.mutable_host_data()[...] = value
                losses.append(executor.iterate(inputs, train=False)["loss"])
            flat[index] = original
            blob.mutable_host_data()[...] = value
            right, left = (losses[0] - base) / eps, (base - losses[1]) / eps
            if abs(right - left) > 1e-2 + 0.1 * abs(right + left):
                continue  # the step crossed a ReLU or max-pool kink
            numeric = (losses[0] - losses[1]) / (2 * eps)
            exact = analytic.reshape(-1)[index]
            assert abs(numeric - exact) <= 2e-3 + 5e-2 * abs(exact), (name, index, numeric, exact)
            checked += 1
    assert checked >= 0.8 * samples * len(names)


RESIDUAL_INCEPTION = [  # a residual add and an inception-style concat, no BatchNorm (float32 check)
    {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "c1", "num_output": 4,
     "kernel_size": 3, "pad": 1},
    {"name": "relu1", "type": "ReLU", "bottom": "c1", "top": "c1"},
    {"name": "conv2", "type": "Convolution", "bottom": "c1", "top": "c2", "num_output": 4,
     "kernel_size": 3, "pad": 1},
    {"name": "add", "type": "Eltwise", "bottom": ["c1", "c2"], "top": "sum"},
    {"name": "branch", "type": "Convolution", "bottom": "sum", "top": "b", "num_output": 2,
     "kernel_size": 1},
    {"name": "cat", "type": "Concat", "bottom": ["sum", "b"], "top": "cat"},
    {"name": "pool", "type": "Pooling", "bottom": "cat", "top": "pool", "pool": "max",
     "kernel_size": 2},
    {"name": "fc", "type": "InnerProduct", "bottom": "pool", "top": "fc", "num_output": 3},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"},
]


@pytest.mark.usefixtures("small_gemm_tile")
@pytest.mark.parametrize("kind", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda,
                                                                     pytest.mark.slow])])
def test_dag_gradients_match_numerical_ones(kind):
    # on cuda slow: 100 s in the simulator (the layers' own gradient checks run there in CI)
    inputs = batch(2, 2, 6, classes=3)
    with new_device(kind, 2**20) as device:
        executor = ResidentExecutor(build(RESIDUAL_INCEPTION, inputs), device)
        numerical_check(executor, inputs, ["conv1.weight", "conv2.weight", "branch.weight"],
                        samples=2 if kind == "cuda" else 6)


@pytest.mark.parametrize("model, size", [("resnet18", 32), ("resnet50", 32), ("googlenet", 64)])
def test_zoo_models_learn_a_batch_on_cpu(model, size):
    inputs = batch(4, 3, size, classes=4)
    net = build(zoo.MODELS[model](num_classes=4, width=16), inputs)
    with make_device("cpu", "64MiB") as device:
        executor = ResidentExecutor(net, device, SGD(0.05, momentum=0.9))
        losses = [executor.iterate(inputs)["loss"] for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.cuda
@pytest.mark.slow       # about 2 minutes in the simulator; the golden nets train on cuda in CI
@pytest.mark.usefixtures("small_gemm_tile")
def test_cuda_and_cpu_train_alike():
    """The residual + inception net with a BatchNorm, three SGD steps on each device. (A zoo
    ResNet takes many minutes under the simulator; on a real GPU this is where to grow it.)"""
    inputs = batch(2, 2, 6, classes=3)
    layers = ([dict(RESIDUAL_INCEPTION[0], top="c0"),
               {"name": "bn1", "type": "BatchNorm", "bottom": "c0", "top": "c1"}]
              + RESIDUAL_INCEPTION[1:])
    losses, weights = {}, {}
    for kind in ("cpu", "cuda"):
        with new_device(kind, 2**20) as device:
            executor = ResidentExecutor(build(layers, inputs), device, SGD(0.1, momentum=0.9))
            losses[kind] = [executor.iterate(inputs)["loss"] for _ in range(3)]
            weights[kind] = params_of(executor)
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-4)
    for name, value in weights["cpu"].items():
        np.testing.assert_allclose(weights["cuda"][name], value, rtol=1e-3, atol=1e-5)


def test_lms_off_out_of_memory_says_what_it_needs():
    inputs = batch(64, 1, 28)
    with make_device("cpu", "1MiB") as device:
        with pytest.raises(OutOfDeviceMemory, match=r"LMS off needs every blob resident: .* "
                                                    r"but the pool holds 1.00 MiB: turn LMS on"):
            ResidentExecutor(build(zoo.lenet(), inputs), device)



def counting_params(monkeypatch, net) -> list:
    """Every layer type's ``params()`` of ``net``, counted as called."""
    calls = []
    for layer_type in {type(layer) for layer in net.layers}:
        original = layer_type.params
        monkeypatch.setattr(layer_type, "params",
                            lambda self, original=original: calls.append(1) or original(self))
    return calls


def test_a_step_names_its_blobs_at_its_first_run_only(monkeypatch):
    """The blobs a step touches are worked out at its first run (``Executor._names``), not at
    every iteration: a layer builds its parameter lists anew at each ``params()``."""
    inputs = batch(4, 1, 28)
    net = build(zoo.lenet(), inputs)
    calls = counting_params(monkeypatch, net)
    with make_device("cpu", "32MiB") as device:
        executor = ResidentExecutor(net, device, SGD(0.01, momentum=0.9))
        executor.iterate(inputs)
        counted = len(calls)
        executor.iterate(inputs)
    assert counted > 0 and len(calls) == counted


def test_named_steps_train_as_steps_named_at_every_run(monkeypatch):
    """LMS on, batches of two sizes in turn (a plan and a net each): the weights are those of the
    same run with every step's names worked out anew at each run (the definition)."""
    from minilms.lms import LmsExecutor, Policy
    from minilms.lms.executor import Executor

    big, small = batch(4, 1, 28), batch(2, 1, 28, seed=1)
    results = []
    for cached in (True, False):
        if not cached:
            named = Executor._names
            monkeypatch.setattr(Executor, "_names", lambda self, *args: (
                self.__dict__.__setitem__("_named", {}), named(self, *args))[1])
        with make_device("cpu", "5MiB") as device:     # swaps blobs both ways
            executor = LmsExecutor(build(zoo.lenet(), big), device, SGD(0.01, momentum=0.9),
                                   Policy(policy="auto"))
            for inputs in (big, small, big, small):
                executor.iterate(inputs)
            results.append(params_of(executor))
    for name, value in results[0].items():
        np.testing.assert_array_equal(value, results[1][name], err_msg=name)


@pytest.mark.parametrize("lms", [False, True])
def test_an_iteration_on_the_cpu_holds_blas_to_one_thread(monkeypatch, lms):
    """On the ``cpu`` device every product runs on one BLAS thread per core (``blas_threads``):
    an iteration holds the BLAS libraries at one thread from its first step to its last, so
    that its hundreds of products do not each set and restore the counts; outside it, the
    counts the user set (two here) are back. (The libraries are those ``blas_threads`` found
    when it first looked: Numba's CPU target loads SciPy's OpenBLAS later, at its first compiled
    function, and no kernel calls that one.)"""
    from threadpoolctl import threadpool_limits

    from minilms.kernels import blas_threads
    from minilms.lms import LmsExecutor, Policy, resident_bytes
    if not blas_threads.libraries():
        pytest.skip("threadpoolctl finds no BLAS library here")
    inputs = batch(4, 1, 28)
    net = build(zoo.lenet(), inputs)
    seen = []
    with threadpool_limits(2, user_api="blas"):
        if lms:
            capacity = resident_bytes(net, net.schedule(("momentum",))) * 3 // 4
            executor = LmsExecutor(net, make_device("cpu", capacity), SGD(0.01, momentum=0.9),
                                   Policy(policy="auto"))
        else:
            executor = ResidentExecutor(net, make_device("cpu", 64 << 20), SGD(0.01))
        dispatch = type(executor)._dispatch

        def noting(self, step, train, solver):
            seen.append({library.num_threads for library in blas_threads.libraries()})
            dispatch(self, step, train, solver)

        monkeypatch.setattr(type(executor), "_dispatch", noting)
        before = [library.num_threads for library in blas_threads.libraries()]
        executor.iterate(inputs)
        after = [library.num_threads for library in blas_threads.libraries()]
    assert 2 in before      # MKL's sequential layer says 1 whatever it is told
    assert len(seen) > 10 and all(counts == {1} for counts in seen), seen
    assert after == before
