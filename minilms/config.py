"""Run configs: a YAML file plus ``key.sub=value`` overrides, checked against the schema, with every
mistake reported as one line that says where it is (``FILE:LINE:COL``), what was expected and what
was found. The schema itself (keys, defaults, checks) is data, in ``minilms.config_schema``.

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

Every error is a ``ConfigError``: missing file, directory, bad UTF-8, YAML syntax (with PyYAML's
line and column), empty file, top level not a mapping, unknown key (with a did-you-mean), wrong
type or value, settings that contradict each other, malformed or unknown overrides.
"""
import copy
import re
from collections.abc import Mapping
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from .config_schema import SCHEMA, Invalid, Section, check_together, did_you_mean
from .errors import ConfigError

__all__ = ["Config", "load_config", "config_error_line", "ConfigLoader", "ConfigDumper"]

_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
_TAG = "tag:yaml.org,2002:"
_PLAIN_SCALARS = {_TAG + name for name in ("str", "int", "float", "bool", "null")}
_COLLECTIONS = {_TAG + "map", _TAG + "seq"}
MAX_VALUES = 100_000        # a few aliases can expand to billions of values ("billion laughs")


class ConfigLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3``, ``5e4``, ``-2E-5`` as floats."""


class ConfigDumper(yaml.SafeDumper):
    """SafeDumper that quotes strings ConfigLoader reads as floats, and never writes aliases."""

    def ignore_aliases(self, data):
        return True


def _represent_list(dumper, data):
    # short lists of numbers read best on one line ([0.9, 0.999]); lists of layers do not
    flow = all(not isinstance(item, (list, dict)) for item in data)
    return dumper.represent_sequence(_TAG + "seq", data, flow_style=flow)


def _represent_str(dumper, data):
    # YAML counts NEL and the Unicode line/paragraph separators as line breaks: in a plain or
    # single-quoted scalar PyYAML folds them away, so such strings go double-quoted (escaped).
    style = '"' if any(c in data for c in "\x85\u2028\u2029") else None
    return dumper.represent_scalar(_TAG + "str", data, style=style)


class _Layer(dict):
    """A layer mapping, written on one line like the configs in the docs."""


ConfigDumper.add_representer(list, _represent_list)
ConfigDumper.add_representer(str, _represent_str)
ConfigDumper.add_representer(
    _Layer, lambda dumper, data: dumper.represent_mapping(_TAG + "map", data, flow_style=True))
for _cls in (ConfigLoader, ConfigDumper):   # on these classes only: yaml's own stay YAML 1.1
    _cls.add_implicit_resolver(_TAG + "float", _EXPONENT_FLOAT, list("-+0123456789."))


def _error(where: str, key: str, expected: str, found, hint: str = "", found_text: str = ""):
    """A ConfigError; ``found_text`` words a finding that is a description, not a value."""
    error = ConfigError(key, expected, found, where or None, hint)
    if found_text or not key:
        parts = [part for part in (where, key) if part]
        error.args = (": ".join(parts + [f"expected {expected}, found "
                                         f"{found_text or repr(found)}{hint}"]),)
    return error


def _unknown_key(where: str, key: str, known, name_key: bool = True):
    word = key.rsplit(".", 1)[-1]
    hint = did_you_mean(word, known) or f"; known keys: {', '.join(known)}"
    error = ConfigError(key, "a known key", word, where, hint)
    error.args = (f"{where}: {key + ': ' if name_key else ''}unknown key{hint}",)
    return error


def _join(path: str, segment) -> str:
    if isinstance(segment, int):
        return f"{path}[{segment}]"
    return f"{path}.{segment}" if path else segment


def _parent(path: str) -> str:
    return path[:max(path.rfind("."), path.rfind("["), 0)]


_PATH = re.compile(r"[A-Za-z_][\w-]*(?:\[\d+\])*(?:\.[A-Za-z_][\w-]*(?:\[\d+\])*)*")
_SEGMENT = re.compile(r"([A-Za-z_][\w-]*)|\[(\d+)\]")


def _split(path: str) -> list | None:
    """``"model.layers[3].type"`` -> ``["model", "layers", 3, "type"]``; None if malformed."""
    if not _PATH.fullmatch(path):
        return None
    return [name or int(index) for name, index in _SEGMENT.findall(path)]


class Origin:
    """Where each value came from. ``marks`` maps the path of every key and list item written in
    the file to its 1-based (line, column); ``value_marks`` does the same for scalar values, which
    is where an error about the value points; ``overrides`` maps a path to the override that set it.
    """

    def __init__(self, file: str):
        self.file, self.marks, self.value_marks, self.overrides = file, {}, {}, {}
        self.values: dict = {}      # the resolved config, once there is one

    def locate(self, path: str, at_value: bool = True, overrides: bool = True) -> str:
        """``FILE:LINE:COL`` of ``path`` or, if it was not written, of the nearest key above it."""
        node = path
        while True:
            if node in self.overrides:
                return self.overrides[node] if overrides else self.file
            if node in self.marks:
                pointed = self.value_marks if at_value and node == path else self.marks
                line, column = pointed.get(node, self.marks[node])
                return f"{self.file}:{line}:{column}"
            if not node:
                return self.file
            node = _parent(node)

    def overridden(self, path: str, source: str) -> None:
        self.overrides[path] = source
        below = (path + ".", path + "[")
        for written in [p for p in self.marks if p == path or p.startswith(below)]:
            del self.marks[written]
            self.value_marks.pop(written, None)


class _Converter:
    """Plain Python values from a composed node, recording marks in ``origin`` (for a file)."""

    def __init__(self, loader, label: str, origin: Origin | None):
        self.loader, self.label, self.origin, self.budget = loader, label, origin, MAX_VALUES
        self.inside: set = set()      # ids of the collections being converted: an alias cycle

    def where(self, node) -> str:
        if self.origin is None:
            return self.label
        return f"{self.label}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def value(self, node, path: str):
        self.budget -= 1
        if self.budget < 0:
            raise _error(self.label, path, f"at most {MAX_VALUES} values", None,
                         found_text="more (aliases that expand without end?)")
        if id(node) in self.inside:
            raise _error(self.where(node), path, "a value that does not contain itself", None,
                         found_text="an alias to a collection around it")
        if isinstance(node, (MappingNode, SequenceNode)) and node.tag in _COLLECTIONS:
            self.inside.add(id(node))
            try:
                if isinstance(node, MappingNode):
                    return self.mapping(node, path)
                return [self.item(item, _join(path, i)) for i, item in enumerate(node.value)]
            finally:
                self.inside.discard(id(node))
        if isinstance(node, ScalarNode) and node.tag == _TAG + "timestamp":
            return node.value       # a date is just text to a config (a run name, say)
        if isinstance(node, ScalarNode) and node.tag in _PLAIN_SCALARS:
            try:
                return self.loader.construct_object(node)
            except (yaml.YAMLError, ValueError):      # e.g. !!int abc
                pass
        raise _error(self.where(node), path, "a plain YAML value (no tags)", None,
                     found_text=f"{node.tag.replace(_TAG, '!!')} {node.value!r}"
                     if isinstance(node, ScalarNode) else node.tag.replace(_TAG, "!!"))

    def item(self, node, path: str):
        if self.origin is not None:
            self.origin.marks[path] = _position(node)
        return self.value(node, path)

    def mapping(self, node, path: str) -> dict:
        written_here = {id(key) for key, _ in node.value}
        try:
            self.loader.flatten_mapping(node)     # merge keys (<<: *defaults) come first
        except yaml.YAMLError as error:
            raise _error(self.where(node), path, "a valid merge (<<)", None,
                         found_text=getattr(error, "problem", "") or "something else") from None
        result, line_of = {}, {}     # line_of: keys spelt out here (a merged key may be replaced)
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if not isinstance(key_node, ScalarNode) or key_node.tag != _TAG + "str":
                raise _error(self.where(key_node), path or "(top level)", "text keys (quote "
                             "keys like on, no, 1 or null)", None, found_text=f"the key {key!r}")
            here = _join(path, key)
            if id(key_node) in written_here:
                if key in line_of:
                    raise _error(self.where(key_node), here, "each key once", None,
                                 found_text=f"it again (first at line {line_of[key]})")
                line_of[key] = key_node.start_mark.line + 1
            if self.origin is not None:
                self.origin.marks[here] = _position(key_node)
                if isinstance(value_node, ScalarNode):
                    self.origin.value_marks[here] = _position(value_node)
            result[key] = self.value(value_node, here)
        return result


_BUT_FOUND = re.compile(r"expected (.*), but (?:found|got) (.*)", re.S)


def _position(node) -> tuple:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _compose(text: str, label: str, origin: Origin | None, path: str = ""):
    """The value in ``text`` (at key ``path``), or ``...`` (Ellipsis) when there is none."""
    loader = None
    try:
        loader = ConfigLoader(text)     # already reads: a NUL byte fails here
        node = loader.get_single_node()
        return Ellipsis if node is None else _Converter(loader, label, origin).value(node, path)
    except yaml.YAMLError as error:
        raise _syntax_error(error, text, label, origin is not None) from None
    except RecursionError:
        raise _error(label, "", "valid YAML nested a few hundred levels at most", None,
                     found_text="deeper nesting") from None
    finally:
        if loader is not None:
            loader.dispose()


def _syntax_error(error: yaml.YAMLError, text: str, label: str, with_lines: bool) -> ConfigError:
    """PyYAML's problem and position, reworded into one ``expected ..., found ...`` line."""
    mark = getattr(error, "problem_mark", None)
    if isinstance(error, yaml.reader.ReaderError):
        line = text.count("\n", 0, error.position)
        column = error.position - (text.rfind("\n", 0, error.position) + 1)
        mark = yaml.Mark(label, error.position, line, column, None, None)
        found = (f"character #x{error.character:04x} ({error.reason})"
                 if isinstance(error.character, int) else f"{error.character!r} ({error.reason})")
    else:
        found = getattr(error, "problem", None) or str(error)
    where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark and with_lines else label
    expected, context = "valid YAML", getattr(error, "context", None) or ""
    # PyYAML words some problems as "expected X, but found Y", sometimes split over two fields
    if found.startswith("but found ") and context.startswith("expected "):
        expected, found = f"valid YAML ({context[9:]})", found[10:]
    elif match := _BUT_FOUND.fullmatch(found):
        expected, found = f"valid YAML ({match.group(1)})", match.group(2)
    found = found.removeprefix("found ")
    return _error(where, "", expected, None, found_text=" ".join(found.split()))


def _read(path) -> tuple[dict, Origin]:
    origin = Origin(str(path))
    label, file = origin.file, Path(path)
    if file.is_dir():
        raise _error(label, "", "a YAML config file", None, found_text="a directory")
    try:
        text = file.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise _error(label, "", "a YAML config file", None, found_text="no such file") from None
    except OSError as error:
        raise _error(label, "", "a readable YAML config file", None,
                     found_text=error.strerror or type(error).__name__) from None
    except UnicodeDecodeError as error:
        bad_byte = error.object[error.start]
        raise _error(label, "", "UTF-8 text", None,
                     found_text=f"byte {bad_byte:#04x} at offset {error.start}") from None
    except ValueError:                                  # a NUL character in the path
        raise _error(label, "", "a path to a YAML config file", None,
                     found_text="a path with a NUL character") from None
    tree = _compose(text, label, origin)
    if tree is Ellipsis or tree is None:
        raise _error(label, "", "a mapping of settings (model, data, solver, ...)", None,
                     found_text="an empty file")
    if not isinstance(tree, dict):
        raise _error(label, "", "a mapping of settings (model, data, solver, ...) at the top level",
                     tree, found_text="a list" if isinstance(tree, list) else repr(tree))
    return tree, origin


def _apply_override(tree: dict, text: str, origin: Origin) -> None:
    """Set ``key.path=value`` in the raw tree; the path must be in the schema, or (below a value
    kept as written, like model.layers) already in the config."""
    source = f"override {text}"
    key, equals, value_text = str(text).partition("=")
    segments = _split(key.strip())
    if not equals or not segments:
        raise _error(source, "", "key.path=value, like train.max_iters=20", text)
    value = _compose(value_text, source, None, key.strip())
    value = None if value is Ellipsis else value
    section, container, path = SCHEMA, tree, ""
    for depth, segment in enumerate(segments):
        here, last = _join(path, segment), depth == len(segments) - 1
        if section is not None:         # a schema section: the key must be one of its fields
            if not isinstance(container, dict):
                raise _error(origin.locate(path), path, "a mapping of settings", container)
            if isinstance(segment, int):
                raise _error(source, path, "a key, not an index (keys: "
                             f"{', '.join(section.fields)})", segment)
            if segment not in section.fields:
                raise _unknown_key(source, here, list(section.fields), name_key=not last)
            spec = section.fields[segment]
            if not last and container.get(segment) is None:     # not written: start from default
                container[segment] = spec.defaults() if isinstance(spec, Section) \
                    else copy.deepcopy(spec.default)
            section = spec if isinstance(spec, Section) else None
        elif isinstance(segment, int):  # inside a value kept as written: only what is there
            if not isinstance(container, list) or segment >= len(container):
                raise _error(source, path, f"a list with an item {segment}", container)
        elif not isinstance(container, dict) or (not last and segment not in container):
            raise _error(source, path, f"a mapping with a key {segment!r}", container)
        if last:
            container[segment] = value
            origin.overridden(here, source)
            return
        container, path = container[segment], here


def _resolve(section: Section, raw, path: str, origin: Origin) -> dict:
    """Check ``raw`` against ``section`` (in the order it was written) and fill in the defaults."""
    if raw is None:
        raw = {}        # "solver:" with nothing under it: all defaults
    if not isinstance(raw, dict):
        raise _error(origin.locate(path), path, f"a mapping with keys {', '.join(section.fields)}",
                     raw)
    given = {}
    for key, value in raw.items():
        here = _join(path, key)
        spec = section.fields.get(key)
        if spec is None:
            raise _unknown_key(origin.locate(here, at_value=False), here, list(section.fields))
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
    return _error(origin.locate(key), key, error.expected, error.found, error.hint,
                  error.found_text)


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


def config_error_line(error: BaseException, config: "Config") -> str:
    """``error`` as one line. A ConfigError without a source (the net builder's, say) is located
    where its key's value was written (or the nearest key above a path that is not in the file),
    or named by the override that set it; any other error is only flattened to one line."""
    message = str(error)
    if isinstance(error, ConfigError) and not error.source:
        message = f"{config._origin.locate(error.key)}: {message}"
    return " ".join(message.split())


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
            return Config(value, self._origin, _join(self._prefix, key))
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
        for segment in _split(path) or [object()]:
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
            values["model"]["layers"] = [_Layer(layer) for layer in values["model"]["layers"]]
        header = f"# minilms config, resolved from {self.file}\n" if not self._prefix else ""
        return header + yaml.dump(values, Dumper=ConfigDumper, sort_keys=False,
                                  default_flow_style=False, width=100, allow_unicode=True)
