"""A full-size net's convolutions shape by shape: minilms' layer, with the paths its engine takes
in the net, against PyTorch's ``conv2d`` on the same threads, forward and backward.

    python scripts/bench_layers.py [--net resnet50:224:8] [--rounds 3] [--repeat 3] [--cold]
                                   [--torch-python PATH] [--no-torch] [--smoke]

Every distinct convolution of the net as written (input shape, weight shape, geometry; the layers
a fused net stacks are apart here, as PyTorch runs them) once, named by its first layer, with the
number of layers of that shape. Each is timed as ``bench_kernels`` times: the best of ``--repeat``
calls after a warm-up, in ``--rounds`` rounds that alternate the two libraries, each keeping its
best; hot (the operands in cache as far as they fit), or with ``--cold`` after every cache line of
400 MiB is written before each call (``bench_slotted``'s way), so that operands and weights come
from memory as in the net. The backward computes the input gradient only where the net needs
one (not for a layer over the data). PyTorch runs in a process of its own with its own thread
defaults (as in ``bench_fullsize``; minilms' ``OMP_WAIT_POLICY`` slows its OpenMP), started with
``--torch-python`` (default: this interpreter, if it has torch) and asked for one shape at a time.

Columns: the layers of the shape, the path minilms' engine takes (``pointwise``, ``winograd``,
``windows``, ``bands``, ``direct`` or ``im2col``), each pass's ms and GFLOP/s, PyTorch's ms and
the ratio (PyTorch's time over minilms'; above 1 minilms is faster). Last, the net's convolutions
as a whole (each shape's times by its count) against numpy's SGEMM rate measured in this run.
Neither way is the net's iteration, where a layer follows others (docs/benchmarks.md, session 61:
a path faster here measured slower in the net): the training benchmarks (``bench_fullsize``) and
a trace's table say what the iteration does. Where ``bench_fullsize`` says how far minilms is
from PyTorch, this says on which shapes.

``--smoke``: tiny, for the test suite.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SETTLE_SECONDS = 0.3    # quiet before each library's turn (bench_kernels.SETTLE_SECONDS)
FLUSH_BYTES = 400 << 20  # written before each call with --cold: beyond any last-level cache here


def best_of(run, repeat: int, warmup: float, flush=None) -> float:
    """The fastest of ``repeat`` calls, after calls for ``warmup`` seconds (the first compiles);
    with ``flush`` (a float32 array), every cache line of it written before each timed call."""
    began = time.perf_counter()
    run()
    while time.perf_counter() - began < warmup:
        run()
    fastest = float("inf")
    for _ in range(repeat):
        if flush is not None:
            flush[::16] += 1
        began = time.perf_counter()
        run()
        fastest = min(fastest, time.perf_counter() - began)
    return fastest


# -- the shapes and minilms' side ----------------------------------------------------------------

def shapes_of(net) -> list[dict]:
    """The net's distinct convolutions in its order: the first layer of each, the count, and
    what PyTorch needs to run the same (JSON-able)."""
    found = {}
    for layer in net.layers:
        if layer.type != "Convolution":
            continue
        key = (layer.bottom_shapes[0], layer.num_output, layer.kernel_size, layer._geometry(),
               layer.groups, bool(layer.bias), layer.bottom[0] in net.inputs)
        if key in found:
            found[key]["count"] += 1
            continue
        (_, stride, pad, dilation) = layer._geometry()
        found[key] = {"layer": layer, "name": layer.name, "count": 1,
                      "x": list(layer.bottom_shapes[0]),
                      "weight": [layer.num_output, layer.in_group, *layer.kernel_size],
                      "stride": list(stride), "pad": list(pad), "dilation": list(dilation),
                      "groups": layer.groups, "bias": bool(layer.bias),
                      "dx": layer.bottom[0] not in net.inputs}
    return list(found.values())


def path_of(layer) -> str:
    """The path the layer's engine takes on the ``cpu`` device (``direct.engine``)."""
    fast = getattr(layer, "fast", None)
    if fast is None:
        return "im2col"
    for attribute, name in (("pointwise", "pointwise"), ("winograd_slots", "winograd"),
                            ("window_slots", "windows"), ("band_slots", "bands")):
        if getattr(fast, attribute, 0):
            return name
    parts = [what for what, taken in (("fwd", fast.forward_direct), ("dx", fast.dx_path),
                                      ("dW", fast.dw_direct)) if taken]
    return "direct " + "+".join(parts) if parts else "im2col"


def minilms_calls(shape, rng):
    """``(forward, backward)`` of the net's own layer on random operands."""
    import numpy as np

    from minilms.layers import StepIO
    layer = shape["layer"]
    x = rng.standard_normal(shape["x"]).astype(np.float32)
    params = {p.name: p.initial(rng) for p in layer.params()}
    top = layer.top_shapes[0]
    dy = rng.standard_normal(top).astype(np.float32)
    io = StepIO(bottom=[x], top=[np.empty(top, np.float32)], params=params,
                work={b.name: np.empty(b.shape, b.dtype_in(np.float32))
                      for b in layer.workspace()},
                top_grad=[dy], bottom_grad=[np.empty_like(x) if shape["dx"] else None],
                param_grad={name: np.empty_like(value) for name, value in params.items()})
    return (lambda: layer.forward(io)), (lambda: layer.backward(io))


# -- PyTorch's side, in a process of its own -----------------------------------------------------

def torch_worker(shapes_json: str, threads: int, repeat: int, warmup: float, cold: bool) -> None:
    """The child: builds every shape's tensors, says READY, then for each index read from stdin
    prints ``TIME forward backward`` (seconds, best of ``repeat``; ``cold`` as ``--cold``)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    flush = np.ones(FLUSH_BYTES // 4, np.float32) if cold else None
    generator = torch.Generator().manual_seed(0)
    cases = []
    for shape in json.loads(shapes_json):
        x = torch.randn(shape["x"], generator=generator).requires_grad_(shape["dx"])
        w = torch.randn(shape["weight"], generator=generator, requires_grad=True)
        b = torch.zeros(shape["weight"][0], requires_grad=True) if shape["bias"] else None

        def forward(x=x, w=w, b=b, s=shape):
            return F.conv2d(x, w, b, stride=s["stride"], padding=s["pad"],
                            dilation=s["dilation"], groups=s["groups"])
        y = forward()
        dy = torch.randn(y.shape, generator=generator)
        wanted = tuple(t for t in (x, w, b) if t is not None and t.requires_grad)
        cases.append((forward, lambda y=y, dy=dy, wanted=wanted:
                      torch.autograd.grad(y, wanted, dy, retain_graph=True)))
    print("READY", flush=True)
    for line in sys.stdin:
        forward, backward = cases[int(line)]      # the forward with autograd on, as in training
        fwd = best_of(forward, repeat, warmup, flush)
        print(f"TIME {fwd!r} {best_of(backward, repeat, warmup, flush)!r}", flush=True)


class TorchProcess:
    """The PyTorch child, asked one shape at a time."""

    def __init__(self, python, shapes, threads, repeat, warmup, cold):
        from bench_fullsize import worker_env
        public = [{k: v for k, v in shape.items() if k != "layer"} for shape in shapes]
        self.process = subprocess.Popen(
            [python, __file__, "--torch-worker", json.dumps(public), str(threads), str(repeat),
             str(warmup), "cold" if cold else "hot"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=worker_env("torch"))
        if self._line() != "READY":
            raise RuntimeError("bench_layers: the PyTorch process did not start")

    def _line(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("bench_layers: the PyTorch process ended early")
        return line.strip()

    def time(self, index: int) -> tuple[float, float]:
        self.process.stdin.write(f"{index}\n")
        self.process.stdin.flush()
        _, fwd, bwd = self._line().split()
        return float(fwd), float(bwd)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


# -- the table -----------------------------------------------------------------------------------

def flops(shape) -> tuple[float, float]:
    """A shape's forward FLOPs, and its backward's (twice, or once without an input gradient)."""
    forward = shape["layer"].flops()
    return forward, forward * (2 if shape["dx"] else 1)


def report(shapes, ours, theirs, sgemm) -> None:
    rival = f" {'torch fwd':>9} {'torch bwd':>9} {'fwd x':>5} {'bwd x':>5}" if theirs else ""
    print(f"{'layer':14} {'n':>2} {'input':>17} {'kernel':>8} {'path':17} {'fwd ms':>8} "
          f"{'GF/s':>5} {'bwd ms':>8} {'GF/s':>5}" + rival)
    totals = [0.0, 0.0, 0.0, 0.0]
    for i, shape in enumerate(shapes):
        fwd, bwd = ours[i]
        f_flops, b_flops = flops(shape)
        w = shape["weight"]
        kernel = f"{w[2]}x{w[3]}/{shape['stride'][0]}"
        row = (f"{shape['name']:14} {shape['count']:2} {'x'.join(map(str, shape['x'])):>17} "
               f"{kernel:>8} {path_of(shape['layer']):17} {fwd * 1e3:8.2f} "
               f"{f_flops / fwd / 1e9:5.0f} {bwd * 1e3:8.2f} {b_flops / bwd / 1e9:5.0f}")
        totals[0] += shape["count"] * fwd
        totals[1] += shape["count"] * bwd
        if theirs:
            t_fwd, t_bwd = theirs[i]
            totals[2] += shape["count"] * t_fwd
            totals[3] += shape["count"] * t_bwd
            row += f" {t_fwd * 1e3:9.2f} {t_bwd * 1e3:9.2f} {t_fwd / fwd:5.2f} {t_bwd / bwd:5.2f}"
        print(row)
    f_all = sum(shape["count"] * flops(shape)[0] for shape in shapes)
    b_all = sum(shape["count"] * flops(shape)[1] for shape in shapes)
    print(f"the net's convolutions ({sum(s['count'] for s in shapes)} layers): minilms forward "
          f"{totals[0] * 1e3:.1f} ms ({f_all / totals[0] / sgemm:.0%} of SGEMM), backward "
          f"{totals[1] * 1e3:.1f} ms ({b_all / totals[1] / sgemm:.0%})"
          + (f"; PyTorch forward {totals[2] * 1e3:.1f} ms ({f_all / totals[2] / sgemm:.0%}), "
             f"backward {totals[3] * 1e3:.1f} ms ({b_all / totals[3] / sgemm:.0%}); ratio "
             f"forward {totals[2] / totals[0]:.2f}x, backward {totals[3] / totals[1]:.2f}x"
             if theirs else "")
          + f" (numpy's SGEMM {sgemm / 1e9:.0f} GFLOP/s in this run)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", default="resnet50:224:8", metavar="MODEL:SIZE:BATCH")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=0.2)
    parser.add_argument("--cold", action="store_true",
                        help="400 MiB written before each timed call (operands from memory)")
    parser.add_argument("--torch-python", default=None, help="an interpreter that has torch")
    parser.add_argument("--no-torch", action="store_true", help="minilms' times alone")
    parser.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    parser.add_argument("--torch-worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_worker:
        shapes, threads, repeat, warmup, cold = args.torch_worker
        torch_worker(shapes, int(threads), int(repeat), float(warmup), cold == "cold")
        return 0
    if args.rounds < 1 or args.repeat < 1:
        print(f"bench_layers: --rounds and --repeat: expected at least 1, found {args.rounds} "
              f"and {args.repeat}", file=sys.stderr)
        return 2
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import numba
    import numpy as np

    from bench_fullsize import build, parse_case, sgemm_rate, torch_python
    case = parse_case(args.net, "bench_layers: --net")
    if args.smoke:
        case = {"model": "resnet50", "size": 32, "batch": 2, "width": 16, "classes": 10}
        args.rounds, args.repeat, args.warmup = 1, 1, 0.0
    net, _ = build(case, np, fuse="none")
    shapes = shapes_of(net)
    threads = numba.get_num_threads()
    python, why_not = (None, "--no-torch") if args.no_torch else torch_python(args)
    rival = TorchProcess(python, shapes, threads, args.repeat, args.warmup,
                         args.cold) if python else None
    flush = np.ones(FLUSH_BYTES // 4, np.float32) if args.cold else None
    rng = np.random.default_rng(0)
    calls = [minilms_calls(shape, rng) for shape in shapes]
    ours = [[float("inf")] * 2 for _ in shapes]
    theirs = [[float("inf")] * 2 for _ in shapes] if rival else None
    sgemm = sgemm_rate(256 if args.smoke else 2048)
    print(f"bench_layers: {case['model']} {case['size']}x{case['size']} batch {case['batch']}, "
          f"{len(shapes)} distinct convolutions, {threads} threads, best of {args.repeat} in each "
          f"of {args.rounds} rounds, {'cold' if args.cold else 'hot'}; PyTorch: "
          f"{python or 'none (' + why_not + ')'}")
    try:
        for _ in range(args.rounds):
            for i, (forward, backward) in enumerate(calls):
                time.sleep(SETTLE_SECONDS if not args.smoke else 0)
                ours[i][0] = min(ours[i][0], best_of(forward, args.repeat, args.warmup, flush))
                ours[i][1] = min(ours[i][1], best_of(backward, args.repeat, args.warmup, flush))
                if rival:
                    time.sleep(SETTLE_SECONDS)
                    theirs[i] = [min(a, b) for a, b in zip(theirs[i], rival.time(i))]
    finally:
        if rival:
            rival.close()
    report(shapes, ours, theirs, sgemm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
