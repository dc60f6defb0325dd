"""LMS step time against LMS off: the Caffe document's Off / Default / Tuned, with and without
prefetch, on a model that fits and under a memory cap, with and without a link model.

    python scripts/bench_lms.py [--model resnet18] [--width 4] [--image-size 32] [--batch 32]
                                [--iters 6] [--cap 1.25] [--link pcie3] [--sweep] [--smoke]

Everything runs on the ``cpu`` device, in this process, one after another. Off keeps every blob
resident (it needs the pool the model needs); Default is LMS with the manual knobs at their
defaults (Caffe's ``-lms``: keep only what the next step needs); Tuned keeps blobs resident up to
the pool (``limit``) and parameters and optimizer state across iterations (Caffe's
``-lms_exclude``, chosen by hand); Auto is ``policy: auto``. "Fits" gives every variation the pool
LMS off needs; "capped" gives it ``--cap`` times the least pool LMS needs, where Off cannot run.

Printed per row: the median iteration time, its ratio against Off (measured in the same process,
same link), the time compute waited for copies (stall), the stall the planner's cost model
predicted, and MiB moved per iteration. The goals of the engine issue are checked at the end:
with prefetch, LMS on a model that fits costs at most 5% over Off; under the cap with the link
model, prefetch cuts the stall by at least half against prefetch 0.

``--sweep`` adds two pictures (``docs/images/lms_capacity.png``, ``lms_link.png``): step time
against the device's capacity (from the least pool to what LMS off needs), and against the link's
bandwidth (2 GB/s to NVLink 2.0's 75 per direction), measured and as the cost model predicts.
The LMS documents credit NVLink's 150 GB/s against PCIe 3.0's 32 (both directions) with a 2.7x
speed-up; the link sweep shows what the model and the executor say for this model.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilms import zoo  # noqa: E402
from minilms.device import CpuDevice, parse_link  # noqa: E402
from minilms.lms import (  # noqa: E402
    LmsExecutor,  # noqa: E402
    Policy,
    least_pool,
    resident_bytes,
)
from minilms.lms.cost import measure_cpu, simulate  # noqa: E402
from minilms.net import Net  # noqa: E402
from minilms.sizes import format_bytes  # noqa: E402
from minilms.solver import SGD  # noqa: E402

MiB = 2**20


def model(args):
    if args.model == "lenet":
        return zoo.lenet(num_classes=10)
    return zoo.MODELS[args.model](num_classes=10, width=args.width)


def inputs(args, seed=0):
    rng = np.random.default_rng(seed)
    channels = 1 if args.model == "lenet" else 3
    size = 28 if args.model == "lenet" else args.image_size
    return {"data": rng.standard_normal((args.batch, channels, size, size)).astype(np.float32),
            "label": rng.integers(0, 10, args.batch).astype(np.int32)}


def run(args, layers, batch, capacity, policy, link):
    """Median seconds per iteration, mean stall seconds, predicted stall, bytes moved."""
    net = Net(layers, {k: (v.shape, v.dtype) for k, v in batch.items()}, device_kind="cpu")
    with CpuDevice(capacity, link=parse_link(link)) as device:
        executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), policy,
                               cost_model=args.cost_model.with_link(parse_link(link)))
        for _ in range(args.warmup):
            executor.iterate(batch)
        times, stalls = [], []
        for _ in range(args.iters):
            start = time.perf_counter()
            executor.iterate(batch)
            times.append(time.perf_counter() - start)
            stalls.append(executor.stall_seconds)
        plan = executor.plan
        predicted = simulate(plan, executor.net, executor.cost_model).stall_seconds
        moved = plan.bytes_moved("h2d") + plan.bytes_moved("d2h")
    return statistics.median(times), statistics.mean(stalls), predicted, moved, plan


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18", choices=sorted(zoo.MODELS))
    p.add_argument("--width", type=int, default=4)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--cap", type=float, default=1.25, help="capped pool: this times the least")
    p.add_argument("--link", default="pcie3")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    p.add_argument("--sweep", action="store_true", help="also sweep capacity and link bandwidth")
    p.add_argument("--images", default=str(Path(__file__).resolve().parent.parent / "docs" /
                                           "images"))
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.width, args.batch, args.iters, args.warmup = "resnet18", 16, 4, 1, 1
    args.cost_model = measure_cpu()     # this machine's rates, as the trainer plans with
    layers, batch = model(args), inputs(args)
    net = Net(layers, {k: (v.shape, v.dtype) for k, v in batch.items()}, device_kind="cpu")
    steps = net.schedule(("momentum",))
    fits = resident_bytes(net, steps) + MiB
    capped = int(args.cap * least_pool(net, steps))
    k = args.prefetch
    tuned = Policy(limit=fits, keep_state=True)
    variations = [
        ("fits", "Off", fits, Policy(enabled=False)),
        ("fits", "Default", fits, Policy()),
        ("fits", f"Default, prefetch {k}", fits, Policy(prefetch=k)),
        ("fits", "Tuned", fits, tuned),
        ("fits", f"Tuned, prefetch {k}", fits, Policy(limit=fits, keep_state=True, prefetch=k)),
        ("fits", "Auto", fits, Policy(policy="auto")),
        ("capped", "Default", capped, Policy()),
        ("capped", f"Default, prefetch {k}", capped, Policy(prefetch=k)),
        ("capped", "Tuned", capped, Policy(limit=capped)),
        ("capped", f"Tuned, prefetch {k}", capped, Policy(limit=capped, prefetch=k)),
        ("capped", "Auto", capped, Policy(policy="auto")),
    ]
    print(f"{args.model} width 1/{args.width}, batch {args.batch}, {args.iters} iterations after "
          f"{args.warmup} warm-up; fits: {format_bytes(fits)}, capped: {format_bytes(capped)}")
    results = {}
    for link in (None, args.link):
        print(f"\nlink: {link or 'none (copies at memory speed)'}")
        print(f"{'case':<7} {'variation':<22} {'ms/iter':>9} {'vs Off':>7} {'stall ms':>9} "
              f"{'predicted':>9} {'MiB/iter':>9}  plan")
        off = None
        for case, name, capacity, policy in variations:
            seconds, stall, predicted, moved, plan = run(args, layers, batch, capacity, policy,
                                                         link)
            off = seconds if name == "Off" else off
            results[(link, case, name)] = (seconds, stall)
            print(f"{case:<7} {name:<22} {seconds * 1e3:>9.2f} {seconds / off:>6.2f}x "
                  f"{stall * 1e3:>9.2f} {predicted * 1e3:>9.2f} {moved / MiB:>9.2f}  "
                  f"{plan.policy.describe()}{'; ' + plan.notes[0] if plan.notes else ''}")
    off = results[(None, "fits", "Off")][0]
    off_link = results[(args.link, "fits", "Off")][0]
    best_fits = min(results[(None, "fits", f"{n}, prefetch {k}")][0] for n in ("Default", "Tuned"))
    stall0 = results[(args.link, "capped", "Default")][1]
    stall_k = results[(args.link, "capped", f"Default, prefetch {k}")][1]
    print(f"\ngoal: with prefetch, LMS on a model that fits costs at most 5% over Off: "
          f"{best_fits / off:.3f}x ({'met' if best_fits <= 1.05 * off else 'not met'})")
    cut = 1 - stall_k / stall0 if stall0 > 0 else float("nan")
    print(f"goal: under the cap with link {args.link}, prefetch {k} cuts the stall by at least "
          f"half against prefetch 0: {stall0 * 1e3:.2f} ms -> {stall_k * 1e3:.2f} ms, cut "
          f"{cut:.0%} ({'met' if cut >= 0.5 else 'not met'})")
    if args.sweep:
        sweeps(args, layers, batch, net, steps, fits, off_link)
    return 0


def sweeps(args, layers, batch, net, steps, fits, off):
    """Step time against capacity (link fixed) and against link bandwidth (capacity fixed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    least = least_pool(net, steps)
    k = args.prefetch
    policies = (("Default", Policy()), (f"Default, prefetch {k}", Policy(prefetch=k)),
                ("Auto", Policy(policy="auto")))
    capacities = [int(least * f) for f in (1.0, 1.15, 1.3, 1.6, 2.0, 3.0)] + [fits]
    print(f"\nstep time against capacity (link {args.link}); Off: {off * 1e3:.2f} ms")
    by_capacity = {name: [] for name, _ in policies}
    for capacity in capacities:
        cells = []
        for name, policy in policies:
            seconds, stall, predicted, moved, plan = run(args, layers, batch, capacity, policy,
                                                         args.link)
            model = args.cost_model.with_link(parse_link(args.link))
            by_capacity[name].append((seconds, simulate(plan, net, model).seconds))
            cells.append(f"{name} {seconds * 1e3:7.2f} ms")
        print(f"  {format_bytes(capacity):>11}: " + "  ".join(cells))
    links = [2.0, 4.0, 8.0, 16.0, 32.0, 75.0]
    capped = int(args.cap * least)
    print(f"\nstep time against link bandwidth (pool {format_bytes(capped)})")
    by_link = {name: [] for name, _ in policies[:2]}
    for gbps in links:
        cells = []
        for name, policy in policies[:2]:
            seconds, stall, predicted, moved, plan = run(args, layers, batch, capped, policy,
                                                         gbps)
            model = args.cost_model.with_link(parse_link(gbps))
            by_link[name].append((seconds, simulate(plan, net, model).seconds))
            cells.append(f"{name} {seconds * 1e3:7.2f} ms (predicted "
                         f"{by_link[name][-1][1] * 1e3:.2f})")
        print(f"  {gbps:>5g} GB/s: " + "  ".join(cells))
    for name, series in by_link.items():
        pcie, nvlink = series[links.index(16.0)][0], series[links.index(75.0)][0]
        print(f"{name}: PCIe 3.0 -> NVLink 2.0 speeds a step up {pcie / nvlink:.2f}x measured, "
              f"{series[links.index(16.0)][1] / series[links.index(75.0)][1]:.2f}x predicted")
    images = Path(args.images)
    images.mkdir(parents=True, exist_ok=True)
    for name, xs, data, xlabel, scale, file in (
            ("capacity", [c / MiB for c in capacities], by_capacity, "device pool (MiB)", "linear",
             "lms_capacity.png"),
            ("link", links, by_link, "link bandwidth per direction (GB/s, log scale)", "log",
             "lms_link.png")):
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for label, series in data.items():
            line, = ax.plot(xs, [m * 1e3 for m, _ in series], "o-", label=f"{label} (measured)")
            ax.plot(xs, [p * 1e3 for _, p in series], "--", color=line.get_color(),
                    label=f"{label} (cost model)")
        ax.axhline(off * 1e3, color="black", linewidth=1, label="Off (LMS off, fits)")
        if name == "capacity":
            ax.axvline(least / MiB, color="crimson", linestyle=":", label="least pool")
        ax.set_xscale(scale)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms per training iteration")
        ax.set_title(f"{args.model} 1/{args.width}, batch {args.batch}: step time against {name}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(images / file, dpi=110)
        print(f"picture: {images / file}")


if __name__ == "__main__":
    sys.exit(main())
