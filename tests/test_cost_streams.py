"""The cost model's timeline runs copies as the executor does: a stream each way, so a swap-out
and a load overlap, except where the load writes the space the swap-out reads (or reads the home
it writes), and a step waits for the copies still using the space it writes."""
import pytest

from minilms.lms.cost import CostModel, Streams
from minilms.lms.plan import Action, StepPlan
from minilms.net import Step

# 1 s a step's fixed cost, no FLOPs or bytes counted; a copy of 100 bytes takes 1 s
MODEL = CostModel(1e12, 1e12, 100.0, "test", 0.0, 0.0)


def run(steps, seconds=1.0):
    streams = Streams(MODEL)
    for step_plan in steps:
        streams.step(step_plan, seconds)
    return streams


def out(blob, offset):
    return Action.make("swap_out", blob, 100, offset, 256)


def load(blob, offset, for_step=None):
    return Action.make("swap_in", blob, 100, offset, 256, for_step=for_step)


def test_a_swap_out_and_a_load_elsewhere_overlap():
    streams = run([StepPlan(Step(0, "forward", "a"), [out("x", 0)], [load("y", 1024)], [])])
    assert streams.starts == [1.0]          # the load took 1 s, beside the swap-out
    assert streams.copies == 2.0 and streams.moved == 200


def test_a_load_into_the_space_a_swap_out_reads_waits_for_it():
    streams = run([StepPlan(Step(0, "forward", "a"), [out("x", 0)], [load("y", 0)], [])])
    assert streams.starts == [2.0]


def test_a_load_of_the_blob_a_swap_out_sends_home_waits_for_it():
    steps = [StepPlan(Step(0, "forward", "a"), [out("x", 0)], [load("x", 1024)], [])]
    assert run(steps).starts == [2.0]


def test_a_step_writing_space_a_copy_still_uses_waits():
    """Step 0 swaps ``x`` out (1 s) and computes at once; step 1 allocates where ``x`` was: it
    waits for the swap-out only if it had not ended (a 0.5 s step 0: yes; 2 s: no)."""
    def steps():
        return [StepPlan(Step(0, "forward", "a"), [out("x", 0)], [], []),
                StepPlan(Step(1, "forward", "b"), [],
                         [Action.make("alloc", "y", 100, 0, 256)], [])]
    assert run(steps(), seconds=0.5).starts == [0.0, 1.0]
    assert run(steps(), seconds=2.0).starts == [0.0, 2.0]


def test_prefetches_queue_behind_the_loads_and_end_the_iteration():
    steps = [StepPlan(Step(0, "forward", "a"), [], [load("y", 0)], [load("z", 1024, 1)]),
             StepPlan(Step(1, "forward", "b"), [], [], [])]
    streams = run(steps)
    assert streams.starts == [1.0, 2.0]     # z landed at 2 s, under step 0
    timeline = streams.finish([out("y", 0)])
    assert timeline.seconds == pytest.approx(4.0)   # y home after the last step (3 s) + 1 s
    assert timeline.copy_seconds == pytest.approx(3.0)


# -- a host that queues the steps and runs ahead of the device (the cuda model) --------------------

def run_ahead(steps, device, host):
    streams = Streams(CostModel(1e12, 1e12, 100.0, "test", 0.0, 0.0, host_runs_ahead=True))
    for step_plan in steps:
        streams.step(step_plan, device, host)
    return streams


def plain(n):
    return [StepPlan(Step(i, "forward", f"s{i}"), [], [], []) for i in range(n)]


def test_a_host_slower_than_the_device_sets_the_pace_without_stalls():
    streams = run_ahead(plain(3), device=1.0, host=2.0)
    assert streams.starts == [2.0, 4.0, 6.0]     # each step once the host has queued it
    assert streams.stalls == [0.0, 0.0, 0.0]     # waiting on the host is no wait for copies
    assert streams.finish([]).seconds == pytest.approx(7.0)


def test_a_faster_host_runs_ahead_and_its_time_is_hidden():
    streams = run_ahead(plain(3), device=1.0, host=0.5)
    assert streams.starts == [0.5, 1.5, 2.5]
    assert streams.finish([]).seconds == pytest.approx(3.5)     # added up: 4.5
    assert run([StepPlan(Step(i, "forward", "s"), [], [], []) for i in range(3)],
               seconds=1.5).finish([]).seconds == pytest.approx(4.5)


def test_a_copy_begins_once_the_host_has_queued_it():
    streams = run_ahead([StepPlan(Step(0, "forward", "a"), [], [load("y", 0)], [])],
                        device=1.0, host=2.0)
    assert streams.starts == [3.0] and streams.stalls == [1.0]   # queued at 2 s, landed at 3 s


def test_the_cuda_model_runs_its_host_ahead_and_the_cpu_model_adds_it():
    from minilms import zoo
    from minilms.net import Net
    net = Net(zoo.lenet(num_classes=10), {"data": ((2, 1, 28, 28), "float32"),
                                          "label": ((2,), "int32")})
    step = net.schedule()[0]
    for kind, ahead in (("cuda", True), ("cpu", False)):
        model = CostModel.for_device(kind)
        host, device = model.step_parts(net, step)
        assert model.host_runs_ahead == ahead
        assert host + device == pytest.approx(model.step_seconds(net, step))
        assert host == (model.step_seconds_fixed if ahead else 0.0)


def test_a_gpu_step_is_the_larger_of_its_flop_and_memory_times_the_cpu_adds_them():
    """A roofline on a GPU (its loads run under its arithmetic), the sum on the cpu device: a
    step whose FLOP time and memory time are both known, at rates made to give round numbers."""
    from minilms import zoo
    from minilms.net import Net
    net = Net(zoo.lenet(num_classes=10), {"data": ((2, 1, 28, 28), "float32"),
                                          "label": ((2,), "int32")})
    step = next(s for s in net.schedule() if net.layer[s.layer].type == "Convolution")
    flops = net.layer[step.layer].flops()
    touched = sum(net.blobs[name].nbytes for name in set(step.blobs))
    for roofline, expected in ((True, 3.0), (False, 5.0)):
        model = CostModel(flops / 2.0, touched / 3.0, 1.0, "test", 0.0, 0.0, roofline=roofline)
        assert model.step_seconds(net, step) == pytest.approx(expected)
