"""What a training run leaves in its directory, and what the next command makes of it: a run
killed before its first checkpoint is started over by ``--resume`` and explained to a fresh run;
the newest ``train.keep_checkpoints`` and the best are kept; a loss that turns NaN stops the run
with one line; NaN is written as null; a model's loss and accuracy are found by their names; a
validation cut short by ``max_iters`` says where it stands."""
import json

import numpy as np
import pytest

from minilms.commands.common import run
from minilms.commands.train import main
from minilms.kernels import mkl
from minilms.training.checkpoint import load_checkpoint

from .test_train import TINY, write_config

QUICK = ["data.train_size=64", "data.val_size=32", "data.batch_size=16", "--quiet"]


def train(tmp_path, *argv) -> int:
    return run(main, [write_config(tmp_path), *QUICK, *argv])


def test_a_run_killed_before_its_first_checkpoint_is_started_over_by_resume(tmp_path, capsys):
    """A kill leaves config.yaml and metrics and no checkpoint (simulated by writing them): a
    fresh run into it says what it is and what to do; ``--resume`` starts it over, and ends
    with the weights of a run that was never interrupted."""
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "config.yaml").write_text("name: tiny\n")
    (stopped / "metrics.jsonl").write_text('{"split": "train", "iteration": 1}\n')
    capsys.readouterr()
    assert train(tmp_path, f"run_dir={stopped}", "train.epochs=1") == 2
    err = capsys.readouterr().err.strip()
    assert "stopped before its first checkpoint" in err and f"--resume {stopped}" in err
    assert train(tmp_path, "--resume", str(stopped), "train.epochs=1") == 0
    fresh = tmp_path / "fresh"
    assert train(tmp_path, f"run_dir={fresh}", "train.epochs=1") == 0
    a, b = load_checkpoint(stopped).weights, load_checkpoint(fresh).weights
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    def rows(run_dir):       # what was trained, without the timings
        return [{k: row[k] for k in ("split", "epoch", "iteration", "loss", "accuracy")}
                for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]
    assert rows(stopped) == rows(fresh), "the stale rows of the killed run were kept"


def test_the_newest_checkpoints_and_the_best_are_kept(tmp_path):
    run_dir = tmp_path / "run"
    assert train(tmp_path, f"run_dir={run_dir}", "train.epochs=5", "train.keep_checkpoints=2") == 0
    kept = sorted(p.name for p in run_dir.glob("iter-*"))
    meta = json.loads((run_dir / kept[-1] / "trainer.json").read_text())
    best = meta["best"]["tag"]
    vals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"val"' in line]
    assert len(vals) == 5
    assert meta["best"]["val_accuracy"] == pytest.approx(max(v["accuracy"] for v in vals),
                                                         abs=1e-6)
    assert kept == sorted({"iter-0000016", "iter-0000020", best}), kept


def test_a_loss_that_turns_nan_stops_the_run_naming_the_iteration(tmp_path, capsys):
    run_dir = tmp_path / "run"
    capsys.readouterr()
    assert train(tmp_path, f"run_dir={run_dir}", "solver.lr=1e30", "solver.schedule.type=constant",
                 "train.epochs=3") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the loss is nan" in err[0] and "iteration " in err[0] and \
        "train.on_nonfinite_loss" in err[0], err


def test_with_continue_a_nan_loss_trains_on_and_is_written_as_null(tmp_path):
    run_dir = tmp_path / "run"
    assert train(tmp_path, f"run_dir={run_dir}", "solver.lr=1e30", "solver.schedule.type=constant",
                 "train.on_nonfinite_loss=continue", "train.epochs=1") == 0
    text = (run_dir / "metrics.jsonl").read_text() + (run_dir / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(row["loss"] is None for row in rows)      # strict JSON: null where NaN
    assert json.loads((run_dir / "summary.json").read_text())["loss"] is None


def test_loss_and_accuracy_are_found_by_the_model_s_names(tmp_path):
    renamed = TINY.replace("top: loss}", "top: xent}").replace("top: accuracy}", "top: hits}")
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, renamed, "renamed.yaml")
    assert run(main, [config, *QUICK, f"run_dir={run_dir}", "train.epochs=1"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert np.isfinite(summary["loss"]) and 0 <= summary["accuracy"] <= 1
    assert 0 <= summary["val_accuracy"] <= 1
    assert summary["blas"] == mkl.chosen()      # whose bits these are (kernels/mkl.py)


def test_a_validation_cut_short_by_max_iters_names_its_iteration(tmp_path, capsys):
    """4 iterations an epoch: the end of epoch 1 and iteration 6 both validate, and say so
    differently (they used to print the same "epoch 1" line twice)."""
    capsys.readouterr()
    run_dir = tmp_path / "run"
    assert run(main, [write_config(tmp_path), *QUICK[:-1], f"run_dir={run_dir}",
                      "train.max_iters=6", "train.epochs=3"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if ": validation loss" in line]
    assert [line.split(":")[0] for line in lines] == ["epoch 1", "iteration 6 (in epoch 2)"]
