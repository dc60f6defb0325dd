"""CIFAR-10 from its *binary* distribution (``cifar-10-binary.tar.gz``, extracted).

Each ``.bin`` file is a run of 3073-byte records: one label byte (0..9), then a 32x32 image as
1024 red, 1024 green and 1024 blue bytes, row-major, which is already the ``[C, H, W]`` layout.
The Python distribution is pickles, and unpickling a downloaded file runs whatever code it holds,
so this reader does not support it, and nothing here ever unpickles.

Files: ``data_batch_1.bin`` .. ``data_batch_5.bin`` (train) and ``test_batch.bin`` (the ``val``
split), in ``root`` or in ``root/cifar-10-batches-bin/`` as the archive extracts. All five training
batches are required: silently training on a fifth of the data is worse than stopping. Class names
come from the archive's ``batches.meta.txt`` when present.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DatasetError
from .base import (
    ArrayDataset,
    DatasetFormat,
    check_channels,
    check_file_fits,
    check_native_size,
    check_num_classes,
    check_root,
    check_split,
    one_line,
    out_of_memory,
)

RECORD_BYTES = 1 + 3 * 32 * 32
FILES = {"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "val": ("test_batch.bin",)}
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck")
ARCHIVE_DIR = "cifar-10-batches-bin"


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``[n, 3, 32, 32]`` and labels ``[n]`` from one binary batch file."""
    if not path.is_file():
        raise DatasetError(path, "a CIFAR-10 binary batch file", "no such file")
    check_file_fits(path)
    try:
        data = np.fromfile(path, np.uint8)
    except OSError as error:
        raise DatasetError(path, "a readable file", one_line(error)) from None
    except MemoryError as error:
        raise out_of_memory(path, error, "a file that fits in host memory") from None
    if data.size == 0:
        raise DatasetError(path, "a CIFAR-10 binary batch file", "an empty file")
    if data.size % RECORD_BYTES:
        raise DatasetError(path, f"a whole number of {RECORD_BYTES}-byte records "
                           "(1 label byte + 3072 pixel bytes)",
                           f"{data.size} bytes ({data.size // RECORD_BYTES} records and "
                           f"{data.size % RECORD_BYTES} bytes over)")
    records = data.reshape(-1, RECORD_BYTES)
    labels = records[:, 0]
    if labels.max() >= len(CLASSES):
        record = int(np.argmax(labels >= len(CLASSES)))
        raise DatasetError(path, f"labels 0..{len(CLASSES) - 1}",
                           f"label {labels[record]} in record {record}")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def read_class_names(folder: Path) -> tuple[str, ...]:
    meta = folder / "batches.meta.txt"
    if meta.is_file():
        names = [line.strip() for line in meta.read_text(errors="replace").splitlines()]
        names = [name for name in names if name]
        if len(names) == len(CLASSES):
            return tuple(names)
    return CLASSES


def open_cifar10(split: str, *, root=None, image_size=None, channels=None,
                 num_classes=None) -> ArrayDataset:
    """The ``cifar10`` format: 50,000 training and 10,000 test 32x32 RGB images, 10 classes."""
    split = check_split(split)
    root = check_root(root, "a directory with the CIFAR-10 binary batches (data_batch_1.bin ...)")
    folder = root / ARCHIVE_DIR if (root / ARCHIVE_DIR).is_dir() else root
    check_native_size("cifar10", 32, 32, image_size)
    check_num_classes("cifar10", len(CLASSES), num_classes)
    batches = [read_batch(folder / name) for name in FILES[split]]
    try:
        images = np.concatenate([images for images, _ in batches])
    except MemoryError as error:        # the split is the batches' sum, each of which fitted
        raise out_of_memory(folder, error, "batches that fit in host memory "
                            "together") from None
    labels = np.concatenate([labels for _, labels in batches])
    return ArrayDataset("cifar10", split, read_class_names(folder), images, labels,
                        check_channels(channels, 3))


FORMAT = DatasetFormat("cifar10", open_cifar10, num_classes=len(CLASSES), needs_root=True,
                       files=f"{FILES['train'][0]} .. {FILES['train'][-1]} and {FILES['val'][0]} "
                             f"in root or root/{ARCHIVE_DIR}")
