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

``--row-blocks`` times MKL's products in ``mkl.row_blocks``' blocks of rows against one call
(``kernels/mkl.py``, ``ROW_BLOCKS``) instead, on MKL alone:

1. **products**: the shapes the rule cuts (ResNet-50's 1x1s from 64 channels to 256 at 56x56, its
   input gradients, added or not) and some either side of it, a sample's product per thread as
   ``blas_threads`` deals them, each call's operands and output taken from a ring twice the
   last-level cache, so that the output is not in cache, as in a net: ms each way, whole over
   blocks;
2. **training**: each net LMS off and LMS on (an eighth of the pool), one executor, iterations
   alternating the switch: the median of the pairs' ratios.

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


# (m, k, n, a transposed, added into): the rule's shapes, then either side of it
BLOCK_SHAPES = ((256, 64, 3136, False, False), (256, 64, 3136, True, False),
                (256, 64, 3136, True, True), (512, 64, 784, False, False),
                (256, 96, 3136, False, False), (192, 48, 3136, False, False),
                (256, 40, 3136, False, False), (160, 64, 3136, False, False),
                (256, 128, 3136, False, False), (1024, 64, 196, False, False))


def time_row_blocks(shapes, samples: int, calls: int, ring_bytes: int):
    """``(shape, whole seconds, blocks seconds)`` per shape: ``samples`` products a call dealt out
    to the threads as ``blas_threads`` does, operands from a ring of ``ring_bytes``, whole and in
    blocks alternating; the median of ``calls`` each."""
    import numpy as np

    from minilms.kernels import blas_threads, mkl
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n, transposed, added in shapes:
        weight = rng.standard_normal((k, m) if transposed else (m, k), dtype=np.float32)
        weight = weight.T if transposed else weight
        per_call = 4 * samples * (k + m) * n
        ring = [(rng.standard_normal((samples, k, n), dtype=np.float32),
                 np.ones((samples, m, n), np.float32))
                for _ in range(max(2, ring_bytes // per_call + 1))]
        seconds = {True: [], False: []}
        for call in range(2 * calls + 2):
            for blocks in ((True, False) if call % 2 else (False, True)):
                x, out = ring[(2 * call + blocks) % len(ring)]
                mkl.ROW_BLOCKS = blocks
                start = time.perf_counter()
                blas_threads.matmul(weight, x, out=out, accumulate=added)
                if call >= 2:
                    seconds[blocks].append(time.perf_counter() - start)
        mkl.ROW_BLOCKS = True
        rows.append(((m, k, n, transposed, added), float(np.median(seconds[False])),
                     float(np.median(seconds[True]))))
    return rows


def time_switch_training(case, pairs: int, lms: bool):
    """``(whole s, blocks s, paired whole/blocks)``: one executor (``bench_fullsize.training``),
    its iterations alternating ``mkl.ROW_BLOCKS``."""
    import numpy as np
    from bench_fullsize import training

    from minilms.kernels import mkl
    _, inputs, executor, _, _ = training(dict(case, lms=lms), 8)
    seconds = {True: [], False: []}
    try:
        for pair in range(pairs + 1):           # the first pair warms up
            for blocks in ((True, False) if pair % 2 else (False, True)):
                mkl.ROW_BLOCKS = blocks
                began = time.perf_counter()
                executor.iterate(inputs)
                if pair:
                    seconds[blocks].append(time.perf_counter() - began)
    finally:
        mkl.ROW_BLOCKS = True
        executor.device.close()
    whole, blocks = np.array(seconds[False]), np.array(seconds[True])
    return float(np.median(whole)), float(np.median(blocks)), float(np.median(whole / blocks))


def row_blocks(cases, pairs: int, smoke: bool) -> int:
    """``--row-blocks``: the module docstring's two parts (``smoke``: one small shape, a small
    ring, the nets' cases as given)."""
    import numpy as np

    from minilms.device.cpu import last_level_cache
    from minilms.kernels import mkl
    mkl.use("mkl")
    shapes, samples, calls = BLOCK_SHAPES, 8, 12
    ring = 2 * (last_level_cache() or 2**25)
    if smoke:
        shapes, samples, calls, ring = ((256, 64, 392, False, False),), 2, 2, 2**24
    print(f"{'m x k x n':>18} {'':12} {'whole ms':>9} {'blocks ms':>10} {'whole/blocks':>12}  "
          f"({samples} samples a call, operands from a {ring >> 20} MiB ring, medians)")
    for (m, k, n, transposed, added), whole, blocks in time_row_blocks(shapes, samples, calls,
                                                                         ring):
        cut = len(mkl.row_blocks(mkl.gemm_arguments(
            np.empty((m, k), np.float32), np.empty((k, n), np.float32),
            np.empty((m, n), np.float32)), 4)) > 1
        how = ("a^T" if transposed else "") + (" added" if added else "")
        print(f"{f'{m} x {k} x {n}':>18} {how:12} {whole * 1e3:9.2f} {blocks * 1e3:10.2f} "
              f"{whole / blocks:11.2f}x{'' if cut else '  (not cut: the same calls)'}")
    print(f"\n{'net':24} {'LMS':>4} {'whole s':>8} {'blocks s':>9} {'paired':>8}")
    for case in cases:
        for lms in (False, True):
            whole, blocks, paired = time_switch_training(case, pairs, lms)
            name = f"{case['model']} {case['size']} b{case['batch']}"
            print(f"{name:24} {'on' if lms else 'off':>4} {whole:8.3f} {blocks:9.3f} "
                  f"{paired:7.3f}x")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet50:224:8", "googlenet:224:8"],
                   metavar="MODEL:SIZE:BATCH")
    p.add_argument("--pairs", type=int, default=12, help="training iterations on each library")
    p.add_argument("--seconds", type=float, default=2.0, help="per product shape")
    p.add_argument("--row-blocks", action="store_true",
                   help="MKL's products in blocks of rows against whole calls (docstring)")
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
        if args.row_blocks:
            return row_blocks(cases, args.pairs, args.smoke)
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
