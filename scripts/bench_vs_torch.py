"""Training throughput of minilms on the ``cpu`` device against PyTorch on the CPU: same models,
same batch, same threads, same SGD, same initial weights, in the same process.

    python scripts/bench_vs_torch.py [--models lenet resnet18] [--lenet-batch 64]
                                     [--resnet-batch 32] [--iters 10] [--runs 3] [--steps 5]
                                     [--threads N] [--no-lms] [--profile] [--smoke]

Models: LeNet on 28x28x1 and ``zoo.resnet(18, num_classes=10, width=4)`` on 32x32x3. The PyTorch
model is built from the same layer list (``nn.Conv2d``, ``nn.BatchNorm2d`` in training mode,
``nn.Linear``, ``nn.MaxPool2d``...; the residual adds as the layer list names them) and starts
from minilms' initial parameters (PyTorch layouts are ours: conv ``[out, in, kh, kw]``, linear
``[out, in]``, BatchNorm weight, bias and running statistics). Both train with SGD, momentum 0.9,
on one fixed random batch (pixel-like values in [0, 1)).

minilms runs as ``LmsExecutor(net, device, SGD, Policy(enabled=False))`` on a ``cpu`` device whose
pool holds the whole net (LMS off); with LMS on (``policy: auto`` in a pool of ``--cap`` times the
least LMS needs, no link model) as an extra row unless ``--no-lms``. Both libraries use the cores
numba uses (``numba.get_num_threads()``, or ``--threads``).

Timing: after ``--steps`` iterations (which also compile, and give the loss curves compared below)
and ``--warmup`` more, ``--runs`` timed runs of ``--iters`` iterations each, the libraries taking
turns run by run (so a change in the machine's load hits both); images/s is from the best run of
each. Ratio = minilms images/s / PyTorch images/s (goal 1.0x: above 1 minilms is faster).

Agreement: the loss of each of the first ``--steps`` iterations, both libraries from the same
weights; the largest relative difference should be float32 rounding. Training amplifies rounding
(a BatchNorm net's more than LeNet's), so PyTorch also runs those steps in float64 from the same
weights: that curve has no float32 rounding, and says which float32 curve drifted. LMS on must
give LMS off's losses bit for bit.

``--profile``: minilms (LMS off) under cProfile for a few iterations per model, the top 15
functions by total time. cProfile sees Python functions and builtins: time in a numpy ufunc such
as ``np.matmul`` (BLAS) is counted in the Python function that called it. If PyTorch is not
installed, the script says so and exits 0: it is the baseline.
"""
import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# minilms before numpy: it sets the OpenMP wait policy and OpenBLAS's thread timeout, which
# OpenBLAS reads when numpy loads it (``python -m minilms.train`` always imports it first)
import minilms  # noqa: E402,F401,I001
import numpy as np  # noqa: E402
from minilms import zoo  # noqa: E402
from minilms.device import make_device  # noqa: E402
from minilms.lms import (  # noqa: E402
    LmsExecutor,  # noqa: E402
    Policy,
    least_pool,
    resident_bytes,
)
from minilms.net import Net  # noqa: E402
from minilms.sizes import format_bytes  # noqa: E402
from minilms.solver import SGD  # noqa: E402

MiB = 2**20
LR, MOMENTUM = 0.01, 0.9
GOAL = 1.0


# -- the models -----------------------------------------------------------------------------------

def model_spec(name):
    """(layer list, input channels, image size)."""
    if name == "lenet":
        return zoo.lenet(num_classes=10), 1, 28
    return zoo.resnet(18, num_classes=10, width=4), 3, 32


def make_batch(batch, channels, size, seed=0):
    """Pixel-like inputs in [0, 1) (standard normal ones make LeNet, which has no normalisation,
    diverge at this learning rate within a few steps), labels in [0, 10)."""
    rng = np.random.default_rng(seed)
    return {"data": rng.random((batch, channels, size, size), dtype=np.float32),
            "label": rng.integers(0, 10, batch).astype(np.int32)}


def build_net(layers, batch):
    return Net(layers, {k: (v.shape, v.dtype) for k, v in batch.items()}, device_kind="cpu")


def torch_model(torch, net):
    """The PyTorch module that computes what ``net`` (a minilms ``Net``) computes, layer by layer,
    blobs by name. Returns the module and ``copy_params(params)``, which loads minilms parameters
    (``{"<layer>.<param>": array}``) into it."""
    nn, F = torch.nn, torch.nn.functional
    modules = nn.ModuleDict()
    for layer in net.layers:
        kind, shape = layer.type, layer.bottom_shapes[0]
        if kind == "Convolution":
            modules[layer.name] = nn.Conv2d(shape[1], layer.num_output, layer.kernel_size,
                                            layer.stride, layer.pad, layer.dilation, layer.groups,
                                            bias=layer.bias)
        elif kind == "BatchNorm":
            norm = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}
            modules[layer.name] = norm[len(shape)](shape[1], eps=layer.eps,
                                                   momentum=layer.momentum, affine=layer.affine)
        elif kind == "InnerProduct":
            modules[layer.name] = nn.Linear(layer.k, layer.num_output, bias=layer.bias)
        elif kind == "Pooling":
            if layer.global_pooling and layer.pool == "ave":
                modules[layer.name] = nn.AdaptiveAvgPool2d(1)
            elif layer.global_pooling:
                modules[layer.name] = nn.AdaptiveMaxPool2d(1)
            elif layer.pool == "max":
                modules[layer.name] = nn.MaxPool2d(layer.kernel, layer.stride, layer.pad,
                                                   ceil_mode=layer.ceil_mode)
            else:
                modules[layer.name] = nn.AvgPool2d(layer.kernel, layer.stride, layer.pad,
                                                   ceil_mode=layer.ceil_mode,
                                                   count_include_pad=layer.count_include_pad)
        elif kind == "ReLU":
            modules[layer.name] = nn.ReLU(inplace=layer.top == layer.bottom)
        elif kind == "Dropout":
            modules[layer.name] = nn.Dropout(layer.ratio)
        elif kind not in ("Eltwise", "SoftmaxWithLoss", "Accuracy", "Flatten", "Concat"):
            raise NotImplementedError(f"bench_vs_torch: no PyTorch counterpart for {kind}")

    class FromLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = modules

        def forward(self, data, label):
            blobs, loss = {"data": data, "label": label}, 0.0
            for layer in net.layers:
                x = [blobs[b] for b in layer.bottom]
                if layer.type == "Eltwise":
                    y = sum(c * v if c != 1.0 else v for c, v in zip(layer.coeffs, x))
                elif layer.type == "InnerProduct":
                    y = self.layers[layer.name](x[0].flatten(1))
                elif layer.type == "Concat":
                    y = torch.cat(x, dim=1)
                elif layer.type == "Flatten":
                    y = x[0].flatten(1)
                elif layer.type == "SoftmaxWithLoss":
                    y = layer.loss_weight * F.cross_entropy(x[0].flatten(1), x[1])
                    loss = loss + y
                elif layer.type == "Accuracy":
                    with torch.no_grad():
                        top = x[0].flatten(1).topk(layer.top_k, 1).indices
                        y = (top == x[1][:, None]).any(1).float().mean()
                else:
                    y = self.layers[layer.name](x[0])
                if getattr(layer, "relu", False):   # a ReLU fused into it (minilms.fusion)
                    y = F.relu(y)
                blobs[layer.top[0]] = y
            return loss

    model = FromLayers()

    def copy_params(params):
        with torch.no_grad():
            for layer in net.layers:
                for spec in layer.params():
                    target = getattr(modules[layer.name], spec.name)
                    value = torch.from_numpy(np.array(params[f"{layer.name}.{spec.name}"]))
                    if target.shape != value.shape:
                        raise ValueError(f"{layer.name}.{spec.name}: ours {tuple(value.shape)}, "
                                         f"PyTorch's {tuple(target.shape)}")
                    target.copy_(value)

    return model, copy_params


def initial_params(executor):
    executor.sync_state()
    return {name: blob.host_data().copy() for name, blob in executor.shared.items()
            if blob.role == "param"}


# -- one model ------------------------------------------------------------------------------------

class Contender:
    """A name and ``step()``: one training iteration, returning the loss."""

    def __init__(self, name, step, close=None):
        self.name, self.step, self.close = name, step, close or (lambda: None)
        self.losses, self.best = [], float("inf")

    def timed(self, iters):
        began = time.perf_counter()
        for _ in range(iters):
            self.step()
        self.best = min(self.best, time.perf_counter() - began)


def minilms_contender(name, layers, batch, capacity, policy):
    net = build_net(layers, batch)
    device = make_device("cpu", capacity)
    executor = LmsExecutor(net, device, SGD(LR, momentum=MOMENTUM), policy)
    contender = Contender(name, lambda: executor.iterate(batch)["loss"], device.close)
    contender.executor = executor
    return contender


def torch_contender(torch, net, batch, params, dtype=None):
    model, copy_params = torch_model(torch, net)
    copy_params(params)
    dtype = dtype or torch.float32
    model.to(dtype).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x = torch.from_numpy(batch["data"]).to(dtype)
    y = torch.from_numpy(batch["label"].astype(np.int64))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        return loss.item()

    return Contender(f"PyTorch {torch.__version__}", step)


def reference_losses(torch, net, batch, params, steps):
    """PyTorch in float64 from the same float32 weights: the loss curve without float32
    rounding, to tell which of two float32 curves drifts."""
    reference = torch_contender(torch, net, batch, params, torch.float64)
    return [reference.step() for _ in range(steps)]


def bench_model(torch, args, name, batch_size):
    layers, channels, size = model_spec(name)
    batch = make_batch(batch_size, channels, size)
    net = build_net(layers, batch)
    steps = net.schedule(("momentum",))
    fits = resident_bytes(net, steps) + MiB
    capped = int(args.cap * least_pool(net, steps))
    off = minilms_contender("minilms, LMS off", layers, batch, fits, Policy(enabled=False))
    contenders = [off]
    try:
        params = initial_params(off.executor)
        theirs = torch_contender(torch, net, batch, params)
        exact = reference_losses(torch, net, batch, params, args.steps)
        contenders.insert(0, theirs)
        if args.lms:
            contenders.append(minilms_contender(
                f"minilms, LMS on (auto, {format_bytes(capped)})", layers, batch, capped,
                Policy(policy="auto")))
        for contender in contenders:             # the loss curves; compiles, warms up
            contender.losses = [contender.step() for _ in range(args.steps)]
            for _ in range(args.warmup):
                contender.step()
        for _ in range(args.runs):               # taking turns, run by run
            for contender in contenders:
                contender.timed(args.iters)
        profile = profiled(off, args) if args.profile else None
    finally:
        for contender in contenders:
            contender.close()
    return {"name": name, "batch": batch_size, "contenders": contenders, "torch": theirs,
            "off": off, "lms": contenders[2] if args.lms else None, "exact": exact,
            "profile": profile}


def profiled(contender, args) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.profile_iters):
        contender.step()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    total = next((line.strip() for line in lines if "function calls" in line), "")
    return "\n".join([total] + lines[start:])


def environment() -> str:
    """numpy's BLAS and the thread settings that govern it, and the load on the machine: a
    shared, busy machine slows the libraries unequally (their thread pools wait differently)."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{blas['name']} {blas.get('version', '')}".strip()
    except Exception:   # older numpy: no dicts
        blas = "unknown"
    settings = ", ".join(f"{k}={os.environ[k]}" if k in os.environ else f"{k} unset"
                         for k in ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS"))
    return f"numpy BLAS: {blas} ({settings}); {load()}"


def load() -> str:
    try:
        return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        return "load average unknown"


def rel_diff(a, b) -> float:
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30)))


# -- the report -----------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", choices=("lenet", "resnet18"),
                   default=["lenet", "resnet18"])
    p.add_argument("--lenet-batch", type=int, default=64)
    p.add_argument("--resnet-batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=10, help="iterations per timed run")
    p.add_argument("--runs", type=int, default=3, help="timed runs; the best one counts")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations after the curve")
    p.add_argument("--steps", type=int, default=5, help="iterations whose losses are compared")
    p.add_argument("--threads", type=int, default=None, help="default: numba.get_num_threads()")
    p.add_argument("--cap", type=float, default=1.25, help="LMS row's pool: this times the least")
    p.add_argument("--no-lms", dest="lms", action="store_false", help="no LMS-on row")
    p.add_argument("--profile", action="store_true", help="cProfile minilms: top 15 functions")
    p.add_argument("--profile-iters", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    args = p.parse_args(argv)
    if args.smoke:
        args.lenet_batch = args.resnet_batch = 4
        args.iters, args.runs, args.warmup, args.steps, args.profile_iters = 2, 1, 0, 2, 2
    try:
        import torch
    except ImportError as error:
        print(f"bench_vs_torch: skipped, PyTorch is the baseline and it is not installed "
              f"({error}; pip install torch)")
        return 0
    import numba
    if args.threads:
        numba.set_num_threads(args.threads)
    threads = numba.get_num_threads()
    torch.set_num_threads(threads)
    torch.set_grad_enabled(True)
    print(f"minilms (cpu device) vs PyTorch {torch.__version__} CPU training, {threads} threads "
          f"each; SGD lr {LR} momentum {MOMENTUM}; {args.steps} compared steps, {args.warmup} "
          f"warm-up, best of {args.runs} runs of {args.iters} iterations (the machine may be "
          f"shared: best-of is the least disturbed run)")
    print(environment())
    results = []
    for name in args.models:
        batch = args.lenet_batch if name == "lenet" else args.resnet_batch
        print(f"... {name}, batch {batch}", file=sys.stderr, flush=True)
        results.append(bench_model(torch, args, name, batch))

    print(f"\n{'model':<9} {'batch':>5}  {'row':<36} {'images/s':>9} {'ms/iter':>9} "
          f"{'vs torch':>8}")
    for r in results:
        base = r["torch"].best
        for c in r["contenders"]:
            per_iter = c.best / args.iters
            print(f"{r['name']:<9} {r['batch']:>5}  {c.name:<36} {r['batch'] / per_iter:>9.1f} "
                  f"{per_iter * 1e3:>9.2f} {base / c.best:>7.2f}x")

    print(f"\nloss agreement, {args.steps} SGD steps from the same initial weights: the last "
          f"losses, and the largest relative difference over the {args.steps} steps; f64 is "
          f"PyTorch in float64 (no float32 rounding)")
    print(f"{'model':<9} {'minilms':>11} {'torch':>11} {'torch f64':>11} {'ours/torch':>11} "
          f"{'ours/f64':>9} {'torch/f64':>9}  LMS on = off")
    for r in results:
        ours, theirs, exact = (np.array(v) for v in (r["off"].losses, r["torch"].losses,
                                                      r["exact"]))
        same = ("-" if r["lms"] is None else
                "bit for bit" if r["lms"].losses == r["off"].losses else "DIFFERENT")
        print(f"{r['name']:<9} {ours[-1]:>11.7f} {theirs[-1]:>11.7f} {exact[-1]:>11.7f} "
              f"{rel_diff(ours, theirs):>11.2e} {rel_diff(ours, exact):>9.2e} "
              f"{rel_diff(theirs, exact):>9.2e}  {same}")

    print(f"\nafter the runs: {load()}")
    for r in results:
        ratio = r["torch"].best / r["off"].best
        print(f"ratio minilms/torch images/s, {r['name']} batch {r['batch']} (LMS off): "
              f"{ratio:.2f}x (goal {GOAL:.1f}x: {'met' if ratio >= GOAL else 'not met'})")
    if args.profile:
        for r in results:
            print(f"\nprofile: minilms LMS off, {r['name']} batch {r['batch']}, "
                  f"{args.profile_iters} iterations, top 15 by total time (tottime; numpy "
                  f"ufuncs such as matmul count in their caller)")
            print(r["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
