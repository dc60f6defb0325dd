"""Augmentation against naive numpy references, and the config section that builds it."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilms.datasets import ArrayDataset, Augment, channel_stats, make_dataset, make_transform
from minilms.datasets.transforms import (
    flip_horizontal,
    normalize,
    pad_and_crop,
    random_crop,
    random_flip,
)
from minilms.errors import ConfigError

from .helpers import assert_one_line


def batch(n=5, c=3, h=6, w=7, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, c, h, w)).astype(np.float32)


def naive_crop(image: np.ndarray, padding: int, top: int, left: int) -> np.ndarray:
    c, h, w = image.shape
    out = np.zeros_like(image)
    for ch in range(c):
        for y in range(h):
            for x in range(w):
                source_y, source_x = top + y - padding, left + x - padding
                if 0 <= source_y < h and 0 <= source_x < w:
                    out[ch, y, x] = image[ch, source_y, source_x]
    return out


@given(padding=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_pad_and_crop_matches_a_pixel_by_pixel_reference(padding, seed):
    images = batch(seed=seed)
    offsets = np.random.default_rng(seed).integers(0, 2 * padding + 1, (len(images), 2))
    cropped = pad_and_crop(images, padding, offsets)
    for image, out, (top, left) in zip(images, cropped, offsets):
        np.testing.assert_array_equal(out, naive_crop(image, padding, top, left))


def test_random_crop_draws_its_offsets_from_the_generator():
    images = batch(n=32)
    out = random_crop(images, 2, np.random.default_rng(5))
    offsets = np.random.default_rng(5).integers(0, 5, (32, 2))
    np.testing.assert_array_equal(out, pad_and_crop(images, 2, offsets))
    assert len({tuple(o) for o in offsets.tolist()}) > 1
    assert random_crop(images, 0, np.random.default_rng(5)) is images


def test_flip_matches_reference_and_random_flip_flips_some():
    images = batch(n=40)
    which = np.arange(40) % 3 == 0
    flipped = flip_horizontal(images, which)
    for i in range(40):
        expected = images[i][:, :, ::-1] if which[i] else images[i]
        np.testing.assert_array_equal(flipped[i], expected)
    randomly = random_flip(images, np.random.default_rng(1))
    changed = [not np.array_equal(a, b) for a, b in zip(randomly, images)]
    assert 5 < sum(changed) < 35
    assert not np.shares_memory(flipped, images)


def test_normalize_matches_reference():
    images = batch()
    mean, std = [0.1, 0.5, 0.9], [0.2, 0.25, 2.0]
    out = normalize(images, mean, std)
    assert out.dtype == np.float32
    for c in range(3):
        np.testing.assert_allclose(out[:, c], (images[:, c] - mean[c]) / std[c], rtol=1e-6)


def test_channel_stats_match_numpy_over_the_whole_split():
    images = (np.random.default_rng(2).random((30, 3, 4, 4)) * 255).astype(np.uint8)
    ds = ArrayDataset("t", "train", ["a"], images, np.zeros(30))
    mean, std = channel_stats(ds, batch_size=7)
    scaled = images.astype(np.float64) / 255
    np.testing.assert_allclose(mean, scaled.mean(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(std, scaled.std(axis=(0, 2, 3)), rtol=1e-5)
    sampled, _ = channel_stats(ds, max_samples=10)
    assert np.abs(sampled - mean).max() < 0.1


def test_channel_stats_are_the_same_bits_whatever_the_threads(monkeypatch):
    """Batches read on threads, in whatever order they finish: their sums are added in the
    batches' order, so the figures are those of one thread, bit for bit."""
    from minilms.datasets import transforms
    images = (np.random.default_rng(4).random((45, 3, 6, 6)) * 255).astype(np.uint8)
    ds = ArrayDataset("t", "train", ["a"], images, np.zeros(45))
    got = {}
    for threads in (1, 4):
        monkeypatch.setattr(transforms, "STATS_THREADS", threads)
        got[threads] = channel_stats(ds, batch_size=4)
    for one, many in zip(got[1], got[4]):
        assert one.tobytes() == many.tobytes()
    # and what a loop over the batches in order gives
    total, total_sq, pixels = np.zeros(3), np.zeros(3), 0
    for start in range(0, 45, 4):
        values = (images[start:start + 4].astype(np.float32) / np.float32(255)).transpose(
            1, 0, 2, 3).reshape(3, -1).astype(np.float64)
        total += values.sum(axis=1)
        total_sq += (values * values).sum(axis=1)
        pixels += values.shape[1]
    mean = total / pixels
    assert got[4][0].tobytes() == mean.astype(np.float32).tobytes()
    std = np.sqrt(np.maximum(total_sq / pixels - mean * mean, 0.0)).astype(np.float32)
    assert got[4][1].tobytes() == std.tobytes()


def test_channel_stats_read_no_more_images_than_max_pixels_hold(monkeypatch):
    """Large images: the sample is cut to ``max_pixels`` a channel (never below 16 images), and
    the statistics are those of the images it read."""
    images = (np.random.default_rng(3).random((40, 3, 8, 8)) * 255).astype(np.uint8)
    ds = ArrayDataset("t", "train", ["a"], images, np.zeros(40))
    read = []
    real_get = ds.get
    monkeypatch.setattr(ds, "get", lambda idx: read.extend(idx) or real_get(idx))
    mean, _ = channel_stats(ds, max_pixels=20 * 64)         # 20 images' pixels
    assert len(read) == 20 and len(set(read)) == 20
    scaled = images[sorted(read)].astype(np.float64) / 255
    np.testing.assert_allclose(mean, scaled.mean(axis=(0, 2, 3)), rtol=1e-5)
    read.clear()
    channel_stats(ds, max_pixels=64)                          # one image's: at least 16
    assert len(read) == 16


def test_augment_applies_crop_flip_then_normalise_reproducibly():
    images = batch(n=8)
    augment = Augment(crop_padding=1, flip=True, mean=[0.5] * 3, std=[0.25] * 3)
    first = augment(images, np.random.default_rng(3))
    np.testing.assert_array_equal(first, augment(images, np.random.default_rng(3)))
    rng = np.random.default_rng(3)
    expected = normalize(random_flip(random_crop(images, 1, rng), rng), [0.5] * 3, [0.25] * 3)
    np.testing.assert_array_equal(first, expected)
    # padding is black before normalisation, so after it is (0 - mean) / std
    crop_only = Augment(crop_padding=6, mean=[0.5] * 3, std=[0.25] * 3)
    assert (crop_only(images, np.random.default_rng(0)) == -2.0).any()


def test_make_transform_from_the_config_section():
    train = make_dataset("shapes", "train", train_size=20, image_size=8)
    train_transform = make_transform({"crop_padding": 2, "flip": True, "normalize": True},
                                     train, train=True)
    val_transform = make_transform({"crop_padding": 2, "flip": True, "normalize": True},
                                   train, train=False)
    assert (train_transform.crop_padding, train_transform.flip) == (2, True)
    assert (val_transform.crop_padding, val_transform.flip) == (0, False)
    np.testing.assert_array_equal(train_transform.mean, channel_stats(train)[0])
    np.testing.assert_array_equal(val_transform.std, train_transform.std)
    images, _ = train.get(np.arange(20))
    normalised = val_transform(images, np.random.default_rng(0))
    np.testing.assert_allclose(normalised.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(normalised.std(axis=(0, 2, 3)), 1, atol=1e-4)
    given_stats = make_transform({"normalize": {"mean": [0, 0, 0], "std": [1, 2, 4]}}, train, True)
    assert given_stats.std.tolist() == [1, 2, 4]
    assert make_transform({"normalize": False}, train, train=False) is None
    assert make_transform(None, train, True).mean is not None  # normalize defaults to true


def test_the_train_and_validation_transforms_read_the_statistics_once(monkeypatch):
    """Both transforms normalise with the training split's statistics: read once a split (the
    images of a large one take most of a second), the same figures for both, each its own."""
    from minilms.datasets import transforms
    calls = []
    monkeypatch.setattr(transforms, "channel_stats",
                        lambda dataset: calls.append(dataset) or channel_stats(dataset))
    train = make_dataset("shapes", "train", train_size=12, image_size=8)
    first = make_transform(None, train, True)
    second = make_transform(None, train, False)
    assert calls == [train]
    assert first.mean.tobytes() == second.mean.tobytes() == channel_stats(train)[0].tobytes()
    assert first.mean is not second.mean
    other = make_dataset("shapes", "train", train_size=12, image_size=8, seed=1)
    make_transform(None, other, True)
    assert calls == [train, other]


@pytest.mark.parametrize("section, key", [
    ({"crop_padding": -1}, "data.augment.crop_padding"),
    ({"flip": "yes"}, "data.augment.flip"),
    ({"normalize": {"mean": [0, 0], "std": [1, 1]}}, "data.augment.normalize"),
    ({"normalize": {"mean": [0, 0, 0], "std": [1, 0, 1]}}, "data.augment.normalize"),
    ({"normalize": "imagenet"}, "data.augment.normalize"),
    ({"rotate": 10}, "data.augment.rotate"),
])
def test_bad_augment_settings_are_config_errors(section, key):
    train = make_dataset("shapes", "train", train_size=4, image_size=8)
    with pytest.raises(ConfigError) as error:
        make_transform(section, train, train=True)
    assert_one_line(error, key)
