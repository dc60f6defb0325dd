"""A 1x1 convolution's two gradients sample by sample (``pointwise.both_by_sample``) against two
passes over the batch (``input_grad``, then ``weight_grad``), layer by layer and in training.

    python scripts/bench_pointwise.py [--models resnet50:224:8 googlenet:224:8] [--pairs 12]

Two parts, each alternating its contenders in one process (a VM's speed drifts):

1. **layers**: every distinct 1x1 stride-1 convolution of the nets that the engine takes sample
   by sample (a long plane, products over ``blas_threads.MIN_FLOPS``): its backward (dx and dW)
   both ways, alternating call by call, with 400 MiB written between calls (``--hot``: not), so
   that the operands come from memory as in the net; the median ms of each, the ratio, and
   whether the two gave the same bits;
2. **training**: each net LMS off, one executor, its iterations alternating the switch
   (``pointwise.BY_SAMPLE``) in pairs: the median seconds of an iteration each way, and of the
   time the iteration spent in those layers' backward (that part's difference is what the
   switch changes, and it shows where the whole iteration's drifts more than it).

``--smoke``: tiny, for the test suite.
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def layer_shapes(nets):
    """``(name, x shape, weight shape, geometry)`` of each distinct 1x1 stride-1 convolution whose
    backward goes sample by sample, in the nets' order (``bench_windows.conv_shapes``)."""
    import numpy as np
    from bench_windows import conv_shapes

    from minilms.kernels.direct import pointwise

    def by_sample(layer, weight, geometry):
        dy = np.empty((layer.bottom_shapes[0][0], layer.num_output, layer.out_h, layer.out_w),
                      np.float32)
        return pointwise.applies(weight, geometry) and pointwise.by_sample(
            dy, np.empty(weight, np.float32), geometry, 1)
    return conv_shapes(nets, by_sample)


def time_layers(shapes, rounds, cold):
    import numpy as np
    from bench_slotted import _alternate_timed, flushed, timed

    from minilms.kernels.direct import pointwise
    rng = np.random.default_rng(0)
    flush = np.ones(400 * 2**20 // 4, np.float32) if cold else None
    geometry = ((1, 1), (1, 1), (0, 0), (1, 1))
    print(f"{'layer':12} {'input':>16} {'weight':>16} {'two passes':>10} {'by sample':>9} "
          f"{'ratio':>6}  same bits  (ms, median of alternating calls, "
          f"{'cold' if cold else 'hot'})")
    for name, x_shape, w_shape, _ in shapes:
        x = rng.standard_normal(x_shape, dtype=np.float32)
        weight = rng.standard_normal(w_shape, dtype=np.float32)
        dy = rng.standard_normal((x_shape[0], w_shape[0]) + x_shape[2:], dtype=np.float32)
        outputs = {on: (np.empty_like(x), np.empty_like(weight)) for on in (False, True)}

        def backward(on):
            def call():
                pointwise.BY_SAMPLE = on
                try:
                    pointwise.backward(x, dy, weight, *outputs[on], None, None, x_shape[0],
                                       geometry)
                finally:
                    pointwise.BY_SAMPLE = True
            return flushed(call, flush) if cold else timed(call)
        two, mine = _alternate_timed([backward(on) for on in (False, True)], rounds)
        same = all(np.array_equal(a, b) for a, b in zip(outputs[False], outputs[True]))
        print(f"{name:12} {'x'.join(map(str, x_shape)):>16} {'x'.join(map(str, w_shape)):>16} "
              f"{two * 1e3:10.2f} {mine * 1e3:9.2f} {two / mine:5.2f}x  {'yes' if same else 'NO'}")


def time_training(case, pairs):
    """``(layers by sample, {switch: [iteration s]}, {switch: [s in those layers' backward]})``,
    LMS off, iterations alternating ``pointwise.BY_SAMPLE``."""
    import numpy as np
    from bench_fullsize import build
    from tqdm import tqdm

    from minilms.device import make_device
    from minilms.kernels.direct import pointwise
    from minilms.lms import LmsExecutor, Policy, resident_bytes
    from minilms.solver import SGD
    net, inputs = build(dict(case, lms=False), np)
    pool = resident_bytes(net, net.schedule(("momentum",))) + 2**20
    device = make_device("cpu", pool)
    executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), Policy(enabled=False))
    backward, spent = pointwise.backward, [0.0]

    def timed(x, dy, weight, dx, dweight, dbias, work, chunk, geometry, slots=1, add_dx=False):
        began = time.perf_counter()
        backward(x, dy, weight, dx, dweight, dbias, work, chunk, geometry, slots, add_dx)
        if dx is not None and dweight is not None and pointwise.by_sample(dy, weight, geometry,
                                                                           slots):
            spent[0] += time.perf_counter() - began
    seconds, layers = {True: [], False: []}, {True: [], False: []}
    pointwise.backward = timed
    try:
        for turn in tqdm(range(1 + pairs), desc=case["model"], leave=False):  # 1st warms up
            for on in ((True, False) if turn % 2 else (False, True)):
                pointwise.BY_SAMPLE, spent[0] = on, 0.0
                began = time.perf_counter()
                executor.iterate(inputs)
                if turn:
                    seconds[on].append(time.perf_counter() - began)
                    layers[on].append(spent[0])
    finally:
        pointwise.backward, pointwise.BY_SAMPLE = backward, True
        device.close()
    taken = len(layer_shapes([net]))
    return taken, seconds, layers


def print_training(cases, pairs) -> None:
    import numpy as np
    print(f"\n{'net (LMS off)':20} {'shapes':>6} {'two passes s':>12} {'by sample s':>11} "
          f"{'paired':>7} {'their layers, ms':>17} {'by sample':>9}")
    for case in cases:
        taken, seconds, layers = time_training(case, pairs)
        two, mine = np.array(seconds[False]), np.array(seconds[True])
        name = f"{case['model']} {case['size']} b{case['batch']}"
        print(f"{name:20} {taken:6d} {np.median(two):12.3f} {np.median(mine):11.3f} "
              f"{np.median(two / mine):6.3f}x {np.median(layers[False]) * 1e3:17.1f} "
              f"{np.median(layers[True]) * 1e3:9.1f}")


def main(argv=None) -> int:
    from bench_slotted import cold_arguments
    args, cases, nets = cold_arguments(__doc__, argv, "bench_pointwise", {
        "model": "resnet50", "size": 112, "batch": 2, "classes": 10}, rounds=9)
    time_layers(layer_shapes(nets), args.rounds, cold=not args.hot)
    print_training(cases, args.pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
