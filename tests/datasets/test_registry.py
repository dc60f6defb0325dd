"""The registry and make_dataset: names, option routing, one-line errors, and no pickle; every
format's declared facts checked against its data and against the config, which reads them.

The format-wide tests run over ``DATASETS``, never a list of names: a new format is covered once
it is registered and its test module (``test_<module>.py``) defines ``sample_options``.
"""
import importlib
import re
from pathlib import Path

import pytest

import minilms.datasets
from minilms.config import load_config
from minilms.config.build import num_classes
from minilms.datasets import DATASETS, OPTIONS, DatasetFormat, make_dataset, register
from minilms.errors import ConfigError

from .helpers import assert_one_line

FORMATS = list(DATASETS)


def sample_options(tmp_path: Path, name: str) -> dict:
    """The data.* options of a small instance of ``name``, from the test module of the format's
    module (``test_mnist`` for ``minilms.datasets.mnist``), which writes it under ``tmp_path``."""
    module = DATASETS[name].open.__module__.rsplit(".", 1)[-1]
    tests = importlib.import_module(f".test_{module}", __package__)
    assert hasattr(tests, "sample_options"), f"{tests.__name__} must define sample_options"
    tmp_path.mkdir(parents=True, exist_ok=True)
    return tests.sample_options(tmp_path, name)


def write_config(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(f"model:\n  zoo: lenet\ndata:\n  dataset: {name}\n")
    return path


def test_every_format_is_registered_with_its_options():
    assert DATASETS["shapes"].options == {"image_size", "channels", "num_classes", "train_size",
                                          "val_size", "seed"}
    assert "root" in DATASETS["mnist"].options and "train_size" not in DATASETS["mnist"].options
    for name, spec in DATASETS.items():
        assert spec.name == name and spec.options <= set(OPTIONS) and spec.summary


def test_options_a_format_does_not_use_are_ignored():
    # the whole data section can be passed, whatever the dataset
    ds = make_dataset("shapes", "val", root="/nonexistent", val_size=3, val_fraction=0.5,
                      cache=False, image_size=8)
    assert len(ds) == 3


def test_unknown_dataset_and_unknown_option_are_config_errors():
    with pytest.raises(ConfigError) as error:
        make_dataset("imagenet", "train")
    assert_one_line(error, "data.dataset", ", ".join(DATASETS), "imagenet")
    with pytest.raises(ConfigError) as error:
        make_dataset("shapes", "train", imagesize=32)
    assert_one_line(error, "data.imagesize")


def test_register_refuses_options_outside_the_documented_set():
    def open_odd(split, *, colour_space=None):
        """An odd format."""
    with pytest.raises(ValueError, match="colour_space"):
        register(DatasetFormat("odd", open_odd, num_classes=None, needs_root=False, files="none"))
    assert "odd" not in DATASETS


def test_a_format_must_declare_sound_facts():
    def open_odd(split):
        """An odd format."""
    with pytest.raises(ValueError, match="num_classes"):
        DatasetFormat("odd", open_odd, num_classes=1, needs_root=False, files="none")
    with pytest.raises(ValueError, match="files"):
        DatasetFormat("odd", open_odd, num_classes=None, needs_root=False, files=" ")


@pytest.mark.parametrize("name", FORMATS)
def test_declared_facts_agree_with_the_data(tmp_path, name):
    format_ = DATASETS[name]
    options = sample_options(tmp_path / "data", name)
    train = make_dataset(name, "train", **options)
    # needs_root is "takes data.root": a format reads only what the config points it to
    assert ("root" in format_.options) == format_.needs_root == ("root" in options)
    # files goes into one-line messages, and says where under root the data is
    assert "\n" not in format_.files and ("root" in format_.files) == format_.needs_root
    if format_.num_classes is not None:
        assert train.num_classes == format_.num_classes
    # the net's class count is the data's, whether declared (planned without files) or counted
    overrides = [f"data.{key}={value}" for key, value in options.items()]
    assert num_classes(load_config(write_config(tmp_path, name), overrides)) == train.num_classes


@pytest.mark.parametrize("name", [name for name, spec in DATASETS.items() if spec.needs_root])
def test_a_format_that_reads_files_names_data_root_when_it_is_missing(tmp_path, name):
    for root in (None, tmp_path / "nowhere"):
        with pytest.raises(ConfigError) as error:
            make_dataset(name, "train", root=root)
        assert_one_line(error, "data.root")


@pytest.mark.parametrize("name", FORMATS)
def test_a_config_without_data_root(tmp_path, name):
    format_, path = DATASETS[name], write_config(tmp_path, name)
    if format_.config_needs_root:  # the class count is in the files: nothing can be built
        with pytest.raises(ConfigError) as error:
            load_config(path)
        assert_one_line(error, f"data.root: expected the folder or file to read {name} from, "
                        "found None")
    else:  # planned without the files; training reports the missing root when it opens them
        config = load_config(path)
        if format_.num_classes is not None:
            assert num_classes(config) == format_.num_classes


def test_nothing_in_the_package_unpickles():
    package = Path(minilms.datasets.__file__).parent
    for source in package.glob("*.py"):
        text = source.read_text()
        unpicklers = r"^\s*(import|from)\s+(pickle|cPickle|dill|joblib)\b"
        assert not re.search(unpicklers, text, re.M), source
        assert "allow_pickle=True" not in text, source
        for call in re.findall(r"np\.load\([^)]*\)", text):
            assert "allow_pickle=False" in call, (source, call)
