"""What every dataset split is, what every format declares, and the checks formats share.

A split is a fixed, numbered list of labelled images. ``get(indices)`` returns the images as
float32 ``[n, C, H, W]`` in [0, 1] and the labels as int32 ``[n]``; everything downstream
(augmentation, the loader, the input blob) sees only that. Formats store pixels however suits them
(uint8 arrays in memory, files decoded on demand, images drawn from a seed) and implement one
method, ``_pixels(indices)``.

Keeping pixels as uint8 until a batch is asked for costs a quarter of the memory of float32, and
scaling in one place means every format agrees on what 1.0 means.

A format's facts (its name, open function, class count, whether it reads ``data.root`` and what it
reads there) are a ``DatasetFormat`` declared once, beside the open function, in the format's
module: the registry, the config's accepted ``data.dataset`` values and root check, the net
builder's class count and the tests all read them from there, so none keeps a list to forget.

A split must fit in host memory. Before a format allocates a split's pixels it checks the bytes
against what the host has available (``check_fits``), so ``data.image_size: 100000`` is one line
naming the key, not numpy's MemoryError traceback (or, worse, the kernel's OOM killer once the
cache fills); a MemoryError that still happens is turned into the same line (``memory_guard``).
The available memory is read here, from ``/proc/meminfo`` or ``os.sysconf``, because datasets
sits below the device package, whose ``host_memory_info`` says the same.
"""
from __future__ import annotations

import inspect
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError, DatasetError

SPLITS = ("train", "val")


class Dataset:
    """One split of a data set: ``len``, ``classes``, ``num_classes``, ``shape`` (C, H, W),
    ``labels`` (int32, all of them) and ``get(indices)``."""

    def __init__(self, name: str, split: str, classes: Sequence[str], shape: tuple[int, int, int],
                 labels: np.ndarray):
        self.name, self.split = name, split
        self.classes = tuple(str(c) for c in classes)
        self.shape = tuple(int(d) for d in shape)
        # Our own copy, made read-only: the split's truth must not change under a caller's edit.
        labels = np.array(labels, dtype=np.int32)
        labels.setflags(write=False)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def get(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Images float32 ``[n, C, H, W]`` scaled to [0, 1], and labels int32 ``[n]``."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            bad = indices[(indices < 0) | (indices >= len(self))][0]
            raise IndexError(f"{self!r}: index {bad} out of range 0..{len(self) - 1}")
        pixels = self._pixels(indices)
        if pixels.dtype == np.uint8:
            images = pixels.astype(np.float32) / np.float32(255)  # x / 255 exactly rounded
        else:
            images = np.array(pixels, dtype=np.float32)  # a copy: callers may write into a batch
        return images, self.labels[indices]  # fancy indexing: a copy

    def _pixels(self, indices: np.ndarray) -> np.ndarray:
        """uint8 (0..255) or float32 (already in [0, 1]) pixels ``[n, C, H, W]``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        c, h, w = self.shape
        return (f"<{self.name} {self.split}: {len(self)} images {c}x{h}x{w}, "
                f"{self.num_classes} classes>")


class ArrayDataset(Dataset):
    """A split held in memory as one array ``[N, C, H, W]`` (uint8, or float32 in [0, 1]),
    converted to ``channels`` (1 or 3) per batch so a 3-channel model can train on grey images."""

    def __init__(self, name: str, split: str, classes: Sequence[str], images: np.ndarray,
                 labels: np.ndarray, channels: int | None = None):
        self._images = images
        self._channels = images.shape[1] if channels is None else channels
        super().__init__(name, split, classes, (self._channels, *images.shape[2:]), labels)

    def _pixels(self, indices: np.ndarray) -> np.ndarray:
        return convert_channels(self._images[indices], self._channels)


class CachedDataset(Dataset):
    """A split whose images are made one at a time (drawn, or decoded from a file) by
    ``_make(index) -> uint8 [C, H, W]`` and, with ``cache``, kept in memory once made.

    Two threads may make the same image at once; both write the same bytes, so no lock is needed.
    """

    def __init__(self, name: str, split: str, classes: Sequence[str], shape: tuple[int, int, int],
                 labels: np.ndarray, cache: bool = True):
        super().__init__(name, split, classes, shape, labels)
        # np.empty only reserves address space; pages are committed as images are made.
        self._cache = np.empty((len(self), *self.shape), np.uint8) if cache else None
        self._made = np.zeros(len(self), bool) if cache else None

    def _make(self, index: int) -> np.ndarray:
        raise NotImplementedError

    def _pixels(self, indices: np.ndarray) -> np.ndarray:
        out = np.empty((len(indices), *self.shape), np.uint8)
        for slot, index in enumerate(indices.tolist()):
            if self._cache is None:
                out[slot] = self._make(index)
            else:
                if not self._made[index]:
                    self._cache[index] = self._make(index)
                    self._made[index] = True
                out[slot] = self._cache[index]
        return out


def convert_channels(pixels: np.ndarray, channels: int) -> np.ndarray:
    """``[n, C, H, W]`` to ``channels``: grey is repeated into RGB; RGB becomes grey with
    ITU-R 601 luma, the weights Pillow's ``convert("L")`` uses, so every format agrees."""
    have = pixels.shape[1]
    if have == channels:
        return pixels
    if have == 1 and channels == 3:
        return np.repeat(pixels, 3, axis=1)
    if have == 3 and channels == 1:
        weights = np.array([0.299, 0.587, 0.114], np.float32).reshape(1, 3, 1, 1)
        grey = (pixels.astype(np.float32) * weights).sum(axis=1, keepdims=True)
        return np.rint(grey).astype(np.uint8) if pixels.dtype == np.uint8 else grey
    raise ValueError(f"cannot convert {have} channels to {channels}")


@dataclass(frozen=True)
class DatasetFormat:
    """A format, as its module declares it (``FORMAT = DatasetFormat(...)``) and ``registry.py``
    registers it.

    ``open(split, *, <options>) -> Dataset`` opens the ``"train"`` or ``"val"`` split; its
    keyword-only parameters are the ``data.*`` options it uses (``options``, read from the
    signature so they cannot drift from the code). ``num_classes`` is the class count a config
    gets with ``data.num_classes`` null, known without opening any data (None: counted from the
    files). ``needs_root``: the data is read from ``data.root``. ``files`` says, for people, what
    is read there, in the words of docs and errors.
    """
    name: str
    open: Callable[..., Dataset]
    num_classes: int | None
    needs_root: bool
    files: str

    def __post_init__(self):
        # A malformed fact fails at import, where it is written, not later as a wrong class
        # count in a planned net or a blank in an error message.
        if self.num_classes is not None and (type(self.num_classes) is not int
                                             or self.num_classes < 2):
            raise ValueError(f"{self.name}: num_classes must be an integer >= 2 or None, "
                             f"not {self.num_classes!r}")
        if not isinstance(self.needs_root, bool) or not self.files.strip():
            raise ValueError(f"{self.name}: needs_root must be true or false and files a "
                             "description of what the format reads")

    @property
    def options(self) -> frozenset:
        return frozenset(p.name for p in inspect.signature(self.open).parameters.values()
                         if p.kind is inspect.Parameter.KEYWORD_ONLY)

    @property
    def config_needs_root(self) -> bool:
        """Whether a config without ``data.root`` is wrong before anything is opened: the class
        count is in the files, so not even the net can be built. A format with a known count can
        be planned on a machine without its data; training reports the missing root."""
        return self.needs_root and self.num_classes is None

    @property
    def summary(self) -> str:
        return inspect.getdoc(self.open).splitlines()[0]


# --- option checks shared by the formats: each failure is a ConfigError naming the data.* key ---

def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError("split", "train or val", split)
    return split


def check_int(key: str, value, default: int | None, low: int, high: int | None = None,
              what: str = "") -> int | None:
    """``value`` (or ``default`` when None) as an int in [low, high]."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low \
            or (high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(f"data.{key}", what or f"an integer {span}", value)
    return int(value)


def check_channels(value, default: int | None) -> int | None:
    if value is None:
        return default
    if value not in (1, 3) or isinstance(value, bool):
        raise ConfigError("data.channels", "1 (grey) or 3 (RGB)", value)
    return int(value)


def check_fraction(key: str, value, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(f"data.{key}", "a fraction strictly between 0 and 1", value)
    return float(value)


def check_root(root, what: str, kind: str = "dir") -> Path:
    """``data.root`` as an existing directory (``kind="dir"``) or file (``"file"``)."""
    if root is None or root == "":
        raise ConfigError("data.root", what, root)
    path = Path(root).expanduser()
    exists = path.is_dir() if kind == "dir" else path.is_file()
    if not exists:
        raise ConfigError("data.root", what, str(root),
                          hint=" (no such file or directory)" if not path.exists() else "")
    return path


def check_native_size(name: str, height: int, width: int, image_size) -> None:
    """File formats do not resize: ``data.image_size``, when given, must be the files' own size."""
    if image_size is not None and (image_size != height or image_size != width):
        raise ConfigError("data.image_size", f"{height} for {name} (the size of its images)"
                          if height == width else f"null for {name} ({height}x{width} images)",
                          image_size)


def check_num_classes(name: str, actual: int, requested) -> None:
    """``data.num_classes``, when given for a file format, must match the data (it sizes the
    model's last layer, so a mismatch is a config mistake worth stopping for)."""
    if requested is not None and requested != actual:
        raise ConfigError("data.num_classes", f"{actual} for {name}", requested)


# --- host memory: a split must fit, or the error names what made it big ---

def available_memory() -> int | None:
    """Bytes of host RAM a process can still take without swapping (Linux's MemAvailable, else
    the free physical pages), or None where the host does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def size_text(nbytes: int) -> str:
    """``109.1 TiB``: one decimal in the largest binary unit under the number (bytes as is)."""
    value, unit = float(nbytes), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def split_bytes(count: int, shape: Sequence[int]) -> tuple[int, str]:
    """The uint8 pixel bytes of ``count`` images of ``shape``, and how a message says so."""
    need = int(count) * math.prod(int(d) for d in shape)
    images = "1 image" if count == 1 else f"{count} images"
    return need, f"{images} of {'x'.join(str(int(d)) for d in shape)} = {size_text(need)}"


def _too_big(key: str, found, what: str, free: int | None, hint: str) -> ConfigError:
    room = f"; {size_text(free)} available" if free is not None else ""
    return ConfigError(key, f"a data set that fits in host memory ({what}{room})", found,
                       hint=hint)


def check_fits(key: str, found, count: int, shape: Sequence[int], hint: str = "") -> None:
    """A ConfigError naming ``key`` (the ``data.*`` option that made it big, ``found`` its value)
    when ``count`` uint8 images of ``shape`` need more bytes than the host has available."""
    need, what = split_bytes(count, shape)
    free = available_memory()
    if free is not None and need > free:
        raise _too_big(key, found, what, free, hint)


@contextmanager
def memory_guard(key: str, found, count: int, shape: Sequence[int], hint: str = ""):
    """``check_fits`` first; then a MemoryError inside the block (the check passed, but the host
    could not deliver, or could not say what it had) becomes the same one-line ConfigError."""
    check_fits(key, found, count, shape, hint)
    try:
        yield
    except MemoryError:
        raise _too_big(key, found, split_bytes(count, shape)[1], available_memory(),
                       hint) from None


def fits(nbytes: int) -> bool:
    """Whether ``nbytes`` fit in the host's available memory (True where the host does not say:
    the allocation itself is then the check)."""
    free = available_memory()
    return free is None or nbytes <= free


def check_bytes_fit(path: Path, nbytes: int, what: str = "a file") -> None:
    """A DatasetError naming ``path`` when ``what`` there, ``nbytes`` once in memory, is more
    than the host has available."""
    free = available_memory()
    if free is not None and nbytes > free:
        raise DatasetError(path, f"data that fits in host memory ({size_text(free)} available)",
                           f"{what} of {size_text(nbytes)}")


def check_file_fits(path: Path) -> None:
    """``check_bytes_fit`` for a whole file, read as it is."""
    try:
        size = path.stat().st_size
    except OSError:
        return          # the read that follows names the problem
    check_bytes_fit(path, size)


def out_of_memory(path: Path, error: MemoryError,
                  expected: str = "data that fits in host memory") -> DatasetError:
    """A MemoryError met while reading ``path``, as the one-line DatasetError naming it."""
    free = available_memory()
    room = f" ({size_text(free)} available)" if free is not None else ""
    return DatasetError(path, f"{expected}{room}", one_line(error))


def one_line(error: BaseException) -> str:
    """An exception as ``Type: message`` on one line, for the ``found`` part of a DatasetError."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
