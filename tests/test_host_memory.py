"""Host memory, stated and kept (``minilms.lms.host``): blobs get a host copy (a home) only where
the plan needs one, all of them before the first iteration and none during one; the plan's figure is
the sum a reader gets by walking the plan; training is unchanged, bit for bit."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minilms import zoo
from minilms.blob import Blob, State
from minilms.device import make_device
from minilms.kernels.elementwise import fill
from minilms.layers.base import ParamSpec
from minilms.lms import (
    LmsExecutor,
    Policy,
    ResidentExecutor,
    crossing,
    homes,
    host_memory,
    least_pool,
    loader_batches,
    make_plan,
    resident_bytes,
)
from minilms.lms.host import CPU_KERNEL_BYTES
from minilms.net import Net
from minilms.sizes import format_bytes
from minilms.solver import SGD

from .devices import KINDS, new_device
from .test_executor import batch
from .test_lms import DAG, assert_identical, reference, train

MiB = 2**20
RESNET = zoo.resnet(18, num_classes=4, width=16)


def make_net(layers, inputs):
    return Net(layers, {k: (v.shape, v.dtype) for k, v in inputs.items()})


def with_home(executor) -> set:
    return {name for name, blob in executor.blobs.items() if blob.has_home}


def walked(plan) -> set:
    """The blobs that need a home, found by walking the plan's actions: every blob a copy moves
    (prologue, steps, epilogue) or a reduction reads on the host, the inputs written and the
    outputs read on the host, and the parameters and optimizer state."""
    found = set()
    for action in plan.prologue:
        if action.kind in ("swap_in", "swap_out", "sync"):
            found.add(action.blob)
    for step_plan in plan.steps:
        for action in step_plan.release + step_plan.demand + step_plan.prefetch:
            if action.kind in ("swap_in", "swap_out", "sync", "reduce"):
                found.add(action.blob)
    for action in plan.epilogue:
        if action.kind in ("swap_out", "sync"):
            found.add(action.blob)
    found.update(n for n, info in plan.blobs.items() if info.role in ("param", "optimizer_state"))
    return found | set(plan.host_inputs) | set(plan.outputs)


def walked_crossing(plan) -> set:
    """The homes page-locked on cuda, by walking the plan: what a step or the epilogue copies or
    reduces, the inputs and the outputs (not what only the prologue loads)."""
    found = set(plan.host_inputs) | set(plan.outputs)
    for step_plan in plan.steps:
        for action in step_plan.release + step_plan.demand + step_plan.prefetch:
            if action.kind in ("swap_in", "swap_out", "sync", "reduce"):
                found.add(action.blob)
    found.update(a.blob for a in plan.epilogue if a.kind in ("swap_out", "sync"))
    return found


def test_lms_off_gives_homes_only_to_what_the_host_touches():
    """LMS off keeps every blob in the pool: only parameters and optimizer state, the inputs and
    the loss gradient seed, and the outputs get a home; activations, their gradients, parameter
    gradients and workspace never do, not after the build nor after training."""
    inputs = batch(2, 3, 32, classes=4)
    net = make_net(RESNET, inputs)
    with make_device("cpu", resident_bytes(net, net.schedule(("momentum",)))) as device:
        executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), Policy(enabled=False))
        built = with_home(executor)
        assert built == set(homes(executor.plan)) == walked(executor.plan)
        roles = {executor.blobs[n].role for n in built}
        assert roles == {"param", "optimizer_state", "input", "activation", "activation_grad"}
        assert {n for n in built if executor.blobs[n].role == "activation"} == {"loss", "accuracy"}
        assert {n for n in built if executor.blobs[n].role == "activation_grad"} == {"loss.grad"}
        for _ in range(2):
            executor.iterate(inputs)
        assert with_home(executor) == built
        assert not any(b.has_home for b in executor.blobs.values()
                       if b.role in ("workspace", "param_grad"))


@pytest.mark.parametrize("policy", [Policy(), Policy(prefetch=2), Policy(policy="auto")],
                         ids=["default", "prefetch 2", "auto"])
def test_lms_on_gives_homes_to_swapped_blobs_before_the_first_iteration(policy, monkeypatch):
    """With LMS on, what swaps has a home from the build on; workspace never has one; and no home
    is allocated while iterating (``alloc_host`` is not called)."""
    inputs = batch(4, 3, 32, classes=4)
    net = make_net(RESNET, inputs)
    steps = net.schedule(("momentum",))
    capacity = least_pool(net, steps) if policy.policy == "manual" else \
        int(1.2 * least_pool(net, steps))
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), policy)
        plan = executor.plan
        built = with_home(executor)
        assert built == set(homes(plan)) == walked(plan)
        swapped = {a.blob for _, a in plan.actions() if a.kind == "swap_out"}
        assert swapped and swapped <= built
        if policy.policy == "manual":       # Caffe's default swaps activations out
            assert any(executor.blobs[n].role == "activation" for n in swapped)
        assert not any(b.has_home for b in executor.blobs.values() if b.role == "workspace")
        assert len(built) < len(executor.blobs)
        calls = []
        monkeypatch.setattr(device, "alloc_host", lambda *a: calls.append(a) or 1 / 0)
        for _ in range(2):
            executor.iterate(inputs)
        executor.sync_state()
        assert calls == [] and with_home(executor) == built


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("policy", [Policy(), Policy(enabled=False), Policy(keep_state=True)],
                         ids=["default", "off", "keep state"])
def test_the_figure_is_the_sum_of_the_walked_plan(kind, policy):
    """The figure, from a plan alone (no device): the bytes of the blobs found by walking the
    plan, plus the pool on ``cpu`` (its arena is host RAM), plus the loader's batches; pinned is
    the homes that cross the link every iteration on ``cuda``, none on ``cpu``. What the host
    writes or reads every iteration (inputs, seeds, outputs) has two homes (a ring of two: the
    host writes the next iteration's while the device reads the last one's)."""
    inputs = batch(2, 2, 6, classes=3)
    net = make_net(DAG, inputs)
    steps = net.schedule(("momentum",))
    capacity = resident_bytes(net, steps) if not policy.enabled else least_pool(net, steps,
                                                                                policy)
    plan = make_plan(net, steps, capacity, policy)
    twice = set(plan.host_inputs) | set(plan.outputs)
    blob_bytes = sum(net.blobs[n].nbytes * (2 if n in twice else 1) for n in walked(plan))
    one_batch = inputs["data"].nbytes + inputs["label"].nbytes
    batches = loader_batches(2)
    figure = host_memory(plan, kind, batches)
    assert batches == 4 and figure.batch_count == 4
    assert figure.home_bytes == blob_bytes and figure.batches == 4 * one_batch
    pool = plan.capacity if kind == "cpu" else 0
    assert figure.pool == pool
    kernels = CPU_KERNEL_BYTES if kind == "cpu" else 0     # the run's one-time cost: cpu only
    assert figure.kernels == kernels
    assert figure.total == blob_bytes + pool + 4 * one_batch + kernels
    locked = sum(net.blobs[n].nbytes * (2 if n in twice else 1) for n in walked_crossing(plan))
    assert figure.pinned == (locked if kind == "cuda" else 0)
    assert 0 < locked <= blob_bytes
    assert figure.pageable == figure.total - figure.pinned
    text = figure.describe()
    assert text.startswith(f"{format_bytes(figure.total)} (pinned ") and "blob homes of" in text
    assert ("pool (host RAM on cpu)" in text) == (kind == "cpu")
    assert ("kernels (Numba's JIT and the cpu kernels, once)" in text) == (kind == "cpu")
    assert host_memory(plan, kind).total == blob_bytes + pool + kernels
    with pytest.raises(ValueError, match="cpu or cuda"):
        host_memory(plan, "tpu")


def test_lms_on_trains_the_weights_of_lms_off_and_of_the_resident_executor():
    """Lazy homes change nothing that is computed: LMS on (Caffe's default, in its least pool)
    and LMS off give the resident executor's losses and weights, bit for bit."""
    batches = [batch(2, 2, 6, classes=3, seed=s) for s in (0, 1)]
    solver = lambda: SGD(0.05, momentum=0.9)  # noqa: E731
    expected = reference(DAG, batches, solver)
    net = make_net(DAG, batches[0])
    steps = net.schedule(("momentum",))
    for policy, capacity in ((Policy(), least_pool(net, steps)),
                             (Policy(enabled=False), resident_bytes(net, steps))):
        with make_device("cpu", capacity) as device:
            executor = LmsExecutor(make_net(DAG, batches[0]), device, solver(), policy)
            assert_identical(train(executor, batches), expected)


def test_the_resident_executor_syncs_homes_into_being_as_the_host_needs_them():
    inputs = batch(2, 2, 6, classes=3)
    with make_device("cpu", 64 * MiB) as device:
        executor = ResidentExecutor(make_net(DAG, inputs), device, SGD(0.05, momentum=0.9))
        executor.iterate(inputs)
        roles = {b.role for b in executor.blobs.values() if b.has_home}
        assert "workspace" not in roles and "param_grad" not in roles
        loss = executor.blobs["loss"]
        assert loss.has_home and np.isfinite(loss.host_data()).all()


# -- the lazy home in Blob -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_blob_has_no_home_until_one_is_needed(kind):
    with new_device(kind, 1 * MiB) as device:
        blob = Blob(device, "x", (3, 5), np.float32, "workspace")
        assert not blob.has_home and blob.nbytes == 60
        fill(blob.mutable_device_data(overwrite=True), 1.0)   # a kernel writes it: no home
        assert not blob.has_home and "no home" in repr(blob)
        blob.release(needed_later=False)                       # dead: dropped, still none
        assert not blob.has_home and blob.state is State.UNINITIALIZED
        np.testing.assert_array_equal(blob.host_data(), 0)    # read of nothing: zeros
        assert blob.has_home and blob.state is State.HOST


@pytest.mark.parametrize("kind", KINDS)
def test_the_raw_host_copy_of_a_blob_without_one_is_never_garbage(kind):
    """``blob.host`` on a blob with no home: zeros while uninitialized (the state stays), the
    device's data when the head is there (copied home: synced)."""
    with new_device(kind, 1 * MiB) as device:
        empty = Blob(device, "e", (4,), np.float32)
        np.testing.assert_array_equal(empty.host, 0)
        assert empty.state is State.UNINITIALIZED and empty.has_home
        dirty = Blob(device, "d", (4,), np.float32)
        device.h2d(dirty.mutable_device_data(overwrite=True), np.arange(4, dtype=np.float32))
        assert not dirty.has_home
        np.testing.assert_array_equal(dirty.host, np.arange(4))
        assert dirty.state is State.SYNCED
        np.testing.assert_array_equal(device.to_host(dirty.device_data()), np.arange(4))


@pytest.mark.parametrize("kind", KINDS)
def test_a_swap_out_without_a_home_makes_one_and_loses_nothing(kind):
    with new_device(kind, 1 * MiB) as device:
        blob = Blob(device, "a", (2, 3), np.float32)
        device.h2d(blob.mutable_device_data(overwrite=True), np.full((2, 3), 7, np.float32))
        assert blob.release(needed_later=True) == "swap_out"
        assert blob.has_home and blob.state is State.HOST
        np.testing.assert_array_equal(blob.host_data(), 7)
        np.testing.assert_array_equal(device.to_host(blob.device_data()), 7)


def test_ensure_home_allocates_once_and_keeps_the_state():
    with new_device("cpu", 1 * MiB) as device:
        blob = Blob(device, "p", (3,), np.float32, "param")
        home = blob.ensure_home()
        assert blob.ensure_home() is home and blob.state is State.UNINITIALIZED
        blob.mutable_host_data()[...] = 2
        assert blob.host is home and (home == 2).all()


def test_fill_gives_the_initial_values_bit_for_bit():
    """``ParamSpec.fill`` writes in pieces what ``initial`` made in one piece before (normal
    draws in float64, scaled, rounded): the same bits, for shapes above and below a chunk."""
    for shape, init in (((64, 3, 7, 7), "he"), ((1000, 64), "xavier"), ((5,), "he"),
                        ((3, 3), "zeros"), ((2,), "ones")):
        spec = ParamSpec("w", shape, init, fan_in=9, fan_out=4)
        std = np.sqrt(2.0 / 9) if init == "he" else np.sqrt(2.0 / 13)
        rng = np.random.default_rng(7)
        before = (rng.standard_normal(shape) * std).astype(np.float32) if init in ("he", "xavier") \
            else np.full(shape, 0.0 if init == "zeros" else 1.0, np.float32)
        out = spec.fill(np.empty(shape, np.float32), np.random.default_rng(7))
        assert np.array_equal(out.view(np.uint32), before.view(np.uint32))
        assert np.array_equal(spec.initial(np.random.default_rng(7)).view(np.uint32),
                              before.view(np.uint32))
    with pytest.raises(ValueError, match="C-contiguous"):
        ParamSpec("w", (4, 4), "he").fill(np.empty((4, 8), np.float32)[:, ::2],
                                          np.random.default_rng(0))


@pytest.mark.cuda
def test_only_what_crosses_the_link_is_page_locked_in_one_arena_for_every_program(monkeypatch):
    """On cuda: the parameters and optimizer state a step moves and every per-iteration home
    are page-locked, nothing else; the per-iteration homes of all programs (batches of 4, a
    smaller last batch of 3, evaluation) come out of one arena allocated once, as large as the
    largest program's; no page-locked memory is allocated after the first program. The kernels
    are counted, not run (``counting_launches(run=False)``): this is about host memory."""
    from minilms.kernels.common import counting_launches
    batches = [batch(4, 3, 32, 4, 0), batch(4, 3, 32, 4, 1), batch(3, 3, 32, 4, 2)]
    net = make_net(RESNET, batches[0])
    capacity = int(1.3 * least_pool(net, net.schedule(("momentum",))))
    with new_device("cuda", capacity) as device, counting_launches(run=False):
        locked = []
        alloc_host = device.alloc_host

        def recorded(shape, dtype, page_locked=False):
            if page_locked:
                locked.append(int(np.prod(shape)) * np.dtype(dtype).itemsize)
            return alloc_host(shape, dtype, page_locked)
        monkeypatch.setattr(device, "alloc_host", recorded)
        executor = LmsExecutor(make_net(RESNET, batches[0]), device, SGD(0.01, momentum=0.9))
        first = list(locked)
        for inputs in batches:
            executor.iterate(inputs)
            plan = executor.plan
            assert {n for n, b in executor.blobs.items() if b.page_locked} == \
                walked_crossing(plan) | {n for n in plan.chunks if n in walked(plan)}
            assert not any(executor.blobs[n].page_locked for n in homes(plan)
                           if n not in walked_crossing(plan))
            assert set(crossing(plan)) == walked_crossing(plan)
        executor.iterate(batches[0], train=False)
        assert len(executor.programs) == 3 and locked == first
        arena, ring = executor.arena.nbytes, executor.ring.nbytes
        for program in executor.programs.values():
            twice = set(program.plan.host_inputs) | set(program.plan.outputs)
            per_iteration = [program.blobs[n].nbytes for n in homes(program.plan)
                             if n not in executor.shared and n not in twice]
            assert sum(per_iteration) <= arena
            assert 2 * sum(program.blobs[n].nbytes for n in twice) <= ring
        moved_state = {n for program in executor.programs.values()
                       for n in crossing(program.plan) if n in executor.shared}
        swapped_state = sum(executor.shared[n].nbytes for n in moved_state)
        assert sum(first) == arena + ring + swapped_state
    resident = resident_bytes(net, net.schedule(("momentum",)))
    with new_device("cuda", resident) as device, counting_launches(run=False):
        off = LmsExecutor(make_net(RESNET, batches[0]), device, SGD(0.01, momentum=0.9),
                          Policy(enabled=False))
        off.iterate(batches[0])
        locked_off = {n for n, b in off.blobs.items() if b.page_locked}
        assert locked_off == set(off.plan.host_inputs) | set(off.plan.outputs) | {"loss.grad"}
        figure = host_memory(off.plan, "cuda")       # the parameters' homes are not pinned
        # each of them twice: the ring's two homes
        assert figure.pinned == 2 * sum(off.blobs[n].nbytes for n in locked_off) < \
            figure.home_bytes
        assert off.ring.nbytes >= figure.pinned


@pytest.mark.slow
def test_the_kernels_term_is_what_a_run_adds_to_a_fresh_process_once():
    """The figure's kernels term is one measured constant, not a sum over the plan: here against
    what a run really leaves in a fresh process once its objects are freed (``bench_host_memory``'s
    child: Numba's JIT started, the kernels loaded from the cache, the threads' buffers). A small
    net loads fewer kernels than the full-size ones the constant was measured on: loosely."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_host_memory.py"
    done = subprocess.run([sys.executable, str(script), "--child", "off", "--depth", "18",
                           "--width", "4", "--image-size", "32", "--batch", "4", "--classes", "10",
                           "--iters", "1"], capture_output=True, text=True, check=True)
    kept = json.loads(done.stdout.strip().splitlines()[-1])["after"]
    assert 0.7 <= kept / CPU_KERNEL_BYTES <= 1.3, kept / 2**20
