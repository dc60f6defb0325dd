"""Where the time goes (``Trace.time_table``, ``--table``): on a real training run the per-layer
times add up to the phases, the phases fit in the iterations' wall time and the types add up
the layers, and the first iteration (the warm-up) is kept apart from the mean of the others; on
a trace built by hand from known step times every mean and share, the first iteration's and a
lone iteration's, is the one worked out below; the folded middle of a long run keeps its times;
a version 1 file (no step times) loads and says so; ``--top`` leaves out what it says it does."""
import copy
import json

import pytest

from minilms import events, trace
from minilms.commands.common import run
from minilms.device import make_device
from minilms.lms import LmsExecutor, Policy, ResidentExecutor, make_plan
from minilms.net import Net
from minilms.solver import SGD
from minilms.trace.command import main as command_main

from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)
from .test_executor import batch
from .test_trace import SMALL_CNN, make_net

TIME_SECTIONS = ("time          per training iteration", "iteration (wall)",
                 "time per layer, ms per iteration", "time by layer type")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Five training iterations and one evaluation of the small CNN under LMS, seen by a
    recorder that keeps everything and one that folds the middle iterations away."""
    inputs = batch(2, 3, 8, classes=4)
    net = make_net(SMALL_CNN, inputs)
    with make_device("cpu", 2**20) as device:
        with trace.record() as full, trace.record(max_events=400) as bounded:
            executor = LmsExecutor(net, device, SGD(0.1, momentum=0.9), Policy(prefetch=1))
            for i in range(6):
                executor.iterate(inputs, train=i != 4)
    path = bounded.save(tmp_path_factory.mktemp("timed") / "trace.json")
    return full, bounded, path


def test_layers_add_up_to_the_phases_and_the_phases_fit_in_the_wall_time(recorded):
    tr = recorded[0]
    phase, rows = tr.time_by_phase(), tr.time_table()
    first, every = tr.time_by_phase(which="first"), tr.time_by_phase(which="all")
    assert (phase.kind, phase.iterations, phase.warmup) == ("train", 4, False)  # after the first
    assert (first.iterations, first.warmup, every.iterations, every.warmup) == (1, True, 5, True)
    for which, counted in (("steady", phase), ("first", first), ("all", every)):
        layers = tr.time_table(which=which)
        for name in ("forward", "backward", "update"):
            assert sum(getattr(r, name) for r in layers) == pytest.approx(getattr(counted, name))
            assert getattr(counted, name) > 0
        assert 0 < counted.steps <= counted.wall and counted.stall >= 0
        assert counted.outside >= 0
    walls = [e.detail["end"] - e.detail["start"] for e in tr.events
             if e.kind == "iteration" and e.who == "train"]
    assert phase.wall == pytest.approx(sum(walls[1:]) / 4) and first.wall == walls[0]
    assert every.wall == pytest.approx(sum(walls) / 5)
    for name in ("forward", "backward", "update", "stall"):
        assert getattr(every, name) == \
            pytest.approx((getattr(first, name) + 4 * getattr(phase, name)) / 5)
    kernels = [e for e in tr.events if e.kind == "kernel"]
    lone = tr.time_by_phase("eval")             # the only evaluation: its warm-up counted
    assert (lone.iterations, lone.warmup) == (1, True) and lone == tr.time_by_phase("eval", "all")
    assert sum(e.detail["end"] - e.detail["start"] for e in kernels) == \
        pytest.approx(first.steps + 4 * phase.steps + lone.steps)   # every step counted once
    assert [r.total for r in rows] == sorted((r.total for r in rows), reverse=True)
    assert {r.layer for r in rows} == {layer["name"] for layer in SMALL_CNN}
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    updated = {r.layer for r in rows if r.update}
    assert updated == {"conv1", "fc"}           # the layers with parameters
    evaluation = tr.time_table("eval")
    assert evaluation and not any(r.backward or r.update for r in evaluation)
    # every copy that ended in an iteration counted in its own: the trainings' and the lone
    # evaluation's add up to the copy events (none ends between iterations here)
    for direction in ("h2d", "d2h"):
        copies = [e for e in tr.events if e.kind == "copy" and e.detail["direction"] == direction]
        counted = [dict((d, (b, t)) for d, b, t in p.copies).get(direction, (0, 0.0))
                   for p in (first, phase, lone)]
        assert counted[0][0] + 4 * counted[1][0] + counted[2][0] == \
            pytest.approx(sum(e.nbytes for e in copies)) and counted[1][0] > 0
        assert counted[0][1] + 4 * counted[1][1] + counted[2][1] == pytest.approx(
            sum(e.detail["end"] - e.detail["start"] for e in copies))


def test_types_add_up_their_layers_and_the_text_names_every_type(recorded):
    tr = recorded[0]
    rows, types = tr.time_table(), tr.time_by_type()
    assert tr.layer_types == {layer["name"]: layer["type"] for layer in SMALL_CNN}
    assert sorted(t.type for t in types) == sorted({r.type for r in rows})
    for row in types:
        mine = [r for r in rows if r.type == row.type]
        assert row.layers == len(mine)
        for name in ("forward", "backward", "update", "total", "share"):
            assert getattr(row, name) == pytest.approx(sum(getattr(r, name) for r in mine))
    text = tr.summary(table=True)
    assert "in (H2D)" in text                   # the memory table is still there
    for section in TIME_SECTIONS:
        assert section in text
    first = tr.time_by_phase(which="first").wall
    assert (f"time          per training iteration (the mean of 4, after the first: "
            f"{first * 1e3:.3f} ms, warm-up, left out): ") in text
    assert "(not counted: 1 evaluation)" in text
    layer_part = text.split("time per layer")[1]
    for row in rows:
        assert row.layer in layer_part and row.type in layer_part


def test_the_folded_middle_of_a_long_run_keeps_its_times(recorded):
    full, bounded, path = recorded
    assert any(e.kind == "gap" for e in bounded.events)
    loaded = trace.load_trace(path)
    for tr in (bounded, loaded):
        for kind in ("train", "eval"):
            for which in ("steady", "first", "all"):
                assert tr.time_table(kind, which) == full.time_table(kind, which)
                assert tr.time_by_phase(kind, which) == full.time_by_phase(kind, which)
    assert loaded.layer_types == full.layer_types
    assert loaded.summary(table=True) == bounded.summary(table=True)


def test_the_command_prints_the_time_tables_and_top_leaves_out_the_rest(recorded, capsys):
    tr, path = recorded[1], recorded[2]
    assert run(command_main, [str(path.parent), "--table"]) == 0
    out = capsys.readouterr().out
    for section in TIME_SECTIONS:
        assert section in out
    assert "more layer" not in out              # five layers, fewer than the default 20
    assert run(command_main, [str(path), "--table", "--top", "2"]) == 0
    out = capsys.readouterr().out
    rows, steps = tr.time_table(), tr.time_by_phase().steps
    rest = sum(r.total for r in rows[2:])
    assert (f"({len(rows) - 2} more layers left out: {rest * 1e3:.3f} ms per iteration, "
            f"{100 * rest / steps:.1f}% of the steps' time; --top 0 shows all)") in out
    layer_part = out.split("time per layer")[1].split("time by layer type")[0]
    assert "(2 of 5 layers)" in layer_part
    assert all(r.layer in layer_part for r in rows[:2])
    assert not any(f"\n  {r.layer} " in layer_part for r in rows[2:])
    assert run(command_main, [str(path), "--table", "--top", "0"]) == 0
    assert "(5 of 5 layers)" in capsys.readouterr().out
    for argv in ([str(path), "--top", "3"], [str(path), "--table", "--top", "-1"]):
        with pytest.raises(SystemExit) as done:
            command_main(argv)
        assert done.value.code == 2
    assert "--top goes with --table" in capsys.readouterr().err


def test_a_trace_without_step_times_loads_and_says_so(recorded, tmp_path, capsys):
    """A version 1 file (written before step times were kept) loads; its time tables say there
    are none. A version 2 file must hold them."""
    document = json.loads(recorded[2].read_text())
    old = copy.deepcopy(document)
    old["version"] = 1
    del old["totals"]["times"], old["totals"]["times_first"], old["totals"]["times_pending"]
    for plan in old["plans"]:
        del plan["types"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    loaded = trace.load_trace(path)
    assert loaded.time_table() == [] and loaded.time_by_phase() is None
    assert loaded.time_by_type() == [] and loaded.layer_types == {}
    text = loaded.summary(table=True)
    assert "no step times in this trace" in text and "in (H2D)" in text
    assert loaded.peak == recorded[1].peak
    assert run(command_main, [str(path), "--table"]) == 0
    assert "no step times in this trace" in capsys.readouterr().out
    again = trace.load_trace(loaded.save(tmp_path / "again.json"))      # saved as version 2
    assert "no step times in this trace" in again.summary(table=True)
    old["version"] = 2
    path.write_text(json.dumps(old))
    with pytest.raises(trace.TraceError, match=r"malformed: totals\.times: expected .*, found "
                                               r"nothing"):
        trace.load_trace(path)
    old["version"], old["totals"]["times"] = 2, document["totals"]["times"]    # no first
    path.write_text(json.dumps(old))
    with pytest.raises(trace.TraceError, match=r"malformed: totals\.times_first: expected .*, "
                                               r"found nothing"):
        trace.load_trace(path)
    old["version"] = 1
    path.write_text(json.dumps(old))
    with pytest.raises(trace.TraceError, match=r"malformed: totals\.times_first: expected step "
                                               r"times, as totals\.times holds, found nothing"):
        trace.load_trace(path)
    old["version"] = 3
    path.write_text(json.dumps(old))
    with pytest.raises(trace.TraceError, match="trace format version 3, this minilms reads "
                                               "versions 1, 2$"):
        trace.load_trace(path)
    broken = copy.deepcopy(document)
    broken["totals"]["times"]["train"]["steps"]["conv1"]["sideways"] = [1.0, 1]
    path.write_text(json.dumps(broken))
    with pytest.raises(trace.TraceError, match=r"totals\.times\['train'\]\.steps\['conv1'\] "
                                               r"\(a key\): expected a step kind"):
        trace.load_trace(path)
    broken = copy.deepcopy(document)
    broken["totals"]["times_first"]["train"]["iterations"] = 2
    path.write_text(json.dumps(broken))
    with pytest.raises(trace.TraceError, match=r"totals\.times_first\['train'\]\.iterations: "
                                               r"expected 1 \(one iteration\), found 2"):
        trace.load_trace(path)
    del broken["totals"]["times_first"]["train"]
    path.write_text(json.dumps(broken))
    with pytest.raises(trace.TraceError, match=r"totals\.times \(a key\): expected a kind whose "
                                               r"first iteration times_first holds, found 'train'"):
        trace.load_trace(path)


def test_a_trace_without_a_plan_has_times_but_no_layer_types():
    inputs = batch(2, 3, 8, classes=4)
    net = make_net(SMALL_CNN, inputs)
    with make_device("cpu", 2**20) as device:
        executor = ResidentExecutor(net, device, SGD(0.1))
        with trace.record() as tr:
            executor.iterate(inputs)
    assert tr.layer_types == {} and {r.type for r in tr.time_table()} == {"(unknown)"}
    assert "(no plan in this trace names the layers' types)" in tr.summary(table=True)


# -- known step times, by hand ------------------------------------------------------------------
U = 2.0 ** -10      # the unit of time below: every sum and mean of it is exact in floating point
CRAFTED = [
    {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "c1", "num_output": 4,
     "kernel_size": 3, "pad": 1},
    {"name": "relu1", "type": "ReLU", "bottom": "c1", "top": "c1"},
    {"name": "conv2", "type": "Convolution", "bottom": "c1", "top": "c2", "num_output": 4,
     "kernel_size": 3, "pad": 1},
    {"name": "relu2", "type": "ReLU", "bottom": "c2", "top": "c2"},
    {"name": "fc", "type": "InnerProduct", "bottom": "c2", "top": "fc", "num_output": 4},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"},
]
# (phase, layer): units in training iterations 0 (the warm-up, as a first iteration compiles), 1, 2
STEPS = {("forward", "conv1"): (200, 4, 6), ("forward", "relu1"): (1, 1, 1),
         ("forward", "conv2"): (40, 3, 3), ("forward", "relu2"): (1, 1, 3),
         ("forward", "fc"): (10, 2, 2), ("forward", "loss"): (5, 1, 1),
         ("backward", "loss"): (1, 1, 1), ("backward", "fc"): (6, 2, 2),
         ("update", "fc"): (4, 2, 2), ("backward", "relu2"): (1, 1, 1),
         ("backward", "conv2"): (30, 5, 7), ("update", "conv2"): (2, 1, 1),
         ("backward", "relu1"): (1, 1, 1), ("backward", "conv1"): (24, 8, 8),
         ("update", "conv1"): (2, 1, 1)}
STALL = {0: ("forward", "conv1", 5), 2: ("backward", "conv2", 2)}   # iteration: before, units
OUTSIDE = 3                               # units of each iteration in no step


def crafted_trace(training: int = 3, copies: dict | None = None) -> trace.Trace:
    """``training`` training iterations (the first ones of STEPS) and one evaluation, their
    steps, stalls and iterations emitted by hand with the times above, after the plan that names
    the layers' types; ``copies``: by training iteration, its copies' ``(direction, bytes,
    units)``, each emitted at the iteration's start."""
    inputs = batch(2, 3, 8, classes=4)
    net = make_net(CRAFTED, inputs)
    plan = make_plan(net, net.schedule(("momentum",)), 2**22)
    clock = [1.0]

    def span(units):
        start = clock[0]
        clock[0] += units * U
        return start, clock[0]

    with trace.record() as tr:
        events.emit("plan", "crafted", plan.capacity, plan=plan, net=net, train=True)
        for iteration in range(training):
            begin = clock[0]
            for direction, nbytes, units in (copies or {}).get(iteration, ()):
                start, end = span(units)
                events.emit("copy", "c1", nbytes, direction=direction, start=start, end=end,
                            stream=direction)
            for index, ((phase, layer), units) in enumerate(STEPS.items()):
                if STALL.get(iteration, ())[:2] == (phase, layer):
                    start, end = span(STALL[iteration][2])
                    events.emit("stall", f"{phase} {layer}", step=index, start=start, end=end)
                start, end = span(units[iteration])
                events.emit("kernel", f"{phase} {layer}", layer=layer, phase=phase, step=index,
                            start=start, end=end, stream="compute")
            span(OUTSIDE)
            events.emit("iteration", "train", index=iteration, start=begin, end=clock[0])
        begin = clock[0]
        start, end = span(64)
        events.emit("kernel", "forward conv1", layer="conv1", phase="forward", step=0,
                    start=start, end=end, stream="compute")
        events.emit("iteration", "eval", index=training, start=begin, end=span(6)[1])
    return tr


# The first training iteration, worked out from STEPS' first column: conv1 200 + 24 + 2 = 226,
# conv2 40 + 30 + 2 = 72, fc 10 + 6 + 4 = 20, loss 5 + 1 = 6, relu1 1 + 1 = 2, relu2 1 + 1 = 2;
# the steps 328 (forward 257, backward 63, update 8); stalled 5; wall 328 + 5 + 3 = 336.
FIRST = trace.PhaseTime("train", 1, True, 336 * U, 257 * U, 0.0, 63 * U, 8 * U, 5 * U)
FIRST_LAYERS = [trace.LayerTime(layer, kind, f * U, 0.0, b * U, u * U, (f + b + u) / 328)
                for layer, kind, f, b, u in [
                    ("conv1", "Convolution", 200, 24, 2), ("conv2", "Convolution", 40, 30, 2),
                    ("fc", "InnerProduct", 10, 6, 4), ("loss", "SoftmaxWithLoss", 5, 1, 0),
                    ("relu1", "ReLU", 1, 1, 0), ("relu2", "ReLU", 1, 1, 0)]]
FIRST_TYPES = [trace.TypeTime("Convolution", 2, 240 * U, 0.0, 54 * U, 4 * U, 298 / 328),
               trace.TypeTime("InnerProduct", 1, 10 * U, 0.0, 6 * U, 4 * U, 20 / 328),
               trace.TypeTime("SoftmaxWithLoss", 1, 5 * U, 0.0, U, 0.0, 6 / 328),
               trace.TypeTime("ReLU", 2, 2 * U, 0.0, 2 * U, 0.0, 4 / 328)]
EVALUATION = trace.PhaseTime("eval", 1, True, 70 * U, 64 * U, 0.0, 0.0, 0.0, 0.0)   # the only one


def test_known_step_times_give_the_means_and_shares_worked_out_by_hand(tmp_path, capsys):
    """Means per training iteration after the first (the warm-up), in units U, from STEPS'
    iterations 1 and 2: conv1 forward (4+6)/2 = 5, backward 8, update 1: 14; relu1 1+1 = 2;
    conv2 3+6+1 = 10; relu2 2+1 = 3; fc 2+2+2 = 6; loss 1+1 = 2; the steps 37 (forward 14,
    backward 19, update 4). Walls: 34 + 3 = 37 and 40 + 2 (stall) + 3 = 45, mean 41; stalled 1;
    outside 41 - 37 - 1 = 3. The first iteration (FIRST) counts only when asked for, or in all
    three; the evaluation's 64 units of conv1 count nowhere."""
    tr = crafted_trace()
    assert tr.time_by_phase() == trace.PhaseTime("train", 2, False, 41 * U, 14 * U, 0.0, 19 * U,
                                                 4 * U, U)
    expected = [("conv1", "Convolution", 5, 8, 1), ("conv2", "Convolution", 3, 6, 1),
                ("fc", "InnerProduct", 2, 2, 2), ("relu2", "ReLU", 2, 1, 0),
                ("relu1", "ReLU", 1, 1, 0), ("loss", "SoftmaxWithLoss", 1, 1, 0)]
    assert tr.time_table() == [trace.LayerTime(layer, kind, f * U, 0.0, b * U, u * U,
                                               (f + b + u) / 37)
                               for layer, kind, f, b, u in expected]
    assert tr.time_by_type() == [
        trace.TypeTime("Convolution", 2, 8 * U, 0.0, 14 * U, 2 * U, 24 / 37),
        trace.TypeTime("InnerProduct", 1, 2 * U, 0.0, 2 * U, 2 * U, 6 / 37),
        trace.TypeTime("ReLU", 2, 3 * U, 0.0, 2 * U, 0.0, 5 / 37),
        trace.TypeTime("SoftmaxWithLoss", 1, U, 0.0, U, 0.0, 2 / 37)]
    assert tr.time_by_phase(which="first") == FIRST
    assert tr.time_table("train", "first") == FIRST_LAYERS
    assert tr.time_by_type(which="first") == FIRST_TYPES
    every = tr.time_by_phase(which="all")       # (336 + 2 * 41) / 3, not exact: approx
    assert (every.kind, every.iterations, every.warmup) == ("train", 3, True)
    for name in ("wall", "forward", "backward", "update", "stall"):
        assert getattr(every, name) == pytest.approx((getattr(FIRST, name) +
                                                      2 * getattr(tr.time_by_phase(), name)) / 3)
    assert [r.total for r in tr.time_table(which="all")] == pytest.approx(
        [u * U for u in ((226 + 28) / 3, (72 + 20) / 3, (20 + 12) / 3, (6 + 4) / 3,
                         (2 + 6) / 3, (2 + 4) / 3)])   # conv1, conv2, fc, loss, relu2, relu1
    assert tr.time_by_phase("eval") == EVALUATION == tr.time_by_phase("eval", "first")
    with pytest.raises(ValueError, match="which: expected one of steady, first, all"):
        tr.time_table(which="warm")

    # The file holds the first iteration apart from the others.
    totals = json.loads(tr.save(tmp_path / "trace.json").read_text())["totals"]
    assert totals["times_first"]["train"]["wall"] == 336 * U
    assert totals["times_first"]["train"]["steps"]["conv1"]["forward"] == [200 * U, 1]
    assert totals["times"]["train"]["iterations"] == 2 and totals["times"]["train"]["wall"] == \
        82 * U and totals["times"]["train"]["steps"]["conv1"]["forward"] == [10 * U, 2]
    assert "eval" in totals["times_first"] and "eval" not in totals["times"]

    # The text, its figures in ms (U = 0.9765625 ms), rounded half to even at the third decimal.
    loaded = trace.load_trace(tmp_path / "trace.json")
    assert run(command_main, [str(tmp_path), "--table", "--top", "4"]) == 0
    out = capsys.readouterr().out
    assert out == tr.summary(table=True, top=4) + "\n" == loaded.summary(table=True, top=4) + "\n"
    lines = [line.split() for line in out.splitlines()]
    assert ("time          per training iteration (the mean of 2, after the first: 328.125 ms, "
            "warm-up, left out): 40.039 ms wall, 36.133 ms in steps, 0.977 ms stalled (not "
            "counted: 1 evaluation)") in out
    for row in (["forward", "13.672", "34.1%"], ["backward", "18.555", "46.3%"],
                ["update", "3.906", "9.8%"],
                ["stalled", "(waiting", "for", "copies)", "0.977", "2.4%"],
                ["outside", "the", "steps", "2.930", "7.3%"],
                ["iteration", "(wall)", "40.039", "100.0%"],
                ["conv1", "Convolution", "4.883", "7.812", "0.977", "13.672", "37.8%"],
                ["conv2", "Convolution", "2.930", "5.859", "0.977", "9.766", "27.0%"],
                ["fc", "InnerProduct", "1.953", "1.953", "1.953", "5.859", "16.2%"],
                ["relu2", "ReLU", "1.953", "0.977", "-", "2.930", "8.1%"],
                ["Convolution", "2", "7.812", "13.672", "1.953", "23.438", "64.9%"],
                ["ReLU", "2", "2.930", "1.953", "-", "4.883", "13.5%"],
                ["SoftmaxWithLoss", "1", "0.977", "0.977", "-", "1.953", "5.4%"]):
        assert row in lines, row
    assert ("  (2 more layers left out: 3.906 ms per iteration, 10.8% of the steps' time; "
            "--top 0 shows all)") in out
    assert "(4 of 6 layers)" in out and ["relu1", "ReLU", "0.977", "0.977", "-", "1.953",
                                         "5.4%"] not in lines
    assert ("  (1 more layer left out: 1.953 ms per iteration, 5.4% of the steps' time; "
            "--top 0 shows all)") in tr.summary(table=True, top=5)


MiB = 2**20
COPIES = {0: [("d2h", 4 * MiB, 200)], 1: [("h2d", 2 * MiB, 1), ("d2h", 4 * MiB, 2)],
          2: [("h2d", 2 * MiB, 3), ("d2h", 4 * MiB, 2)]}


def test_the_copies_per_iteration_keep_the_first_apart(tmp_path):
    """Each direction's bytes and seconds per iteration, the mean after the first (H2D 2 MiB in
    (1 + 3) / 2 = 2 units, D2H 4 MiB in 2) and the first's alone (D2H 4 MiB in 200 units: a first
    iteration's copies home into pages never touched run slow, and a rate over the run mixes
    it in); saved and loaded; a file written before they were kept loads without them."""
    tr = crafted_trace(copies=COPIES)
    assert tr.time_by_phase().copies == (("h2d", 2 * MiB, 2 * U), ("d2h", 4 * MiB, 2 * U))
    assert tr.time_by_phase(which="first").copies == (("d2h", 4 * MiB, 200 * U),)
    every = tr.time_by_phase(which="all").copies
    assert [(d, b) for d, b, _ in every] == [("h2d", 4 * MiB / 3), ("d2h", 4 * MiB)]
    assert [s for _, _, s in every] == pytest.approx([4 * U / 3, 204 * U / 3])
    assert tr.time_by_phase("eval").copies == ()
    text = tr.summary(table=True)
    assert ("  copies per iteration: H2D 2.00 MiB in 1.953 ms (1.07 GB/s), D2H 4.00 MiB in "
            "1.953 ms (2.15 GB/s)\n  copies in the first (left out): D2H 4.00 MiB in 195.312 ms "
            "(0.0215 GB/s)\n") in text
    assert "0 B" not in text.split("copies per iteration")[1].split("\n\n")[0]
    path = tr.save(tmp_path / "trace.json")
    loaded = trace.load_trace(path)
    assert loaded.summary(table=True) == text
    assert loaded.time_by_phase() == tr.time_by_phase()
    document = json.loads(path.read_text())
    totals = document["totals"]
    for times in (*totals["times"].values(), *totals["times_first"].values(),
                  totals["times_pending"]):
        del times["copies"]
    path.write_text(json.dumps(document))
    older = trace.load_trace(path)
    assert older.time_by_phase().copies == () and "copies per iteration" not in \
        older.summary(table=True)
    assert older.time_by_phase().wall == tr.time_by_phase().wall
    totals["times"]["train"]["copies"] = {"h2d": [1, 0.5], "d2h": ["1", 0.5]}
    path.write_text(json.dumps(document))
    with pytest.raises(trace.TraceError, match=r"totals\.times\['train'\]\.copies\.d2h\[0\]: "
                                               r"expected a byte count"):
        trace.load_trace(path)
    one_way = crafted_trace(training=1, copies={0: [("h2d", MiB, 4)]})
    assert "copies in the first" not in one_way.summary(table=True)   # it is the one counted
    assert "  copies per iteration: H2D 1.00 MiB in 3.906 ms" in one_way.summary(table=True)


def test_a_lone_iteration_is_counted_warm_up_included_and_says_so():
    """With one training iteration there is nothing after the first: every table is that one
    (FIRST, worked out above), whichever iterations are asked for, and the text says so."""
    tr = crafted_trace(training=1)
    for which in ("steady", "first", "all"):
        assert tr.time_by_phase(which=which) == FIRST
        assert tr.time_table(which=which) == FIRST_LAYERS
        assert tr.time_by_type(which=which) == FIRST_TYPES
    assert tr.time_by_phase("eval") == EVALUATION
    out = tr.summary(table=True)
    assert ("time          per training iteration (the only one, warm-up included): 328.125 ms "
            "wall, 320.312 ms in steps, 4.883 ms stalled (not counted: 1 evaluation)") in out
    lines = [line.split() for line in out.splitlines()]
    for row in (["forward", "250.977", "76.5%"], ["iteration", "(wall)", "328.125", "100.0%"],
                ["conv1", "Convolution", "195.312", "23.438", "1.953", "220.703", "68.9%"],
                ["Convolution", "2", "234.375", "52.734", "3.906", "291.016", "90.9%"]):
        assert row in lines, row


@pytest.mark.cuda
@pytest.mark.simulator_slow
@pytest.mark.usefixtures("small_gemm_tile")
def test_on_cuda_every_step_is_timed_by_device_events():
    """On ``cuda`` a step's time comes from CUDA events read after the iteration synchronized
    (``bench_cuda.py --gpu-steps`` ranks kernels by it): every step of every iteration gets one
    kernel event on the compute stream in step order, and the time tables add up as on the cpu
    device; on a GPU the steps' times also follow one another inside the iteration's wall time
    (the simulator's events keep no time)."""
    from .conftest import CUDA_SIMULATED
    from .devices import new_device
    inputs = batch(2, 3, 8, classes=4)
    net = Net(SMALL_CNN, {k: (v.shape, v.dtype) for k, v in inputs.items()}, device_kind="cuda")
    with new_device("cuda", 2**20) as device:
        executor = LmsExecutor(net, device, SGD(0.1, momentum=0.9), Policy(prefetch=1))
        executor.iterate(inputs)
        with trace.record(executor=executor) as tr:
            for _ in range(2):
                executor.iterate(inputs)
    steps = len(executor.plan.steps)
    kernels = [e for e in tr.events if e.kind == "kernel"]
    iterations = [e for e in tr.events if e.kind == "iteration"]
    assert len(iterations) == 2 and len(kernels) == 2 * steps
    for n, it in enumerate(iterations):
        mine = kernels[n * steps:(n + 1) * steps]
        assert [e.detail["step"] for e in mine] == list(range(steps))
        assert all(e.detail["stream"] == "compute" for e in mine)
        if CUDA_SIMULATED:      # the simulator's events keep no time (elapsed_time is -1.0)
            continue
        for earlier, later in zip(mine, mine[1:]):
            assert earlier.detail["start"] <= earlier.detail["end"] <= later.detail["start"]
        assert it.detail["start"] <= mine[0].detail["start"] <= mine[-1].detail["end"] \
            <= it.detail["end"]
    layers, phase = tr.time_table(), tr.time_by_phase()
    assert sum(r.forward + r.backward + r.update for r in layers) == pytest.approx(phase.steps)
    assert "time by layer type" in tr.summary(table=True)
