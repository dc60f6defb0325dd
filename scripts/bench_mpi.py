"""Data-parallel scaling on this machine: images/s of one process against two MPI ranks.

    python scripts/bench_mpi.py [--model resnet18|quickstart] [--batch 32] [--iters 40]
                                [--warmup 8] [--repeat 1] [--smoke]

Each row is a whole training run, ``python -m minilms.train`` (one rank) or ``mpiexec -n 2
python -m minilms.train`` (two), on the cpu device, LMS on (``policy: auto`` in a pool smaller
than the net), every rank with batch ``--batch`` (so two ranks train on twice as many images a
step: weak scaling, as data parallelism is used). Threads per rank are chosen so the two ranks do
not oversubscribe two cores: 2 threads for one rank, 1 each for two (``OMP_NUM_THREADS``,
``NUMBA_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``); one rank with 1 thread is shown as the per-core
reference. images/s is read from rank 0's ``metrics.jsonl`` (one row per iteration: the images of
all ranks over the iteration's time, gradient averaging included), summed over the iterations
after ``--warmup``: the steady state, without start-up, compilation and data loading waits. The
ratio is against one rank with 2 threads, measured in the same run of this script. ``overlap
off`` averages all gradients after the last backward step instead of layer by layer during it;
``wait ms/it`` is how long rank 0's updates waited for the averages, per iteration (the trainer's
closing line).
``--repeat R`` runs every row R times and keeps the best (the machine may be shared). The load
average before and after is printed: numbers taken on a busy machine say little.

``--smoke``: a tiny net and a few iterations, to check the script works (no numbers worth
reading).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODELS = {
    "resnet18": """
name: bench_mpi
model: {zoo: resnet18, options: {width: 2}}     # 32..256 channels
data: {dataset: shapes, image_size: 32, channels: 3, num_classes: 4, train_size: 8192,
       val_size: 0, batch_size: 32, augment: {flip: true}}
device: {kind: cpu, memory: 16MiB}              # LMS off needs 72 MiB at batch 32
lms: {policy: auto}
solver: {type: sgd, lr: 0.05, momentum: 0.9}
""",
    "quickstart": None,          # configs/quickstart.yaml
    "smoke": """
name: bench_mpi_smoke
model:
  layers:
    - {name: conv1, type: Convolution, bottom: data, top: c1, num_output: 4, kernel_size: 3, pad: 1}
    - {name: relu1, type: ReLU, bottom: c1, top: c1}
    - {name: pool1, type: Pooling, bottom: c1, top: p1, pool: ave, global_pooling: true}
    - {name: fc, type: InnerProduct, bottom: p1, top: fc, num_output: 3}
    - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
data: {dataset: shapes, image_size: 8, num_classes: 3, train_size: 64, val_size: 0,
       batch_size: 4}
device: {kind: cpu, memory: 1MiB}
lms: {policy: manual}
solver: {type: sgd, lr: 0.05}
""",
}
THREADS = ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# label, ranks, threads per rank, overlap
ROWS = [("1 rank, 2 threads", 1, 2, True), ("1 rank, 1 thread", 1, 1, True),
        ("2 ranks, 1 thread each", 2, 1, True), ("2 ranks, overlap off", 2, 1, False)]


def find_mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def throughput(run_dir: Path, warmup: int, ranks: int, batch: int) -> float:
    """Images/s over the iterations after ``warmup``: their images over their summed times."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in rows if r["split"] == "train" and r["iteration"] > warmup]
    images = ranks * batch * len(steady)
    return images / sum(ranks * batch / r["images_per_s"] for r in steady)


def measure(config: str, ranks: int, threads: int, overlap: bool, args, work: Path) -> tuple:
    """(images/s, ms rank 0 waited for gradient averages per iteration, or None)."""
    run_dir = Path(tempfile.mkdtemp(dir=work))
    shutil.rmtree(run_dir)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.update({key: str(threads) for key in THREADS})
    command = [sys.executable, "-m", "minilms.train", config, f"run_dir={run_dir}",
               f"train.max_iters={args.iters}", "train.log_every=1", "train.epochs=null",
               "train.checkpoint_every=0", "train.eval_every=0", "data.val_size=0", "trace=false",
               f"data.batch_size={args.batch}", f"distributed.overlap={str(overlap).lower()}"]
    if ranks > 1:
        command = [find_mpiexec(), "-n", str(ranks)] + command
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_mpi: {' '.join(command)} failed:\n{done.stderr}")
    waited = re.search(r"updates waited ([\d.]+) ms in all", done.stdout)
    return (throughput(run_dir, args.warmup, ranks, args.batch),
            float(waited.group(1)) / args.iters if waited else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["resnet18", "quickstart"], default="resnet18")
    parser.add_argument("--batch", type=int, default=32, help="images per rank per step")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8, help="iterations left out")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.batch, args.iters, args.warmup = "smoke", 4, 5, 1
    if args.iters <= args.warmup:
        parser.error("--iters must exceed --warmup")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        print("bench_mpi: skipped, mpi4py is not installed (pip install -e '.[mpi]')")
        return 0
    if find_mpiexec() is None:
        print("bench_mpi: skipped, no mpiexec beside the Python executable or on PATH")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_mpi-") as tmp:
        work = Path(tmp)
        if MODELS[args.model] is None:
            config = str(ROOT / "configs" / "quickstart.yaml")
        else:
            config = str(work / "bench.yaml")
            Path(config).write_text(MODELS[args.model])
        load = os.getloadavg()
        print(f"data parallel on the cpu device: {args.model}, batch {args.batch} per rank, "
              f"{args.iters} iterations ({args.warmup} left out), best of {args.repeat}; "
              f"{os.cpu_count()} cores, load average {load[0]:.2f} before")
        print(f"{'row':<26} {'ranks':>5} {'threads/rank':>12} {'batch in all':>12} "
              f"{'images/s':>9} {'ratio':>6} {'wait ms/it':>10}")
        results = {}
        for label, ranks, threads, overlap in ROWS:
            best, waited = max(measure(config, ranks, threads, overlap, args, work)
                               for _ in range(args.repeat))
            results[label] = best
            ratio = best / results[ROWS[0][0]]
            wait = "-" if waited is None else f"{waited:.2f}"
            print(f"{label:<26} {ranks:>5} {threads:>12} {ranks * args.batch:>12} {best:>9.1f} "
                  f"{ratio:>5.2f}x {wait:>10}")
        two, one = results["2 ranks, 1 thread each"], results["1 rank, 2 threads"]
        print(f"ratio 2 ranks / 1 rank images/s: {two / one:.2f}x against 1 rank with 2 threads, "
              f"{two / results['1 rank, 1 thread']:.2f}x against 1 rank with 1 thread "
              "(2.00x: perfect scaling)")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
