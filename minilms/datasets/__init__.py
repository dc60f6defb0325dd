"""Datasets: labelled images from a file format or drawn on the fly, and a prefetching loader.

The path of the data, as ``python -m minilms.train`` walks it::

    train = make_dataset("shapes", "train", image_size=32, num_classes=4)   # a Dataset
    val = make_dataset("shapes", "val", image_size=32, num_classes=4)
    loader = BatchLoader(train, batch_size=32, shuffle=True, seed=0,
                         transform=make_transform({"crop_padding": 4, "flip": True}, train, True))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:     # float32 [n, C, H, W], int32 [n]
            ...

A ``Dataset`` is one split: ``len(ds)``, ``ds.classes`` (names), ``ds.num_classes``, ``ds.shape``
(C, H, W), ``ds.labels`` (int32, all) and ``ds.get(indices) -> (images, labels)``, images float32
in [0, 1]. ``make_dataset(name, split, **options)`` opens the ``"train"`` or ``"val"`` split (for
file formats, ``val`` is the format's test split) of a format in ``DATASETS``, which maps each
name to its ``DatasetFormat``: the open function and its ``options``, ``num_classes`` (None:
counted from the data), ``needs_root`` and ``files`` (what it reads under ``data.root``, in
words). ``shapes`` is drawn with Pillow and needs no files; the others read MNIST and
Fashion-MNIST IDX files, CIFAR-10 binary batches, image folders and ``.npz`` arrays.

Options are the config's ``data.*`` keys (``OPTIONS``): ``root``, ``image_size``, ``channels``,
``num_classes``, ``train_size``, ``val_size``, ``val_fraction``, ``seed``, ``cache``. A format
ignores those it does not use; file formats do not resize (``image_size``, when given, must be
theirs) but convert ``channels`` (grey to RGB or back), and check ``num_classes`` against the data.

Augmentation (``transforms``): random crop with zero padding, random horizontal flip, per-channel
normalisation with statistics of the training split or given; ``make_transform`` builds it from
the config's ``data.augment`` section. ``BatchLoader`` (``loader``) shuffles by (seed, epoch),
shards across ranks, and makes batches in a background thread.

A bad option is a ``ConfigError`` naming its ``data.*`` key; a bad file is a ``DatasetError``
naming the file, what was expected and what was found. Both are one line. A split too big for the
host's available memory is found before its pixels are allocated: a ``ConfigError`` naming the key
that made it big (``image_size``, ``train_size``, ``val_size``), or a ``DatasetError`` naming the
file that would not fit.

To add a format: write ``<format>.py`` with ``open_<format>(split, *, <options>) -> Dataset``
(usually an ``ArrayDataset`` or a ``CachedDataset``) and, beside it, its facts as
``FORMAT = DatasetFormat(...)``; register it with one line in ``registry.py``; test it in
``tests/datasets/test_<format>.py`` on small files the test writes. No other code or test lists
the formats.
"""
from .base import ArrayDataset, CachedDataset, Dataset, DatasetFormat
from .loader import BatchLoader
from .registry import DATASETS, OPTIONS, make_dataset, register
from .transforms import Augment, channel_stats, make_transform

__all__ = ["Dataset", "ArrayDataset", "CachedDataset", "DATASETS", "OPTIONS", "DatasetFormat",
           "make_dataset", "register", "BatchLoader", "Augment", "channel_stats",
           "make_transform"]
