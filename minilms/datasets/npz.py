"""Arrays from one ``.npz`` file: the way to bring any data set that fits in memory.

Keys: ``x_train``, ``y_train``, ``x_test``, ``y_test`` (the ``val`` split is the test arrays), or
``x`` and ``y``, split by a seeded shuffle with ``val_fraction`` going to val. An optional
``classes`` array of strings names the classes; otherwise they are "0", "1", ...

Images may be ``[N, H, W]`` (grey), ``[N, C, H, W]`` or ``[N, H, W, C]`` with C of 1 or 3 (the
layout is channels-first when dimension 1 is 1 or 3, else channels-last when the last is), uint8
(0..255, scaled by 1/255) or floating point already in [0, 1]. Labels are non-negative integers.

The file is opened with ``allow_pickle=False``: an object array in it is an error, never code run.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DatasetError
from .base import (
    ArrayDataset,
    DatasetFormat,
    check_channels,
    check_fraction,
    check_int,
    check_native_size,
    check_num_classes,
    check_root,
    check_split,
    one_line,
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


def _refusal(path: Path, error: Exception) -> DatasetError:
    found = one_line(error)
    if "pickle" in found:  # numpy's message suggests loading unsafely; we never will
        found = "pickled (object) data, which is refused: unpickling can run any code"
    return DatasetError(path, "an .npz archive of plain arrays", found)


def load_arrays(path: Path, split: str, val_fraction: float, seed: int):
    """This split's images and labels, every label in the file (to count the classes), and the
    optional class names."""
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as error:  # not a zip, a damaged one, a pickle: all mean "not our format"
        raise _refusal(path, error) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DatasetError(path, "an .npz archive of named arrays", "a single .npy array")
    with archive:
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
