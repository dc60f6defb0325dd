"""Byte sizes as people write them: ``512MiB``, ``2GiB``, ``1.5 GB``, ``4096``."""
import re

from .errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
EXPECTED = "a size like '512MiB', '2GiB' or '1048576'"


def parse_size(value, key: str = "size", source: str | None = None) -> int:
    """Bytes in ``value`` (an int, or a string with an optional binary/decimal unit), as an int > 0.

    Raises ConfigError naming ``key`` for anything else: negative, zero, unknown unit, not a number.
    """
    if isinstance(value, bool):
        raise ConfigError(key, EXPECTED, value, source)
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str) and (match := _SIZE.match(value)):
        number, unit = float(match.group(1)), match.group(2).lower()
    else:
        raise ConfigError(key, EXPECTED, value, source)
    if unit not in _UNITS or number <= 0:
        raise ConfigError(key, EXPECTED, value, source)
    nbytes = int(number * _UNITS[unit])
    if nbytes <= 0:
        raise ConfigError(key, EXPECTED, value, source)
    return nbytes


def format_bytes(nbytes: float) -> str:
    """Human-readable binary size: ``format_bytes(3 * 2**20) == '3.00 MiB'``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
