"""npz arrays: every image layout and dtype round-trips, x/y is split deterministically, and
pickles and malformed arrays are refused with the file named."""
import io
import zipfile

import numpy as np
import pytest

from minilms.datasets import make_dataset
from minilms.errors import ConfigError, DatasetError

from .helpers import assert_one_line

rng = np.random.default_rng(3)
NCHW = rng.integers(0, 256, (6, 3, 5, 5), dtype=np.uint8)
LABELS = np.array([0, 1, 2, 0, 1, 2], np.int64)
TEST = rng.integers(0, 256, (4, 3, 5, 5), dtype=np.uint8)
TEST_LABELS = np.array([2, 2, 0, 3], np.int64)


def save(tmp_path, **arrays):
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return path


def as_uint8(ds) -> np.ndarray:
    return np.rint(ds.get(np.arange(len(ds)))[0] * 255).astype(np.uint8)


def sample_options(tmp_path, name) -> dict:
    """The data.* options of a small instance of format ``name``, written under ``tmp_path``:
    the registry's tests open every format this way to check its declared facts."""
    path = save(tmp_path, x_train=NCHW, y_train=LABELS, x_test=TEST, y_test=TEST_LABELS)
    return {"root": path, "image_size": 5}


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_uint8_images_round_trip_in_either_layout(tmp_path, layout):
    def arrange(x):
        return x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    path = save(tmp_path, x_train=arrange(NCHW), y_train=LABELS, x_test=arrange(TEST),
                y_test=TEST_LABELS)
    train = make_dataset("npz", "train", root=path)
    val = make_dataset("npz", "val", root=path)
    np.testing.assert_array_equal(as_uint8(train), NCHW)
    np.testing.assert_array_equal(as_uint8(val), TEST)
    np.testing.assert_array_equal(val.labels, TEST_LABELS)
    assert train.num_classes == 4  # the largest label in either split counts
    assert train.classes == ("0", "1", "2", "3") and train.shape == (3, 5, 5)


def test_grey_float_images_are_kept_as_given(tmp_path):
    grey = rng.random((6, 7, 4)).astype(np.float64)
    path = save(tmp_path, x_train=grey, y_train=LABELS, x_test=grey[:2], y_test=LABELS[:2],
                classes=np.array(["a", "b", "c"]))
    ds = make_dataset("npz", "train", root=path)
    images, labels = ds.get(np.arange(6))
    assert ds.shape == (1, 7, 4) and ds.classes == ("a", "b", "c")
    np.testing.assert_array_equal(images[:, 0], grey.astype(np.float32))
    np.testing.assert_array_equal(labels, LABELS)


def test_x_and_y_are_split_deterministically(tmp_path):
    x = np.arange(20, dtype=np.uint8).reshape(20, 1, 1, 1).repeat(2, axis=2)
    path = save(tmp_path, x=x, y=np.arange(20) % 2)
    train = make_dataset("npz", "train", root=path, val_fraction=0.25)
    val = make_dataset("npz", "val", root=path, val_fraction=0.25)
    train_ids = set(as_uint8(train)[:, 0, 0, 0].tolist())
    val_ids = set(as_uint8(val)[:, 0, 0, 0].tolist())
    assert len(val_ids) == 5 and train_ids.isdisjoint(val_ids)
    assert train_ids | val_ids == set(range(20))
    again = make_dataset("npz", "val", root=path, val_fraction=0.25)
    np.testing.assert_array_equal(as_uint8(again), as_uint8(val))
    np.testing.assert_array_equal(val.labels, as_uint8(val)[:, 0, 0, 0] % 2)


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    # An npz whose y_train declares object dtype; its "pickle" is junk that must never be read.
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|O", "fortran_order": False,
                                                  "shape": (6,)})
    path = save(tmp_path, x_train=NCHW, x_test=TEST, y_test=TEST_LABELS)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("y_train.npy", header.getvalue() + b"not a pickle")
    with pytest.raises(DatasetError) as error:
        make_dataset("npz", "train", root=path)
    assert_one_line(error, path, "pickled (object) data, which is refused")


def test_a_pickle_file_is_refused(tmp_path):
    path = tmp_path / "evil.npz"
    path.write_bytes(b"\x80\x04K\x01.")  # the protocol-4 pickle of 1, written by hand
    with pytest.raises(DatasetError) as error:
        make_dataset("npz", "train", root=path)
    assert "pickle.load" not in assert_one_line(error, path, "refused")


@pytest.mark.parametrize("arrays, fragment", [
    ({"x": NCHW, "labels": LABELS}, "x_train, y_train, x_test, y_test (or x, y)"),
    ({"x": NCHW[:, :, :, :, None], "y": LABELS}, "shape [6, 3, 5, 5, 1]"),
    ({"x": NCHW[:, :2], "y": LABELS}, "C of 1 or 3"),
    ({"x": NCHW.astype(np.int32), "y": LABELS}, "dtype int32"),
    ({"x": NCHW.astype(np.float32), "y": LABELS}, "values from 0.0 to"),
    ({"x": NCHW, "y": LABELS[:5]}, "one label per image (6)"),
    ({"x": NCHW, "y": LABELS.astype(np.float32)}, "1-d integer array"),
    ({"x": NCHW, "y": -LABELS}, "label -2"),
])
def test_malformed_arrays_name_the_file(tmp_path, arrays, fragment):
    path = save(tmp_path, **arrays)
    with pytest.raises(DatasetError) as error:
        make_dataset("npz", "train", root=path)
    assert_one_line(error, path, fragment)


@pytest.mark.parametrize("content, found", [
    (b"x,y\n1,2\n3,4\n", "a file that is not a zip archive (it begins b'x,y\\n1,2\\n3,4\\n')"),
    (b"", "a file that is not a zip archive (an empty file)"),
    (b"\x89PNG\r\n\x1a\n", "a file that is not a zip archive (it begins b'\\x89PNG"),
])
def test_a_file_that_is_not_a_zip_is_named_as_such_not_as_a_pickle(tmp_path, content, found):
    """numpy tries anything that is neither .npz nor .npy as a pickle, and says so: a CSV
    renamed .npz must be called what it is, with no word of pickles."""
    path = tmp_path / "data.npz"
    path.write_bytes(content)
    with pytest.raises(DatasetError) as error:
        make_dataset("npz", "train", root=path)
    message = assert_one_line(error, f"{path}: expected an .npz (zip) archive of plain arrays, "
                                     f"found {found}")
    assert "pickle" not in message


def test_an_array_bigger_than_host_memory_is_refused_from_its_header(tmp_path, monkeypatch):
    from minilms.datasets import base
    path = tmp_path / "data.npz"
    np.savez_compressed(path, x=np.zeros((6, 3, 64, 64), np.uint8), y=LABELS)   # 72 KiB inflated
    monkeypatch.setattr(base, "available_memory", lambda: 50_000)
    assert path.stat().st_size < 50_000
    with pytest.raises(DatasetError) as error:
        make_dataset("npz", "train", root=path)
    assert_one_line(error, f"{path}: expected data that fits in host memory (48.8 KiB "
                           "available), found x [6, 3, 64, 64] uint8 of 72.0 KiB")


def test_truncated_archive_names_the_file(tmp_path):
    path = save(tmp_path, x=NCHW, y=LABELS)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError) as error:
        make_dataset("npz", "train", root=path)
    assert_one_line(error, path)


def test_a_single_npy_array_is_refused(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, NCHW)
    with pytest.raises(DatasetError) as error:
        make_dataset("npz", "train", root=path)
    assert_one_line(error, path, "single .npy")


def test_root_must_be_a_file_and_sizes_must_agree(tmp_path):
    with pytest.raises(ConfigError) as error:
        make_dataset("npz", "train", root=tmp_path)
    assert_one_line(error, "data.root", ".npz file")
    path = save(tmp_path, x=NCHW, y=LABELS)
    with pytest.raises(ConfigError) as error:
        make_dataset("npz", "train", root=path, image_size=32)
    assert_one_line(error, "data.image_size", "5 for npz")
