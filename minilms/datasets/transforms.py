"""Augmentation and normalisation of a batch: random crop, random horizontal flip, per-channel
normalisation, in numpy, seeded.

Each random transform comes in two parts: one that draws its choices from a generator, and one
that applies given choices, so the arithmetic can be tested against a naive reference on known
choices. The loader hands every batch its own generator, seeded by (seed, epoch, rank, batch), so
augmentation is reproducible however the background thread is scheduled.

Order, as in the usual torchvision pipeline (RandomCrop, RandomHorizontalFlip, Normalize):
crop and flip act on [0, 1] pixels, so padding is black; normalisation comes last.
"""
from __future__ import annotations

import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from ..errors import ConfigError
from .base import Dataset


def pad_and_crop(images: np.ndarray, padding: int, offsets: np.ndarray) -> np.ndarray:
    """Each image ``[C, H, W]`` zero-padded by ``padding`` on every side, then cut back to H x W
    with its top-left corner at ``offsets[i] = (top, left)`` in the padded image (0..2*padding)."""
    n, channels, height, width = images.shape
    padded = np.zeros((n, channels, height + 2 * padding, width + 2 * padding), images.dtype)
    padded[:, :, padding:padding + height, padding:padding + width] = images
    out = np.empty_like(images)
    for i, (top, left) in enumerate(np.asarray(offsets).tolist()):
        out[i] = padded[i, :, top:top + height, left:left + width]
    return out


def random_crop(images: np.ndarray, padding: int, rng: np.random.Generator) -> np.ndarray:
    """A random H x W window of each zero-padded image (``RandomCrop(size, padding)``)."""
    if padding == 0:
        return images
    offsets = rng.integers(0, 2 * padding + 1, size=(len(images), 2))
    return pad_and_crop(images, padding, offsets)


def flip_horizontal(images: np.ndarray, which: np.ndarray) -> np.ndarray:
    """The images with ``which[i]`` true mirrored left to right; the others unchanged."""
    out = images.copy()
    out[which] = images[which][..., ::-1]
    return out


def random_flip(images: np.ndarray, rng: np.random.Generator,
                probability: float = 0.5) -> np.ndarray:
    return flip_horizontal(images, rng.random(len(images)) < probability)


def normalize(images: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """``(x - mean[c]) / std[c]`` per channel, float32."""
    mean = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    return ((images - mean) / std).astype(np.float32, copy=False)


MIN_STATS_IMAGES = 16     # channel_stats reads at least this many images (or all there are)
STATS_THREADS = min(4, os.cpu_count() or 1)   # channel_stats reads batches on this many threads


def channel_stats(dataset: Dataset, max_samples: int | None = 10_000, seed: int = 0,
                  batch_size: int = 500, max_pixels: int | None = 2**23
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of a split's pixels, float32 ``[C]``: of all of it,
    or of a seeded sample of ``max_samples`` images (reading a big image folder in full just to
    normalise it would cost as much as an epoch), and of no more images than hold ``max_pixels``
    pixels a channel (at least ``MIN_STATS_IMAGES``): two thousand 224x224 images took seconds of
    start-up to read, for a mean that a few hundred give as well."""
    count = len(dataset)
    plane = dataset.shape[1] * dataset.shape[2]
    if max_pixels is not None:
        by_pixels = max(MIN_STATS_IMAGES, max_pixels // plane)
        max_samples = by_pixels if max_samples is None else min(max_samples, by_pixels)
        batch_size = max(1, min(batch_size, max_pixels // 8 // plane))
    if max_samples is not None and count > max_samples:
        indices = np.sort(np.random.default_rng(seed).choice(count, max_samples, replace=False))
    else:
        indices = np.arange(count)
    if not len(indices):
        raise ValueError(f"{dataset!r}: no images to compute channel statistics from")
    channels = dataset.shape[0]

    def sums(batch):
        images, _ = dataset.get(batch)
        values = images.transpose(1, 0, 2, 3).reshape(channels, -1).astype(np.float64)
        return values.sum(axis=1), (values * values).sum(axis=1), values.shape[1]
    batches = [indices[start:start + batch_size] for start in range(0, len(indices), batch_size)]
    # batches read on threads (drawing or decoding, Pillow and numpy, leaves the GIL for most of
    # it), their sums added in order: the figures do not depend on the threads
    with ThreadPoolExecutor(min(len(batches), STATS_THREADS)) as threads:
        parts = list(threads.map(sums, batches))
    total, total_sq, pixels = np.zeros(channels), np.zeros(channels), 0
    for batch_total, batch_sq, batch_pixels in parts:
        total += batch_total
        total_sq += batch_sq
        pixels += batch_pixels
    mean = total / pixels
    std = np.sqrt(np.maximum(total_sq / pixels - mean * mean, 0.0))
    return mean.astype(np.float32), std.astype(np.float32)


class Augment:
    """The transform the loader applies to each batch: ``augment(images, rng) -> images``."""

    def __init__(self, crop_padding: int = 0, flip: bool = False,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None):
        self.crop_padding, self.flip = crop_padding, flip
        self.mean = None if mean is None else np.asarray(mean, np.float32)
        self.std = None if std is None else np.asarray(std, np.float32)

    def __call__(self, images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        images = random_crop(images, self.crop_padding, rng)
        if self.flip:
            images = random_flip(images, rng)
        if self.mean is not None:
            images = normalize(images, self.mean, self.std)
        return images

    def __repr__(self) -> str:
        norm = "" if self.mean is None else f", mean={self.mean.tolist()}, std={self.std.tolist()}"
        return f"Augment(crop_padding={self.crop_padding}, flip={self.flip}{norm})"


AUGMENT_KEYS = ("crop_padding", "flip", "normalize")


def make_transform(augment: dict | None, train_dataset: Dataset, train: bool) -> Augment | None:
    """The transform for a split from the config's ``data.augment`` section:

        crop_padding: 0      # random crop after zero padding by this many pixels (train only)
        flip: false          # random horizontal flip (train only)
        normalize: true      # true: mean/std of train_dataset; false; or {mean: [...], std: [...]}

    Missing keys take the values shown. Validation gets the same normalisation and no
    augmentation. None when there is nothing to do.
    """
    augment = dict(augment or {})
    for key in augment:
        if key not in AUGMENT_KEYS:
            raise ConfigError(f"data.augment.{key}", f"one of {', '.join(AUGMENT_KEYS)}", key)
    padding = augment.get("crop_padding", 0) or 0
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ConfigError("data.augment.crop_padding", "an integer >= 0", padding)
    flip = augment.get("flip", False)
    if not isinstance(flip, bool):
        raise ConfigError("data.augment.flip", "true or false", flip)
    mean, std = _normalisation(augment.get("normalize", True), train_dataset)
    if not train:
        padding, flip = 0, False
    if not padding and not flip and mean is None:
        return None
    return Augment(padding, flip, mean, std)


_STATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # dataset -> channel_stats


def _normalisation(setting, train_dataset: Dataset):
    channels = train_dataset.shape[0]
    if setting is False or setting is None:
        return None, None
    if setting is True:
        if train_dataset not in _STATS:    # the train and validation transforms: read once
            _STATS[train_dataset] = channel_stats(train_dataset)
        mean, std = (value.copy() for value in _STATS[train_dataset])
        return mean, np.where(std > 0, std, 1.0)  # a constant channel only needs centring
    key = "data.augment.normalize"
    expected = f"true, false, or {{mean: [{channels} numbers], std: [{channels} positive numbers]}}"
    if not isinstance(setting, dict) or set(setting) != {"mean", "std"}:
        raise ConfigError(key, expected, setting)
    try:
        mean = np.asarray(setting["mean"], np.float64).reshape(-1)
        std = np.asarray(setting["std"], np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ConfigError(key, expected, setting) from None
    if len(mean) != channels or len(std) != channels or not (std > 0).all() \
            or not np.isfinite(mean).all():
        raise ConfigError(key, expected, setting)
    return mean.astype(np.float32), std.astype(np.float32)
