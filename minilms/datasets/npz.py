"""Arrays from one ``.npz`` file: the way to bring any data set that fits in memory.

Keys: ``x_train``, ``y_train``, ``x_test``, ``y_test`` (the ``val`` split is the test arrays), or
``x`` and ``y``, split by a seeded shuffle with ``val_fraction`` going to val. An optional
``classes`` array of strings names the classes; otherwise they are "0", "1", ...

Images may be ``[N, H, W]`` (grey), ``[N, C, H, W]`` or ``[N, H, W, C]`` with C of 1 or 3 (the
layout is channels-first when dimension 1 is 1 or 3, else channels-last when the last is), uint8
(0..255, scaled by 1/255) or floating point already in [0, 1]. Labels are non-negative integers.

The file is opened with ``allow_pickle=False``: an object array in it is an error, never code run.
A file that is not a zip archive (a CSV renamed ``.npz``, say) is named as such from its first
bytes, and an image array bigger than the host's available memory is refused from its header,
before it is read.
"""
from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from .base import (
    ArrayDataset,
    DatasetFormat,
    check_bytes_fit,
    check_channels,
    check_fraction,
    check_int,
    check_native_size,
    check_num_classes,
    check_root,
    check_split,
    one_line,
    out_of_memory,
)

SPLIT_KEYS = ("x_train", "y_train", "x_test", "y_test")
WHOLE_KEYS = ("x", "y")


def as_images(path: Path, key: str, array: np.ndarray) -> np.ndarray:
    """``array`` as ``[N, C, H, W]``, uint8 or float32 in [0, 1]."""
    if array.ndim == 3:
        array = array[:, None]
    elif array.ndim == 4 and array.shape[1] in (1, 3):
        pass
    elif array.ndim == 4 and array.shape[3] in (1, 3):
        array = np.ascontiguousarray(array.transpose(0, 3, 1, 2))
    else:
        raise DatasetError(path, f"{key} as [N, H, W], [N, C, H, W] or [N, H, W, C] with C of "
                           "1 or 3", f"shape {list(array.shape)}")
    if array.dtype == np.uint8:
        return array
    if not np.issubdtype(array.dtype, np.floating):
        raise DatasetError(path, f"{key} as uint8 or floating point", f"dtype {array.dtype}")
    array = array.astype(np.float32, copy=False)
    if array.size and not (np.isfinite(array).all() and array.min() >= 0 and array.max() <= 1):
        raise DatasetError(path, f"{key} as floating point values in [0, 1]",
                           f"values from {array.min()} to {array.max()}")
    return array


def as_labels(path: Path, key: str, array: np.ndarray, count: int | None) -> np.ndarray:
    if not np.issubdtype(array.dtype, np.integer) or array.ndim != 1:
        raise DatasetError(path, f"{key} as a 1-d integer array",
                           f"dtype {array.dtype}, shape {list(array.shape)}")
    if count is not None and len(array) != count:
        raise DatasetError(path, f"{key} with one label per image ({count})", len(array))
    if array.size and array.min() < 0:
        raise DatasetError(path, f"{key} as non-negative labels", f"label {array.min()}")
    return array


PICKLED = "pickled (object) data, which is refused: unpickling can run any code"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")     # a zip's first entry; an empty zip's directory
NPY_MAGIC = b"\x93NUMPY"


def _refusal(path: Path, error: Exception) -> DatasetError:
    found = one_line(error)
    if "pickle" in found:  # numpy's message suggests loading unsafely; we never will
        found = PICKLED
    return DatasetError(path, "an .npz archive of plain arrays", found)


def check_kind(path: Path) -> None:
    """Name what the file is when it is not a zip archive, from its first bytes: numpy's own
    error for anything that is neither .npz nor .npy talks of pickles (it would try one), which
    for a CSV or an image renamed .npz is a wrong and alarming diagnosis."""
    try:
        with open(path, "rb") as file:
            head = file.read(16)
    except OSError as error:
        raise DatasetError(path, "a readable file", one_line(error)) from None
    if head.startswith(ZIP_MAGICS):
        return
    if head.startswith(NPY_MAGIC):
        raise DatasetError(path, "an .npz archive of named arrays", "a single .npy array")
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        raise DatasetError(path, "an .npz archive of plain arrays", PICKLED)
    found = f"it begins {head!r}" if head else "an empty file"
    raise DatasetError(path, "an .npz (zip) archive of plain arrays",
                       f"a file that is not a zip archive ({found})")


def check_member_fits(path: Path, archive, key: str) -> None:
    """Refuse an array whose .npy header says it needs more memory than the host has, before
    reading it: a compressed archive can inflate far beyond its size on disk. A header that
    cannot be read here is left for the read itself to report."""
    try:
        with archive.zip.open(f"{key}.npy") as member:
            version = np.lib.format.read_magic(member)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                return
            shape, _, dtype = read_header(member)
    except Exception:   # any damage here is reported by the read that follows
        return
    check_bytes_fit(path, math.prod(shape) * dtype.itemsize, f"{key} {list(shape)} {dtype}")


def load_arrays(path: Path, split: str, val_fraction: float, seed: int):
    """This split's images and labels, every label in the file (to count the classes), and the
    optional class names."""
    check_kind(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except zipfile.BadZipFile as error:
        raise DatasetError(path, "an .npz (zip) archive of plain arrays",
                           f"a damaged zip archive ({one_line(error)})") from None
    except Exception as error:  # a damaged one: "not our format"
        raise _refusal(path, error) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DatasetError(path, "an .npz archive of named arrays", "a single .npy array")
    with archive:
        for key in ("x_train", "x_test", "x"):
            if key in archive.files:
                check_member_fits(path, archive, key)
        try:
            keys = set(archive.files)
            if set(SPLIT_KEYS) <= keys:
                x_key, y_key = ("x_train", "y_train") if split == "train" else ("x_test", "y_test")
                images = as_images(path, x_key, archive[x_key])
                labels = as_labels(path, y_key, archive[y_key], len(images))
                other = "y_test" if split == "train" else "y_train"
                all_labels = np.concatenate([labels, as_labels(path, other, archive[other], None)])
            elif set(WHOLE_KEYS) <= keys:
                images = as_images(path, "x", archive["x"])
                all_labels = as_labels(path, "y", archive["y"], len(images))
                order = np.random.default_rng(seed).permutation(len(images))
                val_count = round(val_fraction * len(images))
                chosen = np.sort(order[:val_count] if split == "val" else order[val_count:])
                images, labels = images[chosen], all_labels[chosen]
            else:
                raise DatasetError(path, "arrays x_train, y_train, x_test, y_test (or x, y)",
                                   f"arrays {', '.join(sorted(keys)) or 'none'}")
            names = archive["classes"] if "classes" in keys else None
        except DatasetError:
            raise
        except MemoryError as error:    # the headers fitted, the copies and conversions did not
            raise out_of_memory(path, error, "arrays that fit in host memory") from None
        except Exception as error:  # a damaged member, an object array refused without pickle
            raise _refusal(path, error) from None
    return images, labels, all_labels, names


def class_names(path: Path, names, all_labels: np.ndarray) -> tuple[str, ...]:
    count = int(all_labels.max()) + 1 if all_labels.size else 0
    if names is None:
        return tuple(str(i) for i in range(count))
    if names.ndim != 1 or names.dtype.kind not in "US" or len(names) < count:
        raise DatasetError(path, f"classes as at least {count} strings (labels go to "
                           f"{count - 1})", f"dtype {names.dtype}, shape {list(names.shape)}")
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names.tolist())


def open_npz(split: str, *, root=None, image_size=None, channels=None, num_classes=None,
             val_fraction=None, seed=None) -> ArrayDataset:
    """The ``npz`` format: ``root`` is the file."""
    split = check_split(split)
    path = check_root(root, "an .npz file with x_train, y_train, x_test, y_test (or x, y)",
                      kind="file")
    images, labels, all_labels, names = load_arrays(
        path, split, check_fraction("val_fraction", val_fraction, 0.2),
        check_int("seed", seed, 0, 0))
    classes = class_names(path, names, all_labels)
    check_native_size("npz", images.shape[2], images.shape[3], image_size)
    check_num_classes("npz", len(classes), num_classes)
    return ArrayDataset("npz", split, classes, images, labels,
                        check_channels(channels, images.shape[1]))


# No fixed class count: it is the largest label in the file, plus one (or its classes).
FORMAT = DatasetFormat("npz", open_npz, num_classes=None, needs_root=True,
                       files=f"root is the .npz file: {', '.join(SPLIT_KEYS)} (or "
                             f"{', '.join(WHOLE_KEYS)}), and optionally classes")
