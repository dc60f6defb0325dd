"""Sizes as people write them, and one clear line for anything else."""
import pytest

from minilms.errors import ConfigError
from minilms.sizes import format_bytes, parse_size


@pytest.mark.parametrize("text, nbytes", [
    ("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1.5 GiB", 3 * 2**29), ("64 KiB", 65536),
    ("1GB", 10**9), ("4096", 4096), (4096, 4096), ("16g", 16 * 2**30), ("1 kb", 1000),
])
def test_sizes(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("bad", ["-1", -1, "0", 0, "3 parsecs", "MiB", "1..5GiB", "", None, True,
                                 "1e3", [512]])
def test_bad_sizes_give_one_line_naming_the_key(bad):
    with pytest.raises(ConfigError) as error:
        parse_size(bad, key="device.memory", source="run.yaml")
    message = str(error.value)
    assert message.startswith("run.yaml: device.memory: expected a size like")
    assert f"found {bad!r}" in message and "\n" not in message


def test_format_bytes():
    assert format_bytes(100) == "100 B"
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    assert format_bytes(5 * 2**40) == "5120.00 GiB"
