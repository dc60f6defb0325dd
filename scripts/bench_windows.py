"""The row-window convolution (``kernels/direct/windows.py``) against the ``cpu`` device's other
paths, layer by layer and in training.

    python scripts/bench_windows.py [--models resnet50:224:8 googlenet:224:8] [--pairs 12]

Two parts, each alternating its contenders in one process, so that a machine whose speed drifts
(a VM's neighbours) moves them alike:

1. **layers**: every distinct convolution of the first net that the windows could take (more
   than one tap, any stride): forward and backward (all three gradients) by
   im2col + GEMM (``conv_cpu``), by the direct kernels and by the windows, alternating call by
   call; the median ms of each, the windows' ratio to im2col + GEMM and to the best other path,
   and whether the engine takes the windows there (``windows.pays``);
2. **training**: each net LMS off, built twice (the windows where they pay, and nowhere), its
   iterations alternating the two (pairs, the order swapped every other pair): the median seconds
   of each, and the median of the pairs' ratios.

The first part times a layer alone, its operands hot in cache; the second is what decides the
rule (``windows.WINDOWS_PLANE``): on 14x14 planes the windows won alone and came out even in
the net, within a VM's noise (docs/benchmarks.md, session 36).
``--smoke``: tiny, for the test suite.
"""
import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def conv_shapes(nets, keep):
    """``(name, x shape, weight shape, geometry)`` of each distinct convolution without groups
    of ``nets`` that ``keep(layer, weight shape, geometry)`` takes, in the nets' order (the first
    layer of a shape names it): the engine benchmarks' layers."""
    shapes = {}
    for net in nets:
        for layer in net.layers:
            if layer.type != "Convolution" or layer.groups != 1:
                continue
            weight = (layer.num_output, layer.in_group) + layer.kernel_size
            geometry = layer._geometry()
            if keep(layer, weight, geometry):
                shapes.setdefault((layer.bottom_shapes[0], weight, geometry), layer.name)
    return [(name,) + key for key, name in shapes.items()]


def layer_shapes(net):
    """``conv_shapes`` of the convolutions the windows apply to."""
    from minilms.kernels.direct import windows
    return conv_shapes([net], lambda layer, weight, geometry: windows.applies(weight, geometry))


def paths(x, weight, dy, geometry):
    """``{path: (forward, backward)}``, each a call with its outputs and workspace bound."""
    import numpy as np

    from minilms.kernels import conv_cpu
    from minilms.kernels.direct import conv, input_grad, weight_grad, windows
    y, dx, dw = np.empty_like(dy), np.empty_like(x), np.empty_like(weight)
    samples = x.shape[0]
    columns = np.empty(samples * (weight[0].size + weight.shape[0]) * dy[0, 0].size, np.float32)
    direct = np.empty(conv.padded_size(x.shape, *geometry, max_step=1) * samples + 2**16 +
                      samples * dy[0].size * 2, np.float32)
    slots = windows.slot_count(x.shape, weight.shape, geometry, 2**31)
    rows = np.empty(windows.workspace_elements(x.shape, weight.shape, geometry, slots),
                    np.float32)
    chunk = conv.chunk_size(x.shape, geometry, direct.size)
    dw_chunk = conv.chunk_size(x.shape, geometry, direct.size, max_step=1)

    def direct_backward():
        if not input_grad.conv_input_grad_direct(dy, weight, dx, direct, geometry):
            conv_cpu.conv_backward(x, dy, weight, dx, None, None, columns, samples, geometry)
        weight_grad.conv_weight_grad_direct(x, dy, dw, None, direct, dw_chunk, geometry)
    return {
        "im2col + GEMM": (
            lambda: conv_cpu.conv_forward(x, weight, None, y, columns, samples, geometry),
            lambda: conv_cpu.conv_backward(x, dy, weight, dx, dw, None, columns, samples,
                                           geometry)),
        "direct": (lambda: conv.conv_forward_direct(x, weight, None, y, direct, chunk, geometry),
                   direct_backward),
        "windows": (lambda: windows.forward(x, weight, None, y, rows, slots, geometry),
                    lambda: windows.backward(x, dy, weight, dx, dw, None, rows, slots,
                                             geometry))}


def alternate(calls, rounds):
    """The median seconds of each call, the calls taken in turn ``rounds`` times."""
    import numpy as np
    for call in calls:
        call()          # compiles, warms
    times = [[] for _ in calls]
    for _ in range(rounds):
        for i, call in enumerate(calls):
            began = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - began)
    return [float(np.median(t)) for t in times]


def operands(rng, x_shape, w_shape, geometry):
    """Random ``(x, weight, dy)`` for one convolution shape, float32."""
    import numpy as np

    from minilms.kernels.im2col import conv_out_size
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
    out_h = conv_out_size(x_shape[2], kh, sh, ph, dh)
    out_w = conv_out_size(x_shape[3], kw, sw, pw, dw)
    return (rng.standard_normal(x_shape, dtype=np.float32),
            rng.standard_normal(w_shape, dtype=np.float32),
            rng.standard_normal((x_shape[0], w_shape[0], out_h, out_w), dtype=np.float32))


def time_layers(shapes, rounds):
    import numpy as np

    from minilms.kernels.direct import windows
    rng = np.random.default_rng(0)
    print(f"{'layer':14} {'input':>18} {'kernel':>7} {'pass':8} {'im2col':>7} {'direct':>7} "
          f"{'windows':>7} {'vs im2col':>9} {'vs best':>7}  pays  (ms, median of alternating "
          "calls)")
    for name, x_shape, w_shape, geometry in shapes:
        (kh, kw), (sh, sw), _, _ = geometry
        x, weight, dy = operands(rng, x_shape, w_shape, geometry)
        out_h, out_w = dy.shape[2:]
        ways = paths(x, weight, dy, geometry)
        pays = windows.pays(w_shape, geometry, out_h * out_w, x_shape[0])
        for index, label in ((0, "forward"), (1, "backward")):
            gemm, direct, rows = alternate([way[index] for way in ways.values()], rounds)
            print(f"{name:14} {'x'.join(map(str, x_shape)):>18} {kh}x{kw}/{sh}{'':>3} "
                  f"{label:8} {gemm * 1e3:7.2f} {direct * 1e3:7.2f} {rows * 1e3:7.2f} "
                  f"{gemm / rows:8.2f}x {min(gemm, direct) / rows:6.2f}x  "
                  f"{'yes' if pays else 'no'}")


@contextlib.contextmanager
def patched(module, name, value):
    """``module.name`` is ``value`` inside (a rule replaced while nets are built or run)."""
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def alternating_iterations(executor, inputs, pairs: int, desc: str, switch, values,
                           warmed=lambda: None) -> dict:
    """``{value: [s an iteration]}``: ``executor``'s iterations in ``1 + pairs`` pairs, each
    pair running ``switch(value)`` then an iteration for both ``values``, in turn first; the
    first pair warms up (untimed, ``warmed()`` after it)."""
    from tqdm import tqdm
    seconds = {value: [] for value in values}
    for turn in tqdm(range(1 + pairs), desc=desc, leave=False):
        for value in values if turn % 2 else values[::-1]:
            switch(value)
            began = time.perf_counter()
            executor.iterate(inputs)
            if turn:
                seconds[value].append(time.perf_counter() - began)
        if not turn:
            warmed()
    return seconds


# The direct engine's paths that take a layer whole: the module, and the engine's attribute that
# counts its slots (nonzero where it took the layer).
WHOLE_LAYER_PATHS = {"windows": "window_slots", "winograd": "winograd_slots",
                     "bands": "band_slots"}


def path_switch(name: str):
    """``(nowhere, takes)`` for one of ``WHOLE_LAYER_PATHS``: a context inside which nets are
    built without it (the engine asks its ``pays``), and whether a layer took it."""
    import importlib
    module = importlib.import_module(f"minilms.kernels.direct.rules.{name}")  # the engine's
    attribute = WHOLE_LAYER_PATHS[name]
    return (lambda: patched(module, "pays", lambda *args: False),
            lambda layer: bool(getattr(getattr(layer, "fast", None), attribute, 0)))


def time_training(case, pairs, nowhere, takes):
    """A net built twice, under ``nowhere()`` and as it is, iterations alternating in pairs, and
    again with the two built in the other order, half the pairs each: ``(layers that ``takes``
    counts, median s nowhere, median s as built, the two orders' median pair ratios' geometric
    mean, (the ratio with ``nowhere`` built first, with it built second))``. Both orders, because
    on a VM of session 55 the executor built second ran 2-6% faster even when the two were the
    same (docs/benchmarks.md, session 55)."""
    import numpy as np
    seconds = {"nowhere": [], "where they pay": []}
    ratios, taken = [], 0
    for order in (("nowhere", "where they pay"), ("where they pay", "nowhere")):
        got = _alternated(case, max(1, pairs // 2), nowhere, takes, order)
        taken = got.pop("taken")
        for label, times in got.items():
            seconds[label] += times
        off, on = np.array(got["nowhere"]), np.array(got["where they pay"])
        ratios.append(float(np.median(off / on)))
    off, on = (float(np.median(times)) for times in seconds.values())
    return taken, off, on, float(np.sqrt(ratios[0] * ratios[1])), tuple(ratios)


def _alternated(case, pairs, nowhere, takes, order) -> dict:
    """``{label: [s an iteration]}`` of the two nets built in ``order``, and ``"taken"``."""
    import numpy as np
    from bench_fullsize import build

    from minilms.device import make_device
    from minilms.lms import LmsExecutor, Policy, resident_bytes
    from minilms.solver import SGD
    runs = {}
    for label in order:
        with nowhere() if label == "nowhere" else contextlib.nullcontext():
            net, inputs = build(case, np)
        taken = sum(1 for layer in net.layers if takes(layer))
        if label == "nowhere" and taken:        # the switch missed where the engine reads it
            raise RuntimeError(f"{taken} layers took the path with it switched off")
        pool = resident_bytes(net, net.schedule(("momentum",))) + 2**20
        device = make_device("cpu", pool)
        executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), Policy(enabled=False))
        executor.iterate(inputs)          # a warm-up iteration each
        runs[label] = (executor, inputs, device, taken)
    seconds = {label: [] for label in runs}
    try:
        for pair in range(pairs):
            for label in (list(runs) if pair % 2 == 0 else list(runs)[::-1]):
                executor, inputs = runs[label][:2]
                began = time.perf_counter()
                executor.iterate(inputs)
                seconds[label].append(time.perf_counter() - began)
    finally:
        for run in runs.values():
            run[2].close()
    return {**seconds, "taken": runs["where they pay"][3]}


def arguments(doc: str, rounds: int = 9) -> argparse.ArgumentParser:
    """The options every engine path's benchmark takes (this one's, ``bench_winograd``'s,
    ``bench_slotted``'s, ``bench_bands``'): the nets, the training pairs, the calls per layer
    shape, ``--smoke``."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet50:224:8", "googlenet:224:8"],
                   metavar="MODEL:SIZE:BATCH")
    p.add_argument("--pairs", type=int, default=12, help="training iterations of each net")
    p.add_argument("--rounds", type=int, default=rounds,
                   help="calls of each path per layer shape")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    return p


def print_training(cases, pairs, what, nowhere, takes) -> None:
    """The training part: a row per net, LMS off, built with ``what`` where it pays and with it
    ``nowhere``, alternating (``time_training``)."""
    print(f"\n{'net (LMS off)':24} {'layers':>6} {'nowhere s':>9} {what + ' s':>10} "
          f"{'paired nowhere/' + what:>24}  (nowhere built first, second)")
    for case in cases:
        taken, off, on, paired, orders = time_training(case, pairs, nowhere, takes)
        name = f"{case['model']} {case['size']} b{case['batch']}"
        print(f"{name:24} {taken:6d} {off:9.3f} {on:10.3f} {paired:23.3f}x  "
              f"({orders[0]:.3f}x, {orders[1]:.3f}x)")


def main(argv=None) -> int:
    args = arguments(__doc__).parse_args(argv)
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import numpy as np

    from bench_fullsize import build, parse_case
    cases = [parse_case(text, "bench_windows: --models") for text in args.models]
    if args.smoke:
        cases = [{"model": "resnet50", "size": 32, "batch": 2, "width": 16, "classes": 10}]
        args.pairs, args.rounds = 1, 1
    net, _ = build(cases[0], np)
    time_layers(layer_shapes(net), args.rounds)
    print_training(cases, args.pairs, "windows", *path_switch("windows"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
