"""Shapes: deterministic random access, distinct splits, every class, learnable, fast enough."""
import time

import numpy as np
import pytest

from minilms.datasets import make_dataset, shapes
from minilms.datasets.shapes import SHAPE_NAMES, ShapesDataset
from minilms.errors import ConfigError

from .helpers import assert_one_line


def small(split="train", **options):
    options = {"train_size": 64, "val_size": 32, **options}
    return make_dataset("shapes", split, **options)


def sample_options(tmp_path, name) -> dict:
    """The data.* options of a small instance of format ``name``, written under ``tmp_path``:
    the registry's tests open every format this way to check its declared facts."""
    return {"train_size": 8, "val_size": 4, "image_size": 8}


def test_images_and_labels_have_the_promised_form():
    ds = small(image_size=20, channels=3, num_classes=5)
    images, labels = ds.get(np.arange(len(ds)))
    assert (len(ds), ds.shape, ds.num_classes) == (64, (3, 20, 20), 5)
    assert ds.classes == SHAPE_NAMES[:5]
    assert images.dtype == np.float32 and images.shape == (64, 3, 20, 20)
    assert labels.dtype == np.int32 and labels.shape == (64,)
    assert images.min() >= 0 and images.max() <= 1
    assert set(labels.tolist()) == set(range(5))  # every class present, balanced by construction
    assert np.bincount(labels).tolist() == [13, 13, 13, 13, 12]


def test_same_seed_same_pixels_in_any_order():
    first, second = small(), small()
    everything, _ = first.get(np.arange(64))
    backwards, _ = second.get(np.arange(64)[::-1])
    np.testing.assert_array_equal(everything, backwards[::-1])
    one_by_one = np.concatenate([small().get([i])[0] for i in (17, 3, 40)])
    np.testing.assert_array_equal(one_by_one, everything[[17, 3, 40]])


def test_seeds_and_splits_give_different_images():
    train, _ = small().get(np.arange(32))
    val, _ = small("val").get(np.arange(32))
    other_seed, _ = small(seed=1).get(np.arange(32))
    assert not np.array_equal(train, val)
    assert not np.array_equal(train, other_seed)
    # no validation image is a training image
    assert not (np.abs(train[:, None] - val[None]).max(axis=(2, 3, 4)) == 0).any()


def test_split_sizes_come_from_train_size_and_val_size():
    assert len(small()) == 64 and len(small("val")) == 32
    assert len(make_dataset("shapes", "val")) == 500


@pytest.mark.parametrize("size, channels", [(8, 1), (17, 3), (96, 1)])
def test_any_resolution_and_channels(size, channels):
    images, _ = small(image_size=size, channels=channels, train_size=8).get(np.arange(8))
    assert images.shape == (8, channels, size, size)
    assert images.std() > 0.05  # something is drawn


def test_images_are_cached_after_the_first_get(monkeypatch):
    ds = small(train_size=10)
    ds.get(np.arange(10))
    monkeypatch.setattr(shapes, "draw", lambda *a, **k: pytest.fail("drawn twice"))
    ds.get(np.arange(10)[::-1])


def test_two_thousand_images_draw_quickly():
    ds = ShapesDataset("train", 2000)
    start = time.perf_counter()
    ds.get(np.arange(2000))
    # about 0.2 s on one core; generous because the test machine's cores are shared
    assert time.perf_counter() - start < 4.0


def shape_features(images: np.ndarray) -> np.ndarray:
    """Rotation-, scale- and colour-free features of the one shape in each image: how much of its
    circumscribed disc it fills, how its pixels spread from the centroid, and its first Hu moment
    (which tells a triangle from a star: both fill about 40% of their disc)."""
    features = []
    for image in images:
        border = np.concatenate([image[:, 0], image[:, -1], image[:, :, 0], image[:, :, -1]], 1)
        background = np.median(border, axis=1)[:, None, None]
        distance = np.sqrt(((image - background) ** 2).sum(axis=0))
        ys, xs = np.nonzero(distance > 0.5 * np.percentile(distance, 99))
        radius = np.hypot(ys - ys.mean(), xs - xs.mean())
        outer = np.percentile(radius, 98) + 0.5
        features.append([len(ys) / (np.pi * outer ** 2), radius.mean() / outer,
                         (radius < 0.35 * outer).mean(), (radius ** 2).sum() / len(ys) ** 2])
    return np.array(features)


def test_learnable_nearest_class_mean_beats_chance_by_far():
    train = small(train_size=400, num_classes=4)
    val = small("val", val_size=200, num_classes=4)
    x_train, y_train = train.get(np.arange(len(train)))
    x_val, y_val = val.get(np.arange(len(val)))
    f_train, f_val = shape_features(x_train), shape_features(x_val)
    scale = f_train.std(axis=0) + 1e-9
    means = np.stack([f_train[y_train == c].mean(axis=0) for c in range(4)]) / scale
    distances = (((f_val / scale)[:, None] - means[None]) ** 2).sum(axis=-1)
    predicted = np.argmin(distances, axis=1)
    accuracy = (predicted == y_val).mean()
    assert accuracy > 0.8, accuracy  # chance is 0.25; a small CNN gets over 0.95


@pytest.mark.parametrize("key, value", [("num_classes", 9), ("num_classes", 1),
                                        ("image_size", 0), ("channels", 2),
                                        ("train_size", 0), ("seed", -1), ("image_size", 3.5)])
def test_bad_options_are_config_errors_naming_the_key(key, value):
    with pytest.raises(ConfigError) as error:
        small(**{key: value})
    assert_one_line(error, f"data.{key}")


def test_unknown_split_is_a_config_error():
    with pytest.raises(ConfigError) as error:
        small("test")
    assert_one_line(error, "split", "train or val")


# -- a split that cannot fit in host memory is the config's mistake, named by its key ---------
@pytest.mark.parametrize("split, options, key, found, what", [
    ("train", {"image_size": 100_000, "train_size": 4000}, "data.image_size", 100_000,
     "4000 images of 3x100000x100000 = 109.1 TiB"),
    ("train", {"train_size": 10**12}, "data.train_size", 10**12,
     "1000000000000 images of 3x32x32 = 2.7 PiB"),
    ("val", {"val_size": 10**12, "channels": 1}, "data.val_size", 10**12,
     "1000000000000 images of 1x32x32 = 931.3 TiB"),
])
def test_a_split_too_big_for_host_memory_names_the_key(split, options, key, found, what):
    """Checked before anything is allocated: numpy's MemoryError traceback (or a cache the
    kernel kills the process for filling) becomes one line naming the data.* key."""
    with pytest.raises(ConfigError) as error:
        make_dataset("shapes", split, **options)
    message = assert_one_line(error, f"{key}: expected a data set that fits in host memory "
                                     f"({what}; ", " available), found " + str(found))
    assert message.endswith(f"found {found}")


def test_the_key_blamed_is_the_one_that_made_the_split_big(monkeypatch):
    from minilms.datasets import base
    monkeypatch.setattr(base, "available_memory", lambda: 10**6)     # about 1 MB free
    assert len(small(image_size=32)) == 64                           # 192 KiB: fits
    with pytest.raises(ConfigError) as error:
        small(image_size=128)                                        # 3 MiB: the size's fault
    assert_one_line(error, "data.image_size:", "(64 images of 3x128x128 = 3.0 MiB; 976.6 KiB "
                                               "available), found 128")
    with pytest.raises(ConfigError) as error:
        small(train_size=1000)                                       # 2.9 MiB at 32x32
    assert_one_line(error, "data.train_size:", "found 1000")


def test_a_memory_error_while_allocating_is_the_same_one_line_error(monkeypatch):
    """The host said nothing (or said enough) and the allocation failed anyway."""
    from minilms.datasets import base

    def out_of_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 109. TiB")

    monkeypatch.setattr(base, "available_memory", lambda: None)
    monkeypatch.setattr(base.CachedDataset, "__init__", out_of_memory)
    with pytest.raises(ConfigError) as error:
        small(image_size=64)
    assert_one_line(error, "data.image_size: expected a data set that fits in host memory "
                           "(64 images of 3x64x64 = 768.0 KiB), found 64")
