"""Host memory: a run's peak resident memory against the plan's figure (``minilms.lms.host``).

    python scripts/bench_host_memory.py [--depth 50] [--image-size 224] [--batch 8]
                                        [--pool 256MiB] [--iters 3] [--in-process] [--smoke]

Trains ResNet-``depth`` (``zoo.resnet``, 1000 classes) on one random batch on the ``cpu`` device,
twice: LMS ``policy: auto`` in a ``--pool`` pool, and LMS off in the pool it needs (every blob
resident). Each run is a process of its own (``--child``), so that none inherits another's freed
memory or compiled kernels. In it, the **baseline** is the resident memory right after the
imports (Python, numpy, minilms; numba comes with the first kernel), before the batch, the net,
the device or the executor exist; the **peak** is the process's high-water mark (``VmHWM``, reset
to the baseline through ``/proc/self/clear_refs``; without that, the peak since the process began)
after ``--iters`` iterations; the **growth** is peak minus baseline. The plan's **figure** is
``LmsExecutor.host_memory(batches=1)``: the homes of the blobs the plan needs on the host, the
pool (on ``cpu`` it is host RAM), the one batch the script holds, and the **kernels**, the run's
one-time cost in the process (Numba's JIT started, the kernels loaded; ``minilms.lms.host``). The
ratio growth / figure is the goal's: within 10% (0.90x to 1.10x).

What the figure leaves out shows in the stages printed beside each run: the resident memory
once the executor is built (the pool, the parameters and optimizer state initialised in their
homes), after the first iteration (the other homes written, and the process's one-time costs:
Numba loading or compiling the kernels, the direct convolutions' LLVM code, the BLAS library's
buffers), and the peak. ``homes`` counts the blobs with a host copy after the build and after the
iterations: equal, since the executor allocates them all before the first.

**kept** is the resident memory over the baseline once the run's objects are freed: the process's
one-time cost, which the figure's kernels term predicts (second ratio: kept / kernels).

``--in-process`` measures in this process instead (after a garbage collection and
``malloc_trim``, so freed memory is given back first, and after an unmeasured warm-up run of
each mode, so the kernels are loaded before the peak is taken, and the growth is set against the
figure less its kernels): what the test suite does with ``--smoke`` (ResNet-18 at a quarter
width, 32x32, batch 4, 6 MiB). Numbers are printed, never asserted, beyond being sane.
"""
import argparse
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from minilms import zoo  # noqa: E402
from minilms.device import make_device  # noqa: E402
from minilms.lms import LmsExecutor, Policy, least_pool  # noqa: E402
from minilms.net import Net  # noqa: E402
from minilms.sizes import format_bytes, parse_size  # noqa: E402
from minilms.solver import SGD  # noqa: E402

GOAL = 0.10
MODES = {"auto": "LMS auto", "off": "LMS off"}


# -- resident memory ---------------------------------------------------------------------------
def _status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def resident() -> int:
    """Bytes resident now (``VmRSS``; the peak where /proc is not there)."""
    now = _status("VmRSS")
    return now if now is not None else peak()


def peak() -> int:
    """The process's high-water mark of resident bytes (``VmHWM``, else ``ru_maxrss``)."""
    high = _status("VmHWM")
    if high is not None:
        return high
    scale = 1 if sys.platform == "darwin" else 1024      # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def reset_peak() -> bool:
    """Reset the high-water mark to what is resident now (Linux: ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def give_back_freed() -> None:
    """Collect garbage and return free heap pages to the system (glibc's ``malloc_trim``), so a
    measurement in a process that ran other things starts from what it really holds."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# -- one run -----------------------------------------------------------------------------------
def measure(args, mode: str) -> dict:
    """Train ``args.iters`` iterations and report resident memory against the plan's figure:
    from the baseline, at stages, at the peak, and once everything the run made is freed again
    (what stays is the process's one-time cost: the kernels loaded or compiled, their caches)."""
    give_back_freed()
    reset = reset_peak()
    baseline = resident()
    found = _run(args, mode, baseline)
    give_back_freed()
    found.update(reset=reset, baseline=baseline, after=resident() - baseline)
    return found


def _run(args, mode: str, baseline: int) -> dict:
    rng = np.random.default_rng(0)
    shape = (args.batch, 3, args.image_size, args.image_size)
    batch = {"data": rng.standard_normal(shape, dtype=np.float32),
             "label": rng.integers(0, args.classes, args.batch).astype(np.int32)}
    net = Net(zoo.resnet(args.depth, num_classes=args.classes, width=args.width),
              {name: (value.shape, value.dtype) for name, value in batch.items()},
              device_kind="cpu")                       # sized for the cpu, as a config's net
    if mode == "auto":
        capacity, policy = args.pool, Policy(policy="auto")
    else:
        policy = Policy(enabled=False)
        capacity = least_pool(net, net.schedule(("momentum",)), policy)
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), policy)
        figure = executor.host_memory(batches=1)
        built, homes_built = resident(), _homes(executor)
        # what the build has written: the pool, parameters and optimizer state in their homes
        state = sum(blob.nbytes for blob in executor.shared.values() if blob.has_home)
        stages = []
        for _ in range(args.iters):
            executor.iterate(batch)
            stages.append(resident())
        homes_after = _homes(executor)
        high = peak()
        described = executor.plan.policy.describe()
    return {"mode": mode, "policy": described, "pool": capacity,
            "built": built - baseline, "built_figure": capacity + state,
            "first": stages[0] - baseline, "peak": high - baseline,
            "figure": figure.total, "kernels": figure.kernels, "figure_text": figure.describe(),
            "homes_built": homes_built, "homes_after": homes_after,
            "blobs": len(executor.blobs)}


def _homes(executor) -> int:
    return sum(blob.has_home for blob in executor.blobs.values())


def run_child(args, mode: str) -> dict:
    """``measure`` in a fresh process of its own."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode,
               "--depth", str(args.depth), "--width", str(args.width),
               "--image-size", str(args.image_size), "--batch", str(args.batch),
               "--pool", str(args.pool), "--iters", str(args.iters),
               "--classes", str(args.classes)]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
    if done.returncode != 0:
        raise SystemExit(f"the {MODES[mode]} run failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f}"


def report(args, results: list[dict], where: str, warmed: bool) -> None:
    """The table, each run's figure and what lies beyond it, and the goals. ``warmed``: the
    process paid its one-time cost before the baseline, so the growth is set against the figure
    less its kernels term."""
    first = results[0]
    print(f"host memory: ResNet-{args.depth}"
          f"{f' at 1/{args.width} width' if args.width != 1 else ''}, "
          f"{args.image_size}x{args.image_size}, batch {args.batch}, SGD with momentum, cpu "
          f"device, {args.iters} iterations; {where}")
    print(f"process baseline (resident after the imports: Python, numpy, minilms): "
          f"{mib(first['baseline'])} MiB\n")
    print(f"{'run':<9} {'pool':>8} {'figure':>8} {'kernels':>8} {'built':>8} {'1st iter':>8} "
          f"{'peak':>8} {'ratio':>7} {'kept':>7} {'ratio':>7}  homes")
    for r in results:
        print(f"{MODES[r['mode']]:<9} {mib(r['pool']):>8} {mib(r['figure']):>8} "
              f"{mib(r['kernels']):>8} {mib(r['built']):>8} {mib(r['first']):>8} "
              f"{mib(r['peak']):>8} {r['peak'] / counted(r, warmed):>6.3f}x {mib(r['after']):>7} "
              f"{'-' if warmed else format(r['after'] / r['kernels'], '.3f') + 'x':>7}  "
              f"{r['homes_built']}/{r['homes_after']}/"
              f"{r['blobs']}")
    print("(MiB; figure: the plan's, kernels: its term for the run's one-time cost; built, 1st "
          "iter, peak: resident\n over the baseline; ratio: peak / figure"
          + (" less kernels (paid by the warm-up)" if warmed else "") + "; kept: resident over "
          "the baseline once the run's\n objects are freed, the process's one-time cost (kernels "
          "loaded or compiled, their caches); second ratio:\n kept / kernels (none after a "
          "warm-up); homes: blobs with a host copy once built / after the iterations / all blobs)")
    for r in results:
        built = r["built"] - r["built_figure"]
        print(f"\n{MODES[r['mode']]}: {r['policy']}\n  figure: {r['figure_text']}\n"
              f"  beyond the figure: {mib(r['peak'] - counted(r, warmed))} MiB at the peak; "
              f"{mib(built)} MiB once built (beyond the pool and the parameters and state "
              f"written, {mib(r['built_figure'])} MiB), "
              f"{mib(r['first'] - counted(r, warmed))} MiB after the first iteration")
        if not r["reset"]:
            print("  (the high-water mark could not be reset: the peak is the process's)")
    auto = next(r for r in results if r["mode"] == "auto")
    ratio = auto["peak"] / counted(auto, warmed)
    met = "met" if abs(ratio - 1) <= GOAL else "not met"
    print(f"goal: peak growth within {GOAL:.0%} of the plan's figure, LMS auto in "
          f"{format_bytes(auto['pool'])}: {ratio:.3f}x ({met})")
    if warmed:
        return
    print(f"the process's one-time cost against the figure's kernels term, LMS auto: "
          f"{mib(auto['after'])} of {mib(auto['kernels'])} MiB "
          f"({auto['after'] / auto['kernels']:.3f}x)")


def counted(run: dict, warmed: bool) -> int:
    """The part of the figure a run's growth is set against."""
    return run["figure"] - (run["kernels"] if warmed else 0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--depth", type=int, default=50)
    p.add_argument("--width", type=int, default=1, help="channels divided by this")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--pool", default="256MiB", help="the LMS run's pool")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--in-process", action="store_true", help="measure in this process")
    p.add_argument("--smoke", action="store_true", help="tiny, in this process: for the tests")
    p.add_argument("--child", choices=sorted(MODES), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.depth, args.width, args.image_size, args.batch = 18, 4, 32, 4
        args.classes, args.pool, args.iters, args.in_process = 10, "6MiB", 2, True
    args.pool = parse_size(args.pool, "--pool")
    if args.child:
        print(json.dumps(measure(args, args.child)))
        return 0
    if args.in_process:
        for mode in MODES:      # warm-up: the process's one-time costs paid before measuring
            _run(args, mode, resident())
        results = [measure(args, mode) for mode in MODES]
        where = "measured one after the other in this process, after a warm-up run of each"
    else:
        results = [run_child(args, mode) for mode in MODES]
        where = "each run in a process of its own"
    report(args, results, where, warmed=args.in_process)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
