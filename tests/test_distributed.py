"""Data-parallel training (``minilms.training.distributed``).

In one process: the delayed-update schedule and ``reduce_grads`` plans pass the replay checker;
training through the reduce path with an identity reducer gives LMS's weights bit for bit; the
reducer averages in plan order and ends the job past its deadline; device memory is shared.

Under ``mpiexec -n 2`` (skipped, saying why, without mpi4py or mpiexec; the ``test`` extra
installs both): two ranks with batch B take the steps one process takes with batch 2B, LMS on or
off; only rank 0 writes the run directory, each rank its trace; a run resumes; a rank that dies
or hangs ends the others with a non-zero status within the stated time.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilms import zoo
from minilms.commands.common import run
from minilms.commands.train import main
from minilms.errors import PlanError
from minilms.lms import LmsExecutor
from minilms.lms.check import check_plan
from minilms.lms.planner import Policy, make_plan
from minilms.net import Net
from minilms.solver import SGD, Adam
from minilms.training.checkpoint import load_checkpoint
from minilms.training.distributed import (
    GradientReducer,
    World,
    device_of,
    launched_size,
    memory_share,
    sharers,
)

from .devices import new_device
from .test_executor import RESIDUAL_INCEPTION, batch
from .test_plan import NETS, net_named

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20

# No BatchNorm (its statistics are per rank) and no Dropout (masks drawn per rank): the model
# whose two-rank run must equal one process with the combined batch.
TINY = """
name: dp
seed: 5
model:
  layers:
    - {name: conv1, type: Convolution, bottom: data, top: c1, num_output: 8, kernel_size: 3, pad: 1}
    - {name: relu1, type: ReLU, bottom: c1, top: c1}
    - {name: pool1, type: Pooling, bottom: c1, top: p1, pool: max, kernel_size: 2, stride: 2}
    - {name: conv2, type: Convolution, bottom: p1, top: c2, num_output: 8, kernel_size: 3, pad: 1}
    - {name: relu2, type: ReLU, bottom: c2, top: c2}
    - {name: pool2, type: Pooling, bottom: c2, top: p2, pool: ave, global_pooling: true}
    - {name: fc, type: InnerProduct, bottom: p2, top: fc, num_output: 3}
    - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
    - {name: accuracy, type: Accuracy, bottom: [fc, label], top: accuracy}
data: {dataset: shapes, image_size: 16, num_classes: 3, train_size: 96, val_size: 40,
       batch_size: 8, augment: {flip: false}, prefetch: 1}
device: {kind: cpu, memory: 1MiB}
lms: {policy: manual, prefetch: 1}
solver: {type: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.0001}
train: {epochs: 2, log_every: 2, eval_every: 1, checkpoint_every: 1}
"""


# -- one process -----------------------------------------------------------------------------------
def test_delayed_updates_come_after_the_last_backward_in_backward_order():
    net = Net(zoo.lenet(), {"data": ((2, 1, 28, 28), np.float32), "label": ((2,), np.int32)})
    plain, delayed = net.schedule(("momentum",)), net.schedule(("momentum",), delay_updates=True)
    assert sorted(s.name for s in plain) == sorted(s.name for s in delayed)
    kinds = [s.kind for s in delayed]
    last_backward = max(i for i, k in enumerate(kinds) if k == "backward")
    assert set(kinds[last_backward + 1:]) == {"update"} and "update" not in kinds[:last_backward]
    order = [s.layer for s in delayed if s.kind == "backward" and net.learnable(net.layer[s.layer])]
    assert [s.layer for s in delayed if s.kind == "update"] == order
    assert [s.index for s in delayed] == list(range(len(delayed)))


policies = st.builds(
    Policy, enabled=st.booleans(), policy=st.just("manual"),
    min_swap_bytes=st.sampled_from([0, 0, 512, 65536]),
    limit=st.one_of(st.none(), st.integers(0, 4 << 20)),
    start_fraction=st.sampled_from([0.0, 0.0, 0.5]), prefetch=st.integers(0, 4),
    keep_state=st.booleans(), reduce_grads=st.just(True))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from([n for n in sorted(NETS) if "eval" not in n]), policy=policies,
       scale=st.floats(1.0, 1.6))
def test_reduce_plans_replay_correctly(name, policy, scale):
    """Random knobs on the delayed schedule: every gradient goes home after its backward, is
    reduced there, and is loaded back for its update; nothing else changes what plans promise."""
    net, _, least, everything = net_named(name)
    state = ("exp_avg", "exp_avg_sq") if "adam" in name else ("momentum",)
    steps = net.schedule(state, delay_updates=True)
    capacity = int(least * scale * 1.2) if policy.enabled else int(everything * scale)
    try:
        plan = make_plan(net, steps, capacity, policy)
    except PlanError as error:
        assert "out of device memory" in str(error)
        return
    check_plan(plan)
    reduced = [a.blob for _, a in plan.actions() if a.kind == "reduce"]
    assert sorted(reduced) == sorted(n for n, b in plan.blobs.items() if b.role == "param_grad")


def test_the_checker_refuses_an_update_of_an_unreduced_gradient():
    net, _, least, _ = net_named("residual+inception")
    steps = net.schedule(("momentum",), delay_updates=True)
    plan = make_plan(net, steps, least * 2, Policy(reduce_grads=True))
    for step_plan in plan.steps:
        step_plan.release = [a for a in step_plan.release if a.kind != "reduce"]
    with pytest.raises(AssertionError, match="not reduced since it was written"):
        check_plan(plan)


class IdentityReducer:
    """The executor's side of the contract, checked: one process, so the average is the value."""

    def __init__(self):
        self.submitted, self.finished, self.polls, self.pending = [], [], 0, {}

    def begin_iteration(self, iteration):
        self.pending = {}

    def submit(self, name, host, copied):
        assert name.endswith(".grad") and name not in self.pending    # once an iteration
        self.submitted.append(name)
        self.pending[name] = copied

    def poll(self):
        self.polls += 1

    def finish(self, name):
        copied = self.pending.pop(name, None)
        if copied is not None:
            copied.synchronize()
            self.finished.append(name)


@pytest.mark.parametrize("policy", [Policy(prefetch=2), Policy(enabled=False),
                                    Policy(min_swap_bytes=4096, prefetch=1)],
                         ids=["lms prefetch 2", "lms off", "small pinned"])
@pytest.mark.parametrize("solver", [lambda: SGD(0.05, momentum=0.9, weight_decay=1e-4),
                                    lambda: Adam(1e-3)], ids=["sgd", "adam"])
def test_the_reduce_path_with_one_process_gives_lms_weights_bit_for_bit(policy, solver):
    """Gradients home, through the reducer and back, updates delayed: with nobody to average
    with, exactly the weights, state and losses of the plain LMS executor."""
    batches = [batch(2, 2, 6, 3, seed=s) for s in range(2)]
    shapes = {k: (v.shape, v.dtype) for k, v in batches[0].items()}
    results = []
    for reduce in (False, True):
        reducer = IdentityReducer() if reduce else None
        with new_device("cpu", 16 * MiB) as device:
            executor = LmsExecutor(Net(RESIDUAL_INCEPTION, shapes), device, solver(),
                                   Policy(**{**policy.__dict__, "reduce_grads": reduce}),
                                   reducer=reducer)
            losses = [executor.iterate(batches[i % 2])["loss"] for i in range(3)]
            executor.sync_state()
            results.append((losses, {n: b.host_data().copy() for n, b in executor.shared.items()}))
        if reduce:
            grads = [n for n, b in executor.blobs.items() if b.role == "param_grad"]
            assert len(reducer.submitted) == 3 * len(grads) == len(reducer.finished)
            assert reducer.polls >= 3 * len(executor.plan.steps)
    assert results[0][0] == results[1][0]
    for name, value in results[0][1].items():
        np.testing.assert_array_equal(results[1][1][name], value, err_msg=name)


def test_the_reducer_in_the_executor_starts_averages_while_backward_runs():
    """The real reducer, its other rank contributing the same gradient (x + x, then / 2: exact):
    the weights of plain LMS bit for bit, and gradients are handed to MPI while later backward
    steps are still to run, not after the last one."""
    inputs = batch(2, 2, 6, 3, seed=1)
    shapes = {k: (v.shape, v.dtype) for k, v in inputs.items()}
    log, results = [], []

    class Logged(GradientReducer):
        def _hand_over(self):
            log.append(("hand over", self.copying[0][0]))
            super()._hand_over()

    for reducer in (None, Logged(FakeWorld())):
        log.clear()
        with new_device("cpu", 16 * MiB) as device:
            executor = LmsExecutor(Net(RESIDUAL_INCEPTION, shapes), device, SGD(0.1, momentum=0.9),
                                   Policy(prefetch=1, reduce_grads=reducer is not None),
                                   reducer=reducer)
            run_step = executor.run_step

            def logged(index, step, *args):
                log.append((step.kind, step.layer))
                return run_step(index, step, *args)
            executor.run_step = logged
            losses = [executor.iterate(inputs)["loss"] for _ in range(2)]
            executor.sync_state()
            results.append((losses, {n: b.host_data().copy() for n, b in executor.shared.items()}))
        if reducer is not None:
            reducer.close()
    assert results[0][0] == results[1][0]
    for name, value in results[0][1].items():
        np.testing.assert_array_equal(results[1][1][name], value, err_msg=name)
    first = log[:[entry[0] for entry in log].index("update")]     # up to the first update
    backward = [i for i, entry in enumerate(first) if entry[0] == "backward"]
    handed = [i for i, entry in enumerate(first) if entry[0] == "hand over"]
    assert handed and handed[0] < backward[-1], first


class Request:
    def __init__(self, done=True):
        self.done = done

    def Test(self):
        return self.done


class FakeWorld(World):
    """Two ranks whose other rank contributes the same gradient (or never answers)."""

    def __init__(self, answer=True, timeout=5.0):
        super().__init__(timeout=timeout)
        self.size, self.answer, self.started, self.failed = 2, answer, [], threading.Event()

    def start_sum(self, array):
        self.started.append(array.copy())
        array *= 2                   # both ranks had this gradient
        return Request(self.answer)

    def fail(self, message, code=3):
        self.message = message
        self.failed.set()
        time.sleep(3600)


class Landed:
    def query(self):
        return True

    def synchronize(self):
        pass


def test_the_reducer_averages_in_plan_order():
    world = FakeWorld()
    reducer = GradientReducer(world)
    reducer.begin_iteration(7)
    grads = {f"l{i}.weight.grad": np.full(3, float(i + 1), np.float32) for i in range(4)}
    for name, host in grads.items():
        reducer.submit(name, host, Landed())
    for name in reversed(list(grads)):
        reducer.finish(name)
    assert [a[0] for a in world.started] == [1, 2, 3, 4]           # the order they came in
    for i, host in enumerate(grads.values()):
        np.testing.assert_array_equal(host, np.full(3, float(i + 1), np.float32))
    reducer.close()


def test_without_overlap_nothing_starts_before_the_first_update():
    world = FakeWorld()
    reducer = GradientReducer(world, overlap=False)
    reducer.begin_iteration(1)
    reducer.submit("a.grad", np.ones(2, np.float32), Landed())
    reducer.poll()
    time.sleep(0.05)
    assert world.started == []
    reducer.submit("b.grad", np.ones(2, np.float32), Landed())
    reducer.finish("b.grad")
    assert len(world.started) == 2
    reducer.close()


def test_a_sum_that_never_completes_ends_the_job_naming_it():
    world = FakeWorld(answer=False, timeout=0.2)
    reducer = GradientReducer(world)
    reducer.begin_iteration(12)
    started = time.monotonic()
    reducer.submit("fc.weight.grad", np.ones(2, np.float32), Landed())
    assert world.failed.wait(5)
    assert 0.2 <= time.monotonic() - started < 2
    assert world.message == ("allreduce of fc.weight.grad in iteration 12 did not complete within "
                             "0.2 s (distributed.timeout): another rank died or hangs; ending all "
                             "2 ranks")


def test_one_process_is_its_own_world():
    world = World()
    assert (world.rank, world.size, world.distributed) == (0, 1, False)
    arrays = {"w": np.arange(3.0)}
    world.broadcast(arrays, "weights")
    world.barrier("nothing")
    world.agree("anything", "the config")
    np.testing.assert_array_equal(world.sum([1.5, 2], "metrics"), [1.5, 2])
    assert world.share("runs/x", "the run directory") == "runs/x"


def test_launchers_are_recognised_by_their_environment():
    assert launched_size({}) == 1
    assert launched_size({"PMI_SIZE": "4"}) == 4
    assert launched_size({"OMPI_COMM_WORLD_SIZE": "2"}) == 2
    assert launched_size({"PMI_SIZE": "x", "MV2_COMM_WORLD_SIZE": "3"}) == 3


def test_memory_auto_is_shared_by_the_ranks_on_a_device():
    # 4 local ranks on 2 GPUs: ranks 0 and 2 on GPU 0, 1 and 3 on GPU 1; two share each
    assert [device_of(r, 2) for r in range(4)] == [0, 1, 0, 1]
    assert [sharers(r, 4, 2) for r in range(4)] == [2, 2, 2, 2]
    assert [sharers(r, 3, 2) for r in range(3)] == [2, 1, 2]
    assert sharers(1, 3, 0) == 3                     # the cpu device: the node's ranks share RAM
    free = 80 * 2**30
    assert memory_share(free, 0.9, 2) == int(free * 0.9) // 2
    assert memory_share(free, 0.9, 1) == int(free * 0.9)


# -- under mpiexec ---------------------------------------------------------------------------------
def find_mpiexec():
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def mpi_missing() -> str:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py not installed (pip install -e '.[test]' or '.[mpi]')"
    if find_mpiexec() is None:
        return "no mpiexec beside the Python executable or on PATH (pip install mpich)"
    return ""


needs_mpi = pytest.mark.skipif(bool(mpi_missing()), reason=mpi_missing() or "-")


def environment():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for key in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[key] = "1"            # two ranks on a small machine: one thread each
    return env


def mpiexec(*args, ranks=2, launcher=(), timeout=120):
    started = time.monotonic()
    done = subprocess.run([find_mpiexec(), *launcher, "-n", str(ranks), sys.executable, *args],
                          cwd=ROOT, env=environment(), capture_output=True, text=True,
                          timeout=timeout)
    return done, time.monotonic() - started


def write_config(tmp_path, text=TINY):
    path = tmp_path / "dp.yaml"
    path.write_text(text)
    return str(path)


def final_state(run_dir):
    checkpoint = load_checkpoint(run_dir)
    return {**checkpoint.weights, **checkpoint.state}, checkpoint.meta["iteration"]


def assert_close(got, expected):
    assert got[1] == expected[1]
    assert got[0].keys() == expected[0].keys()
    for name, value in expected[0].items():
        np.testing.assert_allclose(got[0][name], value, rtol=1e-4, atol=1e-6, err_msg=name)


@needs_mpi
@pytest.mark.parametrize("lms", [["lms.enabled=true", "device.memory=1MiB"],
                                 ["lms.enabled=false", "device.memory=8MiB"]],
                         ids=["lms on, small pool", "lms off"])
def test_two_ranks_step_as_one_process_with_the_combined_batch(tmp_path, lms):
    """2 ranks x batch 8 for 12 iterations (2 epochs) against 1 process x batch 16: the same
    weights and momentum, to float rounding (the sums are taken in another order)."""
    config = write_config(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    done, _ = mpiexec("-m", "minilms.train", config, "--quiet", f"run_dir={two}", *lms)
    assert done.returncode == 0, done.stderr
    assert run(main, [config, "--quiet", f"run_dir={one}", "data.batch_size=16", *lms]) == 0
    assert_close(final_state(two), final_state(one))
    assert final_state(one)[1] == 12


@needs_mpi
def test_rank_0_writes_the_run_each_rank_its_trace_and_a_resumed_run_ends_the_same(tmp_path):
    """Metrics, checkpoints and the summary from rank 0 (images/s of both ranks, validation over
    every sample once); a trace per rank; linear lr scaling said at start; stopped after one
    epoch and resumed under mpiexec, the uninterrupted run's weights."""
    config = write_config(tmp_path)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    extra = ["distributed.lr_scaling=linear"]
    done, _ = mpiexec("-m", "minilms.train", config, f"run_dir={whole}", "trace=true", *extra)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "data parallel: 2 ranks, batch 8 each (16 in all)" in out
    assert "lr scaling linear: lr 0.1 = 0.05 x 2" in out
    assert out.count("run directory:") == 1 and out.count("done: 12 iterations") == 1
    files = {p.name for p in whole.iterdir()}
    assert {"config.yaml", "metrics.csv", "metrics.jsonl", "summary.json", "trace.json",
            "trace.rank1.json", "memory.png", "latest"} <= files
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["iterations"] == 12
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["split"] == "val"] == [1, 2]
    assert {r["lr"] for r in rows if r["split"] == "train"} == {0.1}

    done, _ = mpiexec("-m", "minilms.train", config, "--quiet", f"run_dir={parts}",
                      "train.epochs=1", *extra)
    assert done.returncode == 0, done.stderr
    done, _ = mpiexec("-m", "minilms.train", config, "--quiet", "--resume", str(parts), *extra)
    assert done.returncode == 0, done.stderr
    assert_close(final_state(parts), final_state(whole))


@needs_mpi
@pytest.mark.parametrize("mode, launcher, message", [
    ("hang", (), True),                             # nothing ends it but the deadline
    ("exit", ("-disable-auto-cleanup",), True),     # the launcher leaves the others running
    ("kill", (), False),                            # the launcher ends the job at once
], ids=["hangs", "exits, no clean-up", "killed"])
def test_a_rank_that_dies_or_hangs_ends_the_others_within_the_timeout(tmp_path, mode, launcher,
                                                                       message):
    """Rank 1 fails as it begins iteration 3; rank 0 waits in the gradient average at most
    ``distributed.timeout`` (3 s), then says so in one line and ends the job."""
    config = write_config(tmp_path)
    done, seconds = mpiexec("-m", "tests.mpi_driver", "1", "3", mode, config, "--quiet",
                            f"run_dir={tmp_path / 'run'}", "distributed.timeout=3",
                            launcher=launcher, timeout=90)
    assert done.returncode != 0, done.stderr
    assert f"driver: rank 1 {mode} at iteration 3" in done.stderr
    if message:
        assert done.returncode == 3, done.stderr
        assert ("error: rank 0: allreduce of fc.weight.grad in iteration 3 did not complete "
                "within 3 s (distributed.timeout): another rank died or hangs; ending all 2 "
                "ranks") in done.stderr
    assert seconds < 3 + 25, seconds         # start-up, three iterations, the deadline


@needs_mpi
def test_a_config_error_is_one_line_and_exit_2(tmp_path):
    """Every rank finds it; the launcher ends the job at the first rank's exit, so the other's
    line may or may not make it out."""
    config = write_config(tmp_path, TINY.replace("lr: 0.05", "lr: -1"))
    done, _ = mpiexec("-m", "minilms.train", config, "--quiet")
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert 1 <= len(lines) <= 2 and "solver.lr: expected a number > 0, found -1" in lines[0]
