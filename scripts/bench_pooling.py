"""The ``cpu`` device's max-pool forwards against each other: output by output
(``pooling.max_pool_forward_cpu``), a row of outputs at a time (``pooling_rows``) and two passes a
plane (``pooling_planes``), on a net's pools and in training.

    python scripts/bench_pooling.py [--models resnet50:224:8 googlenet:224:8] [--pairs 12]
                                    [--rounds 9]

Two parts, each alternating its contenders in one process (a VM's speed drifts):

1. **layers**: every distinct max pool of the nets, each kernel that can run it called in turn,
   ``--rounds`` times: the median ms of each, and the two passes' ratio to the best other;
2. **training**: each net LMS off, one executor, its iterations alternating the two passes on
   and off (``pooling_planes.ENABLED``) in pairs: the median seconds and the median of the pairs'
   ratios.

``--smoke``: tiny, for the test suite.
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pool_shapes(net):
    """``(name, x shape, y shape, kernel, stride, pad)`` of each distinct max pool."""
    shapes = {}
    for layer in net.layers:
        if layer.type == "Pooling" and layer.pool == "max" and not layer.global_pooling:
            key = (layer.bottom_shapes[0], layer.top_shapes[0], layer.kernel, layer.stride,
                   layer.pad)
            shapes.setdefault(key, layer.name)
    return [(name,) + key for key, name in shapes.items()]


def kernels_for(x, y, geom):
    """The forwards that can run this pooling, by name."""
    from minilms.kernels import pooling, pooling_planes, pooling_rows
    kh, kw, sh, sw, ph, pw = geom
    found = {"per output": pooling.max_pool_forward_cpu}
    if sw == 1:
        found["rows"] = pooling_rows.max_pool_forward_rows_cpu
    elif sw == 2 and pooling_rows.stride2_rows_pay(x.shape[3], y.shape[3], kw, pw):
        found["rows"] = pooling_rows.max_pool_forward_stride2_cpu
    if pooling_planes.applies(geom, x.shape[3], y.shape[3]):
        found["planes"] = pooling_planes.max_pool_forward_planes_cpu
    return found


def time_layers(shapes, rounds: int) -> None:
    import numpy as np

    from minilms.kernels import pooling
    print(f"{'layer':14} {'input':>18} {'k/s/p':>7} {'per output':>11} {'rows':>7} "
          f"{'planes':>7} {'vs best':>8}  (ms, median of alternating calls)")
    rng = np.random.default_rng(0)
    for name, x_shape, y_shape, kernel, stride, pad in shapes:
        x = rng.standard_normal(x_shape, dtype=np.float32)
        y, argmax = np.empty(y_shape, np.float32), np.empty(y_shape, np.int32)
        geom = pooling._geometry(x, y, kernel, stride, pad)
        kernels = kernels_for(x, y, geom)
        seconds = {label: [] for label in kernels}
        for _ in range(rounds + 1):               # the first compiles
            for label, kernel_fn in kernels.items():
                began = time.perf_counter()
                kernel_fn(x, y, argmax, geom)
                seconds[label].append(time.perf_counter() - began)
        ms = {label: float(np.median(s[1:])) * 1e3 for label, s in seconds.items()}
        cells = [f"{ms[label]:.2f}" if label in ms else "-"
                 for label in ("per output", "rows", "planes")]
        others = [v for label, v in ms.items() if label != "planes"]
        ratio = f"{min(others) / ms['planes']:.2f}x" if "planes" in ms else "-"
        shape = "x".join(map(str, x_shape))
        print(f"{name:14} {shape:>18} {f'{kernel[0]}/{stride[0]}/{pad[0]}':>7} {cells[0]:>11} "
              f"{cells[1]:>7} {cells[2]:>7} {ratio:>8}")


def time_training(case, pairs: int) -> tuple:
    """One net LMS off, iterations alternating the two passes on and off: ``(max pools that take
    them, median s off, median s on, median pair ratio off/on)``."""
    import numpy as np
    from bench_fullsize import build

    from minilms.device import make_device
    from minilms.kernels import pooling, pooling_planes
    from minilms.lms import LmsExecutor, Policy, resident_bytes
    from minilms.solver import SGD
    net, inputs = build(case, np)
    taken = 0
    for _, x_shape, y_shape, kernel, stride, pad in pool_shapes(net):
        geom = pooling._geometry(np.empty(x_shape), np.empty(y_shape), kernel, stride, pad)
        taken += pooling_planes.applies(geom, x_shape[3], y_shape[3])
    device = make_device("cpu", resident_bytes(net, net.schedule(("momentum",))) + 2**20)
    executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), Policy(enabled=False))
    seconds = {False: [], True: []}
    try:
        for on in (False, True):                  # a warm-up iteration each
            pooling_planes.ENABLED = on
            executor.iterate(inputs)
        for pair in range(pairs):
            for on in ((False, True) if pair % 2 == 0 else (True, False)):
                pooling_planes.ENABLED = on
                began = time.perf_counter()
                executor.iterate(inputs)
                seconds[on].append(time.perf_counter() - began)
    finally:
        pooling_planes.ENABLED = True
        device.close()
    off, on = np.array(seconds[False]), np.array(seconds[True])
    return taken, float(np.median(off)), float(np.median(on)), float(np.median(off / on))


def main(argv=None) -> int:
    from bench_windows import arguments
    args = arguments(__doc__).parse_args(argv)
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import numpy as np

    from bench_fullsize import build, parse_case
    cases = [parse_case(text, "bench_pooling: --models") for text in args.models]
    if args.smoke:
        cases = [{"model": "googlenet", "size": 64, "batch": 2, "width": 0.25, "classes": 10}]
        args.pairs, args.rounds = 1, 1
    shapes = {}
    for case in cases:
        for row in pool_shapes(build(case, np)[0]):
            shapes.setdefault(row[1:], row)
    time_layers(list(shapes.values()), args.rounds)
    print(f"\n{'net (LMS off)':24} {'pools':>6} {'one pass s':>10} {'two passes s':>12} "
          f"{'paired one/two':>15}")
    for case in cases:
        taken, off, on, paired = time_training(case, args.pairs)
        name = f"{case['model']} {case['size']} b{case['batch']}"
        print(f"{name:24} {taken:6d} {off:10.3f} {on:12.3f} {paired:14.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
