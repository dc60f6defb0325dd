"""minilms on a real GPU: its GEMM against cuBLAS, what a launch costs, a process's cold and warm
start, and training throughput against PyTorch on the same GPU.

    python scripts/bench_cuda.py [--only env gemm launch start train] [--model resnet18]
                                 [--size 224] [--batches 32 64] [--iters 10] [--runs 3]
                                 [--warmup 2] [--pool-fraction 4] [--gemm-sizes 1024 4096]
                                 [--max-workspace MIB [MIB ...]]
                                 [--write-back] [--no-torch] [--json FILE] [--smoke]

Sections (``--only`` picks some; all by default):

- ``env``: the GPU (name, compute capability, SMs) and the versions of numba, numba-cuda, PyTorch.
- ``gemm``: ``kernels.gemm`` on square float32 matrices, all four transpose variants: TFLOP/s from
  CUDA events around repeated launches (the first launch, which compiles or loads the kernel, is
  timed apart), against ``torch.matmul`` with TF32 off (cuBLAS, the same float32 arithmetic) on
  the same operands, and the relative error of ours against it.
- ``launch``: host microseconds per launch of a small kernel through minilms' launcher (a view of
  the arguments, ``common.launch``, numba's dispatch), through numba with prepared arrays, and what
  a device-array view alone costs: the overhead a step pays before its kernel runs.
- ``start``: two fresh processes, one after the other, each building the net, planning and running
  one training iteration, with one numba cache directory (``$NUMBA_CACHE_DIR`` if set, which
  should then be empty, else a new one): seconds to the end of the first iteration, and numba's
  own cache counters summed over the registered kernels (a cold process misses and compiles; a
  warm one only hits).
- ``train``: ``--model`` at ``--size`` on the ``cuda`` device for each batch: minilms LMS off (a
  pool that holds the whole net), LMS on (``policy: auto`` in a pool of 1/``--pool-fraction`` of
  that, or the least pool if more), and PyTorch on the same GPU (fp32, TF32 off: the arithmetic
  ours does) from the same initial weights. After ``--steps`` iterations whose losses are
  compared and ``--warmup`` more, ``--runs`` runs of ``--iters`` iterations each, contenders taking
  turns; each run ends synchronized (minilms' ``iterate`` does; PyTorch's step reads its loss).
  LMS off also runs as the training loop does (``loss read behind``: each step issues an
  iteration with ``submit`` and reads the loss of the one before; the run ends with the last).
  Rows: s/iteration, images/s, ratio to PyTorch, launches per iteration, the pool.
  ``--max-workspace``: each convolution's ``max_workspace`` in MiB (the layer's default if not
  given; several: the whole section once for each), which bounds how many samples' columns a
  chunk holds, so the launches a step makes and the split-K weight gradients' blocks.
  ``--profile``: cProfile of LMS off (the host's time); ``--gpu-steps``: LMS off under the trace,
  each step's GPU time from CUDA events, by layer type and layer (the GPU's time).
  ``--write-back``: two more rows, the plan ``auto`` chose with ``lms.write_back`` ``lazy`` and
  ``early`` (docs/lms.md, "Early write-back": predicted faster on a GPU, to be measured here).

``--smoke``: tiny shapes under the Numba CUDA simulator (unless ``NUMBA_ENABLE_CUDASIM=0`` says
otherwise): the test suite's check that this script runs; PyTorch on the CPU where installed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

LR, MOMENTUM = 0.01, 0.9
MiB = 2**20
SECTIONS = ("env", "gemm", "launch", "start", "train")


def torch_or_none(args):
    if args.no_torch:
        return None
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_tf32 = False     # float32 as ours: no TF32 anywhere
    torch.backends.cudnn.allow_tf32 = False
    return torch


def torch_device(torch, simulated):
    return "cpu" if simulated or not torch.cuda.is_available() else "cuda"


# -- env ------------------------------------------------------------------------------------------

def section_env(args, report):
    import numba
    import numpy as np
    from numba import cuda
    versions = {"numba": numba.__version__, "numpy": np.__version__}
    try:
        import numba_cuda
        versions["numba-cuda"] = numba_cuda.__version__
    except ImportError:
        versions["numba-cuda"] = "absent"
    torch = torch_or_none(args)
    versions["torch"] = torch.__version__ if torch else "absent"
    gpu = cuda.get_current_device()
    name = getattr(gpu, "name", "Numba CUDA simulator")
    name = name.decode() if isinstance(name, bytes) else str(name)
    info = {"gpu": name, "cc": list(getattr(gpu, "compute_capability", ())),
            "sms": int(getattr(gpu, "MULTIPROCESSOR_COUNT", 0)), **versions}
    report["env"] = info
    print("env: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)


# -- gemm -----------------------------------------------------------------------------------------

def timed_gpu(fn, reps, simulated):
    """Seconds per call of ``fn`` from CUDA events around ``reps`` calls (one untimed first);
    the host clock under the simulator, whose events keep no time."""
    from numba import cuda
    fn()
    if simulated:
        began = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - began) / reps
    start, end = cuda.event(timing=True), cuda.event(timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cuda.event_elapsed_time(start, end) / 1000 / reps


def section_gemm(args, report):
    import numpy as np
    from numba import cuda

    from minilms.kernels import gemm
    torch = torch_or_none(args)
    rows = []
    rng = np.random.default_rng(0)
    for n in args.gemm_sizes:
        a_host = rng.standard_normal((n, n), dtype=np.float32)
        b_host = rng.standard_normal((n, n), dtype=np.float32)
        a, b = cuda.to_device(a_host), cuda.to_device(b_host)
        c = cuda.device_array((n, n), np.float32)
        for ta, tb in ((False, False), (False, True), (True, False), (True, True)):
            began = time.perf_counter()
            gemm.gemm(a, b, c, ta, tb)
            cuda.synchronize()
            first = time.perf_counter() - began
            reps = 3 if args.smoke else max(3, min(200, int(2e12 / (2 * n ** 3))))
            seconds = timed_gpu(lambda: gemm.gemm(a, b, c, ta, tb), reps, args.simulated)
            ours = c.copy_to_host()
            row = {"n": n, "variant": f"{'nt'[ta]}{'nt'[tb]}", "first_s": first,
                   "tflops": 2 * n ** 3 / seconds / 1e12}
            reference = (a_host.T if ta else a_host) @ (b_host.T if tb else b_host) \
                if torch is None or n <= 256 else None
            if torch is not None:
                where = torch_device(torch, args.simulated)
                ta_t, tb_t = torch.from_numpy(a_host).to(where), torch.from_numpy(b_host).to(where)
                op_a, op_b = (ta_t.T if ta else ta_t), (tb_t.T if tb else tb_t)
                out = torch.empty((n, n), device=where)

                def cublas():
                    torch.matmul(op_a, op_b, out=out)
                cublas()
                if where == "cuda":
                    torch.cuda.synchronize()
                    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                        enable_timing=True)
                    t0.record()
                    for _ in range(reps):
                        cublas()
                    t1.record()
                    t1.synchronize()
                    row["torch_tflops"] = 2 * n ** 3 / (t0.elapsed_time(t1) / 1000 / reps) / 1e12
                reference = out.cpu().numpy() if reference is None else reference
            if reference is not None:
                row["rel_err"] = float(np.linalg.norm(ours - reference) /
                                       np.linalg.norm(reference))
            rows.append(row)
            print("gemm {variant} n={n}: {tflops:.2f} TFLOP/s".format(**row)
                  + (" (cuBLAS fp32 {:.2f}, {:.0%})".format(
                      row["torch_tflops"], row["tflops"] / row["torch_tflops"])
                     if "torch_tflops" in row else "")
                  + (f", rel err {row['rel_err']:.1e}" if "rel_err" in row else "")
                  + f", first call {first:.2f} s", flush=True)
    report["gemm"] = rows


# -- launch ---------------------------------------------------------------------------------------

def host_us(fn, count):
    from numba import cuda
    cuda.synchronize()
    began = time.perf_counter()
    for _ in range(count):
        fn()
    per = (time.perf_counter() - began) / count
    cuda.synchronize()
    return per * 1e6


def section_launch(args, report):
    import numpy as np
    from numba import cuda

    from minilms.kernels import common, elementwise
    n, count = 1024, 3 if args.smoke else 5000
    pool = cuda.device_array(4 * n * 3, np.uint8)
    x, y, out = (pool[i * 4 * n:(i + 1) * 4 * n].view(np.float32) for i in range(3))
    elementwise.axpby(1.0, x, 0.5, y, out)          # compiles (or loads) once, untimed
    stream = cuda.stream()
    kernel = elementwise.axpby_cuda
    blocks, threads = common.grid_1d(n)
    prepared = kernel[blocks, threads, stream]
    one, half = np.float32(1.0), np.float32(0.5)
    launched = common.launch(kernel, blocks, threads, stream)
    rows = {
        "common.launch, kernel prepared (no views)":
            host_us(lambda: launched(one, x, half, y, out), count),
        "minilms launcher (views, checks, launch)":
            host_us(lambda: elementwise.axpby(1.0, x, 0.5, y, out, stream=stream), count),
        "numba, prepared arrays and configuration":
            host_us(lambda: prepared(one, x, half, y, out), count),
        "device-array view (pool slice + dtype view)":
            host_us(lambda: pool[4 * n:8 * n].view(np.float32), count),
        "stream synchronize, nothing queued": host_us(stream.synchronize, count),
    }
    report["launch"] = rows
    for name, us in rows.items():
        print(f"launch: {name}: {us:.1f} us", flush=True)


# -- the nets -------------------------------------------------------------------------------------

def build(model, size, batch, classes=1000, max_workspace=None):
    """``model``'s net on ``cuda`` and a seeded batch; ``max_workspace`` (bytes) for every
    convolution if given."""
    import numpy as np

    from minilms import zoo
    from minilms.net import Net
    if model == "lenet":
        layers, channels, classes = zoo.lenet(num_classes=10), 1, 10
    else:
        depth = int(model.removeprefix("resnet"))
        layers, channels = zoo.resnet(depth, num_classes=classes), 3
    if max_workspace:
        layers = [dict(layer, max_workspace=max_workspace) if layer["type"] == "Convolution"
                  else layer for layer in layers]
    net = Net(layers, {"data": ((batch, channels, size, size), np.float32),
                       "label": ((batch,), np.int32)}, device_kind="cuda")
    rng = np.random.default_rng(0)
    inputs = {"data": rng.random((batch, channels, size, size), dtype=np.float32),
              "label": rng.integers(0, classes, batch).astype(np.int32)}
    return net, inputs


def minilms_executor(net, lms, fraction, policy=None):
    """An executor on the GPU: LMS off in the pool it needs, or LMS on in ``1/fraction`` of
    that under ``policy`` (default ``auto``)."""
    from minilms.device import make_device
    from minilms.lms import LmsExecutor, Policy, least_pool, resident_bytes
    from minilms.solver import SGD
    steps = net.schedule(("momentum",))
    everything = resident_bytes(net, steps)
    if lms:
        policy = policy or Policy(policy="auto")
        pool = max(everything // fraction, least_pool(net, steps, policy))
    else:
        policy, pool = Policy(enabled=False), everything + 2 ** 20
    device = make_device("cuda", pool)
    return LmsExecutor(net, device, SGD(LR, momentum=MOMENTUM), policy), pool


def cache_counts():
    """numba's cache counters summed over every registered kernel: (hits, misses)."""
    from minilms.kernels.registry import KERNELS
    hits = misses = 0
    for spec in KERNELS.values():
        hits += sum(getattr(spec.dispatcher, "_cache_hits", {}).values())
        misses += sum(getattr(spec.dispatcher, "_cache_misses", {}).values())
    return hits, misses


def section_first(args, report):
    """One process's start: import, build, plan, one iteration (run by ``section_start``)."""
    began = time.perf_counter()
    import minilms  # noqa: F401
    from minilms.kernels import registry  # noqa: F401
    imported = time.perf_counter()
    net, inputs = build(args.model, args.size, args.batches[0])
    executor, _ = minilms_executor(net, False, 1)
    planned = time.perf_counter()
    loss = executor.iterate(inputs)["loss"]
    done = time.perf_counter()
    hits, misses = cache_counts()
    executor.device.close()
    report["first"] = {"import_s": imported - began, "plan_s": planned - imported,
                       "iteration_s": done - planned, "total_s": done - began,
                       "hits": hits, "misses": misses, "loss": loss}


def section_start(args, report):
    # $NUMBA_CACHE_DIR when set (empty, so that the first process is cold; later runs of the
    # lease then load what it compiled), else a fresh folder
    cache = os.environ.get("NUMBA_CACHE_DIR") or tempfile.mkdtemp(prefix="minilms-numba-cache-")
    if any(Path(cache).rglob("*.nbi")):
        print(f"start: {cache} already holds cached kernels: the 'cold' process is not cold",
              flush=True)
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    rows = []
    for label in ("cold", "warm"):
        out = Path(cache) / f"{label}.json"
        command = [sys.executable, __file__, "--only", "first", "--model", args.model,
                   "--size", str(args.size), "--batches", str(args.batches[0]),
                   "--json", str(out)]
        began = time.perf_counter()
        subprocess.run(command, env=env, check=True)
        wall = time.perf_counter() - began
        first = json.loads(out.read_text())["first"]
        files = sum(1 for p in Path(cache).rglob("*") if p.suffix in (".nbi", ".nbc"))
        rows.append({"start": label, "process_s": wall, "cache_files": files, **first})
        print(f"start ({label}): {wall:.1f} s for the process (import {first['import_s']:.1f}, "
              f"plan {first['plan_s']:.1f}, first iteration {first['iteration_s']:.1f}); "
              f"numba cache: {first['misses']} compiled, {first['hits']} loaded, "
              f"{files} files", flush=True)
    report["start"] = rows


# -- train ----------------------------------------------------------------------------------------

class Contender:
    def __init__(self, name, step, pool=None, close=None):
        self.name, self.step, self.pool = name, step, pool
        self.close = close or (lambda: None)
        self.best, self.first, self.losses, self.launches = float("inf"), None, [], None

    def timed(self, iters):
        began = time.perf_counter()
        for _ in range(iters):
            self.step()
        self.best = min(self.best, (time.perf_counter() - began) / iters)


class ReadBehind(Contender):
    """minilms as the training loop runs it: each step issues an iteration (``submit``) and then
    reads the loss of the one before, so the GPU has the next iteration queued while the host
    waits; a timed run ends with the last loss read."""

    def __init__(self, name, executor, inputs, pool=None, close=None):
        super().__init__(name, self.issue, pool, close)
        self.executor, self.inputs, self.previous = executor, inputs, None

    def issue(self):
        """The loss of the iteration issued before this one (None for the first)."""
        pending, self.previous = self.previous, self.executor.submit(self.inputs)
        return pending.result()["loss"] if pending is not None else None

    def drain(self):
        pending, self.previous = self.previous, None
        return pending.result()["loss"] if pending is not None else None

    def timed(self, iters):
        began = time.perf_counter()
        for _ in range(iters):
            self.step()
        self.drain()
        self.best = min(self.best, (time.perf_counter() - began) / iters)


def torch_contender(torch, net, inputs, params, where):
    from bench_vs_torch import torch_model
    model, copy_params = torch_model(torch, net)
    copy_params(params)
    model.to(where).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x = torch.from_numpy(inputs["data"]).to(where)
    y = torch.from_numpy(inputs["label"].astype("int64")).to(where)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        return loss.item()          # waits for the GPU, as minilms' iterate does

    return Contender(f"PyTorch {torch.__version__} ({where}, fp32, TF32 off)", step)


def section_train(args, report):
    from minilms.kernels.common import counting_launches
    from minilms.sizes import format_bytes
    torch = torch_or_none(args)
    rows, profiles = [], []
    for batch, workspace in [(b, w) for w in args.max_workspace or [None] for b in args.batches]:
        net, inputs = build(args.model, args.size, batch,
                            max_workspace=workspace and workspace * MiB)
        contenders = []
        try:
            for lms in (False, True):
                executor, pool = minilms_executor(net, lms, args.pool_fraction)
                name = f"minilms, LMS {'on (auto)' if lms else 'off'}"
                contender = Contender(name, lambda e=executor: e.iterate(inputs)["loss"],
                                      pool, executor.device.close)
                contender.executor = executor
                contenders.append(contender)
                if not lms:     # the same executor, its losses read one iteration behind
                    contenders.append(ReadBehind("minilms, LMS off, loss read behind", executor,
                                                 inputs, pool))
            if args.write_back:     # auto's plan with each write-back (docs/lms.md), measured
                chosen = contenders[-1].executor.plan.policy
                for mode in ("lazy", "early"):
                    policy = replace(chosen, policy="manual", write_back=mode)
                    executor, pool = minilms_executor(net, True, args.pool_fraction, policy)
                    contender = Contender(f"minilms, LMS on, write-back {mode}",
                                          lambda e=executor: e.iterate(inputs)["loss"], pool,
                                          executor.device.close)
                    contender.executor = executor
                    contenders.append(contender)
            if torch is not None:
                off = contenders[0].executor
                off.sync_state()
                params = {name: blob.host_data().copy() for name, blob in off.shared.items()
                          if blob.role == "param"}
                contenders.insert(0, torch_contender(torch, net, inputs, params,
                                                     torch_device(torch, args.simulated)))
            for contender in contenders:
                began = time.perf_counter()
                contender.losses = [contender.step()]
                contender.first = time.perf_counter() - began
                contender.losses += [contender.step() for _ in range(args.steps - 1)]
                if isinstance(contender, ReadBehind):
                    contender.losses = contender.losses[1:] + [contender.drain()]
                for _ in range(args.warmup):
                    contender.step()
                if isinstance(contender, ReadBehind):
                    contender.drain()
                if hasattr(contender, "executor"):
                    with counting_launches() as launches:
                        contender.step()
                        if isinstance(contender, ReadBehind):
                            contender.drain()
                    contender.launches = sum(launches.values())
            for _ in range(args.runs):
                for contender in contenders:
                    contender.timed(args.iters)
            off = next(c for c in contenders if c.name == "minilms, LMS off")
            if args.profile:
                profiles.append(profiled(off.step, args.iters, batch, workspace))
            if args.gpu_steps:
                profiles.append(gpu_step_times(off, batch, workspace))
        finally:
            for contender in contenders:
                contender.close()
        base = contenders[0].best if torch is not None else None
        for contender in contenders:
            row = {"batch": batch, "max_workspace_mib": workspace, "name": contender.name,
                   "s_per_iter": contender.best,
                   "images_per_s": batch / contender.best, "first_s": contender.first,
                   "launches": contender.launches, "pool": contender.pool,
                   "losses": contender.losses}
            if base:
                row["vs_torch"] = base / contender.best
            rows.append(row)
        print(f"\n{args.model} {args.size}x{args.size}, batch {batch}"
              + (f", max_workspace {workspace} MiB:" if workspace else ":"))
        print(f"  {'':44} {'s/iter':>8} {'img/s':>8} {'vs torch':>8} {'launches':>8} "
              f"{'pool':>10} {'first':>7}")
        for row in rows[-len(contenders):]:
            print(f"  {row['name']:44} {row['s_per_iter']:8.4f} {row['images_per_s']:8.1f} "
                  f"{row.get('vs_torch', float('nan')):7.2f}x {row['launches'] or '':>8} "
                  f"{format_bytes(row['pool']) if row['pool'] else '':>10} "
                  f"{row['first_s']:6.1f}s")
        for row, contender in zip(rows[-len(contenders):], contenders):
            # the read-behind row shares LMS off's executor: its losses go on from LMS off's run
            later = " (later iterations, same weights)" if isinstance(contender, ReadBehind) else ""
            print(f"  losses {row['name']}{later}: "
                  + " ".join(f"{v:.5f}" for v in row["losses"]))
    if not args.simulated:
        from minilms.kernels.prepared_launch import PREPARED
        ready = sum(1 for entry in PREPARED.values() if entry)
        print(f"\nprepared launches: {ready} kernels by kind of arguments, "
              f"{len(PREPARED) - ready} left to numba's dispatch")
    for text in profiles:
        print(text)
    report["train"] = rows


def gpu_step_times(contender, batch, workspace, iterations=3) -> str:
    """minilms LMS off under the trace: each step's GPU time from CUDA events on the compute
    stream, by layer type and by layer (``python -m minilms.trace RUN --table``'s tables)."""
    from minilms.trace.record import record
    with record(executor=contender.executor) as trace:
        for _ in range(iterations):
            contender.step()
    return (f"\n== GPU time per step (CUDA events), minilms LMS off, batch {batch}, "
            f"{iterations} iterations{workspaced(workspace)} ==\n"
            + trace.summary(table=True, top=25))


def workspaced(mib) -> str:
    return f", max_workspace {mib} MiB" if mib else ""


def profiled(step, iters, batch, workspace) -> str:
    """minilms LMS off under cProfile for ``iters`` iterations: the top functions by their own
    time and by cumulative time (where the host's time per iteration goes)."""
    import cProfile
    import io
    import pstats
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(iters):
        step()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    out.write(f"\n== profile, minilms LMS off, batch {batch}, {iters} iterations"
              f"{workspaced(workspace)} ==\n")
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    return out.getvalue()


def small_gemm_tile():
    """The simulator's cost is per block and per barrier: a GEMM tile of 32 threads, as the layer
    tests use (tests/layers/conftest.py), instead of minutes per launch at the real 128x128."""
    from minilms.kernels import gemm
    shape = dict(BM=8, BN=32, BK=16, TM=2, TN=4)
    derived = dict(zip(gemm.DERIVED, gemm.derived_constants(*shape.values())))
    for name, value in {**shape, **derived}.items():
        setattr(gemm, name, value)


# -- main -----------------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", choices=SECTIONS + ("first",), default=list(SECTIONS))
    p.add_argument("--model", default="resnet18", help="resnet18/34/50/101/152 or lenet")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batches", type=int, nargs="+", default=[32, 64])
    p.add_argument("--iters", type=int, default=10, help="iterations per timed run")
    p.add_argument("--runs", type=int, default=3, help="timed runs; the best one counts")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations after the losses")
    p.add_argument("--steps", type=int, default=3, help="iterations whose losses are printed")
    p.add_argument("--pool-fraction", type=int, default=4, help="LMS on: pool = LMS off / this")
    p.add_argument("--gemm-sizes", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--max-workspace", type=int, nargs="+", metavar="MIB",
                   help="train: each convolution's max_workspace, MiB (several: one pass each)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--profile", action="store_true", help="train: cProfile of minilms LMS off")
    p.add_argument("--write-back", action="store_true",
                   help="train: also auto's LMS plan with lms.write_back lazy and early")
    p.add_argument("--gpu-steps", action="store_true",
                   help="train: each step's GPU time (events), by layer type, minilms LMS off")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--smoke", action="store_true", help="tiny and quick: for the test suite")
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.size, args.batches = "lenet", 28, [2]
        args.iters, args.runs, args.warmup, args.steps, args.gemm_sizes = 1, 1, 0, 1, [64]
        if args.only == list(SECTIONS):
            args.only = ["env", "gemm", "launch", "train"]
    if args.smoke:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")   # before numba is imported
    import numba
    from numba import cuda
    args.simulated = bool(numba.config.ENABLE_CUDASIM)
    if not args.smoke and (args.simulated or not cuda.is_available()):
        print("bench_cuda: no GPU here (the simulator would take hours): run it with --smoke, "
              "or where a GPU is", file=sys.stderr)
        return 2
    if args.simulated:
        small_gemm_tile()
    report = {"argv": sys.argv[1:]}
    sections = {"env": section_env, "gemm": section_gemm, "launch": section_launch,
                "start": section_start, "first": section_first, "train": section_train}
    for name in args.only:
        sections[name](args, report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
