"""Optimizer updates on the calling thread below ``optimizers.SERIAL_BELOW`` against Numba's
workers for every size: the figures behind that rule.

    python scripts/bench_updates.py [--models resnet50:224:8] [--pairs 8] [--calls 30]

Two parts, each alternating its contenders in one process (a VM's speed drifts):

1. **sizes**: ``sgd_step`` with momentum on 2^8 to 2^22 elements, the parallel kernel and the
   serial one, each call right after a GEMM (as in training, where Numba's workers have gone to
   sleep while BLAS ran): the median us of each and whether the two gave the same bits;
2. **training**: each net LMS off, one executor, its iterations alternating ``SERIAL_BELOW`` (0:
   every update on the workers; the rule's): the median seconds of an iteration, and the update
   steps' ms an iteration, those of up to 2^18 elements and the rest apart.

``--smoke``: tiny, for the test suite.
"""
import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def time_sizes(calls: int, sizes) -> None:
    import numpy as np

    from minilms.kernels import optimizers
    rng = np.random.default_rng(0)
    a, b = rng.random((512, 512), dtype=np.float32), rng.random((512, 256), dtype=np.float32)
    print(f"{'elements':>10} {'workers us':>10} {'serial us':>9} {'ratio':>6}  same bits  "
          "(median of calls, each after a GEMM)")
    for size in sizes:
        grad = rng.standard_normal(size, dtype=np.float32)
        start = rng.standard_normal(size, dtype=np.float32)
        state = {rule: (start.copy(), np.zeros_like(start)) for rule in (0, 1 << 62)}
        spent = {rule: [] for rule in state}
        for turn in range(calls):
            for rule in (0, 1 << 62) if turn % 2 else (1 << 62, 0):
                optimizers.SERIAL_BELOW = rule
                a @ b
                began = time.perf_counter()
                optimizers.sgd_step(state[rule][0], grad, 0.01, state[rule][1], 0.9)
                spent[rule].append(time.perf_counter() - began)
        optimizers.SERIAL_BELOW = 1 << 18
        workers, serial = (np.median(spent[rule]) * 1e6 for rule in (0, 1 << 62))
        same = all(np.array_equal(x, y) for x, y in zip(state[0], state[1 << 62]))
        print(f"{size:10d} {workers:10.1f} {serial:9.1f} {workers / serial:5.2f}x  "
              f"{'yes' if same else 'NO'}")


def time_training(case, pairs: int):
    """``({rule: [iteration s]}, {(rule, small): update steps' s summed})``, LMS off."""
    import numpy as np
    from bench_fullsize import training
    from bench_windows import alternating_iterations

    from minilms.kernels import optimizers
    net, inputs, executor, _, _ = training(dict(case, lms=False), 8)
    run_step, spent, rule_now = executor.run_step, collections.defaultdict(float), [0]

    def timed(index, step, train, solver):
        began = time.perf_counter()
        run_step(index, step, train, solver)
        if step.kind == "update":
            size = max(int(np.prod(p.shape)) for p in net.learnable(net.layer[step.layer]))
            spent[(rule_now[0], size < 1 << 18)] += time.perf_counter() - began
    def switched(rule):
        optimizers.SERIAL_BELOW = rule_now[0] = rule
    executor.run_step = timed
    try:
        seconds = alternating_iterations(executor, inputs, pairs, case["model"], switched,
                                         (0, 1 << 18), spent.clear)
    finally:
        optimizers.SERIAL_BELOW = 1 << 18
        executor.device.close()
    return seconds, spent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet50:224:8"], metavar="MODEL:SIZE:BATCH")
    p.add_argument("--pairs", type=int, default=8, help="training iterations each way")
    p.add_argument("--calls", type=int, default=30, help="calls each way per size")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    args = p.parse_args(argv)
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import numpy as np

    from bench_fullsize import parse_case
    cases = [parse_case(text, "bench_updates: --models") for text in args.models]
    sizes = [1 << k for k in range(8, 23, 2)]
    if args.smoke:
        cases = [{"model": "resnet50", "size": 32, "batch": 2, "width": 16, "classes": 10}]
        args.pairs, args.calls, sizes = 1, 2, [256, 1 << 18]
    time_sizes(args.calls, sizes)
    print(f"\n{'net (LMS off)':20} {'workers s':>9} {'rule s':>7} {'paired':>7}  update steps, ms "
          "an iteration (workers / rule): up to 2^18 elements, above")
    for case in cases:
        seconds, spent = time_training(case, args.pairs)
        workers, rule = np.array(seconds[0]), np.array(seconds[1 << 18])
        name = f"{case['model']} {case['size']} b{case['batch']}"
        steps = ", ".join(f"{spent[(0, small)] / args.pairs * 1e3:.1f} / "
                          f"{spent[(1 << 18, small)] / args.pairs * 1e3:.1f}"
                          for small in (True, False))
        print(f"{name:20} {np.median(workers):9.3f} {np.median(rule):7.3f} "
              f"{np.median(workers / rule):6.3f}x  {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
