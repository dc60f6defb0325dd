"""Image folders: both layouts, sorted classes, exact pixels, resize and crop as documented,
deterministic splits, and unreadable files named."""
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from minilms.datasets import BatchLoader, make_dataset
from minilms.errors import ConfigError, DatasetError

from .helpers import assert_one_line


def write_png(path: Path, pixels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def random_rgb(seed: int, height: int = 8, width: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def sample_options(tmp_path, name) -> dict:
    """The data.* options of a small instance of format ``name``, written under ``tmp_path``:
    the registry's tests open every format this way to check its declared facts."""
    for i, label in enumerate("abc"):
        write_png(tmp_path / "train" / label / "0.png", random_rgb(i))
    write_png(tmp_path / "val" / "a" / "0.png", random_rgb(3))
    return {"root": tmp_path, "image_size": 8}


def test_split_layout_round_trips_pixels_with_sorted_classes(tmp_path):
    written = {}
    for s, (split, count) in enumerate((("train", 3), ("val", 2))):
        for c, name in enumerate(("zebra", "ant")):
            for i in range(count):
                pixels = random_rgb(100 * s + 10 * c + i)
                written[(split, name, i)] = write_png(tmp_path / split / name / f"{i}.png", pixels)
    (tmp_path / "train" / "ant" / "notes.txt").write_text("not an image")
    (tmp_path / "train" / ".hidden").mkdir()
    train = make_dataset("imagefolder", "train", root=tmp_path, image_size=8)
    val = make_dataset("imagefolder", "val", root=tmp_path, image_size=8)
    assert train.classes == ("ant", "zebra") and (len(train), len(val)) == (6, 4)
    images, labels = train.get(np.arange(6))
    for image, label, path in zip(images, labels, train.files):
        assert train.classes[label] == path.parent.name
        np.testing.assert_array_equal(image, np.asarray(Image.open(path)).transpose(2, 0, 1) /
                                      np.float32(255))


def test_test_folder_is_accepted_as_val(tmp_path):
    write_png(tmp_path / "train" / "a" / "x.png", random_rgb(0))
    write_png(tmp_path / "test" / "a" / "y.png", random_rgb(1))
    assert len(make_dataset("imagefolder", "val", root=tmp_path, image_size=8)) == 1


def test_flat_layout_splits_each_class_deterministically(tmp_path):
    for name, count in (("cat", 10), ("dog", 5)):
        for i in range(count):
            write_png(tmp_path / name / f"{i:02d}.png", random_rgb(i))
    options = dict(root=tmp_path, image_size=8, val_fraction=0.4)
    train = make_dataset("imagefolder", "train", **options)
    val = make_dataset("imagefolder", "val", **options)
    assert set(train.files).isdisjoint(val.files)
    assert len(train.files) + len(val.files) == 15
    assert np.bincount(val.labels).tolist() == [4, 2]  # 40% of each class
    assert make_dataset("imagefolder", "val", **options).files == val.files
    other = make_dataset("imagefolder", "val", **options, seed=3).files
    assert other != val.files


def test_shorter_side_resized_then_centre_cropped(tmp_path):
    wide = random_rgb(5, height=20, width=40)
    write_png(tmp_path / "c" / "wide.png", wide)
    ds = make_dataset("imagefolder", "train", root=tmp_path, image_size=10, val_fraction=0.01)
    resized = Image.fromarray(wide).resize((20, 10), Image.Resampling.BILINEAR)
    reference = resized.crop((5, 0, 15, 10))
    images, _ = ds.get([0])
    np.testing.assert_array_equal(np.rint(images[0] * 255).astype(np.uint8),
                                  np.asarray(reference).transpose(2, 0, 1))


def test_channels_converted_by_pillow(tmp_path):
    rgb = random_rgb(9)
    write_png(tmp_path / "c" / "a.png", rgb)
    ds = make_dataset("imagefolder", "train", root=tmp_path, image_size=8, channels=1,
                      val_fraction=0.01)
    expected = np.asarray(Image.fromarray(rgb).convert("L"))
    assert ds.shape == (1, 8, 8)
    np.testing.assert_array_equal(np.rint(ds.get([0])[0][0, 0] * 255), expected)
    grey = tmp_path / "g"
    write_png(grey / "c" / "g.png", rgb[:, :, 0])
    three = make_dataset("imagefolder", "train", root=grey, image_size=8, val_fraction=0.01)
    images, _ = three.get([0])
    assert three.shape == (3, 8, 8) and (images[0] == images[0, :1]).all()


def corrupt_folder(tmp_path: Path, keep=lambda data: data[:40]) -> Path:
    for i in range(3):
        write_png(tmp_path / "train" / "a" / f"{i}.png", random_rgb(i, 32, 32))
    write_png(tmp_path / "val" / "a" / "ok.png", random_rgb(7))
    bad = tmp_path / "train" / "a" / "1.png"
    bad.write_bytes(keep(bad.read_bytes()))
    return bad


@pytest.mark.parametrize("keep, found", [
    (lambda data: data[:40], "cannot identify"),            # the header is cut
    (lambda data: data[:len(data) // 2], "truncated"),      # the pixels are cut
    (lambda data: b"", "cannot identify"),                  # empty
], ids=["header", "pixels", "empty"])
def test_unreadable_image_is_a_dataset_error_naming_the_file(tmp_path, keep, found):
    bad = corrupt_folder(tmp_path, keep)
    ds = make_dataset("imagefolder", "train", root=tmp_path, image_size=8, cache=False)
    ds.get([0, 2])  # the good ones still read
    with pytest.raises(DatasetError) as error:
        ds.get([1])
    assert_one_line(error, bad, "an image Pillow can read", found)


def test_unreadable_image_surfaces_through_the_loader(tmp_path):
    bad = corrupt_folder(tmp_path)
    ds = make_dataset("imagefolder", "train", root=tmp_path, image_size=8)
    with pytest.raises(DatasetError) as error:
        for _ in BatchLoader(ds, batch_size=1, shuffle=False):
            pass
    assert_one_line(error, bad)


def test_val_class_missing_from_train_is_an_error(tmp_path):
    write_png(tmp_path / "train" / "a" / "x.png", random_rgb(0))
    write_png(tmp_path / "val" / "b" / "y.png", random_rgb(1))
    with pytest.raises(DatasetError) as error:
        make_dataset("imagefolder", "val", root=tmp_path, image_size=8)
    assert_one_line(error, tmp_path / "val" / "b")


def test_empty_or_missing_folders_and_missing_size(tmp_path):
    with pytest.raises(DatasetError) as error:
        make_dataset("imagefolder", "train", root=tmp_path, image_size=8)
    assert_one_line(error, tmp_path, "class")
    (tmp_path / "c").mkdir()
    with pytest.raises(DatasetError) as error:
        make_dataset("imagefolder", "train", root=tmp_path, image_size=8)
    assert_one_line(error, "images for the train split")
    with pytest.raises(ConfigError) as error:
        make_dataset("imagefolder", "train", root=tmp_path)
    assert_one_line(error, "data.image_size")
    with pytest.raises(ConfigError) as error:
        make_dataset("imagefolder", "train", root=tmp_path / "none", image_size=8)
    assert_one_line(error, "data.root")
    write_png(tmp_path / "c" / "x.png", random_rgb(0))
    with pytest.raises(ConfigError) as error:
        make_dataset("imagefolder", "train", root=tmp_path, image_size=8, num_classes=3)
    assert_one_line(error, "data.num_classes")


def test_a_cache_too_big_for_host_memory_names_image_size(tmp_path, monkeypatch):
    from minilms.datasets import base
    for i, label in enumerate("ab"):
        write_png(tmp_path / label / "0.png", random_rgb(i))
        write_png(tmp_path / label / "1.png", random_rgb(i + 2))
    with pytest.raises(ConfigError) as error:             # each image alone is 28 TiB
        make_dataset("imagefolder", "train", root=tmp_path, image_size=3_000_000, cache=False)
    assert_one_line(error, "data.image_size: expected a data set that fits in host memory "
                           "(1 image of 3x3000000x3000000 = 24.6 TiB;", "found 3000000")
    monkeypatch.setattr(base, "available_memory", lambda: 10_000)
    with pytest.raises(ConfigError) as error:             # four cached 64x64 images: 48 KiB
        make_dataset("imagefolder", "train", root=tmp_path, image_size=64)
    assert_one_line(error, "data.image_size:", "(4 images of 3x64x64 = 48.0 KiB; 9.8 KiB "
                           "available), found 64; or set data.cache: false")
    ds = make_dataset("imagefolder", "train", root=tmp_path, image_size=32, cache=False)
    assert ds.get([0])[0].shape == (1, 3, 32, 32)         # one at a time fits
