"""MNIST and Fashion-MNIST from their IDX files, gzipped or not.

The IDX format (LeCun's): a big-endian header, ``0x00 0x00 <type> <ndim>`` then ``ndim`` uint32
sizes, then the data. Images are type 0x08 (ubyte) with 3 dimensions (magic 2051), labels ubyte
with 1 (magic 2049). Every field is checked against the data that follows, because a truncated
download is the usual failure and it should be named, not surface as a reshape error mid-training.

Files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-...``) are looked for in
``root``, then in the layouts torchvision and Kaggle use; a name may end in ``.gz``. Compression is
detected from the bytes, not the name. The ``val`` split is the format's test split (t10k).
"""
from __future__ import annotations

import gzip
import math
import zlib
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

IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
CLASSES = {
    "mnist": tuple(str(d) for d in range(10)),
    "fashion_mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                      "Sneaker", "Bag", "Ankle boot"),
}
_TORCHVISION_DIRS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}


def find_file(root: Path, base: str, name: str) -> Path:
    """``base`` (or ``base.gz``, or Kaggle's ``train-images.idx3-ubyte`` spelling) under ``root``,
    ``root/raw`` or torchvision's ``root/<Name>/raw``."""
    folders = [root, root / "raw", root / _TORCHVISION_DIRS[name] / "raw"]
    spellings = [base, base.replace("-idx", ".idx")]
    for folder in folders:
        for spelling in spellings:
            for candidate in (folder / spelling, folder / f"{spelling}.gz"):
                if candidate.is_file():
                    return candidate
    raise DatasetError(root / base, "an IDX file (plain or .gz)", "no such file")


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped if they are gzip (magic 1f 8b; IDX files start with 00 00)."""
    check_file_fits(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DatasetError(path, "a readable file", one_line(error)) from None
    except MemoryError as error:
        raise out_of_memory(path, error, "a file that fits in host memory") from None
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise DatasetError(path, "a complete gzip file", f"a damaged one ({one_line(error)})") \
            from None
    except MemoryError as error:        # what it inflates to is only known by inflating it
        raise out_of_memory(path, error, "a gzip file whose contents fit in host "
                            "memory") from None


def read_idx(path: Path, magic: int) -> np.ndarray:
    """An IDX ubyte array whose header must carry ``magic``; every size is checked."""
    data = read_bytes(path)
    ndim = magic & 0xFF
    what = "images" if magic == IMAGES_MAGIC else "labels"
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise DatasetError(path, f"an IDX header of {header_size} bytes",
                           f"{len(data)} bytes in all (truncated)")
    found_magic = int.from_bytes(data[:4], "big")
    if found_magic != magic:
        raise DatasetError(path, f"IDX magic number {magic} ({what}: {ndim}-d unsigned bytes)",
                           found_magic)
    dims = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    # Python's integers: numpy's int64 product wraps past 2^63 (three sizes of 2^21..2^22 make
    # 2^64, "0 bytes"), and a wrapped count could even match the file and reach reshape.
    expected = math.prod(dims)
    payload = len(data) - header_size
    shape = "x".join(map(str, dims))
    if expected > max(payload, np.iinfo(np.intp).max):   # no array is that big: a bad header
        raise DatasetError(path, f"{what[:-1]} dimensions whose product fits the file ({payload} "
                           "data bytes after the header)", f"dimensions {shape} (product "
                           f"{expected})")
    if payload != expected:
        state = "truncated" if payload < expected else "trailing bytes"
        raise DatasetError(path, f"{expected} data bytes for dimensions {shape}",
                           f"{payload} ({state})")
    return np.frombuffer(data, np.uint8, offset=header_size).reshape(dims)


def load_split(root: Path, name: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``[N, 1, H, W]`` and labels, checked against each other and the classes."""
    images_path = find_file(root, FILES[split][0], name)
    labels_path = find_file(root, FILES[split][1], name)
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if len(labels) != len(images):
        raise DatasetError(labels_path, f"{len(images)} labels, one per image in "
                           f"{images_path.name}", len(labels))
    num_classes = len(CLASSES[name])
    if len(labels) and labels.max() >= num_classes:
        raise DatasetError(labels_path, f"labels 0..{num_classes - 1}", f"label {labels.max()}")
    return images[:, None], labels


def open_idx(name: str, split: str, *, root=None, image_size=None, channels=None,
             num_classes=None) -> ArrayDataset:
    split = check_split(split)
    folder = check_root(root, f"a directory with the {name} IDX files")
    images, labels = load_split(folder, name, split)
    check_native_size(name, images.shape[2], images.shape[3], image_size)
    check_num_classes(name, len(CLASSES[name]), num_classes)
    return ArrayDataset(name, split, CLASSES[name], images, labels, check_channels(channels, 1))


def open_mnist(split: str, *, root=None, image_size=None, channels=None,
               num_classes=None) -> ArrayDataset:
    """The ``mnist`` format: handwritten digits 0-9."""
    return open_idx("mnist", split, root=root, image_size=image_size, channels=channels,
                    num_classes=num_classes)


def open_fashion_mnist(split: str, *, root=None, image_size=None, channels=None,
                       num_classes=None) -> ArrayDataset:
    """The ``fashion_mnist`` format: ten kinds of clothing, same files and layout as MNIST."""
    return open_idx("fashion_mnist", split, root=root, image_size=image_size, channels=channels,
                    num_classes=num_classes)


def _idx_format(name: str, open_split) -> DatasetFormat:
    """The two formats differ only in name and classes: the files and where they are looked for
    are the same, and so is the description that docs and errors give of them."""
    files = ", ".join(FILES["train"] + FILES["val"])
    return DatasetFormat(name, open_split, num_classes=len(CLASSES[name]), needs_root=True,
                         files=f"{files} (each plain or .gz) in root, root/raw or "
                               f"root/{_TORCHVISION_DIRS[name]}/raw")


MNIST = _idx_format("mnist", open_mnist)
FASHION_MNIST = _idx_format("fashion_mnist", open_fashion_mnist)
