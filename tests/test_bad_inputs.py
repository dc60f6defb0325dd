"""A hostile but fair new user's corpus: broken configs, overrides, flags, data files, run
directories, checkpoints and trace files, each given to the real command (``python -m
minilms.train``, ``plan`` or ``trace``, run in-process through ``commands.common.run``, and a few
as real processes). Every one must end with exit code 2 and one line on stderr, no traceback,
that names where the mistake is (the file, with its line or key, or the flag), and must leave
nothing behind: the working directory and every input are as they were.

Each case builds its inputs under ``tmp_path`` and returns the command line; ``names`` are the
words the line must hold (a file name, ``:line:``, a key, a flag).
"""
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minilms.commands.common import run
from minilms.commands.plan import main as plan_main
from minilms.commands.train import main as train_main
from minilms.trace.command import main as trace_main

from .conftest import CUDA_SIMULATED

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = (ROOT / "configs" / "quickstart.yaml").read_text()
MAINS = {"train": train_main, "plan": plan_main, "trace": trace_main}
# A quick run: few images, no validation, two iterations.
QUICK = ["data.train_size=64", "data.val_size=0", "train.max_iters=2", "trace=false"]


def config(tmp_path, replace=None, text=None, name="bad.yaml") -> str:
    """The quickstart config, with ``replace`` (old, new) applied, or ``text``, written to
    ``tmp_path/name``."""
    body = text if text is not None else QUICKSTART
    if replace:
        old, new = replace
        assert old in body, old
        body = body.replace(old, new, 1)
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def quick(tmp_path, *extra) -> list:
    return [config(tmp_path, name="quick.yaml"), *QUICK, *extra]


def idx(array: np.ndarray, magic: int) -> bytes:
    return struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + \
        array.tobytes()


def written(path: Path, content) -> Path:
    """``path`` (its folders made) holding ``content``, text or bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def saved(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def mnist(tmp_path, images: bytes) -> list:
    """An MNIST folder with these image-file bytes and a good label file."""
    root = tmp_path / "mnist"
    written(root / "train-images-idx3-ubyte", images)
    written(root / "train-labels-idx1-ubyte", idx(np.zeros(2, np.uint8), 2049))
    return quick(tmp_path, "data.dataset=mnist", f"data.root={root}", "data.channels=1",
                 "data.image_size=28", "data.augment.crop_padding=0", "data.num_classes=null",
                 "model.layers[12].num_output=10")


def cifar(tmp_path) -> Path:
    """A CIFAR-10 folder whose batches are each five bytes short of two records."""
    for i in range(1, 6):
        written(tmp_path / "cifar" / f"data_batch_{i}.bin", bytes(3073 * 2 - 5))
    return tmp_path / "cifar"


def npz_data(tmp_path, labels=None, name="data.npz") -> Path:
    rng = np.random.default_rng(0)
    labels = np.arange(64) % 4 if labels is None else labels
    path = tmp_path / name
    np.savez(path, x_train=rng.integers(0, 256, (64, 3, 32, 32), dtype=np.uint8),
             y_train=labels, x_test=rng.integers(0, 256, (8, 3, 32, 32), dtype=np.uint8),
             y_test=np.arange(8) % 4)
    return path


def with_npz(tmp_path, path, *extra) -> list:
    return quick(tmp_path, "data.dataset=npz", f"data.root={path}", *extra)


def trained_run(tmp_path) -> Path:
    """A real run directory with one checkpoint, made by the command itself."""
    run_dir = tmp_path / "good_run"
    assert run(train_main, quick(tmp_path, f"run_dir={run_dir}", "--quiet")) == 0
    return run_dir


def break_meta(tmp_path, change) -> list:
    run_dir = trained_run(tmp_path)
    meta_path = run_dir / (run_dir / "latest").read_text().strip() / "trainer.json"
    meta = json.loads(meta_path.read_text())
    change(meta)
    meta_path.write_text(json.dumps(meta))
    return quick(tmp_path, "--resume", str(run_dir))


def trace_file(tmp_path, change) -> list:
    """A real trace (from a run with trace: true), changed by ``change(document)``."""
    run_dir = tmp_path / "traced"
    assert run(train_main, quick(tmp_path, f"run_dir={run_dir}", "trace=true", "--quiet")) == 0
    document = json.loads((run_dir / "trace.json").read_text())
    change(document)
    path = tmp_path / "bad_trace.json"
    path.write_text(json.dumps(document))
    return [str(path)]


def first_event(kind):
    def find(document):
        return next(row for row in document["events"] if row[0] == kind)
    return find


def corrupt_image_folder(tmp_path) -> list:
    """An image folder whose fifth image (read by the third batch of two) is not an image."""
    from PIL import Image
    root = tmp_path / "images"
    for label in ("a", "b"):
        (root / "train" / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (32, 32), (40 * i, 0, 0)).save(root / "train" / label / f"{i}.png")
    (root / "train" / "b" / "2.png").write_bytes(b"not a png")
    return [config(tmp_path, name="quick.yaml"), "data.dataset=imagefolder", f"data.root={root}",
            "data.num_classes=null", "model.layers[13].num_output=2", "data.batch_size=2",
            "data.val_size=0", "train.max_iters=4", "trace=false", "data.augment.crop_padding=0"]


# (id, command, build(tmp_path) -> argv, words the one line must hold)
CASES = [
    # -- config files -----------------------------------------------------------------------
    ("unknown top-level key", "train", lambda t: [config(t, ("seed: 0", "seed: 0\nsede: 1"))],
     ["bad.yaml:", "sede"]),
    ("misspelt solver key", "train", lambda t: [config(t, ("  lr: 0.05", "  lrr: 0.05"))],
     ["bad.yaml:", "solver.lrr"]),
    ("negative lr", "train", lambda t: [config(t, ("lr: 0.05", "lr: -1"))],
     ["bad.yaml:", "solver.lr"]),
    ("lr a word", "train", lambda t: [config(t, ("lr: 0.05", "lr: fast"))],
     ["bad.yaml:", "solver.lr"]),
    ("batch of zero", "train", lambda t: [config(t, ("batch_size: 32", "batch_size: 0"))],
     ["bad.yaml:", "data.batch_size"]),
    ("dataset misspelt", "train", lambda t: [config(t, ("dataset: shapes", "dataset: shapez"))],
     ["bad.yaml:", "data.dataset"]),
    ("layer type misspelt", "train",
     lambda t: [config(t, ("type: Convolution, bottom: data", "type: Convolutoin, bottom: data"))],
     ["bad.yaml:", "Convolution"]),
    ("layer option misspelt", "train",
     lambda t: [config(t, ("num_output: 16, kernel_size: 3", "num_output: 16, kernal_size: 3"))],
     ["bad.yaml:", "kernal_size"]),
    ("zero stride", "plan", lambda t: [config(t, ("kernel_size: 3, pad: 1, bias: false}",
                                                   "kernel_size: 3, pad: 1, stride: 0, "
                                                   "bias: false}"))],
     ["bad.yaml:", "model.layers[0]", "stride"]),
    ("pool method misspelt", "plan", lambda t: [config(t, ("pool: max", "pool: maxx"))],
     ["bad.yaml:", "model.layers[3]", "pool"]),
    ("kernel larger than its input", "plan",
     lambda t: [config(t, ("num_output: 64, kernel_size: 3", "num_output: 64, kernel_size: 30"))],
     ["bad.yaml:", "model.layers[8]"]),
    ("missing bottom", "plan", lambda t: [config(t, ("bottom: pool1", "bottom: pool9"))],
     ["bad.yaml:", "model.layers[4]", "pool9"]),
    ("float kernel size", "plan",
     lambda t: [config(t, ("num_output: 16, kernel_size: 3", "num_output: 16, kernel_size: 2.5"))],
     ["bad.yaml:", "model.layers[0]", "kernel_size"]),
    ("bottom a number", "plan",
     lambda t: [config(t, ("bottom: pool3, top: fc", "bottom: 7, top: fc"))],
     ["bad.yaml:", "model.layers[12] (fc).bottom"]),
    ("top a mapping", "plan",
     lambda t: [config(t, ("bottom: pool3, top: fc", "bottom: pool3, top: {a: fc}"))],
     ["bad.yaml:", "model.layers[12] (fc).top"]),
    ("unclosed quote on line 1", "train",
     lambda t: [config(t, text='name: "quick\n' + QUICKSTART.split("\nseed", 1)[1])],
     ["bad.yaml:1:"]),
    ("zero-width space in a key", "train",
     lambda t: [config(t, ("  lr: 0.05", "  lr\u200b: 0.05"))],
     ["bad.yaml:", "\\u200b"]),
    ("tab indentation", "train", lambda t: [config(t, ("  type: sgd", "\ttype: sgd"))],
     ["bad.yaml:"]),
    ("duplicate key", "train", lambda t: [config(t, ("seed: 0", "seed: 0\nseed: 1"))],
     ["bad.yaml:", "seed"]),
    ("empty file", "train", lambda t: [config(t, text="")], ["bad.yaml"]),
    ("a list at the top", "train", lambda t: [config(t, text="- a\n- b\n")], ["bad.yaml"]),
    ("binary garbage", "train", lambda t: [config(t, text="\x00\x01\x02\xff")], ["bad.yaml"]),
    ("a directory as the config", "train", lambda t: [str(t)], ["{inputs}"]),
    ("/dev/zero as the config", "train", lambda t: ["/dev/zero"], ["/dev/zero"]),
    ("missing config file", "train", lambda t: [str(t / "nope.yaml")], ["nope.yaml"]),
    ("no loss layer", "train", lambda t: [config(t, (
        "    - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}\n", "")),
        *QUICK], ["model.layers", "loss"]),
    ("pool far too small", "train", lambda t: [config(t, ("memory: 9MiB", "memory: 1MiB"))],
     ["MiB", "device.memory"]),
    ("memory in parsecs", "train", lambda t: [config(t, ("memory: 9MiB", "memory: 3 parsecs"))],
     ["bad.yaml:", "device.memory"]),
    ("link unknown", "train", lambda t: [config(t, ("link: pcie3", "link: pcie9"))],
     ["bad.yaml:", "device.link"]),
    ("device kind unknown", "train", lambda t: [config(t, ("kind: cpu", "kind: tpu"))],
     ["bad.yaml:", "device.kind"]),
    ("prefetch yes", "train",
     lambda t: [config(t, ("policy: auto", "policy: auto\n  prefetch: yes"))],
     ["bad.yaml:47:13", "lms.prefetch"]),   # the line shows what was written
    ("solver unknown", "train", lambda t: [config(t, ("type: sgd", "type: rmsprop"))],
     ["bad.yaml:", "solver.type"]),
    ("image size too large for memory", "train",
     lambda t: [config(t, name="quick.yaml"), "data.image_size=100000"], ["data.image_size"]),
    ("train size too large for memory", "train",
     lambda t: [config(t, name="quick.yaml"), "data.train_size=1000000000000"],
     ["data.train_size"]),
    ("more classes than the classifier has", "train",
     lambda t: [config(t, name="quick.yaml"), "data.num_classes=8", *QUICK],
     ["quick.yaml:", "model.layers[12].num_output"]),
    # -- overrides --------------------------------------------------------------------------
    ("override without =", "train", lambda t: quick(t, "solver.lr"), ["solver.lr"]),
    ("override of an unknown key", "train", lambda t: quick(t, "solver.lrr=1"), ["solver.lrr"]),
    ("override past the layer list", "train", lambda t: quick(t, "model.layers[99].stride=1"),
     ["model.layers[99]"]),
    ("override with bad YAML", "train", lambda t: quick(t, "solver.lr=[1"), ["solver.lr"]),
    ("override prefetch yes", "train", lambda t: quick(t, "lms.prefetch=yes"),
     ["lms.prefetch", "yes"]),
    ("override batch size a word", "plan", lambda t: [config(t), "data.batch_size=many"],
     ["data.batch_size"]),
    # -- flags ------------------------------------------------------------------------------
    ("--lms nan", "train", lambda t: quick(t, "--lms", "nan"), ["--lms"]),
    ("--lms inf", "train", lambda t: quick(t, "--lms", "inf"), ["--lms"]),
    ("--lms-frac above one", "train", lambda t: quick(t, "--lms-frac", "2"), ["--lms-frac"]),
    ("--resume of nothing", "train", lambda t: quick(t, "--resume", str(t / "nothing")),
     ["--resume"]),
    ("--resume of a file", "train", lambda t: quick(t, "--resume", config(t, name="f.yaml")),
     ["--resume"]),
    ("--resume of a directory that holds no run", "train",
     lambda t: quick(t, "--resume", str(written(t / "empty" / "x", "x").parent)), ["--resume"]),
    ("plan --link inf", "plan", lambda t: [config(t), "--link", "inf"], ["--link"]),
    ("plan --link abc", "plan", lambda t: [config(t), "--link", "abc"], ["--link"]),
    # -- run directories --------------------------------------------------------------------
    ("run_dir a file", "train", lambda t: quick(t, f"run_dir={config(t, name='f.yaml')}"),
     ["run_dir", "f.yaml"]),
    ("run_dir full of other things", "train",
     lambda t: quick(t, f"run_dir={written(t / 'full' / 'x', 'x').parent}"), ["run_dir", "full"]),
    ("run_dir holding a run with checkpoints", "train",
     lambda t: quick(t, f"run_dir={trained_run(t)}"), ["run_dir", "--resume"]),
    # -- data files -------------------------------------------------------------------------
    ("a CSV named .npz", "train",
     lambda t: with_npz(t, written(t / "d.npz", "a,b\n1,2\n")), ["d.npz"]),
    ("an npz without its arrays", "train",
     lambda t: with_npz(t, saved(t / "d.npz", nothing=np.zeros(3))), ["d.npz"]),
    ("an npz of pickled objects", "train",
     lambda t: with_npz(t, saved(t / "d.npz", x_train=np.array([{}], dtype=object),
                                 y_train=np.zeros(1))), ["d.npz"]),
    ("labels the classifier has no output for", "train",
     lambda t: with_npz(t, npz_data(t, labels=np.arange(64) % 9), "data.num_classes=null"),
     ["quick.yaml:", "model.layers[12].num_output"]),
    ("an IDX file with the wrong magic", "train",
     lambda t: mnist(t, idx(np.zeros((2, 28, 28), np.uint8), 1234)),
     ["train-images-idx3-ubyte"]),
    ("an IDX header past 2^64", "train",
     lambda t: mnist(t, struct.pack(">IIII", 2051, 2**32 - 1, 2**32 - 1, 2**32 - 1)),
     ["train-images-idx3-ubyte"]),
    ("a truncated CIFAR-10 batch", "train",
     lambda t: quick(t, "data.dataset=cifar10", f"data.root={cifar(t)}", "data.num_classes=null",
                     "model.layers[12].num_output=10"), ["data_batch_1.bin"]),
    ("an image folder that is not there", "train",
     lambda t: quick(t, "data.dataset=imagefolder", f"data.root={t / 'nowhere'}",
                     "data.num_classes=null"), ["data.root"]),
    ("a broken image read by the third batch", "train", corrupt_image_folder, ["2.png"]),
    # -- checkpoints ------------------------------------------------------------------------
    ("trainer.json without rng", "train",
     lambda t: break_meta(t, lambda m: m.pop("rng")), ["trainer.json", "rng"]),
    ("trainer.json without batch", "train",
     lambda t: break_meta(t, lambda m: m.pop("batch")), ["trainer.json", "batch"]),
    ("trainer.json with a string iteration", "train",
     lambda t: break_meta(t, lambda m: m.update(iteration="12")), ["trainer.json", "iteration"]),
    ("trainer.json with a string epoch", "train",
     lambda t: break_meta(t, lambda m: m.update(epoch="one")), ["trainer.json", "epoch"]),
    ("trainer.json with a garbage rng state", "train",
     lambda t: break_meta(t, lambda m: m.update(rng={"dropout": {"state": "garbage"}})),
     ["trainer.json", "rng"]),
    ("init_weights that are not there", "train",
     lambda t: quick(t, f"init_weights={t / 'none.npz'}"), ["none.npz"]),
    ("init_weights of another model", "train",
     lambda t: quick(t, "init_weights=" + str(saved(
         t / "w.npz", **{"conv1.weight": np.zeros((2, 2, 2, 2), np.float32)}))), ["w.npz"]),
    # -- trace files ------------------------------------------------------------------------
    ("a trace that is not JSON", "trace",
     lambda t: [str(written(t / "t.json", "{oops"))], ["t.json"]),
    ("a JSON file that is no trace", "trace",
     lambda t: [str(written(t / "t.json", '{"a": 1}'))], ["t.json"]),
    ("a trace that is not there", "trace", lambda t: [str(t / "none.json")], ["none.json"]),
    ("a trace event with a string offset", "trace",
     lambda t: trace_file(t, lambda d: first_event("alloc")(d)[4].update(offset="0x10")),
     ["bad_trace.json"]),
    ("a trace event with a list for a time", "trace",
     lambda t: trace_file(t, lambda d: first_event("kernel")(d)[4].update(start=[1])),
     ["bad_trace.json"]),
    ("a trace whose roles are a list", "trace",
     lambda t: trace_file(t, lambda d: d.update(roles=[1, 2])), ["bad_trace.json"]),
]


def snapshot(where: Path) -> dict:
    return {str(p.relative_to(where)): (p.stat().st_size if p.is_file() else None)
            for p in sorted(where.rglob("*"))}


def test_the_corpus_is_big_and_covers_every_kind():
    assert len(CASES) >= 60
    assert set(command for _, command, _, _ in CASES) == set(MAINS)


@pytest.mark.parametrize("name, command, build, names", CASES, ids=[c[0] for c in CASES])
def test_a_broken_input_is_one_line_exit_2_and_leaves_nothing(name, command, build, names,
                                                              tmp_path, monkeypatch, capsys):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    work = tmp_path / "work"          # the command's working directory: runs/ would land here
    work.mkdir()
    argv = build(inputs)
    if command == "train":
        argv = [*argv, "--quiet"]
    before = snapshot(inputs)
    capsys.readouterr()
    monkeypatch.chdir(work)
    code = run(MAINS[command], argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"exit {code}: {err}"
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in names:
        word = word.format(inputs=inputs)
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    assert snapshot(inputs) == before, "the inputs changed"
    assert snapshot(work) == {}, f"left behind: {snapshot(work)}"


@pytest.mark.skipif(CUDA_SIMULATED is False, reason="a real GPU is present: cuda is no mistake")
def test_cuda_without_a_gpu_is_one_line(tmp_path):
    """Without the simulator (which the suite turns on, and under which cuda trains), as a
    user without a GPU runs it."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    argv = [config(tmp_path, ("kind: cpu", "kind: cuda")), "device.link=null", *QUICK, "--quiet"]
    done = subprocess.run([sys.executable, "-m", "minilms.train", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "bad.yaml:41:9: device.kind: expected a CUDA GPU (none is present; use cpu or auto), "
        "found 'cuda'"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.parametrize("name", ["zero stride", "--lms inf", "a trace that is not JSON"])
def test_as_a_real_process_the_exit_code_is_2(name, tmp_path):
    _, command, build, names = next(c for c in CASES if c[0] == name)
    argv = build(tmp_path)
    done = subprocess.run([sys.executable, "-m", f"minilms.{command}", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_bad_minilms_blas_is_one_line_before_anything_is_written(tmp_path):
    """The environment variable that picks the cpu device's BLAS (kernels/mkl.py), checked as
    the device is made: a real process, since the choice is read once per process."""
    argv = [config(tmp_path, name="quick.yaml"), *QUICK, "--quiet"]
    done = subprocess.run([sys.executable, "-m", "minilms.train", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "MINILMS_BLAS": "mlk"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: environment: MINILMS_BLAS: expected mkl or openblas, found 'mlk'"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quick.yaml"]
