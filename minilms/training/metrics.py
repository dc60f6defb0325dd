"""The training loop's log: one row per logged training iteration and per validation, in
``metrics.jsonl`` (strict JSON: NaN and infinities as null) and ``metrics.csv``."""
import csv
import json
import math
from pathlib import Path

METRICS = ("split", "epoch", "iteration", "loss", "accuracy", "lr", "images_per_s",
           "mib_moved", "stall_ms")


class Metrics:
    """``metrics.jsonl`` and ``metrics.csv`` in the run directory, appended to (resume)."""

    def __init__(self, run_dir: Path):
        self.jsonl, self.csv = run_dir / "metrics.jsonl", run_dir / "metrics.csv"
        if not self.csv.exists():
            with self.csv.open("w", newline="") as f:
                csv.DictWriter(f, METRICS).writeheader()

    def write(self, **row) -> None:
        row = finite_or_null({k: (round(v, 6) if isinstance(v, float) else v)
                              for k, v in row.items()})
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row, allow_nan=False) + "\n")
        with self.csv.open("a", newline="") as f:
            csv.DictWriter(f, METRICS).writerow(row)


def finite_or_null(row: dict) -> dict:
    """NaN and infinities as null (``None``): strict JSON has no NaN (the accuracy of a model
    without an Accuracy layer, a diverged loss), and readers such as ``jq`` reject it."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in row.items()}


class NoMetrics:
    """What ranks other than 0 log to."""

    def write(self, **row) -> None:
        pass
