"""Image folders: one directory per class, any image format Pillow reads.

Layouts, as torchvision's ImageFolder and most exported data sets use:

    root/train/<class>/<image>   and   root/val/<class>/<image>   (``test/`` accepted for ``val``)
    root/<class>/<image>         split per class: a seeded shuffle puts ``val_fraction`` in val

Classes are the sorted directory names (of ``train/`` in the first layout), so a class's number
does not depend on the file system's order. Hidden entries and files whose suffix is not an image
suffix are skipped, so a README beside the images is harmless.

Images are decoded on demand (in the loader's background thread) and cached once decoded:
converted to ``channels`` (grey or RGB), resized so the shorter side is ``image_size`` and
centre-cropped to a square, as ``Resize(s) + CenterCrop(s)`` does. A file Pillow cannot read is a
DatasetError naming it, whatever Pillow raised. The cache must fit in host memory: an
``image_size`` that makes it too big is a ConfigError naming the key, before anything is decoded.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import ConfigError, DatasetError
from .base import (
    CachedDataset,
    DatasetFormat,
    check_channels,
    check_fraction,
    check_int,
    check_num_classes,
    check_root,
    check_split,
    memory_guard,
    one_line,
)

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp",
                            ".ppm", ".pgm", ".pbm"})
VAL_DIRS = ("val", "test")


def _visible(entries):
    return sorted(e for e in entries if not e.name.startswith("."))


def list_images(folder: Path) -> list[Path]:
    return [p for p in _visible(folder.iterdir()) if p.is_file()
            and p.suffix.lower() in IMAGE_SUFFIXES]


def class_dirs(folder: Path) -> list[Path]:
    return [p for p in _visible(folder.iterdir()) if p.is_dir()]


def load_image(path: Path, image_size: int, channels: int) -> np.ndarray:
    """``path`` as uint8 ``[channels, image_size, image_size]``: shorter side resized to
    ``image_size``, then the centre square cut out."""
    try:
        with Image.open(path) as opened:
            image = opened.convert("L" if channels == 1 else "RGB")
        width, height = image.size
        scale = image_size / min(width, height)
        size = (max(image_size, round(width * scale)), max(image_size, round(height * scale)))
        if size != image.size:
            image = image.resize(size, Image.Resampling.BILINEAR)
        left, top = (size[0] - image_size) // 2, (size[1] - image_size) // 2
        pixels = np.asarray(image.crop((left, top, left + image_size, top + image_size)), np.uint8)
    except Exception as error:  # Pillow raises OSError, SyntaxError, ValueError, ... for bad files
        raise DatasetError(path, "an image Pillow can read", one_line(error)) from None
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def split_files(root: Path, split: str, val_fraction: float, seed: int):
    """The classes and this split's ``(file, class index)`` pairs, for either layout."""
    if (root / "train").is_dir():
        classes = [d.name for d in class_dirs(root / "train")]
        if split == "train":
            folder = root / "train"
        else:
            folder = next((root / n for n in VAL_DIRS if (root / n).is_dir()), None)
            if folder is None:
                raise DatasetError(root / "val", "a folder of validation images beside train/",
                                   "no such directory")
        samples = []
        for directory in class_dirs(folder):
            if directory.name not in classes:
                raise DatasetError(directory, "a class that also has a folder in train/",
                                   "a class train/ does not have")
            label = classes.index(directory.name)
            samples += [(path, label) for path in list_images(directory)]
        return classes, samples

    classes = [d.name for d in class_dirs(root)]
    samples = []
    for label, directory in enumerate(class_dirs(root)):
        files = list_images(directory)
        # Per class, so every class is in both splits in proportion; seeded, so runs agree.
        order = np.random.default_rng([seed, label]).permutation(len(files))
        val_count = round(val_fraction * len(files))
        chosen = order[:val_count] if split == "val" else order[val_count:]
        samples += [(files[i], label) for i in sorted(chosen)]
    return classes, samples


class ImageFolderDataset(CachedDataset):
    def __init__(self, split: str, classes, files, labels, image_size: int, channels: int,
                 cache: bool = True):
        self.files, self.image_size, self.channels = files, image_size, channels
        super().__init__("imagefolder", split, classes, (channels, image_size, image_size),
                         labels, cache=cache)

    def _make(self, index: int) -> np.ndarray:
        return load_image(self.files[index], self.image_size, self.channels)


def open_imagefolder(split: str, *, root=None, image_size=None, channels=None, num_classes=None,
                     val_fraction=None, seed=None, cache=None) -> ImageFolderDataset:
    """The ``imagefolder`` format: class folders under ``root``, see the module docstring."""
    split = check_split(split)
    root = check_root(root, "a directory of class folders (or train/ and val/ of them)")
    image_size = check_int("image_size", image_size, None, 1)
    if image_size is None:
        raise ConfigError("data.image_size", "a positive integer (imagefolder resizes and crops "
                          "every image to it)", None)
    classes, samples = split_files(root, split, check_fraction("val_fraction", val_fraction, 0.2),
                                   check_int("seed", seed, 0, 0))
    if not classes:
        raise DatasetError(root, "one folder per class", "no class folders")
    if not samples:
        raise DatasetError(root, f"images for the {split} split "
                           f"(suffixes {', '.join(sorted(IMAGE_SUFFIXES))})", "none")
    check_num_classes("imagefolder", len(classes), num_classes)
    if cache is not None and not isinstance(cache, bool):
        raise ConfigError("data.cache", "true or false", cache)
    files = [path for path, _ in samples]
    labels = np.array([label for _, label in samples], np.int32)
    channels = check_channels(channels, 3)
    cache = True if cache is None else cache
    # Cached, every image of the split is kept once decoded; uncached, one at a time.
    count = len(files) if cache else 1
    hint = "; or set data.cache: false to decode images as batches need them" if cache else ""
    with memory_guard("data.image_size", image_size, count, (channels, image_size, image_size),
                      hint):
        return ImageFolderDataset(split, classes, files, labels, image_size, channels,
                                  cache=cache)


# No fixed class count: it is the number of class folders.
FORMAT = DatasetFormat("imagefolder", open_imagefolder, num_classes=None, needs_root=True,
                       files="root/<class>/<image>, or root/train/<class>/<image> and "
                             "root/val/<class>/<image> (or test/); any image Pillow reads")
