"""MKL against numpy's OpenBLAS for the ``cpu`` device's products (``kernels/mkl.py``).

    python scripts/bench_blas.py [--models resnet50:224:8 googlenet:224:8] [--pairs 12]

Two parts, each alternating the two libraries in one process (call by call, then iteration by
iteration), so that a machine whose speed drifts (a VM's neighbours) moves both alike:

1. **products**: every distinct GEMM of the first net's 1x1 convolutions (the forward ``W @ x``,
   the input gradient ``W^T @ dy``, the weight gradient ``dy @ x^T``, per sample) on one thread,
   as ``blas_threads`` gives each thread its piece: GFLOP/s on each library, best of many calls;
2. **training**: each net LMS off, one executor, its iterations alternating the library (pairs,
   the order swapped every other pair): the median seconds of each, and the median of the
   pairs' ratios.

Needs the ``mkl`` wheel (``pip install -e ".[mkl]"``). ``--smoke``: tiny, for the test suite.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def product_shapes(net):
    """``(label, m, k, n, transposed b)`` of each distinct 1x1 stride-1 product, per sample."""
    shapes = {}
    for layer in net.layers:
        if layer.type != "Convolution" or layer.kernel_size != (1, 1) or layer.stride != (1, 1):
            continue
        channels = layer.bottom_shapes[0][1]
        out, plane = layer.num_output, layer.bottom_shapes[0][2] * layer.bottom_shapes[0][3]
        for label, m, k, n, trans in (("forward", out, channels, plane, False),
                                      ("input grad", channels, out, plane, False),
                                      ("weight grad", out, plane, channels, True)):
            shapes.setdefault((label, m, k, n, trans), None)
    return list(shapes)


def time_products(shapes, seconds):
    import numpy as np
    from threadpoolctl import threadpool_limits

    from minilms.kernels import mkl
    rng = np.random.default_rng(0)
    print(f"{'product':12} {'m x k x n':>18} {'OpenBLAS':>9} {'MKL':>7} {'MKL/OB':>7}  (GFLOP/s, "
          "one thread, best of alternating calls)")
    ratios = []
    with threadpool_limits(1, user_api="blas"):
        for label, m, k, n, trans in shapes:
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((n, k) if trans else (k, n), dtype=np.float32)
            b = b.T if trans else b
            out = np.empty((m, n), np.float32)
            best = {"openblas": float("inf"), "mkl": float("inf")}
            began = time.perf_counter()
            while time.perf_counter() - began < seconds:
                for name in best:
                    mkl.use(name)
                    start = time.perf_counter()
                    mkl.product(a, b, out)
                    best[name] = min(best[name], time.perf_counter() - start)
            rate = {name: 2 * m * k * n / t / 1e9 for name, t in best.items()}
            ratios.append(rate["mkl"] / rate["openblas"])
            print(f"{label:12} {f'{m} x {k} x {n}':>18} {rate['openblas']:9.0f} {rate['mkl']:7.0f} "
                  f"{ratios[-1]:6.2f}x")
    return ratios


def time_training(case, pairs):
    import numpy as np
    from bench_fullsize import build

    from minilms.device import make_device
    from minilms.kernels import mkl
    from minilms.lms import LmsExecutor, Policy, resident_bytes
    from minilms.solver import SGD
    net, inputs = build(case, np)
    pool = resident_bytes(net, net.schedule(("momentum",))) + 2**20
    with make_device("cpu", pool) as device:
        executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), Policy(enabled=False))
        seconds = {"openblas": [], "mkl": []}
        for name in seconds:          # a warm-up iteration on each
            mkl.use(name)
            executor.iterate(inputs)
        for pair in range(pairs):
            for name in (("openblas", "mkl") if pair % 2 == 0 else ("mkl", "openblas")):
                mkl.use(name)
                began = time.perf_counter()
                executor.iterate(inputs)
                seconds[name].append(time.perf_counter() - began)
    ob, mk = (np.array(seconds[name]) for name in ("openblas", "mkl"))
    return float(np.median(ob)), float(np.median(mk)), float(np.median(ob / mk))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet50:224:8", "googlenet:224:8"],
                   metavar="MODEL:SIZE:BATCH")
    p.add_argument("--pairs", type=int, default=12, help="training iterations on each library")
    p.add_argument("--seconds", type=float, default=2.0, help="per product shape")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    args = p.parse_args(argv)
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import numpy as np

    from bench_fullsize import build, parse_case
    from minilms.kernels import mkl
    if not mkl.available():
        print("bench_blas: skipped, MKL is not installed here (pip install -e \".[mkl]\")")
        return 0
    cases = [parse_case(text, "bench_blas: --models") for text in args.models]
    if args.smoke:
        cases = [{"model": "resnet50", "size": 32, "batch": 2, "width": 16, "classes": 10}]
        args.pairs, args.seconds = 1, 0.05
    chosen = mkl.chosen()
    try:
        net, _ = build(cases[0], np)
        ratios = time_products(product_shapes(net), args.seconds)
        print(f"MKL/OpenBLAS on {cases[0]['model']}'s products: {min(ratios):.2f}-"
              f"{max(ratios):.2f}x, median {float(np.median(ratios)):.2f}x\n")
        print(f"{'net (LMS off)':24} {'OpenBLAS s':>10} {'MKL s':>7} {'paired OB/MKL':>13}")
        for case in cases:
            ob, mk, paired = time_training(case, args.pairs)
            name = f"{case['model']} {case['size']} b{case['batch']}"
            print(f"{name:24} {ob:10.3f} {mk:7.3f} {paired:12.3f}x")
    finally:
        mkl.use(chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
