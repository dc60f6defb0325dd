"""Which batches fit, and in how much memory: the LMS documents' scenarios, planned at full size
and confirmed by real training iterations at a size that fits this machine.

    python scripts/bench_capacity.py [--png docs/images/capacity.png] [--skip-confirm] [--smoke]

Planned (no memory allocated, nothing run): the Caffe document's scenarios A-F, ResNet-152 on
224x224 images at batch 8, 16, 32, 64, 128 and 256 on a 16 GiB device: what LMS off needs, the
least pool LMS needs (Default: Caffe's ``-lms``), the floor under it when steps may split along
the batch (issue 20: one chunk of a step, ``split_floor``), and at 16 GiB the bytes each plan
moves per iteration, Default against Auto (the computed "Tuned"), with the cost model's predicted
step-time ratio. Then the TensorFlow document's GoogLeNet on 2240x2240 images at batch 15, with
and without splitting, planned in a 1.5 GiB pool.

Confirmed with splitting (real iterations): GoogLeNet at ``--split-size`` (2240) and batch 2, in
a pool smaller than its largest unsplit working set, against the same run in a pool large enough
not to split: the losses agree within the tolerance docs/lms.md states.

Confirmed (real iterations on the ``cpu`` device): ResNet-152 at 1/16 width on 32x32 images, the
convolution workspace scaled down with it, in a pool where LMS off fits scenario A's batch and not
B's: Off runs out of memory from B on (an error that names the step); Default and Auto train every
batch A to F (two iterations each, timed).
"""
import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilms import zoo  # noqa: E402
from minilms.device import CpuDevice  # noqa: E402
from minilms.errors import PlanError  # noqa: E402
from minilms.lms import (  # noqa: E402
    LmsExecutor,  # noqa: E402
    Policy,
    least_pool,
    make_plan,
    resident_bytes,
)
from minilms.lms.auto import auto_plan  # noqa: E402
from minilms.lms.bounds import split_floor, working_set_bytes  # noqa: E402
from minilms.lms.cost import CostModel, plan_for, simulate  # noqa: E402
from minilms.lms.substeps import split_counts  # noqa: E402
from minilms.net import Net  # noqa: E402
from minilms.sizes import format_bytes  # noqa: E402
from minilms.solver import SGD  # noqa: E402

GiB, MiB = 2**30, 2**20
SCENARIOS = dict(zip("ABCDEF", (8, 16, 32, 64, 128, 256)))
STATE = ("momentum",)


def build(layers, batch, size, channels=3):
    net = Net(layers, {"data": ((batch, channels, size, size), np.float32),
                       "label": ((batch,), np.int32)})
    return net, net.schedule(STATE)


def planned(args) -> list[dict]:
    """The full-size table: one row per scenario."""
    capacity, rows = 16 * GiB, []
    model = CostModel.for_device("cuda")      # a data-centre GPU on PCIe, the cost model's rates
    layers = zoo.resnet(args.depth, num_classes=1000, width=args.width)
    for name, batch in SCENARIOS.items():
        if args.smoke and name not in "AB":
            continue
        net, steps = build(layers, batch, args.size)
        off, least = resident_bytes(net, steps), least_pool(net, steps, Policy(split="off"))
        row = {"scenario": name, "batch": batch, "off": off, "least": least,
               "floor": split_floor(net, steps)[0]}
        if least <= capacity:
            default = make_plan(net, steps, capacity, Policy())
            auto = auto_plan(net, steps, capacity, model)
            row.update(default_moved=moved(default), auto_moved=moved(auto),
                       auto=auto.policy.describe(),
                       ratio=simulate(auto, net, model).seconds
                       / simulate(default, net, model).seconds)
        rows.append(row)
    return rows


def moved(plan) -> int:
    return plan.bytes_moved("h2d") + plan.bytes_moved("d2h")


def print_planned(rows, title):
    print(title)
    print(f"{'':>3} {'batch':>5}  {'LMS off needs':>14}  {'fits 16 GiB':>11}  "
          f"{'LMS least pool':>14}  {'split floor':>12}  {'Default moves':>14}  "
          f"{'Auto moves':>12}  {'Auto/Default':>12}")
    for r in rows:
        fits = "yes" if r["off"] <= 16 * GiB else "no"
        extra = (f"{format_bytes(r['default_moved']):>14}  {format_bytes(r['auto_moved']):>12}  "
                 f"{r['ratio']:>11.2f}x" if "ratio" in r else "")
        print(f"{r['scenario']:>3} {r['batch']:>5}  {format_bytes(r['off']):>14}  {fits:>11}  "
              f"{format_bytes(r['least']):>14}  {format_bytes(r['floor']):>12}  {extra}")


def googlenet(args):
    size, batch = (224, 2) if args.smoke else (2240, 15)
    net, steps = build(zoo.googlenet(num_classes=1000), batch, size)
    off, least = resident_bytes(net, steps), least_pool(net, steps, Policy(split="off"))
    floor, step = split_floor(net, steps)
    print(f"\nGoogLeNet {size}x{size}, batch {batch} (the TensorFlow LMS document): LMS off needs "
          f"{format_bytes(off)}, LMS needs at least {format_bytes(least)}: "
          f"{'fits' if least <= 16 * GiB else 'does not fit'} a 16 GiB device")
    pool = int(1.5 * GiB) if not args.smoke else (floor + least) // 2
    started = time.perf_counter()
    plan = plan_for(net, steps, pool, Policy())
    counts = split_counts([step_plan.step for step_plan in plan.steps])
    print(f"  with steps split (lms.split auto): floor {format_bytes(floor)} (one chunk of "
          f"{step.name}); planned in {format_bytes(pool)}: {len(counts)} steps split, up to "
          f"{max(counts.values(), default=1)} chunks, peak {format_bytes(plan.peak)}, moves "
          f"{format_bytes(moved(plan))} per iteration (planned in "
          f"{time.perf_counter() - started:.1f} s)")
    return off, least


def confirm(args) -> list[tuple]:
    """Real iterations at 1/16 width, 32x32: Off fits A, not B; LMS trains A to F."""
    layers = zoo.resnet(50 if args.smoke else 152, num_classes=10, width=16)
    for layer in layers:
        if layer["type"] == "Convolution":
            layer["max_workspace"] = 64 * 1024
    batches = dict(list(SCENARIOS.items())[:2 if args.smoke else 6])
    net_a, steps_a = build(layers, batches["A"], 32)
    capacity = int(resident_bytes(net_a, steps_a) * 1.02)
    rng = np.random.default_rng(0)
    results = []
    print(f"\nconfirmed on the cpu device: ResNet-152 at 1/16 width, 32x32, pool "
          f"{format_bytes(capacity)} (LMS off fits batch {batches['A']})")
    for name, batch in batches.items():
        inputs = {"data": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32),
                  "label": rng.integers(0, 10, batch).astype(np.int32)}
        variations = (("Off", Policy(enabled=False)), ("Default", Policy()),
                      ("Auto", Policy(policy="auto")))
        for label, policy in variations[:2] if args.smoke else variations:
            net, _ = build(layers, batch, 32)
            with CpuDevice(capacity) as device:
                try:
                    executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), policy)
                except PlanError as error:
                    results.append((name, batch, label, None, str(error)))
                    print(f"  {name} batch {batch:>3} {label:<8} out of memory: "
                          f"{str(error)[:110]}...")
                    continue
                started = time.perf_counter()
                losses = [executor.iterate(inputs)["loss"] for _ in range(2)]
                seconds = (time.perf_counter() - started) / 2
                assert np.isfinite(losses).all()
                results.append((name, batch, label, seconds, executor.plan.policy.describe()))
                print(f"  {name} batch {batch:>3} {label:<8} trains: {seconds:6.2f} s/iteration, "
                      f"pool peak {format_bytes(device.pool.peak)}")
    return results


def confirm_split(args) -> list[float]:
    """GoogLeNet at ``--split-size``, batch 2, trained a few iterations twice: in a pool large
    enough not to split, then in one smaller than its largest unsplit working set (where
    ``lms.split: auto`` splits what does not fit). Prints the losses and their agreement."""
    size, iterations = (224, 2) if args.smoke else (args.split_size, 3)
    layers = zoo.googlenet(num_classes=1000)
    net, steps = build(layers, 2, size)
    largest = max(working_set_bytes(net, step) for step in steps)
    floor = split_floor(net, steps)[0]
    rng = np.random.default_rng(0)
    inputs = {"data": rng.standard_normal((2, 3, size, size)).astype(np.float32),
              "label": rng.integers(0, 1000, 2).astype(np.int32)}
    print(f"\nconfirmed with splitting: GoogLeNet {size}x{size}, batch 2, largest unsplit "
          f"working set {format_bytes(largest)}, split floor {format_bytes(floor)}")
    runs = []
    for label, capacity in (("whole", int(largest * 1.5)),
                            ("split", (largest + floor) // 2)):
        with CpuDevice(capacity) as device:
            started = time.perf_counter()
            executor = LmsExecutor(build(layers, 2, size)[0], device, SGD(0.01, momentum=0.9),
                                   Policy(policy="auto"))
            planned_in = time.perf_counter() - started
            counts = split_counts([step_plan.step for step_plan in executor.plan.steps])
            started = time.perf_counter()
            losses = [executor.iterate(inputs)["loss"] for _ in range(iterations)]
            seconds = (time.perf_counter() - started) / iterations
            print(f"  {label:<5} pool {format_bytes(capacity):>11}: {len(counts):>3} steps split, "
                  f"planned in {planned_in:.1f} s, {seconds:.1f} s/iteration, losses "
                  f"{', '.join(f'{loss:.7f}' for loss in losses)}")
            runs.append(losses)
            del executor
        gc.collect()
    first = abs(runs[1][0] - runs[0][0]) / abs(runs[0][0])
    worst = max(abs(b - a) / abs(a) for a, b in zip(*runs))
    print(f"  split against whole: first loss {first:.1e} apart, the worst {worst:.1e} "
          f"(docs/lms.md: 1e-5 after one iteration, 1e-3 after three)")
    return runs


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["off"] / GiB for r in rows], 0.4, label="LMS off needs", color="#c44e52")
    ax.bar(x + 0.2, [r["least"] / GiB for r in rows], 0.4, label="LMS least pool",
           color="#4c72b0")
    ax.axhline(16, color="black", linestyle="--", linewidth=1, label="16 GiB device")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{r['scenario']}\nbatch {r['batch']}" for r in rows])
    ax.set_ylabel("GiB (log scale)")
    ax.set_title("ResNet-152, 224x224: device memory needed per iteration (planned)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\npicture: {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--png", default=str(Path(__file__).resolve().parent.parent / "docs" /
                                        "images" / "capacity.png"))
    p.add_argument("--skip-confirm", action="store_true", help="plan only")
    p.add_argument("--smoke", action="store_true", help="small and quick: for the test suite")
    p.add_argument("--split-size", type=int, default=2240,
                   help="GoogLeNet's image size for the training with steps split (batch 2)")
    args = p.parse_args(argv)
    args.width, args.size, args.depth = (16, 32, 50) if args.smoke else (1, 224, 152)
    rows = planned(args)
    print_planned(rows, f"ResNet-{args.depth} at 1/{args.width} width, {args.size}x{args.size}, "
                        "planned for a 16 GiB device (Caffe LMS scenarios A-F)")
    off_fits = [r["scenario"] for r in rows if r["off"] <= 16 * GiB]
    lms_fits = [r["scenario"] for r in rows if r["least"] <= 16 * GiB]
    print(f"LMS off fits: {', '.join(off_fits) or 'none'}; LMS fits: {', '.join(lms_fits)}")
    googlenet(args)
    if not args.skip_confirm:
        confirm(args)
        confirm_split(args)
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    plot(rows, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
