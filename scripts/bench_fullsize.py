"""Training at full size on the ``cpu`` device: minilms LMS off, minilms LMS on in a small pool, and
PyTorch on the CPU, with the same threads, against the machine's SGEMM rate measured in this run.

    python scripts/bench_fullsize.py [--cases resnet50:224:8 resnet152:224:16 ...]
                                     [--iters 3] [--runs 2] [--rounds 1] [--warmup 1]
                                     [--pool-fraction 8]
                                     [--torch-python PATH] [--no-torch] [--big]
                                     [--fuse auto|all|none] [--interleave] [--smoke]

Each case is ``model:image size:batch``. Each contender runs in a process of its own, one after
another (never side by side: two cores): the process builds the net, times ``--runs`` runs of
``--iters`` iterations after ``--warmup`` untimed ones (which compile), and reports its best run
and its peak resident memory (``VmHWM``). With ``--rounds N`` each contender runs in N processes,
the contenders of a case in turn, and the fastest counts: on a machine whose speed drifts (a VM
beside busy neighbours) the contenders then meet the same slow spells. A process of its own gives
each its own peak, and gives PyTorch its own defaults: minilms sets ``OMP_WAIT_POLICY=PASSIVE``,
``GOMP_SPINCOUNT`` and ``OPENBLAS_THREAD_TIMEOUT`` for itself, and PyTorch's OpenMP runs slower
with the first, so the PyTorch process runs without them and imports torch before anything of
minilms. With ``--interleave`` a case's
contenders are alive at once (started one after another, each warmed up before the next starts)
and take ``--rounds`` turns of ``--iters`` iterations each, in rotation, one running at a time,
numpy's SGEMM timed here before each rotation; each row's median turn counts, against the SGEMM's
median. On a VM whose speed drifts within minutes this is the arrangement
whose ratios hold (a slow spell falls on every contender's turns alike); the case must fit in
memory three times over. PyTorch runs with ``--torch-python``
(default: this interpreter, if it has torch): the project's own environment stays free of torch.

Rows: PyTorch (the baseline), minilms LMS off (a pool that holds the whole net), minilms LMS on
(``policy: auto`` in a pool of 1/``--pool-fraction`` of what LMS off needs, or the least pool if
that is more). Columns: seconds per iteration, images/s, the ratio to PyTorch's images/s (goal
1.2x), model GFLOP/s (three times the forward's FLOPs a training iteration, the usual count, for
every row alike) and their share of the SGEMM rate (goal 65%), the peak resident memory and, for
minilms, the plan's host figure (``LmsExecutor.host_memory``: what the plan says the run needs,
with the one batch the process holds and the kernels' one-time cost) and the ratio of the peak's
growth over the process's own resident memory after its imports to it (goal: within 10%;
``bench_host_memory.py`` says what the process itself adds), marked ``*`` where the process
compiled kernels (an empty Numba cache: the first process of a case on a new machine), whose peak
holds the compiler's memory too (``lms.host.CPU_COMPILE_BYTES``, which ``minilms.plan`` prints
apart): a first run's figure, not a run's.

``--big`` adds GoogLeNet at 2240x2240 with LMS on, at the largest batch whose plan's host figure
fits in three quarters of this machine's available memory (PyTorch where LMS off would fit).
``--smoke``: a small ResNet at 32x32, one short run: for the test suite.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_TORCH, GOAL_SGEMM, GOAL_HOST = 1.2, 0.65, 0.10
DEFAULT_CASES = ["resnet50:224:8", "resnet50:224:16", "resnet152:224:8", "resnet152:224:16",
                 "googlenet:224:8"]


# -- the worker: one contender in one process ----------------------------------------------------

def status_bytes(field: str) -> int:
    """A size from /proc/self/status, bytes: ``VmHWM`` (the peak resident set), ``VmRSS`` (now)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def time_runs(step, iters, runs, warmup) -> float:
    for _ in range(warmup):
        step()
    best = float("inf")
    for _ in range(runs):
        began = time.perf_counter()
        for _ in range(iters):
            step()
        best = min(best, (time.perf_counter() - began) / iters)
    return best


def build(case, np, fuse=None):
    """``(net, inputs)``: the case's net, fused as ``fuse`` says (default: as a config's net is
    first tried, ``fusion.fusions_for`` of the case's ``fuse`` and ``lms``), one random batch."""
    from minilms import zoo
    from minilms.net import Net
    model, size, batch = case["model"], case["size"], case["batch"]
    classes = case.get("classes", 1000)
    layers = zoo.MODELS[model](num_classes=classes, width=case.get("width", 1))
    net = Net(layers, {"data": ((batch, 3, size, size), np.float32),
                       "label": ((batch,), np.int32)}, device_kind="cpu",
              fuse=fuse or fusions(case)[0])
    rng = np.random.default_rng(0)
    inputs = {"data": rng.random((batch, 3, size, size), dtype=np.float32),
              "label": rng.integers(0, classes, batch).astype(np.int32)}
    return net, inputs


def minilms_setup(case):
    """``(step, report)``: one training iteration of minilms on ``case``, and what the row
    reports besides its time (``report()``, read when called: the peak so far)."""
    import minilms  # noqa: F401, I001  (first: thread settings before numpy loads OpenBLAS)
    import minilms.device, minilms.lms, minilms.solver  # noqa: F401, E401  (in the baseline)
    baseline = status_bytes("VmRSS")      # the process after its imports
    net, inputs, executor, pool, everything = training(case, case["fraction"])

    def report():
        host = executor.host_memory(batches=1)      # the one batch this process holds
        return {"rss": status_bytes("VmHWM"), "baseline": baseline, "host": host.total,
                "pool": pool, "resident": everything, "compiled": kernels_compiled(),
                "flops": 3 * net_flops(net), "blas_spin_fixed": minilms.BLAS_SPIN_FIXED}
    return (lambda: executor.iterate(inputs)), report


def kernels_compiled() -> int:
    """The kernels this process compiled, where Numba's cache did not hold them (signatures
    missed in the cache, over every dispatcher): a process that compiled has the compiler's
    memory in its peak (``lms.host.CPU_COMPILE_BYTES``), a first run's and not a steady one."""
    import gc

    from numba.core.dispatcher import Dispatcher
    # type(), not isinstance: gc's objects include weak proxies, whose __class__ a dead one's
    # referent cannot give
    return sum(len(found.stats.cache_misses) for found in gc.get_objects()
               if issubclass(type(found), Dispatcher))


def fusions(case) -> tuple:
    """The fusions a config's net of the case would try, in order (``fusion.fusions_for``)."""
    from minilms.fusion import fusions_for
    return fusions_for(case.get("fuse", "auto"), case.get("lms", True))


def training(case, fraction: int):
    """``(net, inputs, executor, pool, LMS off's pool)``, as a config's run makes them: LMS off
    (``case["lms"]`` false) in the pool it needs; LMS on (``policy: auto``) in 1/``fraction`` of
    that, at least the least pool, the net fused as the pool allows (``fusion.first_that_plans``),
    planned with this machine's measured rates (``cost.measure_cpu``, as the trainer plans);
    SGD with momentum."""
    import numpy as np

    from minilms.device import make_device
    from minilms.fusion import first_that_plans
    from minilms.lms import LmsExecutor, Policy, least_pool, measure_cpu, resident_bytes
    from minilms.solver import SGD
    tried = fusions(case)
    net, inputs = build(case, np, tried[-1])      # the fusion whose least pool is least
    steps = net.schedule(("momentum",))
    everything = resident_bytes(net, steps)
    if case.get("lms", True):
        policy = Policy(policy="auto")
        pool = max(everything // fraction, least_pool(net, steps, policy))
    else:
        policy, pool = Policy(enabled=False), everything + 2**20
    device = make_device("cpu", pool)
    least_net, rates = net, measure_cpu()       # once, as the trainer measures them
    net, executor = first_that_plans(
        tried, lambda fuse: least_net if fuse == tried[-1] else build(case, np, fuse)[0],
        lambda net, policy: LmsExecutor(net, device, SGD(0.01, momentum=0.9), policy,
                                        cost_model=rates), policy)
    return net, inputs, executor, pool, everything


def net_flops(net) -> int:
    return sum(layer.flops() for layer in net.layers)


def torch_setup(case):
    """``(step, report)`` for PyTorch, as ``minilms_setup``."""
    import torch  # first: its OpenMP starts with its own defaults, before minilms sets any

    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT))
    import numpy as np
    from bench_vs_torch import torch_model
    torch.set_num_threads(case["threads"])
    net, inputs = build(case, np, fuse="none")     # the net as written: one module per layer
    model, _ = torch_model(torch, net)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.from_numpy(inputs["data"])
    y = torch.from_numpy(inputs["label"].astype(np.int64))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        optimizer.step()

    return step, lambda: {"rss": status_bytes("VmHWM"), "flops": 3 * net_flops(net),
                          "version": torch.__version__}


def worker(kind, case) -> dict:
    """One contender's process: its best run, and its report."""
    step, report = (torch_setup if kind == "torch" else minilms_setup)(case)
    seconds = time_runs(step, case["iters"], case["runs"], case["warmup"])
    return dict(report(), seconds=seconds)


def serve(kind, case) -> None:
    """One contender's process in ``--interleave``: set up and warm up, say READY, then time
    ``iters`` iterations for each ``run`` read from stdin (``TIME`` seconds an iteration), and
    report at ``end``."""
    step, report = (torch_setup if kind == "torch" else minilms_setup)(case)
    for _ in range(case["warmup"]):
        step()
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "run":
            began = time.perf_counter()
            for _ in range(case["iters"]):
                step()
            print(f"TIME {(time.perf_counter() - began) / case['iters']!r}", flush=True)
        elif line.strip() == "end":
            print("RESULT " + json.dumps(report()), flush=True)
            return


# -- the parent: cases, processes, the table ------------------------------------------------------

def openblas_kernels() -> str:
    """The kernels numpy's OpenBLAS runs (threadpoolctl's ``architecture``), and the core type
    the environment forces where it does: a machine may set an older one than its CPU runs, at
    half the SGEMM rate (``OPENBLAS_CORETYPE=Haswell`` on a Zen 5: docs/benchmarks.md, session
    65), and a figure taken so says it."""
    from threadpoolctl import threadpool_info
    found = [i.get("architecture") for i in threadpool_info() if i.get("internal_api") ==
             "openblas"]
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return f"OpenBLAS kernels {found[0] if found else 'not loaded'}" + (
        f", OPENBLAS_CORETYPE={forced} set" if forced else "")


def sgemm_rate(n=2048, repeats=5) -> float:
    """numpy's float32 GEMM on ``n x n`` matrices, best of ``repeats``, FLOP/s."""
    import minilms  # noqa: F401, I001  (first, as above)
    import numpy as np
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    b, c = a.copy(), np.empty_like(a)
    np.matmul(a, b, out=c)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        np.matmul(a, b, out=c)
        best = min(best, time.perf_counter() - began)
    return 2 * n**3 / best


def worker_env(kind) -> dict:
    env = dict(os.environ)
    if kind == "torch":      # PyTorch's defaults, not minilms' thread settings
        for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT"):
            env.pop(name, None)
    return env


def run_worker(python, kind, case) -> dict:
    done = subprocess.run([python, __file__, "--worker", kind, json.dumps(case)],
                          env=worker_env(kind), capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"{kind} worker exit {done.returncode}: {tail[0]}"}
    return json.loads(lines[-1][len("RESULT "):])


# In --interleave, before each turn: the others' threads have gone quiet (see bench_kernels)
SETTLE_SECONDS = 0.3


def _answer(process, word: str):
    """The rest of the first line of ``process``'s stdout that starts with ``word`` (None where
    it ended first)."""
    for line in process.stdout:
        if line.startswith(word):
            return line[len(word):].strip()
    return None


def interleaved(contenders, turns: int, sgemm_n: int):
    """``({label: result}, SGEMM rate)`` for ``contenders`` (``(label, python, kind, case)``),
    each a process alive for the whole case (started one after another, each warmed up before
    the next starts), taking ``turns`` turns each in rotation, and numpy's SGEMM rate measured
    here before each rotation: the medians count, and a machine whose speed drifts moves every
    contender, and the rate, alike. All of a case's processes are in memory at once."""
    processes, results, rates = {}, {}, []
    try:
        for label, python, kind, case in contenders:
            process = subprocess.Popen([python, __file__, "--serve", kind, json.dumps(case)],
                                       env=worker_env(kind), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)
            if _answer(process, "READY") is None:
                results[label] = {"error": f"{kind} server exit {process.wait()}"}
                continue
            processes[label] = process
        times = {label: [] for label in processes}
        for turn in range(turns):
            order = list(processes)
            if not order:
                break
            time.sleep(SETTLE_SECONDS)
            rates.append(sgemm_rate(sgemm_n))
            for label in order[turn % len(order):] + order[:turn % len(order)]:
                time.sleep(SETTLE_SECONDS)
                processes[label].stdin.write("run\n")
                processes[label].stdin.flush()
                answer = _answer(processes[label], "TIME ")
                if answer is None:
                    process = processes.pop(label)
                    results[label] = {"error": f"server exit {process.wait()} in turn {turn}"}
                    continue
                times[label].append(float(answer))
        for label, process in processes.items():
            process.stdin.write("end\n")
            process.stdin.flush()
            results[label] = dict(json.loads(_answer(process, "RESULT ")),
                                  seconds=sorted(times[label])[len(times[label]) // 2])
    finally:
        for process in processes.values():
            process.stdin.close()
            process.wait()
    return results, (sorted(rates)[len(rates) // 2] if rates else None)


def torch_python(args):
    """``(interpreter, None)`` for the PyTorch rows, or ``(None, why not)``. The PyTorch worker
    builds the net with minilms' zoo, so that interpreter needs minilms' dependencies too (a
    plain ``pip install -e .`` in its environment)."""
    if args.no_torch:
        return None, "--no-torch"
    python = args.torch_python or sys.executable
    probe = subprocess.run([python, "-c", f"import torch, sys; sys.path.insert(0, {str(ROOT)!r});"
                            " import minilms.zoo"], capture_output=True, text=True)
    if probe.returncode == 0:
        return python, None
    if "No module named 'torch'" in probe.stderr:
        return None, "--torch-python PATH, or pip install torch"
    last = (probe.stderr.strip().splitlines() or ["?"])[-1]
    return None, f"{python} has torch, but minilms does not import there ({last}): pip install -e ."


def parse_case(text, where: str = "bench_fullsize: --cases"):
    """``model:size:batch`` as a case; bad input exits 2 with ``where`` (the script and flag)."""
    try:
        model, size, batch = text.split(":")
        return {"model": model, "size": int(size), "batch": int(batch)}
    except ValueError:
        print(f"{where}: expected model:size:batch, found {text!r}", file=sys.stderr)
        sys.exit(2)


def big_case(args, threads):
    """GoogLeNet at 2240x2240 at the largest batch whose plan's host figure fits in 3/4 of the
    available memory, LMS on; None if not even batch 1 fits."""
    import minilms  # noqa: F401, I001  (first, as above)
    import numpy as np

    from minilms.lms import Policy, host_memory, least_pool, make_plan, resident_bytes
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    chosen = None
    for batch in range(1, 9):
        net, _ = build({"model": "googlenet", "size": 2240, "batch": batch}, np)
        steps = net.schedule(("momentum",))
        policy = Policy(policy="auto")
        pool = max(resident_bytes(net, steps) // args.pool_fraction,
                   least_pool(net, steps, policy))
        need = host_memory(make_plan(net, steps, pool, policy), "cpu", batches=1).total
        if need > 0.75 * available:
            break
        chosen = {"model": "googlenet", "size": 2240, "batch": batch}
    return chosen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES, metavar="MODEL:SIZE:BATCH")
    p.add_argument("--iters", type=int, default=3, help="iterations per timed run")
    p.add_argument("--runs", type=int, default=2, help="timed runs; the best one counts")
    p.add_argument("--rounds", type=int, default=1,
                   help="processes per contender, the contenders in turn; the fastest counts")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first (compile)")
    p.add_argument("--pool-fraction", type=int, default=8, help="LMS on: pool = LMS off / this")
    p.add_argument("--threads", type=int, default=None, help="default: numba.get_num_threads()")
    p.add_argument("--torch-python", default=None, help="an interpreter that has torch")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--big", action="store_true", help="add GoogLeNet at 2240x2240, LMS on")
    p.add_argument("--fuse", choices=("auto", "all", "none"), default="auto",
                   help="minilms' layer fusion, as a config's model.fuse (default auto)")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    p.add_argument("--interleave", action="store_true",
                   help="a case's contenders alive at once, taking --rounds turns of --iters "
                        "iterations each in rotation; the median turn counts")
    p.add_argument("--worker", nargs=2, metavar=("KIND", "CASE"), help=argparse.SUPPRESS)
    p.add_argument("--serve", nargs=2, metavar=("KIND", "CASE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker[0], json.loads(args.worker[1]))))
        return 0
    if args.serve:
        serve(args.serve[0], json.loads(args.serve[1]))
        return 0
    import minilms  # noqa: F401, I001  (first, as above)
    import numba

    from minilms.kernels.mkl import chosen as blas_library
    threads = args.threads or numba.get_num_threads()
    cases = [parse_case(text) for text in args.cases]
    if args.smoke:
        cases = [{"model": "resnet50", "size": 32, "batch": 2, "width": 16, "classes": 10}]
        args.iters, args.runs, args.warmup = 1, 1, 1
    if args.big and not args.smoke:
        big = big_case(args, threads)
        print("GoogLeNet at 2240x2240: " + (f"batch {big['batch']} fits, LMS on" if big else
                                            "not even batch 1 fits this machine's memory"))
        if big:
            cases.append(dict(big, only_lms=True))
    python, why_not = torch_python(args)
    rate = sgemm_rate(256 if args.smoke else 2048)
    print(f"bench_fullsize: {threads} threads each; numpy SGEMM {rate / 1e9:.0f} GFLOP/s (this "
          f"run); LMS on in 1/{args.pool_fraction} of LMS off's pool; "
          + (f"median of {args.rounds} turns of {args.iters} iterations, the contenders in "
             "rotation, alive at once" if args.interleave else
             f"best of {args.runs} runs of {args.iters} iterations"
             + (f" in each of {args.rounds} rounds, taken in turn" if args.rounds > 1 else ""))
          + f"; minilms' BLAS: {blas_library()} ({openblas_kernels()}); PyTorch: "
          + (python if python else f"not run ({why_not})"))
    header = (f"{'case':22} {'row':12} {'s/iter':>7} {'img/s':>7} {'vs torch':>8} {'GFLOP/s':>8} "
              f"{'SGEMM':>6} {'peak RSS':>10} {'plan host':>10} {'RSS/plan':>8}")
    print(header + "\n(RSS/plan: peak RSS less the process's own after its imports, over the "
          "plan's host figure, LmsExecutor.host_memory; *: the process compiled kernels into "
          "Numba's cache, and its peak has the compiler's memory too)")
    print("-" * len(header))
    summary = []
    for case in cases:
        case.update(iters=args.iters, runs=args.runs, warmup=args.warmup, threads=threads,
                    fraction=args.pool_fraction, fuse=args.fuse)
        name = f"{case['model']} {case['size']} b{case['batch']}"
        contenders = []
        if python and not case.get("only_lms"):
            contenders.append(("PyTorch", python, "torch", case))
        if not case.get("only_lms"):
            contenders.append(("LMS off", sys.executable, "minilms", dict(case, lms=False)))
        contenders.append(("LMS on", sys.executable, "minilms", dict(case, lms=True)))
        case_rate = rate
        if args.interleave:     # the SGEMM rate too in turns, beside the contenders'
            done, measured = interleaved(contenders, args.rounds, 256 if args.smoke else 2048)
            rows = [(label, done[label]) for label, *_ in contenders]
            case_rate = measured or rate
            print(f"{name}: numpy SGEMM {case_rate / 1e9:.0f} GFLOP/s, the median of its turns")
        else:
            results = {label: [] for label, *_ in contenders}
            for _ in range(args.rounds):  # in turn: a machine whose speed drifts slows them alike
                for label, *how in contenders:
                    results[label].append(run_worker(*how))
            rows = [(label, fastest(results[label])) for label in results]
        base = next((r for label, r in rows if label == "PyTorch" and "seconds" in r), None)
        for label, r in rows:
            if "error" in r:
                print(f"{name:22} {label:12} {r['error']}")
                continue
            summary.append((name, label, r, base, case_rate))
            print(format_row(name, label, r, base, case_rate, case["batch"]))
    print()
    for name, label, r, base, rate_ in summary:
        if label == "PyTorch":
            continue
        verdicts = []
        if base:
            ratio = base["seconds"] / r["seconds"]
            verdicts.append(f"{ratio:.2f}x PyTorch (goal {GOAL_TORCH}x: "
                            f"{'met' if ratio >= GOAL_TORCH else 'not met'})")
        share = r["flops"] / r["seconds"] / rate_
        verdicts.append(f"{share:.0%} of SGEMM (goal {GOAL_SGEMM:.0%}: "
                        f"{'met' if share >= GOAL_SGEMM else 'not met'})")
        off = abs((r["rss"] - r["baseline"]) / r["host"] - 1)
        verdicts.append(f"peak RSS over the process's baseline {off:.0%} from the plan's host "
                        f"figure (goal within "
                        f"{GOAL_HOST:.0%}: {'met' if off <= GOAL_HOST else 'not met'}"
                        + (f"; compiled {r['compiled']} kernels, a first run's peak: run again "
                           "for a run's" if r.get("compiled") else "") + ")")
        print(f"{name}, {label}: " + "; ".join(verdicts))
    return 0


def fastest(results):
    """The result with the fewest seconds an iteration (an error only if every round failed)."""
    done = [r for r in results if "seconds" in r]
    return min(done, key=lambda r: r["seconds"]) if done else results[-1]


def format_row(name, label, r, base, rate, batch) -> str:
    from minilms.sizes import format_bytes
    ratio = f"{base['seconds'] / r['seconds']:.2f}x" if base else "-"
    gflops = r["flops"] / r["seconds"]
    host = format_bytes(r["host"]) if "host" in r else "-"
    vs_plan = f"{(r['rss'] - r['baseline']) / r['host']:.2f}" if "host" in r else "-"
    vs_plan += "*" if r.get("compiled") else ""
    return (f"{name:22} {label:12} {r['seconds']:7.3f} {batch / r['seconds']:7.2f} {ratio:>8} "
            f"{gflops / 1e9:8.0f} {gflops / rate:6.0%} {format_bytes(r['rss']):>10} {host:>10} "
            f"{vs_plan:>8}")


if __name__ == "__main__":
    sys.exit(main())
