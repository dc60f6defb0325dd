"""Time to the first training step, with an empty Numba cache (cold) and a filled one (warm).

    python scripts/bench_startup.py [--config configs/quickstart.yaml] [--repeat 2]
                                    [--overrides trace=false data.val_size=0] [--smoke]
                                    [--warm-only]

Each measurement is a whole process, ``python -m minilms.train CONFIG train.max_iters=N
OVERRIDES --quiet run_dir=<temporary>``, timed from launch to exit: nothing in the library is
instrumented. ``t(1)`` (max_iters=1) is the time to the first step: interpreter, imports, data,
net, plan, compiling or loading the kernels, one iteration, the checkpoint, exit. ``t(2) - t(1)``
is one more step, so what start-up costs beyond a step is plain to see. A step of a small net
takes tens of milliseconds, less than two processes' times differ by: ``--more N`` times
``t(1 + N)`` instead and reports ``(t(1 + N) - t(1)) / N``.

Cold: ``NUMBA_CACHE_DIR`` is a fresh empty directory, so every kernel compiles. Warm: the same
directory again, after the cold run filled it. Kernels declared ``njit(cache=False)`` compile in
every process, warm or not (the script lists them, read from the sources). ``data.val_size=0`` by
default: the validation pass at the end of a run comes after the first step, and would otherwise
be counted in it. ``import only`` times ``python -c "import minilms.commands.train,
minilms.training.trainer"`` with the warm cache: what a process pays before it reads the config.
``planning`` times ``python -m minilms.plan CONFIG OVERRIDES --summary`` with the warm cache:
what start-up spends planning LMS for the config (not in ``--smoke``).

**To the first step**: the warm ``t(1)`` process also says when its first iteration begins, from
its interpreter's first line (``MARK_FIRST_STEP`` wraps ``LmsExecutor.submit`` in the child
process; the library itself stays uninstrumented). That is the wait before training starts, the
goal's figure: a full-size net's first iteration is slower than the rest (its memory is touched
for the first time), and ``t(1)`` counts all of it.

With ``--repeat R`` the whole sequence (cold t(1), warm t(1), warm t(1+N), import) runs R times,
each with its own fresh cache directory; the best of each column is reported (the machine may be
shared; the best is the least disturbed). Goal: to the first step under 5 s warm. ``--smoke``: a
tiny config (the quickstart with 64 training images, batch 8, no validation) written to a
temporary directory, one cold and one warm t(1). ``--warm-only``: no cold run, and the warm runs
use the Numba cache the user has (``NUMBA_CACHE_DIR``, or the package's own ``__pycache__``)
instead of a fresh one: start-up as a second run of the day sees it, without the minute or more
that compiling every kernel takes on a 2-core machine.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
GOAL_WARM = 5.0
DEFAULT_OVERRIDES = ["trace=false", "data.val_size=0"]


def jit_caching(root: Path = ROOT) -> dict:
    """``{"cached": [...], "uncached": [...], "inline": [...]}``: the ``njit`` functions of the
    package, by whether Numba keeps them on disk (``cache=True``) or compiles them in every
    process (``cache=False``, or no ``cache=``). Inline-always helpers are compiled into their
    callers, so their own flag does not matter. Read from the sources, nothing imported."""
    found = {"cached": [], "uncached": [], "inline": []}
    call = re.compile(r"\bnjit\(([^()]*)\)")
    for path in sorted((root / "minilms").rglob("*.py")):
        lines = path.read_text().splitlines()
        where = path.relative_to(root).as_posix()
        for i, line in enumerate(lines):
            if line.lstrip().startswith("#") or '``' in line:
                continue
            match = call.search(line)
            if not match:
                continue
            options = match.group(1)
            if line.lstrip().startswith("@"):
                name = next((re.match(r"\s*def (\w+)", following).group(1)
                             for following in lines[i + 1:]
                             if re.match(r"\s*def \w+", following)), "?")
            else:
                assigned = re.match(r"\s*(?:self\.)?(\w+)\s*=\s*([\[{]?)", line)
                name = assigned.group(1) if assigned else "?"
                if assigned and assigned.group(2):    # a comprehension: several variants
                    name += " (one per variant)"
            kind = ("inline" if 'inline="always"' in options else
                    "cached" if "cache=True" in options else "uncached")
            found[kind].append(f"{where}: {name}")
    return found


def timed(command, env, cwd=ROOT, output: list | None = None) -> float:
    began = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{tail}")
    if output is not None:
        output.append(done.stderr)
    return seconds


# Runs ``python -m minilms.train ARGS`` and says on stderr when the first iteration begins,
# measured from the interpreter's first line: the library stays uninstrumented, the child process
# wraps ``LmsExecutor.submit`` before the command starts.
MARK_FIRST_STEP = """
import time; began = time.perf_counter()
import runpy, sys
from minilms.lms import replay
submit = replay.LmsExecutor.submit
def first(self, *args, **kwargs):
    replay.LmsExecutor.submit = submit
    print(f"FIRST-STEP {time.perf_counter() - began:.6f}", file=sys.stderr, flush=True)
    return submit(self, *args, **kwargs)
replay.LmsExecutor.submit = first
sys.argv = ["minilms.train"] + sys.argv[1:]
runpy.run_module("minilms.train", run_name="__main__")
"""


def cache_env(cache_dir) -> dict:
    """The environment with Numba's cache in ``cache_dir``; None: the cache the user has (their
    ``NUMBA_CACHE_DIR``, or the package's own ``__pycache__``)."""
    return dict(os.environ) if cache_dir is None else dict(os.environ,
                                                         NUMBA_CACHE_DIR=str(cache_dir))


def train_time(config, overrides, iters, cache_dir, scratch, to_step: list | None = None
               ) -> float:
    """Seconds the whole ``python -m minilms.train`` process took; with ``to_step`` (a list), the
    process runs under ``MARK_FIRST_STEP`` and the seconds to its first step are appended."""
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=scratch)) / "run"
    args = [str(config), f"train.max_iters={iters}", *overrides, "--quiet", f"run_dir={run_dir}"]
    command = ([sys.executable, "-c", MARK_FIRST_STEP] if to_step is not None else
               [sys.executable, "-m", "minilms.train"]) + args
    output: list = []
    seconds = timed(command, cache_env(cache_dir), output=output)
    if to_step is not None:
        marks = re.findall(r"^FIRST-STEP ([\d.]+)$", output[0], re.M)
        if not marks:
            raise RuntimeError(f"{' '.join(args)}: no first step was reached")
        to_step.append(float(marks[0]))
    return seconds


def plan_time(config, overrides, cache_dir) -> float:
    """``python -m minilms.plan CONFIG OVERRIDES --summary``, whole process: what start-up
    spends planning (the trainer plans the same schedule in the same pool), and then some (the
    command also searches the least pool and plans again without prefetch)."""
    command = [sys.executable, "-m", "minilms.plan", str(config), *overrides, "--summary"]
    return timed(command, cache_env(cache_dir))


def import_time(cache_dir) -> float:
    return timed([sys.executable, "-c", "import minilms.commands.train, minilms.training.trainer"],
                 cache_env(cache_dir))


def tiny_config(scratch: Path) -> Path:
    config = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    config["name"] = "startup-smoke"
    config["trace"] = False
    config["data"].update(train_size=64, val_size=0, batch_size=8)
    path = scratch / "tiny.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def load() -> str:
    try:
        return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        return "load average unknown"


def fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    p.add_argument("--overrides", nargs="*", default=DEFAULT_OVERRIDES, metavar="KEY=VALUE",
                   help=f"config overrides (default: {' '.join(DEFAULT_OVERRIDES)})")
    p.add_argument("--repeat", type=int, default=2, help="whole sequences; best of each column")
    p.add_argument("--more", type=int, default=1, metavar="N",
                   help="one step = (t(1 + N) - t(1)) / N; default 1: t(2) - t(1)")
    p.add_argument("--smoke", action="store_true", help="tiny config, one cold and one warm run")
    p.add_argument("--warm-only", action="store_true",
                   help="no cold run: the warm runs use the Numba cache you have (NUMBA_CACHE_DIR, "
                        "or the package's own), not a fresh one")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch_name:
        scratch = Path(scratch_name)
        config = tiny_config(scratch) if args.smoke else Path(args.config).resolve()
        overrides = [] if args.smoke else list(args.overrides)
        repeat = 1 if args.smoke else max(1, args.repeat)
        more = max(1, args.more)
        shown = config.name if args.smoke else os.path.relpath(config, ROOT)
        iters = "1" if args.smoke else f"1 (and {1 + more})"
        command = " ".join(["python -m minilms.train", shown, f"train.max_iters={iters}",
                            *overrides, "--quiet run_dir=<tmp>"])
        print(f"time to the first step: {command}, whole process, wall seconds; "
              f"best of {repeat}{' (smoke: tiny config)' if args.smoke else ''}; {load()}")
        rows = []
        try:
            for attempt in range(repeat):
                print(f"... sequence {attempt + 1}/{repeat}", file=sys.stderr, flush=True)
                cache = (None if args.warm_only else
                         Path(tempfile.mkdtemp(prefix="numba-cache-", dir=scratch)))
                cold = None if args.warm_only else train_time(config, overrides, 1, cache, scratch)
                to_step: list = []
                warm = train_time(config, overrides, 1, cache, scratch, to_step)
                warm2 = None if args.smoke else train_time(config, overrides, 1 + more, cache,
                                                           scratch)
                imports = None if args.smoke else import_time(cache)
                planned = None if args.smoke else plan_time(config, overrides, cache)
                rows.append((cold, warm, warm2, imports, planned, to_step[0]))
        except RuntimeError as error:
            print(f"bench_startup: a training run failed: {error}", file=sys.stderr)
            return 1
    later = f"warm t({1 + more}) s"
    print(f"\n{'run':<10} {'cold t(1) s':>12} {'warm t(1) s':>12} {later:>12} "
          f"{'one step s':>11} {'import only s':>14} {'to 1st step s':>14}")
    for i, (cold, warm, warm2, imports, _, first) in enumerate(rows, 1):
        step = None if warm2 is None else (warm2 - warm) / more
        print(f"{i:<10} {fmt(cold):>12} {fmt(warm):>12} {fmt(warm2):>12} {fmt(step):>11} "
              f"{fmt(imports):>14} {fmt(first):>14}")
    best = [min((r[k] for r in rows if r[k] is not None), default=None) for k in range(6)]
    step = None if best[2] is None else (best[2] - best[1]) / more
    print(f"{'best':<10} {fmt(best[0]):>12} {fmt(best[1]):>12} {fmt(best[2]):>12} "
          f"{fmt(step):>11} {fmt(best[3]):>14} {fmt(best[5]):>14}")
    how = ("not measured in smoke" if step is None else
           "t(2) - t(1), warm; a small net's step may be below the run-to-run noise: "
           "--more 20 averages over 20" if more == 1 else
           f"(t({1 + more}) - t(1)) / {more}, warm")
    compiling = ("not measured (--warm-only)" if best[0] is None else
                 f"{best[0] - best[1]:.2f} s")
    print(f"\ntime to the first step: cold {fmt(best[0])} s, warm {best[1]:.2f} s; one step "
          f"{fmt(step)} s ({how}); compiling with an empty cache costs {compiling}")
    if best[4] is not None:
        print(f"planning: python -m minilms.plan {shown} {' '.join(overrides)} --summary, whole "
              f"process, warm: {best[4]:.2f} s (import only {best[3]:.2f} s)")
    print(f"after the runs: {load()}")
    jits = jit_caching()
    print(f"njit functions cached on disk (cache=True): {len(jits['cached'])}; compiled in every "
          f"process, warm or not, on first call (cache=False): {len(jits['uncached'])}:")
    for name in jits["uncached"]:
        print(f"  {name}")
    met = best[5] < GOAL_WARM
    print(f"goal: time to the first step under {GOAL_WARM:.0f} s warm: {best[5]:.2f} s "
          f"from launch to the first iteration's start ({'met' if met else 'not met'}; the "
          f"whole warm t(1) process, one iteration and exit included: {best[1]:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
