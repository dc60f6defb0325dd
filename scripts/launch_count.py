"""CUDA kernel launches and host synchronizations per training iteration, before and after the
convolution ran a chunk of samples per launch (issue 19).

    python scripts/launch_count.py [--models lenet resnet18] [--batches 2 8 64] [--size 224]
                                   [--smoke]

Counted in this process under the Numba CUDA simulator (no GPU is needed): ``kernels.common``
counts every launch (``counting_launches``), and the device's blocking calls (``synchronize``,
an event's ``synchronize``, a copy to the host on the default stream) are counted where the
executor makes them. "Before" forces the convolution's per-sample path (the one that ran before
issue 19: a few launches per sample); "after" is today's. ``syncs``: an ``iterate`` (which waits
for everything at its end); ``loop``: an iteration as the training loop runs it (``submit`` the
next, then read the last one's loss: the waits are for events of the iterations before, never
for the device as a whole).

The kernels are *not run*, only counted (``counting_launches(run=False)``), so the full-size
schedule (ResNet-18 at 224x224, batch 64) is counted by the executor's own walk through it in
seconds, with memory the simulator allocates on the host (garbage values, which nothing reads).
Which kernels launch is decided on the host, never by a kernel's result; tests/test_launches.py
runs the kernels in the simulator on a small net and finds the same counts both ways (running
even LeNet's kernels in the simulator takes more than ten minutes).
"""
import argparse
import os
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")   # before numba is imported
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from minilms import zoo  # noqa: E402
from minilms.device.cuda import CudaDevice  # noqa: E402
from minilms.kernels import common  # noqa: E402
from minilms.layers.convolution import Convolution  # noqa: E402
from minilms.lms import LmsExecutor, Policy, least_pool  # noqa: E402
from minilms.net import Net  # noqa: E402
from minilms.solver import SGD  # noqa: E402


@contextmanager
def counting_syncs(device):
    """Count the host's blocking calls on ``device``: Counter by kind."""
    counts = Counter()
    synchronize, to_host, event, d2h = device.synchronize, device.to_host, device.event, device.d2h

    def counted(kind, fn):
        def call(*args, **kwargs):
            counts[kind] += 1
            return fn(*args, **kwargs)
        return call

    def new_event():
        made = event()
        made.synchronize = counted("event.synchronize", made.synchronize)
        return made

    def copy_back(dst, src, stream=None, label=""):
        if stream is None:                  # the default stream: the host waits for the copy
            counts["blocking d2h"] += 1
        return d2h(dst, src, stream, label)

    device.synchronize = counted("device.synchronize", synchronize)
    device.to_host = counted("to_host", to_host)
    device.event, device.d2h = new_event, copy_back
    try:
        yield counts
    finally:
        device.synchronize, device.to_host, device.event, device.d2h = (synchronize, to_host,
                                                                         event, d2h)


def layers_of(model, width):
    return zoo.lenet(num_classes=10) if model == "lenet" else \
        zoo.MODELS[model](num_classes=10, width=width)


def count(model, batch, size, width, before):
    channels = 1 if model == "lenet" else 3
    size = 28 if model == "lenet" else size
    rng = np.random.default_rng(0)
    inputs = {"data": rng.standard_normal((batch, channels, size, size)).astype(np.float32),
              "label": rng.integers(0, 10, batch).astype(np.int32)}
    shapes = {k: (v.shape, v.dtype) for k, v in inputs.items()}
    layers = layers_of(model, width)
    net = Net(layers, shapes)
    pool = int(1.5 * least_pool(net, net.schedule(("momentum",))))
    patches = [mock.patch.multiple(Convolution, _batch_chunk=lambda self, n: 0,
                                   pointwise_on_cuda=False)] if before else []
    with CudaDevice(pool) as device, counting_syncs(device) as blocking:
        for patch in patches:
            patch.start()
        try:
            executor = LmsExecutor(Net(layers, shapes, device_kind="cuda"), device,
                                   SGD(0.01, momentum=0.9), Policy(prefetch=2))
            with common.counting_launches(run=False):
                executor.iterate(inputs)                 # the first runs the prologue too
            before = Counter(blocking)
            with common.counting_launches(run=False) as launches:
                executor.iterate(inputs)
            syncs = blocking - before
            with common.counting_launches(run=False):
                issued = executor.submit(inputs)
                before = Counter(blocking)
                executor.submit(inputs)                  # the training loop: issue the next,
                issued.result()                          # then read the last one's loss
            behind = blocking - before
        finally:
            for patch in patches:
                patch.stop()
    return launches, syncs, behind, len(executor.plan.steps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["lenet", "resnet18"])
    p.add_argument("--batches", type=int, nargs="+", default=[2, 8, 64])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--width", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    args = p.parse_args(argv)
    if args.smoke:
        args.models, args.batches, args.size, args.width = ["resnet18"], [2, 4], 32, 16
    print("launches and host synchronizations per training iteration (counted, kernels not run); "
          "before: the convolution one sample at a time, after: a chunk of samples per launch")
    print(f"{'model':9} {'input':>9} {'batch':>5} {'steps':>5} {'launches before':>15} "
          f"{'after':>7} {'conv before':>11} {'conv after':>10} {'syncs':>5} {'loop':>4}  s")
    for model in args.models:
        for batch in args.batches:
            start = time.perf_counter()
            row = {}
            for before in (True, False):
                row[before] = count(model, batch, args.size, args.width, before)
            took = time.perf_counter() - start
            (b_launch, _, _, steps), (a_launch, syncs, behind, _) = row[True], row[False]
            conv = ("im2col", "col2im", "gemm", "channel", "add_channel", "fill", "sum_splits")
            conv_b = sum(n for k, n in b_launch.items() if k.startswith(conv))
            conv_a = sum(n for k, n in a_launch.items() if k.startswith(conv))
            size = 28 if model == "lenet" else args.size
            name = model if model == "lenet" or args.width == 1 else f"{model}/{args.width}"
            print(f"{name:9} {f'{size}x{size}':>9} {batch:5d} {steps:5d} "
                  f"{sum(b_launch.values()):15d} {sum(a_launch.values()):7d} {conv_b:11d} "
                  f"{conv_a:10d} {sum(syncs.values()):5d} {sum(behind.values()):4d}  {took:.1f}")
            print("    syncs: " + ", ".join(f"{k} {n}" for k, n in sorted(syncs.items()))
                  + "; the loop's: " + ", ".join(f"{k} {n}" for k, n in sorted(behind.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
