"""Swap or recompute (issue 21): swap only against swap + recompute in the same pool, predicted
for a GPU at full size and measured on the ``cpu`` device behind a slow link; and the memory /
compute curve of checkpointing on a deep chain against Chen et al.'s sqrt(N).

    python scripts/bench_recompute.py [--predicted] [--measured] [--curve] [--smoke]
                                      [--links 0.25 1] [--iters 3] [--images docs/images]

With no section named, all three run, one after another, in this process.

``--predicted``: ResNet-50 and GoogLeNet at 224x224, batch 32, a 1 GiB ``cuda`` device behind
PCIe 3.0, planned by ``policy: auto`` with ``lms.recompute`` off and auto; the cost model's
bytes moved, compute, stall and iteration time (no GPU runs here: every figure is predicted).

``--measured``: ResNet-50 and GoogLeNet at 224x224, batch 8, on the ``cpu`` device in a pool an
eighth of what LMS off needs, behind link models of ``--links`` GB/s (0.25: slow enough that, as
a GPU's PCIe link is, the link and not the compute bounds a step; 1: where it is not); median
seconds per iteration,
the stall, bytes moved, and whether the weights after the run are bit for bit those of the run
without recompute (they must be).

``--curve``: a chain of N conv-BN-ReLU blocks (``zoo.chain``, 16 channels at 32x32, batch 8),
checkpointed into 1..N segments (``recompute.checkpointed``): for each, the activation bytes
the planner's plan holds at its peak without moving any (the least such pool, found by
bisection) against the forward FLOPs run again; and, for N = 16, 64, 256, the least of them
against sqrt(N). Plotted in ``recompute_curve.png``.
"""
import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilms import zoo  # noqa: E402
from minilms.device import CpuDevice, parse_link  # noqa: E402
from minilms.errors import PlanError  # noqa: E402
from minilms.lms import LmsExecutor, Policy, resident_bytes  # noqa: E402
from minilms.lms.cost import CostModel, measure_cpu, plan_for, simulate  # noqa: E402
from minilms.lms.planner import make_plan  # noqa: E402
from minilms.lms.recompute import (  # noqa: E402
    RECOMPUTE,
    candidates,
    checkpointed,
    recompute_schedule,
    recomputed,
)
from minilms.net import Net  # noqa: E402
from minilms.sizes import format_bytes  # noqa: E402
from minilms.solver import SGD  # noqa: E402

MiB, GiB = 2**20, 2**30


def make_net(model: str, batch: int, size: int, classes: int = 1000, width: int = 1) -> Net:
    layers = zoo.MODELS[model](num_classes=classes, width=width)
    return Net(layers, {"data": ((batch, 3, size, size), np.float32),
                        "label": ((batch,), np.int32)})


def extra_flops(net: Net, plan) -> int:
    return sum(net.layer[s.step.layer].flops() for s in plan.steps if s.step.kind == RECOMPUTE)


def moved(plan) -> int:
    return plan.bytes_moved("h2d") + plan.bytes_moved("d2h")


def row(label, plan, net, model, seconds=None) -> dict:
    timeline = simulate(plan, net, model)
    return {"label": label, "moved": moved(plan), "compute": timeline.compute_seconds,
            "stall": timeline.stall_seconds, "predicted": timeline.seconds,
            "rebuilt": len(recomputed(net, plan)), "flops": extra_flops(net, plan),
            "measured": seconds}


def goal(off: dict, on: dict, key: str) -> str:
    fewer = 1 - on["moved"] / max(off["moved"], 1)
    faster = off[key] / on[key]
    met = fewer >= 0.30 and faster > 1.0
    return (f"{fewer:.0%} fewer bytes moved, step {faster:.2f}x faster "
            f"({'met' if met else 'NOT met'}: goal at least 30% fewer and faster)")


def predicted(args) -> None:
    print(f"\n== predicted for a GPU: cuda cost model, link {args.gpu_link}, pool "
          f"{format_bytes(args.gpu_pool)}, batch {args.gpu_batch} at 224x224")
    model = CostModel.for_device("cuda", parse_link(args.gpu_link))
    print(f"cost model: {model.describe()}")
    print(f"{'model':10} {'recompute':9} {'moved/iter':>11} {'compute ms':>10} {'stall ms':>9} "
          f"{'iter ms':>8} {'rebuilt':>7} {'GFLOP added':>11} {'plan s':>6}")
    for name in args.models:
        net = make_net(name, args.gpu_batch, args.size, width=args.gpu_width)
        steps = net.schedule(("momentum",))
        rows = {}
        for recompute in ("off", "auto"):
            start = time.perf_counter()
            plan = plan_for(net, steps, args.gpu_pool, Policy(policy="auto",
                                                              recompute=recompute), model)
            took = time.perf_counter() - start
            r = rows[recompute] = row(recompute, plan, net, model)
            print(f"{name:10} {recompute:9} {format_bytes(r['moved']):>11} "
                  f"{r['compute'] * 1e3:10.2f} {r['stall'] * 1e3:9.2f} "
                  f"{r['predicted'] * 1e3:8.2f} {r['rebuilt']:7d} {r['flops'] / 1e9:11.1f} "
                  f"{took:6.1f}")
        print(f"{name}: {goal(rows['off'], rows['auto'], 'predicted')} (predicted)")


def train(net: Net, capacity: int, policy: Policy, model: CostModel, link, batch, args):
    with CpuDevice(capacity, link=link) as device:
        executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), policy, cost_model=model)
        executor.iterate(batch)           # warm-up: compiles, fills the caches
        times, stalls = [], []
        for _ in range(args.iters):
            start = time.perf_counter()
            executor.iterate(batch)
            times.append(time.perf_counter() - start)
            stalls.append(executor.stall_seconds)
        executor.sync_state()
        weights = {name: b.host_data().copy() for name, b in executor.shared.items()
                   if b.role in ("param", "optimizer_state")}
        result = row(policy.recompute, executor.plan, executor.net, model,
                     statistics.median(times))
        result["stall measured"] = statistics.mean(stalls)
    return result, weights


def measured(args) -> None:
    for link in args.links:
        measured_on(args, parse_link(link))


def measured_on(args, link) -> None:
    model = measure_cpu(link)             # this machine's rates, as the trainer plans with
    print(f"\n== measured on the cpu device: batch {args.batch} at {args.size}x{args.size}, "
          f"{link!r}, pool 1/{args.fraction} of LMS off, {args.iters} iterations after 1 "
          "warm-up")
    print(f"cost model: {model.describe()}")
    print(f"{'model':10} {'recompute':9} {'pool':>10} {'moved/iter':>11} {'s/iter':>7} "
          f"{'stall s':>7} {'predicted s':>11} {'rebuilt':>7} {'GFLOP added':>11} weights")
    rng = np.random.default_rng(0)
    for name in args.models:
        net = make_net(name, args.batch, args.size, classes=10, width=args.width)
        batch = {"data": rng.standard_normal(net.blobs["data"].shape).astype(np.float32),
                 "label": rng.integers(0, 10, args.batch).astype(np.int32)}
        capacity = resident_bytes(net, net.schedule(("momentum",))) // args.fraction
        rows, weights = {}, {}
        for recompute in ("off", "auto"):
            rows[recompute], weights[recompute] = train(
                make_net(name, args.batch, args.size, classes=10, width=args.width), capacity,
                Policy(policy="auto", recompute=recompute), model, link, batch, args)
            r = rows[recompute]
            same = "" if recompute == "off" else (
                "bit for bit" if all(np.array_equal(weights["off"][k], v)
                                     for k, v in weights["auto"].items()) else "DIFFER")
            print(f"{name:10} {recompute:9} {format_bytes(capacity):>10} "
                  f"{format_bytes(r['moved']):>11} {r['measured']:7.2f} "
                  f"{r['stall measured']:7.2f} {r['predicted']:11.2f} {r['rebuilt']:7d} "
                  f"{r['flops'] / 1e9:11.1f} {same}")
        print(f"{name}: {goal(rows['off'], rows['auto'], 'measured')} (measured); predicted "
              f"{rows['off']['predicted'] / rows['auto']['predicted']:.2f}x")


def activation_peak(net: Net, plan) -> int:
    """The most activation bytes the plan holds on the device at once."""
    return max(sum(net.blobs[b].nbytes for b in s.resident if net.blobs[b].role == "activation")
               for s in plan.steps)


def least_still_plan(net: Net, steps, high: int):
    """The plan in the least pool (to 64 KiB) where no activation is swapped out: (pool, plan)."""
    def plan_or_none(capacity):
        try:
            plan = make_plan(net, steps, capacity, Policy(limit=capacity, keep_state=True))
        except PlanError:
            return None
        swaps = [a for _, a in plan.actions() if a.kind == "swap_out"
                 and net.blobs[a.blob].role == "activation" and a.blob not in plan.outputs]
        return None if swaps else plan
    low, best = 0, plan_or_none(high)
    while high - low > 64 * 1024:
        middle = (low + high) // 2
        plan = plan_or_none(middle)
        if plan is None:
            low = middle
        else:
            high, best = middle, plan
    return high, best


def curve(args) -> None:
    print(f"\n== checkpointing a chain of N conv-BN-ReLU blocks (16 channels, {args.chain_size}x"
          f"{args.chain_size}, batch 8): activation memory against forwards run again")
    lines, least = {}, {}
    for n in args.depths:
        net = Net(zoo.chain(n), {"data": ((8, 3, args.chain_size, args.chain_size), np.float32),
                                 "label": ((8,), np.int32)})
        steps = net.schedule(("momentum",))
        found = candidates(net, steps)
        forward = sum(net.layer[s.layer].flops() for s in steps if s.kind == "forward")
        high = resident_bytes(net, steps) + MiB
        counts = sorted({c for c in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, len(found))
                         if c <= len(found)} | {round(math.sqrt(len(found)))})
        points = []
        for count in [0] + counts:        # 0: recompute nothing (keep everything)
            blobs = checkpointed(net, found, count) if count else []
            schedule = recompute_schedule(net, steps, blobs) if blobs else steps
            _, plan = least_still_plan(net, schedule, high)
            points.append((count, activation_peak(net, plan), extra_flops(net, plan) / forward))
        lines[n] = points
        keep = points[0][1]
        best = min(points[1:], key=lambda p: (p[1], p[2]))
        least[n] = best
        print(f"N={n:4d} ({len(found)} candidate blobs): keep everything {format_bytes(keep)}; "
              f"least {format_bytes(best[1])} ({best[1] / keep:.1%}) with {best[0]} segments, "
              f"{best[2]:.2f} forwards run again")
        print("   segments: " + "  ".join(f"{c}: {format_bytes(m)} +{f:.2f}" for c, m, f in
                                          points))
    if len(least) > 1:
        depths = sorted(least)
        base = least[depths[0]][1] / math.sqrt(depths[0])
        print("least activation memory against sqrt(N) (1.00 = grows as sqrt(N) from N="
              f"{depths[0]}): " + ", ".join(f"N={n}: {least[n][1] / math.sqrt(n) / base:.2f}"
                                              for n in depths))
        print("goal: O(sqrt(N)) activation memory for at most one extra forward: "
              + ("met" if all(least[n][2] <= 1.0 + 1e-9 for n in depths)
                 and least[depths[-1]][1] / math.sqrt(depths[-1]) / base < 1.5 else "NOT met"))
    if args.images:
        plot_curve(lines, Path(args.images) / "recompute_curve.png")


def plot_curve(lines: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, points in lines.items():
        front = [p for p in points if not any(q[1] <= p[1] and q[2] <= p[2]
                                              and q[1:] != p[1:] for q in points)]
        front.sort(key=lambda p: p[1])
        line, = ax.plot([p[1] / MiB for p in front], [p[2] for p in front], "-",
                        label=f"N = {n}: the best of each")
        ax.plot([p[1] / MiB for p in points], [p[2] for p in points], "o", color=line.get_color(),
                alpha=0.5)
        ax.annotate("keep all", (points[0][1] / MiB, points[0][2]), fontsize=8)
        ax.axvline(min(p[1] for p in points) / MiB, color=line.get_color(), ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("activation memory at the peak, MiB (no activation swapped)")
    ax.set_ylabel("forward FLOPs run again / one forward")
    ax.set_title("checkpointing a chain of N conv-BN-ReLU blocks (dotted: the least, ~sqrt(N))")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--predicted", action="store_true")
    p.add_argument("--measured", action="store_true")
    p.add_argument("--curve", action="store_true")
    p.add_argument("--models", nargs="+", default=["resnet50", "googlenet"])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=8, help="measured: the batch")
    p.add_argument("--width", type=int, default=1, help="measured: the channel divisor")
    p.add_argument("--fraction", type=int, default=8, help="measured: pool = LMS off / this")
    p.add_argument("--links", nargs="+", default=["0.25", "1"],
                   help="measured: the cpu device's links (GB/s or names), one run each")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--gpu-batch", type=int, default=32)
    p.add_argument("--gpu-pool", type=int, default=GiB)
    p.add_argument("--gpu-link", default="pcie3")
    p.add_argument("--gpu-width", type=int, default=1)
    p.add_argument("--depths", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--chain-size", type=int, default=32)
    p.add_argument("--images", default=str(Path(__file__).resolve().parent.parent / "docs" /
                                           "images"))
    p.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    args = p.parse_args(argv)
    if not (args.predicted or args.measured or args.curve):
        args.predicted = args.measured = args.curve = True
    if args.smoke:
        args.models, args.size, args.batch, args.width, args.iters = ["resnet18"], 32, 4, 16, 1
        args.gpu_batch, args.gpu_pool, args.gpu_width = 4, MiB, 16
        args.depths, args.chain_size = [4, 9], 8
        args.fraction, args.links = 2, ["0.5"]
    for section in ("predicted", "measured", "curve"):
        if getattr(args, section):
            globals()[section](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
