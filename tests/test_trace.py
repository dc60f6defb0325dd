"""The memory microscope: a trace's numbers are the pool's and the plan's own, its exports are
valid (the Trace Event Format's rules, a picture with what it promises), it survives saving, the
command reads it with one-line errors, a long run stays bounded without losing a byte of its
totals, recording costs little, and the ``limit_device_memory`` marker fails what it should."""
import copy
import json
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from minilms import trace, zoo
from minilms.commands.common import run
from minilms.device import make_device
from minilms.layers.run import LayerRun
from minilms.lms import LmsExecutor, Policy, least_pool
from minilms.net import Net, build_layer
from minilms.solver import SGD
from minilms.trace.command import main as command_main

from .test_executor import batch

pytest_plugins = ["pytester"]

SMALL_CNN = [
    {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "conv1", "num_output": 8,
     "kernel_size": 3, "pad": 1},
    {"name": "relu1", "type": "ReLU", "bottom": "conv1", "top": "conv1"},
    {"name": "pool1", "type": "Pooling", "bottom": "conv1", "top": "pool1", "pool": "max",
     "kernel_size": 2, "stride": 2},
    {"name": "fc", "type": "InnerProduct", "bottom": "pool1", "top": "fc", "num_output": 4},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"},
]


def make_net(layers, inputs):
    return Net(layers, {k: (v.shape, v.dtype) for k, v in inputs.items()})


@pytest.fixture(scope="module")
def capped():
    """ResNet-18 at 1/16 width, batch 4 of 32x32, in the least pool LMS needs: recorded from
    the executor's construction through two iterations, then a third recorded on its own."""
    layers = zoo.resnet(18, num_classes=4, width=16)
    inputs = batch(4, 3, 32, classes=4)
    net = make_net(layers, inputs)
    least = least_pool(net, net.schedule(("momentum",)))
    with make_device("cpu", least) as device:
        device.pool.reset_peak()
        with trace.record() as whole:
            executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), Policy(prefetch=1))
            for _ in range(2):
                executor.iterate(inputs)
        whole_stats = device.pool.stats()
        device.pool.reset_peak()
        with trace.record(executor=executor) as one:
            executor.iterate(inputs)
        one_stats = device.pool.stats()
        yield SimpleNamespace(whole=whole, one=one, whole_stats=whole_stats,
                              one_stats=one_stats, plan=executor.plan, least=least,
                              capacity=device.pool.capacity)


# -- the numbers are the pool's and the plan's -------------------------------------------------
def test_traced_peak_and_use_are_the_pools_own(capped):
    for tr, stats in ((capped.whole, capped.whole_stats), (capped.one, capped.one_stats)):
        assert tr.peak == stats.peak and tr.in_use == stats.in_use
        assert sum(tr.at_peak.values()) == tr.peak
        assert set(tr.at_peak) <= set(trace.ROLE_ORDER) and "other" not in tr.peak_by_role
        assert tr.capacity == capped.capacity
    assert capped.whole.peak == capped.capacity     # the least pool is used to the last byte


def test_the_peak_is_attributed_to_the_step_it_was_staged_for(capped):
    tr, plan = capped.whole, capped.plan
    index = tr.peak_step_index
    assert tr.peak_step == plan.steps[index].step.name
    biggest = tr.biggest_at_peak(1)[0][0]
    assert biggest in plan.steps[index].step.blobs      # the peak's biggest blob is that step's
    assert plan.steps[index].in_use == tr.peak


def test_one_iteration_moves_the_bytes_the_plan_predicted(capped):
    tr, plan = capped.one, capped.plan
    assert tr.bytes_h2d == plan.bytes_moved("h2d") > 0
    assert tr.bytes_d2h == plan.bytes_moved("d2h") > 0
    ran = {d: sum(e.nbytes for e in tr.events if e.kind == "copy"
                  and e.detail["direction"] == d) for d in ("h2d", "d2h")}
    assert ran == {"h2d": tr.bytes_h2d, "d2h": tr.bytes_d2h}     # what was issued, ran
    rows = tr.layer_table()
    assert sum(r.h2d for r in rows) == tr.bytes_h2d and sum(r.d2h for r in rows) == tr.bytes_d2h
    assert [r.layer for r in rows][:3] == ["conv1", "conv1_bn", "pool1"]   # schedule order
    assert tr.iterations == 1 and capped.whole.iterations == 2
    assert tr.stall_seconds == pytest.approx(sum(e.detail["end"] - e.detail["start"]
                                                 for e in tr.events if e.kind == "stall"))


def test_least_pool_is_computed_only_on_request(capped):
    tr = capped.whole
    assert "least pool not computed" in tr.summary()
    assert tr.least_pool == capped.least
    text = tr.summary(table=True)
    assert "the planner's least pool" in text and "100.0% of the least pool" in text
    assert f"at step {tr.peak_step_index} ({tr.peak_step})" in text
    assert "layer" in text and "in (H2D)" in text and "pinned" in text


def test_a_trace_started_mid_run_knows_what_the_pool_held():
    """Pinned blobs placed by the prologue, before the trace began: named and given roles from
    the executor, and the per-layer table's pinned column is the plan's."""
    inputs = batch(2, 3, 8, classes=4)
    net = make_net(SMALL_CNN, inputs)
    policy = Policy(min_swap_bytes=1024, prefetch=1)
    with make_device("cpu", 2**20) as device:
        executor = LmsExecutor(net, device, SGD(0.1, momentum=0.9), policy)
        executor.iterate(inputs)
        device.pool.reset_peak()
        with trace.record(executor=executor) as tr:
            executor.iterate(inputs)
        assert tr.peak == device.pool.peak and tr.in_use == device.pool.in_use
    plan = executor.plan
    assert plan.pinned and "(before the trace)" not in str(tr.biggest_at_peak(50))
    assert "other" not in tr.at_peak
    pinned = sum(plan.blobs[name].nbytes for name in plan.pinned)
    assert sum(r.pinned for r in tr.layer_table()) == pinned
    with make_device("cpu", 2**20) as device:      # without the executor: inferred, unnamed
        executor = LmsExecutor(net, device, SGD(0.1, momentum=0.9), policy)
        executor.iterate(inputs)
        device.pool.reset_peak()
        with trace.record() as blind:
            executor.iterate(inputs)
        assert blind.peak == device.pool.peak and blind.at_peak["other"] > 0


def test_one_layers_forward_is_traced_outside_any_step():
    layer = build_layer({"name": "conv", "type": "Convolution", "bottom": "x", "top": "y",
                         "num_output": 4, "kernel_size": 3}, "layer")
    with make_device("cpu", 2**20) as device:
        run_ = LayerRun(device, layer, [(2, 3, 8, 8)])
        with trace.record() as tr:
            run_.forward([np.ones((2, 3, 8, 8), np.float32)])
        assert tr.peak == device.pool.peak and tr.peak_step is None
    assert {"input", "param", "activation"} <= set(tr.at_peak)    # roles from h2d/d2h
    assert "outside any step" in tr.summary() and tr.bytes_h2d > 0
    assert tr.plot().axes                                         # no iterations: the whole trace


# -- exports ------------------------------------------------------------------------------------
REQUIRED = ("name", "ph", "ts", "pid", "tid")


def assert_valid_chrome_trace(document) -> None:
    """The Trace Event Format's rules for what we emit: the JSON object form; per event the
    required fields; X with a duration; C with numeric args; M naming a process or thread; and
    on each thread, slices that nest (none overlaps another partially)."""
    assert set(document) >= {"traceEvents", "displayTimeUnit"}
    assert document["displayTimeUnit"] in ("ms", "ns")
    by_thread: dict = {}
    for event in document["traceEvents"]:
        for key in REQUIRED:
            assert key in event, f"{key} missing from {event}"
        assert isinstance(event["name"], str) and isinstance(event["ts"], (int, float))
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        phase = event["ph"]
        assert phase in ("X", "C", "M", "i"), phase
        if phase == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0
            by_thread.setdefault((event["pid"], event["tid"]), []).append(
                (event["ts"], event["ts"] + event["dur"]))
        elif phase == "C":
            assert event["args"] and all(isinstance(v, (int, float))
                                         for v in event["args"].values())
        elif phase == "M":
            assert event["name"] in ("process_name", "thread_name", "process_sort_index",
                                     "thread_sort_index")
            assert "name" in event["args"] or "sort_index" in event["args"]
        elif phase == "i":
            assert event.get("s", "t") in ("g", "p", "t")
    tolerance = 1e-6   # microseconds: float rounding of ts + dur
    for thread, spans in by_thread.items():
        stack: list = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + tolerance:
                stack.pop()
            assert not stack or end <= stack[-1] + tolerance, \
                f"partial overlap on thread {thread}: [{start}, {end}] crosses {stack[-1]}"
            stack.append(end)


def test_chrome_trace_follows_the_format(capped, tmp_path):
    tr = capped.whole
    path = tmp_path / "trace.chrome.json"
    tr.to_chrome(path)
    document = json.loads(path.read_text())
    assert_valid_chrome_trace(document)
    slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
    kinds = [e.kind for e in tr.events]
    assert sum(e["cat"].startswith("step") for e in slices) == kinds.count("kernel")
    assert sum(e["cat"] in ("h2d", "d2h") for e in slices) == kinds.count("copy")
    threads = {e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert {"compute stream (steps, stalls)", "H2D stream", "D2H stream"} <= threads
    tids = {e["cat"]: e["tid"] for e in slices if e["cat"] in ("h2d", "d2h")}
    assert tids["h2d"] != tids["d2h"]                    # one thread per copy stream
    counters = [e for e in document["traceEvents"] if e["ph"] == "C"]
    assert max(sum(e["args"].values()) for e in counters) == tr.peak   # stacked, to the byte


def test_picture_is_written_and_shows_what_it_promises(capped, tmp_path):
    from matplotlib.collections import PolyCollection
    tr = capped.whole
    path = tmp_path / "memory.png"
    figure = tr.plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 30_000
    memory, lanes = figure.axes
    labels = [line.get_label() for line in memory.get_lines()]
    assert any(label.startswith("capacity") for label in labels)
    assert any(label.startswith("planner's least pool") for label in labels)
    capacity = next(line for line in memory.get_lines() if line.get_label().startswith("cap"))
    assert capacity.get_ydata()[0] == pytest.approx(capped.capacity / 1024)   # KiB scale
    stacked = [c for c in memory.collections if isinstance(c, PolyCollection)
               and not c.get_label().startswith("_")]
    roles = {label.replace(" ", "_") for label in (c.get_label() for c in stacked)}
    assert len(stacked) == len(roles) and roles == set(tr.timeline().by_role)
    assert {"activation", "workspace", "input"} <= roles
    assert [t.get_text() for t in lanes.get_yticklabels()] == ["stall", "D2H", "H2D", "steps"]
    assert "peak" in memory.get_title(loc="left")
    assert tr.plot(iteration=0, axis="time").axes[1].get_xlabel() == "time (ms)"
    with pytest.raises(trace.TraceError, match="iteration 5: the trace keeps 2 iterations"):
        tr.plot(iteration=5)


# -- saving and the command -------------------------------------------------------------------
def test_save_and_load_keep_every_number(capped, tmp_path):
    tr = capped.whole
    _ = tr.least_pool
    path = tr.save(tmp_path / "trace.json")
    document = json.loads(path.read_text())
    assert document["format"] == "minilms-trace"
    plan_events = [e for e in document["events"] if e[0] == "plan"]
    assert plan_events and plan_events[0][4] == {"plan": 0, "train": True}
    loaded = trace.load_trace(tmp_path)             # the run directory works too
    assert loaded.summary(table=True) == tr.summary(table=True)
    assert (loaded.peak, loaded.peak_step, loaded.least_pool, loaded.bytes_h2d) == \
        (tr.peak, tr.peak_step, capped.least, tr.bytes_h2d)
    assert loaded.to_chrome() == tr.to_chrome()
    assert loaded.save(tmp_path / "again.json").read_text() == path.read_text()


def test_command_reads_a_trace_file_and_a_run_directory(capped, tmp_path, capsys):
    capped.one.save(tmp_path / "trace.json")
    png, chrome = tmp_path / "m.png", tmp_path / "c.json"
    assert run(command_main, [str(tmp_path / "trace.json"), "--png", str(png), "--chrome",
                            str(chrome), "--table"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("minilms trace: iterations train 1") and "in (H2D)" in out
    assert png.stat().st_size > 10_000
    assert_valid_chrome_trace(json.loads(chrome.read_text()))
    assert run(command_main, [str(tmp_path)]) == 0
    assert "peak" in capsys.readouterr().out


def test_command_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    (tmp_path / "bad.json").write_text('{"format": "minilms-trace", "version": 1, ')
    (tmp_path / "other.json").write_text('{"traceEvents": []}')
    (tmp_path / "short.json").write_text('{"format": "minilms-trace", "version": 1}')
    cases = {tmp_path / "missing.json": "missing.json: no such file",
             tmp_path: "trace.json: no such file",
             tmp_path / "bad.json": "bad JSON",
             tmp_path / "other.json": "not a minilms trace (no \"format\"",
             tmp_path / "short.json": "not a minilms trace: malformed"}
    for path, expected in cases.items():
        assert run(command_main, [str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and expected in err and err.count("\n") == 1, err
    done = subprocess.run([sys.executable, "-m", "minilms.trace", str(tmp_path / "bad.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr


@pytest.fixture(scope="module")
def small_document(tmp_path_factory):
    """A saved trace of two iterations of the small CNN (with a gap, a plan, copies, stalls),
    as the JSON document a test edits."""
    inputs = batch(2, 3, 8, classes=4)
    net = make_net(SMALL_CNN, inputs)
    with make_device("cpu", 2**20) as device:
        with trace.record(max_events=400) as tr:
            executor = LmsExecutor(net, device, SGD(0.1, momentum=0.9), Policy(prefetch=1))
            for _ in range(6):
                executor.iterate(inputs)
    path = tr.save(tmp_path_factory.mktemp("small") / "trace.json", least_pool=True)
    document = json.loads(path.read_text())
    assert {e[0] for e in document["events"]} >= {"alloc", "free", "copy", "kernel", "stall",
                                                   "iteration", "plan", "gap", "h2d", "d2h"}
    return document


def first_event(document, kind) -> list:
    return next(e for e in document["events"] if e[0] == kind)


def set_detail(kind, key, value):
    def edit(document):
        first_event(document, kind)[4][key] = value
    return edit


def set_key(*path_and_value):
    *path, value = path_and_value

    def edit(document):
        where = document
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
    return edit


def drop_key(*path):
    def edit(document):
        where = document
        for key in path[:-1]:
            where = where[key]
        del where[path[-1]]
    return edit


# Each: an edit of a good file, and what the one-line error must say (after the file's name).
MALFORMED = {
    "alloc offset a string": (set_detail("alloc", "offset", "12"),
                              r"events\[\d+\] \(alloc\) detail\.offset: expected an integer"
                              r".*, found '12'$"),
    "kernel start a list": (set_detail("kernel", "start", [1, 2]),
                            r"\(kernel\) detail\.start: expected a finite number, found \[1, 2\]"),
    "kernel step a float": (set_detail("kernel", "step", 1.5),
                            r"detail\.step: expected an integer"),
    "copy direction unknown": (set_detail("copy", "direction", "sideways"),
                               r"detail\.direction: expected 'h2d' or 'd2h', found 'sideways'"),
    "stall end infinite": (set_detail("stall", "end", float("inf")),
                           r"\(stall\) detail\.end: expected a finite number, found inf"),
    "iteration index a string": (set_detail("iteration", "index", "1"),
                                 r"\(iteration\) detail\.index: expected an integer"),
    "gap live a dict": (set_detail("gap", "live", {}), r"\(gap\) detail\.live: expected a list"),
    "h2d role unknown": (set_detail("h2d", "role", "weights"), r"detail\.role: expected a role"),
    "event bytes negative": (lambda d: d["events"][0].__setitem__(2, -5),
                             r"events\[0\]\[2\]: expected a byte count"),
    "event too short": (lambda d: d["events"][0].pop(), r"events\[0\]: expected an event"),
    "initial_live a string": (set_key("initial_live", "abc"),
                              r"initial_live: expected a list of \[offset, owner, bytes, role\]"),
    "initial_live bytes a string": (set_key("initial_live", [[0, "w", "x", "param"]]),
                                    r"initial_live\[0\]\[2\]: expected a byte count"),
    "roles a list": (set_key("roles", [1, 2]), r"roles: expected a role by blob name"),
    "a role unknown": (set_key("roles", {"data": "bogus"}), r"roles\['data'\]: expected a role"),
    "origin a string": (set_key("origin", "1.5"), r"origin: expected a finite number, found '1.5'"),
    "origin missing": (drop_key("origin"), r"origin: expected a finite number, found nothing"),
    "capacity_hint a string": (set_key("capacity_hint", "big"),
                               r"capacity_hint: expected a byte count .*, found 'big'"),
    "plan capacity a string": (set_key("plans", 0, "capacity", "big"),
                               r"plans\[0\]\.capacity: expected a byte count"),
    "plan pins an unsized blob": (set_key("plans", 0, "pinned", ["nowhere"]),
                                  r"plans\[0\]\.pinned: expected blobs the plan's sizes list"),
    "plan with a live net": (set_key("plans", 0, "live", [1, 2]),
                             r"plans\[0\]: expected only the keys .*, found 'live'"),
    "totals peak a string": (set_key("totals", "peak", "big"), r"totals\.peak: expected a byte"),
    "totals replacing the pool": (set_key("totals", "pool", None),
                                  r"totals: expected only the keys .*, found 'pool'"),
    "totals stall short": (set_key("totals", "stall", [0.0, 1]), r"totals\.stall: expected \["),
    "totals issued pair": (set_key("totals", "issued", "d2h", {"x": [1, None]}),
                           r"totals\.issued\.d2h\['x'\]\[1\]: expected an integer 0"),
    "totals role unknown": (set_key("totals", "at_peak", {"weights": 1}),
                            r"totals\.at_peak \(a key\): expected a role"),
    "totals times half": (set_key("totals", "last_time", None),
                          r"totals\.last_time: expected a time exactly when first_time is one"),
}
MALFORMED["free in_use missing"] = (
    lambda d: first_event(d, "free")[4].pop("in_use"),
    r"\(free\) detail\.in_use: expected a byte count .*, found nothing \(no such key\)$")


@pytest.mark.parametrize("case", MALFORMED)
def test_values_of_the_wrong_type_are_one_line_errors_at_load(small_document, tmp_path, capsys,
                                                               case):
    """Every field the readers use is checked when the file is loaded: a wrong one is a
    one-line TraceError naming the file and where in it, never a traceback while reading."""
    edit, expected = MALFORMED[case]
    document = copy.deepcopy(small_document)
    edit(document)
    path = tmp_path / "bad_trace.json"
    path.write_text(json.dumps(document))
    with pytest.raises(trace.TraceError) as error:
        trace.load_trace(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    assert re.search(expected, message), message
    assert run(command_main, [str(path)]) == 2          # what python -m minilms.trace prints
    assert capsys.readouterr().err == f"error: {message}\n"


def test_json_python_cannot_hold_is_a_one_line_error(tmp_path):
    for name, text in (("digits.json", '{"format": "minilms-trace", "origin": ' + "9" * 5000),
                       ("deep.json", "[" * 100_000)):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(trace.TraceError, match=f"^{re.escape(str(path))}: not a minilms "
                                                   "trace: (bad JSON|JSON nested too deeply)"):
            trace.load_trace(path)


def test_what_the_checks_accept_every_reader_can_read(small_document, tmp_path):
    """The other side of the checks: a file whose values have the right types, however odd
    (empty, zero, negative offsets, unknown event kinds), loads and is read without an error."""
    document = copy.deepcopy(small_document)
    document["events"].append(["state", "x", 0, 1.0, {"anything": [1]}])    # a kind not read
    first_event(document, "alloc")[4]["offset"] = -3
    document["initial_live"] = []
    document["capacity_hint"] = None
    document["plans"][0]["least_pool"] = None
    path = tmp_path / "odd_trace.json"
    path.write_text(json.dumps(document))
    loaded = trace.load_trace(path)
    assert loaded.summary(table=True).startswith("minilms trace")
    assert_valid_chrome_trace(loaded.to_chrome())
    assert loaded.plot(iteration=-1).axes and loaded.layer_table()


def test_the_checks_name_every_field_the_folds_and_plans_hold():
    """The file checks list the totals' and plans' fields by hand: they must be the fold's and
    PlanInfo's own, or a new field would load unchecked (or a good file be refused)."""
    from dataclasses import fields

    from minilms.trace import file_format
    from minilms.trace.fold import Fold, PlanInfo
    assert set(file_format.TOTALS_FIELDS) == set(Fold({}).to_json())
    assert set(file_format.PLAN_FIELDS) == {f.name for f in fields(PlanInfo)} - {"live"}


# -- long runs, cost --------------------------------------------------------------------------
def test_a_long_run_is_folded_into_its_totals_not_lost(tmp_path):
    """Two recorders see the same run: one keeps everything, the other at most 3000 events.
    Every total agrees; the bounded one keeps the first two iterations and the latest."""
    inputs = batch(2, 3, 8, classes=4)
    net = make_net(SMALL_CNN, inputs)
    with make_device("cpu", 2**20) as device:
        with trace.record() as full, trace.record(max_events=3000) as bounded:
            executor = LmsExecutor(net, device, SGD(0.1, momentum=0.9), Policy(prefetch=1))
            for i in range(40):
                executor.iterate(inputs, train=i % 10 != 9)
    assert len(bounded.events) < len(full.events) and len(bounded.events) <= 3000
    gaps = [e for e in bounded.events if e.kind == "gap"]
    assert len(gaps) == 1 and gaps[0].detail["iterations"] > 10
    kept = sum(e.kind == "iteration" for e in bounded.events)
    assert kept + gaps[0].detail["iterations"] == 40 == bounded.iterations
    for name in ("peak", "peak_step", "at_peak", "peak_by_role", "bytes_h2d", "bytes_d2h",
                 "stall_seconds", "in_use"):
        assert getattr(bounded, name) == getattr(full, name), name
    assert bounded.layer_table() == full.layer_table()
    line = bounded.timeline()
    assert line.gaps and max(sum(line.by_role.values())) <= bounded.peak
    loaded = trace.load_trace(bounded.save(tmp_path / "trace.json"))
    assert loaded.summary() == bounded.summary()
    assert_valid_chrome_trace(loaded.to_chrome())
    assert loaded.plot(iteration=-1).axes


def test_recording_costs_little():
    """Iteration time with and without recording, on a small CNN at batch 32 in a pool that
    makes LMS swap. Loose, never an absolute time: this machine is shared, and its copy thread
    makes iteration times jumpy, so up to three measurements are taken and the best counts
    (noise only ever makes one side slower; the events are the same each time)."""
    layers = [dict(SMALL_CNN[0], num_output=32)] + SMALL_CNN[1:]
    inputs = batch(32, 3, 32, classes=4)
    net = make_net(layers, inputs)
    capacity = int(1.2 * least_pool(net, net.schedule(("momentum",))))
    with make_device("cpu", capacity) as device:
        executor = LmsExecutor(net, device, SGD(0.01, momentum=0.9), Policy(prefetch=1))
        measured = []
        while len(measured) < 3 and (not measured or measured[-1].fraction >= 0.25):
            measured.append(trace.measure_overhead(lambda: executor.iterate(inputs), repeats=5))
    best = min(measured, key=lambda m: m.fraction)
    print(best)
    assert best.events_per_iteration > 100 and best.fraction < 0.25, \
        "; ".join(map(str, measured))


# -- the pytest marker ---------------------------------------------------------------------------
INNER_TESTS = '''
import numpy as np
import pytest
from minilms.device import make_device
from minilms.lms import LmsExecutor
from minilms.net import Net
from minilms.plan import Policy
from minilms.solver import SGD
from minilms.trace.command import main as command_main
from tests.test_trace import SMALL_CNN


def train_once():
    rng = np.random.default_rng(0)
    inputs = {"data": rng.standard_normal((2, 3, 8, 8)).astype(np.float32),
              "label": np.array([0, 1], np.int32)}
    net = Net(SMALL_CNN, {k: (v.shape, v.dtype) for k, v in inputs.items()})
    with make_device("cpu", 2**20) as device:
        LmsExecutor(net, device, SGD(0.1), Policy(prefetch=1)).iterate(inputs)


@pytest.mark.limit_device_memory("4 KiB")
def test_over_the_limit():
    train_once()


@pytest.mark.limit_device_memory("64 MiB")
def test_under_the_limit():
    train_once()


def test_unmarked():
    train_once()


@pytest.mark.limit_device_memory("lots")
def test_bad_limit():
    pass
'''


def test_the_marker_fails_a_test_over_its_limit_and_passes_one_under(pytester):
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_inprocess("-p", "tests.trace_fixture", "-q")
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*test_over_the_limit*",
        "device memory peak 25.50 KiB exceeds the limit 4.00 KiB (by 21.50 KiB), at step 10 "
        "(backward conv1); biggest blobs then: conv1.col 17.50 KiB (workspace), *",
        "FAILED test_inner.py::test_over_the_limit - *",
        "ERROR test_inner.py::test_bad_limit - Failed: limit_device_memory: expected a*",
    ])
