"""minilms against PyTorch's stored answers (``tests/golden/``), on both devices, with no PyTorch.

The PyTorch comparisons beside each layer's tests skip where torch is not installed, which is CI.
``scripts/make_golden.py`` (run where it is) stores PyTorch's outputs and gradients for every layer
type (several options each) and two small nets trained two steps with SGD and with Adam; this file
replays them through ``LayerRun`` and ``ResidentExecutor``. A fixture is trusted only as far as it
is complete: a layer type without one fails here, and so does an array a test did not compare.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minilms.layers import LAYERS
from minilms.layers.run import LayerRun
from minilms.lms.executor import ResidentExecutor
from minilms.net import Net
from minilms.solver import SGD, Adam

from .devices import KINDS, new_device
from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)

GOLDEN = Path(__file__).resolve().parent / "golden"
MiB = 2**20
REGENERATE = "python scripts/make_golden.py (where PyTorch is installed)"

# Under the simulator, a GEMM tile that covers these small matrices in one block (layers/conftest).
pytestmark = pytest.mark.usefixtures("small_gemm_tile")

# The references are float64, computed from the stored inputs exactly as stored, so a tolerance is
# minilms's own rounding. Each figure below is the worst element over every fixture on both
# devices when these were set, and the share of the tolerance it used.
# float64 runs: sums of at most ~100 terms of size ~1. Worst: 5e-15 absolute (a grouped
# convolution's weight gradient), under 1% of these; 12 significant digits stay pinned.
FLOAT64 = dict(rtol=1e-12, atol=1e-13)
# float32 runs (float32 fixtures; float64 fixtures of layers whose CUDA GEMM is float32 only, cast):
# float32 rounding of the inputs and of each partial sum, ~6e-8 relative per operation. Worst:
# 2.6e-6 absolute on values of ~10 (a dilated convolution's weight gradient on cuda), 14% of these;
# a wrong tap, window, sample or scale is off by far more than 2e-5 relative.
FLOAT32 = dict(rtol=2e-5, atol=4e-6)
# Whole nets run in float32 (Net declares float32 blobs) against a float64 PyTorch net from the same
# float32 values, through two optimizer steps: the loss and accuracy of each forward, and every
# parameter (running statistics included) after each step. Worst: 1.6e-7 relative in a loss (8% of
# NET_LOSS), 1.2e-7 absolute in a weight (4% of NET_PARAM). One step moves a weight by ~1e-2 (Adam:
# lr), so a wrong sign or a missed weight decay or momentum term shows at 100x these tolerances.
NET_LOSS = dict(rtol=2e-6, atol=0)
NET_PARAM = dict(rtol=1e-5, atol=1e-6)

# Layers whose CUDA path is a GEMM, which is float32 only on CUDA (kernels/gemm.py): their float64
# fixtures run in float32 there, with the float32 tolerance.
FLOAT32_ON_CUDA = {"Convolution", "InnerProduct"}


def load(path: Path) -> tuple[dict, dict]:
    """(meta, arrays) of one fixture; ``allow_pickle=False``: plain arrays only."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    return json.loads(str(arrays.pop("meta"))), arrays


FIXTURES = {path.stem: load(path)[0] for path in sorted(GOLDEN.glob("*.npz"))}
LAYER_CASES = [name for name, meta in FIXTURES.items() if meta["kind"] == "layer"]
NET_CASES = [name for name, meta in FIXTURES.items() if meta["kind"] == "net"]


class Arrays:
    """A fixture's arrays, remembering which were read: ``unread()`` at the end of a test names any
    array the script stored and the test never compared (a new field the test must learn)."""

    def __init__(self, arrays: dict):
        self.arrays, self.read = arrays, set()

    def __getitem__(self, key):
        self.read.add(key)
        return self.arrays[key]

    def __contains__(self, key):
        return key in self.arrays

    def prefixed(self, prefix: str) -> dict:
        return {key[len(prefix):]: self[key] for key in sorted(self.arrays)
                if key.startswith(prefix)}

    def indexed(self, prefix: str) -> list:
        values = self.prefixed(prefix)
        assert sorted(values) == [str(i) for i in range(len(values))], values.keys()
        return [values[str(i)] for i in range(len(values))]

    def unread(self) -> list:
        return sorted(set(self.arrays) - self.read)


def close(got, want, tolerance, what):
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, PyTorch's {want.shape}"
    np.testing.assert_allclose(got, want, err_msg=f"{what} (against PyTorch)", **tolerance)


def run_dtype(meta: dict, kind: str):
    if kind == "cuda" and meta["type"] in FLOAT32_ON_CUDA:
        return np.float32
    return np.dtype(meta["dtype"]).type


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", LAYER_CASES)
def test_layer_against_pytorch(name, kind):
    """Forward (and the state it updates), then backward from the stored seed gradient: every top,
    input gradient and parameter gradient PyTorch gave, and Dropout's mask."""
    meta, stored = load(GOLDEN / f"{name}.npz")
    arrays = Arrays(stored)
    dtype = run_dtype(meta, kind)
    tolerance = FLOAT64 if dtype == np.float64 else FLOAT32
    bottoms = [b if b.dtype.kind == "i" else b.astype(dtype) for b in arrays.indexed("bottom.")]
    params = arrays.prefixed("param.")
    layer = LAYERS[meta["type"]]("golden", [f"b{i}" for i in range(len(bottoms))], ["y"],
                                 **meta["options"])
    with new_device(kind, 4 * MiB) as device:
        run = LayerRun(device, layer, [b.shape for b in bottoms], dtype=dtype,
                       seed=meta["rng_seed"], bottom_dtypes=[b.dtype for b in bottoms])
        assert sorted(run.params) == sorted(params), "the fixture sets every parameter"
        for key, value in params.items():
            run.set_param(key, value.astype(dtype))
        (top,) = run.forward(bottoms, train=meta["train"])
        close(top, arrays["top.0"], tolerance, f"{name} top")
        if "mask" in arrays:   # the host RNG's draw: the same elements dropped, exactly
            np.testing.assert_array_equal(run.saved["mask"].host_data(), arrays["mask"])
        for key, value in arrays.prefixed("param_after.").items():
            close(run.param(key), value, tolerance, f"{name} {key} after forward")
        if "top_grad.0" in arrays:
            (top_grad,) = arrays.indexed("top_grad.")
            down = meta["propagate_down"]
            bottom_grads, param_grads = run.backward([top_grad.astype(dtype)], down)
            want = arrays.prefixed("bottom_grad.")
            assert sorted(want) == [str(i) for i, d in enumerate(down) if d]
            for i, grad in want.items():
                close(bottom_grads[int(i)], grad, tolerance, f"{name} bottom {i} gradient")
            want = arrays.prefixed("param_grad.")
            assert sorted(param_grads) == sorted(want)
            for key, grad in want.items():
                close(param_grads[key], grad, tolerance, f"{name} {key} gradient")
    assert not arrays.unread(), f"{name}: stored but not compared: {arrays.unread()}"


def make_solver(spec: dict):
    options = {k: v for k, v in spec.items() if k != "type"}
    return {"SGD": SGD, "Adam": Adam}[spec["type"]](**options)


# Adam's kernel is checked on CUDA against the CPU's (tests/kernels/test_optimizers.py); under
# the simulator the nets with SGD are enough to check training on CUDA whole
NET_RUNS = [pytest.param(name, kind, marks=(pytest.mark.cuda,) + (
    (pytest.mark.simulator_slow,) if FIXTURES[name]["solver"]["type"] == "Adam" else ()))
    if kind == "cuda" else (name, kind) for name in NET_CASES for kind in ("cpu", "cuda")]


@pytest.mark.parametrize(("name", "kind"), NET_RUNS)
def test_net_trains_like_pytorch(name, kind):
    """The fixture's layer list as a minilms Net, its parameters set to the stored ones, trained
    step by step on the stored batch: each step's loss and accuracy, then every parameter."""
    meta, stored = load(GOLDEN / f"{name}.npz")
    arrays = Arrays(stored)
    inputs = arrays.prefixed("input.")
    params = arrays.prefixed("param.")
    net = Net(meta["layers"], {key: (value.shape, value.dtype) for key, value in inputs.items()})
    losses, accuracies = arrays["loss"], arrays["accuracy"]
    assert len(losses) == len(accuracies) == meta["steps"] >= 2
    with new_device(kind, 4 * MiB) as device:
        executor = ResidentExecutor(net, device, make_solver(meta["solver"]))
        assert sorted(n for n, b in executor.blobs.items() if b.role == "param") == sorted(params)
        for key, value in params.items():
            executor.blobs[key].mutable_host_data()[...] = value
        for step in range(1, meta["steps"] + 1):
            out = executor.iterate(inputs)
            close(out["loss"], losses[step - 1], NET_LOSS, f"{name} loss at step {step}")
            assert out["accuracy"] == accuracies[step - 1], f"{name} accuracy at step {step}"
            for key, want in arrays.prefixed(f"after{step}.").items():
                close(executor.blobs[key].host_data(), want, NET_PARAM,
                      f"{name} {key} after step {step}")
    assert not arrays.unread(), f"{name}: stored but not compared: {arrays.unread()}"


def test_every_layer_type_has_a_fixture():
    """A layer registered without a golden case fails here: add one to scripts/make_golden.py."""
    covered = {meta["type"] for meta in FIXTURES.values() if meta["kind"] == "layer"}
    missing = sorted(set(LAYERS) - covered)
    assert not missing, f"no golden fixture for {missing}: add a case and run {REGENERATE}"
    unknown = sorted(covered - set(LAYERS))
    assert not unknown, f"fixtures for layer types minilms does not register: {unknown}"
    solvers = {meta["solver"]["type"] for meta in FIXTURES.values() if meta["kind"] == "net"}
    assert solvers == {"SGD", "Adam"}


def test_fixtures_are_small_plain_and_described():
    """Plain arrays (the loads above refuse pickles), a meta that says what each file is, and
    under 2 MB in all: the fixtures live in the repository."""
    paths = sorted(GOLDEN.glob("*.npz"))
    assert len(paths) >= 2 * len(LAYERS) and set(FIXTURES) == {p.stem for p in paths}
    assert sum(p.stat().st_size for p in paths) < 2_000_000
    for path in paths:
        meta, arrays = load(path)
        assert meta["format"] == 1 and meta["name"] == path.stem and meta["what"]
        assert meta["kind"] in ("layer", "net") and meta["torch"]
        assert all(a.dtype != object for a in arrays.values())
        floats = {a.dtype for a in arrays.values() if a.dtype.kind == "f"}
        assert floats <= {np.dtype(np.float32), np.dtype(np.float64)}


def test_the_script_refuses_without_pytorch():
    """Where torch cannot be imported (hidden here, so this runs with or without it) the script
    says why and exits 2, before it touches tests/golden/."""
    script = GOLDEN.parent.parent / "scripts" / "make_golden.py"
    hide_torch = ("import runpy, sys; sys.modules['torch'] = None; "
                  f"runpy.run_path({str(script)!r}, run_name='__main__')")
    before = {p.name: p.stat().st_mtime_ns for p in GOLDEN.iterdir()}
    done = subprocess.run([sys.executable, "-c", hide_torch], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "PyTorch is not installed" in done.stderr and "make_golden.py" in done.stderr
    assert {p.name: p.stat().st_mtime_ns for p in GOLDEN.iterdir()} == before
