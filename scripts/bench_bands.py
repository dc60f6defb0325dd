"""im2col + GEMM in bands (``kernels/direct/bands.py``) against the ``cpu`` device's other paths
on a net's stem, layer by layer and in training.

    python scripts/bench_bands.py [--models resnet50:224:8 googlenet:224:8] [--pairs 12]
                                  [--big]

Two parts, each alternating its contenders in one process (a VM's speed drifts):

1. **layers**: every distinct convolution of the nets the bands could take with at most
   ``bands.BANDS_CHANNELS`` input channels (a stem): the forward, and the weight gradient alone
   (what a stem's backward computes: its input is the data), by im2col + GEMM (``conv_cpu``, a
   whole batch's columns), by the direct kernels and by the bands, alternating call by call;
   the median ms of each, the bands' ratio to the best other path, and whether the engine takes
   the bands there (``bands.pays``). ``--big`` adds GoogLeNet's stem at 2240x2240, batch 2;
2. **training**: each net LMS off, built twice (the bands where they pay, and nowhere), its
   iterations alternating in pairs (``bench_windows.time_training``).

``--smoke``: tiny, for the test suite.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def layer_shapes(nets):
    """``(name, x shape, weight shape, geometry)`` of each distinct stem-like convolution
    (``bench_windows.conv_shapes``)."""
    from bench_windows import conv_shapes

    from minilms.kernels.direct import bands
    return conv_shapes(nets, lambda layer, weight, geometry: bands.applies(weight, geometry)
                       and weight[1] <= bands.BANDS_CHANNELS)


def paths(x, weight, dy, geometry):
    """``{path: (forward, weight gradient)}``, each a call with its outputs and workspace."""
    import numpy as np

    from minilms.kernels import conv_cpu
    from minilms.kernels.direct import bands, conv, weight_grad
    y, dw = np.empty_like(dy), np.empty_like(weight)
    samples = x.shape[0]
    columns = np.empty(samples * (weight[0].size + weight.shape[0]) * dy[0, 0].size, np.float32)
    direct = np.empty(samples * max(conv.padded_size(x.shape, *geometry),
                                    conv.padded_size(x.shape, *geometry, max_step=1)) + 2**16,
                      np.float32)
    slots = bands.slot_count(x.shape, weight.shape, geometry, 2**31)
    banded = np.empty(bands.workspace_elements(x.shape, weight.shape, geometry, slots),
                      np.float32)
    return {
        "im2col + GEMM": (
            lambda: conv_cpu.conv_forward(x, weight, None, y, columns, samples, geometry),
            lambda: conv_cpu.conv_backward(x, dy, weight, None, dw, None, columns, samples,
                                           geometry)),
        "direct": (
            lambda: conv.conv_forward_direct(x, weight, None, y, direct, samples, geometry),
            lambda: weight_grad.conv_weight_grad_direct(x, dy, dw, None, direct, samples,
                                                        geometry)),
        "bands": (lambda: bands.forward(x, weight, None, y, banded, slots, geometry),
                  lambda: bands.backward(x, dy, weight, None, dw, None, banded, slots,
                                         geometry))}


def time_layers(shapes, rounds):
    import numpy as np
    from bench_windows import alternate, operands

    from minilms.kernels.direct import bands
    rng = np.random.default_rng(0)
    print(f"{'layer':12} {'input':>18} {'kernel':>7} {'pass':8} {'im2col':>8} {'direct':>8} "
          f"{'bands':>8} {'vs best':>7}  pays  (ms, median of alternating calls)")
    for name, x_shape, w_shape, geometry in shapes:
        (kh, kw), (sh, sw), _, _ = geometry
        x, weight, dy = operands(rng, x_shape, w_shape, geometry)
        out_h, out_w = dy.shape[2:]
        ways = paths(x, weight, dy, geometry)
        pays = bands.pays(w_shape, geometry, out_h * out_w)
        for index, label in ((0, "forward"), (1, "dW")):
            gemm, direct, banded = alternate([way[index] for way in ways.values()], rounds)
            print(f"{name:12} {'x'.join(map(str, x_shape)):>18} {kh}x{kw}/{sh}{'':>3} "
                  f"{label:8} {gemm * 1e3:8.2f} {direct * 1e3:8.2f} {banded * 1e3:8.2f} "
                  f"{min(gemm, direct) / banded:6.2f}x  {'yes' if pays else 'no'}")


def main(argv=None) -> int:
    from bench_windows import arguments
    p = arguments(__doc__)
    p.add_argument("--big", action="store_true", help="GoogLeNet's stem at 2240x2240 too")
    args = p.parse_args(argv)
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import numpy as np

    from bench_fullsize import build, parse_case
    from bench_windows import path_switch, print_training
    cases = [parse_case(text, "bench_bands: --models") for text in args.models]
    if args.smoke:
        cases = [{"model": "resnet50", "size": 112, "batch": 2, "width": 2, "classes": 10}]
        args.pairs, args.rounds = 1, 1
    nets = [build(case, np)[0] for case in cases]
    shapes = layer_shapes(nets)
    if args.big:
        shapes += layer_shapes([build({"model": "googlenet", "size": 2240, "batch": 2}, np)[0]])
    time_layers(shapes, args.rounds)
    print_training(cases, args.pairs, "bands", *path_switch("bands"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
