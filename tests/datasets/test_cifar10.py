"""CIFAR-10 binary batches: exact round trips, both directory layouts, class names, bad files."""
from pathlib import Path

import numpy as np
import pytest

from minilms.datasets import make_dataset
from minilms.errors import ConfigError, DatasetError

from .helpers import assert_one_line

RECORD = 3073


def records(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8),
            rng.integers(0, 10, count, dtype=np.uint8))


def write_batch(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    rows = np.concatenate([labels[:, None], images.reshape(len(images), -1)], axis=1)
    path.write_bytes(rows.astype(np.uint8).tobytes())
    return path


def write_cifar(folder: Path) -> dict:
    """Five training batches of 2, 3, 1, 2, 2 records and a test batch of 4."""
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for number, count in enumerate((2, 3, 1, 2, 2), start=1):
        batches[f"data_batch_{number}.bin"] = records(count, number)
        write_batch(folder / f"data_batch_{number}.bin", *batches[f"data_batch_{number}.bin"])
    batches["test_batch.bin"] = records(4, 99)
    write_batch(folder / "test_batch.bin", *batches["test_batch.bin"])
    return batches


def sample_options(tmp_path, name) -> dict:
    """The data.* options of a small instance of format ``name``, written under ``tmp_path``:
    the registry's tests open every format this way to check its declared facts."""
    write_cifar(tmp_path)
    return {"root": tmp_path, "image_size": 32}


def test_values_round_trip_exactly_in_file_order(tmp_path):
    batches = write_cifar(tmp_path)
    train = make_dataset("cifar10", "train", root=tmp_path)
    expected_images = np.concatenate([batches[f"data_batch_{i}.bin"][0] for i in range(1, 6)])
    expected_labels = np.concatenate([batches[f"data_batch_{i}.bin"][1] for i in range(1, 6)])
    images, labels = train.get(np.arange(len(train)))
    assert (len(train), train.shape, train.classes[0], train.num_classes) == \
        (10, (3, 32, 32), "airplane", 10)
    np.testing.assert_array_equal(images, expected_images.astype(np.float32) / 255)
    np.testing.assert_array_equal(labels, expected_labels)
    val = make_dataset("cifar10", "val", root=tmp_path)
    np.testing.assert_array_equal(val.get([3, 1])[0],
                                  batches["test_batch.bin"][0][[3, 1]].astype(np.float32) / 255)


def test_archive_folder_and_meta_class_names(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    write_cifar(folder)
    names = [f"thing{i}" for i in range(10)]
    (folder / "batches.meta.txt").write_text("\n".join(names) + "\n\n")
    ds = make_dataset("cifar10", "val", root=tmp_path)
    assert len(ds) == 4 and list(ds.classes) == names


def test_grey_conversion_uses_luma(tmp_path):
    batches = write_cifar(tmp_path)
    ds = make_dataset("cifar10", "val", root=tmp_path, channels=1)
    rgb = batches["test_batch.bin"][0][0].astype(np.float64)
    luma = np.rint(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])
    np.testing.assert_allclose(ds.get([0])[0][0, 0] * 255, luma, atol=1.01)
    assert ds.shape == (1, 32, 32)


@pytest.mark.parametrize("size", [RECORD - 1, RECORD + 5, 2 * RECORD + 3072])
def test_size_not_a_multiple_of_the_record_is_an_error(tmp_path, size):
    write_cifar(tmp_path)
    bad = tmp_path / "data_batch_3.bin"
    bad.write_bytes(bytes(size))
    with pytest.raises(DatasetError) as error:
        make_dataset("cifar10", "train", root=tmp_path)
    assert_one_line(error, bad, "3073-byte records", f"{size} bytes")


def test_empty_file_is_an_error(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "test_batch.bin").write_bytes(b"")
    with pytest.raises(DatasetError) as error:
        make_dataset("cifar10", "val", root=tmp_path)
    assert_one_line(error, tmp_path / "test_batch.bin", "an empty file")


def test_label_out_of_range_names_the_record(tmp_path):
    write_cifar(tmp_path)
    images, labels = records(3, 5)
    labels[2] = 10
    bad = write_batch(tmp_path / "test_batch.bin", images, labels)
    with pytest.raises(DatasetError) as error:
        make_dataset("cifar10", "val", root=tmp_path)
    assert_one_line(error, bad, "label 10 in record 2")


def test_every_training_batch_is_required(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "data_batch_5.bin").unlink()
    with pytest.raises(DatasetError) as error:
        make_dataset("cifar10", "train", root=tmp_path)
    assert_one_line(error, tmp_path / "data_batch_5.bin", "no such file")


def test_wrong_image_size_and_missing_root_are_config_errors(tmp_path):
    write_cifar(tmp_path)
    with pytest.raises(ConfigError) as error:
        make_dataset("cifar10", "train", root=tmp_path, image_size=28)
    assert_one_line(error, "data.image_size", "32 for cifar10")
    with pytest.raises(ConfigError) as error:
        make_dataset("cifar10", "train", root=tmp_path / "missing")
    assert_one_line(error, "data.root")


def test_a_batch_bigger_than_host_memory_names_the_file(tmp_path, monkeypatch):
    from minilms.datasets import base
    write_cifar(tmp_path)
    monkeypatch.setattr(base, "available_memory", lambda: 7000)       # 2 records, not 3
    with pytest.raises(DatasetError) as error:
        make_dataset("cifar10", "train", root=tmp_path)
    assert_one_line(error, f"{tmp_path / 'data_batch_2.bin'}: expected data that fits in host "
                           "memory (6.8 KiB available), found a file of 9.0 KiB")
