"""Short planes' products in slots (``kernels/slotted.py``) against a product per sample, layer
by layer and in training.

    python scripts/bench_slotted.py [--models resnet50:224:8 googlenet:224:8] [--pairs 12]

Two parts, each alternating its contenders in one process (a VM's speed drifts):

1. **layers**: every distinct convolution of the nets whose forward (and a 1x1's input gradient)
   would go into slots (``slotted.count`` > 1 for its plane, batch and weight, or would with a
   weight of ``MIN_WEIGHT``): the forward and the 1x1's input gradient, per sample and in slots,
   alternating call by call, the median ms of each. ``--cold`` (default) writes 400 MiB between
   calls, so that the weight and the operands come from memory as they do in the net; ``--hot``
   leaves them in cache. The column ``taken`` says whether the layer takes the slots;
2. **training**: each net LMS off, built twice (slots where they are taken, and nowhere), its
   iterations alternating in pairs (``bench_windows.time_training``).

``--smoke``: tiny, for the test suite.
"""
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def layer_shapes(nets):
    """``(name, x shape, weight shape, geometry)`` of each distinct convolution on a short plane
    (the slots' bounds on the plane, not on the weight), in the nets' order
    (``bench_windows.conv_shapes``)."""
    from bench_windows import conv_shapes

    from minilms.kernels import slotted
    return conv_shapes(nets, lambda layer, weight, geometry:
                       slotted.MIN_PLANE <= layer.out_h * layer.out_w < slotted.SHORT_PLANE)


def calls(x, weight, dy, geometry, slots):
    """``{"forward": (per sample, in slots), "dx": ...}`` (``dx`` for a 1x1 only)."""
    import numpy as np

    from minilms.kernels import conv_cpu, slotted
    from minilms.kernels.direct import pointwise
    samples, plane = x.shape[0], dy.shape[2] * dy.shape[3]
    y, dx = np.empty_like(dy), np.empty_like(x)
    if pointwise.applies(weight.shape, geometry):
        strided = tuple(geometry[1]) != (1, 1)
        work = np.empty(pointwise.workspace_elements(x.shape, weight.shape[0], plane, samples,
                                                     strided, slots), np.float32)
        return {label: tuple(
            (lambda s=s, f=f: f(s)) for s in (1, slots)) for label, f in (
            ("forward", lambda s: pointwise.forward(x, weight, None, y, work, samples, geometry,
                                                    s)),
            ("dx", lambda s: pointwise.input_grad(dy, weight, dx, work, samples, geometry, s)))}
    rows = weight[0].size + weight.shape[0]
    work = np.empty(rows * max(samples * plane, slotted.width(slots, plane)), np.float32)
    return {"forward": tuple(
        (lambda s=s: conv_cpu.conv_forward(x, weight, None, y, work, samples, geometry, s))
        for s in (1, slots))}


def time_layers(shapes, rounds, cold):
    import numpy as np
    from bench_windows import alternate

    from minilms.kernels import slotted
    from minilms.kernels.im2col import conv_out_size
    rng = np.random.default_rng(0)
    flush = np.ones(400 * 2**20 // 4, np.float32) if cold else None
    print(f"{'layer':12} {'input':>16} {'weight':>16} {'pass':8} {'slots':>5} {'per sample':>10} "
          f"{'in slots':>8} {'ratio':>6}  taken  (ms, median of alternating calls, "
          f"{'cold' if cold else 'hot'})")
    for name, x_shape, w_shape, geometry in shapes:
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
        out_h = conv_out_size(x_shape[2], kh, sh, ph, dh)
        out_w = conv_out_size(x_shape[3], kw, sw, pw, dw)
        weight_elements = int(np.prod(w_shape))
        taken = slotted.count(out_h * out_w, x_shape[0], x_shape[0], weight_elements) > 1
        slots = slotted.count(out_h * out_w, x_shape[0], x_shape[0],
                              max(weight_elements, slotted.MIN_WEIGHT))
        if slots < 2:
            continue
        x = rng.standard_normal(x_shape, dtype=np.float32)
        weight = rng.standard_normal(w_shape, dtype=np.float32)
        dy = rng.standard_normal((x_shape[0], w_shape[0], out_h, out_w), dtype=np.float32)
        for label, pair in calls(x, weight, dy, geometry, slots).items():
            if cold:
                per_sample, in_slots = _alternate_timed([flushed(c, flush) for c in pair],
                                                         rounds)
            else:
                per_sample, in_slots = alternate(pair, rounds)
            print(f"{name:12} {'x'.join(map(str, x_shape)):>16} "
                  f"{'x'.join(map(str, w_shape)):>16} {label:8} {slots:5d} "
                  f"{per_sample * 1e3:10.2f} {in_slots * 1e3:8.2f} {per_sample / in_slots:5.2f}x"
                  f"  {'yes' if taken else 'no'}")


def timed(call):
    """``call`` as a run that returns its own seconds (``_alternate_timed``'s kind)."""
    def run():
        began = time.perf_counter()
        call()
        return time.perf_counter() - began
    return run


def flushed(call, flush):
    """``timed(call)``, every cache line of ``flush`` (400 MiB) written before each call."""
    def run():
        flush[::16] += 1
        return timed(call)()
    return run


def _alternate_timed(runs, rounds):
    """As ``bench_windows.alternate``, each run timing itself (after its flush)."""
    import numpy as np
    for run in runs:
        run()
    times = [[run() for run in runs] for _ in range(rounds)]
    return [float(np.median(column)) for column in zip(*times)]


@contextlib.contextmanager
def slots_nowhere():
    """Nets built inside take no slots (every layer asks ``shapes.count``: the im2col path
    through ``kernels.shapes``, the direct engine by the name it imported)."""
    from minilms.kernels import shapes
    from minilms.kernels.direct import engine
    readers = (shapes, engine)
    counts = [reader.count for reader in readers]
    for reader in readers:
        reader.count = lambda *args: 1
    try:
        yield
    finally:
        for reader, count in zip(readers, counts):
            reader.count = count


def takes_slots(layer) -> bool:
    return getattr(layer, "slots", 1) > 1 or getattr(getattr(layer, "fast", None), "slots", 1) > 1


def cold_arguments(doc: str, argv, script: str, smoke: dict, rounds: int):
    """``(args, cases, nets)`` of a benchmark whose layer part flushes the caches between calls
    unless ``--hot`` (this one's, ``bench_pointwise``'s): ``bench_windows.arguments`` and
    ``--hot``; the ``--models`` cases (``script: --models`` named in a bad one's error) and their
    nets, LMS off's; under ``--smoke`` the one ``smoke`` case, a pair, a round, hot."""
    from bench_windows import arguments
    p = arguments(doc, rounds=rounds)
    p.add_argument("--hot", action="store_true", help="no cache flush between layer calls")
    args = p.parse_args(argv)
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import numpy as np

    from bench_fullsize import build, parse_case
    cases = [parse_case(text, f"{script}: --models") for text in args.models]
    if args.smoke:
        cases = [smoke]
        args.pairs, args.rounds, args.hot = 1, 1, True
    return args, cases, [build(dict(case, lms=False), np)[0] for case in cases]


def main(argv=None) -> int:
    from bench_windows import print_training
    args, cases, nets = cold_arguments(__doc__, argv, "bench_slotted", {
        "model": "resnet50", "size": 64, "batch": 2, "width": 16, "classes": 10}, rounds=15)
    time_layers(layer_shapes(nets), args.rounds, cold=not args.hot)
    print_training(cases, args.pairs, "slots", slots_nowhere, takes_slots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
