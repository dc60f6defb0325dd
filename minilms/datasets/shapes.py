"""Shapes: a procedurally drawn data set that needs no download, at any resolution.

Each image is one filled shape (the class: circle, square, triangle, star, cross, ring, crescent,
arrow; the first ``num_classes`` of them) of random size, position and rotation, in a random colour
on a random background colour, with Gaussian noise. It is the quickstart's data and the test
suite's: small enough to draw in a fraction of a second, hard enough that a model must learn shape
rather than colour or position (both are random), easy enough that a small CNN gets >95%.

Every image is drawn from its own seed, ``(seed, split, index)``, so ``get([i])`` is random access
and gives the same pixels in any order, in any process (loader threads, MPI ranks) and on any
machine; the two splits use different seeds, so validation images are never training images.
Labels cycle through the classes (``index % num_classes``), so every split is balanced.

Shapes are rasterised with Pillow at up to 4x the resolution and box-filtered down, which gives
anti-aliased edges; colour and noise are then applied in numpy from the coverage mask, which is
what makes 1- and 3-channel images cost the same.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from .base import (
    CachedDataset,
    DatasetFormat,
    check_channels,
    check_int,
    check_split,
    fits,
    memory_guard,
)

SPLIT_SEEDS = {"train": 0, "val": 1}
MAX_CLASSES = 8
DEFAULT_CLASSES = 4  # what a config without data.num_classes gets, and plans for
DEFAULT_IMAGE_SIZE = 32
_LUMA = np.array([0.299, 0.587, 0.114])
_MIN_CONTRAST = 0.35  # luma difference between shape and background, so grey images stay visible


def _regular(corners: int, radius: float = 1.0, start: float = -np.pi / 2) -> np.ndarray:
    angles = start + 2 * np.pi * np.arange(corners) / corners
    return radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)


def _star(points: int = 5, inner: float = 0.42) -> np.ndarray:
    radii = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    angles = -np.pi / 2 + np.pi * np.arange(2 * points) / points
    return radii[:, None] * np.stack([np.cos(angles), np.sin(angles)], axis=1)


_CROSS = np.array([(-.3, -1), (.3, -1), (.3, -.3), (1, -.3), (1, .3), (.3, .3), (.3, 1), (-.3, 1),
                   (-.3, .3), (-1, .3), (-1, -.3), (-.3, -.3)], float)
_ARROW = np.array([(-1, -.22), (.15, -.22), (.15, -.55), (1, 0), (.15, .55), (.15, .22),
                   (-1, .22)], float)

# Each shape: polygons in unit coordinates (extent about 1), each painted as shape (True) or
# background (False), in order: the ring and the crescent are a disc with a part cut back out.
SHAPES: dict[str, list[tuple[np.ndarray, bool]]] = {
    "circle": [(_regular(48), True)],
    "square": [(_regular(4), True)],
    "triangle": [(_regular(3), True)],
    "star": [(_star(), True)],
    "cross": [(_CROSS, True)],
    "ring": [(_regular(48), True), (_regular(48, 0.55), False)],
    "crescent": [(_regular(48), True), (_regular(48, 0.8) + (0.45, 0.0), False)],
    "arrow": [(_ARROW, True)],
}
SHAPE_NAMES = tuple(SHAPES)


def _supersampling(image_size: int) -> int:
    return 4 if image_size <= 64 else 2 if image_size <= 256 else 1


def _colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Shape and background RGB in [0, 1] whose lumas differ by at least _MIN_CONTRAST."""
    background = rng.random(3)
    for _ in range(64):
        shape = rng.random(3)
        if abs((shape - background) @ _LUMA) >= _MIN_CONTRAST:
            return shape, background
    return 1.0 - background, background  # practically never reached; still deterministic


def draw(shape: str, rng: np.random.Generator, image_size: int, channels: int) -> np.ndarray:
    """One image of ``shape`` as uint8 ``[channels, image_size, image_size]``; every random choice
    comes from ``rng``, so the same generator state gives the same pixels."""
    size = image_size
    radius = size * rng.uniform(0.25, 0.45)
    margin = 1.05 * radius  # the cross's corners reach 1.04 of its radius; keep shapes whole
    centre = rng.uniform(margin, size - margin, 2)
    angle = rng.uniform(0, 2 * np.pi)
    cos, sin = np.cos(angle), np.sin(angle)
    rotation = np.array([[cos, sin], [-sin, cos]])
    shape_rgb, background_rgb = _colours(rng)
    noise_sigma = rng.uniform(0.02, 0.06)

    scale = _supersampling(size)
    mask = Image.new("L", (size * scale, size * scale), 0)
    pen = ImageDraw.Draw(mask)
    for polygon, filled in SHAPES[shape]:
        # Pixel centres sit at +0.5 in image coordinates; Pillow puts them at integers.
        points = ((polygon @ rotation) * radius + centre) * scale - 0.5
        pen.polygon([tuple(p) for p in points.tolist()], fill=255 if filled else 0)
    if scale > 1:
        mask = mask.reduce(scale)
    coverage = np.asarray(mask, np.float32) * np.float32(1 / 255)

    if channels == 1:
        shape_rgb, background_rgb = shape_rgb @ _LUMA, background_rgb @ _LUMA
    shape_colour = np.reshape(shape_rgb, (-1, 1, 1)).astype(np.float32)
    background = np.reshape(background_rgb, (-1, 1, 1)).astype(np.float32)
    image = background + (shape_colour - background) * coverage
    image += rng.normal(0.0, noise_sigma, (channels, size, size)).astype(np.float32)
    return np.clip(image * 255 + 0.5, 0, 255).astype(np.uint8)


class ShapesDataset(CachedDataset):
    """``size`` drawn images of the first ``num_classes`` shapes; made on first use, then cached."""

    def __init__(self, split: str, size: int, image_size: int = 32, channels: int = 3,
                 num_classes: int = DEFAULT_CLASSES, seed: int = 0):
        self.seed, self.image_size, self.channels = seed, image_size, channels
        labels = np.arange(size) % num_classes
        super().__init__("shapes", split, SHAPE_NAMES[:num_classes],
                         (channels, image_size, image_size), labels, cache=True)

    def _make(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, SPLIT_SEEDS[self.split], index])
        return draw(self.classes[self.labels[index]], rng, self.image_size, self.channels)


def open_shapes(split: str, *, image_size=None, channels=None, num_classes=None, train_size=None,
                val_size=None, seed=None) -> ShapesDataset:
    """The ``shapes`` format: ``train_size`` or ``val_size`` images for the split."""
    split = check_split(split)
    size_key = f"{split}_size"
    size = check_int("train_size", train_size, 2000, 1) if split == "train" \
        else check_int("val_size", val_size, 500, 1)
    side = check_int("image_size", image_size, DEFAULT_IMAGE_SIZE, 4)
    channels = check_channels(channels, 3)
    num_classes = check_int("num_classes", num_classes, DEFAULT_CLASSES, 2, MAX_CLASSES)
    seed = check_int("seed", seed, 0, 0)
    # The cache (and the labels) are sized before any image is drawn. Blame the image size when
    # this many images would fit at the default size, else the count.
    small_fits = fits(size * channels * DEFAULT_IMAGE_SIZE ** 2)
    key, found = (("data.image_size", side) if small_fits and side > DEFAULT_IMAGE_SIZE
                  else (f"data.{size_key}", size))
    with memory_guard(key, found, size, (channels, side, side)):
        return ShapesDataset(split, size, image_size=side, channels=channels,
                             num_classes=num_classes, seed=seed)


FORMAT = DatasetFormat("shapes", open_shapes, num_classes=DEFAULT_CLASSES, needs_root=False,
                       files="no files: every image is drawn from (seed, split, index)")
