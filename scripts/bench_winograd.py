"""Winograd's F(m x m, 3 x 3) convolutions (``kernels/direct/winograd.py``) against the ``cpu``
device's other paths, layer by layer and in training.

    python scripts/bench_winograd.py [--models resnet50:224:8 googlenet:224:8] [--pairs 12]
                                     [--groups]

Two parts, each alternating its contenders in one process (a VM's speed drifts):

1. **layers**: every distinct 3x3 stride-1 convolution of the nets on a plane of 7x7 or more:
   forward and backward (all three gradients) by im2col + GEMM (``conv_cpu``), by the row
   windows and by Winograd's with F(2, 3) and F(4, 3), alternating call by call, hot in cache;
   the median ms of each, Winograd's (the rule's m) ratio to the best other path, whether the
   engine takes it there (``winograd.pays``), and its forward's largest error against a float64
   reference, relative to the output's largest magnitude;
2. **training**: each net LMS off, built twice (Winograd's where it pays, and nowhere), its
   iterations alternating in pairs (``bench_windows.time_training``).

``--groups`` times instead a small plane's samples in groups against a sample a block
(``winograd.GROUPS``, the rule ``_gemm``): the same two parts, each alternating the switch, on
the layer shapes whose samples go in groups (forward and backward of F(2, 3) and F(4, 3), their
medians and ratio), and in training, where the Winograd layers' time by plane is shown beside
the iteration's (a control: the layers the switch does not touch move with the noise).

``--smoke``: tiny, for the test suite.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def layer_shapes(nets):
    """``(name, x shape, weight shape, pad)`` of each distinct 3x3 stride-1 convolution on a
    plane of at least 7x7, in the nets' order (``bench_windows.conv_shapes``)."""
    from bench_windows import conv_shapes

    from minilms.kernels.direct import winograd
    return [(name, x, weight, geometry[2][0]) for name, x, weight, geometry in conv_shapes(
        nets, lambda layer, weight, geometry: winograd.applies(weight, geometry)
        and layer.out_h * layer.out_w >= 49)]


def tiles_of(m):
    """Winograd's calls inside take F(m, 3), whatever the plane."""
    from bench_windows import patched

    from minilms.kernels.direct.rules import winograd
    return patched(winograd, "tile_size", lambda *args: m)    # where the layouts read it


def paths(x, weight, dy, pad):
    """``{path: (forward, backward)}``, each a call with its outputs and workspace bound."""
    import numpy as np

    from minilms.kernels import conv_cpu
    from minilms.kernels.direct import windows, winograd
    geometry = ((3, 3), (1, 1), (pad, pad), (1, 1))
    y, dx, dw = np.empty_like(dy), np.empty_like(x), np.empty_like(weight)
    samples = x.shape[0]
    columns = np.empty(samples * (weight[0].size + weight.shape[0]) * dy[0, 0].size, np.float32)
    slots = windows.slot_count(x.shape, weight.shape, geometry, 2**31)
    rows = np.empty(windows.workspace_elements(x.shape, weight.shape, geometry, slots),
                    np.float32)
    ways = {
        "im2col + GEMM": (
            lambda: conv_cpu.conv_forward(x, weight, None, y, columns, samples, geometry),
            lambda: conv_cpu.conv_backward(x, dy, weight, dx, dw, None, columns, samples,
                                           geometry)),
        "windows": (lambda: windows.forward(x, weight, None, y, rows, slots, geometry),
                    lambda: windows.backward(x, dy, weight, dx, dw, None, rows, slots,
                                             geometry))}
    for m in (2, 4):
        with tiles_of(m):
            slots_m = winograd.slot_count(x.shape, weight.shape, pad, 2**31)
            work = np.empty(winograd.workspace_elements(x.shape, weight.shape, pad, slots_m),
                            np.float32)

        def forward(m=m, work=work, slots_m=slots_m):
            with tiles_of(m):
                winograd.forward(x, weight, None, y, work, slots_m, geometry, samples)

        def backward(m=m, work=work, slots_m=slots_m):
            with tiles_of(m):
                winograd.backward(x, dy, weight, dx, dw, None, work, slots_m, geometry, samples)
        ways[f"F({m}, 3)"] = (forward, backward)
    return ways, y


def operands(rng, x_shape, w_shape, pad):
    """``(out_hw, x, weight, dy)``: a layer shape's random operands, the weights scaled as an
    initialiser's."""
    import numpy as np
    out_hw = (x_shape[2] + 2 * pad - 2, x_shape[3] + 2 * pad - 2)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    weight = (rng.standard_normal(w_shape, dtype=np.float32) /
              np.sqrt(9 * w_shape[1])).astype(np.float32)
    dy = rng.standard_normal((x_shape[0], w_shape[0]) + out_hw, dtype=np.float32)
    return out_hw, x, weight, dy


def forward_error(x, weight, pad, y):
    """``max |y - reference| / max |reference|``, the reference in float64 (an einsum per
    tap)."""
    import numpy as np
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out_h, out_w = y.shape[2:]
    want = sum(np.einsum("oc,nchw->nohw", weight[:, :, i, j].astype(np.float64),
                         xp[:, :, i:i + out_h, j:j + out_w])
               for i in range(3) for j in range(3))
    return float(np.abs(y - want).max() / np.abs(want).max())


def time_layers(shapes, rounds):
    import numpy as np
    from bench_windows import alternate

    from minilms.kernels.direct import winograd
    rng = np.random.default_rng(0)
    print(f"{'layer':16} {'input':>16} {'out':>4} {'pass':8} {'im2col':>7} {'windows':>7} "
          f"{'F(2,3)':>7} {'F(4,3)':>7} {'m':>2} {'vs best':>7}  pays  {'error':>8}  (ms, "
          "median of alternating calls)")
    for name, x_shape, w_shape, pad in shapes:
        out_hw, x, weight, dy = operands(rng, x_shape, w_shape, pad)
        ways, y = paths(x, weight, dy, pad)
        m = winograd.tile_size(w_shape, out_hw)
        pays = winograd.pays(w_shape, ((3, 3), (1, 1), (pad, pad), (1, 1)),
                             out_hw[0] * out_hw[1])
        ways[f"F({m}, 3)"][0]()
        error = forward_error(x, weight, pad, y)
        for index, label in ((0, "forward"), (1, "backward")):
            gemm, rows, f2, f4 = alternate([way[index] for way in ways.values()], rounds)
            ours = f2 if m == 2 else f4
            print(f"{name:16} {'x'.join(map(str, x_shape)):>16} {w_shape[0]:4d} {label:8} "
                  f"{gemm * 1e3:7.2f} {rows * 1e3:7.2f} {f2 * 1e3:7.2f} {f4 * 1e3:7.2f} "
                  f"{m:2d} {min(gemm, rows) / ours:6.2f}x  {'yes' if pays else 'no ':3}  "
                  f"{error:8.1e}")


def time_groups(shapes, rounds):
    """Per small-plane shape, F(2, 3) and F(4, 3) with ``winograd.GROUPS`` off and on, calls
    alternating: ms (median) and the ratio."""
    import numpy as np
    from bench_windows import alternate

    from minilms.kernels.direct import winograd
    rng = np.random.default_rng(0)
    print(f"{'layer':16} {'input':>16} {'out':>4} {'m':>2} {'group':>5} {'pass':8} "
          f"{'a sample':>8} {'groups':>7} {'ratio':>6}  (ms, median of alternating calls)")
    for name, x_shape, w_shape, pad in shapes:
        out_hw, x, weight, dy = operands(rng, x_shape, w_shape, pad)
        ways, _ = paths(x, weight, dy, pad)
        for m in (2, 4):
            with tiles_of(m):
                group = winograd.layouts_of(x_shape, w_shape, pad)[0].group
            if group == 1:
                continue
            for index, label in ((0, "forward"), (1, "backward")):
                call = ways[f"F({m}, 3)"][index]
                one, grouped = alternate([_switched(call, False), _switched(call, True)],
                                         rounds)
                print(f"{name:16} {'x'.join(map(str, x_shape)):>16} {w_shape[0]:4d} {m:2d} "
                      f"{group:5d} {label:8} {one * 1e3:8.2f} {grouped * 1e3:7.2f} "
                      f"{one / grouped:5.3f}x")


def _switched(call, groups: bool):
    from minilms.kernels.direct import winograd

    def run():
        winograd.GROUPS = groups
        try:
            call()
        finally:
            winograd.GROUPS = True
    return run


def training_groups(case, pairs):
    """LMS off, one executor, iterations alternating ``winograd.GROUPS``: ``({switch: [s]},
    {(switch, plane, pass): s summed over the turns})`` for the Winograd layers."""
    import collections
    import time

    from bench_fullsize import training
    from bench_windows import alternating_iterations

    from minilms.kernels.direct import winograd
    net, inputs, executor, _, _ = training(dict(case, lms=False), 8)
    run_step, spent = executor.run_step, collections.defaultdict(float)
    switch = [True]

    def timed(index, step, train, solver):
        began = time.perf_counter()
        run_step(index, step, train, solver)
        layer = net.layer[step.layer]
        if getattr(getattr(layer, "fast", None), "winograd_slots", 0) and step.kind != "update":
            spent[(switch[0], f"{layer.out_h}x{layer.out_w}", step.kind)] += \
                time.perf_counter() - began
    def switched(on):
        winograd.GROUPS = switch[0] = on
    executor.run_step = timed
    try:
        seconds = alternating_iterations(executor, inputs, pairs, case["model"], switched,
                                         (True, False), spent.clear)
    finally:
        winograd.GROUPS = True
        executor.device.close()
    return seconds, spent


def print_training_groups(cases, pairs) -> None:
    import numpy as np
    print(f"\n{'net (LMS off)':20} {'a sample s':>10} {'groups s':>8} {'paired':>7}  the Winograd "
          "layers by plane, ms an iteration (a sample / groups)")
    for case in cases:
        seconds, spent = training_groups(case, pairs)
        one, grouped = np.array(seconds[False]), np.array(seconds[True])
        planes = sorted({key[1:] for key in spent})
        layers = ", ".join(f"{plane} {kind} {spent[(False, plane, kind)] / pairs * 1e3:.1f} / "
                           f"{spent[(True, plane, kind)] / pairs * 1e3:.1f}"
                           for plane, kind in planes)
        name = f"{case['model']} {case['size']} b{case['batch']}"
        print(f"{name:20} {np.median(one):10.3f} {np.median(grouped):8.3f} "
              f"{np.median(one / grouped):6.3f}x  {layers or 'none takes Winograd'}")


def main(argv=None) -> int:
    from bench_windows import arguments
    parser = arguments(__doc__)
    parser.add_argument("--groups", action="store_true",
                        help="groups of samples against a sample a block (winograd.GROUPS)")
    args = parser.parse_args(argv)
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import numpy as np

    from bench_fullsize import build, parse_case
    from bench_windows import path_switch, print_training
    cases = [parse_case(text, "bench_winograd: --models") for text in args.models]
    if args.smoke:      # with --groups, a batch whose small planes' samples go in groups
        cases = [{"model": "resnet50", "size": 32 if args.groups else 64,
                  "batch": 8 if args.groups else 2, "width": 16, "classes": 10}]
        args.pairs, args.rounds = 1, 1
    nets = [build(case, np)[0] for case in cases]
    if args.groups:
        time_groups(layer_shapes(nets), args.rounds)
        print_training_groups(cases, args.pairs)
        return 0
    time_layers(layer_shapes(nets), args.rounds)
    print_training(cases, args.pairs, "Winograd", *path_switch("winograd"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
