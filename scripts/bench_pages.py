"""First touch of fresh memory: numpy's huge pages, 4 KiB pages, and either mapped ahead.

    python scripts/bench_pages.py [--gib 1] [--rounds 3] [--smoke]

Each measurement is a process of its own (a fresh address space; the memory it frees goes back
to the OS before the next). It makes ``--gib`` GiB of zeros one way, writes every byte once
(timed: the page faults and the write) and once more (the write alone, the baseline), and
prints seconds per GiB with each way's ratio against numpy's own ``np.zeros``:

- ``numpy``: ``np.zeros``, which asks for transparent huge pages for arrays of 4 MiB and more;
- ``small pages``: the same kept on 4 KiB pages (``MADV_NOHUGEPAGE``, ``pages.small_pages``);
- ``small, populated``: that, mapped with ``MADV_POPULATE_WRITE`` first (``pages.populate``,
  timed with the write);
- ``huge, populated``: numpy's huge pages mapped the same way first.

Rounds run the ways in turn, and the median of each is reported: on a VM whose host takes back
free memory (``pages.host_reclaims_huge_pages``) huge pages cost several times more to touch
first, which is why the ``cpu`` device keeps its arena on small pages there. ``--smoke``: 16 MiB,
one round.
"""
import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WAYS = ("numpy", "small pages", "small, populated", "huge, populated")


def child(way: str, nbytes: int) -> None:
    """In a process of its own: ``first second`` (seconds) on stdout."""
    import numpy as np

    from minilms.device import pages
    buffer = np.zeros(nbytes, np.uint8)
    if way.startswith("small"):
        pages._reclaims[:] = [True]      # whatever this machine's balloon says
        if not pages.small_pages(buffer):
            raise SystemExit("MADV_NOHUGEPAGE refused")
    began = time.perf_counter()
    if way.endswith("populated") and not pages.populate(buffer, 0, nbytes):
        raise SystemExit("MADV_POPULATE_WRITE refused (Linux 5.14 and on)")
    buffer[:] = 1
    first = time.perf_counter() - began
    began = time.perf_counter()
    buffer[:] = 2
    print(f"{first:.6f} {time.perf_counter() - began:.6f}")


def measure(way: str, nbytes: int) -> tuple[float, float] | None:
    done = subprocess.run([sys.executable, __file__, "--child", way, str(nbytes)],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        print(f"  {way}: {(done.stderr or done.stdout).strip().splitlines()[-1]}",
              file=sys.stderr)
        return None
    first, again = (float(x) for x in done.stdout.split())
    return first, again


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="16 MiB, one round")
    args = p.parse_args(argv)
    if args.gib <= 0 or args.rounds < 1:
        print("bench_pages: --gib must be > 0 and --rounds >= 1", file=sys.stderr)
        return 2
    nbytes = 16 << 20 if args.smoke else int(args.gib * 2**30)
    rounds = 1 if args.smoke else args.rounds
    sys.path.insert(0, str(ROOT))
    from minilms.device.pages import host_reclaims_huge_pages
    print(f"bench_pages: {nbytes / 2**30:.3g} GiB written for the first time, a process each, "
          f"median of {rounds} round(s); this machine's host reclaims huge pages: "
          f"{'yes' if host_reclaims_huge_pages() else 'no'}")
    times = {way: [] for way in WAYS}
    for turn in range(rounds):
        for way in (WAYS if turn % 2 == 0 else WAYS[::-1]):
            got = measure(way, nbytes)
            if got is not None:
                times[way].append(got)
    gib = nbytes / 2**30
    base = statistics.median(t[0] for t in times["numpy"]) if times["numpy"] else None
    print(f"{'way':<18} {'first s/GiB':>12} {'again s/GiB':>12} {'vs numpy':>9}")
    for way in WAYS:
        if not times[way]:
            print(f"{way:<18} {'-':>12} {'-':>12} {'-':>9}")
            continue
        first = statistics.median(t[0] for t in times[way])
        again = statistics.median(t[1] for t in times[way])
        ratio = "-" if not base else f"{first / base:.2f}x"
        print(f"{way:<18} {first / gib:>12.3f} {again / gib:>12.3f} {ratio:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
