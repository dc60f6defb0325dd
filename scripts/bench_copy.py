"""H2D and D2H copy throughput of the ``cpu`` device against plain ``numpy.copyto`` of the same
bytes.

    python scripts/bench_copy.py [--sizes 1MiB 16MiB 64MiB 256MiB] [--repeat 7]
    python scripts/bench_copy.py --iteration resnet50:224:8 [--pairs 16] [--pool-fraction 8]
                                 [--switch help|streaming|threads|prefetch|parallel|cached]

Each copy is timed as the best of ``--repeat`` runs, interleaved with the baseline: ``numpy.copyto``
between exactly the same two buffers (the host copy and the arena view), in the same process.
Ratio = copyto time / device time; the goal is at least 0.8. Async copies go through the copy
stream and are timed to the event recorded after them; what they add over a synchronous copy is
the hand-off to the copy thread, printed in microseconds. "waited" is an async copy that the
compute stream waits for (``event.wait(compute_stream)``, as a step waits for its loads): on the
``cpu`` device the waiting thread copies pieces of it beside the copy thread
(``device/cpu_streams.py``), against the same wait with that help off ("help x").
``--iteration`` measures what the help gives a training iteration instead: one LMS-on executor
(``policy: auto`` in 1/``--pool-fraction`` of LMS off's pool), iterations alternating help on
and off, ``--pairs`` of each (in one process: this drift-prone VM's only fair comparison), with
the stall each time; ``--switch streaming`` alternates the copies' streaming stores
(``device/streaming.py``) with ``memcpy`` instead, ``--switch threads`` the copy streams' threads
with copies run where they are issued (``cpu_streams.COPY_THREADS``), ``--switch prefetch`` the
streaming copies' prefetch of the source into the outer caches with a non-temporal one
(``streaming.PREFETCH_NEAR``), ``--switch parallel`` a copy run where it is issued shared out to
Numba's threads with one thread a copy (``streaming.PARALLEL``), ``--switch cached`` swap-ins
in plain stores, which leave them in cache, with swap-ins streamed (``cpu.CACHED_SWAP_INS``). The
device's copies stream at ``streaming.STREAM_MIN`` bytes and more; the baseline's
``numpy.copyto`` does not. On a machine
with a GPU, ``--device cuda`` measures pinned transfers instead (no baseline ratio: the link is the
limit there).
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from minilms.device import cpu, cpu_streams, make_device, streaming
from minilms.errors import MinilmsError
from minilms.sizes import format_bytes, parse_size

GOAL = 0.8


def timed(run) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def measure(device, nbytes: int, repeat: int) -> dict:
    """Best-of-``repeat`` seconds for each way of copying, interleaved so drift hits all alike."""
    slot = device.pool.allocate(nbytes, "bench")
    arena = device.view(slot, (nbytes,), np.uint8)
    host = device.alloc_host((nbytes,), np.uint8)
    host[...] = 1

    def async_h2d():
        done = device.event()
        device.h2d(arena, host, stream=device.h2d_stream)
        done.record(device.h2d_stream)
        done.synchronize()

    def waited(helping):
        def run():
            cpu_streams.HELP_WHILE_WAITING = helping
            done = device.event()
            device.h2d(arena, host, stream=device.h2d_stream)
            done.record(device.h2d_stream)
            done.wait(device.compute_stream)
            cpu_streams.HELP_WHILE_WAITING = True
        return run

    runs = {"h2d": lambda: device.h2d(arena, host), "d2h": lambda: device.d2h(host, arena),
            "h2d async": async_h2d}
    if device.kind == "cpu":  # the same bytes between the same two buffers, with numpy alone
        runs["copyto h2d"] = lambda: np.copyto(arena, host)
        runs["copyto d2h"] = lambda: np.copyto(host, arena)
        runs["waited"], runs["waited alone"] = waited(True), waited(False)
    best = {name: float("inf") for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            best[name] = min(best[name], timed(run))
    device.pool.free(slot)
    return best


SWITCHES = {  # --switch: (what is on, what is off, the module and its flag)
    "help": ("a waiting thread helps", "a wait only waits", cpu_streams, "HELP_WHILE_WAITING"),
    "streaming": ("streaming stores", "memcpy", streaming, "ENABLED"),
    "parallel": ("copies on every thread", "copies on one thread", streaming, "PARALLEL"),
    "prefetch": ("the source prefetched near", "prefetched non-temporally", streaming,
                 "PREFETCH_NEAR"),
    "cached": ("swap-ins in plain stores", "swap-ins streamed", cpu, "CACHED_SWAP_INS"),
    "threads": ("copies on the copy threads", "copies where issued", cpu_streams,
                "COPY_THREADS"),
}


def iteration(case: str, pairs: int, fraction: int, switch: str = "help") -> int:
    """LMS on, iterations alternating ``switch`` on and off (the docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_fullsize import parse_case, training
    _, inputs, executor, pool, _ = training(parse_case(case, "bench_copy: --iteration"), fraction)
    named_on, named_off, module, flag = SWITCHES[switch]
    before = getattr(module, flag)
    seconds, stalls = {True: [], False: []}, {True: [], False: []}
    try:
        for turn in tqdm(range(1 + pairs), desc="pairs", leave=False):   # the first warms up
            for on in ((True, False) if turn % 2 else (False, True)):
                executor.device.synchronize()
                setattr(module, flag, on)
                took = timed(lambda: (executor.iterate(inputs), executor.device.synchronize()))
                if turn:
                    seconds[on].append(took)
                    stalls[on].append(executor.stall_seconds)
    finally:
        setattr(module, flag, before)
        executor.device.close()
    print(f"{case}, LMS on in {format_bytes(pool)}, {pairs} pairs alternating in one process:")
    for on, name in ((False, named_off), (True, named_on)):
        print(f"  {name:24} median {np.median(seconds[on]):.4f} s/iter, "
              f"stall {np.median(stalls[on]) * 1e3:.1f} ms")
    ratio = np.median(np.array(seconds[False]) / np.array(seconds[True]))
    print(f"  {named_on}: {ratio:.3f}x (median of the pairs' ratios)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1MiB", "16MiB", "64MiB", "256MiB"])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--iteration", metavar="MODEL:SIZE:BATCH",
                        help="A/B the waiting thread's help on a training iteration instead")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--pool-fraction", type=int, default=8)
    parser.add_argument("--switch", choices=sorted(SWITCHES), default="help",
                        help="what --iteration turns on and off")
    args = parser.parse_args(argv)
    if args.iteration:
        return iteration(args.iteration, args.pairs, args.pool_fraction, args.switch)
    try:
        sizes = [parse_size(s, "--sizes") for s in args.sizes]
        device = make_device(args.device, max(sizes) + 4096)
    except MinilmsError as error:
        print(f"bench_copy: {error}", file=sys.stderr)
        return 2

    print(f"device: {device.name}; best of {args.repeat}; GB/s = 1e9 bytes/s")
    cpu = device.kind == "cpu"
    header = f"{'size':>10} {'h2d GB/s':>9} {'d2h GB/s':>9} {'async GB/s':>11}"
    if cpu:
        header += (f" {'copyto GB/s':>12} {'h2d ratio':>10} {'d2h ratio':>10} {'async +us':>10}"
                   f" {'waited GB/s':>12} {'help x':>7}")
    rows, worst = [], float("inf")
    for nbytes in tqdm(sizes, desc="sizes", leave=False):
        t = measure(device, nbytes, args.repeat)
        gbps = {k: nbytes / v / 1e9 for k, v in t.items()}
        row = (f"{format_bytes(nbytes):>10} {gbps['h2d']:9.2f} {gbps['d2h']:9.2f} "
               f"{gbps['h2d async']:11.2f}")
        if cpu:
            ratios = (t["copyto h2d"] / t["h2d"], t["copyto d2h"] / t["d2h"])
            worst = min(worst, *ratios)
            handoff_us = (t["h2d async"] - t["h2d"]) * 1e6
            row += (f" {gbps['copyto h2d']:12.2f} {ratios[0]:10.2f} {ratios[1]:10.2f} "
                    f"{handoff_us:10.1f} {gbps['waited']:12.2f} "
                    f"{t['waited alone'] / t['waited']:7.2f}")
        rows.append(row)
    device.close()
    print(header, *rows, sep="\n")
    if cpu:
        verdict = "meets" if worst >= GOAL else "misses"
        print(f"worst throughput ratio against numpy.copyto: {worst:.2f} ({verdict} the goal of "
              f"{GOAL}); 'async +us' is the copy thread's hand-off, paid once per async copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
