"""What a copy costs beside a GEMM in one parallel region, against the same copy where it is issued.

    python scripts/bench_copy_overlap.py [--copy 5MiB] [--gemm 256 1024 1568] [--repeat 40]
                                         [--ring 120] [--smoke]

On the ``cpu`` device of a machine whose cores all compute, LMS's copies run where they are
issued (``device/cpu_streams.py``): the main thread copies, memory-bound, while the other cores'
OpenMP workers spin. This measures the alternative a future executor could take: the copy given
to one of Numba's threads inside the next GEMM's ``prange``, that thread's share of the GEMM's
rows after it. Three ways, interleaved, medians of ``--repeat``:

- ``gemm``: ``[M, K] @ [K, N]`` cut in two row blocks, one a thread (as ``kernels.blas_calls``
  deals a product out), BLAS on one thread each;
- ``gemm, then copy``: the same, then one copy of ``--copy`` bytes (``streaming.copy``, as a
  swap's), from a ring of ``--ring`` cold sources on small pages (as the arena and the homes are
  where ``pages.small_pages`` applies);
- ``copy riding``: one region: thread 1 copies first, then the second row block; thread 0's
  block is ``--rows`` rows (by default the splits from even to 5/8 in steps of 1/64 are
  tried: the thread that copies should take as much less of the GEMM as the copy costs).

It prints each way's time and the share of the copy's own cost that riding saves (1: hidden
entirely, 0: no better than inline). A measurement of an idea (docs/benchmarks.md, session 58),
not of a path the package takes.
"""
import argparse
import statistics
import sys
import time

import numpy as np
from numba import njit, prange

import minilms  # noqa: F401  (first: thread settings before numpy loads its BLAS)
from minilms.device import pages, streaming
from minilms.errors import MinilmsError
from minilms.kernels import blas_threads, cblas
from minilms.sizes import format_bytes, parse_size


@njit(parallel=True, nogil=True)
def _region(gemm, a, b, c, rows0, dst, src, copy):
    """Rows ``[0, rows0)`` of ``c = a @ b`` on one thread, the rest on another, which first
    copies ``src`` to ``dst`` where ``copy``."""
    for thread in prange(2):
        if thread == 1 and copy:
            streaming._stream_bytes(dst, src, streaming.PREFETCH_NEAR)
        lo = 0 if thread == 0 else rows0
        hi = rows0 if thread == 0 else a.shape[0]
        if hi > lo:
            gemm(cblas.ROW_MAJOR, cblas.NO_TRANS, cblas.NO_TRANS, hi - lo, b.shape[1],
                 a.shape[1], np.float32(1.0), a[lo:].ctypes.data, a.shape[1], b.ctypes.data,
                 b.shape[1], np.float32(0.0), c[lo:].ctypes.data, c.shape[1])


def cold_ring(nbytes: int, count: int) -> list:
    """``count`` buffers of ``nbytes`` on small pages where the device would use them, written
    once: their next copy reads them from memory."""
    whole = np.empty(nbytes * count, np.uint8)
    pages.small_pages(whole)
    whole[...] = 1
    return [whole[i * nbytes:(i + 1) * nbytes] for i in range(count)]


def measure(copy_bytes: int, shape, repeat: int, ring: int, rows=None) -> dict:
    """Median seconds of each way (the module docstring), by name."""
    gemm, _ = cblas.chosen_sgemm()
    m, k, n = shape
    rng = np.random.default_rng(0)
    a, b = rng.random((m, k), np.float32), rng.random((k, n), np.float32)
    c = np.empty((m, n), np.float32)
    sources, targets = cold_ring(copy_bytes, ring), cold_ring(copy_bytes, ring)
    turn = [0]

    def pair():
        turn[0] = (turn[0] + 1) % ring
        return targets[turn[0]], sources[turn[0]]

    half = m // 2
    splits = rows or sorted(set(range(half, half + m // 8 + 1, max(1, m // 64))))
    ways = {"gemm": lambda: _region(gemm, a, b, c, half, *pair(), False),
            "gemm, then copy": lambda: (_region(gemm, a, b, c, half, *pair(), False),
                                        streaming.copy(*pair()))}
    for split in splits:
        ways[f"copy riding, {split} rows on thread 0"] = \
            lambda split=split: _region(gemm, a, b, c, split, *pair(), True)
    seconds = {name: [] for name in ways}
    with blas_threads.one_blas_thread():
        for way in ways.values():       # compiles, and warms the BLAS up
            way()
        for _ in range(repeat):
            for name, way in ways.items():
                began = time.perf_counter()
                way()
                seconds[name].append(time.perf_counter() - began)
    return {name: statistics.median(found) for name, found in seconds.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copy", default="5MiB", help="bytes a copy moves")
    parser.add_argument("--gemm", nargs=3, type=int, default=[256, 1024, 1568],
                        metavar=("M", "K", "N"))
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--ring", type=int, default=120, help="cold sources copied in turn")
    parser.add_argument("--rows", type=int, nargs="+", help="thread 0's rows when riding")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few repeats")
    args = parser.parse_args(argv)
    try:
        copy_bytes = parse_size(args.copy, "--copy")
    except MinilmsError as error:
        print(f"bench_copy_overlap: {error}", file=sys.stderr)
        return 2
    if args.smoke:
        copy_bytes, args.gemm, args.repeat, args.ring = 1 << 20, [64, 64, 64], 3, 4
    m = args.gemm[0]
    for wrong, flag, expected, found in (
            (copy_bytes < streaming.LINE, "--copy", f"at least {streaming.LINE} bytes",
             f"{copy_bytes} bytes"),
            (min(args.gemm) < 2, "--gemm", "M, K and N of at least 2", args.gemm),
            (any(not 0 <= r <= m for r in args.rows or ()), "--rows",
             f"rows from 0 to M ({m})", args.rows),
            (args.repeat < 1, "--repeat", "at least 1", args.repeat),
            (args.ring < 1, "--ring", "at least 1", args.ring)):
        if wrong:
            print(f"bench_copy_overlap: {flag}: expected {expected}, found {found}",
                  file=sys.stderr)
            return 2
    found = measure(copy_bytes, args.gemm, args.repeat, args.ring, args.rows)
    k, n = args.gemm[1:]
    print(f"bench_copy_overlap: [{m}, {k}] @ [{k}, {n}] on two threads, a copy of "
          f"{format_bytes(copy_bytes)} from cold memory; medians of {args.repeat}")
    alone, inline = found["gemm"], found["gemm, then copy"]
    copy_cost = inline - alone
    for name, seconds in found.items():
        print(f"  {name:36} {seconds * 1e3:8.3f} ms")
    best = min(seconds for name, seconds in found.items() if name.startswith("copy riding"))
    saved = (inline - best) / copy_cost if copy_cost > 0 else float("nan")
    print(f"the copy inline costs {copy_cost * 1e3:.3f} ms; riding, at its best split, saves "
          f"{saved:.2f} of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
