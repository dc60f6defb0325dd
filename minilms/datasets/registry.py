"""The formats by name, and ``make_dataset``, which the training command builds its data from.

A format is a ``DatasetFormat`` its module declares beside its open function: the function
``open_<format>(split, *, <options>) -> Dataset`` and the format's facts (class count, whether it
reads ``data.root``, what files). Registering it here is one line; the config's accepted
``data.dataset`` values, its root check and the net builder's class count are all read from
``DATASETS``, so a format is declared in one place and listed in one.

The open function's keyword-only parameters are the ``data.*`` options it uses, read from its
signature so the registry cannot drift from the code. ``make_dataset`` passes each format only the
options it uses and ignores the rest, so one ``data:`` section switches between formats by changing
``dataset:`` alone; a key that no format knows is a ConfigError, because it is a typo.
"""
from __future__ import annotations

import importlib

from ..errors import ConfigError
from .base import Dataset, DatasetFormat

# The format modules, in the order configs and errors list their formats: adding a format is
# adding its module here (every DatasetFormat the module declares is registered).
FORMAT_MODULES = ("shapes", "mnist", "cifar10", "imagefolder", "npz")

# Every data.* key a format may use. The loader's keys (batch_size, augment, prefetch) and
# ``dataset`` itself are not dataset options.
OPTIONS = ("root", "image_size", "channels", "num_classes", "train_size", "val_size",
           "val_fraction", "seed", "cache")

DATASETS: dict[str, DatasetFormat] = {}


def register(format_: DatasetFormat) -> DatasetFormat:
    """Add a format; its open function's options must be drawn from OPTIONS."""
    unknown = format_.options - set(OPTIONS)
    if unknown:  # a new option must be added to OPTIONS, and documented
        raise ValueError(f"{format_.name}: options {sorted(unknown)} are not in OPTIONS")
    DATASETS[format_.name] = format_
    return format_


for _name in FORMAT_MODULES:
    for _value in vars(importlib.import_module(f".{_name}", __package__)).values():
        if isinstance(_value, DatasetFormat):      # in the order the module declares them
            register(_value)


def make_dataset(name: str, split: str, **options) -> Dataset:
    """The ``split`` ("train" or "val") of the data set ``name`` (a key of DATASETS), configured by
    ``data.*`` options (see OPTIONS); options the format does not use are ignored."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"data.{unknown[0]}", f"one of {', '.join(OPTIONS)}", unknown[0])
    if name not in DATASETS:
        raise ConfigError("data.dataset", f"one of {', '.join(DATASETS)}", name)
    format_ = DATASETS[name]
    return format_.open(split, **{k: v for k, v in options.items() if k in format_.options})
