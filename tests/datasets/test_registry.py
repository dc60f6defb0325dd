"""The registry and make_dataset: names, option routing, one-line errors, and no pickle."""
import re
from pathlib import Path

import pytest

import minilms.datasets
from minilms.datasets import DATASETS, OPTIONS, make_dataset, register
from minilms.errors import ConfigError

from .helpers import assert_one_line


def test_every_format_is_registered_with_its_options():
    assert list(DATASETS) == ["shapes", "mnist", "fashion_mnist", "cifar10", "imagefolder", "npz"]
    assert DATASETS["shapes"].options == {"image_size", "channels", "num_classes", "train_size",
                                          "val_size", "seed"}
    assert "root" in DATASETS["mnist"].options and "train_size" not in DATASETS["mnist"].options
    for spec in DATASETS.values():
        assert spec.options <= set(OPTIONS) and spec.summary


def test_options_a_format_does_not_use_are_ignored():
    # the whole data section can be passed, whatever the dataset
    ds = make_dataset("shapes", "val", root="/nonexistent", val_size=3, val_fraction=0.5,
                      cache=False, image_size=8)
    assert len(ds) == 3


def test_unknown_dataset_and_unknown_option_are_config_errors():
    with pytest.raises(ConfigError) as error:
        make_dataset("imagenet", "train")
    assert_one_line(error, "data.dataset", "shapes, mnist", "imagenet")
    with pytest.raises(ConfigError) as error:
        make_dataset("shapes", "train", imagesize=32)
    assert_one_line(error, "data.imagesize")


def test_register_refuses_options_outside_the_documented_set():
    def open_odd(split, *, colour_space=None):
        """An odd format."""
    with pytest.raises(ValueError, match="colour_space"):
        register("odd", open_odd)
    assert "odd" not in DATASETS


def test_nothing_in_the_package_unpickles():
    package = Path(minilms.datasets.__file__).parent
    for source in package.glob("*.py"):
        text = source.read_text()
        unpicklers = r"^\s*(import|from)\s+(pickle|cPickle|dill|joblib)\b"
        assert not re.search(unpicklers, text, re.M), source
        assert "allow_pickle=True" not in text, source
        for call in re.findall(r"np\.load\([^)]*\)", text):
            assert "allow_pickle=False" in call, (source, call)
