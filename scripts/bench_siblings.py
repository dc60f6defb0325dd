"""Sibling 1x1 convolutions (layers that read the same blob) each on its own, against the
``StackedConvolution`` that runs them as one with their weights stacked, group by group: what the
net's stacking (``fusion.stack_siblings``) buys, and where it does not pay.

    python scripts/bench_siblings.py [--models googlenet:224:8 resnet50:224:8] [--rounds 12]
                                     [--hot] [--smoke]

Each of GoogLeNet's inception blocks runs three 1x1 convolutions on one input (the 1x1 branch and
the 3x3 and 5x5 branches' reductions), with 16 to 384 outputs each: products of few rows, each of
which reads (and BLAS packs) the whole input, and whose input gradients are products with a short
inner dimension added into one another. One convolution with their weights stacked
(``[O1 + O2 + O3, C]``, TensorRT's horizontal fusion) reads the input once, and its products are
as tall as the three together; its output then goes to the members' blobs (a copy of rows), and
in backward their gradients come into one blob (a copy back).

For each group of the net written out (``fusion.sibling_groups``, every group, stacked by the net
or not), alternating call by call in one process, with 400 MiB written before each call
(``--hot``: not), so that operands come from memory as in the net: the members' forward and
backward (dx and dW) through the ``cpu`` engine, one after another, each member's dx added into
the first's where the engine adds (``StepIO.adds``, as in the net), against the stacked layer's.
The median ms of each; their ratio; the largest difference between the two ways' tops, dx and
dW, relative to the largest magnitude (float32 rounding: the sums are regrouped); and the sum
over the groups, the most an iteration would save (docs/benchmarks.md, session 54).

``--smoke``: GoogLeNet at 1/8 width on 64x64 images, batch 2, two rounds: for the test suite.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _buffers(layer, rng):
    """A member's arrays: ``(weight, bias or None, workspace by name, y, dy, dweight, dbias)``."""
    import numpy as np
    weight = (rng.standard_normal((layer.num_output, layer.in_group, 1, 1), dtype=np.float32)
              * 0.05)
    bias = np.zeros(layer.num_output, np.float32) if layer.bias else None
    y = np.empty(layer.top_shapes[0], np.float32)
    dy = rng.standard_normal(layer.top_shapes[0], dtype=np.float32)
    return weight, bias, _work(layer), y, dy, np.empty_like(weight), \
        None if bias is None else np.empty_like(bias)


def _work(layer):
    import numpy as np
    return {spec.name: np.empty(spec.shape, spec.dtype_in(np.float32))
            for spec in layer.workspace()}


def _params(layer, arrays, which=(0, 1)):
    """A member's parameters (``which``: ``(0, 1)``) or their gradients (``(5, 6)``) by name."""
    weight, bias = (arrays[i] for i in which)
    return {"weight": weight} if bias is None else {"weight": weight, "bias": bias}


def group_calls(group, rng):
    """``(members, stacked, error)``: the two ways through the group, each a call (forward then
    backward) with its arrays bound, and the largest difference of their results."""
    import numpy as np

    from minilms.layers import StepIO
    from minilms.layers.stacked_convolution import StackedConvolution
    x = rng.standard_normal(group[0].bottom_shapes[0], dtype=np.float32)
    dx, dx_stacked = np.empty_like(x), np.empty_like(x)
    own = [_buffers(layer, rng) for layer in group]
    stacked = StackedConvolution(group)      # sets its members up again, as the net does
    stacked.setup([x.shape], "cpu")
    work = _work(stacked)
    params = {f"{m.name}.{k}": v for m, a in zip(group, own) for k, v in _params(m, a).items()}
    grads = {name: np.empty_like(value) for name, value in params.items()}
    tops = [np.empty_like(arrays[3]) for arrays in own]    # the members' blobs, stacked way
    partial = np.empty_like(x) if not all(m.adds_bottom_grad for m in group[1:]) else None

    def members():
        for i, (layer, arrays) in enumerate(zip(group, own)):
            adds = i > 0 and layer.adds_bottom_grad
            out = partial if i > 0 and not adds else dx
            layer.forward(StepIO(bottom=[x], top=[arrays[3]], params=_params(layer, arrays),
                                 work=arrays[2]))
            layer.backward(StepIO(bottom=[x], top=[None], params=_params(layer, arrays),
                                  work=arrays[2], top_grad=[arrays[4]], bottom_grad=[out],
                                  param_grad=_params(layer, arrays, (5, 6)),
                                  adds=frozenset({0}) if adds else frozenset()))
            if i > 0 and not adds:
                np.add(dx, partial, out=dx)

    def one():
        stacked.forward(StepIO(bottom=[x], top=tops, params=params, work=work))
        stacked.backward(StepIO(bottom=[x], top=[None] * len(group), params=params, work=work,
                                top_grad=[arrays[4] for arrays in own],
                                bottom_grad=[dx_stacked], param_grad=grads))

    def error():
        """The largest difference of the two ways' results (tops, dx, dW), relative to the
        largest magnitude of each."""
        members()
        one()
        pairs = [(dx, dx_stacked)] + [
            pair for layer, top, arrays in zip(group, tops, own)
            for pair in ((arrays[3], top), (arrays[5], grads[f"{layer.name}.weight"]))]
        return max(float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)) for a, b in pairs)
    return members, one, error


def time_groups(nets, rounds, cold):
    """A row per group of ``nets``; returns the summed medians ``(members, stacked)``, seconds."""
    import numpy as np
    from bench_slotted import _alternate_timed, flushed, timed

    from minilms.fusion import sibling_groups
    rng = np.random.default_rng(0)
    flush = np.ones(400 * 2**20 // 4, np.float32) if cold else None
    print(f"{'group':34} {'input':>16} {'outputs':>14} {'apart':>8} {'stacked':>8} "
          f"{'ratio':>6} {'error':>8}  (ms forward + backward, median of alternating calls, "
          f"{'cold' if cold else 'hot'})")
    totals = [0.0, 0.0]
    for net in nets:
        for group in sibling_groups(net.layers):
            *calls, error = group_calls(group, rng)
            runs = [flushed(call, flush) if cold else timed(call) for call in calls]
            apart, together = _alternate_timed(runs, rounds)
            totals[0] += apart
            totals[1] += together
            name = "+".join(layer.name for layer in group)
            outputs = "+".join(str(layer.num_output) for layer in group)
            shape = "x".join(map(str, group[0].bottom_shapes[0]))
            print(f"{name[:34]:34} {shape:>16} {outputs:>14} {apart * 1e3:8.2f} "
                  f"{together * 1e3:8.2f} {apart / together:5.2f}x {error():8.1e}")
    return totals


def main(argv=None) -> int:
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import numpy as np
    from bench_fullsize import build, parse_case
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["googlenet:224:8", "resnet50:224:8"])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--hot", action="store_true", help="no cache flush between calls")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    cases = [dict(parse_case("googlenet:64:2", "--smoke"), width=8)] if args.smoke else \
        [parse_case(text, "bench_siblings: --models") for text in args.models]
    rounds = 2 if args.smoke else args.rounds
    for case in cases:
        net, _ = build(dict(case, lms=False), np, fuse="none")     # every group, apart
        print(f"\n{case['model']} {case['size']} b{case['batch']}:")
        apart, together = time_groups([net], rounds, not args.hot)
        if apart:
            print(f"{case['model']} {case['size']} b{case['batch']}: the groups apart "
                  f"{apart * 1e3:.1f} ms, stacked {together * 1e3:.1f} ms, "
                  f"{apart / together:.2f}x; at most {(apart - together) * 1e3:.1f} ms an "
                  f"iteration saved")
        else:
            print(f"{case['model']} {case['size']} b{case['batch']}: no sibling 1x1 groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
