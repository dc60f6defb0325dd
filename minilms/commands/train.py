"""``python -m minilms.train CONFIG.yaml [key.sub=value ...] [--lms KB] [--lms-frac F]
[--resume RUN] [--print-config] [--dry-run]``

Trains the config's model on its data, in its device's pool, with LMS as configured. ``--lms`` and
``--lms-frac`` mean what they mean in IBM Caffe: ``--lms KB`` turns LMS on with blobs smaller than
KB kilobytes kept resident (0 or less: LMS off), ``--lms-frac F`` lets LMS idle until that share of
the pool is in use; either makes the policy manual. ``--resume RUN`` continues the run in directory
RUN from its latest checkpoint. ``--print-config`` prints the resolved config; ``--dry-run`` prints
the plan (as ``python -m minilms.plan``) and trains nothing.

A run directory (``run_dir``, default ``runs/<name>-<timestamp>``) receives the resolved config,
``metrics.jsonl`` and ``metrics.csv``, checkpoints, ``summary.json``, and with ``trace: true`` the
memory trace and its picture. Nothing is written before the config, the data, the net and the plan
have all been checked; every such mistake is one line on stderr and exit code 2.

``mpiexec -n N python -m minilms.train CONFIG.yaml`` trains data-parallel over N processes
(``minilms.training.distributed``; the config's ``distributed`` section): rank 0 chooses the run
directory and writes what one process would; with ``trace: true`` every rank records its own trace,
rank 0 into ``trace.json``, rank R into ``trace.rankR.json``.
"""
import argparse
import math
import time
from pathlib import Path

from ..config.build import load
from ..errors import ConfigError
from ..training.checkpoint import LATEST
from .common import run
from .plan import report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minilms.train",
                                description="Train a model with Large Model Support.")
    p.add_argument("config", help="a YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="settings that replace the file's, e.g. train.max_iters=20")
    p.add_argument("--lms", type=float, metavar="KB",
                   help="Caffe's -lms: LMS on, blobs under KB kilobytes stay resident (<= 0: off)")
    p.add_argument("--lms-frac", type=float, metavar="F",
                   help="Caffe's -lms_frac: LMS idles until this share of the pool is in use")
    p.add_argument("--resume", metavar="RUN", help="continue the run in this directory")
    p.add_argument("--print-config", action="store_true", help="print the resolved config, exit")
    p.add_argument("--dry-run", action="store_true", help="print the plan, train nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bars or messages")
    return p


def caffe_flags(args) -> list[str]:
    """The overrides ``--lms`` and ``--lms-frac`` stand for."""
    extra = []
    for flag, value in (("--lms", args.lms), ("--lms-frac", args.lms_frac)):
        if value is not None and not math.isfinite(value):
            raise ConfigError(flag, "a finite number", value)
    if args.lms is not None:
        if args.lms <= 0:
            extra.append("lms.enabled=false")
        else:
            extra += ["lms.enabled=true", "lms.policy=manual",
                      f"lms.min_swap_bytes={int(args.lms * 1024)}"]
    if args.lms_frac is not None:
        if not 0 <= args.lms_frac <= 1:
            raise ConfigError("--lms-frac", "a fraction in [0, 1]", args.lms_frac)
        extra += ["lms.enabled=true", "lms.policy=manual", f"lms.start_fraction={args.lms_frac}"]
    return extra


def run_directory(config, resume: str | None) -> Path:
    if resume:
        path = Path(resume)
        if not path.is_dir():
            raise ConfigError("--resume", "a run directory", resume)
        return path
    if config.run_dir:
        return Path(config.run_dir)
    return Path("runs") / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_run_directory(run_dir: Path, resume: bool) -> None:
    """A fresh run needs a new or empty directory; one that holds a run says which kind, and what
    to do with it. ``--resume`` needs a run directory (one a run wrote its config into)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError("--resume" if resume else "run_dir", "a directory", str(run_dir),
                          hint=" (a file)")
    if resume:
        if not (run_dir / LATEST).exists() and not (run_dir / "config.yaml").exists():
            raise ConfigError("--resume", "a run directory (one holding config.yaml and its "
                              "checkpoints)", str(run_dir))
        return
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return
    if (run_dir / LATEST).exists():
        what = f" (a run with checkpoints: --resume {run_dir} continues it)"
    elif (run_dir / "config.yaml").exists():
        what = (f" (a run that stopped before its first checkpoint: --resume {run_dir} starts "
                "it over, or delete it)")
    else:
        what = f" (a directory holding {sum(1 for _ in run_dir.iterdir())} entries)"
    raise ConfigError("run_dir", "a new or empty directory", str(run_dir), hint=what)


# What a run writes into its directory before its first checkpoint, removed again if it fails
# then (a failed start leaves nothing) or if --resume starts it over.
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.csv", "summary.json", "memory.png")


def clear_run(run_dir: Path, remove_dir: bool) -> None:
    for path in [run_dir / name for name in RUN_FILES] + list(run_dir.glob("trace*.json")):
        path.unlink(missing_ok=True)
    if remove_dir and run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()


def main(argv=None) -> int:
    args = parser().parse_intermixed_args(argv)
    config = load(args.config, list(args.overrides) + caffe_flags(args))
    try:
        if args.print_config:
            print(config.to_yaml(), end="")
            return 0
        if args.dry_run:
            print(report(config))
            return 0
        return train(config, args)
    except Exception as error:
        error.config = config
        raise


def train(config, args) -> int:
    from ..training.distributed import World, rank_suffix
    from ..training.trainer import Trainer, record_trace
    world = World.detect(config.distributed.timeout)
    run_dir = Path(world.share(str(run_directory(config, args.resume)), "the run directory"))
    check_run_directory(run_dir, bool(args.resume))
    world.barrier("checking the run directory")       # every rank looked before rank 0 writes
    trainer = Trainer(config, quiet=args.quiet, world=world)       # every check happens here
    say = not args.quiet and world.rank == 0
    made = not run_dir.exists()
    try:
        if args.resume and (run_dir / LATEST).exists():
            trainer.resume(run_dir)
        elif args.resume:
            if world.rank == 0:
                clear_run(run_dir, remove_dir=False)
            if say:
                print(f"{run_dir} stopped before its first checkpoint: starting it over")
        run_dir.mkdir(parents=True, exist_ok=True)
        if world.rank == 0:
            (run_dir / "config.yaml").write_text(config.to_yaml())
        if say:
            print(f"run directory: {run_dir}")
        with record_trace(config.trace, trainer) as tr:
            trainer.run(run_dir)
        if tr is not None:
            trace = run_dir / f"trace{rank_suffix(world)}.json"
            tr.save(trace, least_pool=True)
            if world.rank == 0:
                tr.plot(run_dir / "memory.png")
            if say:
                print(f"memory trace: {trace}, picture: {run_dir / 'memory.png'}"
                      + (f" (rank 1..{world.size - 1}: trace.rankR.json)" if world.distributed
                         else ""))
    except BaseException:
        # A start that fails before the first checkpoint leaves nothing behind; with a
        # checkpoint, the directory is a run that --resume continues.
        if world.rank == 0 and run_dir.is_dir() and not (run_dir / LATEST).exists():
            clear_run(run_dir, remove_dir=made)
        raise
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
