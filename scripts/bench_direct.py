"""The ``cpu`` device's direct convolution kernels against im2col + GEMM, shape by shape: the
forward, the weight gradient and the input gradient of each layer, both ways, in one process.

    python scripts/bench_direct.py [--rounds 7] [--threads 2]

The shapes are ``bench_kernels.py``'s (LeNet's, ResNet-18/4's, where the small-shape goals
are set) and GoogLeNet's 5x5s at batch 8. For each, a layer is set up twice: with the engine's
rules as they are (``conv.forward_pays``, ``weight_grad_pays``, ``input_grad_pays``,
``sample_lanes_pay``), and with all of them off, so im2col + GEMM takes every part. Each part is
timed alone, the two layers alternating call by call (a VM's speed drifts); the table prints
the median ms each way and the ratio (GEMM / direct: above 1, the direct kernel is faster), with
the paths the engine chose. The input gradient is the backward less the backward without it.
The header names the host's vector lanes and whether it has mask registers (``vector_ir``):
what the kernels were built for.

``--smoke``: tiny, for the test suite.
"""
import argparse
import statistics
import sys
import time

SHAPES = [  # label, N, C, H (= W), out, kernel, stride, pad
    ("LeNet conv1", 64, 1, 28, 20, 5, 1, 0), ("LeNet conv2", 64, 20, 12, 50, 5, 1, 0),
    ("ResNet 16ch 32x32", 32, 16, 32, 16, 3, 1, 1), ("ResNet 32ch 16x16", 32, 32, 16, 32, 3, 1, 1),
    ("ResNet 64ch 8x8", 32, 64, 8, 64, 3, 1, 1), ("ResNet down 16->32", 32, 16, 32, 32, 3, 2, 1),
    ("GoogLeNet 16x28->32", 8, 16, 28, 32, 5, 1, 2),
    ("GoogLeNet 32x28->96", 8, 32, 28, 96, 5, 1, 2),
    ("GoogLeNet 32x14->128", 8, 32, 14, 128, 5, 1, 2),
    ("GoogLeNet 24x14->64", 8, 24, 14, 64, 5, 1, 2),
    ("GoogLeNet 48x7->128", 8, 48, 7, 128, 5, 1, 2),
]
SMOKE_SHAPES = [("smoke 3x3", 2, 8, 6, 16, 3, 1, 1), ("smoke 5x5 s2", 2, 6, 9, 8, 5, 2, 2)]


def layer_for(shape, direct: bool):
    """``(layer, top shape)``: a convolution of ``shape`` whose engine takes what its rules say
    (``direct``), or nothing (every ``pays`` rule off during setup)."""
    from unittest import mock

    # the rules where the engine reads them
    from minilms.kernels.direct.rules import conv, input_grad, weight_grad
    from minilms.layers import LAYERS
    _, n, c, h, out, k, s, p = shape

    def never(*args):
        return False
    rules = [] if direct else [mock.patch.object(conv, "forward_pays", never),
                               mock.patch.object(weight_grad, "weight_grad_pays", never),
                               mock.patch.object(input_grad, "input_grad_pays", never),
                               mock.patch.object(input_grad, "sample_lanes_pay", never)]
    for rule in rules:
        rule.start()
    try:
        layer = LAYERS["Convolution"]("conv", ["x"], ["y"], num_output=out, kernel_size=k,
                                      stride=s, pad=p)
        (top,) = layer.setup([(n, c, h, h)])
    finally:
        for rule in rules:
            rule.stop()
    if not direct and paths(layer) != "fwd gemm, dW gemm, dx gemm":   # the contrast holds
        raise RuntimeError(f"{shape[0]}: the engine took {paths(layer)} with every rule off: "
                           "it reads its rules elsewhere (kernels/direct/rules)")
    return layer, top


def calls(layer, top, rng):
    """``(forward, backward, backward without dx)`` of ``layer`` on random data."""
    import numpy as np

    from minilms.layers import StepIO
    x = rng.standard_normal(layer.bottom_shapes[0]).astype(np.float32)
    params = {q.name: q.initial(rng) for q in layer.params()}
    work = {b.name: np.empty(b.shape, b.dtype_in(np.float32)) for b in layer.workspace()}
    grads = {name: np.empty_like(value) for name, value in params.items()}
    dy = rng.standard_normal(top).astype(np.float32)

    def io(dx):
        return StepIO(bottom=[x], top=[np.empty(top, np.float32)], params=params, work=work,
                      top_grad=[dy], bottom_grad=[dx], param_grad=grads)
    both, weights_only = io(np.empty_like(x)), io(None)
    return (lambda: layer.forward(both), lambda: layer.backward(both),
            lambda: layer.backward(weights_only))


def alternate(pair, rounds):
    """Median seconds of each of two calls, alternating, after one call each."""
    times = ([], [])
    for call in pair:
        call()
    for _ in range(rounds):
        for i, call in enumerate(pair):
            start = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def paths(layer) -> str:
    engine = layer.fast
    return (f"fwd {'direct' if engine.forward_direct else 'gemm'}, "
            f"dW {'direct' if engine.dw_direct else 'gemm'}, dx {engine.dx_path or 'gemm'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None,
                        help="default: numba.get_num_threads()")
    parser.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    args = parser.parse_args(argv)
    import numba
    import numpy as np

    import minilms  # noqa: F401  (BLAS and Numba set up as training does)
    from minilms.kernels.direct import vector_ir
    if args.threads:
        numba.set_num_threads(args.threads)
    shapes, rounds = (SMOKE_SHAPES, 2) if args.smoke else (SHAPES, args.rounds)
    print(f"bench_direct: {numba.get_num_threads()} threads, {vector_ir.VL} lanes, "
          f"{'mask registers' if vector_ir.MASK_REGISTERS else 'no mask registers'}, "
          f"{vector_ir.REGISTERS} vector registers; median ms of {rounds} alternating calls, "
          f"ratio = im2col + GEMM / direct")
    print(f"{'shape':22} {'forward':>21} {'weight gradient':>21} {'input gradient':>21}  paths")
    for shape in shapes:
        rng = np.random.default_rng(0)
        direct, top = layer_for(shape, True)
        gemm, _ = layer_for(shape, False)
        fast, slow = calls(direct, top, rng), calls(gemm, top, rng)
        forward = alternate((fast[0], slow[0]), rounds)
        backward = alternate((fast[1], slow[1]), rounds)
        weights = alternate((fast[2], slow[2]), rounds)
        dx = [max(b - w, 1e-6) for b, w in zip(backward, weights)]
        cells = "".join(f" {a * 1e3:7.2f} {b * 1e3:7.2f} {b / a:4.2f}x"
                        for a, b in (forward, weights, dx))
        print(f"{shape[0]:22}{cells}  {paths(direct)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
