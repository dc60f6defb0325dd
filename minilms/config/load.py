"""Run configs: a YAML file plus ``key.sub=value`` overrides, checked against the schema, with every
mistake reported as one line that says where it is (``FILE:LINE:COL``), what was expected and what
was found. The schema itself (keys, defaults, checks) is data, in ``minilms.config.schema``.

    config = load_config("quick.yaml", ["train.max_iters=20", "solver.lr=1e-3"])
    config.solver.lr == config["solver"]["lr"] == 0.001
    config.where("solver.momentum")     # "quick.yaml:8:3", or "quick.yaml" for a default/override
    config.locations                    # {"solver.momentum": (8, 3), ...}: keys and list items
    config.to_yaml()                    # the resolved config, saved with a run; loads back the same
    config_error_line(error, config)    # a later ConfigError ("model.layers[3].num_output: ...")
                                        # as one line, located in the file

``Config`` is a read-only mapping; sections are ``Config`` too (``config.data.augment.flip``),
other values are plain (lists are copies; ``model.layers`` is a list of dicts as written). Sizes
(``device.memory``, ``lms.min_swap_bytes``, ``lms.limit``) stay as written, checked with
``parse_size``. ``name`` defaults to the file's stem.

Why compose YAML nodes instead of ``yaml.safe_load``: the nodes carry marks, so each key and list
item keeps its line and column (``Origin.marks``); and only plain values are built (strings,
numbers, booleans, null, lists, mappings), never objects. The loader also reads ``1e-3`` as a
float (YAML 1.1 wants ``1.0e-3``), and the dumper quotes such strings so they round-trip.

Every error is a ``ConfigError``: missing file, directory or device, a file over 1 MiB (a config
is a few KiB), bad UTF-8, YAML syntax (with PyYAML's line and column), empty file, top level not a
mapping, unknown key (with a did-you-mean), wrong type or value, settings that contradict each
other, malformed or unknown overrides. Characters that would not show (a zero-width space in a
key) are escaped in the message; an override's value YAML reread (``yes``) is shown as written.
"""
import copy
import functools
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

import yaml

from ..errors import ConfigError, did_you_mean
from ..sizes import format_bytes
from .schema import SCHEMA, Invalid, Section, check_together
from .yaml_source import (
    ConfigDumper,
    ConfigLoader,
    LayerMap,
    Origin,
    compose,
    config_error,
    join_key,
    printable,
    split_key,
    unknown_key,
)

__all__ = ["Config", "load_config", "config_error_line", "ConfigLoader", "ConfigDumper"]

MAX_CONFIG_BYTES = 2**20     # a config is a few KiB; more is a wrong path (a log, a disk image)
_LIMIT = f"{MAX_CONFIG_BYTES // 2**20} MiB"
# what a config path must not be: reading a device may never end (/dev/zero) or have effects
_NOT_FILES = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _refuse_non_file(mode: int, label: str) -> None:
    for test, what in _NOT_FILES:
        if test(mode):
            raise config_error(label, "", "a YAML config file", None, found_text=what)


def _read_bytes(path, label: str) -> bytes:
    """The bytes at ``path``: a regular file or a pipe (a shell's ``<(...)``), never more than
    ``MAX_CONFIG_BYTES`` of it. A device or a directory is refused before it is opened, and what
    was opened is checked again, in case the path changed in between."""
    _refuse_non_file(os.stat(path).st_mode, label)
    with open(path, "rb") as file:
        info = os.fstat(file.fileno())
        _refuse_non_file(info.st_mode, label)
        if stat.S_ISREG(info.st_mode) and info.st_size > MAX_CONFIG_BYTES:
            found = f"a file of {format_bytes(info.st_size)}"
        else:
            data = file.read(MAX_CONFIG_BYTES + 1)
            found = f"more than {_LIMIT}" if len(data) > MAX_CONFIG_BYTES else ""
    if found:
        raise config_error(label, "", f"a YAML config file of at most {_LIMIT}", None,
                           found_text=found)
    return data


def _read(path) -> tuple[dict, Origin]:
    origin = Origin(str(path))
    label = origin.file
    try:
        text = _read_bytes(path, label).decode("utf-8-sig")
    except FileNotFoundError:
        raise config_error(label, "", "a YAML config file", None,
                           found_text="no such file") from None
    except OSError as error:
        raise config_error(label, "", "a readable YAML config file", None,
                     found_text=error.strerror or type(error).__name__) from None
    except ConfigError:                                 # not a file, or too big
        raise
    except UnicodeDecodeError as error:
        bad_byte = error.object[error.start]
        raise config_error(label, "", "UTF-8 text", None,
                     found_text=f"byte {bad_byte:#04x} at offset {error.start}") from None
    except ValueError:                                  # a NUL character in the path
        raise config_error(label, "", "a path to a YAML config file", None,
                     found_text="a path with a NUL character") from None
    tree = compose(text, label, origin)
    if tree is Ellipsis or tree is None:
        raise config_error(label, "", "a mapping of settings (model, data, solver, ...)", None,
                     found_text="an empty file")
    if not isinstance(tree, dict):
        raise config_error(label, "", "a mapping of settings (model, data, solver, ...) at the "
                           "top level",
                     tree, found_text="a list" if isinstance(tree, list) else repr(tree))
    return tree, origin


def _apply_override(tree: dict, text: str, origin: Origin) -> None:
    """Set ``key.path=value`` in the raw tree; the path must be in the schema, or (below a value
    kept as written, like model.layers) already in the config."""
    source = f"override {text}"
    key, equals, value_text = str(text).partition("=")
    segments = split_key(key.strip())
    if not equals or not segments:
        raise config_error(source, "", "key.path=value, like train.max_iters=20", text)
    written: dict = {}
    value = compose(value_text, source, None, functools.reduce(join_key, segments, ""), written)
    value = None if value is Ellipsis else value
    section, container, path = SCHEMA, tree, ""
    for depth, segment in enumerate(segments):
        here, last = join_key(path, segment), depth == len(segments) - 1
        if section is not None:         # a schema section: the key must be one of its fields
            if not isinstance(container, dict):
                raise config_error(origin.locate(path), path, "a mapping of settings", container)
            if isinstance(segment, int):
                raise config_error(source, path, "a key, not an index (keys: "
                             f"{', '.join(section.fields)})", segment)
            if segment not in section.fields:
                raise unknown_key(source, here, list(section.fields), name_key=not last)
            spec = section.fields[segment]
            if not last and container.get(segment) is None:     # not written: start from default
                container[segment] = spec.defaults() if isinstance(spec, Section) \
                    else copy.deepcopy(spec.default)
            section = spec if isinstance(spec, Section) else None
        elif isinstance(segment, int):  # inside a value kept as written: only what is there
            if not isinstance(container, list) or segment >= len(container):
                raise config_error(source, path, f"a list with an item {segment}", container)
        elif not isinstance(container, dict) or (not last and segment not in container):
            raise config_error(source, path, f"a mapping with a key {segment!r}", container)
        if last:
            container[segment] = value
            origin.overridden(here, source, written)
            return
        container, path = container[segment], here


def _resolve(section: Section, raw, path: str, origin: Origin) -> dict:
    """Check ``raw`` against ``section`` (in the order it was written) and fill in the defaults."""
    if raw is None:
        raw = {}        # "solver:" with nothing under it: all defaults
    if not isinstance(raw, dict):
        raise config_error(origin.locate(path), path,
                           f"a mapping with keys {', '.join(section.fields)}",
                     raw)
    given = {}
    for key, value in raw.items():
        here = join_key(path, key)
        spec = section.fields.get(key)
        if spec is None:
            raise unknown_key(origin.locate(here, at_value=False), here, list(section.fields))
        if isinstance(spec, Section):
            given[key] = _resolve(spec, value, here, origin)
            continue
        try:
            given[key] = spec.check(value)
        except Invalid as error:
            raise _invalid(error, here, origin) from None
    return {key: given[key] if key in given else
            (spec.defaults() if isinstance(spec, Section) else copy.deepcopy(spec.default))
            for key, spec in section.fields.items()}


def _invalid(error: Invalid, path: str, origin: Origin) -> ConfigError:
    key = path + error.at
    return config_error(origin.locate(key), key, error.expected, error.found, error.hint,
                        error.found_text or _as_written(key, error.found, origin))


def _as_written(key: str, found, origin: Origin) -> str:
    """An override's text where YAML read it as something that shows differently (``yes`` as
    True, ``1e-3`` as 0.001), quoted: ``found 'yes'`` says what the user typed, and there is
    no line in a file to look at. "" where ``repr(found)`` already shows it (text, null)."""
    text, value = origin.written.get(key, (None, None))
    if text is None or isinstance(found, str) or found is None or type(found) is not type(value) \
            or found != value or text == repr(found):
        return ""
    return repr(text)


def load_config(path, overrides=()) -> "Config":
    """The resolved config in ``path`` (YAML) with ``overrides`` (``"key.path=value"`` strings,
    values read as YAML) applied in order, later ones winning. Raises ConfigError (one line,
    located) for anything wrong."""
    tree, origin = _read(path)
    for text in [overrides] if isinstance(overrides, str) else overrides or ():
        _apply_override(tree, text, origin)
    values = _resolve(SCHEMA, tree, "", origin)
    try:
        check_together(values)
    except Invalid as error:
        raise _invalid(error, "", origin) from None
    if values["name"] is None:
        values["name"] = Path(origin.file).stem
    origin.values = values
    return Config(values, origin)


# what a key says for people, not for locating: a layer's name after its index, "(conv2)"
_NOTE = re.compile(r" \([^()]*\)")


def _key_path(key: str) -> str:
    """The config path an error's key names: ``model.layers[3] (conv2).stride`` ->
    ``model.layers[3].stride``; ``model.zoo (lenet): layer conv2: bottom 0`` -> ``model.zoo``."""
    return _NOTE.sub("", key).split(": ")[0]


def config_error_line(error: BaseException, config: "Config") -> str:
    """``error`` as one line. A ConfigError without a source (the net builder's, say) is located
    where its key's value was written (or the nearest key above a path that is not in the file),
    or named by the override that set it; any other error is only flattened to one line. What
    is not printable (in a key or a layer name the user wrote) is escaped, not flattened."""
    message = str(error)
    if isinstance(error, ConfigError):
        if not error.source:
            message = f"{config._origin.locate(_key_path(error.key))}: {message}"
        message = printable(message)
    return printable(" ".join(message.split()))


class Config(Mapping):
    """Resolved settings by attribute (``config.solver.lr``) or key (``config["solver"]["lr"]``)."""

    def __init__(self, values: dict, origin: Origin, prefix: str = ""):
        self._values, self._origin, self._prefix = values, origin, prefix

    @property
    def file(self) -> str:
        return self._origin.file

    @property
    def locations(self) -> dict:
        """``{key_path: (line, column)}`` of every key and list item written in the file."""
        return dict(self._origin.marks)

    def __getitem__(self, key):
        value = self._values[key]
        if isinstance(value, dict):
            return Config(value, self._origin, join_key(self._prefix, key))
        return copy.deepcopy(value) if isinstance(value, list) else value

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{self._prefix or 'config'} has no key {name!r}"
                                 f"{did_you_mean(name, self._values)}") from None

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Config({self.file!r}, {self._prefix or 'all'}: {self._values!r})"

    def where(self, key_path: str = "") -> str:
        """``FILE:LINE:COL`` of the key at ``key_path`` (relative to this section); just ``FILE``
        when its value came from a default or an override. A path that is not in the config (a key
        the net builder missed, say) is located at the nearest key above it that was written."""
        separator = "" if key_path.startswith("[") or not (self._prefix and key_path) else "."
        path = self._prefix + separator + key_path
        if path not in self._origin.marks and self._has(path):
            return self.file
        return self._origin.locate(path, at_value=False, overrides=False)

    def _has(self, path: str) -> bool:
        value = self._origin.values
        for segment in split_key(path) or [object()]:
            try:
                value = value[segment]
            except (KeyError, IndexError, TypeError):
                return False
        return True

    def to_dict(self) -> dict:
        return copy.deepcopy(self._values)

    def to_yaml(self) -> str:
        """The resolved settings as YAML, in schema order; ``load_config`` reads back the same."""
        values = self.to_dict()
        if isinstance(values.get("model"), dict) and values["model"]["layers"]:
            values["model"]["layers"] = [LayerMap(layer) for layer in values["model"]["layers"]]
        header = f"# minilms config, resolved from {self.file}\n" if not self._prefix else ""
        return header + yaml.dump(values, Dumper=ConfigDumper, sort_keys=False,
                                  default_flow_style=False, width=100, allow_unicode=True)
