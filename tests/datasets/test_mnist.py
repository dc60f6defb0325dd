"""MNIST and Fashion-MNIST IDX files: exact round trips, plain and gzipped, and every way a file
can be wrong named in one line."""
import gzip
from pathlib import Path

import numpy as np
import pytest

from minilms.datasets import make_dataset
from minilms.errors import ConfigError, DatasetError

from .helpers import assert_one_line

rng = np.random.default_rng(7)
TRAIN_IMAGES = rng.integers(0, 256, (12, 28, 28), dtype=np.uint8)
TRAIN_LABELS = rng.integers(0, 10, 12, dtype=np.uint8)
TEST_IMAGES = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
TEST_LABELS = rng.integers(0, 10, 5, dtype=np.uint8)


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write(path: Path, data: bytes, gz: bool) -> Path:
    path = path.with_name(path.name + ".gz") if gz else path
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def write_mnist(root: Path, gz: bool = False, images=TRAIN_IMAGES, labels=TRAIN_LABELS) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    return {
        "train_images": write(root / "train-images-idx3-ubyte", idx_bytes(images, 2051), gz),
        "train_labels": write(root / "train-labels-idx1-ubyte", idx_bytes(labels, 2049), gz),
        "test_images": write(root / "t10k-images-idx3-ubyte", idx_bytes(TEST_IMAGES, 2051), gz),
        "test_labels": write(root / "t10k-labels-idx1-ubyte", idx_bytes(TEST_LABELS, 2049), gz),
    }


def sample_options(tmp_path, name) -> dict:
    """The data.* options of a small instance of format ``name``, written under ``tmp_path``:
    the registry's tests open every format this way to check its declared facts."""
    write_mnist(tmp_path)  # the labels are 0..9, so the files are Fashion-MNIST's as well
    return {"root": tmp_path, "image_size": 28}


def pixels(ds) -> np.ndarray:
    images, _ = ds.get(np.arange(len(ds)))
    return np.rint(images * 255).astype(np.uint8)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_values_round_trip_exactly(tmp_path, gz):
    write_mnist(tmp_path, gz)
    train = make_dataset("mnist", "train", root=tmp_path)
    val = make_dataset("mnist", "val", root=tmp_path)
    assert (len(train), len(val), train.shape, train.num_classes) == (12, 5, (1, 28, 28), 10)
    np.testing.assert_array_equal(pixels(train)[:, 0], TRAIN_IMAGES)
    np.testing.assert_array_equal(train.labels, TRAIN_LABELS)
    np.testing.assert_array_equal(pixels(val)[:, 0], TEST_IMAGES)
    images, labels = val.get([4, 0])
    np.testing.assert_array_equal(images[:, 0], TEST_IMAGES[[4, 0]].astype(np.float32) / 255)
    assert labels.dtype == np.int32 and labels.tolist() == TEST_LABELS[[4, 0]].tolist()


def test_fashion_mnist_reads_the_same_files_with_its_class_names(tmp_path):
    write_mnist(tmp_path)
    ds = make_dataset("fashion_mnist", "train", root=tmp_path)
    assert ds.classes[0] == "T-shirt/top" and ds.classes[9] == "Ankle boot"
    np.testing.assert_array_equal(pixels(ds)[:, 0], TRAIN_IMAGES)


def test_torchvision_layout_and_kaggle_spelling_are_found(tmp_path):
    write_mnist(tmp_path / "MNIST" / "raw", gz=True)
    assert len(make_dataset("mnist", "train", root=tmp_path)) == 12
    kaggle = tmp_path / "kaggle"
    kaggle.mkdir()
    for path in write_mnist(tmp_path / "plain").values():
        (kaggle / path.name.replace("-idx", ".idx")).write_bytes(path.read_bytes())
    assert len(make_dataset("mnist", "val", root=kaggle)) == 5


def test_grey_becomes_rgb_when_three_channels_are_asked(tmp_path):
    write_mnist(tmp_path)
    ds = make_dataset("mnist", "train", root=tmp_path, channels=3, image_size=28, num_classes=10)
    images, _ = ds.get([3])
    assert ds.shape == (3, 28, 28)
    for channel in range(3):
        np.testing.assert_array_equal(images[0, channel], TRAIN_IMAGES[3] / np.float32(255))


def test_truncated_file_names_the_file(tmp_path):
    paths = write_mnist(tmp_path)
    data = paths["train_images"].read_bytes()
    paths["train_images"].write_bytes(data[:-100])
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "train", root=tmp_path)
    assert_one_line(error, paths["train_images"], "truncated", "9408 data bytes")


def test_truncated_header_names_the_file(tmp_path):
    paths = write_mnist(tmp_path)
    paths["train_labels"].write_bytes(b"\x00\x00")
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "train", root=tmp_path)
    assert_one_line(error, paths["train_labels"], "truncated")


def test_trailing_bytes_are_an_error(tmp_path):
    paths = write_mnist(tmp_path)
    paths["test_labels"].write_bytes(paths["test_labels"].read_bytes() + b"\x01")
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "val", root=tmp_path)
    assert_one_line(error, paths["test_labels"], "trailing")


@pytest.mark.parametrize("dims", [(2**32 - 1,) * 3, (2**22, 2**21, 2**21)],
                         ids=["product 2^96", "product 2^64, 0 in int64"])
def test_dimensions_whose_product_overflows_name_the_file(tmp_path, dims):
    """Sizes are uint32: three of them multiply past 2^64, where numpy's int64 product wraps
    (to a wrong byte count, or to 0, which an empty payload then "matches")."""
    paths = write_mnist(tmp_path)
    header = (2051).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
    paths["train_images"].write_bytes(header + bytes(100 if dims[0] == 2**32 - 1 else 0))
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "train", root=tmp_path)
    payload, product = (100 if dims[0] == 2**32 - 1 else 0), dims[0] * dims[1] * dims[2]
    assert_one_line(error, f"{paths['train_images']}: expected image dimensions whose product "
                           f"fits the file ({payload} data bytes after the header), found "
                           f"dimensions {'x'.join(map(str, dims))} (product {product})")


def test_a_file_bigger_than_host_memory_names_the_file(tmp_path, monkeypatch):
    from minilms.datasets import base
    paths = write_mnist(tmp_path, gz=True)
    monkeypatch.setattr(base, "available_memory", lambda: 100)
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "train", root=tmp_path)
    assert_one_line(error, f"{paths['train_images']}: expected data that fits in host memory "
                           "(100 B available), found a file of ", " KiB")


def test_a_gzip_that_inflates_past_host_memory_names_the_file(tmp_path, monkeypatch):
    paths = write_mnist(tmp_path, gz=True)

    def inflate_too_much(data):
        raise MemoryError

    monkeypatch.setattr("minilms.datasets.mnist.gzip.decompress", inflate_too_much)
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "train", root=tmp_path)
    assert_one_line(error, f"{paths['train_images']}: expected a gzip file whose contents fit in "
                           "host memory (", "available), found MemoryError")


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_wrong_magic_names_the_file_and_both_numbers(tmp_path, gz):
    paths = write_mnist(tmp_path, gz)
    # the labels file where the images should be: a classic mix-up
    paths["train_images"].write_bytes(paths["train_labels"].read_bytes())
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "train", root=tmp_path)
    assert_one_line(error, paths["train_images"], "2051", "found 2049")


def test_label_count_must_match_image_count(tmp_path):
    paths = write_mnist(tmp_path, labels=TRAIN_LABELS[:-1])
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "train", root=tmp_path)
    assert_one_line(error, paths["train_labels"], "12 labels", "found 11")


def test_labels_out_of_range(tmp_path):
    paths = write_mnist(tmp_path, labels=np.full(12, 10, np.uint8))
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "train", root=tmp_path)
    assert_one_line(error, paths["train_labels"], "0..9", "label 10")


def test_truncated_gzip_names_the_file(tmp_path):
    paths = write_mnist(tmp_path, gz=True)
    data = paths["train_images"].read_bytes()
    paths["train_images"].write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "train", root=tmp_path)
    assert_one_line(error, paths["train_images"], "gzip")


def test_gzip_crc_error_names_the_file(tmp_path):
    paths = write_mnist(tmp_path, gz=True)
    data = bytearray(paths["test_images"].read_bytes())
    data[-8] ^= 0xFF  # the CRC32 in the gzip trailer
    paths["test_images"].write_bytes(bytes(data))
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "val", root=tmp_path)
    assert_one_line(error, paths["test_images"], "gzip", "CRC")


def test_missing_file_is_named(tmp_path):
    write_mnist(tmp_path)["test_labels"].unlink()
    with pytest.raises(DatasetError) as error:
        make_dataset("mnist", "val", root=tmp_path)
    assert_one_line(error, tmp_path / "t10k-labels-idx1-ubyte", "no such file")


def test_missing_root_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as error:
        make_dataset("mnist", "train", root=tmp_path / "nowhere")
    assert_one_line(error, "data.root", "nowhere")
    with pytest.raises(ConfigError) as error:
        make_dataset("mnist", "train")
    assert_one_line(error, "data.root")


@pytest.mark.parametrize("key, value", [("image_size", 32), ("num_classes", 4), ("channels", 2)])
def test_options_that_contradict_the_files_are_config_errors(tmp_path, key, value):
    write_mnist(tmp_path)
    with pytest.raises(ConfigError) as error:
        make_dataset("mnist", "train", root=tmp_path, **{key: value})
    assert_one_line(error, f"data.{key}")
