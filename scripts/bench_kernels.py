"""Throughput of the ``cpu`` device's kernels against PyTorch on the CPU, same shapes, same run.

    python scripts/bench_kernels.py [--repeat 5] [--rounds 3] [--threads N] [--settle 0.3]
                                    [--warmup 0.2] [--only conv gemm pool bn]

Each case is timed as the best of ``--repeat`` runs after a warm-up (which also compiles), in
``--rounds`` rounds that alternate the two libraries, each keeping its best: a slow spell of the
machine (other tenants, a clock change) that falls on one library's turn does not decide the
ratio. Both libraries run on the same number of threads. Ratio = PyTorch time / minilms time:
above 1 minilms is faster. Goals: at least 0.5 on every shape, 1.0 on the convolutions of LeNet
and a small ResNet.
minilms layers run on plain arrays here (what the ``cpu`` device hands them), so staging is not
timed: that is the LMS benchmarks' business.
"""
import argparse
import os
import sys
import time

import numpy as np
from tqdm import tqdm

import minilms  # noqa: F401  (first: it sets the OpenMP wait policy before any thread pool starts)

GOAL_ALL, GOAL_CONV = 0.5, 1.0
# OpenBLAS's worker threads spin for about 2**28 cycles (~0.1 s) after a BLAS call before they
# sleep. On two cores a spinning worker takes half the machine from whatever runs next, so each
# library is timed only after the other's threads have gone quiet (measured: PyTorch's conv ran
# 2-3x slower right after a numpy GEMM than on its own).
SETTLE_SECONDS = 0.3
# This machine's cores run about 1.5x slower for the first ~60 ms of work after a second idle
# (measured: a 0.5 ms convolution took 0.76 ms for ~80 calls, then 0.51 ms). Each case therefore
# runs for WARMUP_SECONDS before it is timed, so both libraries are measured at full speed.
WARMUP_SECONDS = 0.2


def best(run, repeat: int, warmup: float = WARMUP_SECONDS) -> float:
    began = time.perf_counter()
    run()
    while time.perf_counter() - began < warmup:
        run()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return min(times)


def conv_cases(torch, F, rng):
    from minilms.layers import LAYERS, StepIO
    shapes = [  # (label, N, C, H, W, out, k, stride, pad)
        ("LeNet conv1", 64, 1, 28, 28, 20, 5, 1, 0),
        ("LeNet conv2", 64, 20, 12, 12, 50, 5, 1, 0),
        ("ResNet 16ch 32x32", 32, 16, 32, 32, 16, 3, 1, 1),
        ("ResNet 32ch 16x16", 32, 32, 16, 16, 32, 3, 1, 1),
        ("ResNet 64ch 8x8", 32, 64, 8, 8, 64, 3, 1, 1),
        ("ResNet down 16->32", 32, 16, 32, 32, 32, 3, 2, 1),
    ]
    for label, n, c, h, w, out, k, stride, pad in shapes:
        layer = LAYERS["Convolution"]("conv", ["x"], ["y"], num_output=out, kernel_size=k,
                                      stride=stride, pad=pad)
        (top_shape,) = layer.setup([(n, c, h, w)])
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        params = {p.name: p.initial(rng) for p in layer.params()}
        dy = rng.standard_normal(top_shape).astype(np.float32)
        io = StepIO(bottom=[x], top=[np.empty(top_shape, np.float32)], params=params,
                    work={b.name: np.empty(b.shape, b.dtype_in(np.float32))
                          for b in layer.workspace()},
                    top_grad=[dy], bottom_grad=[np.empty_like(x)],
                    param_grad={k_: np.empty_like(v) for k_, v in params.items()})
        tx = torch.tensor(x, requires_grad=True)
        tw = torch.tensor(params["weight"], requires_grad=True)
        tb = torch.tensor(params["bias"], requires_grad=True)
        ty = F.conv2d(tx, tw, tb, stride=stride, padding=pad)
        tdy = torch.tensor(dy)
        yield (f"conv fwd {label}", True, lambda io=io, layer=layer: layer.forward(io),
               lambda tx=tx, tw=tw, tb=tb, s=stride, p=pad:
               F.conv2d(tx, tw, tb, stride=s, padding=p))
        yield (f"conv bwd {label}", True, lambda io=io, layer=layer: layer.backward(io),
               lambda ty=ty, tx=tx, tw=tw, tb=tb, tdy=tdy:
               torch.autograd.grad(ty, (tx, tw, tb), tdy, retain_graph=True))


def gemm_cases(torch, F, rng):
    from minilms.kernels.gemm import gemm
    for m, n, k in ((256, 256, 256), (1024, 1024, 1024), (64, 4096, 576), (64, 500, 800)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        c = np.empty((m, n), np.float32)
        ta, tb = torch.tensor(a), torch.tensor(b)
        yield (f"gemm {m}x{n}x{k}", False, lambda a=a, b=b, c=c: gemm(a, b, c),
               lambda ta=ta, tb=tb: torch.mm(ta, tb))


def pool_cases(torch, F, rng):
    from minilms.kernels import pooling
    for label, shape, k, s, p in (("max 2x2 LeNet", (64, 20, 24, 24), 2, 2, 0),
                                  ("max 3x3/2 ResNet stem", (32, 64, 32, 32), 3, 2, 1),
                                  ("max 3x3/2 ResNet-50 pool1 b8", (8, 64, 112, 112), 3, 2, 1),
                                  ("max 3x3/2 GoogLeNet 56x56 b8", (8, 192, 56, 56), 3, 2, 1)):
        x = rng.standard_normal(shape).astype(np.float32)
        oh = pooling.pool_output_size(shape[2], k, s, p)
        ow = pooling.pool_output_size(shape[3], k, s, p)
        y = np.empty(shape[:2] + (oh, ow), np.float32)
        argmax = np.empty(y.shape, np.int32)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        dx = np.empty_like(x)
        tx = torch.tensor(x, requires_grad=True)
        ty = F.max_pool2d(tx, k, s, p)
        tdy = torch.tensor(dy)
        yield (f"pool fwd {label}", False,
               lambda x=x, y=y, am=argmax, k=k, s=s, p=p:
               pooling.max_pool_forward(x, y, am, k, s, p),
               lambda tx=tx, k=k, s=s, p=p: F.max_pool2d(tx, k, s, p))
        yield (f"pool bwd {label}", False,
               lambda dy=dy, am=argmax, dx=dx, k=k, s=s, p=p:
               pooling.max_pool_backward(dy, am, dx, k, s, p),
               lambda ty=ty, tx=tx, tdy=tdy: torch.autograd.grad(ty, tx, tdy, retain_graph=True))
    x = rng.standard_normal((32, 64, 8, 8)).astype(np.float32)
    y = np.empty((32, 64), np.float32)
    tx = torch.tensor(x)
    yield ("pool fwd global avg 64x8x8", False,
           lambda: pooling.global_avg_pool_forward(x, y), lambda: F.adaptive_avg_pool2d(tx, 1))


def bn_cases(torch, F, rng):
    from minilms.kernels import batchnorm

    def cases_for(shape):  # a scope per shape: the lambdas must not share loop variables
        c = shape[1]
        x = rng.standard_normal(shape).astype(np.float32)
        gamma, beta = np.ones(c, np.float32), np.zeros(c, np.float32)
        mean, invstd = np.empty(c, np.float32), np.empty(c, np.float32)
        rmean, rvar = np.zeros(c, np.float32), np.ones(c, np.float32)
        y, dy, dx = (np.empty_like(x), rng.standard_normal(shape).astype(np.float32),
                     np.empty_like(x))
        dgamma, dbeta = np.empty(c, np.float32), np.empty(c, np.float32)
        tx = torch.tensor(x, requires_grad=True)
        tg, tb = torch.ones(c, requires_grad=True), torch.zeros(c, requires_grad=True)
        trm, trv = torch.zeros(c), torch.ones(c)
        ty = F.batch_norm(tx, trm, trv, tg, tb, training=True)
        tdy = torch.tensor(dy)
        label = "x".join(map(str, shape))
        return [
            (f"bn fwd {label}", False,
             lambda: batchnorm.batchnorm_forward_train(x, gamma, beta, y, mean, invstd,
                                                       rmean, rvar),
             lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)),
            (f"bn bwd {label}", False,
             lambda: batchnorm.batchnorm_backward(x, dy, gamma, mean, invstd, dx, dgamma, dbeta),
             lambda: torch.autograd.grad(ty, (tx, tg, tb), tdy, retain_graph=True)),
        ]

    for shape in ((32, 16, 32, 32), (32, 64, 8, 8)):
        yield from cases_for(shape)


FAMILIES = {"conv": conv_cases, "gemm": gemm_cases, "pool": pool_cases, "bn": bn_cases}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3,
                        help="turns each library takes per case, alternating; each keeps its best")
    parser.add_argument("--threads", type=int, default=None, help="default: numba's thread count")
    parser.add_argument("--settle", type=float, default=SETTLE_SECONDS,
                        help="seconds of quiet before each library's timing (see SETTLE_SECONDS)")
    parser.add_argument("--warmup", type=float, default=WARMUP_SECONDS,
                        help="seconds each case runs before it is timed (see WARMUP_SECONDS)")
    parser.add_argument("--only", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    args = parser.parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("bench_kernels: PyTorch is not installed; it is the baseline (pip install torch)",
              file=sys.stderr)
        return 2
    import numba
    threads = args.threads or numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(threads)
    torch.set_num_threads(threads)
    torch.set_grad_enabled(True)
    rng = np.random.default_rng(0)
    cases = [case for family in args.only for case in FAMILIES[family](torch, F, rng)]
    print(f"minilms cpu kernels vs PyTorch {torch.__version__} CPU, {threads} threads, "
          f"best of {args.repeat} in each of {args.rounds} alternating rounds "
          "(ratio = torch time / minilms time)")
    rows, misses = [], []
    for name, is_conv, ours, theirs in tqdm(cases, desc="cases", leave=False):
        t_ours = t_torch = float("inf")
        for _ in range(args.rounds):
            time.sleep(args.settle)
            t_ours = min(t_ours, best(ours, args.repeat, args.warmup))
            time.sleep(args.settle)
            t_torch = min(t_torch, best(theirs, args.repeat, args.warmup))
        ratio = t_torch / t_ours
        goal = GOAL_CONV if is_conv else GOAL_ALL
        mark = "" if ratio >= goal else f"  < goal {goal}"
        if mark:
            misses.append(name)
        rows.append(f"{name:<34} {t_ours * 1e3:10.3f} {t_torch * 1e3:10.3f} {ratio:7.2f}{mark}")
    print(f"{'case':<34} {'minilms ms':>10} {'torch ms':>10} {'ratio':>7}", *rows, sep="\n")
    print("load average after the runs: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(f"{len(cases) - len(misses)} of {len(cases)} cases meet their goal"
          + (f"; missing: {', '.join(misses)}" if misses else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
