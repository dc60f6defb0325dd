"""Where LMS on's time goes on the ``cpu`` device: the plan's bytes, the copies' rate where they
run, the bookkeeping of the plan's actions, against LMS off in the same process.

    python scripts/bench_lms_cost.py [--case resnet50:224:8] [--pool-fraction 8] [--pairs 5]

Two parts:

1. **the plan** (``policy: auto`` in 1/``--pool-fraction`` of the pool LMS off needs, as
   ``bench_fullsize.py``'s LMS on row): bytes moved each way, the actions of an iteration by
   kind, the blobs that move most, and whether any blob crosses more than once a way (a plan that
   only swaps moves each swapped blob out once and in once at the least);
2. **the time**: an LMS off and an LMS on executor built side by side, their iterations
   alternating (``--pairs`` of each after one to warm up; medians), LMS on with its copies run
   where they are issued (``cpu_streams.COPY_THREADS`` off), so that each copy is timed on the
   thread that waits for it. LMS on's iteration is split into its steps (``run_step``), its
   copies (seconds and GB/s), the rest of its actions (placing and freeing in the pool, the
   swaps' bookkeeping) and the loop around them; LMS off's into its steps and the rest. What the
   copy streams' threads change on top of that is ``bench_copy.py --iteration CASE --switch
   threads``.

``--smoke``: tiny, for the test suite.
"""
import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def executors(case, fraction):
    """``(off, on, inputs)``: LMS off in the pool it needs, LMS on in 1/``fraction`` of it
    (``bench_fullsize.training``)."""
    from bench_fullsize import training
    built = {lms: training(dict(case, lms=lms), fraction) for lms in (False, True)}
    return built[False][2], built[True][2], built[True][1]


def report_plan(plan) -> None:
    from minilms.sizes import format_bytes
    kinds = collections.Counter(action.kind for _, action in plan.actions())
    crossings = collections.Counter()
    moved = collections.Counter()
    for _, action in plan.actions():
        if action.copies:
            crossings[(action.blob, action.copies)] += 1
            moved[action.blob] += action.nbytes
    print(f"plan: {plan.policy.describe()} in {format_bytes(plan.capacity)}")
    print(f"  moved an iteration: {format_bytes(plan.bytes_moved('h2d'))} in, "
          f"{format_bytes(plan.bytes_moved('d2h'))} out")
    print("  actions an iteration: " + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
          + f" ({sum(kinds.values())} in all, {len(plan.steps)} steps)")
    again = sorted(key for key, n in crossings.items() if n > 1)
    print(f"  blobs that cross more than once a way: {len(again)}"
          + (": " + ", ".join(f"{blob} ({way})" for blob, way in again[:8]) if again else ""))
    top = ", ".join(f"{blob} {format_bytes(n)}" for blob, n in moved.most_common(6))
    print(f"  moved most: {top}")


def timed_iterations(off, on, inputs, pairs):
    """Medians, in seconds, of each part of LMS off's and LMS on's iterations (the docstring)."""
    from minilms.device import cpu_streams, streaming
    parts = {False: collections.defaultdict(list), True: collections.defaultdict(list)}
    now = collections.Counter()
    real_copy = streaming.copy

    def copy(dst, src, parallel=False, cached=False):
        began = time.perf_counter()
        real_copy(dst, src, parallel, cached)
        now["copies"] += time.perf_counter() - began
        now["bytes"] += dst.nbytes

    def timing(executor, name, key_of):
        real = getattr(executor, name)

        def timed(*args):
            began = time.perf_counter()
            real(*args)
            now[key_of(*args)] += time.perf_counter() - began
        setattr(executor, name, timed)          # the instance's own: the class is untouched

    for executor in (off, on):
        timing(executor, "run_step", lambda *args: "steps")
    timing(on, "_apply", lambda action, stream: "actions")
    threads = cpu_streams.COPY_THREADS
    streaming.copy, cpu_streams.COPY_THREADS = copy, False
    try:
        for turn in range(1 + pairs):                           # the first warms up
            for lms in ((False, True) if turn % 2 else (True, False)):
                now.clear()
                executor = on if lms else off
                began = time.perf_counter()
                executor.iterate(inputs)
                executor.device.synchronize()
                wall = time.perf_counter() - began
                if turn:
                    for key in ("steps", "copies", "bytes"):
                        parts[lms][key].append(now[key])
                    parts[lms]["actions"].append(now["actions"] - now["copies"])
                    parts[lms]["wall"].append(wall)
                    parts[lms]["rest"].append(wall - now["steps"] - now["actions"])
    finally:
        streaming.copy, cpu_streams.COPY_THREADS = real_copy, threads
        for executor in (off, on):
            for name in ("run_step", "_apply"):
                executor.__dict__.pop(name, None)
    return {lms: {key: statistics.median(values) for key, values in found.items()}
            for lms, found in parts.items()}


def report_time(medians, pairs) -> None:
    off, on = medians[False], medians[True]
    ms = lambda seconds: f"{seconds * 1e3:8.1f} ms"   # noqa: E731
    print(f"time: medians of {pairs} iterations each, LMS off and on alternating in one process, "
          "LMS on's copies run where issued")
    print(f"  LMS off  iteration {ms(off['wall'])}   steps {ms(off['steps'])}   "
          f"rest {ms(off['wall'] - off['steps'])}")
    rate = on["bytes"] / on["copies"] / 1e9 if on["copies"] else float("nan")
    print(f"  LMS on   iteration {ms(on['wall'])}   steps {ms(on['steps'])}   "
          f"copies {ms(on['copies'])} ({rate:.1f} GB/s)   actions besides their copies "
          f"{ms(on['actions'])}   loop {ms(on['rest'])}")
    extra = on["wall"] - off["wall"]
    print(f"  LMS on over LMS off: {on['wall'] / off['wall']:.3f}x, {ms(extra).strip()}: steps "
          f"{ms(on['steps'] - off['steps']).strip()}, copies {ms(on['copies']).strip()}, "
          f"actions and loop {ms(on['actions'] + on['rest'] - off['wall'] + off['steps']).strip()}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="resnet50:224:8", metavar="MODEL:SIZE:BATCH")
    parser.add_argument("--pool-fraction", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    args = parser.parse_args(argv)
    if args.pool_fraction < 1 or args.pairs < 1:
        print("bench_lms_cost: --pool-fraction and --pairs: expected at least 1, found "
              f"{args.pool_fraction} and {args.pairs}", file=sys.stderr)
        return 2
    import minilms  # noqa: F401, I001  (first: its thread settings before numpy loads OpenBLAS)
    from bench_fullsize import parse_case
    case = parse_case("resnet18:32:2" if args.smoke else args.case, "bench_lms_cost: --case")
    if args.smoke:
        case["width"], case["classes"], args.pairs = 4, 10, 1      # a quarter of the channels
    off, on, inputs = executors(case, args.pool_fraction)
    print(f"{args.case if not args.smoke else 'resnet18/4:32:2'}, cpu device")
    medians = timed_iterations(off, on, inputs, args.pairs)
    report_plan(on.plan)       # the plan of the inputs' shapes, made by the first iteration
    report_time(medians, args.pairs)
    for executor in (off, on):
        executor.device.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
