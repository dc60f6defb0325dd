"""The formats by name, and ``make_dataset``, which the training command builds its data from.

A format is a function ``open_<format>(split, *, <options>) -> Dataset``; its keyword-only
parameters are the ``data.*`` options it uses, read from its signature so the registry cannot
drift from the code. ``make_dataset`` passes each format only the options it uses and ignores the
rest, so one ``data:`` section switches between formats by changing ``dataset:`` alone; a key that
no format knows is a ConfigError, because it is a typo.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from ..errors import ConfigError
from .base import Dataset
from .cifar10 import open_cifar10
from .imagefolder import open_imagefolder
from .mnist import open_fashion_mnist, open_mnist
from .npz import open_npz
from .shapes import open_shapes

# Every data.* key a format may use. The loader's keys (batch_size, augment, prefetch) and
# ``dataset`` itself are not dataset options.
OPTIONS = ("root", "image_size", "channels", "num_classes", "train_size", "val_size",
           "val_fraction", "seed", "cache")


@dataclass(frozen=True)
class DatasetFormat:
    name: str
    open: Callable[..., Dataset]
    options: frozenset

    @property
    def summary(self) -> str:
        return inspect.getdoc(self.open).splitlines()[0]


DATASETS: dict[str, DatasetFormat] = {}


def register(name: str, open_split: Callable[..., Dataset]) -> DatasetFormat:
    """Add a format: ``open_split(split, *, option=None, ...)``, options drawn from OPTIONS."""
    options = frozenset(p.name for p in inspect.signature(open_split).parameters.values()
                        if p.kind is inspect.Parameter.KEYWORD_ONLY)
    if not options <= set(OPTIONS):  # a new option must be added to OPTIONS, and documented
        raise ValueError(f"{name}: options {sorted(options - set(OPTIONS))} are not in OPTIONS")
    DATASETS[name] = DatasetFormat(name, open_split, options)
    return DATASETS[name]


register("shapes", open_shapes)
register("mnist", open_mnist)
register("fashion_mnist", open_fashion_mnist)
register("cifar10", open_cifar10)
register("imagefolder", open_imagefolder)
register("npz", open_npz)


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
