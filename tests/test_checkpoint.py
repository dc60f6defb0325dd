"""Checkpoints: exact round trips, ``latest``, atomicity under SIGKILL and under a crash between
the renames, one-line errors for broken files, and ``apply_weights``' checks (all or nothing)."""
import inspect
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from minilms.errors import MinilmsError
from minilms.training import checkpoint as checkpoint_module
from minilms.training.checkpoint import (
    CheckpointError,
    NoCheckpointError,
    apply_weights,
    load_checkpoint,
    load_weights,
    restore_rngs,
    save_checkpoint,
)
from minilms.training.retention import prune_checkpoints

ROOT = Path(__file__).resolve().parents[1]


def small_checkpoint():
    rng = np.random.default_rng(7)
    weights = {"conv1.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
               "conv1.bias": np.zeros(4, np.float32),
               "bn1.running_mean": rng.standard_normal(4),                  # float64
               "bn1.num_batches_tracked": np.array(12, np.int64),           # 0-d
               "empty.weight": np.zeros((0, 3), np.float32)}
    state = {"conv1.weight.momentum": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
             "conv1.bias.momentum": np.full(4, -0.0, np.float32)}
    meta = {"iteration": 120, "epoch": 3, "batch": 40, "solver": {"step": 121, "lr": 0.1 / 3},
            "config": "name: café\nsolver:\n  lr: 1e-3\n",
            "rng": {"data": np.random.default_rng(5).bit_generator.state}}
    return weights, state, meta


# The least trainer state a checkpoint holds: what Trainer.resume reads.
BARE = {"iteration": 0, "epoch": 0, "batch": 0, "rng": {}}


def assert_arrays_identical(found: dict, expected: dict):
    assert list(found) == list(expected)
    for name, array in expected.items():
        assert found[name].dtype == array.dtype and found[name].shape == array.shape, name
        assert found[name].tobytes() == array.tobytes(), name    # bit for bit (-0.0 included)


def assert_one_line(error, path):
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: expected "), message
    assert isinstance(error.value, MinilmsError)
    return message


# -- round trips -----------------------------------------------------------------------------------
def test_round_trip_is_exact_and_the_layout_is_plain(tmp_path):
    weights, state, meta = small_checkpoint()
    where = save_checkpoint(tmp_path / "run", "epoch-3", weights, state, meta)
    assert where == tmp_path / "run" / "epoch-3"
    assert sorted(os.listdir(where)) == ["state.npz", "trainer.json", "weights.npz"]
    assert (tmp_path / "run" / "latest").read_text() == "epoch-3\n"
    for path in (tmp_path / "run", where):                   # a run directory or a checkpoint
        loaded = load_checkpoint(path)
        assert loaded.path == where and loaded.tag == "epoch-3"
        assert_arrays_identical(loaded.weights, weights)
        assert_arrays_identical(loaded.state, state)
        assert loaded.meta == meta
    with np.load(where / "weights.npz", allow_pickle=False) as archive:     # readable by numpy
        assert sorted(archive.files) == sorted(weights)
    assert json.loads((where / "trainer.json").read_text())["format"] == "minilms-checkpoint/1"


def test_load_weights_takes_an_npz_a_checkpoint_or_a_run(tmp_path):
    weights, state, meta = small_checkpoint()
    where = save_checkpoint(tmp_path, "last", weights, state, meta)
    for path in (where / "weights.npz", where, tmp_path, str(tmp_path)):
        assert_arrays_identical(load_weights(path), weights)


def test_latest_names_the_newest_and_a_tag_saved_again_is_replaced(tmp_path):
    weights, state, meta = small_checkpoint()
    save_checkpoint(tmp_path, "last", weights, state, meta)
    save_checkpoint(tmp_path, "best", weights, state, {**meta, "iteration": 5})
    assert load_checkpoint(tmp_path).tag == "best"
    doubled = {name: array * 2 for name, array in weights.items()}
    save_checkpoint(tmp_path, "last", doubled, {}, {**meta, "iteration": 200})
    loaded = load_checkpoint(tmp_path)
    assert (loaded.tag, loaded.meta["iteration"], loaded.state) == ("last", 200, {})
    assert_arrays_identical(loaded.weights, doubled)
    assert sorted(os.listdir(tmp_path)) == ["best", "last", "latest"]


def test_generators_are_saved_as_their_states_and_restored(tmp_path):
    pcg, mersenne = np.random.default_rng(3), np.random.Generator(np.random.MT19937(4))
    pcg.random(5), mersenne.random(5)
    meta = {"iteration": 1, "epoch": 0, "batch": 1, "rng": {"data": pcg, "dropout": mersenne}}
    save_checkpoint(tmp_path, "last", {}, {}, meta)
    expected = pcg.random(3), mersenne.random(3)
    fresh = {"data": np.random.default_rng(99), "dropout": np.random.Generator(np.random.MT19937())}
    restore_rngs(fresh, load_checkpoint(tmp_path).meta["rng"])
    assert (fresh["data"].random(3) == expected[0]).all()
    assert (fresh["dropout"].random(3) == expected[1]).all()


def test_restoring_a_generator_that_was_not_saved_changes_none(tmp_path):
    saved = np.random.default_rng(1).bit_generator.state
    keep = np.random.default_rng(5)
    before = keep.bit_generator.state
    with pytest.raises(CheckpointError, match=r"^rng\.other: expected a saved generator state, "
                                              r"found none \(saved: data\)$"):
        restore_rngs({"data": keep, "other": np.random.default_rng()}, {"data": saved})
    assert keep.bit_generator.state == before
    with pytest.raises(CheckpointError, match="expected a MT19937 state, found 'PCG64'"):
        restore_rngs({"data": np.random.Generator(np.random.MT19937())}, {"data": saved})


@pytest.mark.parametrize("tag, weights, meta, found", [
    ("../escape", {}, BARE, "'../escape'"),
    ("latest", {}, BARE, "'latest'"),
    ("last.tmp-12", {}, BARE, "'last.tmp-12'"),
    ("last", {"a.b": np.array([object()])}, BARE, "dtype object"),
    ("last", {"file": np.zeros(1)}, BARE, "'file'"),
    ("last", {}, {"iteration": 0}, "no epoch, batch, rng"),
    ("last", {}, {**BARE, "when": object()}, "is not JSON"),
    ("last", {}, {**BARE, "iteration": "12"}, "iteration: expected an integer >= 0, found '12'"),
    ("last", {}, {**BARE, "rng": {"data": {"bit_generator": "PCG64", "state": 7}}},
     "rng.data: expected a valid PCG64 state"),
])
def test_what_cannot_be_saved_is_refused_before_anything_is_written(tmp_path, tag, weights, meta,
                                                                     found):
    with pytest.raises(CheckpointError, match=found):
        save_checkpoint(tmp_path / "run", tag, weights, {}, meta)
    assert not (tmp_path / "run").exists()


# -- atomicity -------------------------------------------------------------------------------------
def checkpoint_number(k: int):
    """Checkpoint ``k`` of the kill test (about 16 MiB), every array distinct for each ``k`` so a
    mix of two saves would show."""
    base = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)
    weights = {f"layer{j}.weight": base + (k * 8 + j) for j in range(2)}
    state = {f"layer{j}.weight.momentum": base - (k * 8 + j) for j in range(2)}
    tag = "best" if k % 3 == 0 else "last"
    return tag, weights, state, {"iteration": k, "epoch": k // 10, "batch": k % 10, "rng": {},
                                 "config": f"run {k}"}


SAVER = textwrap.dedent(inspect.getsource(checkpoint_number)) + textwrap.dedent("""
    import sys
    import numpy as np
    from minilms.training.checkpoint import save_checkpoint
    directory, k = sys.argv[1], int(sys.argv[2])
    print("ready", flush=True)
    while True:
        tag, weights, state, meta = checkpoint_number(k)
        save_checkpoint(directory, tag, weights, state, meta)
        print(k, flush=True)
        k += 1
""")


def test_a_process_killed_at_random_moments_never_leaves_a_broken_checkpoint(tmp_path):
    directory, chooser = tmp_path / "run", random.Random(20240607)
    last_reported = None                      # the newest save a child said it had completed
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    for kill in range(5):
        first = 1000 * (kill + 1)             # numbers no earlier child could have saved
        child = subprocess.Popen([sys.executable, "-c", SAVER, str(directory), str(first)],
                                 stdout=subprocess.PIPE, text=True, cwd=ROOT, env=environment)
        try:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(chooser.uniform(0.02, 0.6))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        reported = [int(line) for line in child.stdout.read().split()]
        child.stdout.close()
        if reported:
            last_reported = reported[-1]
        try:
            loaded = load_checkpoint(directory)
        except NoCheckpointError:
            assert last_reported is None, "a completed save was lost"
            continue
        k = loaded.meta["iteration"]
        assert last_reported is None or k >= last_reported
        tag, weights, state, meta = checkpoint_number(k)
        assert loaded.tag == tag and loaded.meta == meta
        assert_arrays_identical(loaded.weights, weights)
        assert_arrays_identical(loaded.state, state)
    tag, weights, state, meta = checkpoint_number(9)
    save_checkpoint(directory, tag, weights, state, meta)     # and it cleans up after them
    assert set(os.listdir(directory)) <= {"best", "last", "latest"}
    assert load_checkpoint(directory).meta == meta


class SimulatedCrash(BaseException):
    """Stands for a kill: not an Exception, so nothing on the way out handles it as an error."""


def test_a_crash_between_the_two_renames_leaves_the_old_checkpoint_loadable(tmp_path,
                                                                           monkeypatch):
    weights, state, meta = small_checkpoint()
    save_checkpoint(tmp_path, "last", weights, state, meta)
    real_replace = os.replace

    def replace_then_crash(source, destination):
        real_replace(source, destination)
        if Path(destination).name.startswith("last.old-"):
            raise SimulatedCrash

    monkeypatch.setattr(checkpoint_module.os, "replace", replace_then_crash)
    with pytest.raises(SimulatedCrash):
        save_checkpoint(tmp_path, "last", {}, {}, {**meta, "iteration": 999})
    monkeypatch.setattr(checkpoint_module.os, "replace", real_replace)
    assert not (tmp_path / "last").exists()
    loaded = load_checkpoint(tmp_path)                       # the old one, whole
    assert loaded.meta == meta and loaded.tag == "last"
    assert_arrays_identical(loaded.weights, weights)
    save_checkpoint(tmp_path, "best", weights, state, {**meta, "iteration": 1000})
    assert sorted(os.listdir(tmp_path)) == ["best", "last", "latest"]     # renamed back
    assert load_checkpoint(tmp_path / "last").meta == meta


def test_a_save_that_fails_half_way_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    weights, state, meta = small_checkpoint()
    save_checkpoint(tmp_path, "last", weights, state, meta)

    def full_disk(path, arrays):
        Path(path).write_bytes(b"PK\x03\x04 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "write_npz", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path, "last", weights, state, {**meta, "iteration": 999})
    assert sorted(os.listdir(tmp_path)) == ["last", "latest"]
    assert load_checkpoint(tmp_path).meta == meta


# -- broken files ----------------------------------------------------------------------------------
def write_object_array(path):
    np.savez(path, **{"conv1.weight": np.array([{"a": 1}], dtype=object)})


def write_npy(path):
    with open(path, "wb") as file:
        np.save(file, np.zeros(3))


def flip_a_data_byte(path):
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF                 # inside the first array's data: a CRC mismatch on reading
    path.write_bytes(bytes(data))


BREAKAGES = {
    "missing": (lambda path: path.unlink(), "found no such file"),
    "truncated": (lambda path: path.write_bytes(path.read_bytes()[:300]),
                  "found a file numpy cannot read"),
    "empty": (lambda path: path.write_bytes(b""), "found a file numpy cannot read"),
    "flipped byte": (flip_a_data_byte, "found a corrupt array 'conv1.weight'"),
    "pickle": (lambda path: path.write_bytes(pickle.dumps({"conv1.weight": [1.0]})),
               "found neither .npz nor .npy data"),
    "object array": (write_object_array, "found an object array 'conv1.weight'"),
    "npy": (write_npy, "found a single .npy array"),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
@pytest.mark.parametrize("file", ["weights.npz", "state.npz"])
def test_broken_archives_are_one_line_errors_naming_the_file(tmp_path, breakage, file):
    weights, state, meta = small_checkpoint()
    where = save_checkpoint(tmp_path, "last", weights, state, meta)
    if file == "state.npz" and breakage == "flipped byte":
        np.savez(where / file, **{"conv1.weight": np.zeros(1000)})    # give it a first array
    damage, found = BREAKAGES[breakage]
    damage(where / file)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path)
    assert found in assert_one_line(error, where / file)
    if file == "weights.npz":
        with pytest.raises(CheckpointError, match="^" + str(where / file)):
            load_weights(where / file)


@pytest.mark.parametrize("text, found", [
    ("{\"iteration\": 3,", "found invalid JSON (Expecting property name enclosed in double "
                           "quotes at line 1 column 17)"),
    ("[1, 2]", "found a JSON list"),
    ('{"format": "minilms-checkpoint/1", "epoch": 1}', "found no iteration"),
    ('{"iteration": 1, "epoch": 1}', "expected format 'minilms-checkpoint/1', found None"),
    (b"\xff\xfe{}", "found bytes that are not UTF-8 text"),
    ('{"iteration": ' + "9" * 5000 + "}", "found unreadable JSON (Exceeds the limit (4300 digits)"),
    ("[" * 100_000, "found unreadable JSON (maximum recursion depth exceeded"),
    (None, "found no such file"),
])
def test_broken_trainer_json_is_a_one_line_error(tmp_path, text, found):
    weights, state, meta = small_checkpoint()
    where = save_checkpoint(tmp_path, "last", weights, state, meta)
    path = where / "trainer.json"
    if text is None:
        path.unlink()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(where)
    assert found in assert_one_line(error, path)


def edit_trainer_json(path: Path, key: str, value) -> None:
    """Set ``key`` (``rng.dropout``: a generator's entry) of a saved trainer.json to ``value``, or
    remove it when ``value`` is ``...``."""
    data = json.loads(path.read_text())
    *parents, last = key.split(".")
    where = data
    for parent in parents:
        where = where[parent]
    if value is ...:
        del where[last]
    else:
        where[last] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("key, value, found", [
    ("rng", ..., "expected trainer state with iteration, epoch, batch, rng, found no rng"),
    ("batch", ..., "found no batch"),
    ("iteration", "12", "iteration: expected an integer >= 0, found '12'"),
    ("iteration", -1, "iteration: expected an integer >= 0, found -1"),
    ("epoch", "3", "epoch: expected an integer >= 0, found '3'"),
    ("epoch", 2.5, "epoch: expected an integer >= 0, found 2.5"),
    ("batch", True, "batch: expected an integer >= 0, found True"),
    ("rng", [1, 2], "rng: expected generator states by name (a JSON object), found [1, 2]"),
    ("rng.data", "garbage", "rng.data: expected a numpy bit generator's state"),
    ("rng.data.bit_generator", "Nope", "rng.data: expected a numpy bit generator's state"),
    ("rng.data.state", {"state": "x", "inc": 1}, "rng.data: expected a valid PCG64 state"),
    ("rng.data.state", {"state": -1, "inc": 1}, "rng.data: expected a valid PCG64 state"),
    ("config", 3, "config: expected the resolved config's text, found 3"),
    ("solver", [1], "solver: expected the solver's scalar state (a JSON object), found [1]"),
])
def test_every_field_of_the_trainer_state_is_checked_on_load(tmp_path, key, value, found):
    """What Trainer.resume reads (iteration, epoch, batch, rng) is checked when it is loaded: a
    string iteration is not carried into the run, a garbage generator state is not a traceback."""
    weights, state, meta = small_checkpoint()
    where = save_checkpoint(tmp_path, "last", weights, state, meta)
    path = where / "trainer.json"
    edit_trainer_json(path, key, value)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and found in message, message
    assert isinstance(error.value, MinilmsError)


def test_restoring_a_garbage_state_is_an_error_and_changes_nothing():
    keep, other = np.random.default_rng(5), np.random.default_rng(6)
    before = keep.bit_generator.state, other.bit_generator.state
    good = np.random.default_rng(1).bit_generator.state
    garbage = {**good, "state": {"state": "x", "inc": 1}}
    for states in ({"keep": good, "other": garbage}, {"keep": good, "other": None}, [good]):
        with pytest.raises(CheckpointError) as error:
            restore_rngs({"keep": keep, "other": other}, states, source="run/trainer.json")
        message = str(error.value)
        assert "\n" not in message and message.startswith("run/trainer.json: rng"), message
        assert (keep.bit_generator.state, other.bit_generator.state) == before


def test_no_checkpoint_is_reported_cleanly(tmp_path):
    for path in (tmp_path / "nowhere", tmp_path):
        with pytest.raises(NoCheckpointError) as error:
            load_checkpoint(path)
        assert_one_line(error, path)
    (tmp_path / "leftover.tmp-1").mkdir()                    # an interrupted first save
    with pytest.raises(NoCheckpointError, match="no checkpoint has been completed there"):
        load_checkpoint(tmp_path)


def test_latest_naming_what_is_not_there_is_an_error(tmp_path):
    (tmp_path / "latest").write_text("gone\n")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path)
    assert "found no such directory" in assert_one_line(error, tmp_path / "gone")
    (tmp_path / "latest").write_text("../../etc\n")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path)
    assert "found '../../etc'" in assert_one_line(error, tmp_path / "latest")


# -- retention -------------------------------------------------------------------------------------
def save_iterations(directory, *numbers, width: int = 7) -> dict:
    """A small checkpoint ``iter-<number>`` per number, saved in that order (the last is latest)."""
    weights = {"w": np.zeros(3, np.float32)}
    for number in numbers:
        save_checkpoint(directory, f"iter-{number:0{width}d}", weights, {},
                        {**BARE, "iteration": number})
    return {number: Path(directory) / f"iter-{number:0{width}d}" for number in numbers}


def test_prune_keeps_the_newest_by_number_the_best_and_latest(tmp_path):
    paths = save_iterations(tmp_path, 10, 20, 30, 40, 50)
    paths[100_000_000] = save_iterations(tmp_path, 100_000_000, width=9)[100_000_000]  # wider
    save_checkpoint(tmp_path, "last", {}, {}, BARE)                    # not an iter- tag
    (tmp_path / "iter-0000070.tmp-99999999").mkdir()                  # a save's leftovers
    (tmp_path / "iter-0000080.old-99999999").mkdir()
    (tmp_path / "latest").write_text("iter-0000020\n")                 # as if resumed from it
    assert prune_checkpoints(tmp_path, keep=2, best="iter-0000010") == [paths[30], paths[40]]
    assert sorted(os.listdir(tmp_path)) == [
        "iter-0000010", "iter-0000020", "iter-0000050", "iter-0000070.tmp-99999999",
        "iter-0000080.old-99999999", "iter-100000000", "last", "latest"]
    assert load_checkpoint(tmp_path).meta["iteration"] == 20
    assert prune_checkpoints(tmp_path, keep=1, best=None) == [paths[10], paths[50]]
    assert prune_checkpoints(tmp_path, keep=0, best=None) == [paths[100_000_000]]
    assert sorted(os.listdir(tmp_path)) == [
        "iter-0000020", "iter-0000070.tmp-99999999", "iter-0000080.old-99999999", "last",
        "latest"]
    assert prune_checkpoints(tmp_path, keep=5, best=None) == []
    assert load_checkpoint(tmp_path).meta["iteration"] == 20


def test_prune_never_counts_an_incomplete_directory_as_a_checkpoint(tmp_path):
    paths = save_iterations(tmp_path, 1, 2, 3)
    broken = tmp_path / "iter-0000009"                                # newest by number
    broken.mkdir()
    (broken / "trainer.json").write_text("{}")
    (tmp_path / "iter-0000008").write_text("a file, not a checkpoint directory")
    assert prune_checkpoints(tmp_path, keep=1, best=None) == [paths[1], paths[2], broken]
    assert sorted(os.listdir(tmp_path)) == ["iter-0000003", "iter-0000008", "latest"]
    assert load_checkpoint(tmp_path).tag == "iter-0000003"


def test_prune_removes_nothing_when_latest_cannot_be_read(tmp_path):
    save_iterations(tmp_path, 1, 2, 3)
    (tmp_path / "latest").write_text("../../etc\n")
    assert prune_checkpoints(tmp_path, keep=1, best=None) == []
    assert len(list(tmp_path.glob("iter-*"))) == 3
    with pytest.raises(ValueError, match="keep must be an integer >= 0"):
        prune_checkpoints(tmp_path, keep=-1, best=None)
    assert prune_checkpoints(tmp_path / "nowhere", keep=1, best=None) == []


def test_a_checkpoint_that_cannot_be_removed_is_named(tmp_path, monkeypatch):
    paths = save_iterations(tmp_path, 1, 2, 3)
    real_replace = os.replace

    def refuse_the_second(source, destination):
        if Path(source) == paths[2]:
            raise PermissionError(13, "Permission denied")
        real_replace(source, destination)

    monkeypatch.setattr(checkpoint_module.os, "replace", refuse_the_second)
    with pytest.raises(CheckpointError) as error:
        prune_checkpoints(tmp_path, keep=1, best=None)
    assert str(error.value) == (f"{paths[2]}: expected a checkpoint directory that can be "
                                "removed, found [Errno 13] Permission denied")
    assert sorted(os.listdir(tmp_path)) == ["iter-0000002", "iter-0000003", "latest"]


def test_a_prune_killed_mid_delete_leaves_only_whole_checkpoints(tmp_path, monkeypatch):
    paths = save_iterations(tmp_path, 1, 2, 3, 4)
    real_rmtree = checkpoint_module.shutil.rmtree

    def delete_one_file_then_crash(path, ignore_errors=False):
        if Path(path).exists():
            next(Path(path).iterdir()).unlink()
            raise SimulatedCrash

    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", delete_one_file_then_crash)
    with pytest.raises(SimulatedCrash):
        prune_checkpoints(tmp_path, keep=1, best=None)
    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", real_rmtree)
    left = sorted(os.listdir(tmp_path))
    assert [n for n in left if n.startswith("iter-") and "." not in n] == ["iter-0000004"]
    assert all(".tmp-" in n for n in left if n.startswith("iter-") and n != "iter-0000004")
    assert load_checkpoint(tmp_path).tag == "iter-0000004"
    save_iterations(tmp_path, 5)                                       # the next save cleans up
    assert sorted(os.listdir(tmp_path)) == ["iter-0000004", "iter-0000005", "latest"]
    assert not any(path.exists() for path in (paths[1], paths[2], paths[3]))


# -- apply_weights ---------------------------------------------------------------------------------
class FakeBlob:
    """What apply_weights needs of a Blob: shape, dtype, and the host copy."""

    def __init__(self, shape, dtype=np.float32):
        self.host = np.full(shape, -1, dtype)
        self.shape, self.dtype = self.host.shape, self.host.dtype

    def host_data(self):
        return self.host

    def mutable_host_data(self):
        return self.host


def fake_net():
    return {"conv1.weight": FakeBlob((2, 1, 3, 3)), "conv1.bias": FakeBlob((2,)),
            "fc.weight": FakeBlob((5, 8))}


def weights_for(blobs):
    return {name: np.arange(blob.host.size, dtype=blob.dtype).reshape(blob.shape)
            for name, blob in blobs.items()}


def untouched(blobs):
    return all((blob.host == -1).all() for blob in blobs.values())


def test_apply_weights_copies_every_array_into_its_blob():
    blobs = fake_net()
    weights = weights_for(blobs)
    applied = apply_weights(blobs, weights)
    assert applied == (list(blobs), [], [])
    for name, blob in blobs.items():
        assert (blob.host == weights[name]).all() and blob.host is not weights[name]


def test_apply_weights_names_a_missing_blob_and_writes_nothing():
    blobs = fake_net()
    weights = weights_for(blobs)
    del weights["conv1.bias"]
    with pytest.raises(CheckpointError, match=r"^runs/a/weights\.npz: expected an array for "
                                              r"every blob, found none for conv1\.bias$"):
        apply_weights(blobs, weights, source="runs/a/weights.npz")
    assert untouched(blobs)


def test_apply_weights_names_an_unexpected_key_with_a_did_you_mean():
    blobs = fake_net()
    weights = weights_for(blobs)
    weights["conv1.wieght"] = weights.pop("conv1.weight")
    with pytest.raises(CheckpointError) as error:
        apply_weights(blobs, weights)
    assert str(error.value) == ("conv1.wieght: expected a name of this net's blobs, found no such "
                                "blob; did you mean 'conv1.weight'?")
    assert untouched(blobs)


@pytest.mark.parametrize("name, array, found", [
    ("fc.weight", np.zeros((8, 5), np.float32), "float32 [8, 5]"),       # transposed layout
    ("conv1.bias", np.zeros(2, np.float64), "float64 [2]"),
])
def test_apply_weights_checks_shapes_and_dtypes_before_writing_anything(name, array, found):
    blobs = fake_net()
    weights = weights_for(blobs)
    weights[name] = array
    with pytest.raises(CheckpointError) as error:
        apply_weights(blobs, weights)
    expected = f"{blobs[name].dtype} {list(blobs[name].shape)}"
    assert str(error.value) == f"{name}: expected {expected}, found {found}"
    assert untouched(blobs)              # conv1.weight comes first and was not written either


def test_apply_weights_not_strict_skips_and_reports_what_does_not_match():
    blobs = fake_net()
    weights = weights_for(blobs)
    del weights["fc.weight"]
    weights["fc2.weight"] = np.zeros(3)
    applied = apply_weights(blobs, weights, strict=False)
    assert applied == (["conv1.weight", "conv1.bias"], ["fc.weight"], ["fc2.weight"])
    assert (blobs["fc.weight"].host == -1).all() and (blobs["conv1.bias"].host == [0, 1]).all()
    weights["conv1.bias"] = np.zeros(3, np.float32)
    with pytest.raises(CheckpointError, match=r"^conv1\.bias: expected float32 \[2\]"):
        apply_weights(blobs, weights, strict=False)


def test_weights_saved_from_blobs_load_back_into_them(tmp_path):
    source, target = fake_net(), fake_net()
    for name, array in weights_for(source).items():
        source[name].mutable_host_data()[...] = array
    saved = {name: blob.host_data() for name, blob in source.items()}
    save_checkpoint(tmp_path, "last", saved, {}, BARE)
    apply_weights(target, load_weights(tmp_path))
    assert all((target[name].host == source[name].host).all() for name in source)
